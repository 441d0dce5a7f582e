"""Result shapes for the ops dataless execution cannot shape with a Meta kernel.

The C++ core (``csrc/aten/dataless.cpp``) runs each op's Meta kernel on meta stand-ins
of its arguments. It calls :func:`shape` instead for two kinds of op:

- ops whose result shape depends on values (:data:`PYTHON_OPS`, and Meta kernels that
  stop at a data-dependent step, such as indexing with a boolean mask): they get the
  largest shape possible, or a fraction of it from
  :func:`torchneuron.device.dataless.shape_hints`, noted with the call site;
- ops without a Meta kernel: in-place ops keep their arguments' shapes, out= ops take
  their functional form's, and small ones run on zero-filled CPU stand-ins; anything
  else raises ``NotImplementedError`` naming the op.

Each rule takes the op and its arguments in schema order (meta tensors for tensors)
and returns its results as a tuple of meta tensors and values.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from typing import Any

import torch

from torchneuron.device import dataless

_META = torch.device("meta")
# Ops without a Meta kernel run on zero-filled CPU stand-ins up to this many elements.
SMALL_CPU_ELEMENTS = 1 << 16


@functools.lru_cache(maxsize=None)
def _overload(name: str) -> torch._ops.OpOverload:
    namespace, _, rest = name.partition("::")
    base, _, overload = rest.partition(".")
    return getattr(getattr(getattr(torch.ops, namespace), base), overload or "default")


def _call(op: torch._ops.OpOverload, args: Sequence[Any]) -> Any:
    """Calls ``op`` with arguments in schema order (keyword-only ones as keywords)."""
    positional, keywords = [], {}
    for argument, value in zip(op._schema.arguments, args):
        if argument.kwarg_only:
            keywords[argument.name] = value
        else:
            positional.append(value)
    return op(*positional, **keywords)


def _as_tuple(result: Any, op: torch._ops.OpOverload) -> tuple[Any, ...]:
    if len(op._schema.returns) == 1:
        return (result,)
    return tuple(result) if result is not None else ()


def _empty(shape: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
    return torch.empty(tuple(shape), dtype=dtype, device=_META)


# ---- data-dependent result shapes ---------------------------------------------

def _nonzero_length(mask: torch.Tensor) -> int:
    return dataless.bounded_length("nonzero", mask.numel())


def _nonzero(op: Any, args: Sequence[Any]) -> tuple[Any, ...]:
    self = args[0]
    n = _nonzero_length(self)
    return (torch.empty_strided((n, self.dim()), (1, max(n, 1)), dtype=torch.long, device=_META),)


def _masked_select(op: Any, args: Sequence[Any]) -> tuple[Any, ...]:
    self, mask = args[0], args[1]
    shape = torch.broadcast_shapes(self.shape, mask.shape)
    n = dataless.bounded_length("masked_select", math.prod(shape))
    return (_empty((n,), self.dtype),)


def _unique_length(elements: int) -> int:
    return dataless.bounded_length("unique", elements)


def _unique2(op: Any, args: Sequence[Any]) -> tuple[Any, ...]:
    self, _sorted, return_inverse, return_counts = args[:4]
    n = _unique_length(self.numel())
    return (_empty((n,), self.dtype), _empty(self.shape if return_inverse else (0,), torch.long),
            _empty((n,) if return_counts else (0,), torch.long))


def _unique(op: Any, args: Sequence[Any]) -> tuple[Any, ...]:
    self, _sorted, return_inverse = args[:3]
    n = _unique_length(self.numel())
    return _empty((n,), self.dtype), _empty(self.shape if return_inverse else (0,), torch.long)


def _unique_along(self: torch.Tensor, dim: int, return_inverse: bool,
                  return_counts: bool) -> tuple[Any, ...]:
    dim = dim % max(self.dim(), 1)
    n = _unique_length(self.shape[dim])
    shape = list(self.shape)
    shape[dim] = n
    return (_empty(shape, self.dtype), _empty((self.shape[dim],) if return_inverse else (0,), torch.long),
            _empty((n,) if return_counts else (0,), torch.long))


def _unique_dim(op: Any, args: Sequence[Any]) -> tuple[Any, ...]:
    self, dim = args[0], args[1]
    return _unique_along(self, dim, args[-2], args[-1])


def _unique_consecutive(op: Any, args: Sequence[Any]) -> tuple[Any, ...]:
    self, return_inverse, return_counts, dim = args[:4]
    if dim is not None:
        return _unique_along(self, dim, return_inverse, return_counts)
    n = _unique_length(self.numel())
    return (_empty((n,), self.dtype), _empty(self.shape if return_inverse else (0,), torch.long),
            _empty((n,) if return_counts else (0,), torch.long))


def _bincount(op: Any, args: Sequence[Any]) -> tuple[Any, ...]:
    self, weights, minlength = args[:3]
    # The length is the largest value + 1, which no bound gives: minlength (MoE routing
    # passes the expert count), noted as a data-dependent shape.
    length = max(int(minlength), 1)
    dataless.bounded_length("bincount", length)
    return (_empty((length,), weights.dtype if weights is not None else torch.long),)


def _repeat_interleave(op: Any, args: Sequence[Any]) -> tuple[Any, ...]:
    repeats, output_size = args[0], args[1]
    if output_size is None:  # sum(repeats): each repeat taken as 1, noted
        output_size = dataless.bounded_length("repeat_interleave", repeats.numel())
    return (_empty((int(output_size),), torch.long),)


def _equal(op: Any, args: Sequence[Any]) -> tuple[Any, ...]:
    # A comparison of values never computed: they are taken as equal, and the read noted.
    return (bool(dataless.observe_read("equal", list(args[0].shape), str(args[0].dtype).removeprefix("torch."), 1.0)),)


def _long_indices(indices: Sequence[Any]) -> list[Any]:
    """Boolean masks among ``indices`` as the long index tensors nonzero would give."""
    out: list[Any] = []
    for index in indices:
        if index is not None and index.dtype in (torch.bool, torch.uint8):
            n = _nonzero_length(index)
            out.extend(_empty((n,), torch.long) for _ in range(index.dim()))
        else:
            out.append(index)
    return out


def _index(op: Any, args: Sequence[Any]) -> tuple[Any, ...]:
    self, indices = args[0], args[1]
    return _as_tuple(_call(op, [self, _long_indices(indices), *args[2:]]), op)


def _index_put_(op: Any, args: Sequence[Any]) -> tuple[Any, ...]:
    return (args[0],)  # in place: self keeps its shape


_RULES: dict[str, Callable[[Any, Sequence[Any]], tuple[Any, ...]]] = {
    "aten::nonzero": _nonzero,
    "aten::masked_select": _masked_select,
    "aten::_unique2": _unique2,
    "aten::_unique": _unique,
    "aten::unique_dim": _unique_dim,
    "aten::unique_consecutive": _unique_consecutive,
    "aten::unique_dim_consecutive": _unique_dim,
    "aten::bincount": _bincount,
    "aten::repeat_interleave": _repeat_interleave,
    "aten::equal": _equal,
    "aten::index": _index,
    "aten::index_put_": _index_put_,
    "aten::_index_put_impl_": _index_put_,
}
# Ops (by base name) the core sends here without trying their Meta kernel first.
PYTHON_OPS = frozenset(name for name in _RULES if name not in ("aten::index", "aten::index_put_",
                                                                "aten::_index_put_impl_"))


# ---- ops without a Meta kernel ------------------------------------------------

def _written(op: torch._ops.OpOverload) -> list[int]:
    return [i for i, a in enumerate(op._schema.arguments) if a.alias_info is not None and a.alias_info.is_write]


def _aliased_argument(op: torch._ops.OpOverload, ret: Any) -> int | None:
    if ret.alias_info is None:
        return None
    for i, argument in enumerate(op._schema.arguments):
        if argument.alias_info is not None and argument.alias_info.before_set & ret.alias_info.before_set:
            return i
    return None


def _functional(op: torch._ops.OpOverload) -> torch._ops.OpOverload | None:
    """The overload of ``op``'s packet that computes what its out= form writes."""
    packet = getattr(getattr(torch.ops, op.namespace), op._schema.name.split("::")[1])
    for name in packet.overloads():
        candidate = getattr(packet, name)
        if not _written(candidate) and len(candidate._schema.arguments) == len(op._schema.arguments) - len(_written(op)):
            return candidate
    return None


def _stand_in(value: Any) -> Any:
    if isinstance(value, torch.Tensor) and value.device.type == "meta":
        return torch.empty_strided(value.shape, value.stride(), dtype=value.dtype).zero_()
    if isinstance(value, (list, tuple)):
        return type(value)(_stand_in(v) for v in value)
    return value


def _elements(values: Sequence[Any]) -> int:
    total = 0
    for value in values:
        if isinstance(value, torch.Tensor):
            total += value.numel()
        elif isinstance(value, (list, tuple)):
            total += _elements(value)
    return total


def _to_meta(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return torch.empty_strided(value.shape, value.stride(), dtype=value.dtype, device=_META)
    if isinstance(value, (list, tuple)):
        return type(value)(_to_meta(v) for v in value)
    return value


def _without_meta(op: torch._ops.OpOverload, args: Sequence[Any]) -> tuple[Any, ...]:
    schema = op._schema
    written = _written(op)
    returns = [_aliased_argument(op, ret) for ret in schema.returns]
    if written and all(r is not None and r in written for r in returns):
        out_form = any(schema.arguments[i].kwarg_only for i in written)
        if not out_form:  # in place: the written arguments keep their shapes
            return tuple(args[r] for r in returns)
        functional = _functional(op)
        if functional is not None:
            inputs = [a for i, a in enumerate(args) if i not in written]
            results = _as_tuple(_call(functional, inputs), functional)
            for r, result in zip(returns, results):
                args[r].resize_(result.shape)
            return tuple(args[r] for r in returns)
    if _elements(args) <= SMALL_CPU_ELEMENTS:  # run it on zeros: the shapes are the op's own
        cpu_args = [_stand_in(a) for a in args]
        results = _as_tuple(_call(op, cpu_args), op)
        for i in written:
            if isinstance(args[i], torch.Tensor) and args[i].shape != cpu_args[i].shape:
                args[i].resize_(cpu_args[i].shape)
        return tuple(args[r] if r is not None and r in written else _to_meta(v)
                     for r, v in zip(returns, results))
    raise NotImplementedError(
        f"{schema.name}.{schema.overload_name or 'default'} has no Meta kernel (no shape function), so "
        "dataless execution cannot run it on tensors this large; run this part without "
        "torchneuron.dataless, or report the op to torchneuron")


def shape(name: str, args: tuple[Any, ...]) -> tuple[Any, ...]:
    """The results of op ``name`` ("aten::nonzero", "aten::index.Tensor") on meta ``args``."""
    op = _overload(name)
    rule = _RULES.get(name.split(".")[0])
    if rule is not None:
        return rule(op, list(args))
    return _without_meta(op, list(args))
