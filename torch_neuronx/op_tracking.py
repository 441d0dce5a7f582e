"""TorchNeuron's op-tracking helpers, answered from :mod:`torchneuron.metrics`.

TorchNeuron code checks where ops ran with ``torch_neuronx.get_executed_ops()``
(ops the device ran) and ``get_fallback_ops()`` (ops it sent to the CPU), after
``clear_op_tracking()``, and tests ``"aten::flip" in get_executed_ops()``. The
same counts live in ``torchneuron.metrics``, per (op, dtypes) with a call count;
these functions present them as TorchNeuron does: one ``"aten::name"`` entry per
call, without the overload (``aten::add_.Tensor`` is listed as ``aten::add_``).
The order of calls is not recorded, so entries are grouped by op, most called first.
"""

from __future__ import annotations

from torchneuron import metrics

__all__ = ["get_executed_ops", "get_fallback_ops", "clear_op_tracking"]


def _op_name(qualified: str) -> str:
    """``"aten::add_.Tensor"`` -> ``"aten::add_"`` (TorchNeuron lists ops without overloads)."""
    namespace, _, name = qualified.partition("::")
    return f"{namespace}::{name.split('.', 1)[0]}" if name else qualified


def _calls(fallback: bool) -> list[str]:
    names: list[str] = []
    for count in metrics.ops():
        if count.cpu_fallback == fallback:
            names.extend([_op_name(count.op)] * count.calls)
    return names


def get_executed_ops() -> list[str]:
    """Ops that ran on the device since the last :func:`clear_op_tracking`, one entry per call."""
    return _calls(fallback=False)


def get_fallback_ops() -> list[str]:
    """Ops real Trainium runs on the host CPU (counted CPU fallbacks), one entry per call."""
    return _calls(fallback=True)


def clear_op_tracking() -> None:
    """Forget the ops tracked so far.

    This is ``torchneuron.metrics.reset()``: it also zeroes the host-sync and
    transfer counters that ``torchneuron.metrics.report()`` shows.
    """
    metrics.reset()
