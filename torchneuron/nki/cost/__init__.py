"""Engine-level cost model of an NKI kernel run: per-instruction cost, scheduling, utilisation.

:func:`estimate` takes the instruction log of a :class:`~torchneuron.nki.context.KernelRun`
(or a list of :class:`~torchneuron.nki.instruction.Instruction` records and a chip) and
returns a :class:`KernelCost`: modelled latency, start/end of every instruction on its
engine, per-engine busy time and utilisation, FLOPs and hardware FLOPs utilisation (HFU),
DMA bytes and memory-bound utilisation (MBU), a report table and a Chrome trace.
The model never looks at tensor values, only at the records.

Each instruction's formula per engine is named in its one declaration in ``torchneuron.nki.isa``
(:func:`torchneuron.nki.isa.core.instruction`, stored in :mod:`torchneuron.nki.registry`);
the formulas live in :mod:`torchneuron.nki.cost.formulas`.

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
  ``min(16, ceil(partitions / 8))`` DMA engines [facts 9 DMA], efficiency from AWS's
  published throughput curve (decision 12).

Decisions where the facts are silent (for docs/nki.md)
-------------------------------------------------------
1. **MIN_II floor everywhere.** Every VectorE/ScalarE formula is floored at MIN_II (the
   minimum initiation interval), including ``tensor_reduce``, ``max8`` and
   ``nc_find_index8`` whose legacy formulas omit it. Fractional cycles are kept.
2. **Instructions without a published formula** are declared with an explicit one (no
   silent fallback: an instruction recorded on an engine its declaration gives no formula
   for raises ``NkiCostFormulaError``, :mod:`torchneuron.nki.registry`). VectorE "N per
   full-size input" (N for one, 2N for two; ``tensor_scalar_cumulative``, ``rng``,
   ``rand2``, ``set_rng_seed``, ``quantize_mx``); GpSimd ``150 + N`` per full-size input
   (GPSIMD_START is the only published GpSimd overhead; "no general rule of thumb" in the
   facts), GpSimd ``tensor_scalar(rsqrt)`` ``150 + 4N`` (a quarter of ScalarE's rsqrt
   throughput); ``nc_match_replace8`` as ``nc_find_index8``; SyncE and register
   instructions cost 0.
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
    contiguous) is AWS's published throughput curve for ``[128, F]`` transfers (the figure
    "DMA Throughput varying Bytes per Partition for p_dim = 128" of the NKI DMA overview,
    measured on NeuronCore-v3): its 11 points from 32 B to 32 KiB, as fractions of the
    32 KiB point (``DMA_EFFICIENCY_POINTS``; the figure has no y-axis values, so only
    ratios are used and its plateau is taken as the per-engine table rate), interpolated
    linearly in log2(b), 1.0 from 32 KiB, proportional to b below 32 B. It reads 10% at
    256 B, 42% at 1 KiB, 81% at 2 KiB and 97% at 4 KiB, in line with the prose thresholds
    (< 256 B overhead-bound, >= 2 KiB approaches peak, >= 4 KiB saturates). The same
    relative curve is used on v2 and v4 (only the v3 curve is published). The efficiency
    lengthens the time a transfer occupies its engines (each engine processes one transfer
    at a time, NeuronCore-v2 architecture guide), so more queues do not hide it.
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
17. **What-if, not the default: a DMA queue per call site** (``CostOptions(
    dma_queue_per_call_site=True)``). Each DMA call site (source line and requested
    trigger engine) has its own queue; a queue starts one transfer per fixed cost (the
    next transfer's descriptor setup overlaps this one's data) and the efficiency curve is
    not applied. On one queue this gives ``bytes / max(fixed, data)`` per transfer, which
    reproduces the published v3 curve of decision 12: with the published 1300 ns and 600 ns
    fixed costs it brackets every published point up to 2 KiB per partition (the curve's
    knee implies ~850 ns). Which queue a compiled kernel's transfers take is not published
    ("typically tied to the trigger engine and the method of descriptor generation", DMA
    overview), so this stays an option.

Attributes read from ``Instruction.attrs``: ``op``/``op0``/``op1`` (ALU or activation),
``stationary_free``/``moving_free`` (dst-side sizes of ``nc_matmul``: the dst is
``[stationary_free, moving_free]``; without them the dst shape is used), ``perf_mode``,
``is_transpose``, ``is_stationary_onezero``, ``is_moving_onezero``, ``value`` (memset),
``reduce_res`` (activation read-out), ``num_elem_per_idx``/``num_valid_indices``
(local_gather), ``dge_mode``, ``transpose`` (DMA), ``depends_on``, ``no_reorder``.
nc_matmul's stationary and moving are its first two SBUF reads.
"""

from __future__ import annotations

# The public API (__all__) and the documented figures, each defined once in a submodule; helpers
# shared between submodules have public names there (tests/nki/test_nki_structure.py).
from torchneuron.nki.cost.constants import (  # noqa: F401  documented figures, public for tests and docs
    ACCESS_START,
    DMA_FIXED_NS,
    DMA_OVERHEAD_BOUND_BYTES,
    DMA_QUEUES,
    DMA_SATURATING_BYTES,
    DMA_TRANSPOSE_FROM_HBM,
    DMA_TRANSPOSE_FROM_SBUF,
    FP32_MATMUL_FACTOR,
    GAP_WINDOW,
    GPSIMD_START,
    HWDGE_FIXED_NS,
    LOAD_STATIONARY_SPEEDUP,
    MIN_II,
    MIN_II_DYNAMIC,
    MM_FLOOR,
    MM_INIT_LATENCY,
    PARTITIONS_PER_DMA_ENGINE,
    SCALAR_DEPENDENT_SPACING,
    STRIDE_PENALTY_BYTES,
    VECTOR_STATIC_OVERHEAD,
)
from torchneuron.nki.cost.dma import dma_efficiency
from torchneuron.nki.cost.model import InstructionCost, instruction_cost
from torchneuron.nki.cost.options import CostOptions
from torchneuron.nki.cost.report import KernelCost, TimelineEvent
from torchneuron.nki.cost.schedule import estimate

__all__ = [
    "CostOptions", "InstructionCost", "TimelineEvent", "KernelCost", "estimate", "instruction_cost",
    "dma_efficiency", "MIN_II",
]
