"""Per-instruction cycle formulas of the NKI cost model: TensorE, VectorE, ScalarE and GpSimd
cycles of one instruction from its operands and attributes (facts 9 and decisions 1-5 of the
:mod:`torchneuron.nki.cost` docstring), with the operand helpers they share (N, on-chip
operands, strides, contiguity, attribute names), the engine clocks and the per-engine
dependency overhead.
"""

from __future__ import annotations

from typing import Any, Iterable, Sequence

from torchneuron.hardware.specs import ChipSpec
from torchneuron.nki.cost.constants import (
    ACCESS_START,
    FP32_MATMUL_FACTOR,
    GPSIMD_START,
    LOAD_STATIONARY_SPEEDUP,
    MIN_II,
    MIN_II_DYNAMIC,
    MM_FLOOR,
    MM_INIT_LATENCY,
    SCALAR_DEPENDENT_SPACING,
    STRIDE_PENALTY_BYTES,
    VECTOR_STATIC_OVERHEAD,
    _FP8,
    _ON_CHIP,
    _TWO_BYTE_FLOAT,
)
from torchneuron.nki.instruction import Engine, Instruction, Operand


def _name(value: Any) -> str | None:
    """An op / enum / mode attribute as a lowercase canonical name."""
    if value is None:
        return None
    if isinstance(value, bool):
        return str(value).lower()
    if not isinstance(value, str):
        try:
            from torchneuron.nki.ops import nki_op_name

            return nki_op_name(value)
        except (TypeError, ImportError):
            pass
        value = getattr(value, "name", None) or getattr(value, "__name__", None) or str(value)
    value = value.lower()
    if "." in value:
        value = value.rsplit(".", 1)[-1]
    return {"max": "maximum", "min": "minimum", "sub": "subtract", "mul": "multiply"}.get(value, value)


def _gen(chip: ChipSpec) -> int:
    """NeuronCore generation number: 2 (Trn1), 3 (Trn2), 4 (Trn3)."""
    try:
        return int(chip.neuroncore_version.lstrip("v"))
    except ValueError:
        return 3


def _clock_ghz(chip: ChipSpec, engine: str) -> float:
    return {
        Engine.TENSOR: chip.tensor_clock_hz, Engine.VECTOR: chip.vector_clock_hz,
        Engine.SCALAR: chip.scalar_clock_hz, Engine.GPSIMD: chip.gpsimd_clock_hz,
    }.get(engine, chip.vector_clock_hz) / 1e9


def _dependency_cycles(engine: str) -> float:
    """Decision 6: static overhead a dependent instruction pays on ``engine``."""
    return {
        Engine.VECTOR: VECTOR_STATIC_OVERHEAD,  # facts 9 VectorE
        Engine.SCALAR: SCALAR_DEPENDENT_SPACING - MIN_II,  # facts 9 overheads (264 observed - MIN_II)
        Engine.TENSOR: MM_INIT_LATENCY,  # facts 9 TensorE
        Engine.GPSIMD: ACCESS_START,  # facts 9 overheads (~60-cycle access start, v2)
    }.get(engine, 0)


def _on_chip(ops: Iterable[Operand]) -> list[Operand]:
    return [o for o in ops if o.buffer in _ON_CHIP]


def _contiguous(o: Operand) -> bool:
    return o.free_elements <= 1 or o.inner_stride_bytes == o.itemsize


def _n(ins: Instruction) -> tuple[int, list[Operand]]:
    """N (elements per partition of the largest on-chip operand, reads first) and the full-size reads."""
    reads = _on_chip(ins.reads)
    pool = reads or _on_chip(ins.writes) or list(ins.reads) + list(ins.writes)
    n = max((o.free_elements for o in pool), default=1)
    full = [o for o in reads if o.free_elements == n]
    return max(n, 1), full


def _strided(ops: Iterable[Operand]) -> bool:
    """Decision 5 / facts 9: an inner stride above 16 B halves SBUF/PSUM bandwidth."""
    return any(o.free_elements > 1 and o.inner_stride_bytes > STRIDE_PENALTY_BYTES for o in ops)


def _tensor_cycles(ins: Instruction, gen: int) -> tuple[float, str]:
    op = ins.opcode
    sbuf_reads = [o for o in ins.reads if o.buffer == "sbuf"] or list(ins.reads)
    if op == "nc_transpose":
        data = sbuf_reads[0] if sbuf_reads else (ins.writes[0] if ins.writes else None)
        p, f = (data.partitions, data.free_elements) if data else (1, 1)
        if data is not None and _strided([data]):
            f *= 2
        cycles = max(p, min(MM_FLOOR, f))  # facts 9 TensorE: nc_transpose max(P, min(64, F))
        if data is not None and data.dtype == "float32":
            cycles *= 2 if gen >= 3 else FP32_MATMUL_FACTOR  # decision 4
        return cycles, "nc_transpose max(P, min(64, F))"
    attrs = ins.attrs
    dst = ins.writes[0] if ins.writes else None
    ns = attrs.get("stationary_free")
    nm = attrs.get("moving_free")
    if ns is None:
        ns = dst.partitions if dst is not None else (sbuf_reads[0].free_elements if sbuf_reads else 1)
    if nm is None:
        nm = dst.free_elements if dst is not None else (sbuf_reads[-1].free_elements if sbuf_reads else 1)
    ns, nm = int(ns), int(nm)
    moving = sbuf_reads[1] if len(sbuf_reads) > 1 else None
    if moving is not None and _strided([moving]):
        nm *= 2  # decision 5
    mm = max(min(MM_FLOOR, ns), nm)  # facts 9 TensorE: MultiplyMoving
    ls = ns / LOAD_STATIONARY_SPEEDUP  # facts 9 TensorE: LoadStationary overlaps MM, up to 4x faster
    factor = 1.0
    formula = "matmul max(min(64, Ns), Nm)"
    if any(o.dtype == "float32" for o in sbuf_reads[:2]):
        factor = FP32_MATMUL_FACTOR  # facts 9 TensorE: 4x for fp32
        if _truthy(attrs.get("is_transpose")) and gen >= 3:
            factor /= 2  # facts 9 / 4.1: v3 transpose mode makes fp32 transposes 2x faster
        if _truthy(attrs.get("is_stationary_onezero")) or _truthy(attrs.get("is_moving_onezero")):
            factor /= 2  # facts 9 / 4.1: is_*_onezero up to 2x for fp32
        formula += " x fp32"
    # double_row (facts 9: K=256 in the same time) and MX (4x) change FLOPs, not cycles.
    return max(mm, ls) * factor, formula


def _all_dtypes(ops: Sequence[Operand], allowed: frozenset[str]) -> bool:
    return bool(ops) and all(o.dtype in allowed for o in ops)


def _vector_cycles(ins: Instruction, gen: int) -> tuple[float, str]:
    op = ins.opcode
    attrs = ins.attrs
    n, full = _n(ins)
    operands = _on_chip(ins.reads) + _on_chip(ins.writes)
    big = [o for o in operands if o.free_elements > 1]
    n_eff = 2 * n if _strided(operands) else n  # decision 5
    fast_types = _TWO_BYTE_FLOAT | (_FP8 if gen >= 4 else frozenset())  # decision 3
    perf = 1.0
    floor = MIN_II
    extra = 0.0
    if op == "tensor_tensor":
        inputs = _on_chip(ins.reads)[:2]
        buffers = {o.buffer for o in inputs}
        op_name = _name(attrs.get("op"))
        # facts 9 VectorE tensor_tensor: N with PSUM+SBUF inputs, or all-bf16 SBUF add/mul/sub contiguous
        fast = buffers == {"psum", "sbuf"} or (
            all(o.buffer == "sbuf" for o in operands) and _all_dtypes(operands, frozenset(("bfloat16",)))
            and op_name in ("add", "multiply", "subtract") and all(_contiguous(o) for o in operands))
        base, formula = (n_eff, "tensor_tensor max(MIN_II, N)") if fast else \
            (2 * n_eff, "tensor_tensor max(MIN_II, 2N)")
        if gen >= 3 and inputs and all(o.buffer == "sbuf" for o in inputs) and _all_dtypes(operands, fast_types):
            perf = 2.0  # facts 9: v3 tensor_tensor 2x, both inputs in SBUF, all bf16/fp16
    elif op in ("tensor_scalar", "tensor_copy"):
        base, formula = n_eff, f"{op} max(MIN_II, N)"  # facts 9 VectorE
        if gen >= 3 and _all_dtypes(operands, fast_types):
            # facts 9: v3 performance mode, 4x all-SBUF contiguous, 2x otherwise
            all_sbuf = all(o.buffer == "sbuf" for o in operands)
            perf = 4.0 if all_sbuf and all(_contiguous(o) for o in big) else 2.0
    elif op == "tensor_reduce":
        src = _on_chip(ins.reads)[:1]
        fast = (_all_dtypes(src + _on_chip(ins.writes), frozenset(("bfloat16",)))
                and _name(attrs.get("op")) in ("add", "maximum"))
        base, formula = (n_eff / 2, "tensor_reduce N/2") if fast else (n_eff, "tensor_reduce N")  # facts 9
    elif op == "reciprocal":
        base, formula = 8 * n_eff, "reciprocal max(MIN_II, 8N)"  # facts 9 VectorE reciprocal
    elif op == "memset":
        value = attrs.get("value", None)
        zero = value is not None and _is_zero(value)
        dst = _on_chip(ins.writes)
        if zero and _all_dtypes(dst, _TWO_BYTE_FLOAT):
            base, formula = n_eff / 2, "memset max(MIN_II, N/2)"  # facts 9 memset zero bf16/fp16
        else:
            base, formula = n_eff, "memset max(MIN_II, N)"
    elif op == "bn_stats":
        base, formula = n_eff, "bn_stats max(MIN_II, N)"  # facts 9
    elif op == "bn_aggr":
        base, formula = 13 * n_eff / 3, "bn_aggr max(MIN_II, 13N/3)"  # facts 9
    elif op == "tensor_tensor_scan":
        base, formula = 2 * n_eff, "tensor_tensor_scan max(MIN_II, 2N)"  # facts 9
    elif op == "tensor_scalar_reduce":
        base, formula, extra = n_eff, "tensor_scalar_reduce max(MIN_II, N) + MIN_II", MIN_II  # facts 9
    elif op == "scalar_tensor_tensor":
        fast = (_all_dtypes(operands, frozenset(("bfloat16",))) and _name(attrs.get("op0")) == "subtract"
                and _name(attrs.get("op1")) == "multiply" and n % 2 == 0)
        base, formula = (n_eff, "scalar_tensor_tensor N") if fast else (2 * n_eff, "scalar_tensor_tensor 2N")
    elif op == "tensor_copy_predicated":
        psum = any(o.buffer == "psum" for o in operands)
        base, formula = (n_eff, "tensor_copy_predicated N") if psum else (2 * n_eff, "tensor_copy_predicated 2N")
    elif op in ("nc_stream_shuffle", "dropout", "range_select", "select_reduce", "nc_transpose"):
        base, formula = n_eff, f"{op} max(MIN_II, N)"  # facts 9 VectorE
    elif op in ("max8", "nc_find_index8", "nc_match_replace8"):
        base, formula = n_eff, f"{op} N"  # facts 9 (decision 2 for match_replace8)
    elif op.startswith("tensor_copy_dynamic"):
        base, formula, floor = n_eff, f"{op} max(MIN_II_DYNAMIC, N)", MIN_II_DYNAMIC  # facts 9
    elif op == "exponential":
        base, formula = n_eff / 4, "exponential max(MIN_II, N/4)"  # facts 9: v4 4x ScalarE exp
    else:
        inputs = max(1, len(full))
        base, formula = inputs * n_eff, f"{op} max(MIN_II, {inputs}N) (rule of thumb)"  # decision 2
    return max(floor, base / perf) + extra, formula + (f" /{perf:g} perf mode" if perf != 1 else "")


def _scalar_cycles(ins: Instruction, gen: int) -> tuple[float, str]:
    op = ins.opcode
    n, _ = _n(ins)
    operands = _on_chip(ins.reads) + _on_chip(ins.writes)
    n_eff = 2 * n if _strided(operands) else n  # decision 5
    perf = 1.0
    extra = 0.0
    formula = f"{op} max(MIN_II, N)"  # facts 9 ScalarE activation
    if op == "activation_reduce" or (op in ("activation", "activate2") and ins.attrs.get("reduce_res") is not None
                                     and ins.attrs.get("reduce_res") is not False):
        extra = MIN_II  # facts 9: activation_reduce max(MIN_II, N) + MIN_II (read-out)
        formula += " + MIN_II"
    elif op in ("tensor_scalar", "tensor_copy") and gen >= 4 and _all_dtypes(operands, _TWO_BYTE_FLOAT):
        perf = 2.0  # facts 9: v4 ScalarE 2x for bf16/fp16 tensor_scalar and tensor_copy
        formula += " /2 (v4 bf16)"
    return max(MIN_II, n_eff / perf) + extra, formula


def _gpsimd_cycles(ins: Instruction, gen: int) -> tuple[float, str]:
    op = ins.opcode
    attrs = ins.attrs
    n, full = _n(ins)
    operands = _on_chip(ins.reads) + _on_chip(ins.writes)
    n_eff = 2 * n if _strided(operands) else n  # decision 5
    if op in ("iota", "affine_select"):
        dst = _on_chip(ins.writes)
        m = max((o.free_elements for o in dst), default=n) if op == "iota" else n
        if _strided(dst):
            m *= 2
        return GPSIMD_START + m, f"{op} 150 + N"  # facts 9 GpSimd
    if op == "local_gather":
        reads = _on_chip(ins.reads)
        src = reads[0] if reads else None
        index = reads[1] if len(reads) > 1 else None
        e = int(attrs.get("num_elem_per_idx") or 1)
        valid = attrs.get("num_valid_indices")
        if valid is None:
            # legacy docstring: default index.size / (index.shape[0] / 16) per GpSimd core
            valid = (index.free_elements * 16) if index is not None else n
        dtype_size = src.itemsize if src is not None else 4
        c = ((28 + 4 * e) / (4 * e)) / min(4 / dtype_size, e)  # facts 9 local_gather
        return GPSIMD_START + int(valid) * e / c, "local_gather 150 + valid*e/C"
    if op == "tensor_scalar" and "rsqrt" in (_name(attrs.get("op0")), _name(attrs.get("op1")), _name(attrs.get("op"))):
        return GPSIMD_START + 4 * n_eff, "tensor_scalar(rsqrt) 150 + 4N"  # facts 9 ScalarE note; decision 2
    inputs = max(1, len(full))
    return GPSIMD_START + inputs * n_eff, f"{op} 150 + {inputs}N (decision)"  # decision 2


def _is_zero(value: Any) -> bool:
    try:
        return float(value) == 0.0
    except (TypeError, ValueError):
        return False


def _truthy(value: Any) -> bool:
    if isinstance(value, str):
        return value.lower() not in ("", "false", "none", "0")
    return bool(value)
