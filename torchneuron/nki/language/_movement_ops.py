"""Data movement and matmul in ``nl``: ``load``/``store``/``load_transpose2d`` (``dma_copy``),
``copy``/``static_cast`` (``tensor_copy``), ``matmul`` (``nc_matmul``) and ``transpose``
(``nc_transpose``), plus the legacy-mask helpers they share with the compute ops."""

from __future__ import annotations

import builtins as _b
from typing import Any

import numpy as np

from torchneuron.nki import dtypes as _dtypes
from torchneuron.nki.errors import fail
from torchneuron.nki.indexing import MaskExpr
from torchneuron.nki.indirect import IndirectRows
from torchneuron.nki.memory import Buffer
from torchneuron.nki.tensor import NkiTensor
from torchneuron.nki.language._dtype_buffer_ops import float32, psum, sbuf
from torchneuron.nki.language._base_ops import _is_scalar, _isa, _on_chip, _region, _tile
from torchneuron.nki.language._creation_ops import _allocate, _fill, _reject_legacy_kwargs
from torchneuron.nki.language._issue_ops import _emit, _issue


# ================================================================= data movement


def _valid(t: NkiTensor) -> tuple[int, ...]:
    return tuple(t.valid_shape)


def _mask_shape(mask: Any, shape: tuple[int, ...], op: str) -> tuple[int, ...]:
    """The valid (leading) extent per dim of a legacy ``mask=`` over a tile of ``shape`` (decision 6)."""
    if mask is None:
        return shape
    if isinstance(mask, (bool, np.bool_)):
        return shape if mask else tuple(0 for _ in shape)
    if not isinstance(mask, MaskExpr):
        raise TypeError(f"nl.{op}: mask must be a comparison of nl.arange/nl.mgrid indices, e.g. "
                        f"mask=(i * 128 + i_p < n); got {mask!r}")
    valid = list(shape)
    for term in mask.terms:
        expr = term[0]
        dim = expr.position
        if not 0 <= dim < len(shape):
            fail(op, f"mask bounds index position {dim}, but the tile has {len(shape)} dims")
        try:
            count = expr.valid_count(MaskExpr((term,)))
        except IndexError as exc:
            fail(op, f"{exc}")
        valid[dim] = _b.min(valid[dim], count)
    return tuple(valid)


def _masked(t: NkiTensor, valid: tuple[int, ...]) -> NkiTensor:
    return t if tuple(valid) == tuple(t.shape) else t[_region(valid)]


def _elementwise_min(*shapes: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(_b.min(dims) for dims in zip(*shapes))


def load(src: NkiTensor, dtype: Any = None, *, mask: Any = None, **legacy: Any) -> NkiTensor:
    """Copy HBM ``src`` into a new SBUF tile of ``src.shape`` (dim 0 becomes the partitions).

    A legacy ``mask=`` loads only the region it keeps (the rest of the tile stays
    uninitialised); a legacy index running past the edge of ``src``
    (``a[i * 128 + i_p, i_f]``) must be kept inside by the mask, else the DMA fails.
    """
    _reject_legacy_kwargs("load", legacy)
    if isinstance(src, IndirectRows):  # legacy a[idx_tile, cols]: a gather (torchneuron.nki.indirect)
        return _indirect_load(src, dtype, mask)
    src = _tile(src, "load", "src")
    if src.on_chip:
        fail("load", f"src {src.name!r} is already on chip ({src.buffer.value}); nl.load reads HBM - "
             "use nl.copy for an on-chip copy")
    dt = _dtypes.resolve(dtype) if dtype is not None else src.dtype
    out = _tile(_allocate(src.shape, dt, sbuf, "", "load"), "load")
    valid = _mask_shape(mask, src.shape, "load")
    src_part = _masked(src, valid)

    def issue(dst: NkiTensor) -> None:
        _isa().dma_copy(dst=_masked(dst, valid), src=src_part)

    return _emit(out, issue, "load", region=valid)


def store(dst: NkiTensor, value: NkiTensor, *, mask: Any = None, **legacy: Any) -> None:
    """Copy an SBUF tile into HBM ``dst`` (legacy: a PSUM value is first copied to SBUF)."""
    _reject_legacy_kwargs("store", legacy)
    if isinstance(dst, IndirectRows):  # legacy a[idx_tile, cols] = value: a scatter
        if mask is not None:
            fail("store", "a legacy mask= on a store through an index tile is not simulated; slice the index tile")
        _indirect_store(dst, _tile(value, "store", "value"))
        return
    dst = _tile(dst, "store", "dst")
    if _is_scalar(value) and mask is None:  # legacy nl.store(dst, 0.0): fill HBM from a memset tile
        if dst.on_chip:
            fail("store", f"dst {dst.name!r} is in {dst.buffer.value}; nl.store writes HBM")
        _fill(dst, value, "store")
        return
    value = _tile(value, "store", "value")
    if dst.on_chip:
        fail("store", f"dst {dst.name!r} is in {dst.buffer.value}; nl.store writes HBM - use "
             "dst[...] = value or nisa.tensor_copy for on-chip copies")
    valid = _mask_shape(mask, dst.shape, "store")
    if dst.is_partial or valid != dst.shape:
        if value.ndim != dst.ndim:
            fail("store", f"a masked/clipped store needs value and dst of the same rank, got "
                 f"{list(value.shape)} and {list(dst.shape)}")
        valid = _elementwise_min(valid, value.shape)
        dst, value = _masked(dst, valid), _masked(value, valid)
    _copy_to_hbm(dst, value, "store")


def _indirect_load(rows: IndirectRows, dtype: Any, mask: Any) -> NkiTensor:
    """A gather; a legacy partition mask (``i_p < n``) gathers the first ``n`` rows only."""
    dt = _dtypes.resolve(dtype) if dtype is not None else rows.base.dtype
    out = _tile(_allocate(rows.shape, dt, sbuf, "", "load"), "load")
    valid = _mask_shape(mask, rows.shape, "load")
    if tuple(valid[1:]) != tuple(rows.shape[1:]):
        fail("load", "a legacy mask= on free dims of a load through an index tile is not simulated; mask only the "
             "partitions (i_p < n)")
    kept = rows.first(valid[0]) if valid[0] != rows.shape[0] else rows
    from torchneuron.nki.isa.dma_ops import dma_indirect_rows  # isa imports the language (cycle)

    def issue(dst: NkiTensor) -> None:
        if valid[0]:
            dma_indirect_rows(_masked(dst, valid), kept)

    return _emit(out, issue, "load", region=valid)


def _indirect_store(rows: IndirectRows, value: NkiTensor) -> None:
    if value.buffer is Buffer.psum:  # as _copy_to_hbm: DMA cannot read PSUM, legacy implicit copy
        staged = _tile(_allocate(value.shape, value.dtype, sbuf, "", "store"), "store")
        _isa().tensor_copy(dst=staged, src=value)
        value = staged
    from torchneuron.nki.isa.dma_ops import dma_indirect_rows  # isa imports the language (cycle)

    dma_indirect_rows(rows, value)


def _copy_to_hbm(dst: NkiTensor, value: NkiTensor, op: str) -> None:
    if value.size != dst.size:
        fail(op, f"value {value.name!r} has {value.size} elements (shape {list(value.shape)}) but dst "
             f"{dst.name!r} has {dst.size} (shape {list(dst.shape)}); DMA element counts must match")
    if value.buffer is Buffer.psum:  # DMA cannot read PSUM (0.3.0): legacy implicit copy
        staged = _tile(_allocate(value.shape, value.dtype, sbuf, "", op), op)
        _isa().tensor_copy(dst=staged, src=value)
        value = staged
    _isa().dma_copy(dst=dst, src=value)


def load_transpose2d(src: NkiTensor, dtype: Any = None, *, mask: Any = None, **legacy: Any) -> NkiTensor:
    """Load 2-D HBM ``src`` ``[A, B]`` as an SBUF tile ``[B, A]`` (a slow transposing DMA).

    Recorded as a ``dma_copy`` of the transposed HBM view with
    ``attrs["transpose"] = True`` (the cost model charges it element-wise).
    """
    _reject_legacy_kwargs("load_transpose2d", legacy)
    src = _tile(src, "load_transpose2d", "src")
    if src.on_chip or src.ndim != 2:
        fail("load_transpose2d", f"src must be a 2-D HBM tensor, got {src.buffer.value} shape {list(src.shape)}")
    valid = _mask_shape(mask, src.shape, "load_transpose2d")
    dt = _dtypes.resolve(dtype) if dtype is not None else src.dtype
    out = _tile(_allocate((src.shape[1], src.shape[0]), dt, sbuf, "", "load_transpose2d"), "load_transpose2d")
    src_part = _masked(src, valid)
    src_part.check_in_bounds("load_transpose2d", "src")
    src_t = src_part.permute((1, 0))

    def issue(dst: NkiTensor) -> None:
        _issue(lambda: _isa().dma_copy(dst=_masked(dst, (valid[1], valid[0])), src=src_t),
               tag={"transpose": True})

    return _emit(out, issue, "load_transpose2d", region=(valid[1], valid[0]))


def copy(x: NkiTensor, dtype: Any = None, *, mask: Any = None, **legacy: Any) -> NkiTensor:
    """A new SBUF copy of an SBUF or PSUM tile (``tensor_copy``), e.g. a matmul result out of PSUM."""
    _reject_legacy_kwargs("copy", legacy)
    x = _on_chip(_tile(x, "copy"), "copy")
    dt = _dtypes.resolve(dtype) if dtype is not None else x.dtype
    out = _tile(_allocate(x.shape, dt, sbuf, "", "copy"), "copy")
    valid = _mask_shape(mask, x.shape, "copy")
    src = _masked(x, valid)
    return _emit(out, lambda dst: _isa().tensor_copy(dst=_masked(dst, valid), src=src), "copy")


def static_cast(x: Any, dtype: Any) -> Any:
    """Legacy ``nl.static_cast``: a copy converted to ``dtype`` (of a NumPy array too, on the host,
    as AWS's test code prepares inputs: ``q = nl.static_cast(q, nl.bfloat16)``)."""
    if isinstance(x, np.ndarray):
        return _dtypes.to_storage(x, _dtypes.resolve(dtype))
    return copy(x, dtype)


# ====================================================================== matmul


def matmul(x: NkiTensor, y: NkiTensor, transpose_x: bool = False, *, mask: Any = None,
           **legacy: Any) -> NkiTensor:
    """``x @ y`` (``x.T @ y`` with ``transpose_x=True``) into a new fp32 PSUM tile (nki-api-facts.md: 3.2).

    TensorE contracts over the partition dim, so with ``transpose_x=False`` ``x``
    ``[M, K]`` is first transposed (``nc_transpose`` into PSUM, ``tensor_copy`` back
    to SBUF) as the docs describe; ``transpose_x=True`` takes ``x`` as ``[K, M]``.
    """
    _reject_legacy_kwargs("matmul", legacy)
    x = _on_chip(_tile(x, "matmul"), "matmul")
    y = _on_chip(_tile(y, "matmul", "y"), "matmul", "y")
    if transpose_x:
        stationary = x
    else:
        if x.ndim != 2:
            fail("matmul", f"x must be a 2-D tile [M, K] when transpose_x=False, got {list(x.shape)}")
        xt_psum = _tile(_allocate((x.shape[1], x.shape[0]), x.dtype, psum, "", "matmul.transpose"), "matmul")
        _isa().nc_transpose(dst=xt_psum, data=x)
        stationary = _tile(_allocate(xt_psum.shape, x.dtype, sbuf, "", "matmul.transpose"), "matmul")
        _isa().tensor_copy(dst=stationary, src=xt_psum)
        del xt_psum
    shape = (stationary.free_size,) + tuple(y.shape[1:])
    valid = _mask_shape(mask, shape, "matmul")
    if valid != shape:
        if len(valid) != 2 or y.ndim != 2 or stationary.ndim != 2:
            fail("matmul", "a masked matmul needs 2-D operands")
        stationary, y = stationary[:, 0:valid[0]], y[:, 0:valid[1]]
    out = _tile(_allocate(shape, float32, psum, "", "matmul"), "matmul")

    def issue(dst: NkiTensor, accumulate: bool = False) -> None:
        _isa().nc_matmul(dst=_masked(dst, valid), stationary=stationary, moving=y, accumulate=accumulate)

    return _emit(out, issue, "matmul")


def transpose(x: NkiTensor, dtype: Any = None, *, mask: Any = None, **legacy: Any) -> NkiTensor:
    """Swap the partition and free dims of a 2-D tile into a new PSUM tile (``nc_transpose``)."""
    _reject_legacy_kwargs("transpose", legacy)
    if mask is not None:
        raise TypeError("nl.transpose: mask= is not supported; slice the input instead")
    x = _on_chip(_tile(x, "transpose"), "transpose")
    src = x if x.ndim == 2 else x.reshape((x.shape[0], x.free_size))
    out = _tile(_allocate((src.shape[1], src.shape[0]), x.dtype, psum, "", "transpose"), "transpose")
    _emit(out, lambda dst: _isa().nc_transpose(dst=dst, data=src), "transpose")
    dt = _dtypes.resolve(dtype) if dtype is not None else x.dtype
    if dt == x.dtype:
        return out
    cast = _tile(_allocate(out.shape, dt, psum, "", "transpose"), "transpose")
    return _emit(cast, lambda dst: _isa().tensor_copy(dst=dst, src=out), "copy")
