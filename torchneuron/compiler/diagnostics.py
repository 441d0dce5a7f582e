"""Warnings of ``torch.compile(backend="neuron")`` and its compile cache."""

from __future__ import annotations

import threading
import warnings
from collections.abc import Hashable


class NeuronCompileWarning(UserWarning):
    """torch.compile(backend="neuron") ignored a setting, ran a graph eagerly, or compiles
    without (part of) its persistent cache."""


_warned: set[Hashable] = set()
_warned_lock = threading.Lock()


def warn_once(key: Hashable, message: str) -> None:
    """A :class:`NeuronCompileWarning` the first time ``key`` is seen in this process: a
    cache problem is reported once, not at every compile of a long run."""
    with _warned_lock:
        if key in _warned:
            return
        _warned.add(key)
    warnings.warn(message, NeuronCompileWarning, stacklevel=3)


class CacheUnavailable(Exception):
    """The persistent compile cache cannot be used here (its path is unusable): compiling
    goes on without it, after one warning carrying this message."""


class UnsafeCacheError(RuntimeError):
    """The compile cache (or its key) could be written or read by someone else: refused,
    since files in it are loaded as code."""
