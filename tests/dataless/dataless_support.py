"""Runs one piece of code normally and dataless, and what the record says of each run."""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Callable
from dataclasses import dataclass

import torch

import torchneuron
from torchneuron.device import accounting


@dataclass(frozen=True)
class RunRecord:
    """What the accounting record and the allocator saw of one run."""

    ops: tuple[tuple[str, tuple[str, ...], bool, int, int], ...]  # (op, dtypes, fallback, calls, modelled ns)
    work: tuple[tuple[str, str, int, float, int], ...]  # NKI kernels and collectives
    kernel_calls: tuple[int, ...]  # compiled kernels, by slot
    transfers: tuple[tuple[str, int, int], ...]
    host_syncs: int
    peak_bytes: int  # max allocated above what was allocated at the start
    end_bytes: int  # allocated at the end above the start

    @property
    def modeled_ns(self) -> int:
        return sum(op[4] for op in self.ops)


def record_run(fn: Callable[[], object], *, dataless: bool, device: int = 0) -> RunRecord:
    """Runs ``fn`` (dataless or not) from zeroed counters and peaks; what it left is dropped."""
    gc.collect()
    torch.neuron.synchronize()
    torch.neuron.empty_cache()
    accounting.reset()
    start = torch.neuron.memory_allocated(device)
    torch.neuron.reset_peak_memory_stats(device)
    with torchneuron.dataless() if dataless else contextlib.nullcontext():
        kept = fn()
        end = torch.neuron.memory_allocated(device) - start
    peak = torch.neuron.max_memory_allocated(device) - start
    del kept
    ops = tuple(sorted((o.op, o.dtypes, o.cpu_fallback, o.calls, round(o.modeled_seconds * 1e9))
                       for o in accounting.op_totals() if o.calls))
    work = tuple(sorted((w.kind, w.name, w.calls, w.modeled_seconds, w.instructions)
                        for w in accounting.work_totals() if w.calls))
    transfers = tuple(sorted((link, c, b) for link, (c, b) in accounting.transfers().items()))
    return RunRecord(ops, work, tuple(accounting.kernel_calls()), transfers, accounting.host_syncs(),
                     peak, end)


def assert_agree(fn: Callable[[], object], *, warmups: int = 1) -> tuple[RunRecord, RunRecord]:
    """Runs ``fn`` normally (after ``warmups`` runs that fill compile caches and the like),
    then dataless, and checks that both runs recorded the same ops, dtypes, placements,
    calls and modelled nanoseconds, the same NKI kernels, collectives and compiled kernel
    runs, the same transfers and host syncs, and the same peak and final allocated bytes."""
    for _ in range(warmups):
        record_run(fn, dataless=False)
    normal = record_run(fn, dataless=False)
    dataless = record_run(fn, dataless=True)
    only_normal = sorted(set(normal.ops) - set(dataless.ops))
    only_dataless = sorted(set(dataless.ops) - set(normal.ops))
    assert not only_normal and not only_dataless, (
        f"op records differ:\n normal only: {only_normal}\n dataless only: {only_dataless}")
    assert normal == dataless, f"records differ:\n normal:   {normal}\n dataless: {dataless}"
    assert normal.ops or normal.work or any(normal.kernel_calls), "the run recorded no device work"
    return normal, dataless
