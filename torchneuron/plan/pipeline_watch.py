"""What a planned rank notes of ``torch.distributed.pipelining``: its schedule and stage times.

Wrapped (checked on torch 2.13.0): each schedule's ``step`` notes, once, the schedule's class,
microbatch count, stage count, the pipeline group's global ranks, this rank's stages and the
schedule's ``pipeline_order`` (per pipeline rank, its actions: ``0F1``, ``1B0``...); each
stage's ``forward_one_chunk``, ``backward_one_chunk`` and ``backward_weight_one_chunk`` note
their modelled duration on the compute stream, and the order the first step ran them in
(the schedule's real order on this rank: torch 2.13.0's ``pipeline_order`` of its single-stage
1F1B numbers the last stage's microbatches from 1, so it is only a fallback).
:mod:`torchneuron.plan.pipeline_model` turns the stages' durations and orders into the
schedule's makespan and bubbles.
"""

from __future__ import annotations

import functools
import statistics
from typing import Any

import torch

from torchneuron.device import accounting

__all__ = ["install", "summary"]

_durations: dict[tuple[int, str], list[float]] = {}
_schedule: dict[str, Any] = {}
_executed: list[str] = []  # this rank's compute actions in the order the first step ran them
_steps_seen = 0


def _timed(kind_of: Any) -> Any:
    def decorate(method: Any) -> Any:
        @functools.wraps(method)
        def run(stage: Any, *args: Any, **kwargs: Any) -> Any:
            device = torch.neuron.current_device()
            start = accounting.stream_clock(device)
            result = method(stage, *args, **kwargs)
            kind = kind_of(args, kwargs)
            _durations.setdefault((int(stage.stage_index), kind), []).append(
                accounting.stream_clock(device) - start)
            if _steps_seen == 1:
                chunk = args[0] if args else kwargs.get("fwd_chunk_id", kwargs.get("bwd_chunk_id", 0))
                _executed.append(f"{int(stage.stage_index)}{kind}{int(chunk)}")
            return result
        return run
    return decorate


def _note_schedule(step: Any) -> Any:
    @functools.wraps(step)
    def run(schedule: Any, *args: Any, **kwargs: Any) -> Any:
        global _steps_seen
        _steps_seen += 1
        if not _schedule:
            import torch.distributed as dist

            stages = getattr(schedule, "_stages", None) or [getattr(schedule, "_stage", None)]
            stages = [s for s in stages if s is not None]
            group = (stages[0].group if stages else None) or dist.group.WORLD  # None: the default group
            order = getattr(schedule, "pipeline_order", None) or {}
            _schedule.update(
                schedule=type(schedule).__name__, n_microbatches=int(schedule._n_microbatches),
                num_stages=int(stages[0].num_stages) if stages else 0,
                group_ranks=dist.get_process_group_ranks(group),
                rank_stages=[int(s.stage_index) for s in stages],
                order={str(rank): [str(a) for a in actions if a is not None] for rank, actions in order.items()})
        return step(schedule, *args, **kwargs)
    return run


_installed = False


def install() -> None:
    """Wraps the stage and schedule methods (once per process)."""
    global _installed
    if _installed:
        return
    from torch.distributed.pipelining import schedules, stage

    base = stage._PipelineStageBase
    base.forward_one_chunk = _timed(lambda a, k: "F")(base.forward_one_chunk)
    base.backward_one_chunk = _timed(
        lambda a, k: "B" if k.get("full_backward", a[2] if len(a) > 2 else True) else "I")(base.backward_one_chunk)
    base.backward_weight_one_chunk = _timed(lambda a, k: "W")(base.backward_weight_one_chunk)
    for cls in (schedules.PipelineScheduleSingle, schedules.PipelineScheduleMulti):
        cls.step = _note_schedule(cls.step)
    _installed = True


def summary() -> dict[str, Any] | None:
    """The schedule and this rank's median duration per (stage, kind), or None without pipelining."""
    if not _schedule:
        return None
    return {**_schedule, "durations": {f"{s}:{k}": statistics.median(v) for (s, k), v in _durations.items()},
            "chunks": {f"{s}:{k}": len(v) for (s, k), v in _durations.items()}, "executed": list(_executed)}
