"""VectorE / GpSimd element-wise instructions: ``tensor_tensor``, ``tensor_scalar``,
``tensor_reduce``, ``tensor_partition_reduce``, ``tensor_copy``, ``tensor_copy_predicated``,
``memset`` and ``reciprocal``, with engine choice and integer-arithmetic helpers.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

from torchneuron.nki.cost import formulas as F
from torchneuron.nki.dtypes import resolve, round_tf32
from torchneuron.nki.errors import fail
from torchneuron.nki.instruction import Engine
from torchneuron.nki.isa.core import (
    INT32, NkiInstruction, alu_operator, apply_alu, as_enum, as_tensor, buffer_of, choose_engine, engine_operand,
    fp32_values, instruction, legacy_dtype, mask_counts, masked_operands, new_tile, raw_values, read_values, record,
    run_and_version, same_layout, same_partitions, scalar_value, store_values, vector_operand,
)
from torchneuron.nki.isa.enums import ENGINE_NAME, EngineKind, engine
from torchneuron.nki.isa.legalise import memset_through_dma, misplaced_start
from torchneuron.nki.memory import Buffer
from torchneuron.nki.ops import ALU_OPS, AluOp, nki_op_name
from torchneuron.nki.tensor import NkiTensor


# ============================================================================ VectorE / GpSimd element-wise


def _need_integers(instr: str, op_name: str, *tensors: tuple[str, NkiTensor]) -> None:
    for role, t in tensors:
        if not t.dtype.is_integer:
            fail(instr, f"bit-vector op {op_name} acts on integer bit patterns: {role} {t.name!r} is {t.dtype.name}; "
                 "use integer tiles (or .view() them as an integer dtype)")


def _int_binary(spec: AluOp, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Exact 32-bit integer arithmetic on GpSimd (decision 9)."""
    a = a.astype(np.int64)
    b = b.astype(np.int64)
    with np.errstate(all="ignore"):
        if spec.name == "divide":
            safe = np.where(b == 0, 1, b)
            return np.where(b == 0, 0, np.sign(a) * np.sign(safe) * (np.abs(a) // np.abs(safe)))
        if spec.name in ("mod", "fmod"):
            safe = np.where(b == 0, 1, b)
            return np.where(b == 0, 0, np.fmod(a, safe))
        if spec.name == "power":
            return np.rint(np.power(a.astype(np.float64), b.astype(np.float64)))
        return spec.fn(a, b)


def tensor_tensor(dst: NkiTensor, data1: NkiTensor, data2: NkiTensor, op: Any, engine: engine = engine.unknown,
                  name: str | None = None) -> NkiInstruction:
    """Element-wise ``dst = data1 op data2`` on VectorE or GpSimd (facts 4.3)."""
    instr = "tensor_tensor"
    run, version = run_and_version()
    spec = alu_operator(instr, "op", op)
    if spec.arity != 2 or spec.name == "bypass":
        fail(instr, f"op {spec.name} is unary; tensor_tensor takes a binary operator (use tensor_scalar for unary ops)")
    if spec.trn3_only and version < 4:
        fail(instr, f"op {spec.name} needs NeuronCore-v4 (trn3); target {run.target.name} is NeuronCore-v{version}")
    tiles = (as_tensor(instr, "dst", dst), as_tensor(instr, "data1", data1), as_tensor(instr, "data2", data2))
    requested = as_enum(instr, "engine", engine, EngineKind)
    in_psum = any(t._alloc.buffer is Buffer.psum for t in tiles)
    all_int32 = all(t.dtype.name in INT32 for t in tiles)
    chosen = requested
    if chosen is EngineKind.unknown:
        gpsimd = spec.name == "power" or (all_int32 and not spec.bitvec and not in_psum)
        chosen = EngineKind.gpsimd if gpsimd else EngineKind.vector
    choose_engine(instr, chosen, (EngineKind.vector, EngineKind.gpsimd))
    if spec.name == "power" and chosen is EngineKind.vector:
        fail(instr, "op power runs on GpSimd, not VectorE (engine=nisa.engine.gpsimd, with no PSUM operand)")
    if spec.bitvec and chosen is EngineKind.gpsimd:
        fail(instr, f"bit-vector op {spec.name} runs on VectorE only")
    eng = ENGINE_NAME[chosen]
    data1 = engine_operand(instr, "data1", data1, eng)
    data2 = engine_operand(instr, "data2", data2, eng)
    dst = engine_operand(instr, "dst", dst, eng)
    same_layout(instr, "data1", data1, "data2", data2)
    same_layout(instr, "data1", data1, "dst", dst)
    if data1._alloc.buffer is Buffer.psum and data2._alloc.buffer is Buffer.psum:
        fail(instr, "data1 and data2 are both in PSUM; at most one tensor_tensor input may be in PSUM: copy one "
             "of them to SBUF with nisa.tensor_copy")
    if spec.bitvec:
        _need_integers(instr, spec.name, ("data1", data1), ("data2", data2), ("dst", dst))
        result = spec.fn(raw_values(data1, instr), raw_values(data2, instr))
    elif chosen is EngineKind.gpsimd and all_int32:
        result = _int_binary(spec, raw_values(data1, instr), raw_values(data2, instr))
    else:
        result = spec.fn(fp32_values(data1, instr), fp32_values(data2, instr))
    store_values(dst, result)
    return record(run, instr, eng, [data1, data2], [dst], name=name, op=spec.name, engine_requested=requested.name)


def _tensor_tensor_legacy(data1: NkiTensor, data2: NkiTensor, op: Any, *, dtype: Any = None, mask: Any = None,
                          engine: Any = None, name: str | None = None) -> NkiTensor:
    data1 = as_tensor("tensor_tensor", "data1", data1)
    data2 = as_tensor("tensor_tensor", "data2", data2)
    out = new_tile(data1.shape, legacy_dtype(dtype, data1, data2), Buffer.sbuf, "tensor_tensor")
    cut = masked_operands("tensor_tensor", mask, out, data1, data2)
    if cut is not None:
        dst, (a, b) = cut
        tensor_tensor(dst, a, b, op, engine=EngineKind.unknown if engine is None else engine, name=name)
    return out


tensor_tensor = instruction("tensor_tensor", {Engine.VECTOR: F.tensor_tensor,
                             Engine.GPSIMD: F.gpsimd_per_input},
                            legacy=_tensor_tensor_legacy,
                            tensors=("dst", "data1", "data2"))(tensor_tensor)

_SCALAR_PAIRS = {("multiply", "add"), ("multiply", None), ("add", None)}


def tensor_scalar(dst: NkiTensor, data: NkiTensor, op0: Any, operand0: Any, reverse0: bool = False, op1: Any = None,
                  operand1: Any = None, reverse1: bool = False, engine: engine = engine.unknown,
                  name: str | None = None) -> NkiInstruction:
    """``(data op0 operand0) op1 operand1`` with scalar or (P, 1) operands (facts 4.3)."""
    instr = "tensor_scalar"
    run, version = run_and_version()
    spec0 = alu_operator(instr, "op0", op0)
    spec1 = None if op1 is None else alu_operator(instr, "op1", op1)
    if spec1 is not None and spec1.name == "bypass":
        spec1 = None
    if spec1 is None and operand1 is not None and op1 is None:
        fail(instr, "operand1 is given but op1 is None; unused op1 and operand1 must both be None")
    for spec, operand, role in ((spec0, operand0, "operand0"), (spec1, operand1, "operand1")):
        if spec is None:
            continue
        if spec.trn3_only and version < 4:
            fail(instr, f"op {spec.name} needs NeuronCore-v4 (trn3); target is NeuronCore-v{version}")
        if spec.arity == 1 and operand is not None and not (not isinstance(operand, NkiTensor) and operand == 0):
            fail(instr, f"{spec.name} is a unary op: {role} must be None or 0")
        if spec.arity == 2 and operand is None:
            raise TypeError(f"{instr}: {role} is required for the binary op {spec.name}")
    bitvec = spec0.bitvec
    if spec1 is not None and spec1.bitvec != bitvec:
        fail(instr, f"op0 {spec0.name} and op1 {spec1.name} mix bit-vector and arithmetic operators; both must be "
             "of the same kind")
    names = {spec0.name} | ({spec1.name} if spec1 else set())
    data_t = as_tensor(instr, "data", data)
    dst_t = as_tensor(instr, "dst", dst)
    requested = as_enum(instr, "engine", engine, EngineKind)
    in_psum = any(isinstance(t, NkiTensor) and t._alloc.buffer is Buffer.psum
                  for t in (data_t, dst_t, operand0, operand1))
    chosen = requested
    if chosen is EngineKind.unknown:
        chosen = EngineKind.gpsimd if ("rsqrt" in names and not in_psum and not bitvec) else EngineKind.vector
    choose_engine(instr, chosen, (EngineKind.vector, EngineKind.scalar, EngineKind.gpsimd))
    if bitvec and chosen is not EngineKind.vector:
        fail(instr, f"bit-vector ops ({', '.join(sorted(names))}) run on VectorE only")
    if chosen is EngineKind.gpsimd and "rsqrt" not in names:
        fail(instr, f"GpSimd runs tensor_scalar only for rsqrt (got {', '.join(sorted(names))}); use VectorE or "
             "ScalarE")
    pair = (spec0.name, spec1.name if spec1 else None)
    if chosen is EngineKind.scalar and version < 4 and pair not in _SCALAR_PAIRS:
        fail(instr, f"ScalarE on NeuronCore-v{version} supports only the op pairs (multiply, add), (multiply, None) "
             f"and (add, None), got ({pair[0]}, {pair[1]}); run it on VectorE")
    eng = ENGINE_NAME[chosen]
    data = engine_operand(instr, "data", data_t, eng)
    dst = engine_operand(instr, "dst", dst_t, eng)
    same_layout(instr, "data", data, "dst", dst)
    partitions = data.shape[0]
    reads = [data]
    if bitvec:
        _need_integers(instr, spec0.name, ("data", data), ("dst", dst))
        x = raw_values(data, instr)
    else:
        x = fp32_values(data, instr)
    v0 = None if spec0.arity == 1 else vector_operand(instr, "operand0", operand0, partitions, eng, reads, bitvec)
    y = apply_alu(spec0, x, v0, reverse0)
    if spec1 is not None:
        v1 = None if spec1.arity == 1 else vector_operand(instr, "operand1", operand1, partitions, eng, reads,
                                                          bitvec)
        y = apply_alu(spec1, y, v1, reverse1)
    store_values(dst, y)
    return record(run, instr, eng, reads, [dst], name=name, op0=spec0.name, op1=spec1.name if spec1 else None,
                  reverse0=bool(reverse0), reverse1=bool(reverse1), engine_requested=requested.name)


def _tensor_scalar_legacy(data: NkiTensor, op0: Any, operand0: Any, reverse0: bool = False, op1: Any = None,
                          operand1: Any = None, reverse1: bool = False, *, dtype: Any = None, mask: Any = None,
                          engine: Any = None, name: str | None = None) -> NkiTensor:
    data = as_tensor("tensor_scalar", "data", data)
    out = new_tile(data.shape, legacy_dtype(dtype, data), Buffer.sbuf, "tensor_scalar")
    cut = masked_operands("tensor_scalar", mask, out, data, operand0, operand1)
    if cut is not None:
        dst, (d, o0, o1) = cut
        tensor_scalar(dst, d, op0, o0, reverse0, op1, o1, reverse1,
                      engine=EngineKind.unknown if engine is None else engine, name=name)
    return out


tensor_scalar = instruction("tensor_scalar", {Engine.VECTOR: F.vector_copy,
                             Engine.SCALAR: F.scalar_activation,
                             Engine.GPSIMD: F.gpsimd_tensor_scalar},
                            legacy=_tensor_scalar_legacy,
                            tensors=("dst", "data"))(tensor_scalar)


def _axes(instr: str, axis: Any, ndim: int) -> tuple[int, ...]:
    """Rule 10: reduction axes are free axes, trailing and contiguous (facts 4.3)."""
    if isinstance(axis, (int, np.integer)) and not isinstance(axis, bool):
        axes = [int(axis)]
    elif isinstance(axis, (list, tuple)) and axis and all(isinstance(a, (int, np.integer)) for a in axis):
        axes = [int(a) for a in axis]
    else:
        raise TypeError(f"{instr}: axis must be an int or a list/tuple of ints, got {axis!r}")
    axes = sorted({a + ndim if a < 0 else a for a in axes})
    if axes[0] <= 0 or axes[-1] >= ndim:
        if 0 in axes:
            fail(instr, f"axis {list(axis) if isinstance(axis, (list, tuple)) else axis} includes axis 0, the "
                 "partition axis; reductions run along free axes only (to reduce across partitions use "
                 "nc_transpose, a matmul against ones, or nisa.tensor_partition_reduce)")
        fail(instr, f"axis {axes} is out of range for a {ndim}-D tile")
    if axes != list(range(axes[0], ndim)):
        fail(instr, f"axis {axes} must be the trailing contiguous free axes ending at the last dim (e.g. "
             f"{list(range(ndim - 1, ndim))} or {list(range(1, ndim))} for a {ndim}-D tile)")
    return tuple(axes)


def tensor_reduce(dst: NkiTensor, op: Any, data: NkiTensor, axis: Any, negate: bool = False, keepdims: bool = False,
                  name: str | None = None) -> NkiInstruction:
    """Reduce the trailing free axes of ``data`` on VectorE (facts 4.3, rule 10)."""
    instr = "tensor_reduce"
    run, _version = run_and_version()
    spec = alu_operator(instr, "op", op)
    if not spec.reducible:
        legal = ", ".join(sorted(o.name for o in ALU_OPS.values() if o.reducible))
        fail(instr, f"{spec.name} is not a legal reduction op; use one of {legal}")
    ve = Engine.VECTOR
    data = engine_operand(instr, "data", data, ve)
    dst = engine_operand(instr, "dst", dst, ve)
    same_partitions(instr, "data", data, "dst", dst)
    axes = _axes(instr, axis, data.ndim)
    kept = math.prod(data.shape[1:axes[0]])
    if dst.free_size != kept:
        fail(instr, f"dst has {dst.free_size} elements per partition (shape {list(dst.shape)}) but reducing axes "
             f"{list(axes)} of {list(data.shape)} leaves {kept}")
    if negate and spec.bitvec:
        fail(instr, f"negate=True applies to arithmetic reductions only, not bit-vector op {spec.name}")
    if spec.bitvec:
        _need_integers(instr, spec.name, ("data", data), ("dst", dst))
        values = read_values(data, instr)
        result = spec.reduce(values, axes, keepdims=False)
    else:
        values = read_values(data, instr).astype(np.float32)
        if data.dtype.name == "tfloat32":
            values = round_tf32(values)
        result = np.asarray(spec.reduce(values, axes, keepdims=False), dtype=np.float32)
        if negate:
            result = -result
    store_values(dst, result.reshape(dst.shape[0], -1))
    return record(run, instr, ve, [data], [dst], name=name, op=spec.name, axis=list(axes), negate=bool(negate))


def _tensor_reduce_legacy(op: Any, data: NkiTensor, axis: Any, *, mask: Any = None, dtype: Any = None,
                          negate: bool = False, keepdims: bool = False, name: str | None = None) -> NkiTensor:
    instr = "tensor_reduce"
    data = as_tensor(instr, "data", data)
    axes = _axes(instr, axis, data.ndim)
    if keepdims:
        shape = [1 if i in axes else d for i, d in enumerate(data.shape)]
    else:
        shape = [d for i, d in enumerate(data.shape) if i not in axes]
    out = new_tile(shape, legacy_dtype(dtype, data), Buffer.sbuf, "reduce")
    counts = mask_counts(instr, mask, tuple(data.shape))
    dst, src = out, data
    if counts is not None:
        if 0 in counts:
            return out
        if any(c != d for c, d in zip(counts[1:], data.shape[1:])):
            fail(instr, "a legacy mask on tensor_reduce is simulated for partition bounds only")
        dst, src = out[0:counts[0]], data[0:counts[0]]
    tensor_reduce(dst, op, src, axis, negate=negate, keepdims=keepdims, name=name)
    return out


tensor_reduce = instruction("tensor_reduce", {Engine.VECTOR: F.tensor_reduce},
                            legacy=_tensor_reduce_legacy,
                            tensors=("dst", "data"))(tensor_reduce)

_PARTITION_REDUCE = ("add", "average", "maximum", "bitwise_or", "bitwise_and")


def tensor_partition_reduce(dst: NkiTensor, op: Any, data: NkiTensor, name: str | None = None) -> NkiInstruction:
    """Reduce across partitions on GpSimd into a one-partition ``dst`` (facts 4.3; decision 15)."""
    instr = "tensor_partition_reduce"
    run, _version = run_and_version()
    op_name = nki_op_name(op)
    op_name = {"mean": "average", "max": "maximum"}.get(op_name, op_name)
    if op_name not in _PARTITION_REDUCE:
        fail(instr, f"op {op_name} is not supported; tensor_partition_reduce reduces with "
             f"{', '.join(_PARTITION_REDUCE)}")
    gp = Engine.GPSIMD
    data = engine_operand(instr, "data", data, gp)
    dst = engine_operand(instr, "dst", dst, gp)
    if dst.shape[0] != 1 or dst.free_size != data.free_size:
        fail(instr, f"dst must be one partition with data's {data.free_size} elements per partition, got shape "
             f"{list(dst.shape)}")
    if op_name.startswith("bitwise"):
        _need_integers(instr, op_name, ("data", data), ("dst", dst))
        values = raw_values(data, instr)
        result = (np.bitwise_or if op_name == "bitwise_or" else np.bitwise_and).reduce(values, axis=0)
    else:
        values = fp32_values(data, instr)
        if op_name == "maximum":
            result = values.max(axis=0)
        else:
            result = values.sum(axis=0, dtype=np.float32)
            if op_name == "average":
                result = result / np.float32(values.shape[0])
    store_values(dst, result.reshape(1, -1))
    return record(run, instr, gp, [data], [dst], name=name, op=op_name)


def _tensor_partition_reduce_legacy(op: Any, data: NkiTensor, *, mask: Any = None, dtype: Any = None,
                                    name: str | None = None) -> NkiTensor:
    data = as_tensor("tensor_partition_reduce", "data", data)
    out = new_tile((1,) + tuple(data.shape[1:]), legacy_dtype(dtype, data), Buffer.sbuf, "partition_reduce")
    if mask is not None:
        fail("tensor_partition_reduce", "a legacy mask on tensor_partition_reduce is not simulated; slice the input")
    tensor_partition_reduce(out, op, data, name=name)
    return out


tensor_partition_reduce = instruction("tensor_partition_reduce", {Engine.GPSIMD: F.gpsimd_per_input},
                                      legacy=_tensor_partition_reduce_legacy,
                                      tensors=("dst", "data"))(tensor_partition_reduce)


def tensor_copy(dst: NkiTensor, src: NkiTensor, engine: engine = engine.unknown,
                name: str | None = None) -> NkiInstruction:
    """Copy between SBUF/PSUM tiles (facts 4.3): bit-exact for equal dtypes, else a cast through fp32."""
    instr = "tensor_copy"
    run, version = run_and_version()
    requested = as_enum(instr, "engine", engine, EngineKind)
    chosen = EngineKind.vector if requested is EngineKind.unknown else requested
    choose_engine(instr, chosen, (EngineKind.vector, EngineKind.scalar, EngineKind.gpsimd))
    if chosen is EngineKind.scalar and version < 3:
        fail(instr, "tensor_copy is not supported on ScalarE on NeuronCore-v2: use nisa.activation(op=nl.copy) or "
             "VectorE")
    eng = ENGINE_NAME[chosen]
    src = engine_operand(instr, "src", src, eng)
    dst = engine_operand(instr, "dst", dst, eng)
    same_layout(instr, "src", src, "dst", dst)
    same = src.dtype.name == dst.dtype.name
    store_values(dst, raw_values(src, instr) if same else fp32_values(src, instr))
    return record(run, instr, eng, [src], [dst], name=name, engine_requested=requested.name, cast=not same)


def _tensor_copy_legacy(src: NkiTensor, *, mask: Any = None, dtype: Any = None, engine: Any = None,
                        name: str | None = None) -> NkiTensor:
    src = as_tensor("tensor_copy", "src", src)
    out = new_tile(src.shape, legacy_dtype(dtype, src), Buffer.sbuf, "copy")
    cut = masked_operands("tensor_copy", mask, out, src)
    if cut is not None:
        dst, (s,) = cut
        tensor_copy(dst, s, engine=EngineKind.unknown if engine is None else engine, name=name)
    return out


tensor_copy = instruction("tensor_copy", {Engine.VECTOR: F.vector_copy,
                           Engine.SCALAR: F.scalar_activation,
                           Engine.GPSIMD: F.gpsimd_per_input},
                          legacy=_tensor_copy_legacy,
                          tensors=("dst", "src"))(tensor_copy)


def tensor_copy_predicated(dst: NkiTensor, src: Any, predicate: NkiTensor, reverse_pred: bool = False,
                           name: str | None = None) -> NkiInstruction:
    """Copy ``src`` (tile or scalar) into ``dst`` where ``predicate`` is non-zero, on VectorE (facts 4.3)."""
    instr = "tensor_copy_predicated"
    run, _version = run_and_version()
    ve = Engine.VECTOR
    dst = engine_operand(instr, "dst", dst, ve)
    predicate = engine_operand(instr, "predicate", predicate, ve)
    same_layout(instr, "dst", dst, "predicate", predicate)
    if predicate.dtype.name not in ("uint8", "uint16", "uint32", "bool_"):
        fail(instr, f"predicate dtype is {predicate.dtype.name}; it must be uint8, uint16 or uint32 (or bool_, "
             "stored as uint8)")
    keep = raw_values(predicate, instr) != 0
    if reverse_pred:
        keep = ~keep
    reads = [predicate]
    if isinstance(src, NkiTensor):
        src = engine_operand(instr, "src", src, ve)
        same_layout(instr, "dst", dst, "src", src)
        if src.dtype.name != dst.dtype.name:
            fail(instr, f"src dtype {src.dtype.name} differs from dst dtype {dst.dtype.name}; they must match")
        if src._alloc.buffer is Buffer.psum and predicate._alloc.buffer is Buffer.psum:
            fail(instr, "src and predicate are both in PSUM; at most one of them may be in PSUM")
        values = raw_values(src, instr)
        reads.insert(0, src)
    else:
        values = np.asarray(scalar_value(instr, "src", src))
    store_values(dst, values, where=keep)
    return record(run, instr, ve, reads, [dst], name=name, reverse_pred=bool(reverse_pred))


def _tensor_copy_predicated_legacy(*, src: Any, dst: NkiTensor, predicate: NkiTensor, reverse_pred: bool = False,
                                   mask: Any = None, dtype: Any = None, name: str | None = None) -> NkiTensor:
    cut = masked_operands("tensor_copy_predicated", mask, dst, src, predicate)
    if cut is not None:
        d, (s, p) = cut
        tensor_copy_predicated(d, s, p, reverse_pred=reverse_pred, name=name)
    return dst


tensor_copy_predicated = instruction("tensor_copy_predicated", {Engine.VECTOR: F.tensor_copy_predicated},
                                     legacy=_tensor_copy_predicated_legacy,
                                     tensors=("dst", "predicate"))(tensor_copy_predicated)


def memset(dst: NkiTensor, value: Any, engine: engine = engine.unknown, name: str | None = None) -> NkiInstruction:
    """Fill ``dst`` with a constant on VectorE or GpSimd; the value type must match dst's dtype (facts 4.3)."""
    instr = "memset"
    run, _version = run_and_version()
    requested = as_enum(instr, "engine", engine, EngineKind)
    chosen = EngineKind.vector if requested is EngineKind.unknown else requested
    choose_engine(instr, chosen, (EngineKind.vector, EngineKind.gpsimd))
    eng = ENGINE_NAME[chosen]
    if misplaced_start(dst):
        return memset_through_dma(dst, value, requested, name)
    dst = engine_operand(instr, "dst", dst, eng)
    is_int = isinstance(value, (bool, np.bool_, int, np.integer))
    if not is_int and not isinstance(value, (float, np.floating)):
        raise TypeError(f"{instr}: value must be a compile-time number, got {type(value).__name__}")
    if dst.dtype.is_packed_mx and value != 0:
        fail(instr, f"value {value!r} into {dst.name!r} ({dst.dtype.name}): a packed MX tile can only be memset "
             "to 0 (nki-api-facts.md 3.8)")
    if dst.dtype.is_integer:
        if not is_int:
            example = int(value) if math.isfinite(value) else 0
            fail(instr, f"value {value!r} is a float but dst {dst.name!r} is {dst.dtype.name}; since NKI 0.3.0 the "
                 f"value type must match the dst dtype: pass an int (e.g. value={example})")
        info = np.iinfo(dst.dtype.storage)
        if not info.min <= int(value) <= info.max:
            fail(instr, f"value {int(value)} does not fit dst dtype {dst.dtype.name} [{info.min}, {info.max}]")
    store_values(dst, np.asarray(int(value) if is_int else float(value)))
    return record(run, instr, eng, [], [dst], name=name, value=float(value), engine_requested=requested.name)


def _memset_legacy(shape: Sequence[int], value: Any, dtype: Any, *, mask: Any = None, engine: Any = None,
                   buffer: Any = None, name: str | None = None) -> NkiTensor:
    nki_dtype = resolve(dtype)
    out = new_tile(shape, nki_dtype, buffer_of(buffer), "memset")
    if nki_dtype.is_integer and isinstance(value, (float, np.floating)) and math.isfinite(value):
        value = int(value)  # legacy memset cast the value silently
    cut = masked_operands("memset", mask, out)
    if cut is not None:
        memset(cut[0], value, engine=EngineKind.unknown if engine is None else engine, name=name)
    return out


memset = instruction("memset", {Engine.VECTOR: F.memset,
                      Engine.GPSIMD: F.gpsimd_per_input},
                     legacy=_memset_legacy,
                     tensors=("dst",))(memset)


def reciprocal(dst: NkiTensor, data: NkiTensor, name: str | None = None) -> NkiInstruction:
    """``1 / data`` in fp32 on VectorE (facts 4.3)."""
    instr = "reciprocal"
    run, _version = run_and_version()
    ve = Engine.VECTOR
    data = engine_operand(instr, "data", data, ve)
    dst = engine_operand(instr, "dst", dst, ve)
    same_layout(instr, "data", data, "dst", dst)
    with np.errstate(divide="ignore", invalid="ignore"):
        store_values(dst, np.float32(1.0) / fp32_values(data, instr))
    return record(run, instr, ve, [data], [dst], name=name, op="reciprocal")


def _reciprocal_legacy(data: NkiTensor, *, dtype: Any = None, mask: Any = None, name: str | None = None) -> NkiTensor:
    data = as_tensor("reciprocal", "data", data)
    out = new_tile(data.shape, legacy_dtype(dtype, data), Buffer.sbuf, "reciprocal")
    cut = masked_operands("reciprocal", mask, out, data)
    if cut is not None:
        reciprocal(cut[0], cut[1][0], name=name)
    return out


reciprocal = instruction("reciprocal", {Engine.VECTOR: F.reciprocal},
                         legacy=_reciprocal_legacy,
                         tensors=("dst", "data"))(reciprocal)


def cast_legacy_result(out: NkiTensor, dtype: Any, tile_name: str) -> NkiTensor:
    """A legacy call's result in ``dtype``: when it differs from ``out``'s, legacy NKI inserts
    "an additional cast instruction" - a ``tensor_copy`` into a new SBUF tile ``tile_name``."""
    if dtype is None or resolve(dtype).name == out.dtype.name:
        return out
    cast = new_tile(out.shape, resolve(dtype), Buffer.sbuf, tile_name)
    tensor_copy(cast, out)
    return cast
