"""DMA instructions: ``dma_copy``, ``dma_transpose`` and ``dma_compute``, with the DMA
buffer and priority checks.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

from torchneuron.nki.cost import formulas as F
from torchneuron.nki.errors import fail
from torchneuron.nki.indirect import IndirectRows
from torchneuron.nki.instruction import Engine
from torchneuron.nki.isa.core import (
    NkiInstruction, as_enum, as_tensor, buffer_rule, instruction, masked_operands, new_tile, record,
    run_and_version, store_values,
)
from torchneuron.nki.isa.enums import DgeMode, EngineKind, OobMode, dge_mode, engine, oob_mode
from torchneuron.nki.isa.vector_ops import cast_legacy_result
from torchneuron.nki.memory import Buffer
from torchneuron.nki.ops import nki_op_name
from torchneuron.nki.tensor import NkiTensor


# ============================================================================ DMA
def _dma_buffers(instr: str, dst: NkiTensor, src: NkiTensor) -> None:
    if src._alloc.buffer is Buffer.psum:
        fail(instr, f"src {src.name!r} is in PSUM; since NKI 0.3.0 DMA cannot read PSUM: copy it to SBUF with "
             "nisa.tensor_copy first")
    if dst._alloc.buffer is Buffer.psum:
        fail(instr, f"dst {dst.name!r} is in PSUM; DMA moves data HBM<->SBUF, HBM->HBM or SBUF->SBUF: write PSUM "
             "with a compute engine (nisa.tensor_copy)")


def _priority(instr: str, priority: Any, version: int, mode: dge_mode) -> int | None:
    if priority is None:
        return None
    if version < 4:
        fail(instr, f"priority needs NeuronCore-v4 (trn3); target is NeuronCore-v{version}")
    if isinstance(priority, bool) or not isinstance(priority, (int, np.integer)) or not 0 <= int(priority) <= 3:
        fail(instr, f"priority must be an int 0-3 (lower is higher priority), got {priority!r}")
    if mode is DgeMode.none:
        fail(instr, "priority is not supported with dge_mode=none")
    return int(priority)


def dma_copy(dst: NkiTensor, src: NkiTensor, priority: int | None = None, oob_mode: oob_mode = oob_mode.error,
             dge_mode: dge_mode = dge_mode.unknown, engine: engine = engine.unknown,
             name: str | None = None) -> NkiInstruction:
    """Copy ``src`` to ``dst`` with the DMA engines; a dtype change casts through fp32 (facts 4.5, decision 8)."""
    instr = "dma_copy"
    run, version = run_and_version()
    dst = as_tensor(instr, "dst", dst)
    src = as_tensor(instr, "src", src)
    mode = as_enum(instr, "dge_mode", dge_mode, DgeMode)
    oob = as_enum(instr, "oob_mode", oob_mode, OobMode)
    trigger = as_enum(instr, "engine", engine, EngineKind)
    _dma_buffers(instr, dst, src)
    if mode is DgeMode.hwdge and version < 3:
        fail(instr, f"dge_mode=hwdge needs NeuronCore-v3 or newer; target {run.target.name} is NeuronCore-v2")
    if trigger not in (EngineKind.unknown, EngineKind.sync, EngineKind.scalar):
        fail(instr, f"engine={trigger.name} is not a DMA trigger; hwdge DMAs are triggered by nisa.engine.sync or "
             "nisa.engine.scalar")
    if trigger is not EngineKind.unknown and mode is not DgeMode.hwdge:
        fail(instr, f"engine={trigger.name} is valid only with dge_mode=nisa.dge_mode.hwdge")
    same = src.dtype.name == dst.dtype.name
    if mode is DgeMode.hwdge and not same:
        fail(instr, f"with dge_mode=hwdge the DMA moves raw bytes: src dtype {src.dtype.name} and dst dtype "
             f"{dst.dtype.name} must match; reinterpret with .view() or cast with dge_mode=swdge/none")
    prio = _priority(instr, priority, version, mode)
    if src._indirect is not None or dst._indirect is not None:
        return _indirect_copy(run, version, dst, src, mode, oob, trigger, prio, same, name)
    target = dst
    src.check_in_bounds(instr, "src")
    dst.check_in_bounds(instr, "dst")
    if src.size != dst.size:
        fail(instr, f"src has {src.size} elements (shape {list(src.shape)}) and dst {dst.size} (shape "
             f"{list(dst.shape)}); DMA element counts must match")
    values = src.read(instr)
    if not run.compute_values:  # shape-only run: mark written, move no bytes
        target._mask[...] = np.iinfo(target._mask.dtype).max
    else:
        if not same:
            values = values.astype(np.float32)
        shape = target._data.shape
        if values.shape != shape:
            values = values.reshape(shape)
        target.write(values)
    return record(run, instr, Engine.DMA, [src], [target], name=name, dge_mode=mode.name, oob_mode=oob.name,
                  engine_requested=trigger.name, priority=prio, cast=not same)


# ============================================================================ indirect access patterns
def _indirect_mode(instr: str, version: int, mode: DgeMode, views: Sequence[NkiTensor]) -> DgeMode:
    """The DGE mode of a DMA through indirect views (NKI DGE guide): a vector_offset needs software DGE
    (``unknown`` becomes ``swdge``), which gathers and scatters from NeuronCore-v3 on."""
    if not any(v._indirect is not None and v._indirect.kind == "vector" for v in views):
        return mode
    if mode not in (DgeMode.unknown, DgeMode.swdge):
        fail(instr, f"a vector_offset (gather/scatter) access needs dge_mode=swdge or unknown: only software DGE "
             f"(GpSimd) generates indirect descriptors; dge_mode={mode.name} cannot")
    if version < 3:
        fail(instr, f"indirect (vector_offset) DMA needs NeuronCore-v3 or newer (NKI DGE guide); target is "
             f"NeuronCore-v{version}")
    return DgeMode.swdge


def _resolve(instr: str, t: NkiTensor, skip: bool) -> Any:
    return t.resolve(instr, skip) if t._indirect is not None else None


def _rows_kept(instr: str, resolved: Sequence[Any], rows: int) -> np.ndarray | None:
    """Rows (dim 0) every indirect side keeps (None: all); a skipped row must be a row of each side."""
    keep = None
    for r in resolved:
        if r is None or r.all_valid:
            continue
        if not r.valid.any():
            return np.zeros(rows, dtype=bool)  # the whole transfer is skipped (a scalar_offset out of bounds)
        if r.valid.shape[0] != rows:
            fail(instr, f"an out-of-bounds index skips a row of {r.valid.shape[0]} but the other side has {rows} "
                 "rows; with oob_mode=skip both sides need the same partition count")
        keep = r.valid if keep is None else keep & r.valid
    return keep


def _side_values(instr: str, t: NkiTensor, resolved: Any) -> np.ndarray:
    return t.read_indirect(resolved, instr) if resolved is not None else t.read(instr)


def _store(instr: str, t: NkiTensor, resolved: Any, values: np.ndarray, keep: np.ndarray | None) -> None:
    """Write ``values`` to ``t`` (scattering through an indirect view), only the kept rows."""
    shape = resolved.flat.shape if resolved is not None else t._data.shape
    values = values.reshape(shape)
    where = None
    if keep is not None:
        where = np.broadcast_to(keep.reshape((-1,) + (1,) * (len(shape) - 1)), shape)
    if resolved is not None:
        t.write_indirect(resolved, values, where)
    elif where is None:
        t.write(values)
    else:
        t.write(values, where=where)


def _descriptor_attrs(views: Sequence[NkiTensor], keep: np.ndarray | None) -> dict[str, Any]:
    """What the indirect side's descriptors are: one per contiguous run of each kept row (cost model)."""
    pattern = next(v._indirect for v in views if v._indirect is not None)
    run_elems = pattern.contiguous_run()
    rows = pattern.counts[0] if pattern.kind == "vector" and pattern.counts else 1
    kept = rows if keep is None else int(np.count_nonzero(keep))
    per_row = max(pattern.row_elements() // run_elems, 1) if pattern.kind == "vector" else \
        max(math.prod(pattern.counts) // run_elems, 1)
    return {"indirect": pattern.kind, "descriptors": kept * per_row,
            "descriptor_bytes": run_elems * pattern.dtype.itemsize}


def _sources(views: Sequence[NkiTensor]) -> list[NkiTensor]:
    """The SBUF index tiles the indirect views read (recorded as reads: the DMA depends on them)."""
    return [v._indirect.source for v in views
            if v._indirect is not None and isinstance(v._indirect.source, NkiTensor)]


def _indirect_copy(run: Any, version: int, dst: NkiTensor, src: NkiTensor, mode: DgeMode, oob: OobMode,
                   trigger: EngineKind, prio: int | None, same: bool, name: str | None) -> NkiInstruction:
    """``dma_copy`` through ``.ap(scalar_offset=/vector_offset=)`` views: a gather, a scatter or a copy at a
    runtime offset, each index bounds-checked now (torchneuron/nki/dynamic_ap.py)."""
    instr = "dma_copy"
    mode = _indirect_mode(instr, version, mode, (dst, src))
    skip = oob is OobMode.skip
    rs, rd = _resolve(instr, src, skip), _resolve(instr, dst, skip)
    if src.size != dst.size:
        fail(instr, f"src has {src.size} elements (shape {list(src.shape)}) and dst {dst.size} (shape "
             f"{list(dst.shape)}); DMA element counts must match")
    keep = _rows_kept(instr, (rs, rd), dst.shape[0] if dst.ndim else 1)
    if run.compute_values and (keep is None or keep.any()):
        values = _side_values(instr, src, rs)
        if not same:
            values = values.astype(np.float32)
        _store(instr, dst, rd, values, keep)
    elif not run.compute_values:  # shape-only run: mark written, move no bytes
        if rd is None:
            dst._mask[...] = np.iinfo(dst._mask.dtype).max
        else:
            dst._indirect.mask[rd.flat[rd.valid]] = np.iinfo(dst._indirect.mask.dtype).max
    attrs = _descriptor_attrs((src, dst), keep)
    index = _sources((src, dst))
    return record(run, instr, Engine.DMA, [*index, src], [dst], name=name, index_reads=len(index), dge_mode=mode.name,
                  oob_mode=oob.name, engine_requested=trigger.name, priority=prio, cast=not same, **attrs)


def dma_indirect_rows(dst: Any, src: Any, name: str | None = None) -> NkiInstruction:
    """One indirect DMA between SBUF and HBM rows picked by an index tile (legacy ``a[idx_tile, cols]``,
    :mod:`torchneuron.nki.indirect`): a gather when ``src`` is the :class:`IndirectRows`, else a scatter."""
    instr = "dma_copy"
    run, _version = run_and_version()
    gather = isinstance(src, IndirectRows)
    rows, tile = (src, as_tensor(instr, "dst", dst)) if gather else (dst, as_tensor(instr, "src", src))
    buffer_rule(instr, "dst" if gather else "src", tile, Buffer.sbuf, "an indirect DMA moves HBM rows to or from "
                 "SBUF")
    numbers = rows.row_numbers(instr, run.compute_values)
    views = [rows.row(n) for n in numbers]
    per_row = views[0].size
    if tile.shape[0] != len(views) or tile.size != per_row * len(views):
        fail(instr, f"tile {tile.name!r} {list(tile.shape)} does not match {len(views)} rows of {per_row} elements "
             f"of {rows.name!r}")
    same = tile.dtype.name == rows.base.dtype.name
    if not run.compute_values:
        if gather:
            tile._mask[...] = np.iinfo(tile._mask.dtype).max
    elif gather:
        values = np.stack([v.read(instr).reshape(-1) for v in views])
        tile.write((values if same else values.astype(np.float32)).reshape(tile._data.shape))
    else:
        values = tile.read(instr).reshape(len(views), per_row)
        for view, row in zip(views, values):  # in partition order: a repeated row keeps the last write
            view.write((row if same else row.astype(np.float32)).reshape(view._data.shape))
    distinct = list({id(v._data): v for v in views}.values()) if run.compute_values else views[:1]
    reads, writes = ([rows.index, *distinct], [tile]) if gather else ([rows.index, tile], distinct)
    return record(run, instr, Engine.DMA, reads, writes, name=name, dge_mode=DgeMode.swdge.name, indirect=True,
                  cast=not same, index_reads=1)


def _dma_copy_legacy(*, dst: NkiTensor, src: NkiTensor, mask: Any = None, dst_rmw_op: Any = None,
                     oob_mode: Any = OobMode.error, dge_mode: Any = DgeMode.unknown, unique_indices: Any = None,
                     dtype: Any = None, name: str | None = None) -> NkiTensor:
    if dst_rmw_op is not None or unique_indices is not None:
        raise TypeError("nisa.dma_copy: dst_rmw_op and unique_indices were removed in NKI 0.3.0; use "
                        "nisa.dma_compute(dst, [src, dst], reduce_op=nl.add) for read-modify-write")
    cut = masked_operands("dma_copy", mask, dst, src)
    if cut is not None:
        d, (s,) = cut
        dma_copy(d, s, oob_mode=oob_mode, dge_mode=dge_mode, name=name)
    return dst


dma_copy = instruction("dma_copy", {Engine.DMA: F.dma_transfer},
                       legacy=_dma_copy_legacy,
                       tensors=("dst", "src"),
                       legacy_only=("mask", "dtype", "dst_rmw_op", "unique_indices"))(dma_copy)

_TRANSPOSE_AXES = {2: (1, 0), 3: (2, 1, 0), 4: (3, 1, 2, 0)}


def dma_transpose(dst: NkiTensor, src: NkiTensor, axes: Sequence[int] | None = None, priority: int | None = None,
                  dge_mode: dge_mode = dge_mode.unknown, oob_mode: oob_mode = oob_mode.error,
                  name: str | None = None) -> NkiInstruction:
    """Transpose on the DMA engines into SBUF: (1,0), (2,1,0) or (3,1,2,0) (facts 4.5)."""
    instr = "dma_transpose"
    run, version = run_and_version()
    dst = as_tensor(instr, "dst", dst)
    src = as_tensor(instr, "src", src)
    mode = as_enum(instr, "dge_mode", dge_mode, DgeMode)
    oob = as_enum(instr, "oob_mode", oob_mode, OobMode)
    if mode not in (DgeMode.unknown, DgeMode.hwdge):
        fail(instr, f"dge_mode={mode.name} is not valid for a direct DMA transpose; use unknown or hwdge")
    buffer_rule(instr, "dst", dst, Buffer.sbuf, "dma_transpose writes SBUF")
    _dma_buffers(instr, dst, src)
    if dst.dtype.name != src.dtype.name:
        fail(instr, f"src dtype {src.dtype.name} and dst dtype {dst.dtype.name} must match")
    if src.ndim not in _TRANSPOSE_AXES:
        fail(instr, f"src is {src.ndim}-D; dma_transpose takes 2-D, 3-D or 4-D tensors")
    perm = _TRANSPOSE_AXES[src.ndim] if axes is None else tuple(int(a) for a in axes)
    if perm != _TRANSPOSE_AXES[src.ndim]:
        fail(instr, f"axes {list(perm)} is not supported for a {src.ndim}-D src; the permutation is "
             f"{list(_TRANSPOSE_AXES[src.ndim])}")
    expected = tuple(src.shape[a] for a in perm)
    if tuple(dst.shape) != expected:
        fail(instr, f"dst shape {list(dst.shape)} must equal the transposed src shape {list(expected)} exactly "
             "(including rank, since NKI 0.4.0)")
    if mode is DgeMode.hwdge:
        if version < 3:
            fail(instr, "dge_mode=hwdge needs NeuronCore-v3 or newer")
        if src.dtype.itemsize != 2:
            fail(instr, f"a hwdge transpose needs a 2-byte dtype, got {src.dtype.name}")
        if src.shape[-1] > 128:
            fail(instr, f"a hwdge transpose needs src.shape[-1] <= 128, got {src.shape[-1]}")
        if src.ndim == 2 and src.shape[0] != 16:
            fail(instr, f"a 2-D hwdge transpose needs src.shape[0] == 16, got {src.shape[0]}")
        if src.ndim > 2 and (src.shape[0] not in (1, 2, 4, 8, 16) or (src.shape[0] * src.shape[-2]) % 16):
            fail(instr, f"a {src.ndim}-D hwdge transpose needs src.shape[0] in (1, 2, 4, 8, 16) and "
                 f"src.shape[0] * src.shape[-2] a multiple of 16, got shape {list(src.shape)}")
    prio = _priority(instr, priority, version, mode)
    store_values(dst, np.transpose(src.read(instr), perm))
    return record(run, instr, Engine.DMA, [src], [dst], name=name, transpose=True, axes=list(perm),
                  dge_mode=mode.name, oob_mode=oob.name, priority=prio)


def _dma_transpose_legacy(src: NkiTensor, *, axes: Any = None, mask: Any = None, dtype: Any = None,
                          dge_mode: Any = dge_mode.unknown, name: str | None = None) -> NkiTensor:
    src = as_tensor("dma_transpose", "src", src)
    perm = _TRANSPOSE_AXES.get(src.ndim, tuple(range(src.ndim))[::-1]) if axes is None else tuple(axes)
    out = new_tile(tuple(src.shape[a] for a in perm), src.dtype, Buffer.sbuf, "dma_transpose")
    if mask is not None:
        fail("dma_transpose", "a legacy mask on dma_transpose is not simulated")
    dma_transpose(out, src, axes=perm, dge_mode=dge_mode, name=name)
    return cast_legacy_result(out, dtype, "dma_transpose_cast")


dma_transpose = instruction("dma_transpose", {Engine.DMA: F.dma_transfer},
                            legacy=_dma_transpose_legacy,
                            tensors=("dst", "src"))(dma_transpose)


@instruction("dma_compute", {Engine.DMA: F.dma_transfer})
def dma_compute(dst: NkiTensor, srcs: Sequence[NkiTensor], reduce_op: Any, scales: Sequence[float] | None = None,
                unique_indices: bool = True, oob_mode: oob_mode = oob_mode.error,
                name: str | None = None) -> NkiInstruction:
    """``dst = sum(srcs[i] * scales[i])`` computed in fp32 inside the DMA engines (facts 4.5)."""
    instr = "dma_compute"
    run, _version = run_and_version()
    if isinstance(reduce_op, (list, tuple)):
        raise TypeError("nisa.dma_compute: NKI 0.3.0 reordered the parameters to (dst, srcs, reduce_op, "
                        "scales=None, ...); pass reduce_op=nl.add and scales= by keyword")
    dst = as_tensor(instr, "dst", dst)
    if isinstance(srcs, NkiTensor) or not isinstance(srcs, (list, tuple)) or not srcs:
        raise TypeError(f"{instr}: srcs must be a non-empty list of tensors")
    tensors = [as_tensor(instr, f"srcs[{i}]", s) for i, s in enumerate(srcs)]
    if len(tensors) > 16:
        fail(instr, f"{len(tensors)} source tensors; dma_compute takes at most 16")
    op_name = nki_op_name(reduce_op)
    if op_name != "add":
        fail(instr, f"reduce_op {op_name} is not supported; dma_compute reduces with nl.add only")
    if scales is not None:
        scales = [float(s) for s in scales]
        if len(scales) != len(tensors) or any(s != 1.0 for s in scales):
            fail(instr, f"scales must be None or one 1.0 per source (other scales are not supported), got {scales}")
    oob = as_enum(instr, "oob_mode", oob_mode, OobMode)
    views = [dst, *tensors]
    if any(v._indirect is not None for v in views):
        return _indirect_compute(run, dst, tensors, unique_indices, oob, name)
    total = None
    for i, t in enumerate(tensors):
        _dma_buffers(instr, dst, t)
        if t.size != dst.size:
            fail(instr, f"srcs[{i}] has {t.size} elements and dst {dst.size}; element counts must match")
        values = t.read(instr).astype(np.float32).reshape(-1)
        total = values if total is None else total + values
    store_values(dst, total.reshape(dst._data.shape))
    return record(run, instr, Engine.DMA, tensors, [dst], name=name, op="add", sources=len(tensors))


def _indirect_compute(run: Any, dst: NkiTensor, srcs: list[NkiTensor], unique_indices: Any, oob: OobMode,
                      name: str | None) -> NkiInstruction:
    """``dma_compute`` read-modify-write through vector_offset views (nki.isa docstring): scatter-add
    ``dst(HBM)[idx] = dst[idx] + src(SBUF)`` or gather-add ``dst(SBUF) = dst + src(HBM)[idx]``; two
    sources, distinct indices (``unique_indices=True``; repeated ones are not supported by NKI)."""
    instr = "dma_compute"
    _run, version = run_and_version()
    views = [dst, *srcs]
    mode = _indirect_mode(instr, version, DgeMode.unknown, views)
    if len(srcs) != 2:
        fail(instr, f"a read-modify-write through an indirect view takes exactly 2 sources, got {len(srcs)}")
    if unique_indices is not True:
        fail(instr, "unique_indices must be True with an indirect view (non-unique indices are not supported "
             "by NKI's dma_compute)")
    skip = oob is OobMode.skip
    resolved = [_resolve(instr, v, skip) for v in views]
    for i, t in enumerate(srcs):
        _dma_buffers(instr, dst, t)
        if t.size != dst.size:
            fail(instr, f"srcs[{i}] has {t.size} elements and dst {dst.size}; element counts must match")
    rows = dst.shape[0] if dst.ndim else 1
    keep = _rows_kept(instr, resolved, rows)
    for view, r in zip(views, resolved):
        if r is None or view._indirect.kind != "vector" or not run.compute_values:
            continue
        idx = r.indices if keep is None else r.indices[keep]
        values, counts = np.unique(idx, return_counts=True)
        if (counts > 1).any():
            fail(instr, f"vector_offset {view._indirect.source.name!r} holds row {int(values[counts > 1][0])} "
                 "more than once; dma_compute needs distinct indices (unique_indices=True; repeated rows are "
                 "not supported by NKI): combine the repeated rows' updates first")
    if run.compute_values and (keep is None or keep.any()):
        total = None
        for t, r in zip(srcs, resolved[1:]):
            values = _side_values(instr, t, r).astype(np.float32).reshape(-1)
            total = values if total is None else total + values
        _store(instr, dst, resolved[0], total, keep)
    attrs = _descriptor_attrs(views, keep)
    index = _sources(views)
    return record(run, instr, Engine.DMA, [*index, *srcs], [dst], name=name, op="add", index_reads=len(index),
                  sources=len(srcs), dge_mode=mode.name, oob_mode=oob.name, **attrs)
