"""Per-instruction cost formulas of the NKI cost model: TensorE, VectorE, ScalarE and GpSimd
cycles of one instruction from its operands and attributes (facts 9 and decisions 1-5 of the
:mod:`torchneuron.nki.cost` docstring), with the operand helpers they share (N, on-chip
operands, strides, contiguity, attribute names), the engine clocks and the per-engine
dependency overhead. Each instruction's declaration (:mod:`torchneuron.nki.registry`) names
the formula of each engine it runs on; a formula never dispatches on the opcode.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterable, Sequence

from torchneuron.hardware.specs import ChipSpec
from torchneuron.nki.cost.constants import (
    ACCESS_START,
    FP8_DTYPES,
    FP32_MATMUL_FACTOR,
    GPSIMD_START,
    LOAD_STATIONARY_SPEEDUP,
    MIN_II,
    MM_FLOOR,
    MM_INIT_LATENCY,
    ON_CHIP_BUFFERS,
    SCALAR_DEPENDENT_SPACING,
    STRIDE_PENALTY_BYTES,
    TWO_BYTE_FLOAT_DTYPES,
    VECTOR_STATIC_OVERHEAD,
)
from torchneuron.nki.instruction import Engine, Instruction, Operand

if TYPE_CHECKING:  # annotations only: model.py imports this module
    from torchneuron.nki.cost.model import CostModel, InstructionCost


def enum_name(value: Any) -> str | None:
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


def nc_generation(chip: ChipSpec) -> int:
    """NeuronCore generation number: 2 (Trn1), 3 (Trn2), 4 (Trn3)."""
    try:
        return int(chip.neuroncore_version.lstrip("v"))
    except ValueError:
        return 3


def clock_ghz(chip: ChipSpec, engine: str) -> float:
    return {
        Engine.TENSOR: chip.tensor_clock_hz, Engine.VECTOR: chip.vector_clock_hz,
        Engine.SCALAR: chip.scalar_clock_hz, Engine.GPSIMD: chip.gpsimd_clock_hz,
    }.get(engine, chip.vector_clock_hz) / 1e9


def dependency_cycles(engine: str) -> float:
    """Decision 6: static overhead a dependent instruction pays on ``engine``."""
    return {
        Engine.VECTOR: VECTOR_STATIC_OVERHEAD,  # facts 9 VectorE
        Engine.SCALAR: SCALAR_DEPENDENT_SPACING - MIN_II,  # facts 9 overheads (264 observed - MIN_II)
        Engine.TENSOR: MM_INIT_LATENCY,  # facts 9 TensorE
        Engine.GPSIMD: ACCESS_START,  # facts 9 overheads (~60-cycle access start, v2)
    }.get(engine, 0)


def on_chip_operands(ops: Iterable[Operand]) -> list[Operand]:
    return [o for o in ops if o.buffer in ON_CHIP_BUFFERS]


def is_contiguous_operand(o: Operand) -> bool:
    return o.free_elements <= 1 or o.inner_stride_bytes == o.itemsize


def _n(ins: Instruction) -> tuple[int, list[Operand]]:
    """N (elements per partition of the largest on-chip operand, reads first) and the full-size reads."""
    reads = on_chip_operands(ins.reads)
    pool = reads or on_chip_operands(ins.writes) or list(ins.reads) + list(ins.writes)
    n = max((o.free_elements for o in pool), default=1)
    full = [o for o in reads if o.free_elements == n]
    return max(n, 1), full


def _strided(ops: Iterable[Operand]) -> bool:
    """Decision 5 / facts 9: an inner stride above 16 B halves SBUF/PSUM bandwidth."""
    return any(o.free_elements > 1 and o.inner_stride_bytes > STRIDE_PENALTY_BYTES for o in ops)


# ------------------------------------------------------------------ per-instruction formulas
# Each formula takes the instruction record and the cost model (``model.gen`` is the
# NeuronCore generation) and returns (cycles of its engine's clock, the formula's text).
# They are named in the instructions' declarations (torchneuron.nki.isa, via
# torchneuron.nki.registry); nothing dispatches on opcode here.


def matmul(ins: Instruction, model: "CostModel") -> tuple[float, str]:
    """TensorE nc_matmul: max(min(64, Ns), Nm), LoadStationary overlapped, x4 fp32 (facts 9 TensorE)."""
    gen = model.gen
    sbuf_reads = [o for o in ins.reads if o.buffer == "sbuf"] or list(ins.reads)
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
        if is_set(attrs.get("is_transpose")) and gen >= 3:
            factor /= 2  # facts 9 / 4.1: v3 transpose mode makes fp32 transposes 2x faster
        if is_set(attrs.get("is_stationary_onezero")) or is_set(attrs.get("is_moving_onezero")):
            factor /= 2  # facts 9 / 4.1: is_*_onezero up to 2x for fp32
        formula += " x fp32"
    # double_row (facts 9: K=256 in the same time) and MX (4x) change FLOPs, not cycles.
    return max(mm, ls) * factor, formula


def tensor_engine_transpose(ins: Instruction, model: "CostModel") -> tuple[float, str]:
    """TensorE nc_transpose: max(P, min(64, F)) (facts 9), fp32 x4 on v2, x2 on v3+ (decision 4)."""
    sbuf_reads = [o for o in ins.reads if o.buffer == "sbuf"] or list(ins.reads)
    data = sbuf_reads[0] if sbuf_reads else (ins.writes[0] if ins.writes else None)
    p, f = (data.partitions, data.free_elements) if data else (1, 1)
    if data is not None and _strided([data]):
        f *= 2
    cycles = max(p, min(MM_FLOOR, f))
    if data is not None and data.dtype == "float32":
        cycles *= 2 if model.gen >= 3 else FP32_MATMUL_FACTOR
    return cycles, "nc_transpose max(P, min(64, F))"


def _all_dtypes(ops: Sequence[Operand], allowed: frozenset[str]) -> bool:
    return bool(ops) and all(o.dtype in allowed for o in ops)


class _Shape:
    """What the VectorE / ScalarE / GpSimd formulas read: N, the full-size reads, on-chip operands."""

    __slots__ = ("n", "full", "operands", "n_eff")

    def __init__(self, ins: Instruction) -> None:
        self.n, self.full = _n(ins)
        self.operands = on_chip_operands(ins.reads) + on_chip_operands(ins.writes)
        self.n_eff = 2 * self.n if _strided(self.operands) else self.n  # decision 5


def _vector(base: float, formula: str, perf: float = 1.0, floor: float = MIN_II,
            extra: float = 0.0) -> tuple[float, str]:
    """A VectorE cost: the N term divided by the performance mode, floored (decisions 1, 3)."""
    return max(floor, base / perf) + extra, formula + (f" /{perf:g} perf mode" if perf != 1 else "")


def _fast_types(model: "CostModel") -> frozenset[str]:
    return TWO_BYTE_FLOAT_DTYPES | (FP8_DTYPES if model.gen >= 4 else frozenset())  # decision 3


def tensor_tensor(ins: Instruction, model: "CostModel") -> tuple[float, str]:
    """VectorE tensor_tensor: N with PSUM+SBUF inputs or all-bf16 contiguous add/mul/sub, else 2N (facts 9)."""
    s = _Shape(ins)
    inputs = on_chip_operands(ins.reads)[:2]
    buffers = {o.buffer for o in inputs}
    op_name = enum_name(ins.attrs.get("op"))
    fast = buffers == {"psum", "sbuf"} or (
        all(o.buffer == "sbuf" for o in s.operands) and _all_dtypes(s.operands, frozenset(("bfloat16",)))
        and op_name in ("add", "multiply", "subtract") and all(is_contiguous_operand(o) for o in s.operands))
    base, formula = (s.n_eff, "tensor_tensor max(MIN_II, N)") if fast else \
        (2 * s.n_eff, "tensor_tensor max(MIN_II, 2N)")
    perf = 1.0
    if model.gen >= 3 and inputs and all(o.buffer == "sbuf" for o in inputs) and \
            _all_dtypes(s.operands, _fast_types(model)):
        perf = 2.0  # facts 9: v3 tensor_tensor 2x, both inputs in SBUF, all bf16/fp16
    return _vector(base, formula, perf)


def vector_copy(ins: Instruction, model: "CostModel") -> tuple[float, str]:
    """VectorE tensor_scalar / tensor_copy: max(MIN_II, N), v3+ performance modes /4 or /2 (facts 9)."""
    s = _Shape(ins)
    perf = 1.0
    if model.gen >= 3 and _all_dtypes(s.operands, _fast_types(model)):
        # facts 9: v3 performance mode, 4x all-SBUF contiguous, 2x otherwise
        big = [o for o in s.operands if o.free_elements > 1]
        all_sbuf = all(o.buffer == "sbuf" for o in s.operands)
        perf = 4.0 if all_sbuf and all(is_contiguous_operand(o) for o in big) else 2.0
    return _vector(s.n_eff, f"{ins.opcode} max(MIN_II, N)", perf)


def quantize_mx(ins: Instruction, model: "CostModel") -> tuple[float, str]:
    """VectorE quantize_mx: max(MIN_II, N/4), N the source's elements per partition. Not in the facts
    sheet: AWS's Trainium3 architecture guide (nki/guides/architecture/trainium3_arch.rst @ 81ce03ae,
    "MX data-type Quantization") says it quantises four input elements per partition per cycle,
    "4x Vector performance mode"."""
    s = _Shape(ins)
    return _vector(s.n_eff, "quantize_mx max(MIN_II, N)", perf=4.0)


def tensor_reduce(ins: Instruction, model: "CostModel") -> tuple[float, str]:
    """VectorE tensor_reduce: N/2 for bf16 add/max, else N (facts 9)."""
    s = _Shape(ins)
    src = on_chip_operands(ins.reads)[:1]
    fast = (_all_dtypes(src + on_chip_operands(ins.writes), frozenset(("bfloat16",)))
            and enum_name(ins.attrs.get("op")) in ("add", "maximum"))
    return _vector(*((s.n_eff / 2, "tensor_reduce N/2") if fast else (s.n_eff, "tensor_reduce N")))


def reciprocal(ins: Instruction, model: "CostModel") -> tuple[float, str]:
    """VectorE reciprocal: max(MIN_II, 8N) (facts 9)."""
    return _vector(8 * _Shape(ins).n_eff, "reciprocal max(MIN_II, 8N)")


def memset(ins: Instruction, model: "CostModel") -> tuple[float, str]:
    """VectorE memset: N/2 for zero into bf16/fp16, else N (facts 9)."""
    s = _Shape(ins)
    value = ins.attrs.get("value", None)
    zero = value is not None and _is_zero(value)
    if zero and _all_dtypes(on_chip_operands(ins.writes), TWO_BYTE_FLOAT_DTYPES):
        return _vector(s.n_eff / 2, "memset max(MIN_II, N/2)")
    return _vector(s.n_eff, "memset max(MIN_II, N)")


def bn_stats(ins: Instruction, model: "CostModel") -> tuple[float, str]:
    """VectorE bn_stats: max(MIN_II, N) (facts 9)."""
    return _vector(_Shape(ins).n_eff, "bn_stats max(MIN_II, N)")


def bn_aggr(ins: Instruction, model: "CostModel") -> tuple[float, str]:
    """VectorE bn_aggr: max(MIN_II, 13N/3) (facts 9)."""
    return _vector(13 * _Shape(ins).n_eff / 3, "bn_aggr max(MIN_II, 13N/3)")


def tensor_tensor_scan(ins: Instruction, model: "CostModel") -> tuple[float, str]:
    """VectorE tensor_tensor_scan: max(MIN_II, 2N) (facts 9)."""
    return _vector(2 * _Shape(ins).n_eff, "tensor_tensor_scan max(MIN_II, 2N)")


def tensor_scalar_reduce(ins: Instruction, model: "CostModel") -> tuple[float, str]:
    """VectorE tensor_scalar_reduce: max(MIN_II, N) + MIN_II (facts 9)."""
    return _vector(_Shape(ins).n_eff, "tensor_scalar_reduce max(MIN_II, N) + MIN_II", extra=MIN_II)


def scalar_tensor_tensor(ins: Instruction, model: "CostModel") -> tuple[float, str]:
    """VectorE scalar_tensor_tensor: N for bf16 subtract-then-multiply with N even, else 2N (facts 9)."""
    s = _Shape(ins)
    fast = (_all_dtypes(s.operands, frozenset(("bfloat16",))) and enum_name(ins.attrs.get("op0")) == "subtract"
            and enum_name(ins.attrs.get("op1")) == "multiply" and s.n % 2 == 0)
    return _vector(*((s.n_eff, "scalar_tensor_tensor N") if fast else (2 * s.n_eff, "scalar_tensor_tensor 2N")))


def tensor_copy_predicated(ins: Instruction, model: "CostModel") -> tuple[float, str]:
    """VectorE tensor_copy_predicated: N with a PSUM operand, else 2N (facts 9)."""
    s = _Shape(ins)
    psum = any(o.buffer == "psum" for o in s.operands)
    return _vector(*((s.n_eff, "tensor_copy_predicated N") if psum else
                     (2 * s.n_eff, "tensor_copy_predicated 2N")))


def vector_n(ins: Instruction, model: "CostModel") -> tuple[float, str]:
    """VectorE max(MIN_II, N): nc_stream_shuffle, dropout, range_select, select_reduce, nc_transpose (facts 9)."""
    return _vector(_Shape(ins).n_eff, f"{ins.opcode} max(MIN_II, N)")


def vector_top8(ins: Instruction, model: "CostModel") -> tuple[float, str]:
    """VectorE max8 / nc_find_index8 N (facts 9); nc_match_replace8 as nc_find_index8 (decision 2)."""
    return _vector(_Shape(ins).n_eff, f"{ins.opcode} N")


def exponential(ins: Instruction, model: "CostModel") -> tuple[float, str]:
    """v4 VectorE exponential: max(MIN_II, N/4), 4x ScalarE activation(exp) (facts 9)."""
    return _vector(_Shape(ins).n_eff / 4, "exponential max(MIN_II, N/4)")


def vector_per_input(ins: Instruction, model: "CostModel") -> tuple[float, str]:
    """Decision 2, for VectorE instructions with no published formula: N per full-size input
    (N for one, 2N for two), floored at MIN_II."""
    s = _Shape(ins)
    inputs = max(1, len(s.full))
    return _vector(inputs * s.n_eff, f"{ins.opcode} max(MIN_II, {inputs}N) (decision 2: no published formula)")


def scalar_activation(ins: Instruction, model: "CostModel") -> tuple[float, str]:
    """ScalarE: max(MIN_II, N) whatever scale, bias or function; + MIN_II for a reduction read-out;
    v4 tensor_scalar / tensor_copy /2 for bf16/fp16 (facts 9 ScalarE)."""
    op = ins.opcode
    s = _Shape(ins)
    perf = 1.0
    extra = 0.0
    formula = f"{op} max(MIN_II, N)"
    if op == "activation_reduce" or (op in ("activation", "activate2") and ins.attrs.get("reduce_res") is not None
                                     and ins.attrs.get("reduce_res") is not False):
        extra = MIN_II  # facts 9: activation_reduce max(MIN_II, N) + MIN_II (read-out)
        formula += " + MIN_II"
    elif op in ("tensor_scalar", "tensor_copy") and model.gen >= 4 and _all_dtypes(s.operands, TWO_BYTE_FLOAT_DTYPES):
        perf = 2.0  # facts 9: v4 ScalarE 2x for bf16/fp16 tensor_scalar and tensor_copy
        formula += " /2 (v4 bf16)"
    return max(MIN_II, s.n_eff / perf) + extra, formula


def gpsimd_iota(ins: Instruction, model: "CostModel") -> tuple[float, str]:
    """GpSimd iota / affine_select: 150 + N (facts 9 GpSimd; iota's N is its dst's)."""
    s = _Shape(ins)
    dst = on_chip_operands(ins.writes)
    m = max((o.free_elements for o in dst), default=s.n) if ins.opcode == "iota" else s.n
    if _strided(dst):
        m *= 2
    return GPSIMD_START + m, f"{ins.opcode} 150 + N"


def local_gather(ins: Instruction, model: "CostModel") -> tuple[float, str]:
    """GpSimd local_gather: 150 + valid*e/C, C = ((28 + 4e)/(4e)) / min(4/dtype_size, e) (facts 9)."""
    n, _ = _n(ins)
    reads = on_chip_operands(ins.reads)
    src = reads[0] if reads else None
    index = reads[1] if len(reads) > 1 else None
    e = int(ins.attrs.get("num_elem_per_idx") or 1)
    valid = ins.attrs.get("num_valid_indices")
    if valid is None:
        # legacy docstring: default index.size / (index.shape[0] / 16) per GpSimd core
        valid = (index.free_elements * 16) if index is not None else n
    dtype_size = src.itemsize if src is not None else 4
    c = ((28 + 4 * e) / (4 * e)) / min(4 / dtype_size, e)
    return GPSIMD_START + int(valid) * e / c, "local_gather 150 + valid*e/C"


def gpsimd_per_input(ins: Instruction, model: "CostModel") -> tuple[float, str]:
    """Decision 2, GpSimd instructions with no published formula: 150 + N per full-size input
    (GPSIMD_START is the only published GpSimd overhead; the facts give "no general rule of thumb")."""
    s = _Shape(ins)
    inputs = max(1, len(s.full))
    return GPSIMD_START + inputs * s.n_eff, f"{ins.opcode} 150 + {inputs}N (decision 2: no published formula)"


def gpsimd_tensor_scalar(ins: Instruction, model: "CostModel") -> tuple[float, str]:
    """GpSimd tensor_scalar: with rsqrt 150 + 4N (a quarter of ScalarE's rsqrt throughput, facts 9), else
    decision 2."""
    attrs = ins.attrs
    if "rsqrt" in (enum_name(attrs.get("op0")), enum_name(attrs.get("op1")), enum_name(attrs.get("op"))):
        return GPSIMD_START + 4 * _Shape(ins).n_eff, "tensor_scalar(rsqrt) 150 + 4N"
    return gpsimd_per_input(ins, model)


def sync_free(ins: Instruction, model: "CostModel") -> tuple[float, str]:
    """SyncE and register instructions: 0 (decision 2; control flow only, facts 4.8)."""
    return 0.0, f"{ins.opcode} (SyncE, 0)"


def dma_transfer(ins: Instruction, model: "CostModel") -> "InstructionCost":
    """A DMA transfer, timed by the model's DMA model (fixed cost, queues, engines, efficiency; facts 9 DMA)."""
    return model.dma_cost(ins)


def _is_zero(value: Any) -> bool:
    try:
        return float(value) == 0.0
    except (TypeError, ValueError):
        return False


def is_set(value: Any) -> bool:
    if isinstance(value, str):
        return value.lower() not in ("", "false", "none", "0")
    return bool(value)
