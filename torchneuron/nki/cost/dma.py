"""DMA efficiency curve of the NKI cost model (decision 12): the fraction of the per-engine
DMA rate a transfer reaches for a given number of contiguous bytes per partition, half at
the documented 256 B overhead-bound threshold and 1.0 from the 4 KiB saturation point.
The transfer cost that applies it is :meth:`_Model.dma_cost` in
:mod:`torchneuron.nki.cost.model`.
"""

from __future__ import annotations

from torchneuron.nki.cost.constants import DMA_OVERHEAD_BOUND_BYTES, DMA_SATURATING_BYTES


def dma_efficiency(bytes_per_partition: float) -> float:
    """Decision 12: DMA efficiency for ``bytes_per_partition`` contiguous bytes (facts 9 DMA)."""
    b = max(float(bytes_per_partition), 1.0)
    saturating = DMA_SATURATING_BYTES / (DMA_SATURATING_BYTES + DMA_OVERHEAD_BOUND_BYTES)
    return min(1.0, (b / (b + DMA_OVERHEAD_BOUND_BYTES)) / saturating)
