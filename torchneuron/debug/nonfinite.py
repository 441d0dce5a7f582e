"""Where did the NaN come from: name the first op whose output is not finite.

``with torchneuron.debug.detect_nonfinite():`` checks every floating-point (and
complex) output of every op on a neuron tensor while the block runs; the first
NaN or Inf raises :class:`NonFiniteError` naming the op, the user's Python stack
at the call (for a backward op, where ``backward()`` was called, plus the
forward op's stack when autograd kept it) and statistics of each input (shape,
dtype, min, max, NaN and Inf counts), so an op fed bad values is told from an
op that made them. ``TORCHNEURON_DETECT_NONFINITE=1`` turns it on for the
importing thread from the start.

The check reads each output through its CPU alias (the same memory, no copy),
so it adds no device work, no counted copies and no host syncs to the record.
Off (the default), nothing is installed and the op path is unchanged.

It is a ``TorchDispatchMode`` (public, ``torch.utils._python_dispatch``, checked on
torch 2.13.0): Dynamo does not compile frames while a dispatch mode is active, so
``torch.compile``'d code runs eagerly inside the block and its NaN is named by
the eager op that made it.
"""

from __future__ import annotations

import contextlib
import traceback
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from torchneuron.device import _core, accounting, dataless

__all__ = ["NonFiniteError", "detect_nonfinite", "has_nonfinite", "tensor_stats"]


class NonFiniteError(RuntimeError):
    """An op made a NaN or Inf; ``op``, ``stack`` and ``inputs`` say which, where and from what."""

    def __init__(self, message: str, op: str, stack: list[str], inputs: list[dict[str, Any]]):
        super().__init__(message)
        self.op = op
        self.stack = stack
        self.inputs = inputs


def _host_view(t: torch.Tensor) -> torch.Tensor:
    return _core.cpu_alias(t) if t.device.type == "neuron" else t


def tensor_stats(t: torch.Tensor) -> dict[str, Any]:
    """Shape, dtype, device and, for floating/complex values, min, max, NaN and Inf counts."""
    stats: dict[str, Any] = {"shape": tuple(t.shape), "dtype": str(t.dtype).removeprefix("torch."),
                             "device": str(t.device)}
    plain = _plain(t)
    if t.layout != torch.strided or t.is_meta or plain is None or not _readable(plain):
        return stats
    t = plain
    with torch.utils._python_dispatch._disable_current_modes():
        values = _host_view(t.detach())
        if values.is_complex():
            values = torch.view_as_real(values)
        if values.is_floating_point() and values.numel():
            values = values.float()
            finite = values[torch.isfinite(values)]
            stats["nan"] = int(torch.isnan(values).sum())
            stats["inf"] = int(torch.isinf(values).sum())
            if finite.numel():
                stats["min"] = float(finite.min())
                stats["max"] = float(finite.max())
                stats["mean"] = float(finite.mean())
        elif values.numel() and values.dtype != torch.bool:
            stats["min"] = int(values.min())
            stats["max"] = int(values.max())
    return stats


def _plain(t: torch.Tensor) -> torch.Tensor | None:
    """The tensor holding ``t``'s values on this rank: itself, a DTensor's local shard, or None
    for another wrapper subclass (its values are checked where its own ops run)."""
    if type(t) in (torch.Tensor, torch.nn.Parameter):
        return t
    local = getattr(t, "_local_tensor", None)  # DTensor (torch 2.13.0)
    return local if isinstance(local, torch.Tensor) and type(local) in (torch.Tensor, torch.nn.Parameter) else None


def _readable(t: torch.Tensor) -> bool:
    """Whether ``t``'s elements can be read: it holds values (not made by dataless execution,
    whose values the check assumes finite) and its storage covers its view (FSDP frees an
    unsharded parameter's storage, resize_(0), under a view that keeps its shape)."""
    if not dataless.holds_values(t):
        return False
    span = 1 + sum((size - 1) * stride for size, stride in zip(t.shape, t.stride()))
    return (t.storage_offset() + span) * t.element_size() <= t.untyped_storage().nbytes()


def _not_finite(t: torch.Tensor) -> bool:
    if not (t.is_floating_point() or t.is_complex()) or t.layout != torch.strided or not t.numel():
        return False
    t = _plain(t)
    if t is None or t.device.type != "neuron" or not _readable(t):
        return False
    return not bool(torch.isfinite(_host_view(t)).all())


def has_nonfinite(t: torch.Tensor) -> bool:
    """Whether a neuron tensor (or a DTensor's local shard on neuron) holds a NaN or Inf, read
    through its CPU alias: no device work, copy or host sync is recorded. False for other
    tensors and for tensors without values (dataless execution)."""
    with torch.utils._python_dispatch._disable_current_modes():
        return _not_finite(t)


def _user_stack() -> list[str]:
    """The Python frames outside torch, torchneuron and the standard library, outermost first."""
    frames = traceback.extract_stack()[:-3]
    library = accounting.library_prefixes()
    return [f"{f.filename}:{f.lineno} in {f.name}: {(f.line or '').strip()}"
            for f in frames if not f.filename.startswith(library)]


def _describe(stats: dict[str, Any]) -> str:
    text = f"{stats['dtype']}{list(stats['shape'])} on {stats['device']}"
    if "nan" in stats:
        text += f": {stats['nan']} NaN, {stats['inf']} Inf"
    if "min" in stats:
        text += f", finite min {stats['min']:.6g}, max {stats['max']:.6g}"
    return text


class _NonFiniteMode(TorchDispatchMode):
    """Checks each op's outputs on neuron tensors; raises at the first non-finite one."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        outputs = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
        for t in outputs:
            if t.device.type == "neuron" and _not_finite(t):
                self._report(func, args, kwargs, t)
        return out

    @staticmethod
    def _report(func, args, kwargs, output: torch.Tensor) -> None:
        inputs = [tensor_stats(t) for t in tree_flatten((args, kwargs))[0]
                  if isinstance(t, torch.Tensor)]
        produced = tensor_stats(output)
        stack = _user_stack()
        op = f"aten::{func._schema.name.split('::')[-1]}" + (
            f".{func._overloadname}" if func._overloadname != "default" else "")
        forward = ""
        node = torch._C._current_autograd_node()
        if node is not None:
            trace = node.metadata.get("traceback_", []) if hasattr(node, "metadata") else []
            forward = f" (in the backward of {node.name()})"
            if trace:
                forward += "; forward call:\n    " + "".join(trace).strip().replace("\n", "\n    ")
        lines = [f"{op} produced a non-finite value{forward}: output {_describe(produced)}"]
        for i, s in enumerate(inputs):
            lines.append(f"  input {i}: {_describe(s)}")
        lines.append("  called from (innermost last):")
        lines.extend(f"    {frame}" for frame in stack[-8:] or ["<no frame outside torch>"])
        lines.append("torchneuron.debug.detect_nonfinite() stopped at the first op whose output "
                     "is not finite; inputs that already hold NaN/Inf point further back.")
        raise NonFiniteError("\n".join(lines), op, stack, inputs)


@contextlib.contextmanager
def detect_nonfinite() -> Iterator[None]:
    """Raises :class:`NonFiniteError` at the first op on a neuron tensor whose output holds
    a NaN or Inf, naming the op, its Python stack and its inputs' statistics."""
    with _NonFiniteMode():
        yield


_global_mode: _NonFiniteMode | None = None


def enable_from_setting() -> None:
    """``TORCHNEURON_DETECT_NONFINITE=1``: the check is on in the importing thread from now."""
    global _global_mode
    from torchneuron import config

    if config.get_flag("TORCHNEURON_DETECT_NONFINITE") and _global_mode is None:
        _global_mode = _NonFiniteMode()
        _global_mode.__enter__()
