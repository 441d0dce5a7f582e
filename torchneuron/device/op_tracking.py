"""TorchNeuron's op-tracking names on ``torch.neuron``, as views of the one record.

AWS's TorchNeuron has ``torch.neuron.get_fallback_ops()``, ``get_executed_ops()``,
``clear_op_tracking()`` and ``get_dynamo_metrics()`` / ``reset_dynamo_metrics()``
(trainium-facts.md: TorchNeuron names and switches). Its fallback and executed
lists are lists of operation names; here they read the per-op totals of
:mod:`torchneuron.device.accounting`, so they agree with ``torchneuron.metrics``.
For per-dtype counts, call sites and reasons, use ``torchneuron.metrics.fallbacks()``.
"""

from __future__ import annotations

from typing import Any

from torchneuron.device import accounting

__all__ = ["get_fallback_ops", "get_executed_ops", "clear_op_tracking", "get_dynamo_metrics",
           "reset_dynamo_metrics"]


def get_fallback_ops() -> list[str]:
    r"""Names of the ops (e.g. ``"aten::nonzero"``) the program ran that real Trainium runs
    on the host CPU, since the last :func:`clear_op_tracking`, sorted. Calls made by PyTorch
    internals that compute on the host by design (GradScaler) are not the program's and are
    left out, as in ``torchneuron.metrics.fallbacks()``."""
    return sorted({t.op for t in accounting.op_totals() if t.cpu_fallback and t.calls})


def get_executed_ops() -> list[str]:
    r"""Names of the ops the program ran on the neuron device (not CPU fallbacks) since the
    last :func:`clear_op_tracking`, sorted."""
    return sorted({t.op for t in accounting.op_totals() if not t.cpu_fallback and t.calls})


def clear_op_tracking() -> None:
    r"""Forget which ops ran: zeroes the record's counters, as ``torchneuron.metrics.reset()``
    does (one record backs both)."""
    accounting.reset()


def get_dynamo_metrics() -> dict[str, Any]:
    r"""What ``torch.compile(backend="neuron")`` did: compiles, cache hits and misses,
    compile time, graph breaks and recompiles with reasons (``torch.neuron.compile_metrics()``).
    TorchNeuron returns one record per compiled graph; this returns the totals."""
    return accounting.compile_metrics()


def reset_dynamo_metrics() -> None:
    r"""Zero the ``torch.compile`` counters (``torch.neuron.reset_compile_metrics()``)."""
    accounting.reset_compile_metrics()
