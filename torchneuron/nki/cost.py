"""Engine-level cost model of an NKI kernel run: per-instruction cost, scheduling, utilisation.

:func:`estimate` takes the instruction log of a :class:`~torchneuron.nki.context.KernelRun`
(or a list of :class:`~torchneuron.nki.instruction.Instruction` records and a chip) and
returns a :class:`KernelCost`: modelled latency, start/end of every instruction on its
engine, per-engine busy time and utilisation, FLOPs and hardware FLOPs utilisation (HFU),
DMA bytes and memory-bound utilisation (MBU), a report table and a Chrome trace.
The model never looks at tensor values, only at the records.

Sources: every per-instruction formula cites nki-api-facts.md ("facts") section 9 unless
another section is named; chip figures (clocks, DMA rate, TensorE peak, HBM) come from
:class:`~torchneuron.hardware.specs.ChipSpec` (trainium-facts.md, Chips table).

Per-instruction cost (cycles of the instruction's own engine clock; N = elements per
partition of the largest on-chip operand, reads first; MIN_II = 64 cycles)
---------------------------------------------------------------------------------------
* TensorE ``nc_matmul``: MultiplyMoving ``max(min(64, N_stationary), N_moving)`` for
  bf16/fp16/tf32/fp8 inputs, x4 when an input is fp32; LoadStationary ``N_stationary/4``
  overlaps it, so the instruction occupies TensorE for ``max(MM, LS)``. fp32 factors:
  ``is_transpose`` (v3+) halves it (x2), ``is_*_onezero`` halves it. ``double_row`` (fp8,
  v3+) and ``nc_matmul_mx`` (v4) contract 2x / 4x more rows in the same time: same cycles,
  more FLOPs. ``nc_transpose`` on TensorE: ``max(P, min(64, F))``.
* VectorE: ``tensor_tensor`` ``max(MIN_II, N)`` with one input in PSUM and one in SBUF, or
  all-bf16 SBUF add/multiply/subtract on contiguous data, else ``max(MIN_II, 2N)``;
  ``tensor_scalar``/``tensor_copy`` ``max(MIN_II, N)``; ``tensor_reduce`` N/2 (bf16 in and
  out, add or max) else N; ``reciprocal`` 8N; ``memset`` N/2 (zero, bf16/fp16) else N;
  ``bn_stats`` N; ``bn_aggr`` 13N/3; ``tensor_tensor_scan`` 2N; ``tensor_scalar_reduce``
  ``max(MIN_II, N) + MIN_II``; ``scalar_tensor_tensor`` N (bf16, subtract then multiply,
  N even) else 2N; ``tensor_copy_predicated`` N with a PSUM operand else 2N;
  ``nc_stream_shuffle``/``dropout``/``range_select``/``select_reduce``/``nc_transpose``
  N; ``max8``/``nc_find_index8`` N; dynamic-offset copies ``max(600, N)``; v4
  ``exponential`` N/4 (4x ScalarE ``activation(exp)``). v3+ performance modes
  [facts 9, S:arch3]: ``tensor_copy``/``tensor_scalar`` /4 (all SBUF, all bf16/fp16,
  inner-contiguous) or /2 (bf16/fp16 but not contiguous or one side in PSUM);
  ``tensor_tensor`` /2 (both inputs in SBUF, all bf16/fp16).
* ScalarE: ``activation``/``activate2`` ``max(MIN_II, N)`` whatever scale, bias or
  reduction; + MIN_II for a reduction read-out (``activation_reduce``, or
  ``reduce_res`` given); ``tensor_scalar``/``tensor_copy`` ``max(MIN_II, N)``, /2 on v4 for
  bf16/fp16.
* GpSimd: ``iota``/``affine_select`` ``150 + N``; ``local_gather``
  ``150 + valid*e/C`` with ``C = ((28 + 4e)/(4e)) / min(4/dtype_size, e)``, e =
  ``num_elem_per_idx``, ``valid`` = ``num_valid_indices`` (default: index elements per
  16-partition core) [facts 9; legacy local_gather docstring].
* DMA: ``fixed + (bytes / k) / (rate * efficiency * transpose_factor)`` on k =
  ``min(16, ceil(partitions / 8))`` DMA engines [facts 9 DMA].

Decisions where the facts are silent (for docs/nki.md)
-------------------------------------------------------
1. **MIN_II floor everywhere.** Every VectorE/ScalarE formula is floored at MIN_II (the
   minimum initiation interval), including ``tensor_reduce``, ``max8`` and
   ``nc_find_index8`` whose legacy formulas omit it. Fractional cycles are kept.
2. **Unlisted instructions.** VectorE: the rule of thumb "N per full-size input" (N for one,
   2N for two; ``tensor_scalar_cumulative``, ``rng``, ``quantize_mx``, ``select``...);
   ScalarE: ``max(MIN_II, N)``; GpSimd: ``150 + N`` per full-size input (GPSIMD_START is
   the only published GpSimd overhead; "no general rule of thumb" in the facts), GpSimd
   ``tensor_scalar(rsqrt)`` ``150 + 4N`` (a quarter of ScalarE's rsqrt throughput);
   ``nc_match_replace8`` as ``nc_find_index8``; SyncE instructions cost 0.
3. **v3 performance modes** divide the v2 formula's N term (before the MIN_II floor), so
   an all-bf16 SBUF ``tensor_tensor`` add is N on v2 and N/2 on v3+, which matches the
   published 512 bf16 elements per cycle of v3 VectorE (facts 7). The modes need bf16 or
   fp16 operands (fp8 too on v4, whose VectorE lists 512 BF16/FP16/FP8 per cycle); the
   facts' "256 other elements per cycle" is not applied to fp32. They apply on v3 and v4.
4. **nc_transpose on TensorE** is a matmul against an identity (facts 4.1): fp32 data costs
   x4 on v2 and x2 on v3+ (transpose mode).
5. **Strided access.** An on-chip operand whose innermost stride exceeds 16 bytes (facts 9:
   "halves SBUF/PSUM bandwidth") doubles the N term of its instruction, on every compute
   engine (TensorE: N_moving). Operands with one element per partition are exempt.
6. **Dependency latency.** Formulas are throughput costs of back-to-back independent
   instructions. A consumer of data (RAW edge, ``depends_on``) starts no earlier than the
   producer's end plus the consumer engine's static overhead: VectorE 100 cycles (facts 9
   "~100-cycle static overhead ... depend on each other back to back"), ScalarE 200 cycles
   (the observed 264-cycle spacing of dependent tiny ScalarE instructions minus MIN_II),
   TensorE 64 cycles (MM_INIT_LATENCY), GpSimd 60 cycles (the v2 "~60-cycle tensor access
   start"); DMA 0 (its fixed cost includes the semaphore wait). The same cycle counts are
   used on v3/v4 (unpublished there). WAR/WAW edges wait for the earlier instruction's end
   with no overhead. Matmuls accumulating into PSUM that TensorE wrote are not delayed
   (in-order TensorE accumulates without a round trip).
7. **Dependencies** are tracked per allocation on (rows x bytes-within-row) boxes built
   from ``Operand.extent`` and ``Operand.row_bytes`` (a bounding byte interval when
   ``row_bytes`` is 0); never-written allocations (kernel inputs) are not tracked. Programs
   on different physical cores (LNC2) share no dependency state: they synchronise only at
   ``core_barrier``/``sendrecv``: the sync starts on every core when the last core reaches
   it, and later instructions of every core wait for its end.
8. **Explicit edges.** ``attrs["depends_on"]``: instruction indices (or objects with an
   ``index``) this one waits for (RAW-like). ``attrs["no_reorder"]``: a scope id (or a
   tuple of ids for nested scopes); each instruction waits for the end of the previous
   instruction of each of its scopes.
9. **Engines issue in program order**, one instruction at a time. On v2, VectorE and GpSimd
   share SBUF access, and VectorE and ScalarE share PSUM access (facts 7): an instruction
   of one of those engines touching that memory is placed in the earliest gap of the shared
   port (the gap search looks back over the last 64 busy intervals). Lifted on v3+ (PSUM
   users are assumed to use different banks).
10. **DMA.** 16 engines per physical core, each with 16 queues (facts 9). A transfer uses
    k = ``min(16, ceil(partitions / 8))`` engines (partitions of its on-chip side; an
    HBM-to-HBM copy uses its dim 0 as rows), taken round-robin from a rotating engine
    pointer, and one queue index taken round-robin (the same index on each of its
    engines). A queue runs its transfers in order. Each transfer first pays its fixed cost
    (1300 ns; 600 ns for ``dge_mode=hwdge`` on v3+ - ``unknown`` is charged 1300 ns) as
    latency that overlaps other queues' transfers, then moves ``bytes / k`` over each of
    its engines; an engine moves one transfer's bytes at a time, in the earliest gap
    (gap search over the last 64 busy intervals). bytes = max(bytes read, bytes written).
    Triggers and descriptor generation cost nothing on ScalarE/SyncE/GpSimd (facts 9:
    hwdge descriptor generation overlaps earlier compute; no swdge figure is published).
    The 1416 ns measured for 32 KiB over one Trn2 engine (facts 9) suggests the fixed cost
    is often hidden; the model keeps it as documented.
11. **DMA rate.** The per-engine figures of the DMA bandwidth table, 17/23/33 B/ns
    (Trn1/Trn2/Trn3; trainium-facts.md and ``ChipSpec.dma_bytes_per_second_per_engine``),
    not the prose's 27.2/38.4 GB/s (facts 12); :class:`CostOptions` overrides it. Transfers
    touching HBM are also capped by the core's HBM share, chip HBM bandwidth / physical
    cores (Trn2: 362.5 GB/s < 16 x 23): each engine gets at most share / 16 (halved for
    HBM-to-HBM copies, which read and write HBM).
12. **DMA efficiency** against the contiguous bytes per partition b (the on-chip side's
    bytes per partition; the element size when an operand's innermost stride is not
    contiguous): ``eff(b) = min(1, (b / (b + 256)) / (4096 / (4096 + 256)))``. It puts the
    half-efficiency point at the documented 256 B "overhead-bound" threshold and reaches
    1.0 at the documented 4 KiB "saturates" point; 2 KiB (the recommended minimum) gives
    0.94. Not a published curve.
13. **DMA transpose.** ``dma_transpose`` on v3+ runs at 0.9 (HBM source) / 0.5 (SBUF
    source) of DMA throughput (facts 9). ``dma_transpose`` on v2 and DMAs recorded with
    ``attrs["transpose"]`` (``nl.load_transpose2d``, "much lower bandwidth", no figure) move
    element by element: b = element size in the efficiency curve.
14. **LNC2** runs (``run.lnc == 2``): program p runs on physical core p with its own
    engines and DMA; latency is the latest core's end. **Legacy SPMD grids** (more
    programs, LNC 1) run their programs one after another on one core, each starting when
    the previous one has fully finished (facts 10: "instances run serially").
15. **HFU** = FLOPs / (latency x TensorE peak x physical cores used), with the per-core
    peak of ``ChipSpec.tensor_flops_per_second`` for the input dtype carrying the most
    FLOPs (the BF16 figure when the chip publishes none for it, e.g. fp8 on Trn1/Trn3):
    the tutorials' definition (facts 9 "Roofline"). **MBU** = DMA bytes / (latency x peak
    DMA bandwidth x physical cores), with peak = min(16 x per-engine rate, HBM share).
    A matmul recorded with ``flops=0`` is counted as 2*K*M*N from its operands.
16. Not modelled: TensorE tiling mode running small matmuls in parallel (charged as full
    matmuls), v4 background transpose overlap, DMA QoS/priority (v4), queue arbitration
    beyond FIFO-with-gaps, SBUF capacity pressure on prefetch depth (allocations are
    distinct buffers).

Attributes read from ``Instruction.attrs``: ``op``/``op0``/``op1`` (ALU or activation),
``stationary_free``/``moving_free`` (dst-side sizes of ``nc_matmul``: the dst is
``[stationary_free, moving_free]``; without them the dst shape is used), ``perf_mode``,
``is_transpose``, ``is_stationary_onezero``, ``is_moving_onezero``, ``value`` (memset),
``reduce_res`` (activation read-out), ``num_elem_per_idx``/``num_valid_indices``
(local_gather), ``dge_mode``, ``transpose`` (DMA), ``depends_on``, ``no_reorder``.
nc_matmul's stationary and moving are its first two SBUF reads.
"""

from __future__ import annotations

import gc
import math
import os
from bisect import bisect_right
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

from torchneuron.hardware.specs import ChipSpec, get_chip
from torchneuron.nki.errors import SourceLocation
from torchneuron.nki.instruction import Engine, Instruction, Operand

__all__ = [
    "CostOptions", "InstructionCost", "TimelineEvent", "KernelCost", "estimate", "instruction_cost",
    "dma_efficiency", "MIN_II",
]

# ---------------------------------------------------------------------------- constants
MIN_II = 64  # facts 9: minimum instruction initiation interval, ~64 cycles
MIN_II_DYNAMIC = 600  # facts 9: dynamic-offset copies
GPSIMD_START = 150  # facts 9 GpSimd: iota 150 + N, GPSIMD_START ~150
MM_FLOOR = 64  # facts 9 TensorE: max(min(64, N_stationary), N_moving)
LOAD_STATIONARY_SPEEDUP = 4  # facts 9 TensorE: LoadStationary up to 4x faster than MM
FP32_MATMUL_FACTOR = 4  # facts 9 TensorE: 4x for fp32
VECTOR_STATIC_OVERHEAD = 100  # facts 9 VectorE: ~100-cycle static overhead
SCALAR_DEPENDENT_SPACING = 264  # facts 9: dependent tiny instructions 264 ScalarE cycles apart (v2)
MM_INIT_LATENCY = 64  # facts 9 TensorE: MM_INIT_LATENCY = 64 cycles on v2
ACCESS_START = 60  # facts 9: starting a tensor access ~60 cycles on v2
STRIDE_PENALTY_BYTES = 16  # facts 9: inner stride above 16 B halves SBUF/PSUM bandwidth
DMA_FIXED_NS = 1300.0  # facts 9 DMA: fixed ~1300 ns per transfer
HWDGE_FIXED_NS = 600.0  # facts 9 DMA: hwdge ~600 ns per instruction (v3+)
DMA_QUEUES = 16  # facts 9 DMA: 16 queues per engine
PARTITIONS_PER_DMA_ENGINE = 8  # facts 9 DMA: each engine serves 8 partitions
DMA_OVERHEAD_BOUND_BYTES = 256  # facts 9 DMA: below 256 B per partition overhead-bound
DMA_SATURATING_BYTES = 4096  # facts 9 DMA: >= 4 KiB per partition saturates
DMA_TRANSPOSE_FROM_HBM = 0.9  # facts 9 DMA: transpose up to 90% HBM->SBUF (v3)
DMA_TRANSPOSE_FROM_SBUF = 0.5  # facts 9 DMA: 50% SBUF->SBUF (v3)
GAP_WINDOW = 64  # decision 9/10: gap search depth of shared resources

_ON_CHIP = ("sbuf", "psum")
_TWO_BYTE_FLOAT = frozenset(("bfloat16", "float16"))
_FP8 = frozenset(("float8_e4m3", "float8_e5m2", "float8_e4m3fn", "cfp8"))
_SYNC_OPS = frozenset(("core_barrier", "sendrecv"))
_COMPUTE_ENGINES = (Engine.TENSOR, Engine.VECTOR, Engine.SCALAR, Engine.GPSIMD)
_TRACK_ORDER = {Engine.TENSOR: 0, Engine.VECTOR: 1, Engine.SCALAR: 2, Engine.GPSIMD: 3, Engine.SYNC: 4}


@dataclass(frozen=True)
class CostOptions:
    """Knobs of the model; the defaults are the documented figures (module docstring)."""

    dma_bytes_per_ns_per_engine: float | None = None  # None: ChipSpec's 17/23/33 B/ns table
    dma_fixed_ns: float = DMA_FIXED_NS
    hwdge_fixed_ns: float = HWDGE_FIXED_NS
    hbm_cap: bool = True  # cap HBM transfers at the core's HBM share (decision 11)
    dma_queues: int = DMA_QUEUES  # queues used round-robin per engine (decision 10)


@dataclass(frozen=True)
class InstructionCost:
    """What one instruction costs in isolation."""

    engine: str
    cycles: float  # compute engines: cycles of the engine clock; DMA: 0
    ns: float  # compute: occupancy; DMA: fixed + data time
    formula: str
    fixed_ns: float = 0.0  # DMA only
    data_ns: float = 0.0  # DMA only: time each of its engines moves bytes
    dma_engines: int = 0  # DMA only
    bytes: int = 0  # DMA only


@dataclass(slots=True)
class TimelineEvent:
    """One instruction placed on its engine (DMA: on a queue of the core's DMA engines)."""

    engine: str
    queue: int | None  # DMA queue index; None for compute engines
    core: int  # physical core
    program: int
    start_ns: float
    end_ns: float
    opcode: str
    index: int  # Instruction.index
    source_location: SourceLocation | None  # Instruction.location
    formula: str
    flops: int = 0
    bytes: int = 0
    data_start_ns: float | None = None  # DMA: when its bytes start moving
    dma_engines: tuple[int, ...] = ()

    @property
    def duration_ns(self) -> float:
        return self.end_ns - self.start_ns

    @property
    def location(self) -> str | None:
        """``"kernel.py:12 in fn"``, or None for records without a location."""
        return str(self.source_location) if self.source_location is not None else None

    @property
    def source(self) -> str:
        """The kernel source line that issued the instruction."""
        return getattr(self.source_location, "line", "") or ""

    @property
    def track(self) -> str:
        return f"dma queue {self.queue}" if self.queue is not None else self.engine


# ---------------------------------------------------------------------------- helpers
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


def dma_efficiency(bytes_per_partition: float) -> float:
    """Decision 12: DMA efficiency for ``bytes_per_partition`` contiguous bytes (facts 9 DMA)."""
    b = max(float(bytes_per_partition), 1.0)
    saturating = DMA_SATURATING_BYTES / (DMA_SATURATING_BYTES + DMA_OVERHEAD_BOUND_BYTES)
    return min(1.0, (b / (b + DMA_OVERHEAD_BOUND_BYTES)) / saturating)


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


# ---------------------------------------------------------------------------- formulas
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


class _Model:
    """Chip-derived constants and the per-instruction cost."""

    def __init__(self, chip: ChipSpec, options: CostOptions) -> None:
        self.chip = chip
        self.options = options
        self.gen = _gen(chip)
        self.ghz = {e: _clock_ghz(chip, e) for e in _COMPUTE_ENGINES}
        self.dep_ns = {e: _dependency_cycles(e) / self.ghz[e] for e in _COMPUTE_ENGINES}
        self.dma_engines = chip.dma_engines_per_core or 16
        rate = options.dma_bytes_per_ns_per_engine or chip.dma_bytes_per_second_per_engine / 1e9
        self.dma_rate = rate  # B/ns per engine, decision 11
        share = chip.hbm_bytes_per_second / chip.physical_cores_per_chip / 1e9  # B/ns per physical core
        self.hbm_share = share
        self.peak_dma = min(self.dma_engines * rate, share) if options.hbm_cap else self.dma_engines * rate
        self._cache: dict[tuple, InstructionCost] = {}

    def cost(self, ins: Instruction) -> InstructionCost:
        """The isolated cost of ``ins``, memoised on everything the formulas read."""
        key = (ins.engine, ins.opcode, tuple(map(_shape_key, ins.reads)), tuple(map(_shape_key, ins.writes)),
               _attrs_key(ins.attrs) if ins.attrs else ())
        hit = self._cache.get(key)
        if hit is None:
            hit = self._cache[key] = self._cost(ins)
        return hit

    def _cost(self, ins: Instruction) -> InstructionCost:
        engine = ins.engine
        if engine == Engine.DMA:
            return self.dma_cost(ins)
        if engine == Engine.SYNC:
            return InstructionCost(engine, 0.0, 0.0, f"{ins.opcode} (SyncE, 0)")
        if engine == Engine.TENSOR:
            cycles, formula = _tensor_cycles(ins, self.gen)
        elif engine == Engine.SCALAR:
            cycles, formula = _scalar_cycles(ins, self.gen)
        elif engine == Engine.GPSIMD:
            cycles, formula = _gpsimd_cycles(ins, self.gen)
        else:
            cycles, formula = _vector_cycles(ins, self.gen)
        ghz = self.ghz.get(engine, self.ghz[Engine.VECTOR])
        return InstructionCost(engine, cycles, cycles / ghz, formula)

    def dma_cost(self, ins: Instruction) -> InstructionCost:
        """facts 9 DMA; decisions 10-13."""
        reads, writes = ins.reads, ins.writes
        nbytes = max(sum(o.bytes for o in reads), sum(o.bytes for o in writes))
        on_chip = _on_chip(tuple(reads) + tuple(writes))
        if on_chip:
            rows = max(o.partitions for o in on_chip)
            bpp = min(o.bytes_per_partition for o in on_chip)
        else:
            dst = writes[0] if writes else (reads[0] if reads else None)
            rows = dst.shape[0] if dst is not None and len(dst.shape) > 1 else 1
            bpp = nbytes / max(rows, 1)
        k = max(1, min(self.dma_engines, math.ceil(max(rows, 1) / PARTITIONS_PER_DMA_ENGINE)))
        itemsize = min((o.itemsize for o in tuple(reads) + tuple(writes)), default=4)
        if any(len(o.shape) and o.shape[-1] > 1 and not _contiguous(o) for o in tuple(reads) + tuple(writes)):
            bpp = itemsize  # decision 12: element-granular descriptors
        factor = 1.0
        formula = "dma fixed + bytes/k / (rate x eff)"
        transpose = ins.opcode == "dma_transpose" or _truthy(ins.attrs.get("transpose"))
        if transpose:
            src = reads[0] if reads else None
            if ins.opcode == "dma_transpose" and self.gen >= 3:
                hbm_src = src is not None and src.buffer not in _ON_CHIP
                factor = DMA_TRANSPOSE_FROM_HBM if hbm_src else DMA_TRANSPOSE_FROM_SBUF  # facts 9
                formula += f" x {factor:g} transpose"
            else:
                bpp = itemsize  # decision 13: element-wise transposing descriptors
                formula += " element-wise transpose"
        hbm_sides = sum(1 for side in (reads, writes) if any(o.buffer not in _ON_CHIP for o in side))
        rate = self.dma_rate
        if hbm_sides and self.options.hbm_cap:
            rate = min(rate, self.hbm_share / self.dma_engines / hbm_sides)  # decision 11
        eff = dma_efficiency(bpp)
        data_ns = (nbytes / k) / (rate * eff * factor) if nbytes else 0.0
        hwdge = _name(ins.attrs.get("dge_mode")) == "hwdge" and self.gen >= 3
        fixed = self.options.hwdge_fixed_ns if hwdge else self.options.dma_fixed_ns  # facts 9 DMA
        return InstructionCost(Engine.DMA, 0.0, fixed + data_ns, formula, fixed_ns=fixed, data_ns=data_ns,
                               dma_engines=k, bytes=int(nbytes))


def _shape_key(o: Operand) -> tuple:
    return (o.buffer, o.dtype, o.shape, o.partitions, o.free_elements, o.itemsize, o.inner_stride_bytes)


_IGNORED_ATTRS = frozenset(("depends_on", "no_reorder", "name"))


def _attrs_key(attrs: dict) -> tuple:
    items = []
    for k, v in attrs.items():
        if k in _IGNORED_ATTRS:
            continue
        if k == "reduce_res":
            v = v is not None and v is not False
        else:
            try:
                hash(v)
            except TypeError:
                v = repr(v)
        items.append((k, v))
    return tuple(items)


def instruction_cost(ins: Instruction, target: str | ChipSpec, options: CostOptions | None = None) -> InstructionCost:
    """The isolated cost of one instruction on ``target`` (no scheduling)."""
    chip = get_chip(target) if isinstance(target, str) else target
    return _Model(chip, options or CostOptions()).cost(ins)


# ---------------------------------------------------------------------------- scheduling
class _Busy:
    """Sorted, disjoint busy intervals of a shared resource, with earliest-gap search.

    Only the last GAP_WINDOW intervals are kept (decisions 9/10): time before the
    oldest kept interval counts as busy (``floor``), which bounds the cost per query.
    """

    __slots__ = ("starts", "ends", "floor")

    def __init__(self) -> None:
        self.starts: list[float] = []
        self.ends: list[float] = []
        self.floor = 0.0

    def copy(self) -> "_Busy":
        other = _Busy()
        other.starts = self.starts[:]
        other.ends = self.ends[:]
        other.floor = self.floor
        return other

    def same(self, other: "_Busy") -> bool:
        return self.floor == other.floor and self.ends == other.ends and self.starts == other.starts

    def fit(self, t: float, d: float) -> float:
        if t < self.floor:
            t = self.floor
        ends = self.ends
        n = len(ends)
        if not n or t >= ends[-1]:
            return t
        i = bisect_right(ends, t)
        starts = self.starts
        while i < n:
            if starts[i] >= t + d:
                return t
            if ends[i] > t:
                t = ends[i]
            i += 1
        return t

    def add(self, s: float, e: float) -> None:
        if e <= s:
            return
        starts, ends = self.starts, self.ends
        if not ends or s > ends[-1]:
            starts.append(s)
            ends.append(e)
            if len(ends) > GAP_WINDOW:
                self.floor = ends[0]
                del starts[0], ends[0]
            return
        if s == ends[-1]:
            ends[-1] = max(ends[-1], e)
            return
        i = bisect_right(starts, s)
        if i > 0 and ends[i - 1] >= s:
            i -= 1
            s = starts[i]
            e = max(e, ends[i])
            del starts[i], ends[i]
        while i < len(starts) and starts[i] <= e:
            e = max(e, ends[i])
            del starts[i], ends[i]
        starts.insert(i, s)
        ends.insert(i, e)
        self._trim()

    def _trim(self) -> None:
        if len(self.ends) > GAP_WINDOW:
            self.floor = self.ends[0]
            del self.starts[0], self.ends[0]


def _box(o: Operand) -> tuple[int, int, int, int]:
    """Decision 7: (first row, end row, first byte, end byte) within each row."""
    lo, hi = o.extent
    pitch = o.row_bytes
    if pitch <= 0 or hi <= lo:
        return (0, 1, lo, max(hi, lo + 1))
    r0 = lo // pitch
    r1 = (hi - 1) // pitch + 1
    if r1 - r0 == 1:
        return (r0, r1, lo - r0 * pitch, hi - r0 * pitch)
    c0 = lo - r0 * pitch
    c1 = (hi - 1) - (r1 - 1) * pitch + 1
    if c1 <= c0:
        c0, c1 = 0, pitch
    return (r0, r1, c0, c1)


class _BoxIndex:
    """Boxes of one allocation with a value each, indexed by row range for overlap queries.

    Keys are sorted by first row; a box overlapping rows [r0, r1) must start after
    ``r0 - span`` (``span`` = the tallest box held), so a query scans only nearby keys.
    """

    __slots__ = ("keys", "rows", "span")

    def __init__(self) -> None:
        self.keys: list[tuple[int, int]] = []
        self.rows: dict[tuple[int, int], dict[tuple[int, int], Any]] = {}
        self.span = 0

    def __bool__(self) -> bool:
        return bool(self.keys)

    def overlapping(self, box: tuple[int, int, int, int]) -> list[tuple[tuple[int, int], tuple[int, int], Any]]:
        r0, r1, c0, c1 = box
        keys = self.keys
        lo = bisect_right(keys, (r0 - self.span, 1 << 62))
        hi = bisect_right(keys, (r1 - 1, 1 << 62))
        found = []
        rows = self.rows
        for j in range(lo, hi):
            key = keys[j]
            if key[1] > r0:
                for cols, value in rows[key].items():
                    if cols[0] < c1 and c0 < cols[1]:
                        found.append((key, cols, value))
        return found

    def prune(self, box: tuple[int, int, int, int], limit: float | None) -> None:
        """Drop the boxes ``box`` covers (reads: only those ending by ``limit``)."""
        r0, r1, c0, c1 = box
        keys = self.keys
        if len(keys) == 1:
            key = keys[0]
            if not (r0 <= key[0] and key[1] <= r1):
                return
            row = self.rows[key]
            doomed = [cols for cols, value in row.items() if c0 <= cols[0] and cols[1] <= c1
                      and (limit is None or value <= limit)]
            if len(doomed) == len(row):
                keys.clear()
                self.rows.clear()
                self.span = 0
                return
            for cols in doomed:
                del row[cols]
            return
        for key, cols, value in self.overlapping(box):
            if r0 <= key[0] and key[1] <= r1 and c0 <= cols[0] and cols[1] <= c1 \
                    and (limit is None or value <= limit):
                self.remove(key, cols)

    def get(self, box: tuple[int, int, int, int], default: Any = None) -> Any:
        cols = self.rows.get((box[0], box[1]))
        return default if cols is None else cols.get((box[2], box[3]), default)

    def put(self, box: tuple[int, int, int, int], value: Any) -> None:
        key = (box[0], box[1])
        cols = self.rows.get(key)
        if cols is None:
            cols = self.rows[key] = {}
            self.keys.insert(bisect_right(self.keys, key), key)
            if key[1] - key[0] > self.span:
                self.span = key[1] - key[0]
        cols[(box[2], box[3])] = value

    def remove(self, key: tuple[int, int], cols: tuple[int, int]) -> None:
        row = self.rows[key]
        del row[cols]
        if not row:
            del self.rows[key]
            del self.keys[bisect_right(self.keys, key) - 1]
            if key[1] - key[0] == self.span:
                self.span = max((k[1] - k[0] for k in self.keys), default=0)


class _AllocState:
    __slots__ = ("writes", "reads")

    def __init__(self) -> None:
        self.writes = _BoxIndex()  # box -> (end, engine) of the latest write
        self.reads = _BoxIndex()  # box -> latest end of a read since


class _Core:
    """Scheduling state of one physical core."""

    def __init__(self, model: _Model) -> None:
        self.engine_free: dict[str, float] = defaultdict(float)
        self.fence = 0.0
        self.allocs: dict[int, _AllocState] = {}
        e = model.dma_engines
        self.queue_free = [[0.0] * model.options.dma_queues for _ in range(e)]
        shared = _Busy()
        self.dma_busy = [shared] * e  # copy on write (see _Scheduler.commit)
        self.ports = {"sbuf": _Busy(), "psum": _Busy()}
        self.next_engine = 0
        self.next_queue = 0
        self.scope_end: dict[Any, float] = {}
        self.end = 0.0


class _Scheduler:
    def __init__(self, model: _Model, instructions: Sequence[Instruction], cores: int) -> None:
        self.model = model
        self.cores = [_Core(model) for _ in range(cores)]
        self.ends: dict[int, float] = {}
        self.events: list[TimelineEvent] = []
        self.written = {o.allocation for ins in instructions for o in ins.writes}
        self.dma_engine_ns = 0.0
        self.flops_by_dtype: dict[str, int] = defaultdict(int)
        self._box_memo: dict[int, tuple[list, list]] = {}

    # -- readiness ---------------------------------------------------------------------
    def _boxes(self, ins: Instruction) -> tuple[list, list]:
        """Dependency boxes of the reads and writes of ``ins`` (memoised for the last few)."""
        boxes = self._box_memo.get(ins.index)
        if boxes is None:
            if len(self._box_memo) > 8:
                self._box_memo.clear()
            boxes = self._box_memo[ins.index] = ([_box(o) for o in ins.reads], [_box(o) for o in ins.writes])
        return boxes

    def ready(self, core: _Core, ins: Instruction) -> float:
        """Earliest start allowed by data dependencies, explicit edges and fences."""
        t = core.fence
        engine = ins.engine
        dep = self.model.dep_ns.get(engine, 0.0)
        allocs = core.allocs
        rboxes, wboxes = self._boxes(ins)
        for o, box in zip(ins.reads, rboxes):  # RAW
            state = allocs.get(o.allocation)
            if state is None or not state.writes:
                continue
            accumulate = engine == Engine.TENSOR and o.buffer == "psum"
            for _, _, (end, wengine) in state.writes.overlapping(box):
                ready = end if (accumulate and wengine == Engine.TENSOR) else end + dep
                if ready > t:
                    t = ready
        for o, box in zip(ins.writes, wboxes):  # WAW, WAR
            state = allocs.get(o.allocation)
            if state is None:
                continue
            for _, _, (end, _) in state.writes.overlapping(box):
                if end > t:
                    t = end
            if state.reads:
                for _, _, end in state.reads.overlapping(box):
                    if end > t:
                        t = end
        attrs = ins.attrs
        if attrs:
            deps = attrs.get("depends_on")
            if deps is not None:
                for d in deps if isinstance(deps, (list, tuple, set, frozenset)) else (deps,):
                    idx = d if isinstance(d, int) else getattr(d, "index", None)
                    end = self.ends.get(idx)
                    if end is not None and end + dep > t:
                        t = end + dep
            scopes = attrs.get("no_reorder")
            if scopes is not None and scopes is not False:
                for s in scopes if isinstance(scopes, (list, tuple)) else (scopes,):
                    end = core.scope_end.get(s)
                    if end is not None and end > t:
                        t = end
        return t

    # -- placement ---------------------------------------------------------------------
    def commit(self, core_id: int, ins: Instruction, ready: float) -> TimelineEvent:
        core = self.cores[core_id]
        model = self.model
        cost = model.cost(ins)
        engine = ins.engine
        queue = None
        data_start = None
        dma_engines: tuple[int, ...] = ()
        if engine == Engine.DMA:
            n_engines = model.dma_engines
            k = cost.dma_engines
            first = core.next_engine
            dma_engines = tuple((first + i) % n_engines for i in range(k))
            core.next_engine = (first + k) % n_engines
            queue = core.next_queue
            core.next_queue = (queue + 1) % model.options.dma_queues
            start = ready
            for e in dma_engines:
                if core.queue_free[e][queue] > start:
                    start = core.queue_free[e][queue]
            t = start + cost.fixed_ns
            d = cost.data_ns
            busy = core.dma_busy
            # Engines with identical histories share one _Busy (copy on write): a full-width
            # transfer then searches and books one interval list, not sixteen.
            first_busy = busy[dma_engines[0]]
            objs: list[_Busy] = [first_busy]
            for e in dma_engines:
                b = busy[e]
                if b is not first_busy and not any(b is x for x in objs):
                    objs.append(b)
            while True:
                t_next = t
                for b in objs:
                    t_next = b.fit(t_next, d)
                if t_next == t:
                    break
                t = t_next
            data_start = t
            end = t + d
            if k < n_engines:
                inside = set(dma_engines)
                for j, b in enumerate(objs):
                    if any(busy[e] is b for e in range(n_engines) if e not in inside):
                        copy = objs[j] = b.copy()
                        for e in dma_engines:
                            if busy[e] is b:
                                busy[e] = copy
            for b in objs:
                b.add(t, end)
            if len(objs) > 1 and all(objs[0].same(b) for b in objs[1:]):
                for e in dma_engines:
                    busy[e] = objs[0]
            for e in dma_engines:
                core.queue_free[e][queue] = end
            self.dma_engine_ns += d * k
        else:
            start = max(ready, core.engine_free[engine])
            d = cost.ns
            ports = self._ports(core, ins) if model.gen == 2 else ()
            if ports:
                while True:
                    t_next = start
                    for port in ports:
                        t_next = port.fit(t_next, d)
                    if t_next == start:
                        break
                    start = t_next
                for port in ports:
                    port.add(start, start + d)
            end = start + d
            core.engine_free[engine] = end
        self._record(core, ins, end)
        if end > core.end:
            core.end = end
        flops = _flops(ins) if engine == Engine.TENSOR or ins.flops else 0
        if flops:
            self.flops_by_dtype[_flops_dtype(ins)] += flops
        event = TimelineEvent(engine, queue, core_id, ins.program, start, end, ins.opcode, ins.index,
                              ins.location, cost.formula, flops, cost.bytes, data_start, dma_engines)
        self.events.append(event)
        return event

    @staticmethod
    def _ports(core: _Core, ins: Instruction) -> list[_Busy]:
        """Decision 9 / facts 7: v2 shared SBUF (VectorE, GpSimd) and PSUM (VectorE, ScalarE) access."""
        engine = ins.engine
        if engine not in (Engine.VECTOR, Engine.GPSIMD, Engine.SCALAR):
            return []
        buffers = {o.buffer for o in ins.reads} | {o.buffer for o in ins.writes}
        ports = []
        if engine in (Engine.VECTOR, Engine.GPSIMD) and "sbuf" in buffers:
            ports.append(core.ports["sbuf"])
        if engine in (Engine.VECTOR, Engine.SCALAR) and "psum" in buffers:
            ports.append(core.ports["psum"])
        return ports

    def _record(self, core: _Core, ins: Instruction, end: float) -> None:
        self.ends[ins.index] = end
        allocs = core.allocs
        written = self.written
        engine = ins.engine
        rboxes, wboxes = self._boxes(ins)
        for o, box in zip(ins.reads, rboxes):
            if o.allocation not in written:
                continue  # never written: no hazard can involve it
            state = allocs.get(o.allocation)
            if state is None:
                state = allocs[o.allocation] = _AllocState()
            if state.reads.get(box, -1.0) < end:
                state.reads.put(box, end)
        for o, box in zip(ins.writes, wboxes):
            state = allocs.get(o.allocation)
            if state is None:
                state = allocs[o.allocation] = _AllocState()
            # This write ended after every overlapping earlier access (it depended on them):
            # records it fully covers are superseded.
            if state.writes.keys:
                state.writes.prune(box, None)
            if state.reads.keys:
                state.reads.prune(box, end)
            state.writes.put(box, (end, engine))
        scopes = ins.attrs.get("no_reorder") if ins.attrs else None
        if scopes is not None and scopes is not False:
            for s in scopes if isinstance(scopes, (list, tuple)) else (scopes,):
                core.scope_end[s] = end

    def run(self, core_id: int, ins: Instruction) -> TimelineEvent:
        return self.commit(core_id, ins, self.ready(self.cores[core_id], ins))


def _flops(ins: Instruction) -> int:
    if ins.flops:
        return int(ins.flops)
    if ins.engine == Engine.TENSOR and ins.opcode in ("nc_matmul", "matmul") \
            and not _truthy(ins.attrs.get("is_transpose")):
        sbuf = [o for o in ins.reads if o.buffer == "sbuf"]
        dst = ins.writes[0] if ins.writes else None
        if len(sbuf) >= 2 and dst is not None:
            k = sbuf[0].partitions * (2 if _name(ins.attrs.get("perf_mode")) == "double_row" else 1)
            return 2 * k * dst.partitions * dst.free_elements  # decision 15
    return 0


def _flops_dtype(ins: Instruction) -> str:
    """The input dtype whose TensorE peak applies to ``ins`` (fp32 if either input is fp32)."""
    sbuf = [o for o in ins.reads if o.buffer == "sbuf"] or list(ins.reads)
    if any(o.dtype == "float32" for o in sbuf[:2]):
        return "float32"
    return sbuf[0].dtype if sbuf else "bfloat16"


# ---------------------------------------------------------------------------- result
@dataclass
class KernelCost:
    """The modelled execution of one kernel run (times in nanoseconds)."""

    kernel_name: str
    target: str  # chip name
    neuroncore: str  # "v2", "v3", "v4"
    lnc: int
    programs: int
    cores: int  # physical cores used
    latency_ns: float
    engine_busy_ns: dict[str, float]
    instruction_counts: dict[str, int]
    flops: int
    flops_dtype: str | None
    peak_flops_per_second: float  # TensorE peak of one physical core for flops_dtype
    dma_bytes: int
    peak_dma_bytes_per_second: float  # per physical core
    events: list[TimelineEvent] = field(default_factory=list, repr=False)

    @property
    def latency_seconds(self) -> float:
        return self.latency_ns * 1e-9

    @property
    def latency_us(self) -> float:
        return self.latency_ns * 1e-3

    @property
    def hfu(self) -> float:
        """Hardware FLOPs utilisation: FLOPs / (latency x TensorE peak x physical cores) (facts 9)."""
        denominator = self.latency_seconds * self.peak_flops_per_second * self.cores
        return self.flops / denominator if denominator > 0 else 0.0

    @property
    def mbu(self) -> float:
        """Memory-bound utilisation: DMA bytes / (latency x peak DMA bandwidth x physical cores)."""
        denominator = self.latency_seconds * self.peak_dma_bytes_per_second * self.cores
        return self.dma_bytes / denominator if denominator > 0 else 0.0

    def utilisation(self, engine: str) -> float:
        """Busy time of ``engine`` over latency x physical cores (DMA: share of engine-time moving bytes)."""
        denominator = self.latency_ns * self.cores
        return self.engine_busy_ns.get(engine, 0.0) / denominator if denominator > 0 else 0.0

    utilization = utilisation

    def timeline(self) -> list[TimelineEvent]:
        """Every instruction with its engine (DMA queue), start and end, in start order."""
        return sorted(self.events, key=lambda e: (e.start_ns, e.index))

    def top_instructions(self, n: int = 10) -> list[dict[str, Any]]:
        """Kernel lines by modelled engine time (instructions of one line and opcode summed)."""
        groups: dict[tuple, dict[str, Any]] = {}
        for e in self.events:
            key = (e.location, e.opcode, e.engine)
            g = groups.get(key)
            if g is None:
                g = groups[key] = {"location": e.location, "source": e.source, "opcode": e.opcode,
                                   "engine": e.engine, "count": 0, "total_ns": 0.0, "formula": e.formula}
            g["count"] += 1
            g["total_ns"] += e.duration_ns
        return sorted(groups.values(), key=lambda g: -g["total_ns"])[:n]

    def table(self, top: int = 10) -> str:
        """A text report: latency, utilisation per engine, HFU/MBU and the costliest kernel lines."""
        from rich.console import Console
        from rich.markup import escape
        from rich.table import Table

        console = Console(width=140, record=True, file=open(os.devnull, "w"))  # noqa: SIM115
        title = (f"NKI kernel {self.kernel_name!r} on {self.target} (NeuronCore-{self.neuroncore}), "
                 f"LNC={self.lnc}, {self.programs} program(s)")
        summary = Table(title=escape(title), show_header=False)
        summary.add_row("modelled latency", f"{self.latency_us:,.3f} us")
        summary.add_row("instructions", f"{sum(self.instruction_counts.values()):,}")
        summary.add_row("FLOPs", f"{self.flops:,}" + (f" ({self.flops_dtype})" if self.flops_dtype else ""))
        summary.add_row("HFU", f"{self.hfu:.2%} of {self.peak_flops_per_second * self.cores / 1e12:.2f} TFLOPS")
        summary.add_row("DMA bytes", f"{self.dma_bytes:,}")
        summary.add_row("MBU", f"{self.mbu:.2%} of {self.peak_dma_bytes_per_second * self.cores / 1e9:.1f} GB/s")
        console.print(summary)
        engines = Table(title="engines")
        for column in ("engine", "instructions", "busy", "utilisation"):
            engines.add_column(column, justify="right" if column != "engine" else "left")
        for engine in sorted(set(self.engine_busy_ns) | set(self.instruction_counts), key=_engine_order):
            engines.add_row(engine, f"{self.instruction_counts.get(engine, 0):,}",
                            f"{self.engine_busy_ns.get(engine, 0.0) / 1e3:,.3f} us",
                            f"{self.utilisation(engine):.1%}")
        console.print(engines)
        rows = self.top_instructions(top)
        if rows:
            lines = Table(title=f"top {len(rows)} kernel lines by engine time")
            for column in ("location", "opcode", "engine", "count", "time", "formula", "source"):
                lines.add_column(column, overflow="fold")
            for r in rows:
                lines.add_row(escape(r["location"] or "-"), escape(r["opcode"]), r["engine"], f"{r['count']:,}",
                              f"{r['total_ns'] / 1e3:,.3f} us", escape(r["formula"]), escape(r["source"] or ""))
            console.print(lines)
        return console.export_text()

    def __str__(self) -> str:
        return self.table()

    def to_chrome_trace(self, path: str | os.PathLike | None = None) -> dict:
        """The timeline as Chrome trace JSON (chrome://tracing, Perfetto); written to ``path`` if given."""
        from torchneuron.profiler.nki_trace import chrome_trace, write_chrome_trace

        if path is None:
            return chrome_trace(self)
        return write_chrome_trace(self, path)


def _engine_order(engine: str) -> tuple[int, str]:
    return (_TRACK_ORDER.get(engine, 5 if engine == Engine.DMA else 6), engine)


# ---------------------------------------------------------------------------- entry point
def estimate(run: Any, target: str | ChipSpec | None = None, *, lnc: int | None = None,
             grid: tuple[int, ...] | None = None, options: CostOptions | None = None,
             kernel_name: str | None = None) -> KernelCost:
    """Model the execution of a kernel run.

    Args:
        run: a :class:`~torchneuron.nki.context.KernelRun` (its target, LNC and grid are used)
            or a sequence of :class:`Instruction` records (then ``target`` is required).
        target: chip name or :class:`ChipSpec`; overrides the run's target.
        lnc: 1, or 2 to run programs 0 and 1 on two physical cores.
        grid: the launch grid (programs); defaults to the run's.
        options: :class:`CostOptions` (e.g. another DMA figure set).
    """
    if isinstance(run, (list, tuple)):
        instructions: Sequence[Instruction] = run
        chip = target
        run_lnc, run_grid, name = 1, None, kernel_name or "kernel"
    else:
        instructions = run.instructions
        chip = target if target is not None else run.target
        run_lnc, run_grid, name = run.lnc, run.grid, kernel_name or run.kernel_name
    if chip is None:
        raise TypeError("estimate(instructions) needs target= (a chip name such as 'trn2' or a ChipSpec)")
    chip = get_chip(chip) if isinstance(chip, str) else chip
    lnc = int(lnc if lnc is not None else run_lnc or 1)
    if lnc not in (1, 2):
        raise ValueError(f"lnc must be 1 or 2, got {lnc}")
    model = _Model(chip, options or CostOptions())
    by_program: dict[int, list[Instruction]] = defaultdict(list)
    for ins in instructions:
        by_program[ins.program].append(ins)
    for lst in by_program.values():
        lst.sort(key=lambda i: i.index)
    programs = max(math.prod(grid or run_grid or (1,)), len(by_program))
    cores = lnc if lnc > 1 else 1
    scheduler = _Scheduler(model, instructions, cores)
    collecting = gc.isenabled()
    gc.disable()  # the schedule allocates many small acyclic objects; cyclic GC passes only cost time
    try:
        if cores == 1:
            # Decision 14: legacy SPMD programs run one after another on one core.
            for program in sorted(by_program):
                core = scheduler.cores[0]
                core.fence = core.end
                for ins in by_program[program]:
                    scheduler.run(0, ins)
        else:
            _run_lnc(scheduler, by_program, cores)
    finally:
        if collecting:
            gc.enable()
    latency = max((c.end for c in scheduler.cores), default=0.0)
    busy: dict[str, float] = defaultdict(float)
    counts: dict[str, int] = defaultdict(int)
    dma_bytes = 0
    for e in scheduler.events:
        counts[e.engine] += 1
        if e.engine != Engine.DMA:
            busy[e.engine] += e.duration_ns
        else:
            dma_bytes += e.bytes
    if counts.get(Engine.DMA):
        busy[Engine.DMA] = scheduler.dma_engine_ns / model.dma_engines
    flops_by_dtype = scheduler.flops_by_dtype
    total_flops = sum(flops_by_dtype.values())
    flops_dtype = max(flops_by_dtype, key=flops_by_dtype.get) if flops_by_dtype else None
    peak = (chip.tensor_flops_per_second(flops_dtype) if flops_dtype else None) or chip.tensor_bf16_flops_per_second
    return KernelCost(
        kernel_name=name, target=chip.name, neuroncore=chip.neuroncore_version, lnc=lnc, programs=programs,
        cores=cores, latency_ns=latency, engine_busy_ns=dict(busy), instruction_counts=dict(counts),
        flops=total_flops, flops_dtype=flops_dtype, peak_flops_per_second=peak, dma_bytes=dma_bytes,
        peak_dma_bytes_per_second=model.peak_dma * 1e9, events=scheduler.events)


def _run_lnc(scheduler: _Scheduler, by_program: dict[int, list[Instruction]], cores: int) -> None:
    """Decision 14 / 7: programs on separate physical cores, meeting at core_barrier / sendrecv."""
    streams: dict[int, list[Instruction]] = {c: [] for c in range(cores)}
    for program in sorted(by_program):
        streams[program % cores].extend(by_program[program])
    position = {c: 0 for c in streams}
    while True:
        for c, lst in streams.items():
            i = position[c]
            while i < len(lst) and lst[i].opcode not in _SYNC_OPS:
                scheduler.run(c, lst[i])
                i += 1
            position[c] = i
        waiting = [(c, streams[c][position[c]]) for c in streams if position[c] < len(streams[c])]
        if not waiting:
            return
        ready = {}
        for c, ins in waiting:
            core = scheduler.cores[c]
            t = scheduler.ready(core, ins)
            if ins.engine != Engine.DMA:
                t = max(t, core.engine_free[ins.engine])
            ready[c] = t
        common = max(ready.values())
        events = [scheduler.commit(c, ins, common) for c, ins in waiting]
        done = max(e.end_ns for e in events)  # the barrier completes when the last core arrives
        for c, _ in waiting:
            core = scheduler.cores[c]
            core.fence = max(core.fence, done)
            core.end = max(core.end, done)
            position[c] += 1
