"""FakeTensor's convolution strides for neuron: the layout the device's kernel produces.

``torch.compile``, ``torch.export`` and every other FakeTensor user predict a
convolution's output strides by asking which backend the device's convolution
takes and what memory format that backend uses. For PrivateUse1 the backend is
"overrideable", whose format PyTorch cannot know, so it predicts contiguous
results. neuron's kernel (``csrc/aten/overrides.cpp``) keeps channels_last models in
channels_last, as CPU and CUDA do: its results (output, grad_input, grad_weight)
are channels_last when the input or the weight is. Inductor checks each extern
kernel's strides against the prediction, so without this a channels_last
convolution failed to run compiled. This teaches FakeTensorMode the device's rule.

Private API (nothing public lets a device give FakeTensor a layout for an ATen op):
``torch._subclasses.fake_impls.op_implementations_checks``, the table FakeTensorMode
consults in order, where an implementation answering ``NotImplemented`` passes the
op on to the next one; and PyTorch's Python mirrors of its stride helpers
(``torch._prims_common``). Checked on torch 2.13.0.
"""

from __future__ import annotations

from typing import Any

import torch
from torch._prims_common import (
    make_channels_last_strides_for,
    make_contiguous_strides_for,
    suggest_memory_format,
)
from torch._subclasses import fake_impls

_aten = torch.ops.aten
_BACKWARD = _aten.convolution_backward.default
_OPS = frozenset(
    {_aten.convolution.default, _aten._convolution.default, _aten._convolution.deprecated, _BACKWARD}
)


def memory_format(input: torch.Tensor, weight: torch.Tensor) -> torch.memory_format:
    """The memory format of a neuron convolution's results (``conv_memory_format`` in C++).

    ``input`` and ``weight`` are the operands as the device kernel receives them
    (see :func:`kernel_operands`).
    """
    formats = {suggest_memory_format(input), suggest_memory_format(weight)}
    for fmt in (torch.channels_last, torch.channels_last_3d):
        if fmt in formats:
            return fmt
    return torch.contiguous_format


def kernel_operands(input: torch.Tensor, weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The input and weight as ATen's convolution composites hand them to the device.

    A 1-d convolution is viewed as 2-d (``unsqueeze(2)``), its input made contiguous first
    (forward and backward).
    """
    if weight.dim() != 3:
        return input, weight
    return input.contiguous().unsqueeze(2), weight.unsqueeze(2)


def strides_for(shape: torch.Size, fmt: torch.memory_format) -> tuple[Any, ...]:
    """Strides of a dense tensor of ``shape`` in ``fmt`` (1-d: as the 2-d view squeezed)."""
    if fmt == torch.contiguous_format:
        return make_contiguous_strides_for(shape)
    if len(shape) == 3:
        strides = make_channels_last_strides_for((*shape[:2], 1, *shape[2:]))
        return (*strides[:2], *strides[3:])
    return make_channels_last_strides_for(shape)


def _restrided(
    fake_mode: Any, t: torch.Tensor | None, fmt: torch.memory_format
) -> torch.Tensor | None:
    if t is None:
        return None
    with fake_mode:  # a fresh tensor: comparing symbolic strides first would add guards
        return torch.empty_strided(t.shape, strides_for(t.shape, fmt), dtype=t.dtype, device=t.device)


def _argument(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], name: str) -> Any:
    for i, argument in enumerate(func._schema.arguments):
        if argument.name == name:
            return args[i] if i < len(args) else kwargs[name]
    raise AssertionError(f"{func} has no argument {name!r}")


def _pytorch_impl(func: Any) -> Any:
    """The implementation FakeTensorMode would use without this module."""
    for check, impl in fake_impls.op_implementations_checks:
        if impl is not neuron_convolution and check(func):
            return impl
    raise AssertionError(f"FakeTensorMode has no implementation of {func}")


def neuron_convolution(fake_mode: Any, func: Any, *args: Any, **kwargs: Any) -> Any:
    """FakeTensorMode's convolution for neuron tensors; ``NotImplemented`` for others."""
    input, weight = _argument(func, args, kwargs, "input"), _argument(func, args, kwargs, "weight")
    device = getattr(input, "fake_device", input.device)
    if device.type != "neuron":
        return NotImplemented
    out = _pytorch_impl(func)(fake_mode, func, *args, **kwargs)
    with fake_mode:
        fmt = memory_format(*kernel_operands(input, weight))
    if func is not _BACKWARD:
        return _restrided(fake_mode, out, fmt)
    grad_input, grad_weight, grad_bias = out
    return _restrided(fake_mode, grad_input, fmt), _restrided(fake_mode, grad_weight, fmt), grad_bias


def _applies(func: Any) -> bool:
    return func in _OPS


def register() -> None:
    """Puts the neuron rule first in FakeTensorMode's table (once per process)."""
    table = fake_impls.op_implementations_checks
    if not any(impl is neuron_convolution for _, impl in table):
        table.insert(0, (_applies, neuron_convolution))
