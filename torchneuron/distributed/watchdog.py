"""A watchdog thread that reports a collective stuck beyond its limit, without killing anything.

Why: a collective that never completes shows nothing until gloo's timeout (and an
asynchronous one nobody waits on, nothing at all). PyTorch's NCCL watchdog reports a
stuck collective and by default aborts the process; here the report is a
``RuntimeWarning`` (also kept for :func:`reports`) naming the collective, its sequence
number, how long it has run and the ranks that have not reached it, plus a
flight-recorder dump when ``TORCHNEURON_COLLECTIVE_TRACE_DIR`` is set. The process goes
on: gloo's own timeout still raises the error in the rank that waits.

The limit is ``TORCHNEURON_COLLECTIVE_WATCHDOG_SECONDS`` (read when a group is created),
or the group's timeout when unset; ``0`` turns the watchdog off.
"""

from __future__ import annotations

import threading
import time
import warnings

from torchneuron.distributed import flight_recorder

_lock = threading.Lock()
_limits: dict[str, float] = {}  # group name -> seconds (groups watched)
_reports: list[str] = []
_reported: set[int] = set()  # flight-recorder entry ids already reported
_thread: threading.Thread | None = None


def watch(group: str, seconds: float) -> None:
    """Reports the collectives of ``group`` still running after ``seconds`` (0: not watched)."""
    global _thread
    with _lock:
        if seconds <= 0:
            _limits.pop(group, None)
            return
        _limits[group] = seconds
        if _thread is None:
            _thread = threading.Thread(target=_run, name="torchneuron-collective-watchdog", daemon=True)
            _thread.start()


def reports() -> list[str]:
    """Every report the watchdog made in this process, oldest first."""
    with _lock:
        return list(_reports)


def _run() -> None:
    while True:
        with _lock:
            interval = min([max(0.1, s / 4) for s in _limits.values()], default=1.0)
        time.sleep(min(interval, 1.0))
        try:
            check()
        except Exception:  # noqa: BLE001 - the watchdog must never take the process down
            pass


def check() -> list[str]:
    """One pass: reports each running entry past its group's limit once; returns new reports."""
    from torchneuron.distributed.work import pending

    finished = {w._entry.id for w in pending() if w._entry is not None and w._finished()}
    new = []
    for entry in flight_recorder.entries():
        with _lock:
            limit = _limits.get(entry.group)
            if limit is None or entry.id in _reported:
                continue
        if entry.state != flight_recorder.STARTED or entry.id in finished:
            continue
        if entry.running_seconds < limit:
            continue
        message = _describe(entry, limit)
        with _lock:
            _reported.add(entry.id)
            _reports.append(message)
        new.append(message)
        dumped = flight_recorder.dump_on_failure()
        warnings.warn(message + (f"; flight recorder: {dumped}" if dumped else ""), RuntimeWarning,
                      stacklevel=1)
    return new


def _describe(entry: flight_recorder.Entry, limit: float) -> str:
    from torchneuron.distributed.progress import group_named

    what = f"collective #{entry.seq}" if entry.peer is None else f"#{entry.seq} with rank {entry.peer}"
    head = (f"watchdog: {entry.op} ({what} on process group {entry.group!r}) has run for "
            f"{entry.running_seconds:.1f} s, beyond the watchdog's {limit:g} s; the process keeps running")
    progress = group_named(entry.group)
    if progress is None or entry.peer is not None:
        return head
    try:
        records = progress.records()
    except Exception:  # noqa: BLE001 - the store may be gone with its host rank
        return head + "; the group's store could not be read"
    behind = [f"rank {progress.global_ranks[r]} ("
              + ("no collective yet" if rec is None else f"last at #{rec[0]} {rec[1]}") + ")"
              for r, rec in enumerate(records) if rec is None or rec[0] < entry.seq]
    if behind:
        return head + f"; ranks that have not reached it: {', '.join(behind)}"
    return head + "; every rank has reached it"
