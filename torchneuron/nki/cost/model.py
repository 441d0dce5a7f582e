"""Isolated cost of one instruction in the NKI cost model: :class:`InstructionCost`, and
``CostModel``, which holds the chip-derived constants (clocks, dependency overheads, DMA rate
and HBM share), applies the formula each instruction's declaration names for its engine
(:mod:`torchneuron.nki.registry`; a missing one is an ``NkiCostFormulaError``),
models DMA transfers (fixed cost, engines used, HBM cap, efficiency, transpose; decisions
10-13) and memoises costs on everything the formulas read; :func:`instruction_cost` is its
public one-instruction entry point.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from torchneuron.hardware.specs import ChipSpec, get_chip
from torchneuron.nki import registry
from torchneuron.nki.cost.constants import (
    COMPUTE_ENGINE_NAMES,
    DMA_TRANSPOSE_FROM_HBM,
    DMA_TRANSPOSE_FROM_SBUF,
    ON_CHIP_BUFFERS,
    PARTITIONS_PER_DMA_ENGINE,
)
from torchneuron.nki.cost.dma import dma_efficiency
from torchneuron.nki.cost.formulas import (
    clock_ghz,
    dependency_cycles,
    enum_name,
    is_contiguous_operand,
    is_set,
    nc_generation,
    on_chip_operands,
)
from torchneuron.nki.cost.options import CostOptions
from torchneuron.nki.instruction import Engine, Instruction, Operand


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


class CostModel:
    """Chip-derived constants and the per-instruction cost."""

    def __init__(self, chip: ChipSpec, options: CostOptions) -> None:
        self.chip = chip
        self.options = options
        self.gen = nc_generation(chip)
        self.ghz = {e: clock_ghz(chip, e) for e in COMPUTE_ENGINE_NAMES}
        self.dep_ns = {e: dependency_cycles(e) / self.ghz[e] for e in COMPUTE_ENGINE_NAMES}
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
        """The formula the instruction's declaration gives for its engine (registry), applied."""
        result = registry.cost_formula(ins.opcode, ins.engine)(ins, self)
        if isinstance(result, InstructionCost):
            return result
        cycles, formula = result
        if ins.engine == Engine.SYNC:
            return InstructionCost(ins.engine, 0.0, 0.0, formula)
        ghz = self.ghz.get(ins.engine, self.ghz[Engine.VECTOR])
        return InstructionCost(ins.engine, cycles, cycles / ghz, formula)

    def dma_cost(self, ins: Instruction) -> InstructionCost:
        """facts 9 DMA; decisions 10-13."""
        reads, writes = ins.reads, ins.writes
        index_reads = int(ins.attrs.get("index_reads", 0))
        if index_reads:  # an indirect DMA's index tiles: read by the descriptor generator, not moved
            reads = reads[index_reads:]
        nbytes = max(sum(o.bytes for o in reads), sum(o.bytes for o in writes))
        on_chip = on_chip_operands(tuple(reads) + tuple(writes))
        if on_chip:
            rows = max(o.partitions for o in on_chip)
            bpp = min(o.bytes_per_partition for o in on_chip)
        else:
            dst = writes[0] if writes else (reads[0] if reads else None)
            rows = dst.shape[0] if dst is not None and len(dst.shape) > 1 else 1
            bpp = nbytes / max(rows, 1)
        k = max(1, min(self.dma_engines, math.ceil(max(rows, 1) / PARTITIONS_PER_DMA_ENGINE)))
        itemsize = min((o.itemsize for o in tuple(reads) + tuple(writes)), default=4)
        if any(len(o.shape) and o.shape[-1] > 1 and not is_contiguous_operand(o) for o in tuple(reads) + tuple(writes)):
            bpp = itemsize  # decision 12: element-granular descriptors
        descriptor = ins.attrs.get("descriptor_bytes")
        if descriptor:  # an indirect DMA: one descriptor per contiguous run of each index's row
            bpp = min(bpp, float(descriptor))
        factor = 1.0
        formula = "dma fixed + bytes/k / (rate x eff)"
        transpose = ins.opcode == "dma_transpose" or is_set(ins.attrs.get("transpose"))
        if transpose:
            src = reads[0] if reads else None
            if ins.opcode == "dma_transpose" and self.gen >= 3:
                hbm_src = src is not None and src.buffer not in ON_CHIP_BUFFERS
                factor = DMA_TRANSPOSE_FROM_HBM if hbm_src else DMA_TRANSPOSE_FROM_SBUF  # facts 9
                formula += f" x {factor:g} transpose"
            else:
                bpp = itemsize  # decision 13: element-wise transposing descriptors
                formula += " element-wise transpose"
        hbm_sides = sum(1 for side in (reads, writes) if any(o.buffer not in ON_CHIP_BUFFERS for o in side))
        rate = self.dma_rate
        if hbm_sides and self.options.hbm_cap:
            rate = min(rate, self.hbm_share / self.dma_engines / hbm_sides)  # decision 11
        if self.options.dma_queue_per_call_site:
            eff = 1.0  # decision 17: the queue's issue rate, not a per-transfer efficiency
            formula = formula.replace(" x eff", "") + " (queue per call site)"
        else:
            eff = dma_efficiency(bpp)
        data_ns = (nbytes / k) / (rate * eff * factor) if nbytes else 0.0
        hwdge = enum_name(ins.attrs.get("dge_mode")) == "hwdge" and self.gen >= 3
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
    return CostModel(chip, options or CostOptions()).cost(ins)
