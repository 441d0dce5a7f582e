"""Documented figures of the NKI cost model (nki-api-facts.md section 9 unless noted) and the
engine / buffer / dtype sets the other modules share: instruction initiation intervals,
dependency overheads, DMA fixed costs, queue counts and efficiency thresholds, the gap-search
window and the display order of engine tracks. Every module reads them from here so each
value exists once.
"""

from __future__ import annotations

from torchneuron.hardware.engines import (
    COMPUTE_ENGINES,
    DMA_FIXED_SECONDS,
    HWDGE_FIXED_SECONDS,
    TRACK_ORDER,
)

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
DMA_FIXED_NS = DMA_FIXED_SECONDS * 1e9  # facts 9 DMA: fixed ~1300 ns per transfer
HWDGE_FIXED_NS = HWDGE_FIXED_SECONDS * 1e9  # facts 9 DMA: hwdge ~600 ns per instruction (v3+)
DMA_QUEUES = 16  # facts 9 DMA: 16 queues per engine
PARTITIONS_PER_DMA_ENGINE = 8  # facts 9 DMA: each engine serves 8 partitions
DMA_OVERHEAD_BOUND_BYTES = 256  # facts 9 DMA: below 256 B per partition overhead-bound
DMA_SATURATING_BYTES = 4096  # facts 9 DMA: >= 4 KiB per partition saturates
# DMA throughput against bytes per partition for a [128, F] transfer, relative to the
# 32 KiB point: AWS's published curve, the figure "DMA Throughput varying Bytes per Partition
# for p_dim = 128" of the NKI DMA overview (aws-neuron-sdk nki/get-started/about/
# nki-dma-overview.rst, image nki/img/overviews/nki-dma-intro-1.jpg @ 81ce03ae; measured on
# NeuronCore-v3). The figure prints no y-axis values: these are the heights of its 11 points
# above the axis, read from the image's pixels, divided by the 32 KiB point's height (the
# plateau, "at 4096 free bytes, we are able to nearly saturate DMA bandwidth"). They agree
# with the prose thresholds above: 10% at 256 B, 81% at 2 KiB, 97% at 4 KiB.
DMA_EFFICIENCY_POINTS = (
    (32, 0.017), (64, 0.028), (128, 0.053), (256, 0.104), (512, 0.209), (1024, 0.425),
    (2048, 0.815), (4096, 0.967), (8192, 0.983), (16384, 0.992), (32768, 1.0),
)
DMA_TRANSPOSE_FROM_HBM = 0.9  # facts 9 DMA: transpose up to 90% HBM->SBUF (v3)
DMA_TRANSPOSE_FROM_SBUF = 0.5  # facts 9 DMA: 50% SBUF->SBUF (v3)
GAP_WINDOW = 64  # decision 9/10: gap search depth of shared resources

ON_CHIP_BUFFERS = ("sbuf", "psum")
TWO_BYTE_FLOAT_DTYPES = frozenset(("bfloat16", "float16"))
FP8_DTYPES = frozenset(("float8_e4m3", "float8_e5m2", "float8_e4m3fn", "cfp8"))
SYNC_OPCODES = frozenset(("core_barrier", "sendrecv"))
# The chip's engine list and display order (hardware/engines.py), by NKI's record names.
COMPUTE_ENGINE_NAMES = tuple(e.short for e in COMPUTE_ENGINES)
TRACK_POSITION = {e.short: i for i, e in enumerate(TRACK_ORDER)}  # tensor 0 ... sync 4, dma 5
