"""The example kernels of examples/nki/ against NumPy/torch references, and proof their kernel path ran.

Tolerances are error bounds derived for each kernel, not loose guesses. Notation:
``U_BF16 = 2**-8`` is bf16's unit roundoff (8 significant bits, round to nearest:
``|bf16(v) - v| <= 2**-8 |v|``), ``U_FP32 = 2**-24`` fp32's. Engines compute in
fp32 and round once into the destination dtype (nki-api-facts.md: 4), so every
bound is "one bf16 rounding of the result" plus first-order fp32 terms, the
largest of which is a sum of n fp32 terms (error <= (n - 1) U_FP32 sum|terms|).
References are computed in float64 from the kernels' bf16 inputs.
"""

from __future__ import annotations

import importlib.util
import math
import pathlib
import sys
from collections import Counter

import ml_dtypes
import numpy as np
import pytest

from torchneuron.nki import benchmarking
from torchneuron.testing import assert_close_to_reference, matmul_tolerance

EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / "examples" / "nki"
U_BF16 = 2.0 ** -8
U_FP32 = 2.0 ** -24
BF16 = ml_dtypes.bfloat16


def _example(name: str):
    """Import examples/nki/<name>.py under a unique module name (the directory is not a package)."""
    module_name = f"nki_example_{name}"
    if module_name in sys.modules:
        return sys.modules[module_name]
    spec = importlib.util.spec_from_file_location(module_name, EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    spec.loader.exec_module(module)
    return module


def _run(kernel, *args, target="trn2", **kwargs):
    """Run ``kernel`` on the simulator: (NumPy outputs, KernelRun with its instruction log)."""
    return benchmarking.run_kernel(kernel, args, kwargs, target=target)


def _ops(run) -> Counter:
    """How many instructions of each (opcode, engine) the run executed."""
    return Counter((i.opcode, i.engine) for i in run.instructions)


def _bf16(rng: np.random.Generator, shape, scale: float = 1.0, shift: float = 0.0) -> np.ndarray:
    return (shift + scale * rng.standard_normal(shape)).astype(BF16)


def _assert_within(out: np.ndarray, ref: np.ndarray, bound: np.ndarray | float) -> None:
    assert_close_to_reference(out, ref, bound)


# ---------------------------------------------------------------------------------------------- tensor add
@pytest.mark.parametrize("shape", [(256, 1024), (300, 2500)])  # tile multiple; ragged rows and columns
def test_tensor_add_is_bit_exact(shape):
    ex = _example("tensor_add")
    rng = np.random.default_rng(1)
    a, b = _bf16(rng, shape), _bf16(rng, shape)
    out, run = _run(ex.tensor_add, a, b)
    # VectorE adds in fp32 and rounds once into bf16: exactly NumPy's fp32 add rounded to bf16.
    assert out.dtype == BF16 and out.shape == shape
    np.testing.assert_array_equal(out.view(np.uint16), ex.reference(a, b).view(np.uint16))
    row_tiles, col_tiles = math.ceil(shape[0] / 128), math.ceil(shape[1] / ex.FREE_CHUNK)
    tiles = row_tiles * col_tiles
    assert _ops(run) == Counter({("dma_copy", "dma"): 3 * tiles, ("tensor_tensor", "vector"): tiles})
    adds = [i for i in run.instructions if i.opcode == "tensor_tensor"]
    assert all(i.attrs["op"] == "add" for i in adds)
    # the tail tile covers exactly the leftover rows and columns (min()-sliced, no padding)
    last = adds[-1].writes[0]
    assert last.partitions == shape[0] - 128 * (row_tiles - 1)
    assert last.free_elements == shape[1] - ex.FREE_CHUNK * (col_tiles - 1)


# ---------------------------------------------------------------------------------------------- softmax
@pytest.mark.parametrize("shape", [(256, 1024), (200, 333)])
def test_softmax_matches_reference(shape):
    ex = _example("softmax")
    rng = np.random.default_rng(2)
    x = _bf16(rng, shape, scale=3.0)
    out, run = _run(ex.softmax_kernel, x)
    d = shape[1]
    # exp (<= 2 fp32 ulp), row sum of d positive terms, reciprocal, multiply, then one bf16 rounding.
    rtol = U_BF16 + (d + 6) * U_FP32
    np.testing.assert_allclose(out.astype(np.float64), ex.reference(x), rtol=rtol, atol=0)
    ops = _ops(run)
    tiles = math.ceil(shape[0] / 128)
    assert ops[("activation", "scalar")] == tiles
    assert ops[("tensor_reduce", "vector")] == tiles and ops[("reciprocal", "vector")] == tiles
    assert ops[("tensor_scalar", "vector")] == tiles
    act = next(i for i in run.instructions if i.opcode == "activation")
    assert act.attrs["op"] == "exp" and act.attrs["reduce_op"] == "add" and act.attrs["bias"] == "vector"
    red = next(i for i in run.instructions if i.opcode == "tensor_reduce")
    assert red.attrs["op"] == "maximum" and red.attrs["negate"] is True


# ---------------------------------------------------------------------------------------------- rmsnorm
@pytest.mark.parametrize("n, d", [(256, 1024), (130, 96)])
def test_rmsnorm_matches_reference(n, d):
    ex = _example("rmsnorm")
    rng = np.random.default_rng(3)
    x = _bf16(rng, (n, d))
    w = _bf16(rng, d, scale=0.1, shift=1.0)
    out, run = _run(ex.rmsnorm_kernel, x, w)
    # sum of d exact squares (d U), *1/d and +eps (2 U), rsqrt halves the relative error of its
    # argument plus its own 2 U, two multiplies (2 U); then one bf16 rounding.
    rtol = U_BF16 + (d / 2 + 6) * U_FP32
    np.testing.assert_allclose(out.astype(np.float64), ex.reference(x, w), rtol=rtol, atol=0)
    ops = _ops(run)
    tiles = math.ceil(n / 128)
    assert ops[("activation", "scalar")] == 2 * tiles  # square+sum, then rsqrt(ss/D + eps)
    assert ops[("scalar_tensor_tensor", "vector")] == tiles
    assert ops[("dma_copy", "dma")] == 1 + 2 * tiles  # w broadcast once, then load + store per tile
    acts = [i.attrs["op"] for i in run.instructions if i.opcode == "activation"]
    assert acts[:2] == ["square", "rsqrt"]


# ---------------------------------------------------------------------------------------------- layernorm
@pytest.mark.parametrize("n, d", [(256, 1536), (100, 700)])
def test_layernorm_matches_reference(n, d):
    ex = _example("layernorm")
    rng = np.random.default_rng(4)
    x = _bf16(rng, (n, d), scale=3.0, shift=2.0)
    gamma = _bf16(rng, d, scale=0.2, shift=1.0)
    beta = _bf16(rng, d, scale=0.1)
    out, run = _run(ex.layernorm_kernel, x, gamma, beta)
    ref = ex.reference(x, gamma, beta)
    x64, g64, b64 = x.astype(np.float64), gamma.astype(np.float64), beta.astype(np.float64)
    mu = x64.mean(axis=1, keepdims=True)
    rstd = 1 / np.sqrt(x64.var(axis=1, keepdims=True) + ex.EPS)
    z = (x64 - mu) * rstd
    # fp32 statistics: |d mean| <= d U max|x| (scaled by rstd), rel. error of rstd <= (d/2 + 4) U, so the
    # normalised z is off by <= d U (max|x| rstd + |z|); gamma/beta applied with 2 U. Then one bf16 rounding.
    fp32_terms = 2 * d * U_FP32 * (np.abs(g64) * (np.abs(x64).max(axis=1, keepdims=True) * rstd + np.abs(z))
                                   + np.abs(b64))
    _assert_within(out, ref, U_BF16 * np.abs(ref) + fp32_terms)
    ops = _ops(run)
    tiles = math.ceil(n / 128)
    assert ops[("bn_stats", "vector")] == tiles * math.ceil(d / 512)
    assert ops[("bn_aggr", "vector")] == tiles
    assert ops[("tensor_scalar", "gpsimd")] == tiles  # rsqrt(var + eps): the precise GpSimd path
    assert ops[("tensor_tensor", "vector")] == 2 * tiles


# ---------------------------------------------------------------------------------------------- attention
@pytest.mark.parametrize("S, d, causal", [(512, 128, False), (256, 64, True), (384, 64, False)])
def test_attention_matches_reference(S, d, causal):
    ex = _example("attention")
    rng = np.random.default_rng(5)
    q, k, v = (_bf16(rng, (S, d)) for _ in range(3))
    out, run = _run(ex.attention_kernel, q, k, v, causal=causal, target="trn1")
    ref, probs = ex.reference(q, k, v, causal, with_probs=True)
    scale = 1 / math.sqrt(d)
    q64, k64 = q.astype(np.float64), k.astype(np.float64)
    # exp argument: fp32 scores (d-term dots of exact bf16 products) for s_ij and the row max, plus
    # the scale multiply; p then carries that relative error, its bf16 rounding (U_BF16), the fp32
    # row sum (S U) and the fp32 P V accumulation (S U); the output is rounded once more into bf16.
    arg_err = (2 * scale * d * U_FP32 * (np.abs(q64) @ np.abs(k64).T).max()
               + 2 * U_FP32 * scale * np.abs(q64 @ k64.T).max())
    weight = probs @ np.abs(v.astype(np.float64))  # sum_j p_ij |v_jd|
    bound = U_BF16 * np.abs(ref) + (U_BF16 + 2 * arg_err + 4 * S * U_FP32) * weight * (1 + 2 * U_BF16)
    _assert_within(out, ref, bound)
    ops = _ops(run)
    blocks = S // 128
    pv_blocks = blocks * (blocks + 1) // 2 if causal else blocks * blocks
    assert ops[("nc_matmul", "tensor")] == blocks + pv_blocks  # Q K^T per query tile, then P V blocks
    assert ops[("nc_transpose", "tensor")] == 2 * blocks + pv_blocks  # K, Q and P^T blocks via TensorE
    assert ops[("activation", "scalar")] == blocks
    assert ops[("affine_select", "gpsimd")] == (blocks if causal else 0)
    assert all(i.attrs["op"] == "exp" for i in run.instructions if i.opcode == "activation")
    psum_copies = [i for i in run.instructions if i.opcode == "tensor_copy" and i.reads[0].buffer == "psum"]
    # every transpose leaves PSUM through VectorE; causal scores too (GpSimd's affine_select reads SBUF only)
    assert len(psum_copies) == 2 * blocks + pv_blocks + (blocks if causal else 0)
    cost = benchmarking.estimate(run)
    causal_flops = sum(2 * 128 * (qt + 1) * 128 * d * 2 for qt in range(blocks))
    assert cost.flops == (causal_flops if causal else 4 * S * S * d)


# ---------------------------------------------------------------------------------------------- matmul
def _matmul_bound(lhsT: np.ndarray, rhs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Reference and bound: fp32 sum of K exact bf16 products in any order, one bf16 rounding."""
    ref = lhsT.astype(np.float64).T @ rhs.astype(np.float64)
    return ref, U_BF16 * np.abs(ref) + matmul_tolerance(lhsT.T, rhs) * (1 + U_BF16)


def test_matmul_levels_match_numpy():
    ex = _example("matmul")
    rng = np.random.default_rng(6)
    K, M, N = 1024, 2048, 1024  # the smallest shape every level's blocking divides
    lhsT, rhs = _bf16(rng, (K, M)), _bf16(rng, (K, N))
    ref, bound = _matmul_bound(lhsT, rhs)
    dma_bytes = {}
    for name, kernel in ex.LEVELS.items():
        out, run = _run(kernel, lhsT, rhs, target="trn1")
        assert out.dtype == BF16 and out.shape == (M, N), name
        _assert_within(out, ref, bound)
        matmuls = [i for i in run.instructions if i.opcode == "nc_matmul"]
        assert len(matmuls) == (M // 128) * (N // 512) * (K // 128), name
        assert all(i.engine == "tensor" and i.attrs["moving_free"] == 512 for i in matmuls), name
        dma_bytes[name] = sum(o.bytes for i in run.instructions if i.opcode == "dma_copy" for o in i.writes)
    # each level moves fewer bytes: that is the whole optimisation (same arithmetic every level)
    volumes = list(dma_bytes.values())
    assert volumes == sorted(volumes, reverse=True) and len(set(volumes)) == 4, dma_bytes
    out_bytes = M * N * 2
    assert dma_bytes["tiled"] == (M // 128) * (N // 512) * (K // 128) * (128 * 128 + 128 * 512) * 2 + out_bytes
    assert dma_bytes["fully optimized"] == K * N * 2 + (N // 1024) * K * M * 2 + out_bytes


def test_matmul_levels_with_small_blocks_and_other_shape():
    """Levels 3 and 4 with their block parameters shrunk run a non-square product correctly."""
    ex = _example("matmul")
    rng = np.random.default_rng(7)
    K, M, N = 512, 256, 1024
    lhsT, rhs = _bf16(rng, (K, M)), _bf16(rng, (K, N))
    ref, bound = _matmul_bound(lhsT, rhs)
    out, _ = _run(ex.matmul_blocked, lhsT, rhs, TILES_IN_BLOCK_M=1, TILES_IN_BLOCK_N=1)
    _assert_within(out, ref, bound)
    out, run = _run(ex.matmul_optimized, lhsT, rhs, TILES_IN_BLOCK_M=2, TILES_IN_BLOCK_N=2, TILES_IN_BLOCK_K=2)
    _assert_within(out, ref, bound)
    ops = _ops(run)
    assert ops[("tensor_tensor", "vector")] == (K // 256) * 2 * 2  # one SBUF accumulation per tile per K-block
    for name in ("tiled", "hoisted loads"):
        out, _ = _run(ex.LEVELS[name], lhsT, rhs)
        _assert_within(out, ref, bound)
