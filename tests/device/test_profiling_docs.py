"""docs/profiling.md's examples run as written and show what the page says."""

from __future__ import annotations

import json
import pathlib
import re

DOC = pathlib.Path(__file__).resolve().parents[2] / "docs" / "profiling.md"
BLOCKS = re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S)


def test_profiling_examples_run_and_trace_the_device(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    for index, block in enumerate(BLOCKS):
        exec(compile(block, f"{DOC.name}[{index}]", "exec"), namespace)
    table = capsys.readouterr().out
    assert "NEURON total" in table  # key_averages has the device columns
    trace = json.loads((tmp_path / "trace.json").read_text())
    kernels = [e for e in trace["traceEvents"] if e.get("cat") == "kernel"]
    assert kernels and all(e["args"]["modeled us"] > 0 for e in kernels if e["args"]["kind"] == "op")
    assert any(e.get("ph") == "C" and e["name"] == "neuron:0 memory" for e in trace["traceEvents"])
    events = namespace["events"]
    assert events and events[0].kind in ("op", "copy")
    assert len(list((tmp_path / "log").iterdir())) == 2  # the schedule's two active cycles
    ranges = json.loads((tmp_path / "ranges.json").read_text())["traceEvents"]
    assert any(e.get("cat") == "gpu_user_annotation" and e["name"] == "train_step" for e in ranges)
    sites = json.loads((tmp_path / "sites.json").read_text())
    assert any("call site" in e["args"] for e in sites["traceEvents"] if e.get("cat") == "kernel")
