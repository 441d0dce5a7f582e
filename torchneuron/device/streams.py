"""Streams and events of neuron devices, shaped like torch.cuda's.

Neuron work runs synchronously on the host, so a stream is always idle and an
event completes when recorded; ``Event.elapsed_time`` is host-measured time.
"""

from __future__ import annotations

from typing import Any

import torch

from torchneuron import _C
from torchneuron.device._core import Device, device_index

__all__ = [
    "Event",
    "Stream",
    "StreamContext",
    "current_stream",
    "default_stream",
    "set_stream",
    "stream",
    "synchronize",
]


class Stream(torch.Stream):
    r"""A neuron stream: an in-order queue of work on one device.

    Args:
        device (torch.device or int, optional): the device of the stream; the
            current device if ``None``.
        priority (int, optional): accepted for CUDA compatibility; ignored.
    """

    def __new__(cls, device: Device = None, priority: int = 0, **kwargs: Any) -> Stream:
        if {"stream_id", "device_index", "device_type"} <= kwargs.keys():
            return super().__new__(cls, **kwargs)
        index = device_index(device)
        return super().__new__(cls, device=torch.device("neuron", index), priority=priority)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def wait_event(self, event: torch.Event) -> None:
        r"""Make later work on this stream wait for ``event``."""
        event.wait(self)

    def wait_stream(self, stream: torch.Stream) -> None:
        r"""Make later work on this stream wait for the work queued on ``stream``."""
        self.wait_event(stream.record_event())

    def record_event(self, event: torch.Event | None = None) -> Event:
        r"""Record an event on this stream (a new one if ``None``) and return it."""
        event = Event() if event is None else event
        event.record(self)
        return event

    def __repr__(self) -> str:
        return f"<torch.neuron.Stream device=neuron:{self.device_index} stream_id={self.stream_id}>"


class Event(torch.Event):
    r"""A neuron event: a marker in a stream, for ordering and timing.

    Args:
        enable_timing (bool, optional): allow :meth:`elapsed_time` (default ``False``).
        blocking (bool, optional): accepted for CUDA compatibility.
        interprocess (bool, optional): accepted for CUDA compatibility.
        external (bool, optional): accepted for CUDA compatibility.
    """

    def __new__(
        cls,
        enable_timing: bool = False,
        blocking: bool = False,
        interprocess: bool = False,
        external: bool = False,
    ) -> Event:
        return super().__new__(
            cls,
            device=torch.device("neuron", device_index(None)),
            enable_timing=enable_timing,
            blocking=blocking,
            interprocess=interprocess,
        )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def record(self, stream: torch.Stream | None = None) -> None:
        r"""Record the event on ``stream`` (the current stream if ``None``)."""
        super().record(current_stream() if stream is None else stream)

    def wait(self, stream: torch.Stream | None = None) -> None:
        r"""Make ``stream`` (the current stream if ``None``) wait for this event."""
        super().wait(current_stream() if stream is None else stream)

    def elapsed_time(self, end_event: torch.Event) -> float:
        r"""Milliseconds between this event and ``end_event`` (both recorded, timing on)."""
        return _C._elapsed_time(self, end_event)

    def __repr__(self) -> str:
        return f"<torch.neuron.Event device={self.device}>"


def _wrap(s: torch.Stream) -> Stream:
    return Stream(stream_id=s.stream_id, device_index=s.device_index, device_type=s.device_type)


def current_stream(device: Device = None) -> Stream:
    r"""Return the current stream of a device (the current device if ``None``)."""
    return _wrap(torch.accelerator.current_stream(device_index(device)))


def default_stream(device: Device = None) -> Stream:
    r"""Return the default stream of a device (the current device if ``None``)."""
    current = torch.accelerator.current_stream(device_index(device))
    return Stream(stream_id=0, device_index=current.device_index, device_type=current.device_type)


def set_stream(stream: torch.Stream) -> None:
    r"""Make ``stream`` current for its device (and that device current)."""
    if stream is None:
        return
    torch.accelerator.set_stream(stream)


class StreamContext:
    r"""Context manager that makes a stream current (and its device) and restores both."""

    def __init__(self, stream: torch.Stream | None) -> None:
        self.stream = stream
        self._target_prev: torch.Stream | None = None  # old stream of the stream's device
        self._origin_prev: torch.Stream | None = None  # old stream of the current device

    def __enter__(self) -> torch.Stream | None:
        if self.stream is None:
            return None
        self._origin_prev = torch.accelerator.current_stream(device_index(None))
        self._target_prev = torch.accelerator.current_stream(self.stream.device_index)
        torch.accelerator.set_stream(self.stream)  # also selects its device
        return self.stream

    def __exit__(self, *exc: object) -> None:
        if self.stream is None:
            return
        torch.accelerator.set_stream(self._target_prev)
        torch.accelerator.set_stream(self._origin_prev)  # restores the device too


def stream(stream: torch.Stream | None) -> StreamContext:
    r"""Context manager selecting ``stream`` (a no-op for ``None``)."""
    return StreamContext(stream)


def synchronize(device: Device = None) -> None:
    r"""Wait for all work on a device (the current device if ``None``)."""
    torch.accelerator.synchronize(device_index(device))
