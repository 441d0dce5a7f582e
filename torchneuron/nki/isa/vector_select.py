"""VectorE selection, top-8 and random instructions: ``select_reduce``, ``range_select``,
``max8``, ``nc_find_index8``, ``nc_match_replace8``, ``nc_stream_shuffle``, ``dropout``,
``rng``, ``rand2``, ``set_rng_seed`` and ``rand_set_state``/``rand_get_state``
(``quantize_mx`` is in ``mx_ops.py``).
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from torchneuron.nki.cost import formulas as F
from torchneuron.nki.dtypes import NkiDType, resolve
from torchneuron.nki.errors import fail
from torchneuron.nki.instruction import Engine
from torchneuron.nki.isa.accumulators import dve_write, reduce_cmd_arg, reduce_res_tile
from torchneuron.nki.isa.core import (
    INT32, NkiInstruction, alu_operator, as_enum, as_tensor, choose_engine, core_state, engine_operand, fp32_values,
    instruction, legacy_dtype, mask_counts, masked_operands, new_tile, raw_values, read_values, record,
    run_and_version, same_layout, same_partitions, scalar_value, store_values, vector_operand,
)
from torchneuron.nki.isa.enums import ENGINE_NAME, FP32_MIN, EngineKind, ReduceCmd, engine, reduce_cmd
from torchneuron.nki.isa.vector_ops import cast_legacy_result
from torchneuron.nki.memory import Buffer
from torchneuron.nki.ops import ALU_OPS, nki_op_name
from torchneuron.nki.tensor import NkiTensor


# ============================================================================ VectorE: selection, top-8, random
def _max_only(instr: str, reduce_op: Any) -> str:
    """The reduce op of an instruction that can only max-reduce (None means max)."""
    reduce_name = "maximum" if reduce_op is None else nki_op_name(reduce_op)
    if reduce_name != "maximum":
        fail(instr, f"reduce_op {reduce_name} is not supported; {instr} reduces with max only")
    return reduce_name


def select_reduce(dst: NkiTensor, predicate: NkiTensor, on_true: NkiTensor, on_false: Any,
                  reduce_res: NkiTensor | None = None, reduce_cmd: reduce_cmd = reduce_cmd.idle,
                  reduce_op: Any = "maximum", reverse_pred: bool = False, name: str | None = None) -> NkiInstruction:
    """``where(predicate, on_true, on_false)`` with an optional max into the VectorE accumulators (facts 4.3)."""
    instr = "select_reduce"
    run, _version = run_and_version()
    reduce_name = _max_only(instr, reduce_op)
    cmd = reduce_cmd_arg(instr, reduce_cmd, (ReduceCmd.idle, ReduceCmd.reset_reduce, ReduceCmd.reduce))
    ve = Engine.VECTOR
    predicate = engine_operand(instr, "predicate", predicate, ve)
    on_true = engine_operand(instr, "on_true", on_true, ve)
    dst = engine_operand(instr, "dst", dst, ve)
    same_layout(instr, "on_true", on_true, "predicate", predicate)
    same_layout(instr, "on_true", on_true, "dst", dst)
    if not predicate.dtype.is_integer or predicate.dtype.itemsize > 2:
        fail(instr, f"predicate dtype is {predicate.dtype.name}; it must be int8, uint8, int16 or uint16")
    if on_true.dtype.name in ("tfloat32",) + INT32:
        fail(instr, f"on_true dtype {on_true.dtype.name} is not supported (tfloat32, int32 and uint32 are excluded)")
    if on_true._alloc.buffer is Buffer.psum and predicate._alloc.buffer is Buffer.psum:
        fail(instr, "on_true and predicate are both in PSUM; at most one of them may be in PSUM")
    partitions = on_true.shape[0]
    reads = [predicate, on_true]
    fill = vector_operand(instr, "on_false", on_false, partitions, ve, reads)
    res = reduce_res_tile(instr, reduce_res, partitions, ve)
    if res is not None and not res.dtype.is_float:
        fail(instr, f"reduce_res dtype must be a float type, got {res.dtype.name}")
    keep = raw_values(predicate, instr) != 0
    if reverse_pred:
        keep = ~keep
    result = np.where(keep, fp32_values(on_true, instr), fill).astype(np.float32)
    writes = dve_write(run, instr, dst, result, on_true, cmd, "maximum", res, partitions)
    return record(run, instr, ve, reads, writes, name=name, reduce_op=reduce_name, reduce_cmd=cmd.name,
                  reduce_res=res is not None, reverse_pred=bool(reverse_pred))


def _select_reduce_legacy(*, dst: NkiTensor, predicate: NkiTensor, on_true: NkiTensor, on_false: Any,
                          reduce_res: Any = None, reduce_cmd: Any = ReduceCmd.idle, reduce_op: Any = None,
                          reverse_pred: bool = False, mask: Any = None, dtype: Any = None,
                          name: str | None = None) -> NkiTensor:
    cut = masked_operands("select_reduce", mask, dst, predicate, on_true, on_false, reduce_res)
    if cut is not None:
        d, (p, t, f, r) = cut
        select_reduce(d, p, t, f, reduce_res=r, reduce_cmd=reduce_cmd, reduce_op=reduce_op,
                      reverse_pred=reverse_pred, name=name)
    return dst


select_reduce = instruction("select_reduce", {Engine.VECTOR: F.vector_n},
                            legacy=_select_reduce_legacy,
                            tensors=("dst", "predicate", "on_true"))(select_reduce)

_COMPARISONS = ("equal", "less", "less_equal", "greater", "greater_equal")


def range_select(dst: NkiTensor, on_true_tile: NkiTensor, comp_op0: Any, comp_op1: Any, bound0: NkiTensor,
                 bound1: NkiTensor, reduce_cmd: reduce_cmd = reduce_cmd.reset_reduce,
                 reduce_res: NkiTensor | None = None, reduce_op: Any = "maximum", range_start: int = 0,
                 on_false_value: float = FP32_MIN, name: str | None = None) -> NkiInstruction:
    """Keep elements whose free index lies in a per-partition range, max-reducing them (v3+, facts 4.3)."""
    instr = "range_select"
    run, version = run_and_version()
    comps = []
    for role, op in (("comp_op0", comp_op0), ("comp_op1", comp_op1)):
        op_name = alu_operator(instr, role, op).name
        if op_name not in _COMPARISONS:
            fail(instr, f"{role} {op_name} is not a comparison; use one of {', '.join(_COMPARISONS)}")
        comps.append(ALU_OPS[op_name].fn)
    reduce_name = _max_only(instr, reduce_op)
    if float(on_false_value) != FP32_MIN:
        fail(instr, f"on_false_value must be FP32_MIN ({FP32_MIN!r}, nl.fp32.min) on hardware, got {on_false_value!r}")
    cmd = reduce_cmd_arg(instr, reduce_cmd, (ReduceCmd.idle, ReduceCmd.reset_reduce, ReduceCmd.reduce))
    ve = Engine.VECTOR
    on_true = engine_operand(instr, "on_true_tile", on_true_tile, ve)
    dst = engine_operand(instr, "dst", dst, ve)
    same_layout(instr, "on_true_tile", on_true, "dst", dst)
    if not on_true.dtype.is_float:
        fail(instr, f"on_true_tile must be a float tile, got {on_true.dtype.name}")
    partitions = on_true.shape[0]
    reads = [on_true]
    bounds = []
    for role, bound in (("bound0", bound0), ("bound1", bound1)):
        bound_t = as_tensor(instr, role, bound)
        if bound_t.dtype.name != "float32":
            fail(instr, f"{role} must be a float32 ({partitions}, 1) tile, got {bound_t.dtype.name}")
        bounds.append(vector_operand(instr, role, bound_t, partitions, ve, reads))
    res = reduce_res_tile(instr, reduce_res, partitions, ve)
    index = (np.float32(range_start) + np.arange(on_true.free_size, dtype=np.float32))[None, :]
    keep = (comps[0](index, bounds[0]) != 0) & (comps[1](index, bounds[1]) != 0)
    result = np.where(keep, fp32_values(on_true, instr), np.float32(FP32_MIN)).astype(np.float32)
    writes = dve_write(run, instr, dst, result, on_true, cmd, "maximum", res, partitions)
    return record(run, instr, ve, reads, writes, name=name, reduce_op=reduce_name, reduce_cmd=cmd.name,
                  reduce_res=res is not None, range_start=int(range_start))


def _range_select_legacy(*, on_true_tile: NkiTensor, comp_op0: Any, comp_op1: Any, bound0: NkiTensor,
                         bound1: NkiTensor, reduce_cmd: Any = ReduceCmd.idle, reduce_res: Any = None,
                         reduce_op: Any = None, range_start: int = 0, on_false_value: float = FP32_MIN,
                         mask: Any = None, dtype: Any = None, name: str | None = None) -> NkiTensor:
    on_true_tile = as_tensor("range_select", "on_true_tile", on_true_tile)
    out = new_tile(on_true_tile.shape, legacy_dtype(dtype, on_true_tile), Buffer.sbuf, "range_select")
    cut = masked_operands("range_select", mask, out, on_true_tile, bound0, bound1, reduce_res)
    if cut is not None:
        dst, (t, b0, b1, r) = cut
        range_select(dst, t, comp_op0, comp_op1, b0, b1, reduce_cmd=reduce_cmd, reduce_res=r, reduce_op=reduce_op,
                     range_start=range_start, on_false_value=on_false_value, name=name)
    return out


range_select = instruction("range_select", {Engine.VECTOR: F.vector_n},
                           legacy=_range_select_legacy,
                           tensors=("dst", "on_true_tile"),
                           min_version=3)(range_select)


def _top8_input(instr: str, role: str, t: NkiTensor) -> None:
    if not 8 <= t.free_size <= 16384:
        fail(instr, f"{role} has {t.free_size} elements per partition; {instr} reads 8 to 16384")


def max8(dst: NkiTensor, src: NkiTensor, name: str | None = None) -> NkiInstruction:
    """The 8 largest values of each partition, descending, on VectorE (facts 4.3)."""
    instr = "max8"
    run, _version = run_and_version()
    ve = Engine.VECTOR
    src = engine_operand(instr, "src", src, ve)
    dst = engine_operand(instr, "dst", dst, ve)
    same_partitions(instr, "src", src, "dst", dst)
    _top8_input(instr, "src", src)
    if dst.free_size != 8:
        fail(instr, f"dst must hold 8 elements per partition, has {dst.free_size}")
    x = fp32_values(src, instr)
    top = np.partition(x, x.shape[1] - 8, axis=1)[:, -8:]
    store_values(dst, -np.sort(-top, axis=1))
    return record(run, instr, ve, [src], [dst], name=name)


def _max8_legacy(*, src: NkiTensor, mask: Any = None, dtype: Any = None, name: str | None = None) -> NkiTensor:
    src = as_tensor("max8", "src", src)
    out = new_tile((src.shape[0], 8), legacy_dtype(dtype, src), Buffer.sbuf, "max8")
    counts = mask_counts("max8", mask, tuple(src.shape))
    s, d = src, out
    if counts is not None:
        if 0 in counts:
            return out
        s, d = src[tuple(slice(0, c) for c in counts)], out[0:counts[0]]
    max8(d, s, name=name)
    return out


max8 = instruction("max8", {Engine.VECTOR: F.vector_top8}, legacy=_max8_legacy, tensors=("dst", "src"))(max8)


def _sentinel(dtype: NkiDType) -> int:
    return int(np.iinfo(dtype.storage).max) if dtype.kind in ("uint", "bool") else -1


def nc_find_index8(dst: NkiTensor, data: NkiTensor, vals: NkiTensor, name: str | None = None) -> NkiInstruction:
    """Index of each of 8 values per partition (duplicates take successive occurrences), VectorE (facts 4.3)."""
    instr = "nc_find_index8"
    run, _version = run_and_version()
    ve = Engine.VECTOR
    data = engine_operand(instr, "data", data, ve)
    vals = engine_operand(instr, "vals", vals, ve)
    dst = engine_operand(instr, "dst", dst, ve)
    same_partitions(instr, "data", data, "vals", vals)
    same_partitions(instr, "data", data, "dst", dst)
    _top8_input(instr, "data", data)
    if vals.free_size != 8 or dst.free_size != 8:
        fail(instr, f"vals and dst must hold 8 elements per partition, have {vals.free_size} and {dst.free_size}")
    if dst.dtype.name not in ("uint16", "uint32"):
        fail(instr, f"dst dtype must be uint16 or uint32, got {dst.dtype.name}")
    x = fp32_values(data, instr)
    v = fp32_values(vals, instr)
    rank = np.tril(v[:, :, None] == v[:, None, :], -1).sum(axis=2)  # earlier equal vals
    sentinel = _sentinel(dst.dtype)
    out = np.empty(v.shape, dtype=np.int64)
    for j in range(8):
        equal = x == v[:, j:j + 1]
        hit = equal & (np.cumsum(equal, axis=1) == rank[:, j:j + 1] + 1)
        out[:, j] = np.where(hit.any(axis=1), hit.argmax(axis=1), sentinel)
    store_values(dst, out)
    return record(run, instr, ve, [data, vals], [dst], name=name)


def _nc_find_index8_legacy(*, data: NkiTensor, vals: NkiTensor, mask: Any = None, dtype: Any = None,
                           name: str | None = None) -> NkiTensor:
    data = as_tensor("nc_find_index8", "data", data)
    out = new_tile((data.shape[0], 8), resolve(dtype) if dtype is not None else resolve("uint32"), Buffer.sbuf,
                   "find_index8")
    counts = mask_counts("nc_find_index8", mask, tuple(data.shape))
    d, v, o = data, vals, out
    if counts is not None:
        if 0 in counts:
            return out
        d, v, o = data[tuple(slice(0, c) for c in counts)], vals[0:counts[0]], out[0:counts[0]]
    nc_find_index8(o, d, v, name=name)
    return out


nc_find_index8 = instruction("nc_find_index8", {Engine.VECTOR: F.vector_top8},
                             legacy=_nc_find_index8_legacy,
                             tensors=("dst", "data", "vals"))(nc_find_index8)


def nc_match_replace8(dst: NkiTensor, data: NkiTensor, vals: NkiTensor, imm: float, dst_idx: NkiTensor | None = None,
                      name: str | None = None) -> NkiInstruction:
    """Replace the first occurrence of each of 8 values with ``imm`` (vals processed 7..0), VectorE (facts 4.3)."""
    instr = "nc_match_replace8"
    run, _version = run_and_version()
    ve = Engine.VECTOR
    data = engine_operand(instr, "data", data, ve)
    vals = engine_operand(instr, "vals", vals, ve)
    dst = engine_operand(instr, "dst", dst, ve)
    same_layout(instr, "data", data, "dst", dst)
    same_partitions(instr, "data", data, "vals", vals)
    _top8_input(instr, "data", data)
    if vals.free_size != 8:
        fail(instr, f"vals must hold 8 elements per partition, has {vals.free_size}")
    imm_value = np.float32(scalar_value(instr, "imm", imm))
    x = fp32_values(data, instr)
    v = fp32_values(vals, instr)
    partitions = x.shape[0]
    rows = np.arange(partitions)
    replaced = np.zeros(x.shape, dtype=bool)
    index = np.empty((partitions, 8), dtype=np.int64)
    for j in range(7, -1, -1):
        candidates = (x == v[:, j:j + 1]) & ~replaced
        found = candidates.any(axis=1)
        position = candidates.argmax(axis=1)
        replaced[rows[found], position[found]] = True
        index[:, j] = np.where(found, position, -1)
    writes = [dst]
    if dst_idx is not None:
        idx_t = engine_operand(instr, "dst_idx", dst_idx, ve)
        same_partitions(instr, "data", data, "dst_idx", idx_t)
        if idx_t.free_size != 8 or not idx_t.dtype.is_integer:
            fail(instr, f"dst_idx must be an integer tile with 8 elements per partition, got {idx_t.dtype.name} "
                 f"shape {list(idx_t.shape)}")
        store_values(idx_t, np.where(index < 0, _sentinel(idx_t.dtype), index))
        writes.append(idx_t)
    store_values(dst, np.where(replaced, imm_value, x))
    return record(run, instr, ve, [data, vals], writes, name=name)


def _nc_match_replace8_legacy(*, data: NkiTensor, vals: NkiTensor, imm: float, dst_idx: Any = None, mask: Any = None,
                              dtype: Any = None, name: str | None = None) -> NkiTensor:
    data = as_tensor("nc_match_replace8", "data", data)
    out = new_tile(data.shape, legacy_dtype(dtype, data), Buffer.sbuf, "match_replace8")
    counts = mask_counts("nc_match_replace8", mask, tuple(data.shape))
    d, v, o, i = data, vals, out, dst_idx
    if counts is not None:
        if 0 in counts:
            return out
        key = tuple(slice(0, c) for c in counts)
        d, o, v = data[key], out[key], vals[0:counts[0]]
        i = None if dst_idx is None else dst_idx[0:counts[0]]
    nc_match_replace8(o, d, v, imm, dst_idx=i, name=name)
    return out


nc_match_replace8 = instruction("nc_match_replace8", {Engine.VECTOR: F.vector_top8},
                                legacy=_nc_match_replace8_legacy,
                                tensors=("dst", "data", "vals"))(nc_match_replace8)


@instruction("nc_stream_shuffle", {Engine.VECTOR: F.vector_n})
def nc_stream_shuffle(dst: NkiTensor, src: NkiTensor, shuffle_mask: Sequence[int],
                      name: str | None = None) -> NkiInstruction:
    """Cross-partition moves within 32-partition quadrants on VectorE (facts 4.3); mask value 255 = keep dst."""
    instr = "nc_stream_shuffle"
    run, _version = run_and_version()
    ve = Engine.VECTOR
    src = engine_operand(instr, "src", src, ve)
    dst = engine_operand(instr, "dst", dst, ve)
    if dst.dtype.name != src.dtype.name:
        fail(instr, f"dst dtype {dst.dtype.name} differs from src dtype {src.dtype.name}; they must match")
    if dst.free_size != src.free_size:
        fail(instr, f"dst has {dst.free_size} elements per partition and src {src.free_size}; they must match")
    mask = [int(m) for m in shuffle_mask]
    if len(mask) != 32 or any(not (0 <= m < 32 or m == 255) for m in mask):
        fail(instr, f"shuffle_mask must list 32 source lanes in 0..31 (or 255 to keep dst), got {mask}")
    raw = raw_values(src, instr)
    rows = np.arange(dst.shape[0])
    lane_source = np.array(mask)[rows % 32]
    move = lane_source != 255
    source_rows = (rows // 32) * 32 + np.where(move, lane_source, 0)
    if move.any() and source_rows[move].max() >= src.shape[0]:
        fail(instr, f"shuffle_mask reads src partition {int(source_rows[move].max())}, beyond src's "
             f"{src.shape[0]} partitions")
    values = raw[np.where(move, source_rows, 0)]
    store_values(dst, values, where=np.broadcast_to(move[:, None], values.shape))
    return record(run, instr, ve, [src], [dst], name=name)


def dropout(dst: NkiTensor, data: NkiTensor, prob: Any, name: str | None = None) -> NkiInstruction:
    """Zero each element with probability ``prob`` (scalar or (P, 1)), on VectorE (facts 4.3, decision 12)."""
    instr = "dropout"
    run, _version = run_and_version()
    ve = Engine.VECTOR
    data = engine_operand(instr, "data", data, ve)
    dst = engine_operand(instr, "dst", dst, ve)
    same_layout(instr, "data", data, "dst", dst)
    if dst.dtype.name != data.dtype.name:
        fail(instr, f"dst dtype {dst.dtype.name} must match data dtype {data.dtype.name}")
    partitions = data.shape[0]
    reads = [data]
    if isinstance(prob, NkiTensor) and data.dtype.is_integer and prob.dtype.name != "float32":
        fail(instr, f"prob must be float32 for integer data, got {prob.dtype.name}")
    p = vector_operand(instr, "prob", prob, partitions, ve, reads)
    raw = raw_values(data, instr)
    draw = core_state(run).rng[Engine.VECTOR].random(raw.shape, dtype=np.float32)
    store_values(dst, np.where(draw >= p, raw, np.zeros((), dtype=raw.dtype)))
    return record(run, instr, ve, reads, [dst], name=name)


def _dropout_legacy(data: NkiTensor, prob: Any, *, mask: Any = None, dtype: Any = None,
                    name: str | None = None) -> NkiTensor:
    data = as_tensor("dropout", "data", data)
    out = new_tile(data.shape, data.dtype, Buffer.sbuf, "dropout")
    cut = masked_operands("dropout", mask, out, data, prob)
    if cut is not None:
        dst, (d, p) = cut
        dropout(dst, d, p, name=name)
    return cast_legacy_result(out, dtype, "dropout_cast")


dropout = instruction("dropout", {Engine.VECTOR: F.vector_n}, legacy=_dropout_legacy, tensors=("dst", "data"))(dropout)

_RNG_DTYPES = ("int8", "int16", "int32", "uint8", "uint16", "uint32")


@instruction("rng", {Engine.VECTOR: F.vector_per_input, Engine.GPSIMD: F.gpsimd_per_input})
def rng(dst: NkiTensor, engine: engine = engine.vector, name: str | None = None) -> NkiInstruction:
    """32 random bits per element, truncated to dst's integer dtype (facts 4.3, decision 12)."""
    instr = "rng"
    run, version = run_and_version()
    requested = as_enum(instr, "engine", engine, EngineKind)
    chosen = EngineKind.vector if requested is EngineKind.unknown else requested
    choose_engine(instr, chosen, (EngineKind.vector, EngineKind.gpsimd))
    if chosen is EngineKind.gpsimd and version < 3:
        fail(instr, "rng on GpSimd needs NeuronCore-v3 or newer; NeuronCore-v2 generates on VectorE")
    eng = ENGINE_NAME[chosen]
    dst = engine_operand(instr, "dst", dst, eng)
    if dst.dtype.name not in _RNG_DTYPES:
        fail(instr, f"dst must be an integer tile ({', '.join(_RNG_DTYPES)}), got {dst.dtype.name}")
    bits = core_state(run).rng[eng].integers(0, 1 << 32, size=dst._data.shape, dtype=np.uint32)
    store_values(dst, bits.astype(dst.dtype.storage))
    return record(run, instr, eng, [], [dst], name=name, engine_requested=requested.name)


@instruction("rand2", {Engine.VECTOR: F.vector_per_input}, min_version=4, hint="use nisa.rng and scale the bits")
def rand2(dst: NkiTensor, min: Any, max: Any, name: str | None = None) -> NkiInstruction:  # noqa: A002
    """Uniform random values in [min, max) on VectorE (v4 only, facts 4.3)."""
    instr = "rand2"
    run, version = run_and_version()
    ve = Engine.VECTOR
    dst = engine_operand(instr, "dst", dst, ve)
    partitions = dst.shape[0]
    reads: list[NkiTensor] = []
    low = vector_operand(instr, "min", min, partitions, ve, reads)
    high = vector_operand(instr, "max", max, partitions, ve, reads)
    if np.any(np.asarray(low) >= np.asarray(high)):
        fail(instr, "min must be below max for every partition")
    draw = core_state(run).rng[Engine.VECTOR].random((partitions, dst.free_size), dtype=np.float32)
    store_values(dst, low + draw * (high - low))
    return record(run, instr, ve, reads, [dst], name=name)


@instruction("set_rng_seed", {Engine.VECTOR: F.vector_per_input})
def set_rng_seed(src_seeds: NkiTensor, name: str | None = None) -> NkiInstruction:
    """Seed VectorE's generator from a [1, 1] 32-bit tile: the same seed gives the same sequence (facts 4.3)."""
    instr = "set_rng_seed"
    run, _version = run_and_version()
    ve = Engine.VECTOR
    src_seeds = engine_operand(instr, "src_seeds", src_seeds, ve)
    if src_seeds.size != 1 or src_seeds.dtype.itemsize != 4:
        fail(instr, f"src_seeds must be a [1, 1] tile of a 32-bit dtype, got {src_seeds.dtype.name} shape "
             f"{list(src_seeds.shape)}")
    seed = int(np.ascontiguousarray(read_values(src_seeds, instr)).reshape(-1).view(np.uint32)[0])
    core_state(run).rng[Engine.VECTOR] = np.random.default_rng(seed)
    return record(run, instr, ve, [src_seeds], [], name=name, seed=seed)


@instruction("rand_set_state", {Engine.GPSIMD: F.gpsimd_per_input, Engine.VECTOR: F.vector_per_input}, simulated=False)
def rand_set_state(src_seeds: NkiTensor, engine: engine = engine.gpsimd, name: str | None = None) -> NkiInstruction:
    """Not simulated: the XORWOW state layout is unpublished (decision 16)."""
    fail("rand_set_state", "is not simulated (the engine's XORWOW state layout is unpublished); use "
         "nisa.set_rng_seed")
    raise AssertionError  # unreachable


@instruction("rand_get_state", {Engine.GPSIMD: F.gpsimd_per_input, Engine.VECTOR: F.vector_per_input}, simulated=False)
def rand_get_state(dst: NkiTensor, engine: engine = engine.gpsimd, name: str | None = None) -> NkiInstruction:
    """Not simulated: the XORWOW state layout is unpublished (decision 16)."""
    fail("rand_get_state", "is not simulated (the engine's XORWOW state layout is unpublished)")
    raise AssertionError  # unreachable
