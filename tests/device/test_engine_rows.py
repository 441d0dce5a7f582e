"""torch.profiler traces draw each neuron stream as one row per engine (TensorE, VectorE, DMA, ...).

Every device event sits on exactly one row: its stream's row for its engine, or the stream's
own row when the model names no engine; the engine rows sort right under their stream's row,
so Perfetto and chrome://tracing show a stream's engines together.
"""

from __future__ import annotations

import json

import torch
from torch.profiler import ProfilerActivity, profile

ACTIVITIES = [ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]


def _step() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10)).to("neuron")
    x = torch.randn(16, 32).to("neuron")
    model(x).square().mean().backward()
    a = torch.randn(512, 512).to("neuron")
    a @ a  # big enough to be TensorE-bound (the small layers are bound by their data movement)
    x.sum().item()  # a copy to the host and a host sync


def _trace(tmp_path) -> dict:
    _step()  # warm: placement and cost decisions are made outside the profile
    with profile(activities=ACTIVITIES) as prof:
        _step()
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(str(path))
    return json.loads(path.read_text())


def _metadata(trace: dict, name: str) -> dict[tuple, object]:
    return {(e["pid"], e["tid"]): e["args"][next(iter(e["args"]))] for e in trace["traceEvents"]
            if e.get("ph") == "M" and e["name"] == name}


def _device_events(trace: dict) -> list[dict]:
    return [e for e in trace["traceEvents"] if e.get("ph") == "X" and "modeled us" in e.get("args", {})]


def test_each_device_event_is_on_its_streams_engine_row(tmp_path):
    trace = _trace(tmp_path)
    rows = _metadata(trace, "thread_name")
    events = _device_events(trace)
    assert events
    engines = set()
    for e in events:
        args = e["args"]
        stream_row = f"neuron:{args['device']} stream {args['stream']}"
        engine = args.get("engine")
        assert rows[(e["pid"], e["tid"])] == (f"{stream_row} {engine}" if engine else stream_row), e
        engines.add(engine)
    assert {"TensorE", "DMA"} <= engines, engines  # matmuls, and the copies
    assert None in engines  # the host sync has no engine: the stream's own row


def test_engine_rows_sort_under_their_stream_row(tmp_path):
    trace = _trace(tmp_path)
    rows = _metadata(trace, "thread_name")
    order = _metadata(trace, "thread_sort_index")
    neuron = sorted((order[key], name) for key, name in rows.items()
                    if str(name).startswith("neuron:") and key in order)
    streams = [name for _, name in neuron if name.count(" ") == 2]  # "neuron:0 stream 0"
    assert streams
    # in sort order, each engine row follows its own stream's row (or a sibling engine row)
    current = None
    for _, name in neuron:
        if name in streams:
            current = name
        else:
            assert current is not None and name.startswith(current + " "), (name, current)
