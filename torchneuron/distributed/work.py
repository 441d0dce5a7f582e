"""The work handle of an asynchronous neuron collective: gloo's, with errors that explain.

Why: ``dist.all_reduce(t, async_op=True).wait()`` on a group where a rank died or never
came raised gloo's bare ``Timed out waiting ... for recv`` or ``Connection closed by
peer``. :class:`NeuronWork` wraps gloo's work: ``wait()`` raises
``torch.distributed.DistBackendError`` naming the collective, its sequence number, the
missing ranks (or, for a send/receive, the peer and what it did), as a synchronous call
does; it records the outcome in the flight recorder and makes the waiting stream wait for
the collective in the modelled timeline (:mod:`comm_stream`).

Lifetime (checked on torch 2.13.0): a Python subclass of ``Work`` is a pybind11
trampoline; once its Python object is gone, C++ callers of ``wait()`` reach the base
``Work::wait``, which waits for a completion that never comes. So every handle is kept
here until it is waited or, when its future was taken (DDP's reducer only reads the
future), until gloo finished it; a handle nobody waits on is kept until
:data:`_UNCLAIMED_LIMIT` later handles exist. A handle the program holds stays alive
through that reference regardless.
"""

from __future__ import annotations

import collections
import datetime
import threading
from typing import Any, Protocol

import torch
import torch.distributed as dist

from torchneuron.distributed import comm_stream, flight_recorder

# Finished handles nobody waited on or took the future of, kept beyond this many are
# released (oldest first); a C++ caller waiting on one later would wait forever, so the
# limit is far above what any program leaves unwaited.
_UNCLAIMED_LIMIT = 1024

_lock = threading.Lock()
_live: dict[int, "NeuronWork"] = {}  # not yet finished, or waited on / future taken
_parked: "collections.deque[NeuronWork]" = collections.deque(maxlen=_UNCLAIMED_LIMIT)


class Outcome(Protocol):
    """What a handle reports to the call that issued it (:class:`kernels._Call`)."""

    entry: flight_recorder.Entry | None

    def failed(self, error: BaseException) -> dist.DistBackendError:
        """The explained error for gloo's ``error`` (entry marked failed, recorder dumped)."""

    def succeeded(self) -> dist.DistBackendError | None:
        """Entry completed and stream joined; or the error of a mismatched receive."""


class NeuronWork(dist.Work):
    """gloo's work for one neuron collective, with explained failures and stream joins."""

    def __init__(self, inner: Any, call: Outcome) -> None:
        """``inner``: gloo's work as c10d's ops return it (boxed) or as a ``Work``."""
        super().__init__()
        self._inner = inner if isinstance(inner, dist.Work) else dist.Work.unbox(inner)
        self._call = call
        self._entry = call.entry
        self._error: dist.DistBackendError | None = None
        self._waited = False
        self._future_taken = False
        with _lock:
            _live[id(self)] = self

    # ---- what c10d and the program call ----------------------------------------

    def wait(self, timeout: datetime.timedelta = datetime.timedelta(0)) -> bool:
        """Waits for gloo; a failure raises DistBackendError naming who is missing."""
        if self._error is not None:
            raise self._error
        if not self._waited:
            try:
                self._inner.wait(timeout)
            except RuntimeError as error:
                self._error = self._call.failed(error)
                self._release()
                raise self._error from error
            self._waited = True
            self._release()
            mismatch = self._call.succeeded()
            if mismatch is not None:
                self._error = mismatch
                raise mismatch
        return True

    def get_future(self) -> torch.futures.Future:
        """gloo's future (its error, if any, is gloo's: ``wait()`` explains failures)."""
        if not self._future_taken:
            self._future_taken = True
            comm_stream.defer(self._join_later)
        return self._inner.get_future()

    def is_completed(self) -> bool:
        return self._waited or self._error is not None or self._inner.is_completed()

    def is_success(self) -> bool:
        return self._error is None and self._inner.is_success()

    def exception(self) -> Any:
        return self._inner.exception()

    def source_rank(self) -> int:
        return self._inner.source_rank()

    def result(self) -> list[torch.Tensor]:
        return self._inner.result()

    def synchronize(self) -> None:
        self._inner.synchronize()

    def _join_later(self) -> None:
        """A taken future's collective joins the stream (at the thread's next call or wait)."""
        if not self._waited and self._error is None:
            self._waited = True
            self._call.succeeded()

    # ---- lifetime ---------------------------------------------------------------

    def _release(self) -> None:
        with _lock:
            _live.pop(id(self), None)

    def _finished(self) -> bool:
        return self._inner.is_completed()


def sweep() -> None:
    """Releases handles whose future was taken once gloo finished them, and parks finished
    handles nobody claimed (released beyond the limit); marks their flight-recorder
    entries. Called (with the GIL, on a Python thread) at every collective call."""
    with _lock:
        candidates = list(_live.values())
    for work in candidates:
        if not work._finished():
            continue
        if work._entry is not None and work._entry.state == flight_recorder.STARTED:
            failed = work._inner.exception() is not None
            flight_recorder.finish(work._entry, RuntimeError("failed (not waited)") if failed else None)
        if work._future_taken or not work._waited:
            work._release()
            if not work._future_taken:
                _parked.append(work)  # the deque drops the oldest beyond the limit


def live_count() -> int:
    """Handles kept alive here, parked ones included (for tests of the lifetime rules)."""
    with _lock:
        return len(_live) + len(_parked)


def pending() -> list[NeuronWork]:
    """Handles not yet waited on, finished or failed (the watchdog probes them)."""
    with _lock:
        return [w for w in _live.values() if not w._waited and w._error is None]
