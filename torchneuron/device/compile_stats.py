"""Compile counters shown by ``torch.neuron.compile_metrics()``.

The compiler (``torchneuron.compiler``) records into this module; it lives on
the device side so ``torch.neuron`` can report it without importing the
compiler (and with it Dynamo and Inductor) on ``import torch``.
"""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass, field

__all__ = ["CompileMetrics", "compile_metrics", "reset_compile_metrics"]


@dataclass
class CompileMetrics:
    """What ``torch.compile(backend="neuron")`` did since the last reset."""

    compiles: int = 0  # graphs the backend compiled (each forward and backward graph counts)
    cache_hits: int = 0  # of those, served from the persistent compile cache
    cache_misses: int = 0  # ... and generated afresh
    compile_seconds: float = 0.0  # wall time inside the backend
    graph_breaks: int = 0  # Dynamo graph breaks in frames compiled for neuron
    graph_break_reasons: Counter = field(default_factory=Counter)
    recompiles: int = 0  # a frame compiled again (a guard, e.g. an input shape, changed)
    recompile_reasons: list[str] = field(default_factory=list)
    eager_fallbacks: int = 0  # graphs that failed to compile and run eagerly (fallback execution on)
    partitioned_ops: Counter = field(default_factory=Counter)  # ops left to the device's CPU fallback

    def as_dict(self) -> dict:
        return {
            "compiles": self.compiles,
            "cache_hits": self.cache_hits,
            "cache_misses": self.cache_misses,
            "compile_seconds": self.compile_seconds,
            "graph_breaks": self.graph_breaks,
            "graph_break_reasons": dict(self.graph_break_reasons),
            "recompiles": self.recompiles,
            "recompile_reasons": list(self.recompile_reasons),
            "eager_fallbacks": self.eager_fallbacks,
            "partitioned_ops": dict(self.partitioned_ops),
        }


_lock = threading.Lock()
_metrics = CompileMetrics()


def record(**deltas) -> None:
    """Adds to counters (numbers), counters of reasons (Counter) or lists of reasons."""
    with _lock:
        for name, delta in deltas.items():
            current = getattr(_metrics, name)
            if isinstance(current, Counter):
                current.update(delta)
            elif isinstance(current, list):
                current.extend(delta)
            else:
                setattr(_metrics, name, current + delta)


def compile_metrics() -> dict:
    """Compiles, cache hits and misses, compile time, graph breaks and recompiles with reasons."""
    with _lock:
        return _metrics.as_dict()


def reset_compile_metrics() -> None:
    """Zeroes the compile counters."""
    global _metrics
    with _lock:
        _metrics = CompileMetrics()
