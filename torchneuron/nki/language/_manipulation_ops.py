"""Manipulation and selection in ``nl``: ``broadcast_to`` (a partition broadcast is a
TensorE matmul against a ones row), ``expand_dims``, ``where`` and ``gather_flattened``."""

from __future__ import annotations

import builtins as _b
import math
from typing import Any

import numpy as np

from torchneuron.nki import context
from torchneuron.nki import dtypes as _dtypes
from torchneuron.nki.errors import fail
from torchneuron.nki.memory import Buffer
from torchneuron.nki.tensor import NkiTensor


# ================================================ manipulation and selection


def _legacy_integer_partition_broadcast(x: NkiTensor, out: NkiTensor) -> NkiTensor:
    """A legacy kernel's integer tile broadcast across partitions, bit-exact: one SBUF -> SBUF DMA
    whose source repeats partition 0 (a stride-0 descriptor), noted once per kernel line.

    TensorE (the float path) would round integers above 2^24; the legacy compiler legalised
    the broadcast itself (issue 17). Which instruction it used is not published: the DMA
    is torchneuron's choice (decision recorded in ``torchneuron/nki/isa/legalise.py``).
    """
    from torchneuron.nki.isa.legalise import note_legacy_legalisation

    src = x if x.buffer is Buffer.sbuf else copy(x)
    repeated = src._view(np.broadcast_to(src._data, out._data.shape), np.broadcast_to(src._mask, out._data.shape))
    _isa().dma_copy(dst=out, src=repeated)
    note_legacy_legalisation("broadcast_to", f"partition broadcast of {x.dtype.name} tile {x.name!r}: TensorE takes "
                             "float inputs; legacy NKI's compiler legalised it, so torchneuron issued a bit-exact "
                             "SBUF -> SBUF DMA that repeats partition 0. Current NKI refuses this")
    return out


def broadcast_to(x: Any, shape: Any, dtype: Any = None, **legacy: Any) -> NkiTensor:
    """``x`` broadcast to ``shape`` (same rank; each dim equal or from 1) as a new SBUF tile.

    Returns ``x`` itself when the shape already matches (and no dtype change).
    Free dims are copied from a stride-0 view (``tensor_copy``); a partition
    broadcast ``1 -> P`` is a TensorE matmul of a ones row against ``x``
    (in 512-column pieces) copied out of PSUM.
    """
    _reject_legacy_kwargs("broadcast_to", legacy)
    x = _on_chip(_tile(x, "broadcast_to"), "broadcast_to")
    shape = tuple(_int(s, "broadcast_to") for s in shape)
    dt = _dtypes.resolve(dtype) if dtype is not None else x.dtype
    if len(shape) != x.ndim:
        fail("broadcast_to", f"shape {list(shape)} must have the rank of x {list(x.shape)}")
    for have, want in zip(x.shape, shape):
        if have != want and have != 1:
            fail("broadcast_to", f"cannot broadcast {list(x.shape)} to {list(shape)}: a dim must match or be 1")
    if shape == x.shape and dt == x.dtype:
        return x
    if shape[0] != x.shape[0] and shape[1:] != x.shape[1:] and x.free_size != 1:
        return broadcast_to(broadcast_to(x, (shape[0],) + x.shape[1:]), shape, dt)  # partitions, then free
    out = _tile(_allocate(shape, dt, sbuf, "", "broadcast_to"), "broadcast_to")
    if shape[0] == x.shape[0]:
        src = _expand(x, shape, "broadcast_to")
        return _emit(out, lambda dst: _isa().tensor_copy(dst=dst, src=src), "copy")
    if not x.dtype.is_float:
        if not context.current().legacy:
            fail("broadcast_to", f"partition broadcast (1 -> {shape[0]}) runs on TensorE, which takes float "
                 f"inputs; {x.name!r} is {x.dtype.name}")
        return _legacy_integer_partition_broadcast(x, out)
    row = x if x.buffer is Buffer.sbuf else copy(x)
    row = row.reshape((1, row.free_size))
    ones_dt = float32 if row.dtype.name in ("float32", "tfloat32") else bfloat16
    lhs = ones((1, shape[0]), ones_dt, name="broadcast_to.ones")
    flat_out = out.reshape((shape[0], math.prod(shape[1:])))
    width, free = flat_out.shape[1], x.free_size
    isa = _isa()
    if free == 1:  # one value per partition after the matmul; the copy broadcasts it along the row
        part = _tile(_allocate((shape[0], 1), float32, psum, "", "broadcast_to"), "broadcast_to")
        isa.nc_matmul(dst=part, stationary=lhs, moving=row, accumulate=False)
        isa.tensor_copy(dst=flat_out, src=part.broadcast(1, width) if width > 1 else part)
        return out
    for start in range(0, width, 512):
        cols = _b.min(512, width - start)
        part = _tile(_allocate((shape[0], cols), float32, psum, "", "broadcast_to"), "broadcast_to")
        isa.nc_matmul(dst=part, stationary=lhs, moving=row[:, start:start + cols], accumulate=False)
        isa.tensor_copy(dst=flat_out[:, start:start + cols], src=part)
    return out


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


# The nl modules use each other's names at call time: imported after the definitions (import cycles).
from torchneuron.nki.language._dtype_buffer_ops import _D, bfloat16, float32, psum, sbuf  # noqa: E402
from torchneuron.nki.language._base_ops import _int, _is_scalar, _isa, _on_chip, _tile  # noqa: E402
from torchneuron.nki.language._creation_ops import (  # noqa: E402
    _allocate, _fill_value, _reject_legacy_kwargs, full, ones,
)
from torchneuron.nki.language._issue_ops import _emit, _issue  # noqa: E402
from torchneuron.nki.language._movement_ops import _mask_shape, _masked, copy  # noqa: E402
from torchneuron.nki.language._elementwise_ops import _broadcast_shape, _expand, _result_dtype  # noqa: E402
