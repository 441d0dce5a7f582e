"""`torchneuron check`: runs crafted scripts unmodified on neuron and reports each problem
with the right call site, in the terminal, the JSON file and the HTML report."""

import base64
import json
import re
import shutil
import subprocess
import textwrap

import numpy
import pytest

from check_cli_support import run_check

TOP_LEVEL_KEYS = {"schema", "target", "outcome", "steps", "wall_seconds", "ops", "fallbacks",
                  "pytorch_internal_host_ops", "wide_dtypes", "host_syncs", "transfers", "compile",
                  "memory", "modelled", "roofline", "command", "verdict", "recommendations",
                  "strict_offenders", "cuda", "wide_dtype_origins", "nonfinite"}


# The keys of each kind of row: CI reads them, so they only ever grow (JSON schema stable).
ROW_KEYS = {
    "fallbacks": {"op", "dtypes", "calls", "reason", "call_site", "stack", "bytes_to_host", "call_sites"},
    "call_sites": {"site", "calls", "stack", "stacks"},
    "host_syncs": {"kind", "site", "count", "description", "stack", "stacks"},
    "wide_dtypes": {"op", "dtypes", "wide", "calls", "on_device", "trainium", "call_site"},
    "memory": {"peak_allocated_bytes", "peak_allocated_per_device", "peak_reserved_per_device",
               "timeline", "capacity", "breakdown", "instance", "samples", "step_marks"},
    "modelled": {"lnc", "seconds", "flops", "mfu", "seconds_per_step", "peak_flops_per_second",
                 "families", "ops"},
    "modelled ops": {"op", "calls", "seconds", "flops", "cpu_fallback"},
    "recommendations": {"rank", "severity", "text"},
}


def check(tmp_path, *args, script=None, name="script.py"):
    """Runs `torchneuron check` in tmp_path on `script` saved as `name`; returns (process, report)."""
    return run_check(tmp_path, *args, files=None if script is None else {name: script})


def line_of(source: str, marker: str) -> int:
    return next(i for i, line in enumerate(textwrap.dedent(source).splitlines(), 1) if marker in line)


PROBLEMS = """\
import torch
def wide_total(t):
    return t.exp().sum().item()  # helper fallback and sync
def first_caller(t):
    return wide_total(t)  # caller one
model = torch.nn.Linear(8, 4)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
buffer = torch.ones(4, dtype=torch.float64)  # FP64 buffer
for step in range(3):
    loss = model(torch.randn(5, 8)).square().mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    print(loss.item())  # item in loop
    total = (buffer * 2).sum()  # fp64 math
picked = torch.nonzero(buffer > 0)  # known fallback
first_caller(buffer)  # calls caller one
wide_total(buffer)  # caller two
"""


def test_reports_fallbacks_fp64_and_syncs_with_call_sites_and_strict_refuses(tmp_path):
    result, data = check(tmp_path, "--strict", "script.py", script=PROBLEMS)
    assert result.returncode == 3, result.stdout + result.stderr  # --strict: offenders named below
    assert "--strict: refused" in result.stdout
    assert "CPU fallback aten::nonzero (bool) x1 at script.py:" in result.stdout
    assert "host sync x3: a scalar read" in result.stdout
    assert len(data["strict_offenders"]) == len(data["fallbacks"]) + 2  # 2 repeated syncs
    assert set(data) == TOP_LEVEL_KEYS and data["schema"] == "torchneuron-check/1"
    rows = {"fallbacks": data["fallbacks"], "call_sites": [s for f in data["fallbacks"] for s in f["call_sites"]],
            "host_syncs": data["host_syncs"]["by_site"], "wide_dtypes": data["wide_dtypes"],
            "memory": [data["memory"]], "modelled": list(data["modelled"].values()),
            "modelled ops": data["modelled"]["trn2"]["ops"], "recommendations": data["recommendations"]}
    assert {kind: {frozenset(r) for r in found} for kind, found in rows.items()} == {
        kind: {frozenset(keys)} for kind, keys in ROW_KEYS.items()}
    assert data["outcome"]["status"] == "completed" and data["steps"] == 3
    falls = {f["op"]: f for f in data["fallbacks"]}
    assert falls["aten::nonzero"]["call_site"] == f"script.py:{line_of(PROBLEMS, 'known fallback')} in <module>"
    assert falls["aten::mul.Tensor"]["call_site"].startswith(f"script.py:{line_of(PROBLEMS, 'fp64 math')} ")
    assert falls["aten::mul.Tensor"]["calls"] == 3
    assert data["verdict"].startswith("runs with ") and "CPU fallback" in data["verdict"]
    wide = {w["op"] for w in data["wide_dtypes"] if "float64" in w["wide"]}
    assert {"aten::mul.Tensor", "aten::sum.dim_IntList"} <= wide
    syncs = {(s["kind"], s["site"]): s["count"] for s in data["host_syncs"]["by_site"]}
    assert syncs[("item", f"script.py:{line_of(PROBLEMS, 'item in loop')} in <module>")] == 3
    assert syncs[("data_dependent_shape", f"script.py:{line_of(PROBLEMS, 'known fallback')} in <module>")] == 1
    # A fallback and a sync in a helper called from two places: each whole stack, innermost first.
    def at(marker, function):
        return f"script.py:{line_of(PROBLEMS, marker)} in {function}"
    helper = at("helper fallback and sync", "wide_total")
    both = [{"stack": [helper, at("caller one", "first_caller"), at("calls caller one", "<module>")],
             "calls": 1}, {"stack": [helper, at("caller two", "<module>")], "calls": 1}]
    [exp] = falls["aten::exp"]["call_sites"]
    assert (exp["site"], exp["calls"], exp["stacks"], exp["stack"]) == (helper, 2, both, both[0]["stack"])
    assert falls["aten::exp"]["stack"] == both[0]["stack"]
    assert falls["aten::nonzero"]["call_sites"][0]["stacks"] == [
        {"stack": [at("known fallback", "<module>")], "calls": 1}]
    [item] = [s for s in data["host_syncs"]["by_site"] if s["site"] == helper]
    assert (item["kind"], item["count"], item["stacks"]) == ("item", 2, both)
    chain = f"<- {at('caller one', 'first_caller')} <- {at('calls caller one', '<module>')} (x1)"
    assert result.stdout.count(chain) == 3  # terminal: exp's and sum's call site, and the sync's
    texts = [r["text"] for r in data["recommendations"]]
    assert any(t.startswith("cast the float64 tensors of aten::mul.Tensor") and
               f"script.py:{line_of(PROBLEMS, 'fp64 math')}" in t for t in texts)
    assert any("synchronises the host with the device 3 times (every iteration of a loop)" in t for t in texts)
    assert any(t.endswith(f"2 times, once from each of 2 callers ({at('caller one', 'first_caller')}, "
                          f"{at('caller two', '<module>')}); keep the value on the device where the "
                          f"callers can") for t in texts)  # the helper's sync: not a loop
    assert data["memory"]["peak_allocated_bytes"] > 0
    assert {(c["chip"], c["lnc"]) for c in data["memory"]["capacity"]} == {
        ("trn2", 1), ("trn2", 2), ("trn3", 1), ("trn3", 2)}
    assert set(data["modelled"]) == {"trn2", "trn3"} and data["modelled"]["trn2"]["seconds"] > 0
    for target in data["modelled"].values():  # step time, MFU and top ops on each chip
        assert target["seconds_per_step"] == pytest.approx(target["seconds"] / 3)
        assert 0 < target["mfu"] < 1 and target["ops"][0]["seconds"] == max(o["seconds"] for o in target["ops"])
        assert sum(target["families"].values()) == pytest.approx(target["seconds"])
    # Host <-> device traffic: each .item() and each fallback's result read back (at least).
    assert data["transfers"]["device_to_host"]["copies"] >= 5
    for section in ("host <-> device traffic", "modelled device time", "top ops by modelled time on trn2"):
        assert section in result.stdout
    assert "verdict: runs with" in result.stdout and "recommendations" in result.stdout
    html = (tmp_path / "torchneuron-check.html").read_text()
    for element in ("plot-families", "plot-roofline", "plot-memory", "plot-fallbacks"):
        png = re.search(rf"id='{element}' alt='[^']*' src='data:image/png;base64,([^']+)'", html)
        assert png and base64.b64decode(png.group(1)).startswith(b"\x89PNG"), element
    assert not re.search(r"(src|href)=['\"]https?:", html)  # self-contained: nothing fetched
    stacks = "".join(f"<ol class='stack'>{''.join(f'<li>{f}</li>' for f in s['stack'])}</ol>"
                     .replace("<module>", "&lt;module&gt;") for s in both)
    assert html.count(f"<summary>{helper} (x2) (2 Python stacks)</summary>") == 2  # exp and sum
    assert html.count(f"<summary>{helper} (2 Python stacks)</summary>") == 1  # the sync
    assert html.count(stacks.replace("</ol><ol", "</ol><p class='stack-calls'>1 call by this "
                                     "stack</p><ol")) == 3


CLEAN = """\
import torch
model = torch.nn.Linear(8, 4)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(10):
    model(torch.randn(5, 8)).square().mean().backward()
    opt.step()
    opt.zero_grad()
"""


def test_a_clean_script_passes_strict_and_the_users_files_are_kept(tmp_path):
    mine = tmp_path / "torchneuron-check.json"
    mine.write_text("my own notes")
    (tmp_path / "torchneuron-check.html").write_text("<p>mine</p>")
    result, _ = check(tmp_path, "--strict", "--target", "trn3", "--lnc", "1", "--steps", "4",
                      "script.py", script=CLEAN)
    assert result.returncode == 0, result.stdout + result.stderr
    assert mine.read_text() == "my own notes"  # never overwritten: the report went next to it
    assert (tmp_path / "torchneuron-check.html").read_text() == "<p>mine</p>"
    assert "torchneuron-check-1.json" in result.stdout and "torchneuron-check-1.html" in result.stdout
    assert (tmp_path / "script.py").read_text() == CLEAN
    data = json.loads((tmp_path / "torchneuron-check-1.json").read_text())
    assert data["verdict"] == "runs on device" and data["strict_offenders"] == []
    assert (data["target"]["chip"], data["target"]["lnc"]) == ("trn3", 1)
    assert data["outcome"]["status"] == "stopped" and data["steps"] == 4  # --steps 4
    assert len(data["memory"]["timeline"]) == 4
    assert data["modelled"]["trn3"]["lnc"] == 1
    assert data["modelled"]["trn2"]["seconds_per_step"] == pytest.approx(
        data["modelled"]["trn2"]["seconds"] / 4)


FAILING = """\
import torch
x = torch.ones(3)
y = x @ torch.ones(4, 2)  # shape error
"""


def test_a_failing_script_gets_verdict_fails_with_its_exception(tmp_path):
    result, data = check(tmp_path, "script.py", script=FAILING)
    assert result.returncode == 1
    assert data["verdict"] == "fails"
    assert data["outcome"]["exception_type"] == "RuntimeError"
    assert data["outcome"]["site"] == f"script.py:{line_of(FAILING, 'shape error')} in <module>"
    assert "verdict: fails" in result.stdout and "RuntimeError" in result.stdout
    assert data["recommendations"][0]["severity"] == "error"


def test_sys_exit_with_an_error_status_fails(tmp_path):
    result, data = check(tmp_path, "script.py", script="import sys\nsys.exit(4)\n")
    assert result.returncode == 1 and data["verdict"] == "fails"
    assert "status 4" in data["outcome"]["exception"]


def test_report_paths_replace_only_previous_reports(tmp_path):
    from torchneuron.check import outputs

    report = outputs.write_json(tmp_path / "r.json", {"schema": "torchneuron-check/1", "x": 1})
    assert report == tmp_path / "r.json"
    assert outputs.write_json(tmp_path / "r.json", {"schema": "torchneuron-check/1", "x": 2}) == report
    assert json.loads(report.read_text())["x"] == 2  # its own report is replaced
    (tmp_path / "notes.json").write_text('{"schema": "something else"}')
    assert outputs.write_json(tmp_path / "notes.json", {"schema": "torchneuron-check/1"}) == \
        tmp_path / "notes-1.json"
    assert json.loads((tmp_path / "notes.json").read_text()) == {"schema": "something else"}
    (tmp_path / "link.html").symlink_to(tmp_path / "notes.json")
    assert outputs.free_path(tmp_path / "link.html") == tmp_path / "link-1.html"
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".part")] == []


def test_a_missing_script_is_a_usage_error(capsys):
    from torchneuron import cli

    assert cli.main(["check", "nothing_here.py"]) == 2
    assert "no script 'nothing_here.py'" in capsys.readouterr().out


WIDE_DTYPES = """\
import torch
t = (torch.ones(4) * 2).relu()
positions = torch.arange(4) * 3  # int64 use
magnitude = torch.ones(2, dtype=torch.complex64).abs()  # complex use
"""


def test_a_module_and_its_int64_and_complex_use(tmp_path):
    """(Graph breaks and recompiles: test_check_compile_sites.py.)"""
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "train.py").write_text(WIDE_DTYPES)
    result, data = check(tmp_path, "-m", "pkg.train")
    assert result.returncode == 0, result.stdout + result.stderr
    assert data["command"][:2] == ["-m", "pkg.train"]
    assert data["cuda"]["files_scanned"][0] == "pkg/train.py"  # the module run, then its imports
    assert data["cuda"]["findings"] == []
    texts = [r["text"] for r in data["recommendations"]]
    wide = {(w["op"], tuple(w["wide"])): w for w in data["wide_dtypes"]}
    on_device = wide[("aten::arange.start_out", ("int64",))]  # INT64: what Trainium does with it
    assert on_device["on_device"] and "int64 is computed as int32" in on_device["trainium"]
    assert any(t.startswith("aten::arange.start_out uses int64") and "use int32" in t for t in texts)
    complex_ = wide[("aten::abs.out", ("complex64",))]
    assert not complex_["on_device"] and "complex64 is not a Trainium dtype" in complex_["trainium"]
    site = f"pkg/train.py:{line_of(WIDE_DTYPES, 'complex use')} in <module>"
    assert complex_["call_site"].endswith(site)
    assert any(t.startswith("aten::abs.out on complex64 tensors at ") and site in t and
               "torch.view_as_real" in t for t in texts)
    assert "FP64 / complex / INT64 use" in result.stdout


def test_html_report_renders_in_headless_chromium(tmp_path):
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        pytest.skip("headless Chromium is not installed (Debian: apt-get install chromium); "
                    "the report's PNG plots are checked without it in the first test")
    from PIL import Image  # matplotlib's dependency

    result, data = check(tmp_path, "script.py", script=CLEAN)
    assert result.returncode == 0, result.stdout + result.stderr
    page = (tmp_path / "torchneuron-check.html").as_uri()
    flags = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--enable-logging=stderr", "--v=0"]
    dom = subprocess.run([*flags, "--dump-dom", page], capture_output=True, text=True, timeout=120)
    for element in ("plot-families", "plot-roofline", "plot-memory", "plot-fallbacks"):
        assert f'id="{element}"' in dom.stdout, element
    shot = tmp_path / "shot.png"
    run = subprocess.run([*flags, f"--screenshot={shot}", "--window-size=1100,1400", page],
                         capture_output=True, text=True, timeout=120)
    console = [line for line in (dom.stderr + run.stderr).splitlines() if "CONSOLE" in line]
    assert console == [] and "Uncaught" not in run.stderr  # no console errors
    pixels = numpy.asarray(Image.open(shot).convert("RGB"))
    bars = int((pixels == (0x3B, 0x7D, 0xD8)).all(axis=-1).sum())  # the family plot's bar colour
    assert bars > 500, "the time-by-family plot did not render"
