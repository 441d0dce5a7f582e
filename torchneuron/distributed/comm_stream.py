"""Each device's collective stream: collectives overlap compute in the modelled timeline.

Why: on Trainium (as with NCCL on GPUs) collectives run on their own queue, so a
collective issued with ``async_op=True`` overlaps the compute issued after it until
someone waits for it. Here every collective is charged on one extra stream per device
(made once per process): the collective stream first waits for the issuing stream
(the collective reads what was computed before it), the collective's modelled time is
added there, and its end is an event. Waiting for the work (``work.wait()``, a
synchronous call, functional collectives' ``wait_tensor``) makes the waiting thread's
current stream wait for that event, as NCCL's ``Work.wait`` makes the current CUDA
stream wait. Stream clocks and events are the device layer's (``docs/hardware-model.md``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

import torch

from torchneuron.device import accounting

_T = TypeVar("_T")

_lock = threading.Lock()
_streams: dict[int, torch.Stream] = {}

# Per thread: collectives whose future was taken (DDP's reducer waits on futures, which
# have no stream hook here): joined at the thread's next collective call or wait.
_local = threading.local()


def collective_stream(index: int) -> torch.Stream:
    """The stream device ``index``'s collectives are charged on (made on first use)."""
    found = _streams.get(index)
    if found is not None:
        return found
    with _lock:
        found = _streams.get(index)
        if found is None:
            found = _streams[index] = torch.neuron.Stream(index)
        return found


# Below, torch.accelerator's streams and torch.Stream/torch.Event's own methods: the
# torch.neuron wrappers re-resolve the device and wrap each stream in Python (about 15 us
# per collective in all), which a collective call pays every time.

def charge(index: int, record: Callable[[], _T]) -> tuple[_T, torch.Event, float]:
    """Runs ``record`` (which records the collective) on device ``index``'s collective
    stream, after the issuing stream's work; returns its result, the collective's end
    event and where it started on the collective stream's modelled clock."""
    comm = collective_stream(index)
    previous_device = torch.accelerator.current_device_index()
    issuing = torch.accelerator.current_stream(index)
    torch.Stream.wait_event(comm, torch.Stream.record_event(issuing))
    torch.accelerator.set_stream(comm)  # also selects the device, so events are made on it
    try:
        start = accounting.stream_clock(index)
        result = record()
        end = torch.Stream.record_event(comm)
    finally:
        torch.accelerator.set_stream(issuing)
        if previous_device != index:
            torch.accelerator.set_device_index(previous_device)
    return result, end, start


def device_clock(index: int) -> float:
    """Where device ``index``'s modelled timeline is: the later of the calling thread's current
    stream and the collective stream (a step ends when both are done)."""
    compute = accounting.stream_clock(index)
    comm = _streams.get(index)
    if comm is None:
        return compute
    previous_device = torch.accelerator.current_device_index()
    issuing = torch.accelerator.current_stream(index)
    torch.accelerator.set_stream(comm)
    try:
        collective = accounting.stream_clock(index)
    finally:
        torch.accelerator.set_stream(issuing)
        if previous_device != index:
            torch.accelerator.set_device_index(previous_device)
    return max(compute, collective)


def join(index: int, end: torch.Event) -> None:
    """Makes the calling thread's current stream of device ``index`` wait for ``end``."""
    join_deferred()
    _wait(index, end)


def _wait(index: int, end: torch.Event) -> None:
    torch.Event.wait(end, torch.accelerator.current_stream(index))


def defer(join_one: Callable[[], None]) -> None:
    """Runs ``join_one`` at this thread's next collective call or wait (a future was taken)."""
    pending = getattr(_local, "pending", None)
    if pending is None:
        pending = _local.pending = []
    pending.append(join_one)


def join_deferred() -> None:
    """Runs every join :func:`defer` left for this thread."""
    pending = getattr(_local, "pending", None)
    if not pending:
        return
    _local.pending = []
    for join_one in pending:
        join_one()
