"""Chrome trace export of an NKI kernel's modelled timeline.

``KernelCost.to_chrome_trace(path)`` (:mod:`torchneuron.nki.cost`) lands here. The
output is the Trace Event Format that chrome://tracing and https://ui.perfetto.dev
open: one process per physical NeuronCore, one track per compute engine (TensorE,
VectorE, ScalarE, GpSimd, SyncE) and one per DMA queue; each instruction is a
complete ("X") event whose args carry the instruction index, the kernel source line,
the cost formula, FLOPs and DMA bytes. Timestamps are microseconds.

The profiler imports ``torchneuron.nki`` types only for annotations; ``nki`` imports
this module lazily, so the dependency runs profiler -> nki.
"""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING, Any

from torchneuron.hardware.engines import TRACK_ORDER, Engine

if TYPE_CHECKING:
    from torchneuron.nki.cost import KernelCost, TimelineEvent

__all__ = ["chrome_trace", "write_chrome_trace", "ENGINE_TRACKS"]

# Track ids (Chrome "tid") and display names of the engines (hardware/engines.py), keyed by
# the names NKI's records use: tensor 1 TensorE ... sync 5 SyncE. DMA is drawn per queue:
# queue q is tid DMA_TRACK_BASE + q.
ENGINE_TRACKS: dict[str, tuple[int, str]] = {
    e.short: (i + 1, e.value) for i, e in enumerate(TRACK_ORDER) if e is not Engine.DMA}
DMA_TRACK_BASE = 100


def _track(event: "TimelineEvent") -> tuple[int, str]:
    if event.queue is not None:
        return DMA_TRACK_BASE + event.queue, f"DMA queue {event.queue}"
    return ENGINE_TRACKS.get(event.engine, (50 + abs(hash(event.engine)) % 40, event.engine))


def chrome_trace(cost: "KernelCost") -> dict[str, Any]:
    """The trace as a JSON-serialisable dict (``{"traceEvents": [...], ...}``)."""
    events: list[dict[str, Any]] = []
    tracks: dict[tuple[int, int], str] = {}
    for e in cost.events:
        tid, name = _track(e)
        tracks[(e.core, tid)] = name
        args: dict[str, Any] = {"index": e.index, "program": e.program, "formula": e.formula}
        if e.location:
            args["location"] = e.location
        if e.source:
            args["source"] = e.source
        if e.flops:
            args["flops"] = e.flops
        if e.queue is not None:
            args["bytes"] = e.bytes
            args["dma_engines"] = list(e.dma_engines)
            if e.data_start_ns is not None:
                args["data_start_us"] = e.data_start_ns / 1e3
        events.append({"name": e.opcode, "cat": e.engine, "ph": "X", "pid": e.core, "tid": tid,
                       "ts": e.start_ns / 1e3, "dur": max(e.duration_ns, 0.0) / 1e3, "args": args})
    meta: list[dict[str, Any]] = []
    for core in sorted({core for core, _ in tracks}):
        meta.append({"name": "process_name", "ph": "M", "pid": core, "tid": 0,
                     "args": {"name": f"NeuronCore {core} ({cost.target}) - {cost.kernel_name}"}})
        meta.append({"name": "process_sort_index", "ph": "M", "pid": core, "tid": 0, "args": {"sort_index": core}})
    for (core, tid), name in sorted(tracks.items()):
        meta.append({"name": "thread_name", "ph": "M", "pid": core, "tid": tid, "args": {"name": name}})
        meta.append({"name": "thread_sort_index", "ph": "M", "pid": core, "tid": tid, "args": {"sort_index": tid}})
    return {
        "traceEvents": meta + events,
        "displayTimeUnit": "ns",
        "otherData": {
            "kernel": cost.kernel_name, "target": cost.target, "lnc": cost.lnc,
            "latency_us": cost.latency_us, "hfu": cost.hfu, "mbu": cost.mbu,
            "source": "torchneuron NKI cost model (modelled, not measured)",
        },
    }


def write_chrome_trace(cost: "KernelCost", path: str | os.PathLike) -> dict[str, Any]:
    """Write :func:`chrome_trace` to ``path`` (JSON, whatever the extension) and return it."""
    trace = chrome_trace(cost)
    directory = os.path.dirname(os.fspath(path))
    if directory:
        os.makedirs(directory, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(trace, f)
    return trace
