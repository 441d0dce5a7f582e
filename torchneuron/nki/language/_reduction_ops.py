"""Reductions and normalisations in ``nl``: ``sum``/``max``/``min``/``prod``/``all``
(``tensor_reduce``), ``mean``/``var``, and the composite ``softmax``, ``rms_norm`` and
``dropout`` lowerings described in the module docstring."""

from __future__ import annotations

import math
from typing import Any, Sequence

from torchneuron.nki import dtypes as _dtypes
from torchneuron.nki.errors import fail
from torchneuron.nki.tensor import NkiTensor
from torchneuron.nki.language._elementwise_ops import _op
from torchneuron.nki.language._dtype_buffer_ops import float32, sbuf
from torchneuron.nki.language._base_ops import _int, _isa, _on_chip, _region, _scalar, _tile
from torchneuron.nki.language._creation_ops import _allocate
from torchneuron.nki.language._issue_ops import _emit
from torchneuron.nki.language._movement_ops import _mask_shape, _masked
from torchneuron.nki.language._elementwise_ops import (
    _column, _result_dtype, _unary_out, add, exp, logical_and, maximum, minimum, multiply, reciprocal, rsqrt, square, subtract,
)


# ================================================================= reductions


def _axes(x: NkiTensor, axis: Any, op: str) -> tuple[int, ...]:
    """Validate reduction axes: free dims only, trailing and contiguous (nki-api-facts.md: 3.5)."""
    raw = list(axis) if isinstance(axis, (tuple, list)) else [axis]
    if not raw:
        fail(op, "axis must name at least one free dimension")
    axes = []
    for a in raw:
        a = _int(a, op)
        if a < 0:
            a += x.ndim
        axes.append(a)
    axes = sorted(set(axes))
    if axes[0] <= 0 or axes[-1] >= x.ndim:
        fail(op, f"axis {list(raw)} must be free dims of the {x.ndim}-D tile {list(x.shape)} (1..{x.ndim - 1}); "
             "the partition dim 0 cannot be reduced - transpose first or use nisa.tensor_partition_reduce")
    return tuple(axes)


def _trailing(x: NkiTensor, axes: tuple[int, ...]) -> tuple[int, ...] | None:
    """The free-dim order that puts non-trailing reduction ``axes`` last (None: already trailing).

    ``tensor_reduce`` reduces the trailing free dims; reducing others (AWS's average-pool
    tutorial sums ``axis=[2, 4]``) is the same instruction over a permuted free-dim
    access pattern, which is what the compiler emits (decision 13).
    """
    if list(axes) == list(range(axes[0], x.ndim)):
        return None
    return (0,) + tuple(d for d in range(1, x.ndim) if d not in axes) + tuple(axes)


def _reduced_shape(shape: Sequence[int], axes: tuple[int, ...], keepdims: bool) -> tuple[int, ...]:
    if keepdims:
        return tuple(1 if d in axes else n for d, n in enumerate(shape))
    return tuple(n for d, n in enumerate(shape) if d not in axes)


def _reduce(name: str, op: Any, x: Any, axis: Any, dtype: Any, keepdims: bool, mask: Any = None,
            negate: bool = False) -> NkiTensor:
    x = _on_chip(_tile(x, name), name)
    axes = _axes(x, axis, name)
    valid = _mask_shape(mask, x.shape, name)
    data = _masked(x, valid)
    out = _tile(_allocate(_reduced_shape(x.shape, axes, keepdims), _result_dtype(dtype, x), sbuf, "", name), name)
    out_valid = _reduced_shape(valid, axes, keepdims)
    if 0 in valid:  # the mask keeps nothing (a legacy kernel's all-padding last tile): no instruction
        return out
    order = _trailing(x, axes)
    if order is not None:
        if tuple(valid[1:]) != tuple(x.shape[1:]):  # a partition-only mask (i_p < n) is a slice of dim 0
            fail(name, f"a legacy mask= on free dims with non-trailing reduction axes {list(axes)} is not "
                 "simulated; reduce the trailing free dims, or slice the tile instead of masking it")
        data = data.permute(order)
        axes = tuple(range(x.ndim - len(axes), x.ndim))
        permuted = _reduced_shape(data.shape, axes, keepdims)
        return _emit(out, lambda dst: _isa().tensor_reduce(dst=_masked(dst, out_valid).reshape(permuted), op=op,
                                                           data=data, axis=axes, negate=negate, keepdims=keepdims))
    return _emit(out, lambda dst: _isa().tensor_reduce(dst=_masked(dst, out_valid), op=op, data=data, axis=axes,
                                                       negate=negate, keepdims=keepdims))


def _into_full(result: NkiTensor, shape: tuple[int, ...], valid: tuple[int, ...], op: str) -> NkiTensor:
    """A legacy-masked composite result (computed on the valid region) placed in a full-shape tile."""
    if tuple(valid) == tuple(shape):
        return result
    out = _tile(_allocate(shape, result.dtype, sbuf, "", op), op)
    _isa().tensor_copy(dst=out[_region(result.shape)], src=result)
    return out


@_op("add")
def sum(x: Any, axis: Any, dtype: Any = None, keepdims: bool = False, *, mask: Any = None) -> NkiTensor:
    """Sum over the trailing free ``axis`` (``tensor_reduce(add)``)."""
    return _reduce("sum", add, x, axis, dtype, keepdims, mask)


@_op("maximum")
def max(x: Any, axis: Any, dtype: Any = None, keepdims: bool = False, *, mask: Any = None) -> NkiTensor:
    """Maximum over the trailing free ``axis``."""
    return _reduce("max", maximum, x, axis, dtype, keepdims, mask)


@_op("minimum")
def min(x: Any, axis: Any, dtype: Any = None, keepdims: bool = False, *, mask: Any = None) -> NkiTensor:
    """Minimum over the trailing free ``axis``."""
    return _reduce("min", minimum, x, axis, dtype, keepdims, mask)


@_op("multiply")
def prod(x: Any, axis: Any, dtype: Any = None, keepdims: bool = False, *, mask: Any = None) -> NkiTensor:
    """Product over the trailing free ``axis``."""
    return _reduce("prod", multiply, x, axis, dtype, keepdims, mask)


def all(x: Any, axis: Any, dtype: Any = None, *, mask: Any = None) -> NkiTensor:
    """1 where every element along ``axis`` is non-zero (``tensor_reduce(logical_and)``)."""
    return _reduce("all", logical_and, x, axis, dtype, False, mask)


def mean(x: Any, axis: Any, dtype: Any = None, keepdims: bool = False, *, mask: Any = None) -> NkiTensor:
    """Mean over the trailing free ``axis``, accumulated in fp32 (sum, then a scale)."""
    x = _on_chip(_tile(x, "mean"), "mean")
    axes = _axes(x, axis, "mean")
    valid = _mask_shape(mask, x.shape, "mean")
    data = _masked(x, valid)
    total = _reduce("mean", add, data, axes, float32, keepdims)
    n = math.prod(data.shape[d] for d in axes)
    out = _tile(_allocate(_reduced_shape(x.shape, axes, keepdims), _result_dtype(dtype, x), sbuf, "", "mean"),
                "mean")
    out_valid = _reduced_shape(valid, axes, keepdims)
    return _emit(out, lambda dst: _isa().tensor_scalar(dst=_masked(dst, out_valid), data=total, op0=multiply,
                                                       operand0=1.0 / n))


def var(x: Any, axis: Any, dtype: Any = None, keepdims: bool = False, *, mask: Any = None) -> NkiTensor:
    """Population variance over ``axis`` in fp32; the result always has the keepdims shape (as documented)."""
    x = _on_chip(_tile(x, "var"), "var")
    axes = _axes(x, axis, "var")
    valid = _mask_shape(mask, x.shape, "var")
    data = _masked(x, valid)
    n = math.prod(data.shape[d] for d in axes)
    mu = mean(data, axes, float32, keepdims=True)
    centered = subtract(data, mu, float32)
    squares = multiply(centered, centered, float32)
    total = _reduce("var", add, squares, axes, float32, True)
    out = _tile(_allocate(_reduced_shape(x.shape, axes, True), _result_dtype(dtype, x), sbuf, "", "var"), "var")
    out_valid = _reduced_shape(valid, axes, True)
    return _emit(out, lambda dst: _isa().tensor_scalar(dst=_masked(dst, out_valid), data=total, op0=multiply,
                                                       operand0=1.0 / n))


# ======================================================== activations and norms


def _covers_all_free(x: NkiTensor, axes: tuple[int, ...]) -> bool:
    return axes == tuple(range(1, x.ndim))


def softmax(x: Any, axis: Any = -1, dtype: Any = None, compute_dtype: Any = None, *,
            mask: Any = None) -> NkiTensor:
    """``exp(x - max) / sum(exp(x - max))`` over the free ``axis`` (fp32 intermediates)."""
    x = _on_chip(_tile(x, "softmax"), "softmax")
    valid = _mask_shape(mask, x.shape, "softmax")
    if valid != x.shape:
        return _into_full(softmax(_masked(x, valid), axis, dtype, compute_dtype), x.shape, valid, "softmax")
    axes = _axes(x, axis, "softmax")
    cdt = _dtypes.resolve(compute_dtype) if compute_dtype is not None else float32
    out_dtype = _result_dtype(dtype, x)
    isa = _isa()
    if _covers_all_free(x, axes):
        p = x.shape[0]
        neg_max = _tile(_allocate(_reduced_shape(x.shape, axes, True), float32, sbuf, "", "softmax"), "softmax")
        isa.tensor_reduce(dst=neg_max, op=maximum, data=x, axis=axes, negate=True, keepdims=True)
        e = _tile(_allocate(x.shape, cdt, sbuf, "", "softmax"), "softmax")
        total = _tile(_allocate((p, 1), float32, sbuf, "", "softmax"), "softmax")
        isa.activation(dst=e, op=exp, data=x, bias=_column(neg_max), scale=1.0, reduce_op=add,
                       reduce_res=total, reduce_cmd=isa.reduce_cmd.reset_reduce)
        inv = _tile(_allocate((p, 1), float32, sbuf, "", "softmax"), "softmax")
        isa.reciprocal(dst=inv, data=total)
        out = _tile(_allocate(x.shape, out_dtype, sbuf, "", "softmax"), "softmax")
        return _emit(out, lambda dst: isa.tensor_scalar(dst=dst, data=e, op0=multiply, operand0=inv))
    top = max(x, axes, float32, keepdims=True)
    e = exp(subtract(x, top, cdt), cdt)
    total = sum(e, axes, float32, keepdims=True)
    return multiply(e, reciprocal(total, float32), out_dtype)


def rms_norm(x: Any, w: Any, axis: Any, n: Any, epsilon: float = 1e-06, dtype: Any = None,
             compute_dtype: Any = None, *, mask: Any = None) -> NkiTensor:
    """``x / sqrt(sum(x**2, axis) / n + epsilon) * w`` (fp32 intermediates unless ``compute_dtype``)."""
    x = _on_chip(_tile(x, "rms_norm"), "rms_norm")
    valid = _mask_shape(mask, x.shape, "rms_norm")
    if valid != x.shape:
        w_part = _masked(w, valid) if isinstance(w, NkiTensor) and w.shape == x.shape else w
        return _into_full(rms_norm(_masked(x, valid), w_part, axis, n, epsilon, dtype, compute_dtype),
                          x.shape, valid, "rms_norm")
    axes = _axes(x, axis, "rms_norm")
    cdt = _dtypes.resolve(compute_dtype) if compute_dtype is not None else float32
    isa = _isa()
    if _covers_all_free(x, axes):
        squares = _tile(_allocate(x.shape, cdt, sbuf, "", "rms_norm"), "rms_norm")
        total = _tile(_allocate((x.shape[0], 1), float32, sbuf, "", "rms_norm"), "rms_norm")
        isa.activation(dst=squares, op=square, data=x, reduce_op=add, reduce_res=total,
                       reduce_cmd=isa.reduce_cmd.reset_reduce)
        del squares
    else:
        total = sum(square(x, cdt), axes, float32, keepdims=True)
    ms = _tile(_allocate(total.shape, float32, sbuf, "", "rms_norm"), "rms_norm")
    isa.tensor_scalar(dst=ms, data=total, op0=multiply, operand0=1.0 / float(n), op1=add,
                      operand1=float(epsilon))
    scale = rsqrt(ms, float32)
    normed = multiply(x, scale, cdt)
    return multiply(normed, w, _result_dtype(dtype, x))


def dropout(x: Any, rate: Any, dtype: Any = None, *, mask: Any = None) -> NkiTensor:
    """Zero elements with probability ``rate`` (a scalar or ``(P, 1)`` tile) (VectorE ``dropout``)."""
    x, out, valid = _unary_out("dropout", x, dtype, mask)
    data = _masked(x, valid)
    prob = _column(_masked(rate, (valid[0], 1))) if isinstance(rate, NkiTensor) else _scalar(rate)
    return _emit(out, lambda dst: _isa().dropout(dst=_masked(dst, valid), data=data, prob=prob))
