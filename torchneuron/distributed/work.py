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
future), until gloo finished it. A finished handle nobody waited on is parked (the last
:data:`_UNCLAIMED_LIMIT`), still answering ``wait()``; if the program holds no reference
to it, gloo's work is dropped then, on the calling thread, so its tensors are freed
(:mod:`host_views`). A handle the program holds stays alive through that reference.

Exit: the future's callback runs on gloo's thread, and completing the explained future
runs everything chained to it there (DDP's reducer, the program's ``then``), with the GIL
released; a waiter wakes as soon as the future is marked done, before those callbacks
return. If the program then exits, gloo's thread takes the GIL back while Python
finalizes and Python ends it inside a ``noexcept`` destructor: "terminate called without
an active exception" (SIGABRT; plain gloo does the same, torch 2.13.0). So the callbacks
running are counted, and interpreter exit waits for them (at most
:data:`_EXIT_WAIT_SECONDS`) before finalization starts.
"""

from __future__ import annotations

import atexit
import collections
import datetime
import sys
import threading
import time
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

# Future callbacks running on gloo's threads now (see "Exit" above), and how long exit
# waits for them: a callback the program chained may block, and exit must not hang on it.
_callbacks_running = 0
_exit_hook_registered = False
_EXIT_WAIT_SECONDS = 10.0


class Outcome(Protocol):
    """What a handle reports to the call that issued it (:class:`kernels._Call`)."""

    entry: flight_recorder.Entry | None

    def failed(self, error: BaseException) -> dist.DistBackendError:
        """The explained error for gloo's ``error`` (entry marked failed, recorder dumped)."""

    def succeeded(self) -> dist.DistBackendError | None:
        """Entry completed and stream joined; or the error of a mismatched receive."""

    def join_stream(self) -> None:
        """The current stream waits for the collective (modelled timeline only)."""

    pairs: list  # (gloo's host view, the neuron tensor), for each tensor of the call


class NeuronWork(dist.Work):
    """gloo's work for one neuron collective, with explained failures and stream joins."""

    def __init__(self, inner: Any, call: Outcome) -> None:
        """``inner``: gloo's work as c10d's ops return it (boxed) or as a ``Work``."""
        super().__init__()
        self._inner: dist.Work | None = inner if isinstance(inner, dist.Work) else dist.Work.unbox(inner)
        self._call = call
        # The call's tensors, held as NCCL's work holds its outputs: gloo's views of them do
        # not keep the device memory alive. Results are mapped back to them.
        self._pairs, call.pairs = call.pairs, []  # the handle holds them from now on
        self._entry = call.entry
        self._error: dist.DistBackendError | None = None
        self._gloo_error: RuntimeError | None = None  # kept when the inner work is let go unwaited
        self._waited = False
        self._future_taken = False
        self._joined = False
        self._future: torch.futures.Future | None = None
        self._explaining = threading.Lock()  # wait() and the future's callback may both explain
        with _lock:
            _live[id(self)] = self

    # ---- what c10d and the program call ----------------------------------------

    def wait(self, timeout: datetime.timedelta = datetime.timedelta(0)) -> bool:
        """Waits for gloo; a failure raises DistBackendError naming who is missing."""
        if self._error is not None:
            raise self._error
        if not self._waited:
            try:
                if self._inner is not None:
                    self._inner.wait(timeout)
                elif self._gloo_error is not None:
                    raise self._gloo_error
            except RuntimeError as error:
                explained = self._explain(error)
                self._release()
                raise explained from error
            self._waited = True
            self._release()
            mismatch = self._call.succeeded()
            if mismatch is not None:
                self._error = mismatch
                raise mismatch
        return True

    def get_future(self) -> torch.futures.Future:
        """A future of gloo's result whose failure is the DistBackendError ``wait()`` raises.

        gloo's own future failed with gloo's bare error (``Connection closed by peer``); this
        one is completed from gloo's, on the thread that completes it (one callback).
        """
        if not self._future_taken:
            self._future_taken = True
            comm_stream.defer(self._join_later)
        if self._future is None:
            self._future = self._explained_future()
        return self._future

    def _explained_future(self) -> torch.futures.Future:
        explained = torch.futures.Future()
        if self._inner is None:  # let go unwaited: already finished
            if self._gloo_error is not None:
                explained.set_exception(self._explain(self._gloo_error))
            else:
                explained.set_result([])
            return explained

        def settle(done: torch.futures.Future) -> None:
            _callback_started()
            try:
                try:
                    value = done.value()
                except RuntimeError as error:
                    explained.set_exception(self._explain(error))
                    return
                explained.set_result(self._mapped(value))  # runs what is chained to it, GIL released
            finally:
                _callback_ended()

        _register_exit_wait()
        self._inner.get_future().add_done_callback(settle)
        return explained

    def _explain(self, error: RuntimeError) -> dist.DistBackendError:
        """The explained error for gloo's ``error``, made once (by ``wait()`` or the future)."""
        with self._explaining:
            if self._error is None:
                self._error = self._call.failed(error)
            return self._error

    def is_completed(self) -> bool:
        return self._waited or self._error is not None or self._finished()

    def is_success(self) -> bool:
        if self._inner is None:
            return self._error is None and self._gloo_error is None
        return self._error is None and self._inner.is_success()

    def exception(self) -> Any:
        return self._gloo_error if self._inner is None else self._inner.exception()

    def source_rank(self) -> int:
        return self._held().source_rank()

    def result(self) -> list[torch.Tensor]:
        return self._mapped(self._held().result())

    def _mapped(self, value: Any) -> Any:
        """gloo's result with each host view replaced by the neuron tensor it views (NCCL's
        results are the device tensors; gloo's views do not keep their memory alive)."""
        if not isinstance(value, list):
            return value
        return [next((t for v, t in self._pairs if v is item), item) for item in value]

    def synchronize(self) -> None:
        if self._inner is not None:
            self._inner.synchronize()

    def _held(self) -> dist.Work:
        if self._inner is None:
            raise RuntimeError("this collective's work was let go after it finished unwaited "
                               "(its tensors freed); keep the handle to read its result")
        return self._inner

    def _join_later(self) -> None:
        """A taken future's collective joins the stream (at the thread's next call or wait)."""
        if not self._waited and not self._joined:
            self._joined = True
            self._call.join_stream()

    # ---- lifetime ---------------------------------------------------------------

    def _release(self) -> None:
        with _lock:
            _live.pop(id(self), None)
        if not self._finished():  # a failed wait may leave gloo's work running: keep its tensors
            keep_until_exit(self._pairs)

    def _finished(self) -> bool:
        return self._inner is None or self._inner.is_completed()

    def _let_go_of_inner(self) -> None:
        """Keeps gloo's outcome and drops gloo's work (and so the tensors it holds)."""
        try:
            self._inner.wait()  # finished: returns at once, or raises gloo's error
        except RuntimeError as error:
            self._gloo_error = error
        self._inner = None
        self._pairs = []  # finished and let go: the tensors are the program's alone


# The tensors of collectives that failed while gloo may still run them (which
# gloo's views do not keep alive) are kept for the rest of the process.
_orphaned: list[Any] = []


def keep_until_exit(pairs: list) -> None:
    """Keeps a call's tensors for the process's life (gloo may still write them)."""
    with _lock:
        _orphaned.append(list(pairs))


def gloo_error(inner: dist.Work) -> RuntimeError | None:
    """gloo's error of a finished work, or None.

    Not ``Work.exception()`` or ``is_success()``: torch 2.13.0 deprecates both and prints a
    warning on their first call, which DDP training on neuron showed (the reducer takes
    futures, so its works are swept here unwaited). ``wait()`` on a finished gloo work
    returns at once or raises its error.
    """
    try:
        inner.wait()
    except RuntimeError as error:
        return error
    return None


def _callback_started() -> None:
    global _callbacks_running
    with _lock:
        _callbacks_running += 1


def _callback_ended() -> None:
    global _callbacks_running
    with _lock:
        _callbacks_running -= 1


def callbacks_running() -> int:
    """Future callbacks running now on gloo's threads (what exit waits for)."""
    with _lock:
        return _callbacks_running


def _register_exit_wait() -> None:
    global _exit_hook_registered
    if _exit_hook_registered:  # every future taken asks: no lock once it is done
        return
    with _lock:
        if _exit_hook_registered:
            return
        _exit_hook_registered = True
    atexit.register(wait_for_callbacks, _EXIT_WAIT_SECONDS)


def wait_for_callbacks(timeout: float) -> bool:
    """Waits (GIL released) until no future callback runs on gloo's threads, at most
    ``timeout`` seconds; returns whether none runs. Interpreter exit calls it, before
    finalization, so no gloo thread takes the GIL back from a finalizing Python."""
    deadline = time.monotonic() + timeout
    while callbacks_running():
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.001)
    return True


def sweep() -> None:
    """Lets go of finished handles: ones whose future was taken are released; unclaimed ones
    (never waited) are parked, and their gloo work dropped when the program holds no
    reference to them (C++ callers can still wait). Marks their flight-recorder entries.
    Called (with the GIL, on a Python thread) at every collective call."""
    with _lock:
        keys = list(_live)
    for key in keys:
        with _lock:
            work = _live.get(key)
        if work is None or work._waited or not work._finished():
            continue
        if work._entry is not None and work._entry.state == flight_recorder.STARTED:
            failed = work._inner is not None and gloo_error(work._inner) is not None
            flight_recorder.finish(work._entry, RuntimeError("failed (not waited)") if failed else None)
        if not work._future_taken:
            # References: _live, this loop's name, getrefcount's argument: no one else's.
            if sys.getrefcount(work) <= 3 and work._inner is not None:
                work._let_go_of_inner()
            _parked.append(work)  # the deque drops the oldest beyond the limit
        work._release()
        del work


def live_count() -> int:
    """Handles kept alive here, parked ones included (for tests of the lifetime rules)."""
    with _lock:
        return len(_live) + len(_parked)


def pending() -> list[NeuronWork]:
    """Handles not yet waited on, finished or failed (the watchdog probes them)."""
    with _lock:
        return [w for w in _live.values() if not w._waited and w._error is None]
