"""Runs one piece of code normally and dataless and checks that the records agree."""

from __future__ import annotations

from collections.abc import Callable

from torchneuron.profiler.run_record import RunRecord, record_run


def assert_agree(fn: Callable[[], object], *, warmups: int = 1) -> tuple[RunRecord, RunRecord]:
    """Runs ``fn`` normally (after ``warmups`` runs that fill compile caches and the like),
    then dataless, and checks that both runs recorded the same ops, dtypes, placements,
    calls and modelled nanoseconds, the same NKI kernels, collectives and compiled kernel
    runs, the same transfers and host syncs, and the same peak and final allocated bytes."""
    for _ in range(warmups):
        record_run(fn, dataless_run=False)
    normal = record_run(fn, dataless_run=False)
    dataless = record_run(fn, dataless_run=True)
    only_normal = sorted(set(normal.ops) - set(dataless.ops))
    only_dataless = sorted(set(dataless.ops) - set(normal.ops))
    assert not only_normal and not only_dataless, (
        f"op records differ:\n normal only: {only_normal}\n dataless only: {only_dataless}")
    assert normal == dataless, f"records differ:\n normal:   {normal}\n dataless: {dataless}"
    assert normal.ops or normal.work or any(normal.kernel_calls), "the run recorded no device work"
    return normal, dataless
