"""User-tunable knobs of the NKI cost model: :class:`CostOptions` overrides the DMA rate, the
DMA fixed costs, the HBM cap and the number of DMA queues; its defaults are the documented
figures of :mod:`torchneuron.nki.cost.constants` (see the :mod:`torchneuron.nki.cost`
docstring, decisions 10-11).
"""

from __future__ import annotations

from dataclasses import dataclass

from torchneuron.nki.cost.constants import DMA_FIXED_NS, DMA_QUEUES, HWDGE_FIXED_NS


@dataclass(frozen=True)
class CostOptions:
    """Knobs of the model; the defaults are the documented figures (module docstring)."""

    dma_bytes_per_ns_per_engine: float | None = None  # None: ChipSpec's 17/23/33 B/ns table
    dma_fixed_ns: float = DMA_FIXED_NS
    hwdge_fixed_ns: float = HWDGE_FIXED_NS
    hbm_cap: bool = True  # cap HBM transfers at the core's HBM share (decision 11)
    dma_queues: int = DMA_QUEUES  # queues used round-robin per engine (decision 10)
