"""The makespan of a pipeline schedule, and each rank's bubble, from per-stage durations.

No torch: an event simulation of the schedule's own action lists (``pipeline_order`` of
``torch.distributed.pipelining``'s schedules: per pipeline rank, actions such as ``0F2`` =
stage 0 forward of microbatch 2, ``1B0``, ``1I0``/``1W0`` for split backward). Each rank runs
its actions in order; an action starts when its rank is free and its inputs are there:

- ``F(s, i)`` after ``F(s-1, i)`` and the activation's transfer;
- ``B(s, i)`` / ``I(s, i)`` after ``F(s, i)`` and, but on the last stage, after ``B``/``I`` of
  ``(s+1, i)`` and the gradient's transfer;
- ``W(s, i)`` after ``I(s, i)``.

A rank's bubble is the makespan less the time it computed. This is the bubble the schedule
implies for the measured stage times: ``(p - 1) (t_f + t_b)`` for GPipe and 1F1B with equal
stages, less per microbatch for interleaved schedules.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["Action", "parse_action", "PipelineTimeline", "simulate"]

_ACTION = re.compile(r"(\d+)(F|B|I|W)(\d+)\Z")


@dataclass(frozen=True)
class Action:
    stage: int
    kind: str  # "F", "B" (full backward), "I" (backward input), "W" (backward weight)
    microbatch: int


def parse_action(text: str) -> Action | None:
    """``"1F3"`` -> Action(1, "F", 3); None for communication or other non-compute actions."""
    match = _ACTION.match(text.strip())
    return Action(int(match[1]), match[2], int(match[3])) if match else None


@dataclass(frozen=True)
class PipelineTimeline:
    makespan: float
    busy: dict[int, float]  # pipeline rank -> seconds computing
    bubble: dict[int, float]  # pipeline rank -> makespan - busy


def simulate(order: dict[int, list[str]], durations: dict[tuple[int, str], float], num_stages: int,
             transfer_seconds: float = 0.0) -> PipelineTimeline:
    """Runs ``order`` (pipeline rank -> action strings) with ``durations[(stage, kind)]``.

    Raises:
        ValueError: an action whose inputs no rank produces (a schedule that cannot finish),
            or a missing duration.
    """
    actions = {rank: [a for a in map(parse_action, texts) if a is not None] for rank, texts in order.items()}
    done: dict[tuple[int, str, int], float] = {}
    position = {rank: 0 for rank in actions}
    free = {rank: 0.0 for rank in actions}
    busy = {rank: 0.0 for rank in actions}

    def ready(a: Action) -> float | None:
        needs: list[tuple[tuple[int, str, int], float]] = []
        if a.kind == "F":
            if a.stage > 0:
                needs.append(((a.stage - 1, "F", a.microbatch), transfer_seconds))
        elif a.kind in ("B", "I"):
            needs.append(((a.stage, "F", a.microbatch), 0.0))
            if a.stage < num_stages - 1:
                upstream = (a.stage + 1, "B", a.microbatch)
                if upstream not in done and (a.stage + 1, "I", a.microbatch) in done:
                    upstream = (a.stage + 1, "I", a.microbatch)
                needs.append((upstream, transfer_seconds))
        elif a.kind == "W":
            needs.append(((a.stage, "I", a.microbatch), 0.0))
        start = 0.0
        for key, delay in needs:
            if key not in done:
                return None
            start = max(start, done[key] + delay)
        return start

    remaining = sum(len(v) for v in actions.values())
    while remaining:
        progressed = False
        for rank, queue in actions.items():
            while position[rank] < len(queue):
                a = queue[position[rank]]
                inputs = ready(a)
                if inputs is None:
                    break
                try:
                    seconds = durations[(a.stage, a.kind)]
                except KeyError:
                    raise ValueError(f"no measured duration for stage {a.stage} {a.kind}") from None
                start = max(free[rank], inputs)
                free[rank] = start + seconds
                busy[rank] += seconds
                done[(a.stage, a.kind, a.microbatch)] = free[rank]
                position[rank] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            stuck = {r: str(q[position[r]]) for r, q in actions.items() if position[r] < len(q)}
            raise ValueError(f"the pipeline schedule cannot finish: next actions {stuck} wait for inputs "
                             "no rank produces")
    makespan = max(free.values(), default=0.0)
    return PipelineTimeline(makespan, busy, {r: makespan - b for r, b in busy.items()})
