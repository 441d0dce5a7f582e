"""Printing a neuron tensor reads it to the host once, as printing an XLA tensor does.

PyTorch's formatter (``torch/_tensor_str.py``) computes on the tensor it prints:
float64 ``min``/``max``/``div`` to choose a number format and ``masked_select`` for
the finite values, ops that real Trainium runs on the host. Left on the device they
would be warned about as the user's CPU fallbacks, fill ``torchneuron.metrics``, and
fail strict mode (``TORCHNEURON_CPU_FALLBACK=0``) for a plain ``print(t)``. PyTorch
copies XLA, lazy, IPU and MTIA tensors to the CPU before formatting; this does the
same for neuron, so printing is one device-to-host copy and one host sync (counted),
and the formatter's arithmetic runs on that CPU copy.

Private torch API: ``torch._tensor_str._tensor_str`` (the formatter of a tensor's
values), checked on torch 2.13.0. Nothing public decides where printing computes.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch._tensor_str as _tensor_str_module

_formatter: Callable[[torch.Tensor, int], str] | None = None


def _format_on_host(self: torch.Tensor, indent: int) -> str:
    if self.device.type == "neuron":
        from torchneuron.device import sync_debug

        with sync_debug.printing():  # sync debug mode names this read "printing"
            self = self.cpu()
    return _formatter(self, indent)


def install() -> None:
    """Makes the formatter read neuron tensors to the host first (idempotent)."""
    global _formatter
    if _formatter is None:
        _formatter = _tensor_str_module._tensor_str
        _tensor_str_module._tensor_str = _format_on_host
