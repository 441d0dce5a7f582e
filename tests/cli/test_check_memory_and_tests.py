"""`torchneuron check`: out-of-memory explained by category, sizing against an instance
(--instance), one pytest test by node id, and every call site of a CPU fallback."""


import pytest

from check_cli_support import run_check

GiB = 2**30
MiB = 2**20


check = run_check  # (tmp_path, *args, files={path: source})


OUT_OF_MEMORY = """\
import torch
torch.neuron.set_per_process_memory_fraction(64 * 2**20 / torch.neuron.get_device_properties(0).total_memory)
model = torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1024))
opt = torch.optim.Adam(model.parameters())
for step in range(2):
    model(torch.randn(256, 1024)).square().mean().backward()
    opt.step()
too_big = torch.empty(40 * 2**20, dtype=torch.uint8)  # out of memory
"""


def test_out_of_memory_is_explained_and_sized_against_an_instance(tmp_path):
    result, data = check(tmp_path, "--instance", "trn2.48xlarge", "script.py",
                         files={"script.py": OUT_OF_MEMORY})
    assert result.returncode == 1, result.stdout + result.stderr
    outcome = data["outcome"]
    assert outcome["exception_type"] == "OutOfMemoryError"
    assert outcome["site"].startswith("script.py:8 ")
    oom = outcome["out_of_memory"]
    categories = {c["name"]: c["bytes"] for c in oom["breakdown"]["categories"]}
    params = 2 * (1024 * 1024 + 1024) * 4  # two Linear(1024, 1024), float32
    assert categories["parameters"] == params and categories["gradients"] == params
    assert categories["optimizer state"] == 2 * params  # Adam's two moments on the device
    assert oom["breakdown"]["largest"] == "optimizer state"
    top = oom["sites"][0]  # by allocation site: Adam's moments, made by opt.step() at line 7
    assert (top["site"], top["category"], top["blocks"]) == ("script.py:7 in <module>", "optimizer state", 8)
    assert sum(s["bytes"] for s in oom["sites"]) >= sum(categories[c] for c in categories
                                                        if c not in ("cached, unallocated", "size-class rounding"))
    assert "out of memory: live memory by allocation site and category" in result.stdout
    assert "id='out-of-memory-sites'" in (tmp_path / "torchneuron-check.html").read_text()
    blocks = oom["largest_blocks"]  # 4 MiB weights, gradients and Adam moments, each from its line
    assert [b["bytes"] for b in blocks] == [4 * MiB] * 5 and blocks[0]["site"].startswith("script.py:")
    assert {b["category"] for b in blocks} <= {"parameters", "gradients", "optimizer state"}
    assert "out of memory: largest live blocks" in result.stdout
    assert "id='out-of-memory-blocks'" in (tmp_path / "torchneuron-check.html").read_text()
    assert [(f["chip"], f["lnc"]) for f in oom["fits"] if f["fits"]] == [("trn3", 2)]
    assert "out of memory: what filled neuron:0" in result.stdout
    advice = data["recommendations"][0]
    assert advice["severity"] == "memory" and "the largest category is optimizer state" in advice["text"]
    assert "it would fit one device of trn3 LNC=2" in advice["text"]
    assert "the site holding the most is script.py:7 in <module>" in advice["text"]
    # trainium-facts.md: trn2.48xlarge is 16 Trn2 chips, 64 logical cores at LNC=2, 1.5 TiB HBM.
    sizing = data["memory"]["instance"]
    assert (sizing["name"], sizing["chips"], sizing["cores_per_chip"], sizing["devices"]) == \
        ("trn2.48xlarge", 16, 4, 64)
    assert sizing["bytes_per_device"] == 24 * GiB and sizing["total_bytes"] == 1536 * GiB
    assert sizing["fits_one_device"] and sizing["devices_needed_at_least"] == 1
    assert data["target"]["devices"] == 64 and data["target"]["instance"] == "trn2.48xlarge"
    assert "instance trn2.48xlarge: 16 trn2 chips x 4 logical cores (LNC=2) = 64 devices" in result.stdout
    assert "id='out-of-memory'" in (tmp_path / "torchneuron-check.html").read_text()
    # check records allocation stacks itself (the script does not call _record_memory_history):
    # after the first step, what fills the device by category and by allocation site.
    sampled = data["memory"]["breakdown"]
    assert sampled["when"] == "after optimizer step 1"
    assert sum(c["bytes"] for c in sampled["categories"] if c["name"] != "cached, unallocated") == \
        sampled["allocated"]
    assert {(s["site"], s["category"], s["blocks"], s["bytes"]) for s in sampled["sites"]} == {
        ("script.py:7 in <module>", "optimizer state", 8, 2 * params),
        ("script.py:3 in <module>", "parameters", 4, params),
        ("script.py:6 in <module>", "gradients", 4, params)}
    assert sum(s["bytes"] for s in sampled["sites"]) == sampled["allocated"]
    assert "after optimizer step 1: live memory by allocation site" in result.stdout
    assert "id='breakdown-sites'" in (tmp_path / "torchneuron-check.html").read_text()


def test_a_bad_instance_name_is_a_usage_error_naming_the_valid_ones(capsys, tmp_path):
    from torchneuron import cli

    script = tmp_path / "script.py"
    script.write_text("raise SystemExit('must not run')\n")
    assert cli.main(["check", "--instance", "trn2.49xlarge", str(script)]) == 2
    out = " ".join(capsys.readouterr().out.split())
    assert "--instance 'trn2.49xlarge' is not a known instance type" in out
    assert "trn2.3xlarge, trn2.48xlarge, trn2u.48xlarge" in out
    assert cli.main(["check", "--instance", "trn2.48xlarge", "--target", "trn3", str(script)]) == 2
    assert "conflicts with" in capsys.readouterr().out


TESTS = """\
import pathlib
import torch

def test_fallback_sites():
    x = torch.ones(4, dtype=torch.float64)
    for _ in range(3):
        y = x * 2  # site A
    z = x * 3  # site B
    sites = [
        lambda t: t * 4,
        lambda t: t * 4,
        lambda t: t * 4,
        lambda t: t * 4,
        lambda t: t * 4,
        lambda t: t * 4,
        lambda t: t * 4,
        lambda t: t * 4,
        lambda t: t * 4,
        lambda t: t * 4,
    ]
    for f in sites:
        f(x)

def test_not_named():
    pathlib.Path("ran-test-not-named").write_text("it ran")

def test_fails():
    x = torch.ones(3)
    assert x.sum().item() == 4  # wrong
"""


def test_a_pytest_node_runs_only_that_test_with_every_fallback_call_site(tmp_path):
    result, data = check(tmp_path, "tests/test_model.py::test_fallback_sites",
                         files={"tests/test_model.py": TESTS})
    assert result.returncode == 0, result.stdout + result.stderr
    assert data["command"] == ["tests/test_model.py::test_fallback_sites"]
    assert not (tmp_path / "ran-test-not-named").exists()  # only the named test ran
    assert not (tmp_path / ".pytest_cache").exists()  # nothing written for pytest's cache
    mul = next(f for f in data["fallbacks"] if f["op"] == "aten::mul.Tensor")
    assert mul["calls"] == 14
    sites = [(s["site"].split("/")[-1], s["calls"]) for s in mul["call_sites"]]
    assert sites[0] == ("test_model.py:7 in test_fallback_sites", 3)  # site A, most calls first
    assert ("test_model.py:8 in test_fallback_sites", 1) in sites  # site B
    # capped at 10 distinct sites; the rest are counted together
    assert len(sites) == 11 and sites[-1] == ("(other call sites)", 2)
    assert sum(n for _, n in sites) == mul["calls"]
    assert "call sites (calls)" in result.stdout
    texts = [r["text"] for r in data["recommendations"] if "aten::mul.Tensor" in r["text"]]
    assert texts and "(and 10 more call sites)" in texts[0]


def test_a_failing_pytest_node_fails_with_the_tests_line(tmp_path):
    result, data = check(tmp_path, "tests/test_model.py::test_fails", files={"tests/test_model.py": TESTS})
    assert result.returncode == 1, result.stdout + result.stderr
    assert data["verdict"] == "fails" and data["outcome"]["exception_type"] == "AssertionError"
    line = next(i for i, text in enumerate(TESTS.splitlines(), 1) if "# wrong" in text)
    assert data["outcome"]["site"].endswith(f"test_model.py:{line} in test_fails")
    items = [s for s in data["host_syncs"]["by_site"] if s["kind"] == "item"]
    assert [(s["site"].endswith(f"test_model.py:{line} in test_fails"), s["count"]) for s in items] == [(True, 1)]
    assert not (tmp_path / "ran-test-not-named").exists()


@pytest.mark.parametrize("node_id, error", [
    ("tests/missing.py::test_x", "no test file 'tests/missing.py'"),
    ("tests/notes.txt::test_x", "is not a pytest node id"),
])
def test_bad_node_ids_are_usage_errors(capsys, node_id, error):
    from torchneuron import cli

    assert cli.main(["check", node_id]) == 2
    assert error in " ".join(capsys.readouterr().out.split())
