"""A planned step's device work as a Perfetto / chrome://tracing trace (Trace Event Format).

One process per representative rank; on it one track per engine (TensorE, VectorE, ScalarE,
GpSimd, DMA) for ops and kernels, and a track for collectives; times are modelled Trainium
microseconds from the step's first piece of work.
"""

from __future__ import annotations

from typing import Any

from torchneuron.device.accounting import Event

__all__ = ["step_trace_events", "trace_document"]


def step_trace_events(events: list[Event], rank: int) -> list[dict[str, Any]]:
    """One rank's events of one step as Trace Event Format complete events."""
    work = [e for e in events if e.kind not in ("memory", "host_sync")]
    if not work:
        return []
    origin = min(e.device_start for e in work)
    tracks: dict[str, int] = {}
    out: list[dict[str, Any]] = [{"name": "process_name", "ph": "M", "pid": rank,
                                  "args": {"name": f"rank {rank} (modelled Trainium time)"}}]
    for e in work:
        track = "collectives" if e.kind == "collective" else (e.engine.split(",")[0] if e.engine else e.kind)
        if track not in tracks:
            tracks[track] = len(tracks)
            out.append({"name": "thread_name", "ph": "M", "pid": rank, "tid": tracks[track], "args": {"name": track}})
        out.append({"name": e.name, "cat": e.kind, "ph": "X", "pid": rank, "tid": tracks[track],
                    "ts": (e.device_start - origin) * 1e6, "dur": e.seconds * 1e6,
                    "args": {"bytes": e.bytes, "flops": e.flops, "stream": e.stream, "engine": e.engine}})
    return out


def trace_document(events: list[dict[str, Any]]) -> dict[str, Any]:
    return {"traceEvents": events, "displayTimeUnit": "ms"}
