"""DMA efficiency curve of the NKI cost model (decision 12): the fraction of the per-engine
DMA rate a transfer reaches for a given number of contiguous bytes per partition, read from
AWS's published throughput curve (``DMA_EFFICIENCY_POINTS`` in
:mod:`torchneuron.nki.cost.constants`, the figure of the NKI DMA overview,
aws-neuron-sdk ``nki/get-started/about/nki-dma-overview.rst``).

Between two published points the efficiency is interpolated linearly in log2(bytes), as the
figure draws them; from 32 KiB on it is 1.0. Below the smallest point (32 B) throughput is
taken as proportional to the bytes per partition: from 64 B to 1 KiB the published
throughput doubles with every doubling of the bytes (a transfer's time does not depend on its
size there), and that slope is kept below 32 B (an extrapolation; no point is published).
The transfer cost that applies it is :meth:`CostModel.dma_cost` in
:mod:`torchneuron.nki.cost.model`.
"""

from __future__ import annotations

import math

from torchneuron.nki.cost.constants import DMA_EFFICIENCY_POINTS


def dma_efficiency(bytes_per_partition: float) -> float:
    """Decision 12: DMA efficiency for ``bytes_per_partition`` contiguous bytes (published curve)."""
    b = max(float(bytes_per_partition), 1.0)
    first_bytes, first_eff = DMA_EFFICIENCY_POINTS[0]
    if b <= first_bytes:
        return first_eff * b / first_bytes
    for (b0, e0), (b1, e1) in zip(DMA_EFFICIENCY_POINTS, DMA_EFFICIENCY_POINTS[1:]):
        if b <= b1:
            t = math.log2(b / b0) / math.log2(b1 / b0)
            return e0 + t * (e1 - e0)
    return 1.0
