"""Sync debug mode: every host synchronisation warns or raises at the user's line.

``torch.neuron.set_sync_debug_mode`` is ``torch.cuda.set_sync_debug_mode`` for
neuron: ``"default"`` (0) does nothing, ``"warn"`` (1) warns, ``"error"`` (2)
raises ``RuntimeError`` before the synchronisation does anything. The mode is
the setting ``TORCHNEURON_SYNC_DEBUG`` (declared in :mod:`torchneuron.config`),
so it can also be exported before a run.

A synchronisation is where the host waits for the device on real Trainium: a
read to the host (``.cpu()``, ``.to("cpu")``, ``.tolist()``, ``.numpy()`` after
``.cpu()``, printing), a scalar read (``.item()``, ``bool(t)``, ``int(t)``,
``float(t)``), ``torch.neuron.synchronize()`` / ``torch.accelerator.synchronize()``
/ ``Stream.synchronize()``, and ops whose output shape depends on the data
(``nonzero``, ``masked_select``, boolean-mask indexing, ``unique``, ...), which the
host must wait for to size their output. The C++ core calls :func:`_on_sync`
before each of the first three kinds; the CPU-fallback observer
(:mod:`torchneuron.device.fallback`) reports the last.

With the mode at ``default`` and no listener the core is told nothing is
watching, and a synchronisation costs one atomic load.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torchneuron
from torchneuron import _C, config
from torchneuron.device import accounting

__all__ = ["set_sync_debug_mode", "get_sync_debug_mode", "HostSync", "listening"]

SETTING = "TORCHNEURON_SYNC_DEBUG"
_MODES = {"default": 0, "warn": 1, "error": 2, "0": 0, "1": 1, "2": 2}
_NAMES = ("default", "warn", "error")

# What each kind of synchronisation is, in the user's words.
_DESCRIPTIONS = {
    "copy_to_host": "a copy from {device} to the host (.cpu(), .to('cpu'), .tolist(), ...)",
    "item": "a scalar read of {device} (.item(), bool(), int(), float())",
    "synchronize": "torch.neuron.synchronize() on {device}",
    "stream_synchronize": "Stream.synchronize() on {device}",
    "printing": "printing a tensor on {device} (it is read to the host)",
    "data_dependent_shape": "{op} on {device}: its output shape depends on the data, so the "
                            "host waits for the values",
}


@dataclass(frozen=True)
class HostSync:
    """One host synchronisation as a listener sees it."""

    kind: str  # copy_to_host, item, synchronize, stream_synchronize, printing, data_dependent_shape
    device: int
    nbytes: int
    description: str
    site: str  # "file:line in function" of the innermost frame outside torch and torchneuron
    # The user frames of its Python stack, innermost (``site``) first; kept while a listener
    # listens (a report: ``torchneuron check``), empty otherwise.
    stack: tuple[str, ...] = ()


_state = threading.local()  # .printing: inside the formatter's read to the host
_listeners: list[Callable[[HostSync], None]] = []
_lock = threading.Lock()
_mode = 0


def _mode_from(value: int | str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise TypeError(f"set_sync_debug_mode: debug_mode must be an int or a str, "
                        f"got {type(value).__name__}")
    key = str(value).strip().lower()
    if key not in _MODES:
        raise RuntimeError(f"invalid value of debug_mode, expected one of `default`, `warn`, "
                           f"`error` (or 0, 1, 2), got {value!r}")
    return _MODES[key]


def set_sync_debug_mode(debug_mode: int | str) -> None:
    r"""Set what a host synchronisation does, as ``torch.cuda.set_sync_debug_mode``.

    Args:
        debug_mode: ``"default"`` or 0: nothing; ``"warn"`` or 1: a ``UserWarning`` at
            the caller's line; ``"error"`` or 2: ``RuntimeError`` naming the sync, raised
            before it runs.
    """
    config.set_value(SETTING, _NAMES[_mode_from(debug_mode)])


def get_sync_debug_mode() -> int:
    r"""Return the sync debug mode: 0 (default), 1 (warn) or 2 (error)."""
    return _mode


def configure() -> None:
    """Reads the setting and tells the core whether anything watches (re-run on change)."""
    global _mode
    _mode = _MODES[str(config.value(SETTING))]
    _install()


def _install() -> None:
    _C._set_sync_watcher(_on_sync if (_mode or _listeners) else None)


@contextlib.contextmanager
def listening(listener: Callable[[HostSync], None]) -> Iterator[None]:
    """Calls ``listener`` with each :class:`HostSync` while the block runs (for reports);
    the mode's warning or error still applies."""
    with _lock:
        _listeners.append(listener)
        _install()
    try:
        yield
    finally:
        with _lock:
            _listeners.remove(listener)
            _install()


@contextlib.contextmanager
def printing() -> Iterator[None]:
    """Marks the formatter's read of a printed tensor, so the sync is named as printing."""
    previous = getattr(_state, "printing", False)
    _state.printing = True
    try:
        yield
    finally:
        _state.printing = previous


_SKIP_DIRS: tuple[str, ...] | None = None


def _user_frame():
    """The innermost Python frame outside torch, torchneuron and the standard library."""
    global _SKIP_DIRS
    if _SKIP_DIRS is None:
        import torch

        _SKIP_DIRS = tuple(os.path.dirname(m.__file__) + os.sep
                           for m in (torch, torchneuron, os, contextlib))
    frame = sys._getframe(1)
    while frame is not None:
        name = frame.f_code.co_filename
        if not name.startswith(_SKIP_DIRS) and not name.startswith("<frozen"):
            return frame
        frame = frame.f_back
    return None


def _on_sync(device: int, kind: str, nbytes: int, op: str = "") -> None:
    """Called before each host synchronisation while a mode is set or a listener listens."""
    if kind == "copy_to_host" and getattr(_state, "printing", False):
        kind = "printing"
    where = f"neuron:{device}" if device >= 0 else "the current neuron device"
    description = _DESCRIPTIONS[kind].format(device=where, op=op)
    frame = _user_frame()
    site = (f"{frame.f_code.co_filename}:{frame.f_lineno} in {frame.f_code.co_name}"
            if frame is not None else "<unknown>")
    stack = accounting.user_stack(frame) if frame is not None and _listeners else ()
    sync = HostSync(kind, device, nbytes, description, site, stack)
    for listener in list(_listeners):
        listener(sync)
    if _mode == 2:
        raise RuntimeError(f"called a synchronizing neuron operation: {description}, at {site}. "
                           "torch.neuron.set_sync_debug_mode('error') is set; "
                           "set_sync_debug_mode('default') allows it.")
    if _mode == 1:
        message = f"called a synchronizing neuron operation: {description}"
        if frame is None:
            warnings.warn(message, UserWarning, stacklevel=2)
        else:
            registry = frame.f_globals.setdefault("__warningregistry__", {})
            warnings.warn_explicit(message, UserWarning, frame.f_code.co_filename, frame.f_lineno,
                                   module=frame.f_globals.get("__name__") or "<unknown>",
                                   registry=registry)  # module=None can drop the warning (3.11)


def watching() -> bool:
    """Whether a mode is set or a listener listens (the fallback observer asks first)."""
    return bool(_mode or _listeners)


def on_data_dependent_op(op: str, device: int) -> None:
    """The fallback observer's report of an op whose output shape depends on the data."""
    _on_sync(device, "data_dependent_shape", 0, op)
