"""GpSimd instructions: ``iota``, ``affine_select``, ``local_gather``, ``nc_n_gather``,
``sequence_bounds``, ``nonzero_with_count`` and the unsimulated ``topk``, with the affine
pattern helpers shared by iota and affine_select.
"""

from __future__ import annotations

import builtins
import math
from typing import Any, Sequence

import numpy as np

from torchneuron.nki.cost import formulas as F
from torchneuron.nki.dtypes import resolve
from torchneuron.nki.errors import fail
from torchneuron.nki.indexing import AffineIndex, MaskExpr
from torchneuron.nki.instruction import Engine
from torchneuron.nki.isa.core import (
    NkiInstruction, alu_operator, as_tensor, engine_operand, fp32_values, instruction, legacy_dtype, mask_counts,
    masked_operands, new_tile, raw_values, record, run_and_version, same_layout, same_partitions, scalar_value,
    store_values,
)
from torchneuron.nki.memory import Buffer
from torchneuron.nki.tensor import NkiTensor


# ============================================================================ GpSimd
def _pattern(instr: str, pattern: Any, free_size: int) -> list[tuple[int, int]]:
    try:
        pairs = [(int(step), int(num)) for step, num in pattern]
    except (TypeError, ValueError):
        raise TypeError(f"{instr}: pattern must be a list of [step, num] pairs, got {pattern!r}") from None
    if not 1 <= len(pairs) <= 4:
        fail(instr, f"pattern has {len(pairs)} levels; it describes up to 4 free dimensions as [step, num] pairs")
    total = math.prod(num for _, num in pairs)
    if total != free_size:
        fail(instr, f"pattern {[list(p) for p in pairs]} generates {total} values per partition but dst holds "
             f"{free_size}; the product of the nums must equal dst's elements per partition")
    return pairs


def _affine_values(partitions: int, pairs: Sequence[tuple[int, int]], offset: int,
                   channel_multiplier: int) -> np.ndarray:
    """``offset + c * channel_multiplier + sum(step_k * i_k)`` as an int64 (P, F) array."""
    inner = np.zeros(1, dtype=np.int64)
    for step, num in pairs:
        inner = (inner[:, None] + step * np.arange(num, dtype=np.int64)[None, :]).reshape(-1)
    channels = np.arange(partitions, dtype=np.int64)[:, None] * int(channel_multiplier)
    return int(offset) + channels + inner[None, :]


def iota(dst: NkiTensor, pattern: Any, offset: int = 0, channel_multiplier: int = 0,
         name: str | None = None) -> NkiInstruction:
    """Generate ``offset + c*channel_multiplier + sum(step*i)`` (int32 math) into SBUF on GpSimd (facts 4.4)."""
    instr = "iota"
    run, _version = run_and_version()
    gp = Engine.GPSIMD
    dst = engine_operand(instr, "dst", dst, gp)
    pairs = _pattern(instr, pattern, dst.free_size)
    values = _affine_values(dst.shape[0], pairs, offset, channel_multiplier).astype(np.int32)
    store_values(dst, values)
    return record(run, instr, gp, [], [dst], name=name, pattern=[list(p) for p in pairs], offset=int(offset),
                  channel_multiplier=int(channel_multiplier))


def _affine_terms(instr: str, expr: Any) -> tuple[int, list[AffineIndex]]:
    """A legacy index expression as (constant, [single-variable terms])."""
    if isinstance(expr, AffineIndex):
        return 0, [expr]
    terms = getattr(expr, "terms", None)
    if terms is not None and all(isinstance(t, AffineIndex) for t in terms):
        return int(getattr(expr, "offset", 0)), list(terms)
    raise TypeError(f"{instr}: expected an affine expression of nl.arange / nl.mgrid indices, got {expr!r}")


def _legacy_pattern(instr: str, expr: Any) -> tuple[tuple[int, ...], list[tuple[int, int]], int, int]:
    """(tile shape, free pattern, offset, channel_multiplier) equivalent to a legacy affine expression."""
    constant, terms = _affine_terms(instr, expr)
    rank = builtins.max(builtins.max(t.rank for t in terms), 2)
    shape = [1] * rank
    steps = [0] * rank
    offset = constant
    for t in terms:
        if shape[t.position] != 1 or steps[t.position]:
            fail(instr, f"two index variables of the expression lie on dimension {t.position}; each dimension takes "
                 "one nl.arange index")
        shape[t.position] = t.count
        steps[t.position] = t.step
        offset += t.offset
    pattern = [(steps[d], shape[d]) for d in range(1, rank)]
    return tuple(shape), pattern, offset, steps[0]


def _iota_legacy(expr: Any, dtype: Any, *, mask: Any = None, name: str | None = None) -> NkiTensor:
    instr = "iota"
    shape, pattern, offset, multiplier = _legacy_pattern(instr, expr)
    out = new_tile(shape, resolve(dtype), Buffer.sbuf, "iota")
    counts = mask_counts(instr, mask, shape)
    dst = out
    if counts is not None:
        if 0 in counts:
            return out
        dst = out[tuple(slice(0, c) for c in counts)]
        pattern = [(step, counts[d + 1]) for d, (step, _num) in enumerate(pattern)]
    iota(dst, pattern, offset=offset, channel_multiplier=multiplier, name=name)
    return out


iota = instruction("iota", {Engine.GPSIMD: F.gpsimd_iota}, legacy=_iota_legacy, tensors=("dst",))(iota)

_CMP_OPS = {"<": "less", "<=": "less_equal", ">": "greater", ">=": "greater_equal", "==": "equal",
            "!=": "not_equal"}


def affine_select(dst: NkiTensor, pattern: Any, channel_multiplier: int, on_true_tile: NkiTensor,
                  on_false_value: float, cmp_op: Any = "equal", offset: int = 0,
                  name: str | None = None) -> NkiInstruction:
    """``where(cmp_op(affine_value, 0), on_true_tile, on_false_value)`` on GpSimd, SBUF only (facts 4.4)."""
    instr = "affine_select"
    run, _version = run_and_version()
    gp = Engine.GPSIMD
    on_true = engine_operand(instr, "on_true_tile", on_true_tile, gp)
    dst = engine_operand(instr, "dst", dst, gp)
    same_layout(instr, "on_true_tile", on_true, "dst", dst)
    compare = alu_operator(instr, "cmp_op", cmp_op)
    if compare.name not in _CMP_OPS.values():
        fail(instr, f"cmp_op {compare.name} is not a comparison; use nl.equal, nl.less, nl.greater_equal, ...")
    fill = scalar_value(instr, "on_false_value", on_false_value)
    pairs = _pattern(instr, pattern, dst.free_size)
    values = _affine_values(dst.shape[0], pairs, offset, channel_multiplier).astype(np.int32)
    keep = compare.fn(values, np.int32(0)) != 0
    if on_true.dtype.name == dst.dtype.name:  # selected elements are copied bit-exactly
        store_values(dst, raw_values(on_true, instr), where=keep)
        store_values(dst, np.asarray(np.float32(fill)), where=~keep)
    else:  # different dtypes: selected elements go through fp32 (facts 4.4)
        store_values(dst, np.where(keep, fp32_values(on_true, instr), np.float32(fill)))
    return record(run, instr, gp, [on_true], [dst], name=name, cmp_op=compare.name, pattern=[list(p) for p in pairs],
                  offset=int(offset), channel_multiplier=int(channel_multiplier))


def _affine_select_legacy(pred: Any, on_true_tile: NkiTensor, on_false_value: float, *, mask: Any = None,
                          dtype: Any = None, name: str | None = None) -> NkiTensor:
    instr = "affine_select"
    on_true_tile = as_tensor(instr, "on_true_tile", on_true_tile)
    if isinstance(pred, MaskExpr):
        if len(pred.terms) != 1:
            fail(instr, "pred combines several comparisons; affine_select takes one affine comparison (use nl.where "
                 "for compound predicates)")
        expr, op, bound = pred.terms[0]
        value_expr = expr - bound
    elif hasattr(pred, "expr") and hasattr(pred, "op"):
        value_expr, op = pred.expr, pred.op
    else:
        raise TypeError(f"{instr}: pred must be a comparison of legacy index expressions (e.g. iy < ix), got {pred!r}")
    if op not in _CMP_OPS:
        raise TypeError(f"{instr}: unsupported comparison {op!r} in pred")
    shape, pattern, offset, multiplier = _legacy_pattern(instr, value_expr)
    if math.prod(shape[1:]) == 1 and on_true_tile.free_size > 1 or shape[0] not in (1, on_true_tile.shape[0]):
        fail(instr, f"pred spans {list(shape)} but on_true_tile has shape {list(on_true_tile.shape)}")
    free = on_true_tile.free_size
    if math.prod(num for _, num in pattern) != free:
        fail(instr, f"pred spans {list(shape)} but on_true_tile has shape {list(on_true_tile.shape)}; they must match")
    out = new_tile(on_true_tile.shape, legacy_dtype(dtype, on_true_tile), Buffer.sbuf, "affine_select")
    cut = masked_operands(instr, mask, out, on_true_tile)
    if cut is not None:
        dst, (source,) = cut
        if dst.shape != out.shape:
            # the mask keeps a leading box: the pattern walks the same free dims, cut to the box (as iota's
            # legacy mask); the partition values (offset + p * multiplier) are unchanged from partition 0
            if len(pattern) != dst.ndim - 1:
                fail(instr, f"a legacy mask on affine_select whose pred spans {list(shape)} over a "
                     f"{list(out.shape)} tile is not simulated; slice the input instead")
            pattern = [(step, dst.shape[d + 1]) for d, (step, _num) in enumerate(pattern)]
        affine_select(dst, pattern, multiplier, source, on_false_value, cmp_op=_CMP_OPS[op],
                      offset=offset, name=name)
    return out


affine_select = instruction("affine_select", {Engine.GPSIMD: F.gpsimd_iota},
                            legacy=_affine_select_legacy,
                            tensors=("dst", "on_true_tile"))(affine_select)


def local_gather(dst: NkiTensor, src_buffer: NkiTensor, index: NkiTensor, num_elem_per_idx: int = 1,
                 num_valid_indices: int | None = None, name: str | None = None) -> NkiInstruction:
    """Gather within each 16-partition GpSimd core's slice of SBUF (facts 4.4, decision 13)."""
    instr = "local_gather"
    run, _version = run_and_version()
    gp = Engine.GPSIMD
    src = engine_operand(instr, "src_buffer", src_buffer, gp)
    index = engine_operand(instr, "index", index, gp)
    dst = engine_operand(instr, "dst", dst, gp)
    if index.dtype.name != "uint16":
        fail(instr, f"index dtype must be uint16, got {index.dtype.name}")
    partitions = src.shape[0]
    if index.shape[0] != partitions or partitions % 16:
        fail(instr, f"src_buffer ({partitions} partitions) and index ({index.shape[0]}) must span the same partitions, "
             "a multiple of 16 (one 16-partition slice per GpSimd core)")
    per_elem = int(num_elem_per_idx)
    if per_elem not in (1, 2, 4, 8, 16, 32):
        fail(instr, f"num_elem_per_idx must be 1, 2, 4, 8, 16 or 32, got {num_elem_per_idx}")
    per_core = index.free_size * 16
    if per_core > 4096:
        fail(instr, f"{per_core} indices per GpSimd core, above the limit of 4096")
    valid = per_core if num_valid_indices is None else int(num_valid_indices)
    if not 0 < valid <= per_core:
        fail(instr, f"num_valid_indices {valid} must be in 1..{per_core} (the indices of one 16-partition slice)")
    if dst.shape[0] != partitions or dst.free_size != valid * per_elem:
        fail(instr, f"dst must be [{partitions}, {valid * per_elem}] elements (valid indices x num_elem_per_idx), "
             f"got shape {list(dst.shape)}")
    if dst.dtype.name != src.dtype.name:
        fail(instr, f"dst dtype {dst.dtype.name} differs from src_buffer dtype {src.dtype.name}; local_gather does "
             "not cast")
    raw = raw_values(src, instr)
    idx = raw_values(index, instr).astype(np.int64)
    out = np.empty((partitions, valid * per_elem), dtype=raw.dtype)
    offsets = np.arange(per_elem, dtype=np.int64)
    for core in range(partitions // 16):
        rows = slice(16 * core, 16 * core + 16)
        flat = idx[rows].reshape(-1, order="F")[:valid]
        cols = (flat[:, None] + offsets[None, :]).reshape(-1)
        if cols.max() >= raw.shape[1]:
            fail(instr, f"index {int(flat.max())} (+{per_elem} elements) on GpSimd core {core} reads past the "
                 f"{raw.shape[1]} elements per partition of src_buffer (undefined on hardware)")
        out[rows] = raw[rows][:, cols]
    store_values(dst, out)
    return record(run, instr, gp, [src, index], [dst], name=name, num_elem_per_idx=per_elem,
                  num_valid_indices=valid)


def _local_gather_legacy(src_buffer: NkiTensor, index: NkiTensor, num_elem_per_idx: int = 1,
                         num_valid_indices: int | None = None, *, mask: Any = None,
                         name: str | None = None) -> NkiTensor:
    src_buffer = as_tensor("local_gather", "src_buffer", src_buffer)
    index = as_tensor("local_gather", "index", index)
    valid = index.free_size * 16 if num_valid_indices is None else int(num_valid_indices)
    out = new_tile((src_buffer.shape[0], valid, int(num_elem_per_idx)), src_buffer.dtype, Buffer.sbuf, "gather")
    if mask is not None:
        fail("local_gather", "a legacy mask on local_gather is not simulated")
    local_gather(out, src_buffer, index, num_elem_per_idx, num_valid_indices, name=name)
    return out


local_gather = instruction("local_gather", {Engine.GPSIMD: F.local_gather},
                           legacy=_local_gather_legacy,
                           tensors=("dst", "src_buffer", "index"))(local_gather)


@instruction("nc_n_gather", {Engine.GPSIMD: F.gpsimd_per_input})
def nc_n_gather(dst: NkiTensor, data: NkiTensor, indices: NkiTensor, name: str | None = None) -> NkiInstruction:
    """Per-partition gather over the flattened free dims, on GpSimd, SBUF only (facts 4.4)."""
    instr = "nc_n_gather"
    run, _version = run_and_version()
    gp = Engine.GPSIMD
    data = engine_operand(instr, "data", data, gp)
    indices = engine_operand(instr, "indices", indices, gp)
    dst = engine_operand(instr, "dst", dst, gp)
    same_partitions(instr, "data", data, "indices", indices)
    same_layout(instr, "indices", indices, "dst", dst)
    if indices.dtype.name != "uint32":
        fail(instr, f"indices dtype must be uint32, got {indices.dtype.name}")
    if dst.dtype.name != data.dtype.name:
        fail(instr, f"dst dtype {dst.dtype.name} must equal data dtype {data.dtype.name}")
    raw = raw_values(data, instr)
    idx = raw_values(indices, instr).astype(np.int64)
    if idx.size and idx.max() >= raw.shape[1]:
        fail(instr, f"index {int(idx.max())} is out of range for {raw.shape[1]} elements per partition of data")
    store_values(dst, np.take_along_axis(raw, idx, axis=1))
    return record(run, instr, gp, [data, indices], [dst], name=name)



def sequence_bounds(dst: NkiTensor, segment_ids: NkiTensor, name: str | None = None) -> NkiInstruction:
    """[start, end) of the segment each element belongs to (0 = padding: [n, -1]), on GpSimd (facts 4.4)."""
    instr = "sequence_bounds"
    run, _version = run_and_version()
    gp = Engine.GPSIMD
    ids = engine_operand(instr, "segment_ids", segment_ids, gp)
    dst = engine_operand(instr, "dst", dst, gp)
    for role, t in (("segment_ids", ids), ("dst", dst)):
        if t.dtype.name not in ("float32", "int32"):
            fail(instr, f"{role} dtype must be float32 or int32, got {t.dtype.name}")
        if t.shape[0] != 1:
            fail(instr, f"{role} must have a partition dimension of 1, got shape {list(t.shape)}")
    n = ids.free_size
    if dst.free_size != 2 * n:
        fail(instr, f"dst must hold 2 x {n} elements (start and end of each element's segment), has "
             f"{dst.free_size}")
    seq = fp32_values(ids, instr)[0]
    index = np.arange(n)
    starts = np.ones(n, dtype=bool)
    starts[1:] = seq[1:] != seq[:-1]
    ends = np.ones(n, dtype=bool)
    ends[:-1] = seq[:-1] != seq[1:]
    first = np.maximum.accumulate(np.where(starts, index, 0))
    last = np.minimum.accumulate(np.where(ends, index + 1, n)[::-1])[::-1]
    padding = seq == 0
    bounds = np.stack([np.where(padding, n, first), np.where(padding, -1, last)]).astype(np.float32)
    store_values(dst, bounds.reshape(1, -1))
    return record(run, instr, gp, [ids], [dst], name=name)


def _sequence_bounds_legacy(*, segment_ids: NkiTensor, dtype: Any = None, mask: Any = None,
                            name: str | None = None) -> NkiTensor:
    """Legacy ``sequence_bounds(segment_ids=, dtype=None)``: a new ``[1, 2, n]`` tile (starts, then ends)
    in ``dtype``, by default segment_ids' dtype (the NKI Beta 1 ISA reference)."""
    ids = as_tensor("sequence_bounds", "segment_ids", segment_ids)
    if mask is not None:
        fail("sequence_bounds", "a legacy mask on sequence_bounds is not simulated; slice segment_ids instead")
    out = new_tile((1, 2, ids.free_size), ids.dtype if dtype is None else resolve(dtype), Buffer.sbuf,
                   "sequence_bounds")
    sequence_bounds(out, ids, name=name)
    return out


sequence_bounds = instruction("sequence_bounds", {Engine.GPSIMD: F.gpsimd_per_input},
                              legacy=_sequence_bounds_legacy,
                              tensors=("dst", "segment_ids"))(sequence_bounds)


@instruction("nonzero_with_count", {Engine.GPSIMD: F.gpsimd_per_input}, min_version=3)
def nonzero_with_count(dst: NkiTensor, src: NkiTensor, index_offset: int = 0, padding_val: int = -1,
                       name: str | None = None) -> NkiInstruction:
    """Indices of non-zero elements, padding and their count, on partitions 0, 16, ..., 112 (v3+, facts 4.4)."""
    instr = "nonzero_with_count"
    run, version = run_and_version()
    gp = Engine.GPSIMD
    src = engine_operand(instr, "src", src, gp)
    dst = engine_operand(instr, "dst", dst, gp)
    same_partitions(instr, "src", src, "dst", dst)
    if src.dtype.name not in ("float32", "int32") or dst.dtype.name != "int32":
        fail(instr, f"src must be float32 or int32 and dst int32, got {src.dtype.name} and {dst.dtype.name}")
    width = src.free_size
    if dst.free_size != width + 1:
        fail(instr, f"dst must have one more element per partition than src ({width + 1}), has {dst.free_size}")
    rows = np.flatnonzero((src.start_partition + np.arange(src.shape[0])) % 16 == 0)
    values = raw_values(src, instr)[rows]
    nonzero = values != 0
    count = nonzero.sum(axis=1)
    order = np.argsort(~nonzero, axis=1, kind="stable")  # non-zero positions first, in order
    slots = np.arange(width)[None, :] < count[:, None]
    out = np.where(slots, order + int(index_offset), int(padding_val))
    where = np.zeros((dst.shape[0], width + 1), dtype=bool)
    where[rows] = True
    full = np.zeros((dst.shape[0], width + 1), dtype=np.int64)
    full[rows] = np.concatenate([out, count[:, None]], axis=1)
    store_values(dst, full, where=where)
    return record(run, instr, gp, [src], [dst], name=name, index_offset=int(index_offset))


@instruction("topk", {Engine.GPSIMD: F.gpsimd_per_input}, simulated=False)
def topk(val_dst: NkiTensor, idx_dst: NkiTensor, src: NkiTensor, n: int, name: str | None = None) -> NkiInstruction:
    """Not simulated: the documented 16-partition snake semantics are ambiguous (decision 16)."""
    fail("topk", "is not simulated: its 16-partition snake layout is not specified precisely enough; use nisa.max8 "
         "and nisa.nc_find_index8 (top 8) or nisa.nc_match_replace8 in a loop")
    raise AssertionError  # unreachable
