"""Cost model end to end: kernels written with nki.language / nki.isa, simulated, then estimated."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import torchneuron.nki as nki
import torchneuron.nki.isa as nisa
import torchneuron.nki.language as nl
from torchneuron.hardware.specs import get_chip
from torchneuron.nki import benchmarking
from torchneuron.nki import cost as C
from torchneuron.testing import accumulation_tolerance, assert_close_to_reference, unit_roundoff

TRN1 = get_chip("trn1")


@nki.jit
def matmul_basic(lhsT, rhs):
    """The NKI tutorial's basic tiled matmul: every tile is loaded inside the k loop."""
    K, M = lhsT.shape
    _, N = rhs.shape
    result = nl.ndarray((M, N), dtype=lhsT.dtype, buffer=nl.shared_hbm)
    for m in nl.affine_range(M // 128):
        for n in nl.affine_range(N // 512):
            res_psum = nl.zeros((128, 512), nl.float32, buffer=nl.psum)
            for k in nl.affine_range(K // 128):
                lhsT_tile = nl.load(lhsT[k * 128:(k + 1) * 128, m * 128:(m + 1) * 128])
                rhs_tile = nl.load(rhs[k * 128:(k + 1) * 128, n * 512:(n + 1) * 512])
                res_psum += nl.matmul(lhsT_tile, rhs_tile, transpose_x=True)
            res_sb = nl.copy(res_psum, dtype=result.dtype)
            nl.store(result[m * 128:(m + 1) * 128, n * 512:(n + 1) * 512], value=res_sb)
    return result


@nki.jit
def matmul_hoisted(lhsT, rhs):
    """The same product with the stationary tiles of a row block loaded once, outside the n loop."""
    K, M = lhsT.shape
    _, N = rhs.shape
    result = nl.ndarray((M, N), dtype=lhsT.dtype, buffer=nl.shared_hbm)
    for m in nl.affine_range(M // 128):
        lhsT_tiles = [nl.load(lhsT[k * 128:(k + 1) * 128, m * 128:(m + 1) * 128]) for k in range(K // 128)]
        for n in nl.affine_range(N // 512):
            res_psum = nl.ndarray((128, 512), nl.float32, buffer=nl.psum)
            for k in nl.affine_range(K // 128):
                rhs_tile = nl.load(rhs[k * 128:(k + 1) * 128, n * 512:(n + 1) * 512])
                nisa.nc_matmul(dst=res_psum, stationary=lhsT_tiles[k], moving=rhs_tile, accumulate=k > 0)
            res_sb = nl.ndarray((128, 512), dtype=result.dtype, buffer=nl.sbuf)
            nisa.tensor_copy(dst=res_sb, src=res_psum)
            nisa.dma_copy(dst=result[m * 128:(m + 1) * 128, n * 512:(n + 1) * 512], src=res_sb)
    return result


def _inputs(k=512, m=256, n=1024):
    rng = np.random.default_rng(0)
    return (rng.random((k, m), np.float32).astype(ml_dtypes.bfloat16),
            rng.random((k, n), np.float32).astype(ml_dtypes.bfloat16))


def test_tiled_matmul_is_simulated_and_costed():
    a, b = _inputs()
    out, cost = benchmarking.profile(matmul_basic, target="trn1")(a, b)
    ref = a.astype(np.float64).T @ b.astype(np.float64)
    # non-negative products: K = 512 summed in fp32 (relative gamma_512), then one bf16 rounding
    assert_close_to_reference(out, ref, rtol=accumulation_tolerance(1.0, 512, np.float32) + unit_roundoff(out.dtype))
    matmuls = [e for e in cost.events if e.opcode == "nc_matmul"]
    assert len(matmuls) == 4 * 2 * 2
    per = 512 / TRN1.tensor_clock_hz * 1e9  # max(min(64, 128), 512) cycles at 2.8 GHz
    assert all(e.duration_ns == pytest.approx(per) for e in matmuls)
    assert cost.engine_busy_ns["tensor"] == pytest.approx(len(matmuls) * per)
    assert cost.flops == 2 * 512 * 256 * 1024 and cost.flops_dtype == "bfloat16"
    assert cost.hfu == pytest.approx(cost.flops / (cost.latency_seconds * 92e12))
    assert cost.instruction_counts["dma"] == 2 * len(matmuls) + 4
    assert cost.dma_bytes == len(matmuls) * (128 * 128 + 128 * 512) * 2 + 256 * 1024 * 2
    # every matmul starts after the loads of its two tiles (same source line order: lhsT, rhs, matmul)
    by_index = {e.index: e for e in cost.events}
    for e in matmuls:
        assert e.start_ns >= by_index[e.index - 1].end_ns and e.start_ns >= by_index[e.index - 2].end_ns
    assert cost.latency_ns < sum(e.duration_ns for e in cost.events)  # engines overlap
    text = str(cost)
    assert "nl.load(rhs[k * 128:(k + 1) * 128, n * 512:(n + 1) * 512])" in text.replace("\n", "") or \
        "rhs_tile = nl.load(rhs[k" in text


def test_hoisting_loads_lowers_modelled_latency():
    a, b = _inputs()
    basic = benchmarking.estimate(matmul_basic, a, b, target="trn1")
    hoisted = benchmarking.estimate(matmul_hoisted, a, b, target="trn1")
    assert hoisted.dma_bytes < basic.dma_bytes
    assert hoisted.latency_ns < basic.latency_ns
    assert hoisted.hfu > basic.hfu
    assert hoisted.flops == basic.flops


def test_benchmark_decorator_on_an_nki_kernel():
    a, b = _inputs(256, 128, 512)
    bench = benchmarking.benchmark(warmup=5, iters=10)(matmul_basic)
    bench(a, b)
    p99 = bench.benchmark_result.nc_latency.get_latency_percentile(99)
    again = benchmarking.estimate(matmul_basic, a, b)  # the same default target: the same model
    assert p99 == pytest.approx(again.latency_us) and p99 > 0


@nki.jit
def scale_rows(x):
    """Each LNC program scales its half of the rows."""
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    half = x.shape[0] // nl.num_programs()
    base = nl.program_id(0) * half
    for i in nl.affine_range(half // 128):
        rows = slice(base + i * 128, base + (i + 1) * 128)
        tile = nl.load(x[rows, :])
        nisa.activation(dst=tile, op=nl.exp, data=tile, scale=2.0)
        nl.store(out[rows, :], value=tile)
    return out


def test_lnc2_halves_the_work_per_core():
    x = np.random.default_rng(1).random((1024, 512), np.float32)
    one = benchmarking.estimate(scale_rows, x, target="trn2")
    two = benchmarking.estimate(scale_rows[2], x, target="trn2")
    assert two.cores == 2 and {e.core for e in two.events} == {0, 1}
    assert two.instruction_counts == one.instruction_counts
    # half the tiles per core; the fixed DMA latency of each core's first load is not halved
    assert 0.5 * one.latency_ns <= two.latency_ns < 0.75 * one.latency_ns
    np.testing.assert_allclose(nki.simulate(scale_rows[2])(x), np.exp(2 * x), rtol=1e-5)


def test_dependent_scalar_chain_in_a_kernel():
    @nki.jit
    def chain(x):
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        t = nl.load(x)
        for _ in range(4):
            nisa.activation(dst=t, op=nl.exp, data=t)
        nl.store(out, value=t)
        return out

    x = np.zeros((128, 512), np.float32)
    cost = benchmarking.estimate(chain, x, target="trn1")
    acts = sorted((e for e in cost.events if e.opcode == "activation"), key=lambda e: e.index)
    gap = (C.SCALAR_DEPENDENT_SPACING - C.MIN_II) / TRN1.scalar_clock_hz * 1e9
    for prev, nxt in zip(acts, acts[1:]):
        assert nxt.start_ns == pytest.approx(prev.end_ns + gap)
        assert nxt.duration_ns == pytest.approx(512 / TRN1.scalar_clock_hz * 1e9)
