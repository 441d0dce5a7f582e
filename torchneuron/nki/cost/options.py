"""User-tunable knobs of the NKI cost model: :class:`CostOptions` overrides the DMA rate, the
DMA fixed costs, the HBM cap, the number of DMA queues and how transfers take queues; its
defaults are the documented figures of :mod:`torchneuron.nki.cost.constants` (see the
:mod:`torchneuron.nki.cost` docstring, decisions 10-12 and 17).
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
    # What-if, not the default (decision 17; no published figure says which queue a transfer
    # takes): each DMA call site (source line and requested trigger engine) has its own queue,
    # a queue starts one transfer per fixed cost (the next one's descriptor setup overlaps this
    # one's data), and the efficiency curve is not applied (one queue's issue rate is what
    # shapes the published curve).
    dma_queue_per_call_site: bool = False
