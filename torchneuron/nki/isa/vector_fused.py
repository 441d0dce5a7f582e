"""VectorE fused, scan and statistics instructions: ``exponential``, ``scalar_tensor_tensor``,
``tensor_scalar_reduce``, ``tensor_scalar_cumulative``, ``tensor_tensor_scan``, ``bn_stats``
and ``bn_aggr``, with the VectorE accumulator-register helpers.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from torchneuron.nki.cost import formulas as F
from torchneuron.nki.errors import fail
from torchneuron.nki.instruction import Engine
from torchneuron.nki.isa.accumulators import REDUCE_IDENTITY, dve_write, reduce_cmd_arg, reduce_res_tile
from torchneuron.nki.isa.core import (
    INT32, NkiInstruction, alu_operator, apply_alu, as_tensor, core_state, engine_operand, fp32_values, instruction,
    legacy_dtype, mask_counts, masked_operands, new_tile, partition_lanes, record, registers_read, run_and_version,
    same_layout, same_partitions, store_values, vector_operand,
)
from torchneuron.nki.isa.enums import ReduceCmd, reduce_cmd
from torchneuron.nki.memory import Buffer
from torchneuron.nki.ops import nki_op_name
from torchneuron.nki.tensor import NkiTensor


# ============================================================================ VectorE: fused, scans, statistics


@instruction("exponential", {Engine.VECTOR: F.exponential},
             min_version=4,
             hint="use nisa.activation(op=nl.exp, bias=-max) on ScalarE")
def exponential(dst: NkiTensor, src: NkiTensor, max_value: Any = 0.0, reduce_res: NkiTensor | None = None,
                reduce_cmd: reduce_cmd = reduce_cmd.idle, reduce_init: Any = 0.0,
                name: str | None = None) -> NkiInstruction:
    """``dst = exp(src - max_value)`` on VectorE with an optional running sum (v4 only, facts 4.3)."""
    instr = "exponential"
    run, version = run_and_version()
    ve = Engine.VECTOR
    src = engine_operand(instr, "src", src, ve)
    dst = engine_operand(instr, "dst", dst, ve)
    same_layout(instr, "src", src, "dst", dst)
    cmd = reduce_cmd_arg(instr, reduce_cmd,
                         (ReduceCmd.idle, ReduceCmd.reset_reduce, ReduceCmd.reduce, ReduceCmd.load_reduce))
    partitions = src.shape[0]
    reads = [src]
    shift = vector_operand(instr, "max_value", max_value, partitions, ve, reads)
    init = None
    if cmd is ReduceCmd.load_reduce:
        init = vector_operand(instr, "reduce_init", reduce_init, partitions, ve, reads)
    elif isinstance(reduce_init, NkiTensor) or float(reduce_init) != 0.0:
        fail(instr, "reduce_init must be unset (0.0) unless reduce_cmd is load_reduce")
    res = reduce_res_tile(instr, reduce_res, partitions, ve)
    with np.errstate(over="ignore", invalid="ignore"):
        y = np.exp(fp32_values(src, instr) - shift).astype(np.float32)
    writes = dve_write(run, instr, dst, y, src, cmd, "add", res, partitions, init)
    return record(run, instr, ve, reads, writes, name=name, op="exp", reduce_cmd=cmd.name,
                  reduce_res=res is not None)


def scalar_tensor_tensor(dst: NkiTensor, data: NkiTensor, op0: Any, operand0: Any, op1: Any, operand1: NkiTensor,
                         reverse0: bool = False, reverse1: bool = False, name: str | None = None) -> NkiInstruction:
    """``(data op0 operand0) op1 operand1`` on VectorE: scalar/(P,1) then full-tile operand (facts 4.3)."""
    instr = "scalar_tensor_tensor"
    run, version = run_and_version()
    spec0 = alu_operator(instr, "op0", op0)
    spec1 = alu_operator(instr, "op1", op1)
    for spec in (spec0, spec1):
        if spec.bitvec:
            fail(instr, f"bit-vector op {spec.name} is not supported; scalar_tensor_tensor takes arithmetic ops")
        if spec.trn3_only and version < 4:
            fail(instr, f"op {spec.name} needs NeuronCore-v4 (trn3)")
    ve = Engine.VECTOR
    data = engine_operand(instr, "data", data, ve)
    operand1 = engine_operand(instr, "operand1", operand1, ve)
    dst = engine_operand(instr, "dst", dst, ve)
    same_layout(instr, "data", data, "operand1", operand1)
    same_layout(instr, "data", data, "dst", dst)
    if data._alloc.buffer is Buffer.psum and operand1._alloc.buffer is Buffer.psum:
        fail(instr, "data and operand1 are both in PSUM; at most one of them may be in PSUM")
    reads = [data, operand1]
    v0 = None if spec0.arity == 1 else vector_operand(instr, "operand0", operand0, data.shape[0], ve, reads)
    y = apply_alu(spec0, fp32_values(data, instr), v0, reverse0)
    y = apply_alu(spec1, y, fp32_values(operand1, instr), reverse1)
    store_values(dst, y)
    return record(run, instr, ve, reads, [dst], name=name, op0=spec0.name, op1=spec1.name,
                  reverse0=bool(reverse0), reverse1=bool(reverse1))


def _scalar_tensor_tensor_legacy(*, data: NkiTensor, op0: Any, operand0: Any, op1: Any, operand1: NkiTensor,
                                 reverse0: bool = False, reverse1: bool = False, dtype: Any = None, mask: Any = None,
                                 name: str | None = None) -> NkiTensor:
    data = as_tensor("scalar_tensor_tensor", "data", data)
    out = new_tile(data.shape, legacy_dtype(dtype, data, operand1), Buffer.sbuf, "scalar_tensor_tensor")
    cut = masked_operands("scalar_tensor_tensor", mask, out, data, operand0, operand1)
    if cut is not None:
        dst, (d, o0, o1) = cut
        scalar_tensor_tensor(dst, d, op0, o0, op1, o1, reverse0=reverse0, reverse1=reverse1, name=name)
    return out


scalar_tensor_tensor = instruction("scalar_tensor_tensor", {Engine.VECTOR: F.scalar_tensor_tensor},
                                   legacy=_scalar_tensor_tensor_legacy,
                                   tensors=("dst", "data", "operand1"))(scalar_tensor_tensor)

_TSR_OPS = ("add", "multiply", "maximum", "minimum")


def tensor_scalar_reduce(dst: NkiTensor, data: NkiTensor, op0: Any, operand0: Any, reduce_op: Any,
                         reduce_res: NkiTensor | None = None, reverse0: bool = False,
                         reduce_cmd: reduce_cmd = reduce_cmd.reset_reduce, reduce_init: Any = None,
                         reduce_res_negate: bool = False, name: str | None = None) -> NkiInstruction:
    """``data op0 operand0`` plus a free-dim reduction into the VectorE accumulators (facts 4.3)."""
    instr = "tensor_scalar_reduce"
    run, version = run_and_version()
    spec0 = alu_operator(instr, "op0", op0)
    if spec0.bitvec:
        fail(instr, f"bit-vector op {spec0.name} is not supported; op0 must be arithmetic")
    if reverse0:
        fail(instr, "reverse0=True is not supported by tensor_scalar_reduce yet (AWS docs); swap the operands with a "
             "separate instruction")
    reduce_name = nki_op_name(reduce_op)
    if reduce_name not in _TSR_OPS:
        fail(instr, f"reduce_op {reduce_name} is not supported; use one of add, multiply, max or min")
    cmd = reduce_cmd_arg(instr, reduce_cmd, (ReduceCmd.reset_reduce, ReduceCmd.reduce, ReduceCmd.load_reduce))
    if cmd is ReduceCmd.load_reduce and reduce_init is None:
        fail(instr, "reduce_cmd=load_reduce needs reduce_init (the accumulator's starting value)")
    if cmd is not ReduceCmd.load_reduce and reduce_init is not None:
        fail(instr, "reduce_init may be set only with reduce_cmd=load_reduce")
    ve = Engine.VECTOR
    data = engine_operand(instr, "data", data, ve)
    dst = engine_operand(instr, "dst", dst, ve)
    same_layout(instr, "data", data, "dst", dst)
    partitions = data.shape[0]
    reads = [data]
    if spec0.arity == 1:
        v0 = None
    else:
        v0 = vector_operand(instr, "operand0", operand0, partitions, ve, reads)
    y = np.asarray(apply_alu(spec0, fp32_values(data, instr), v0, False), dtype=np.float32)
    init = None if reduce_init is None else vector_operand(instr, "reduce_init", reduce_init, partitions, ve, reads)
    res = reduce_res_tile(instr, reduce_res, partitions, ve)
    writes = dve_write(run, instr, dst, y, data, cmd, reduce_name, res, partitions, init,
                        negate=bool(reduce_res_negate))
    return record(run, instr, ve, reads, writes, name=name, op0=spec0.name, reduce_op=reduce_name,
                  reduce_cmd=cmd.name, reduce_res=res is not None)


def _tensor_scalar_reduce_legacy(*, data: NkiTensor, op0: Any, operand0: Any, reduce_op: Any, reduce_res: Any,
                                 reverse0: bool = False, dtype: Any = None, mask: Any = None,
                                 name: str | None = None) -> NkiTensor:
    data = as_tensor("tensor_scalar_reduce", "data", data)
    out = new_tile(data.shape, legacy_dtype(dtype, data), Buffer.sbuf, "tensor_scalar_reduce")
    cut = masked_operands("tensor_scalar_reduce", mask, out, data, operand0, reduce_res)
    if cut is not None:
        dst, (d, o0, r) = cut
        tensor_scalar_reduce(dst, d, op0, o0, reduce_op, reduce_res=r, reverse0=reverse0, name=name)
    return out


tensor_scalar_reduce = instruction("tensor_scalar_reduce", {Engine.VECTOR: F.tensor_scalar_reduce},
                                   legacy=_tensor_scalar_reduce_legacy,
                                   tensors=("dst", "data"))(tensor_scalar_reduce)

_CUMULATIVE_OPS = ("add", "subtract", "multiply", "maximum", "minimum")
_ACCUMULATE = {"add": np.add, "multiply": np.multiply, "maximum": np.maximum, "minimum": np.minimum}


@instruction("tensor_scalar_cumulative", {Engine.VECTOR: F.vector_per_input})
def tensor_scalar_cumulative(dst: NkiTensor, src: NkiTensor, op0: Any, op1: Any, imm0: Any, imm1: Any = None,
                             reduce_cmd: reduce_cmd = reduce_cmd.reset_reduce,
                             name: str | None = None) -> NkiInstruction:
    """Running ``reg = op1(op0(x, imm0), reg)`` along the free dim, on VectorE (facts 4.3, decision 11)."""
    instr = "tensor_scalar_cumulative"
    run, _version = run_and_version()
    spec0 = alu_operator(instr, "op0", op0)
    if spec0.bitvec:
        fail(instr, f"op0 must be an arithmetic op, got bit-vector op {spec0.name}")
    op1_name = alu_operator(instr, "op1", op1).name
    if op1_name not in _CUMULATIVE_OPS:
        fail(instr, f"op1 {op1_name} is not supported; the cumulative op is one of {', '.join(_CUMULATIVE_OPS)}")
    cmd = reduce_cmd_arg(instr, reduce_cmd, (ReduceCmd.reset_reduce, ReduceCmd.reduce, ReduceCmd.load_reduce))
    ve = Engine.VECTOR
    src = engine_operand(instr, "src", src, ve)
    dst = engine_operand(instr, "dst", dst, ve)
    same_layout(instr, "src", src, "dst", dst)
    for role, t in (("src", src), ("dst", dst)):
        if t.dtype.name in INT32:
            fail(instr, f"{role} dtype {t.dtype.name} is not supported (int32/uint32 are excluded by the ISA); use "
                 "bf16, fp16, fp32, fp8, (u)int8 or (u)int16")
    partitions = src.shape[0]
    reads = [src]
    v0 = None if spec0.arity == 1 else vector_operand(instr, "imm0", imm0, partitions, ve, reads)
    y = np.asarray(apply_alu(spec0, fp32_values(src, instr), v0, False), dtype=np.float32)
    state = core_state(run)
    lanes = partition_lanes(src)
    if cmd is ReduceCmd.reset_reduce:
        start = np.full((partitions, 1), REDUCE_IDENTITY.get(op1_name, 0.0), dtype=np.float32)
    elif cmd is ReduceCmd.load_reduce:
        if imm1 is None:
            fail(instr, "reduce_cmd=load_reduce needs imm1 (the accumulator's starting value)")
        start = np.broadcast_to(vector_operand(instr, "imm1", imm1, partitions, ve, reads),
                                (partitions, 1)).astype(np.float32)
    else:
        registers_read(run, instr, state.dve_valid, lanes, Engine.title(Engine.VECTOR))
        start = state.dve_acc[lanes].reshape(partitions, 1).copy()
    with np.errstate(all="ignore"):
        if op1_name == "subtract":
            # r_i = y_i - r_(i-1)  =>  r_i = s_i * cumsum(s * y)_i + (-1)^(i+1) r_0, s_k = (-1)^k
            signs = np.where(np.arange(y.shape[1]) % 2 == 0, 1.0, -1.0).astype(np.float32)
            result = signs * np.cumsum(signs * y, axis=1, dtype=np.float32) - signs * start
        else:
            result = _ACCUMULATE[op1_name].accumulate(np.concatenate([start, y], axis=1), axis=1)[:, 1:]
    result = np.asarray(result, dtype=np.float32)
    state.dve_acc[lanes] = result[:, -1]
    state.dve_valid[lanes] = True
    store_values(dst, result)
    return record(run, instr, ve, reads, [dst], name=name, op0=spec0.name, op1=op1_name, reduce_cmd=cmd.name)


def tensor_tensor_scan(dst: NkiTensor, data0: NkiTensor, data1: NkiTensor, initial: Any, op0: Any, op1: Any,
                       reverse0: bool = False, reverse1: bool = False, name: str | None = None) -> NkiInstruction:
    """``r[:, i] = op1(op0(data0[:, i], r[:, i-1]), data1[:, i])`` on VectorE (facts 4.3, decision 11)."""
    instr = "tensor_tensor_scan"
    run, _version = run_and_version()
    spec0 = alu_operator(instr, "op0", op0)
    spec1 = alu_operator(instr, "op1", op1)
    for spec in (spec0, spec1):
        if spec.bitvec or spec.arity != 2:
            fail(instr, f"op {spec.name} is not a binary arithmetic operator")
    ve = Engine.VECTOR
    data0 = engine_operand(instr, "data0", data0, ve)
    data1 = engine_operand(instr, "data1", data1, ve)
    dst = engine_operand(instr, "dst", dst, ve)
    same_layout(instr, "data0", data0, "data1", data1)
    same_layout(instr, "data0", data0, "dst", dst)
    if data0._alloc.buffer is Buffer.psum and data1._alloc.buffer is Buffer.psum:
        fail(instr, "data0 and data1 are both in PSUM; at most one of them may be in PSUM")
    partitions = data0.shape[0]
    reads = [data0, data1]
    state = np.broadcast_to(vector_operand(instr, "initial", initial, partitions, ve, reads),
                            (partitions, 1)).astype(np.float32).reshape(partitions)
    a = fp32_values(data0, instr)
    b = fp32_values(data1, instr)
    out = np.empty_like(a)
    f0, f1 = spec0.fn, spec1.fn
    with np.errstate(all="ignore"):
        for i in range(a.shape[1]):
            t = f0(state, a[:, i]) if reverse0 else f0(a[:, i], state)
            state = np.asarray(f1(b[:, i], t) if reverse1 else f1(t, b[:, i]), dtype=np.float32)
            out[:, i] = state
    store_values(dst, out)
    return record(run, instr, ve, reads, [dst], name=name, op0=spec0.name, op1=spec1.name)


def _tensor_tensor_scan_legacy(data0: NkiTensor, data1: NkiTensor, initial: Any, op0: Any, op1: Any,
                               reverse0: bool = False, reverse1: bool = False, *, dtype: Any = None, mask: Any = None,
                               name: str | None = None) -> NkiTensor:
    data0 = as_tensor("tensor_tensor_scan", "data0", data0)
    out = new_tile(data0.shape, legacy_dtype(dtype, data0, data1), Buffer.sbuf, "scan")
    cut = masked_operands("tensor_tensor_scan", mask, out, data0, data1, initial)
    if cut is not None:
        dst, (d0, d1, init) = cut
        tensor_tensor_scan(dst, d0, d1, init, op0, op1, reverse0=reverse0, reverse1=reverse1, name=name)
    return out


tensor_tensor_scan = instruction("tensor_tensor_scan", {Engine.VECTOR: F.tensor_tensor_scan},
                                 legacy=_tensor_tensor_scan_legacy,
                                 tensors=("dst", "data0", "data1"))(tensor_tensor_scan)


def bn_stats(dst: NkiTensor, data: NkiTensor, name: str | None = None) -> NkiInstruction:
    """Per-partition (count, mean, var*count) of the even and odd elements, on VectorE (facts 4.3)."""
    instr = "bn_stats"
    run, _version = run_and_version()
    ve = Engine.VECTOR
    data = engine_operand(instr, "data", data, ve)
    dst = engine_operand(instr, "dst", dst, ve)
    same_partitions(instr, "data", data, "dst", dst)
    if data.free_size > 512:
        fail(instr, f"data has {data.free_size} elements per partition, above bn_stats' limit of 512 "
             "(nl.tile_size.bn_stats_fmax): run bn_stats per 512-element chunk and combine them with one bn_aggr")
    if dst.free_size != 6:
        fail(instr, f"dst must hold 6 elements per partition (count, mean, var*count for even and odd elements), "
             f"has {dst.free_size}")
    x = fp32_values(data, instr)
    parts = []
    for half in (x[:, 0::2], x[:, 1::2]):
        count = half.shape[1]
        if count:
            mean = half.mean(axis=1, dtype=np.float32)
            m2 = ((half - mean[:, None]) ** 2).sum(axis=1, dtype=np.float32)
        else:
            mean = m2 = np.zeros(half.shape[0], dtype=np.float32)
        parts += [np.full(half.shape[0], count, dtype=np.float32), mean, m2]
    store_values(dst, np.stack(parts, axis=1))
    return record(run, instr, ve, [data], [dst], name=name)


def bn_aggr(dst: NkiTensor, data: NkiTensor, name: str | None = None) -> NkiInstruction:
    """Combine bn_stats tuples into (mean, variance) per partition, on VectorE (facts 4.3)."""
    instr = "bn_aggr"
    run, _version = run_and_version()
    ve = Engine.VECTOR
    data = engine_operand(instr, "data", data, ve)
    dst = engine_operand(instr, "dst", dst, ve)
    same_partitions(instr, "data", data, "dst", dst)
    if data.free_size % 3:
        fail(instr, f"data has {data.free_size} elements per partition; bn_aggr reads (count, mean, var*count) "
             "triples, so it must be a multiple of 3")
    if dst.free_size != 2:
        fail(instr, f"dst must hold 2 elements per partition (mean, variance), has {dst.free_size}")
    x = fp32_values(data, instr).reshape(data.shape[0], -1, 3)
    count, mean, m2 = x[..., 0], x[..., 1], x[..., 2]
    with np.errstate(all="ignore"):
        total = count.sum(axis=1)
        mu = (count * mean).sum(axis=1) / total
        var = (m2.sum(axis=1) + (count * (mean - mu[:, None]) ** 2).sum(axis=1)) / total
    store_values(dst, np.stack([mu, var], axis=1).astype(np.float32))
    return record(run, instr, ve, [data], [dst], name=name)


def _bn_legacy(fn: Callable[..., Any], width: int, label: str) -> Callable[..., NkiTensor]:
    def legacy(data: NkiTensor, *, mask: Any = None, dtype: Any = None, name: str | None = None) -> NkiTensor:
        data = as_tensor(label, "data", data)
        out = new_tile((data.shape[0], width), legacy_dtype(dtype, data), Buffer.sbuf, label)
        counts = mask_counts(label, mask, tuple(data.shape))
        src, dst = data, out
        if counts is not None:
            if 0 in counts:
                return out
            if data.ndim != 2:
                fail(label, f"a legacy mask on {label} is simulated for 2-D data only")
            src, dst = data[0:counts[0], 0:counts[1]], out[0:counts[0]]
        fn(dst, src, name=name)
        return out

    legacy.__name__ = f"_{label}_legacy"
    return legacy


bn_stats = instruction("bn_stats", {Engine.VECTOR: F.bn_stats},
                       legacy=_bn_legacy(bn_stats, 6, "bn_stats"),
                       tensors=("dst", "data"))(bn_stats)
bn_aggr = instruction("bn_aggr", {Engine.VECTOR: F.bn_aggr},
                      legacy=_bn_legacy(bn_aggr, 2, "bn_aggr"),
                      tensors=("dst", "data"))(bn_aggr)
