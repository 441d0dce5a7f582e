"""The memory counter, the collectives row and call sites in torch.profiler traces.

Per neuron device the trace holds a counter track of its allocated bytes (Trace Event
Format "C" events, one per allocation and free, from the allocator's record) and one row
of its collectives; with TORCH_NEURONX_ENABLE_STACK_TRACE=1 each device event names the
Python line that issued it.
"""

from __future__ import annotations

import json

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from torchneuron import config
from torchneuron.device import accounting

ACTIVITIES = [ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]
MiB = 1 << 20


def _trace(prof, tmp_path) -> dict:
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(str(path))
    return json.loads(path.read_text())


def _counters(trace: dict, device: int) -> list[dict]:
    events = [e for e in trace["traceEvents"]
              if e.get("ph") == "C" and e.get("name") == f"neuron:{device} memory"]
    return sorted(events, key=lambda e: e["ts"])  # stable: samples of one instant keep their order


def _thread_names(trace: dict) -> dict[tuple, str]:
    return {(e["pid"], e["tid"]): e["args"]["name"] for e in trace["traceEvents"]
            if e.get("ph") == "M" and e["name"] == "thread_name"}


def _device_events(trace: dict) -> list[dict]:
    return [e for e in trace["traceEvents"] if e.get("ph") == "X" and "modeled us" in e.get("args", {})]


# ---- the memory counter ----------------------------------------------------------

def test_memory_counter_equals_memory_allocated_at_each_allocation_and_free(tmp_path):
    torch.neuron.synchronize()
    expected = []
    with profile(activities=ACTIVITIES) as prof:
        expected.append(torch.neuron.memory_allocated(0))  # the counter starts at what is held
        a = torch.empty(MiB, dtype=torch.uint8, device="neuron:0")
        expected.append(torch.neuron.memory_allocated(0))
        b = torch.empty(3 * MiB, dtype=torch.uint8, device="neuron:0")
        expected.append(torch.neuron.memory_allocated(0))
        del a
        expected.append(torch.neuron.memory_allocated(0))
        del b
        expected.append(torch.neuron.memory_allocated(0))
    counters = _counters(_trace(prof, tmp_path), 0)
    assert [e["args"]["allocated"] for e in counters] == expected
    assert expected[2] - expected[0] == 4 * MiB  # the allocations the counter saw are these tensors


def test_memory_counter_events_follow_the_trace_event_format(tmp_path):
    with profile(activities=ACTIVITIES) as prof:
        x = torch.randn(256, 256, device="neuron")
        y = x @ x
        del x, y
    trace = _trace(prof, tmp_path)
    counters = [e for e in trace["traceEvents"] if e.get("ph") == "C"]
    assert counters
    window = [e for e in trace["traceEvents"] if e.get("ph") == "X"]
    first, last = min(e["ts"] for e in window), max(e["ts"] + e["dur"] for e in window)
    for e in counters:
        # Counter events: a name, a pid (the device's process), a timestamp in us, and
        # args holding the series' numeric values (Trace Event Format, "Counter Events").
        assert isinstance(e["name"], str) and isinstance(e["pid"], int), e
        assert isinstance(e["ts"], (int, float)), e
        assert e["args"] and all(isinstance(v, (int, float)) for v in e["args"].values()), e
        assert e["args"]["allocated"] >= 0
        assert first - 1 <= e["ts"] <= last + 1  # inside the recorded window
    assert {e["pid"] for e in counters} == set(range(torch.neuron.device_count()))
    # points of a graph, not events: key_averages() has no rows for them
    assert not [e.key for e in prof.key_averages() if "memory" in e.key]


def test_each_device_has_its_own_memory_counter(tmp_path):
    if torch.neuron.device_count() < 2:
        pytest.skip("needs two neuron devices")
    before = torch.neuron.memory_allocated(1)
    with profile(activities=ACTIVITIES) as prof:
        t = torch.empty(2 * MiB, dtype=torch.uint8, device="neuron:1")
        held = torch.neuron.memory_allocated(1)
        del t
    trace = _trace(prof, tmp_path)
    assert [e["args"]["allocated"] for e in _counters(trace, 1)] == [before, held, before]
    assert {e["pid"] for e in _counters(trace, 1)} == {1}
    assert held - before == 2 * MiB


def test_recording_hands_out_memory_samples_only_when_asked():
    samples: list[accounting.MemorySample] = []
    with accounting.recording(memory=samples) as events:
        t = torch.empty(MiB, dtype=torch.uint8, device="neuron:0")
        held = torch.neuron.memory_allocated(0)
        del t
    assert held in [s.allocated for s in samples if s.device == 0]
    assert all(e.kind != "memory" for e in events)
    with accounting.recording() as events:
        torch.empty(MiB, dtype=torch.uint8, device="neuron:0")
    assert all(e.kind != "memory" for e in events)


# ---- collectives ------------------------------------------------------------------

def test_collectives_are_on_one_row_per_device(tmp_path):
    devices = range(min(2, torch.neuron.device_count()))
    side = torch.neuron.Stream(device=0)
    with profile(activities=ACTIVITIES) as prof:
        for d in devices:
            x = torch.randn(64, 64, device=f"neuron:{d}")
            x @ x
            accounting.record_work(accounting.WorkKind.COLLECTIVE, "all_reduce", d, 20e-6,
                                   nbytes=1 << 16, engine="NeuronLink")
        with torch.neuron.stream(side):  # another stream's collective joins the same row
            accounting.record_work(accounting.WorkKind.COLLECTIVE, "all_gather", 0, 10e-6,
                                   nbytes=1 << 16, engine="NeuronLink")
    trace = _trace(prof, tmp_path)
    names = _thread_names(trace)
    events = _device_events(trace)
    collectives = [e for e in events if e["args"]["kind"] == "collective"]
    assert sorted(e["name"] for e in collectives) == sorted(["all_reduce"] * len(devices) + ["all_gather"])
    for e in collectives:
        assert names[(e["pid"], e["tid"])] == f"neuron:{e['args']['device']} collectives"
        assert e["args"]["engine"] == "NeuronLink"  # the link still says what it used
        assert e["dur"] == pytest.approx(e["args"]["modeled us"], abs=1e-3)
    # ... and nothing else is on a collectives row
    for e in events:
        if e["args"]["kind"] != "collective":
            assert not names[(e["pid"], e["tid"])].endswith("collectives")
    assert {e["pid"] for e in collectives} == set(devices)


def test_collectives_row_sorts_after_the_streams(tmp_path):
    with profile(activities=ACTIVITIES) as prof:
        x = torch.randn(64, 64, device="neuron:0")
        x @ x
        accounting.record_work(accounting.WorkKind.COLLECTIVE, "all_reduce", 0, 5e-6, engine="NeuronLink")
    trace = _trace(prof, tmp_path)
    order = {(e["pid"], e["tid"]): e["args"]["sort_index"] for e in trace["traceEvents"]
             if e.get("ph") == "M" and e["name"] == "thread_sort_index"}
    rows = {name: order[key] for key, name in _thread_names(trace).items()
            if key[0] == 0 and name.startswith("neuron:0")}
    assert max(rows, key=rows.get) == "neuron:0 collectives", rows


# ---- call sites (TORCH_NEURONX_ENABLE_STACK_TRACE) -----------------------------------

class _Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(32, 32))

    def forward(self, x):
        return x @ self.weight  # FORWARD LINE


def _line_of(marker: str) -> int:
    with open(__file__) as f:
        return next(i for i, line in enumerate(f, 1) if marker in line and "_line_of" not in line)


def test_stack_trace_names_the_user_line_of_each_op(tmp_path):
    block = _Block().to("neuron")
    x = torch.randn(8, 32, device="neuron")
    with config.override(TORCH_NEURONX_ENABLE_STACK_TRACE="1"), profile(activities=ACTIVITIES) as prof:
        y = x.exp()  # EXP LINE
        block(y)  # BLOCK CALL LINE
    trace = _trace(prof, tmp_path)
    sites = {e["name"]: e["args"].get("call site") for e in _device_events(trace)}
    # the innermost frame outside torch and torchneuron: this file, not torch/nn/modules
    assert sites["neuron::exp"] == (
        f"{__file__}:{_line_of('EXP LINE')} in test_stack_trace_names_the_user_line_of_each_op")
    assert sites["neuron::mm"] == f"{__file__}:{_line_of('FORWARD LINE')} in forward"
    stacks = {e["name"]: e["args"].get("python stack") for e in _device_events(trace)}
    assert stacks["neuron::mm"] == [  # the whole stack of user frames, innermost first
        f"{__file__}:{_line_of('FORWARD LINE')} in forward",
        f"{__file__}:{_line_of('BLOCK CALL LINE')} in test_stack_trace_names_the_user_line_of_each_op",
        *stacks["neuron::exp"][1:]]  # pytest's frames below the test, as for every op of the test
    assert stacks["neuron::exp"][0] == sites["neuron::exp"]


def _nested_user_call(x):
    return x.exp()  # NESTED OP LINE


def test_recorded_events_keep_the_whole_python_stack():
    x = torch.randn(4, device="neuron")
    with config.override(TORCH_NEURONX_ENABLE_STACK_TRACE="1"), accounting.recording() as events:
        _nested_user_call(x)  # OUTER CALL LINE
    event, = events
    assert event.stack[:2] == (f"{__file__}:{_line_of('NESTED OP LINE')} in _nested_user_call",
                               f"{__file__}:{_line_of('OUTER CALL LINE')} in "
                               f"test_recorded_events_keep_the_whole_python_stack")
    assert event.site == event.stack[0]
    assert not any("/torch/" in frame or "/torchneuron/" in frame for frame in event.stack)


def test_backward_ops_name_the_backward_call():
    block = _Block().to("neuron")
    x = torch.randn(8, 32, device="neuron")
    with config.override(TORCH_NEURONX_ENABLE_STACK_TRACE="1"), accounting.recording() as events:
        loss = block(x).sum()
        loss.backward()  # BACKWARD LINE
    backward = [e for e in events if e.host_ns > events[1].host_ns]  # after the forward's mm and sum
    assert backward
    line = _line_of("BACKWARD LINE")
    assert {e.site for e in backward} == {
        f"{__file__}:{line} in test_backward_ops_name_the_backward_call"}


def test_stack_trace_is_off_by_default_and_after_the_override(tmp_path):
    assert config.get_flag("TORCH_NEURONX_ENABLE_STACK_TRACE") is False
    x = torch.randn(8, 8, device="neuron")
    with config.override(TORCH_NEURONX_ENABLE_STACK_TRACE="1"), accounting.recording() as on:
        x.exp()
    with accounting.recording() as off:
        x.exp()
    with profile(activities=ACTIVITIES) as prof:
        x.exp()
    assert [e.site.rsplit(" in ", 1)[1] for e in on] == ["test_stack_trace_is_off_by_default_and_after_the_override"]
    assert [e.site for e in off] == [""]
    assert all("call site" not in e["args"] for e in _device_events(_trace(prof, tmp_path)))


def test_stack_trace_setting_is_checked():
    with (pytest.raises(ValueError, match="TORCH_NEURONX_ENABLE_STACK_TRACE='maybe' is not valid"),
          config.override(TORCH_NEURONX_ENABLE_STACK_TRACE="maybe")):
        pass
    x = torch.randn(4, device="neuron")
    with accounting.recording() as events:
        x.exp()
    assert [e.site for e in events] == [""]  # the refused value did not switch it on
