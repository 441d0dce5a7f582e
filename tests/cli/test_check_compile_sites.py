"""`torchneuron check` on compiled code: every graph break (data-dependent branches too) and
recompile with its call site, in the terminal, HTML and JSON; the modelled views of --target."""


from check_cli_support import run_check

COMPILED = """\
import torch
def step(t, n):
    t = t.sin()
    if t.sum() > 0:  # data-dependent branch
        t = t + n
    return t.cos()
f = torch.compile(step, backend="neuron")
for i in range(3):
    f(torch.ones(3 + i), i)  # a new shape each time
"""


def _line(marker: str) -> int:
    return next(i for i, line in enumerate(COMPILED.splitlines(), 1) if marker in line)


def test_graph_breaks_and_recompiles_with_call_sites_on_the_selected_target(tmp_path):
    result, data = run_check(tmp_path, "--target", "trn3", "train.py", files={"train.py": COMPILED})
    assert result.returncode == 0, result.stdout + result.stderr
    compile_ = data["compile"]
    assert compile_["graph_breaks"] >= 1
    branch = f"train.py:{_line('data-dependent branch')} in step"
    breaks = [r for r in compile_["graph_break_sites"] if r["site"].endswith(branch)]
    assert breaks and breaks[0]["reason"].startswith("Data-dependent branching")
    assert compile_["recompiles"] >= 1
    # the function's frame (line 2), or the part Dynamo resumes after the break (line 4)
    assert {r["site"].split("/")[-1] for r in compile_["recompile_sites"]} == {
        "train.py:2 in step", f"{branch}"}
    texts = [r["text"] for r in data["recommendations"]]
    assert any(t.startswith(f"{compile_['graph_breaks']} graph break(s) split compiled graphs: "
                            "Data-dependent branching") and branch in t for t in texts)  # its first line
    assert any("recompile(s)" in t and "compiled frame" in t and "train.py:2 in step" in t for t in texts)
    out = " ".join(result.stdout.split())
    assert "graph breaks by call site" in out and "recompiles by call site" in out
    assert branch in out
    # --target trn3: the top ops and the family plot are trn3's
    assert data["target"]["chip"] == "trn3"
    assert "top ops by modelled time on trn3" in out and "on trn2" not in out
    page = (tmp_path / "torchneuron-check.html").read_text()
    assert "id='graph-break-sites'" in page and "id='recompile-sites'" in page
    assert branch in page.split("All figures (JSON)")[0]


def test_the_family_plot_is_the_selected_targets(monkeypatch):
    from torchneuron.check import report_html

    labels = []
    real = report_html._png

    def spy(fig):
        labels.append(fig.axes[0].get_xlabel())
        return real(fig)

    monkeypatch.setattr(report_html, "_png", spy)
    family = {"lnc": 2, "seconds": 1e-6, "families": {"matmul": 1e-6}}
    data = {"target": {"chip": "trn3"}, "modelled": {"trn2": {**family, "lnc": 1}, "trn3": family},
            "roofline": {"points": [], "peak_flops_per_second": 1e15, "hbm_bytes_per_second": 1e12,
                         "chip": "trn3", "lnc": 2},
            "memory": {"timeline": [], "peak_allocated_bytes": 0, "samples": []}, "fallbacks": [],
            "steps": 0}
    report_html._plots(data)
    assert labels[0] == "modelled time on trn3 LNC=2 (us)"
