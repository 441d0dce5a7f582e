"""torch.profiler on neuron: device tracks of modelled time, from the one accounting record.

An unmodified ``torch.profiler`` script gets, beside the host timeline, one
track per neuron stream with each op's, copy's, compiled kernel's and NKI
kernel's modelled duration, linked to the host op that issued it; the device
time in ``key_averages()`` is that modelled time, and it equals what
``torchneuron.estimate`` and the stream clocks say.
"""

from __future__ import annotations

import json
import math

import pytest
import torch
from torch.profiler import ProfilerActivity, profile, record_function

import torchneuron
from torchneuron.device import accounting

ACTIVITIES = [ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]


def _mlp_step(device: str = "neuron") -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10)).to(device)
    x = torch.randn(16, 32, device=device)
    loss = model(x).square().mean()
    loss.backward()


def _trace(prof, tmp_path) -> dict:
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(str(path))
    return json.loads(path.read_text())


def _device_events(trace: dict) -> list[dict]:
    return [e for e in trace["traceEvents"]
            if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy")]


def test_profiler_trace_has_device_tracks_with_modelled_durations(tmp_path):
    _mlp_step()  # warm: placement and cost decisions are made outside the profile
    with profile(activities=ACTIVITIES) as prof:
        _mlp_step()
    device = _device_events(_trace(prof, tmp_path))
    assert device, "the trace has no neuron device events"
    names = {e["name"] for e in device}
    assert {"neuron::addmm", "neuron::mm"} <= names, names  # aten::mm's device work
    for e in device:
        args = e["args"]
        # each duration is the event's modelled time (the trace's unit is microseconds)
        assert e["dur"] == pytest.approx(args["modeled us"], abs=1e-3 + 1e-6 * args["modeled us"])
        assert args["kind"] in ("op", "copy", "cpu_fallback", "host_sync", "compiled_kernel")
    assert sum(e["dur"] for e in device) > 0


def test_device_events_follow_their_host_ops(tmp_path):
    _mlp_step()
    with profile(activities=ACTIVITIES) as prof:
        _mlp_step()
    trace = _trace(prof, tmp_path)
    device = _device_events(trace)
    # Each device event is linked to the host op that issued it (a flow arrow) ...
    flows = [e for e in trace["traceEvents"] if e.get("cat") == "ac2g"]
    assert flows, "no host-to-device flow arrows"
    # ... and starts no earlier than it was issued; a stream's events never overlap.
    by_track: dict[tuple, list[dict]] = {}
    for e in device:
        by_track.setdefault((e["pid"], e["tid"]), []).append(e)
    for events in by_track.values():
        events.sort(key=lambda e: e["ts"])
        for a, b in zip(events, events[1:]):
            assert a["ts"] + a["dur"] <= b["ts"] + 1e-3


def test_key_averages_device_time_is_the_modelled_time():
    _mlp_step()
    torch.neuron.synchronize()
    start = accounting.stream_clock(0)
    with profile(activities=ACTIVITIES) as prof:
        _mlp_step()
    modelled_us = (accounting.stream_clock(0) - start) * 1e6
    device_events = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.PrivateUse1]
    device_us = sum(e.device_time_total for e in device_events)
    assert device_us > 0
    # the trace's unit is whole nanoseconds: each event rounds by at most half of one
    assert device_us == pytest.approx(modelled_us, abs=1e-3 * len(device_events))
    host_mm = [a for a in prof.key_averages() if a.key == "aten::mm" and a.cpu_time_total > 0]
    assert host_mm and host_mm[0].device_time_total > 0  # the host op carries its device time


def test_record_function_ranges_and_user_code_still_profile(tmp_path):
    with profile(activities=ACTIVITIES) as prof:
        with record_function("my_step"):
            _mlp_step()
    keys = {a.key for a in prof.key_averages()}
    assert "my_step" in keys
    step = next(a for a in prof.key_averages() if a.key == "my_step")
    assert step.device_time_total > 0  # the range's device time: the work issued inside it


# Trace times are microseconds since boot printed to the nanosecond: at ~5e12 us a float64 sum
# of two of them is off by up to a few ns.
NS = 5e-3


def test_record_function_ranges_are_drawn_on_the_device_timeline(tmp_path):
    _mlp_step()
    x = torch.randn(8, 8, device="neuron")
    with profile(activities=ACTIVITIES) as prof:
        (x @ x).sum()  # outside any range
        with record_function("my_step"):
            with record_function("my_forward"):
                _mlp_step()
            with record_function("host_only"):
                sum(range(100))
    trace = _trace(prof, tmp_path)
    device = _device_events(trace)
    ranges = {e["name"]: e for e in trace["traceEvents"] if e.get("cat") == "gpu_user_annotation"}
    assert {"my_step", "my_forward"} <= set(ranges) and "host_only" not in ranges, sorted(ranges)
    host = {e["name"]: e for e in trace["traceEvents"] if e.get("cat") == "user_annotation"}
    for name in ("my_step", "my_forward"):
        drawn = ranges[name]
        assert drawn["pid"] != host[name]["pid"]  # on the device's process, on its stream's row
        stream = (drawn["args"]["device"], drawn["args"]["stream"])
        inside = [e for e in device if (e["args"]["device"], e["args"]["stream"]) == stream
                  and drawn["ts"] - NS <= e["ts"] and e["ts"] + e["dur"] <= drawn["ts"] + drawn["dur"] + NS]
        assert inside, f"{name} covers no device event"
        # it spans exactly its work: from the first item's start to the last one's end
        assert min(e["ts"] for e in inside) == pytest.approx(drawn["ts"], abs=NS)
        assert max(e["ts"] + e["dur"] for e in inside) == pytest.approx(drawn["ts"] + drawn["dur"], abs=NS)
    # the matmul issued before the range is not inside it
    first = min(e["ts"] for e in device)
    assert ranges["my_step"]["ts"] > first
    # ranges are not device work: PyTorch's device-time total (which skips user annotations,
    # as for CUDA's) stays the sum of the device events
    total_us = sum(a.self_device_time_total for a in prof.key_averages()
                   if a.device_type == torch.autograd.DeviceType.PrivateUse1 and not a.is_user_annotation)
    assert total_us == pytest.approx(sum(e["dur"] for e in device), rel=1e-6, abs=1e-3 * len(device))


def test_each_device_has_its_own_track(tmp_path):
    if torch.neuron.device_count() < 2:
        pytest.skip("needs two neuron devices")
    with profile(activities=ACTIVITIES) as prof:
        a = torch.randn(64, 64, device="neuron:0")
        b = torch.randn(64, 64, device="neuron:1")
        (a @ a).sum()
        (b @ b).sum()
    device = _device_events(_trace(prof, tmp_path))
    assert {e["args"]["device"] for e in device} >= {0, 1}
    assert len({e["pid"] for e in device}) >= 2


def test_copies_are_memcpy_events_with_bytes(tmp_path):
    host = torch.randn(256, 256)
    with profile(activities=ACTIVITIES) as prof:
        on_device = host.to("neuron")
        on_device.cpu()
    copies = [e for e in _device_events(_trace(prof, tmp_path)) if e["cat"] == "gpu_memcpy"]
    names = {e["name"] for e in copies}
    assert {"copy host -> device", "copy device -> host"} <= names
    assert all(e["args"]["bytes"] == host.nbytes for e in copies)


def test_profiling_off_records_nothing_and_recorders_are_independent():
    assert not accounting.is_recording()
    with accounting.recording() as outer:
        with profile(activities=ACTIVITIES) as prof:
            with accounting.recording() as inner:
                torch.ones(8, device="neuron").add(1)
        torch.ones(8, device="neuron").mul(2)
    assert not accounting.is_recording()  # every recorder closed: the op path pays one load
    inner_names, outer_names = {e.name for e in inner}, {e.name for e in outer}
    assert "aten::add.Tensor" in inner_names and "aten::mul.Tensor" not in inner_names
    assert {"aten::add.Tensor", "aten::mul.Tensor"} <= outer_names
    assert any(e.name == "neuron::add.Tensor" for e in prof.events())


def test_legacy_profiler_reports_modelled_device_time():
    """torch.autograd.profiler.profile(use_device="neuron"): the legacy profiler times
    each op on the stream's modelled clock (it keeps whole microseconds), never negative."""
    x = torch.randn(64, 64, device="neuron")
    [entry] = [e for e in torchneuron.estimate(lambda: x @ x, targets=("trn2",)).targets["trn2"].ops
               if e.op == "aten::mm"]
    with torch.autograd.profiler.profile(use_device="neuron") as prof:
        for _ in range(3):
            x = x @ x
    mms = [e for e in prof.function_events
           if e.name == "aten::mm" and e.device_type == torch.autograd.DeviceType.CPU]
    assert len(mms) == 3
    for e in mms:
        assert e.device_time_total == int(entry.seconds * 1e6)
    assert all(e.device_time_total >= 0 and e.cpu_time_total >= 0 for e in prof.function_events)


def test_compiled_kernels_appear_on_the_device_track(tmp_path):
    torch._dynamo.reset()

    @torch.compile(backend="neuron")
    def fused(x):
        return torch.relu(x * 2 + 1).sum(dim=1)

    x = torch.randn(128, 64, device="neuron")
    fused(x)
    with profile(activities=ACTIVITIES) as prof:
        fused(x)
    kernels = [e for e in _device_events(_trace(prof, tmp_path)) if e["args"]["kind"] == "compiled_kernel"]
    assert kernels, "no compiled-kernel events"
    assert all(e["name"].startswith("cpp_fused") for e in kernels)
    assert all(e["dur"] > 0 for e in kernels)
    assert math.isclose(sum(e["dur"] for e in kernels), sum(e["args"]["modeled us"] for e in kernels),
                        rel_tol=1e-3)


def test_trace_follows_the_trace_event_format(tmp_path):
    """Every event has the Trace Event Format's required fields with their types; complete
    events have a non-negative duration; flow events pair up (a start and an end per id)."""
    _mlp_step()
    with profile(activities=ACTIVITIES) as prof:
        _mlp_step()
    trace = _trace(prof, tmp_path)
    assert isinstance(trace["traceEvents"], list)
    flows: dict[tuple, set] = {}
    for e in trace["traceEvents"]:
        assert isinstance(e.get("name"), str) and e.get("ph") in set("XBEiIMsftfCbneR"), e
        assert isinstance(e.get("pid"), (int, str)) and isinstance(e.get("tid"), (int, str)), e
        if e["ph"] != "M":
            assert isinstance(e.get("ts"), (int, float)), e
        if e["ph"] == "X":
            assert e["dur"] >= 0, e
        if e["ph"] in ("s", "f"):
            flows.setdefault((e.get("cat"), e["id"]), set()).add(e["ph"])
    neuron_flows = {k: v for k, v in flows.items() if k[0] == "ac2g"}
    assert neuron_flows and all(v == {"s", "f"} for v in neuron_flows.values())
    names = {e["args"]["name"] for e in trace["traceEvents"] if e.get("ph") == "M" and e["name"] == "thread_name"}
    assert any(n.startswith("neuron:0 stream") for n in names), names
