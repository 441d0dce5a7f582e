"""Manipulation and selection in ``nl``: ``expand_dims``, ``where`` and ``gather_flattened``
(``broadcast_to`` lives with the element-wise ops that broadcast through it)."""

from __future__ import annotations

from typing import Any


from torchneuron.nki import dtypes as _dtypes
from torchneuron.nki.errors import fail
from torchneuron.nki.tensor import NkiTensor
from torchneuron.nki.language._dtype_buffer_ops import _D, sbuf
from torchneuron.nki.language._base_ops import _int, _is_scalar, _isa, _on_chip, _tile
from torchneuron.nki.language._creation_ops import (
    _allocate, _fill_value, _reject_legacy_kwargs, full,
)
from torchneuron.nki.language._issue_ops import _emit, _issue
from torchneuron.nki.language._movement_ops import _mask_shape, _masked, copy
from torchneuron.nki.language._elementwise_ops import _broadcast_shape, _expand, _result_dtype


# ================================================ manipulation and selection


def expand_dims(x: Any, axis: Any) -> NkiTensor:
    """A view of ``x`` with new size-1 dims at ``axis`` (an int or a sequence of ints)."""
    x = _tile(x, "expand_dims")
    axes = sorted(axis) if isinstance(axis, (tuple, list)) else [axis]
    for a in axes:
        a = _int(a, "expand_dims")
        x = x.expand_dim(a if a >= 0 else a + x.ndim + 1)
    return x


def where(condition: Any, x: Any, y: Any, dtype: Any = None, *, mask: Any = None) -> NkiTensor:
    """``x`` where ``condition`` (a 1.0 / 0.0 tile) is non-zero, else ``y``.

    Lowered to ``out = y`` (``tensor_copy``, or ``memset`` for a scalar) then
    ``tensor_copy_predicated(out, x, predicate=condition)``; a float condition is
    read as its bit pattern (``.view`` as an unsigned type: 0.0 is false).
    """
    cond = _on_chip(_tile(condition, "where", "condition"), "where", "condition")
    tiles = [t for t in (cond, x, y) if isinstance(t, NkiTensor)]
    shape = _broadcast_shape("where", *tiles)
    valid = _mask_shape(mask, shape, "where")
    values = [v for v in (x, y) if isinstance(v, NkiTensor)]
    out_dtype = _result_dtype(dtype, *values, *[v for v in (x, y) if _is_scalar(v)]) if values else \
        _result_dtype(dtype, cond, *(v for v in (x, y) if _is_scalar(v)))
    out = _tile(_allocate(shape, out_dtype, sbuf, "", "where"), "where")
    region = _masked(out, valid)
    if isinstance(y, NkiTensor):
        _isa().tensor_copy(dst=region, src=_masked(_expand(_on_chip(y, "where", "y"), shape, "where"), valid))
    else:
        _issue(lambda: _isa().memset(dst=region, value=_fill_value(y, out_dtype, "where")))
    if isinstance(x, NkiTensor):
        src = _expand(_on_chip(x, "where", "x"), shape, "where")
        if src.dtype != out_dtype:
            src = copy(src, out_dtype)
    else:
        src = full(shape, x, out_dtype, name="where.x")
    src = _masked(src, valid)
    pred = _masked(_expand(cond, shape, "where"), valid)
    if pred.dtype.name not in ("uint8", "uint16", "uint32"):
        pred = pred.view(_D[f"uint{pred.dtype.itemsize * 8}"])
    _isa().tensor_copy_predicated(dst=region, src=src, predicate=pred)
    return out


def gather_flattened(data: Any, indices: Any, axis: int = 0, dtype: Any = None, *, mask: Any = None,
                     **legacy: Any) -> NkiTensor:
    """Per partition, gather ``data``'s flattened free elements at uint32 ``indices`` (``nc_n_gather``)."""
    _reject_legacy_kwargs("gather_flattened", legacy)
    data = _on_chip(_tile(data, "gather_flattened", "data"), "gather_flattened", "data")
    indices = _on_chip(_tile(indices, "gather_flattened", "indices"), "gather_flattened", "indices")
    if axis not in (0, -1, 1):
        fail("gather_flattened", f"axis={axis}: the gather runs within each partition over the flattened "
             "free dims")
    out = _tile(_allocate(indices.shape, data.dtype, sbuf, "", "gather_flattened"), "gather_flattened")
    _emit(out, lambda dst: _isa().nc_n_gather(dst=dst, data=data, indices=indices))
    dt = _dtypes.resolve(dtype) if dtype is not None else data.dtype
    return out if dt == data.dtype else copy(out, dt)
