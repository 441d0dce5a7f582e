"""Data movement and matmul in ``nl``: ``load``/``store``/``load_transpose2d`` (``dma_copy``),
``copy``/``static_cast`` (``tensor_copy``), ``matmul`` (``nc_matmul``) and ``transpose``
(``nc_transpose``)."""

from __future__ import annotations

from typing import Any

import numpy as np

from torchneuron.nki import dtypes as _dtypes
from torchneuron.nki.errors import fail
from torchneuron.nki.indirect import IndirectRows
from torchneuron.nki.language.core import (
    as_tile, elementwise_min, emit, is_scalar, issue_call, mask_shape, masked_view, nisa, require_on_chip,
)
from torchneuron.nki.legacy_masks import mapped_mask_counts
from torchneuron.nki.language.memory import allocate_tensor, fill_tensor, float32, psum, reject_legacy_kwargs, sbuf
from torchneuron.nki.memory import Buffer
from torchneuron.nki.tensor import NkiTensor


# ================================================================= data movement


def load(src: NkiTensor, dtype: Any = None, *, mask: Any = None, **legacy: Any) -> NkiTensor:
    """Copy HBM ``src`` into a new SBUF tile of ``src.shape`` (dim 0 becomes the partitions).

    A legacy ``mask=`` loads only the region it keeps (the rest of the tile stays
    uninitialised); a legacy index running past the edge of ``src``
    (``a[i * 128 + i_p, i_f]``) must be kept inside by the mask, else the DMA fails.
    """
    reject_legacy_kwargs("load", legacy)
    if isinstance(src, IndirectRows):  # legacy a[idx_tile, cols]: a gather (torchneuron.nki.indirect)
        return _indirect_load(src, dtype, mask)
    src = as_tile(src, "load", "src")
    if src.on_chip:
        fail("load", f"src {src.name!r} is already on chip ({src.buffer.value}); nl.load reads HBM - "
             "use nl.copy for an on-chip copy")
    dt = _dtypes.resolve(dtype) if dtype is not None else src.dtype
    out = as_tile(allocate_tensor(src.shape, dt, sbuf, "", "load"), "load")
    valid = mask_shape(mask, src.shape, "load")
    src_part = masked_view(src, valid)

    def issue(dst: NkiTensor) -> None:
        nisa().dma_copy(dst=masked_view(dst, valid), src=src_part)

    return emit(out, issue, "load", region=valid)


def store(dst: NkiTensor, value: NkiTensor, *, mask: Any = None, **legacy: Any) -> None:
    """Copy an SBUF tile into HBM ``dst`` (legacy: a PSUM value is first copied to SBUF)."""
    reject_legacy_kwargs("store", legacy)
    if isinstance(dst, IndirectRows):  # legacy a[idx_tile, cols] = value: a scatter
        if mask is not None:
            fail("store", "a legacy mask= on a store through an index tile is not simulated; slice the index tile")
        _indirect_store(dst, as_tile(value, "store", "value"))
        return
    dst = as_tile(dst, "store", "dst")
    if is_scalar(value) and mask is None:  # legacy nl.store(dst, 0.0): fill HBM from a memset tile
        if dst.on_chip:
            fail("store", f"dst {dst.name!r} is in {dst.buffer.value}; nl.store writes HBM")
        fill_tensor(dst, value, "store")
        return
    value = as_tile(value, "store", "value")
    if dst.on_chip:
        fail("store", f"dst {dst.name!r} is in {dst.buffer.value}; nl.store writes HBM - use "
             "dst[...] = value or nisa.tensor_copy for on-chip copies")
    valid = mask_shape(mask, dst.shape, "store")
    if dst.is_partial or valid != dst.shape:
        if value.ndim != dst.ndim:
            fail("store", f"a masked/clipped store needs value and dst of the same rank, got "
                 f"{list(value.shape)} and {list(dst.shape)}")
        valid = elementwise_min(valid, value.shape)
        dst, value = masked_view(dst, valid), masked_view(value, valid)
    copy_to_hbm(dst, value, "store")


def _indirect_load(rows: IndirectRows, dtype: Any, mask: Any) -> NkiTensor:
    """A gather; a legacy partition mask (``i_p < n``) gathers the first ``n`` rows only."""
    dt = _dtypes.resolve(dtype) if dtype is not None else rows.base.dtype
    out = as_tile(allocate_tensor(rows.shape, dt, sbuf, "", "load"), "load")
    valid = mask_shape(mask, rows.shape, "load")
    if tuple(valid[1:]) != tuple(rows.shape[1:]):
        fail("load", "a legacy mask= on free dims of a load through an index tile is not simulated; mask only the "
             "partitions (i_p < n)")
    kept = rows.first(valid[0]) if valid[0] != rows.shape[0] else rows
    from torchneuron.nki.isa.dma_ops import dma_indirect_rows  # nki.isa loads on first use (see core.nisa)

    def issue(dst: NkiTensor) -> None:
        if valid[0]:
            dma_indirect_rows(masked_view(dst, valid), kept)

    return emit(out, issue, "load", region=valid)


def _indirect_store(rows: IndirectRows, value: NkiTensor) -> None:
    if value.buffer is Buffer.psum:  # as copy_to_hbm: DMA cannot read PSUM, legacy implicit copy
        staged = as_tile(allocate_tensor(value.shape, value.dtype, sbuf, "", "store"), "store")
        nisa().tensor_copy(dst=staged, src=value)
        value = staged
    from torchneuron.nki.isa.dma_ops import dma_indirect_rows  # nki.isa loads on first use (see core.nisa)

    dma_indirect_rows(rows, value)


def copy_to_hbm(dst: NkiTensor, value: NkiTensor, op: str) -> None:
    if value.size != dst.size:
        fail(op, f"value {value.name!r} has {value.size} elements (shape {list(value.shape)}) but dst "
             f"{dst.name!r} has {dst.size} (shape {list(dst.shape)}); DMA element counts must match")
    if value.buffer is Buffer.psum:  # DMA cannot read PSUM (0.3.0): legacy implicit copy
        staged = as_tile(allocate_tensor(value.shape, value.dtype, sbuf, "", op), op)
        nisa().tensor_copy(dst=staged, src=value)
        value = staged
    nisa().dma_copy(dst=dst, src=value)


def load_transpose2d(src: NkiTensor, dtype: Any = None, *, mask: Any = None, **legacy: Any) -> NkiTensor:
    """Load 2-D HBM ``src`` ``[A, B]`` as an SBUF tile ``[B, A]`` (a slow transposing DMA).

    Recorded as a ``dma_copy`` of the transposed HBM view with
    ``attrs["transpose"] = True`` (the cost model charges it element-wise).
    """
    reject_legacy_kwargs("load_transpose2d", legacy)
    src = as_tile(src, "load_transpose2d", "src")
    if src.on_chip or src.ndim != 2:
        fail("load_transpose2d", f"src must be a 2-D HBM tensor, got {src.buffer.value} shape {list(src.shape)}")
    valid = src.shape
    if mask is not None and mask is not True:  # matched to src's axes by variable (legacy_masks module)
        counts = mapped_mask_counts("load_transpose2d", mask, {"A": src.shape[0], "B": src.shape[1]},
                                    (("src", src, ("A", "B")),))
        valid = (counts["A"], counts["B"])
    dt = _dtypes.resolve(dtype) if dtype is not None else src.dtype
    out = as_tile(allocate_tensor((src.shape[1], src.shape[0]), dt, sbuf, "", "load_transpose2d"), "load_transpose2d")
    src_part = masked_view(src, valid)
    src_part.check_in_bounds("load_transpose2d", "src")
    src_t = src_part.permute((1, 0))

    def issue(dst: NkiTensor) -> None:
        issue_call(lambda: nisa().dma_copy(dst=masked_view(dst, (valid[1], valid[0])), src=src_t),
                   tag={"transpose": True})

    return emit(out, issue, "load_transpose2d", region=(valid[1], valid[0]))


def copy(x: NkiTensor, dtype: Any = None, *, mask: Any = None, **legacy: Any) -> NkiTensor:
    """A new SBUF copy of an SBUF or PSUM tile (``tensor_copy``), e.g. a matmul result out of PSUM."""
    reject_legacy_kwargs("copy", legacy)
    x = require_on_chip(as_tile(x, "copy"), "copy")
    dt = _dtypes.resolve(dtype) if dtype is not None else x.dtype
    out = as_tile(allocate_tensor(x.shape, dt, sbuf, "", "copy"), "copy")
    valid = mask_shape(mask, x.shape, "copy")
    src = masked_view(x, valid)
    return emit(out, lambda dst: nisa().tensor_copy(dst=masked_view(dst, valid), src=src), "copy")


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
    reject_legacy_kwargs("matmul", legacy)
    x = require_on_chip(as_tile(x, "matmul"), "matmul")
    y = require_on_chip(as_tile(y, "matmul", "y"), "matmul", "y")
    valid = None
    if mask is not None and mask is not True:
        x, y, valid = _masked_matmul_operands(x, y, transpose_x, mask)
    if transpose_x:
        stationary = x
    else:
        if x.ndim != 2:
            fail("matmul", f"x must be a 2-D tile [M, K] when transpose_x=False, got {list(x.shape)}")
        xt_psum = as_tile(allocate_tensor((x.shape[1], x.shape[0]), x.dtype, psum, "", "matmul.transpose"), "matmul")
        nisa().nc_transpose(dst=xt_psum, data=x)
        stationary = as_tile(allocate_tensor(xt_psum.shape, x.dtype, sbuf, "", "matmul.transpose"), "matmul")
        nisa().tensor_copy(dst=stationary, src=xt_psum)
        del xt_psum
    shape = valid[1] if valid is not None else (stationary.free_size,) + tuple(y.shape[1:])
    valid = valid[0] if valid is not None else shape
    out = as_tile(allocate_tensor(shape, float32, psum, "", "matmul"), "matmul")
    if 0 in valid:
        return out  # the mask keeps nothing: no instruction runs

    def issue(dst: NkiTensor, accumulate: bool = False) -> None:
        nisa().nc_matmul(dst=masked_view(dst, valid), stationary=stationary, moving=y, accumulate=accumulate)

    return emit(out, issue, "matmul", region=valid)


def _masked_matmul_operands(x: NkiTensor, y: NkiTensor, transpose_x: bool, mask: Any
                            ) -> tuple[NkiTensor, NkiTensor, tuple[tuple[int, int], tuple[int, int]]]:
    """A legacy ``mask=`` on ``nl.matmul`` matched to its axes by variable (x is ``[K, M]`` with
    ``transpose_x=True``, else ``[M, K]``; y is ``[K, N]``): the operands cut to what it keeps,
    and (kept ``[M, N]`` extent, full ``[M, N]`` shape)."""
    if x.ndim != 2 or y.ndim != 2:
        fail("matmul", "a masked matmul needs 2-D operands")
    x_axes = ("K", "M") if transpose_x else ("M", "K")
    m_size = x.shape[1] if transpose_x else x.shape[0]
    counts = mapped_mask_counts("matmul", mask, {"K": y.shape[0], "M": m_size, "N": y.shape[1]},
                                (("x", x, x_axes), ("y", y, ("K", "N"))))
    k, m, n = counts["K"], counts["M"], counts["N"]
    shape = (m_size, y.shape[1])
    if 0 in (k, m, n):
        return x, y, ((0, 0), shape)
    x = x[0:k, 0:m] if transpose_x else x[0:m, 0:k]
    return x, y[0:k, 0:n], ((m, n), shape)


def transpose(x: NkiTensor, dtype: Any = None, *, mask: Any = None, **legacy: Any) -> NkiTensor:
    """Swap the partition and free dims of a 2-D tile into a new PSUM tile (``nc_transpose``).

    A legacy ``mask=`` is matched to the axes by variable (``nl.transpose(t[i, j], mask=(i < n))``
    keeps ``n`` input partitions, the result's first ``n`` columns): legacy_masks module.
    """
    reject_legacy_kwargs("transpose", legacy)
    x = require_on_chip(as_tile(x, "transpose"), "transpose")
    src = x if x.ndim == 2 else x.reshape((x.shape[0], x.free_size))
    full = (src.shape[1], src.shape[0])
    region = full
    if mask is not None and mask is not True:
        if x.ndim != 2:
            fail("transpose", "a legacy mask on nl.transpose is simulated for 2-D tiles only")
        counts = mapped_mask_counts("transpose", mask, {"P": src.shape[0], "F": src.shape[1]},
                                    (("x", x, ("P", "F")),))
        region = (counts["F"], counts["P"])
        src = src[0:counts["P"], 0:counts["F"]]
    out = as_tile(allocate_tensor(full, x.dtype, psum, "", "transpose"), "transpose")
    if 0 not in region:
        emit(out, lambda dst: nisa().nc_transpose(dst=masked_view(dst, region), data=src), "transpose",
             region=region)
    dt = _dtypes.resolve(dtype) if dtype is not None else x.dtype
    if dt == x.dtype:
        return out
    cast = as_tile(allocate_tensor(out.shape, dt, psum, "", "transpose"), "transpose")
    if 0 in region:
        return cast
    return emit(cast, lambda dst: nisa().tensor_copy(dst=masked_view(dst, region), src=masked_view(out, region)),
                "copy", region=region)
