"""What the accounting record and the allocator saw of one piece of code: a comparable value.

:func:`record_run` runs a function (normally or dataless) from zeroed counters and peaks and
returns a :class:`RunRecord`: the ops with their dtypes, placement, calls and modelled
nanoseconds, NKI kernels and collectives, compiled-kernel runs, transfers, host syncs and
the peak of allocated bytes. Two records compare with ``==``; that is how a dataless run is
checked against the normal run it stands for (``tests/dataless``), and how a planned rank
is checked against a real one.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Callable
from dataclasses import dataclass

import torch

from torchneuron.device import accounting, dataless

__all__ = ["RunRecord", "record_run"]


@dataclass(frozen=True)
class RunRecord:
    """One run, as the record saw it (every field compares exactly)."""

    ops: tuple[tuple[str, tuple[str, ...], bool, int, int], ...]  # (op, dtypes, cpu fallback, calls, modelled ns)
    work: tuple[tuple[str, str, int, float, int], ...]  # (kind, name, calls, seconds, instructions)
    kernel_calls: tuple[int, ...]  # runs of each compiled-kernel slot
    transfers: tuple[tuple[str, int, int], ...]  # (link, copies, bytes)
    host_syncs: int
    peak_bytes: int  # the most allocated above what was allocated at the start
    end_bytes: int  # allocated at the end above the start (what the function kept)

    @property
    def modeled_ns(self) -> int:
        """Modelled nanoseconds of the ops (NKI kernels and collectives are in ``work``)."""
        return sum(op[4] for op in self.ops)


def record_run(fn: Callable[[], object], *, dataless_run: bool, device: int | None = None) -> RunRecord:
    """Runs ``fn`` (dataless if ``dataless_run``) from zeroed counters and peaks on ``device``
    (default: the current one); what ``fn`` returns is kept until the record is taken."""
    index = torch.neuron.current_device() if device is None else device
    gc.collect()
    torch.neuron.synchronize()
    torch.neuron.empty_cache()
    accounting.reset()
    start = torch.neuron.memory_allocated(index)
    torch.neuron.reset_peak_memory_stats(index)
    with dataless.dataless() if dataless_run else contextlib.nullcontext():
        kept = fn()
        end = torch.neuron.memory_allocated(index) - start
    peak = torch.neuron.max_memory_allocated(index) - start
    del kept
    ops = tuple(sorted((o.op, o.dtypes, o.cpu_fallback, o.calls, round(o.modeled_seconds * 1e9))
                       for o in accounting.op_totals() if o.calls))
    work = tuple(sorted((w.kind, w.name, w.calls, w.modeled_seconds, w.instructions)
                        for w in accounting.work_totals() if w.calls))
    transfers = tuple(sorted((link, c, b) for link, (c, b) in accounting.transfers().items()))
    return RunRecord(ops, work, tuple(accounting.kernel_calls()), transfers, accounting.host_syncs(),
                     peak, end)
