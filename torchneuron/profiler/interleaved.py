"""Host wall-clock timing of the same work on several devices, interleaved.

Timing one device after the other lets drift (CPU frequency, other processes, cache
warmth) land on one side only: on a shared machine the ratio of two back-to-back
timings swings by 2x between runs. Alternating the devices round by round, and taking
each device's median, lets noise hit both alike. Used by ``python -m torchneuron demo``
and ``benchmarks/eager_overhead.py``.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping

__all__ = ["time_interleaved"]


def time_interleaved(runs: Mapping[str, Callable[[], object]], rounds: int = 31, sample_ns: float = 5e6,
                     warmup: int = 3) -> dict[str, float]:
    """Median microseconds per call of each of ``runs`` (name -> function).

    Each function first runs ``warmup`` times (allocator caches, first-use paths), timed.
    Then ``rounds`` rounds each time one sample per function, in forward order on even
    rounds and reverse order on odd ones; a sample is as many calls (the same number for
    every function) as make the slowest function's sample last about ``sample_ns``, judged
    by each function's fastest warm-up call.
    """
    if rounds < 1 or not runs:
        raise ValueError(f"time_interleaved needs at least one run and one round (got {len(runs)} runs, "
                         f"rounds={rounds})")
    inner = {}
    for name, run in runs.items():
        fastest = None
        for _ in range(max(warmup, 1)):
            start = time.perf_counter_ns()
            run()
            elapsed = time.perf_counter_ns() - start
            fastest = elapsed if fastest is None else min(fastest, elapsed)
        # calls per sample so one sample takes ~sample_ns; from the fastest call, as one
        # preempted call would make every sample a single call
        inner[name] = max(1, int(sample_ns / max(1, fastest)))
    n = min(inner.values())
    samples: dict[str, list[float]] = {name: [] for name in runs}
    names = list(runs)
    for r in range(rounds):
        for name in names if r % 2 == 0 else reversed(names):
            run = runs[name]
            start = time.perf_counter_ns()
            for _ in range(n):
                run()
            samples[name].append((time.perf_counter_ns() - start) / n / 1e3)
    return {name: statistics.median(s) for name, s in samples.items()}
