"""DMA cost of the NKI cost model (torchneuron/nki/cost/dma.py, model.py): the efficiency
curve is AWS's published throughput-against-bytes-per-partition curve (NKI DMA overview
figure), and a transfer occupies its engines for bytes / (rate x efficiency), whatever the
number of DMA queues. Expected values are computed here from the published points and the
per-engine rate, never hard-coded latencies.
"""

from __future__ import annotations

import math

import pytest

from torchneuron.hardware.specs import get_chip
from torchneuron.nki import cost as C
from torchneuron.nki.cost.constants import DMA_EFFICIENCY_POINTS
from torchneuron.nki.instruction import Instruction, Operand

TRN1 = get_chip("trn1")
TRN1_RATE = 17.0  # B/ns per engine (DMA bandwidth table); Trn1's HBM share, 410 GB/s / 16, is above it


def _operand(alloc: int, shape: tuple[int, int], buffer: str, dtype: str = "bfloat16", itemsize: int = 2,
             row_pitch: int | None = None) -> Operand:
    row = shape[1] * itemsize
    pitch = row_pitch or row
    return Operand(buffer=buffer, allocation=alloc, dtype=dtype, shape=shape, start_partition=0,
                   partitions=shape[0], free_elements=shape[1], itemsize=itemsize, inner_stride_bytes=itemsize,
                   extent=(0, (shape[0] - 1) * pitch + row), row_bytes=pitch)


def _load(index: int, free: int, hbm_alloc: int = 1, sbuf_alloc: int | None = None) -> Instruction:
    """A [128, free] bf16 HBM -> SBUF load, its HBM rows 16 KiB apart (a tile of a wider matrix)."""
    src = _operand(hbm_alloc, (128, free), "shared_hbm", row_pitch=16384)
    dst = _operand(sbuf_alloc if sbuf_alloc is not None else 100 + index, (128, free), "sbuf")
    return Instruction(index, "dma_copy", "dma", (src,), (dst,), {})


def test_efficiency_is_the_published_curve():
    for nbytes, published in DMA_EFFICIENCY_POINTS:
        assert C.dma_efficiency(nbytes) == pytest.approx(published)
    assert C.dma_efficiency(32768) == 1.0 and C.dma_efficiency(1 << 20) == 1.0
    values = [C.dma_efficiency(2 ** k) for k in range(0, 17)]
    assert values == sorted(values)


def test_efficiency_interpolates_in_log2_bytes_between_points():
    for (b0, e0), (b1, e1) in zip(DMA_EFFICIENCY_POINTS, DMA_EFFICIENCY_POINTS[1:]):
        assert C.dma_efficiency(math.sqrt(b0 * b1)) == pytest.approx((e0 + e1) / 2)


def test_efficiency_below_the_smallest_point_is_proportional_to_bytes():
    smallest, eff = DMA_EFFICIENCY_POINTS[0]
    assert C.dma_efficiency(smallest / 16) == pytest.approx(eff / 16)
    assert C.dma_efficiency(0) == pytest.approx(eff / smallest)  # at least one byte


def test_published_curve_agrees_with_the_published_thresholds():
    # DMA bandwidth guide: < 256 B severely overhead-bound, >= 2 KiB approaches peak, >= 4 KiB saturates.
    assert C.dma_efficiency(C.DMA_OVERHEAD_BOUND_BYTES - 1) < 0.15
    assert C.dma_efficiency(2048) > 0.8
    assert C.dma_efficiency(C.DMA_SATURATING_BYTES) > 0.95


@pytest.mark.parametrize("nbytes, published", DMA_EFFICIENCY_POINTS)
def test_load_occupies_each_engine_for_bytes_over_rate_times_published_efficiency(nbytes, published):
    cost = C.instruction_cost(_load(0, nbytes // 2), TRN1)
    assert cost.dma_engines == 16  # 128 partitions, 8 per engine
    assert cost.bytes == 128 * nbytes
    assert cost.data_ns == pytest.approx(128 * nbytes / 16 / (TRN1_RATE * published))


def test_quarter_size_tile_costs_what_the_curve_says():
    # The matmul tutorial's two tiles: lhsT [128, 128] bf16 (256 B per partition) and rhs
    # [128, 512] bf16 (1 KiB per partition). On the published curve throughput doubles with the
    # bytes from 64 B to 1 KiB, so the 4x smaller tile takes about as long.
    eff = dict(DMA_EFFICIENCY_POINTS)
    small = C.instruction_cost(_load(0, 128), TRN1).data_ns
    big = C.instruction_cost(_load(0, 512), TRN1).data_ns
    assert small / big == pytest.approx((256 / eff[256]) / (1024 / eff[1024]))


@pytest.mark.parametrize("queues", [1, 4, 16])
def test_dma_engine_time_is_not_hidden_by_more_queues(queues):
    # Each DMA engine processes one transfer at a time (NeuronCore-v2 architecture guide), so
    # independent loads on any number of queues add their engine time. A queue runs its
    # transfers in order: on one queue each transfer also waits out its fixed cost; with
    # enough queues (here fixed < 3 x data) the fixed costs overlap other transfers' data.
    n = 32
    log = [_load(i, 128) for i in range(n)]
    one = C.instruction_cost(log[0], TRN1)
    assert one.fixed_ns < 3 * one.data_ns
    latency = C.estimate(log, target=TRN1, options=C.CostOptions(dma_queues=queues)).latency_ns
    if queues == 1:
        assert latency == pytest.approx(n * (one.fixed_ns + one.data_ns))
    else:
        assert latency == pytest.approx(one.fixed_ns + n * one.data_ns)


# ------------------------------------------------------------- what-if: a queue per call site
def _site_load(index: int, free: int, site: str) -> Instruction:
    ins = _load(index, free)
    return Instruction(ins.index, ins.opcode, ins.engine, ins.reads, ins.writes, ins.attrs, site)


PER_SITE = C.CostOptions(dma_queue_per_call_site=True)


def test_call_site_queue_starts_one_transfer_per_fixed_cost():
    n = 16
    log = [_site_load(i, 128, "k.py:10") for i in range(n)]
    one = C.instruction_cost(log[0], TRN1, PER_SITE)
    assert one.data_ns == pytest.approx(128 * 256 / 16 / TRN1_RATE)  # no efficiency curve
    assert one.data_ns < one.fixed_ns
    latency = C.estimate(log, target=TRN1, options=PER_SITE).latency_ns
    assert latency == pytest.approx(n * one.fixed_ns + one.data_ns)


def test_two_call_sites_issue_concurrently():
    n = 16
    log = [_site_load(i, 128, "k.py:10" if i % 2 == 0 else "k.py:11") for i in range(n)]
    one = C.instruction_cost(log[0], TRN1, PER_SITE)
    latency = C.estimate(log, target=TRN1, options=PER_SITE).latency_ns
    # each site's queue starts n/2 transfers one fixed cost apart; the engines have room for both
    assert latency == pytest.approx((n // 2) * one.fixed_ns + 2 * one.data_ns)


def test_call_site_queue_is_data_bound_for_large_transfers():
    n = 8
    log = [_site_load(i, 8192, "k.py:10") for i in range(n)]  # 16 KiB per partition
    one = C.instruction_cost(log[0], TRN1, PER_SITE)
    assert one.data_ns > one.fixed_ns
    latency = C.estimate(log, target=TRN1, options=PER_SITE).latency_ns
    assert latency == pytest.approx(one.fixed_ns + n * one.data_ns)


def test_one_queue_issue_rate_brackets_the_published_curve():
    # On one queue, a stream of [128, F] transfers reaches bytes / max(fixed, data) per transfer.
    # With the two published fixed costs (~1300 ns per transfer, ~600 ns per hwdge instruction
    # on v3) it brackets the published v3 curve up to 2 KiB per partition, where the issue
    # rate is the limit.
    trn2 = get_chip("trn2")

    def relative_throughput(fixed_ns: float) -> dict[int, float]:
        opts = C.CostOptions(dma_queue_per_call_site=True, dma_fixed_ns=fixed_ns)
        thr = {}
        for nbytes, _ in DMA_EFFICIENCY_POINTS:
            log = [_site_load(i, nbytes // 2, "k.py:10") for i in range(64)]
            thr[nbytes] = 64 * 128 * nbytes / C.estimate(log, target=trn2, options=opts).latency_ns
        return {b: t / thr[32768] for b, t in thr.items()}

    slow, fast = relative_throughput(1300.0), relative_throughput(600.0)
    for nbytes, published in DMA_EFFICIENCY_POINTS:
        if nbytes <= 2048:
            assert slow[nbytes] < published < fast[nbytes]
