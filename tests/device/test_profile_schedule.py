"""torchneuron.profiler.profile: torch.profiler's schedule and on_trace_ready, with the device on.

A schedule (skip_first, wait, warmup, active, repeat) makes one trace per active
cycle, handed to on_trace_ready; each trace holds the device work of its own active
steps and nothing from the steps before or between.
"""

from __future__ import annotations

import json
import os

import pytest
import torch
from torch.profiler import (
    ProfilerActivity,
    record_function,
    schedule,
    tensorboard_trace_handler,
)

import torchneuron
from torchneuron.profiler import profile


def _device_events(trace: dict) -> list[dict]:
    return [e for e in trace["traceEvents"] if e.get("ph") == "X" and "modeled us" in e.get("args", {})]


def _steps(trace: dict) -> dict[int, dict]:
    return {int(e["name"].split("#")[1]): e for e in trace["traceEvents"]
            if e.get("ph") == "X" and e["name"].startswith("ProfilerStep#")}


def _run(steps: int, prof, a: torch.Tensor) -> None:
    for step in range(steps):
        with record_function(f"user_step_{step}"):
            for _ in range(step + 1):  # step i issues i + 1 matmuls: a trace's count names its steps
                a @ a
        prof.step()


def test_one_trace_per_active_cycle_with_only_its_steps_device_work(tmp_path):
    a = torch.randn(32, 32, device="neuron")
    a @ a  # warm: placement and cost decisions are made outside the profile
    traces: list[dict] = []

    def keep(prof) -> None:
        path = tmp_path / f"cycle{len(traces)}.json"
        prof.export_chrome_trace(str(path))
        traces.append(json.loads(path.read_text()))

    # step 0 skipped; cycle 1: wait 1, warmup 2, active 3-4; cycle 2: wait 5, warmup 6, active 7-8
    plan = schedule(skip_first=1, wait=1, warmup=1, active=2, repeat=2)
    with profile(schedule=plan, on_trace_ready=keep) as prof:
        _run(10, prof, a)
    assert len(traces) == 2
    for trace, active in zip(traces, ([3, 4], [7, 8])):
        steps = _steps(trace)
        assert sorted(steps) == active
        mms = [e for e in _device_events(trace) if e["name"] == "neuron::mm"]
        assert len(mms) == sum(step + 1 for step in active)
        # each was issued inside one of the trace's active steps (its host-side launch)
        launches = [e for e in trace["traceEvents"] if e.get("name") == "neuronLaunch"]
        assert len(launches) >= len(mms)
        for launch in launches:
            assert any(s["ts"] <= launch["ts"] <= s["ts"] + s["dur"] for s in steps.values()), launch


def test_tensorboard_trace_handler_writes_a_trace_per_cycle(tmp_path):
    a = torch.randn(32, 32, device="neuron")
    plan = schedule(wait=0, warmup=1, active=1, repeat=3)
    with profile(schedule=plan, on_trace_ready=tensorboard_trace_handler(str(tmp_path), "w")) as prof:
        _run(8, prof, a)
    files = sorted(os.listdir(tmp_path))
    assert len(files) == 3 and all(f.startswith("w.") and f.endswith(".pt.trace.json") for f in files)
    counts = []
    for name in files:
        trace = json.loads((tmp_path / name).read_text())
        [step] = _steps(trace)
        counts.append((step, len([e for e in _device_events(trace) if e["name"] == "neuron::mm"])))
    assert sorted(counts) == [(1, 2), (3, 4), (5, 6)]


def test_records_the_host_and_the_device_by_default(tmp_path):
    a = torch.randn(32, 32, device="neuron")
    with profile() as prof:
        a @ a
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(str(path))
    trace = json.loads(path.read_text())
    assert [e["name"] for e in _device_events(trace)] == ["neuron::mm"]
    assert any(e.get("cat") == "cpu_op" and e["name"] == "aten::mm" for e in trace["traceEvents"])
    assert prof.activities == {ProfilerActivity.CPU, ProfilerActivity.PrivateUse1}
    assert isinstance(prof, torch.profiler.profile)  # key_averages, export_stacks, ... are PyTorch's


def test_is_the_package_profiler():
    assert torchneuron.profiler.profile is profile


def test_bad_schedule_or_handler_is_a_clear_error():
    with pytest.raises(TypeError, match=r"schedule must be a callable .* torch.profiler.schedule"):
        profile(schedule=3)
    with pytest.raises(TypeError, match="on_trace_ready must be a callable taking the profiler"):
        profile(on_trace_ready="./log")
