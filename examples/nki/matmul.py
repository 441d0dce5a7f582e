"""Tiled matrix multiplication in NKI, at the four optimisation levels of AWS's matmul tutorial.

``result[M, N] = lhsT.T @ rhs`` with ``lhsT`` of shape ``[K, M]`` (delivered
transposed: TensorE contracts over the partition axis, nki-api-facts.md: 2
LC#1) and ``rhs`` of shape ``[K, N]``. Each level keeps the previous one's
arithmetic and changes only data movement, which is what the tutorial's
utilisation figures measure (trainium-facts.md: "Published figures"):

1. ``matmul_tiled``: both operand tiles loaded for every multiply (many small DMAs).
2. ``matmul_hoisted``: the ``lhsT`` tiles of a row of output tiles loaded once,
   reused across ``n``; ``rhs`` tiles still loaded per output tile.
3. ``matmul_blocked``: output tiles grouped into 2 x 2 blocks; each loaded
   ``lhsT`` / ``rhs`` tile feeds two output tiles' multiplies.
4. ``matmul_optimized``: blocks on M, N and K (16 x 2 x 8 tiles), ``rhs`` block
   loaded once per (N, K) block, K-partial sums accumulated in SBUF, one DMA per
   ``[128, block]`` row.

The loop nests and block parameters follow the tutorial's kernels
(``nki_matmul_tiled_``, ``nki_matmul_hoist_load_``,
``nki_matmul_block_free_dimension_``, ``nki_matmul_fully_optimized_`` in
aws-neuron-sdk ``nki/examples/matrix_multiplication/``), so their modelled
latencies can be set against the tutorial's published Trn1 figures
(``benchmarks/nki.py``). Level 4 needs M, N and K to be multiples of 2048,
1024 and 1024; level 3 multiples of 256, 1024 and 128.

Run ``python examples/nki/matmul.py`` to check all four against NumPy and print
their modelled cost on the current target.
"""

from __future__ import annotations

import torchneuron.nki as nki
import torchneuron.nki.isa as nisa
import torchneuron.nki.language as nl


def _tiles() -> tuple[int, int, int]:
    return nl.tile_size.pmax, nl.tile_size.gemm_stationary_fmax, nl.tile_size.gemm_moving_fmax


@nki.jit
def matmul_tiled(lhsT, rhs):
    """Level 1: load both operand tiles for every multiply."""
    K, M = lhsT.shape
    _, N = rhs.shape
    TK, TM, TN = _tiles()
    result = nl.ndarray((M, N), dtype=lhsT.dtype, buffer=nl.shared_hbm)
    for m in range(M // TM):
        for n in range(N // TN):
            acc = nl.ndarray((TM, TN), dtype=nl.float32, buffer=nl.psum)
            for k in range(K // TK):
                a = nl.load(lhsT[k * TK:(k + 1) * TK, m * TM:(m + 1) * TM])
                b = nl.load(rhs[k * TK:(k + 1) * TK, n * TN:(n + 1) * TN])
                nisa.nc_matmul(dst=acc, stationary=a, moving=b, accumulate=k > 0)
            out = nl.copy(acc, dtype=result.dtype)
            nl.store(result[m * TM:(m + 1) * TM, n * TN:(n + 1) * TN], value=out)
    return result


@nki.jit
def matmul_hoisted(lhsT, rhs):
    """Level 2: ``lhsT`` tiles of a row block are loaded once and reused for every ``n``."""
    K, M = lhsT.shape
    _, N = rhs.shape
    TK, TM, TN = _tiles()
    result = nl.ndarray((M, N), dtype=lhsT.dtype, buffer=nl.shared_hbm)
    for m in range(M // TM):
        a_tiles = [nl.load(lhsT[k * TK:(k + 1) * TK, m * TM:(m + 1) * TM]) for k in range(K // TK)]
        for n in range(N // TN):
            b_tiles = [nl.load(rhs[k * TK:(k + 1) * TK, n * TN:(n + 1) * TN]) for k in range(K // TK)]
            acc = nl.ndarray((TM, TN), dtype=nl.float32, buffer=nl.psum)
            for k in range(K // TK):
                nisa.nc_matmul(dst=acc, stationary=a_tiles[k], moving=b_tiles[k], accumulate=k > 0)
            out = nl.copy(acc, dtype=result.dtype)
            nl.store(result[m * TM:(m + 1) * TM, n * TN:(n + 1) * TN], value=out)
    return result


@nki.jit
def matmul_blocked(lhsT, rhs, TILES_IN_BLOCK_M=2, TILES_IN_BLOCK_N=2):
    """Level 3: free dims blocked; every tile loaded into SBUF feeds a whole block of multiplies.

    As the tutorial's ``nki_matmul_block_free_dimension_``: the ``lhsT`` tiles of a
    ``TILES_IN_BLOCK_M``-tile row block are loaded once for all of K, the ``rhs`` tiles of
    a ``TILES_IN_BLOCK_N``-tile column block once per row block, and each output tile
    accumulates all of K in one PSUM bank.
    """
    K, M = lhsT.shape
    _, N = rhs.shape
    TK, TM, TN = _tiles()
    BM, BN = TM * TILES_IN_BLOCK_M, TN * TILES_IN_BLOCK_N
    assert M % BM == 0 and N % BN == 0 and K % TK == 0, "M, N, K must be multiples of the block sizes"
    result = nl.ndarray((M, N), dtype=lhsT.dtype, buffer=nl.shared_hbm)
    for bm in range(M // BM):
        a_tiles = [[nl.load(lhsT[k * TK:(k + 1) * TK, bm * BM + i * TM:bm * BM + (i + 1) * TM])
                    for k in range(K // TK)] for i in range(TILES_IN_BLOCK_M)]
        for bn in range(N // BN):
            b_tiles = [[nl.load(rhs[k * TK:(k + 1) * TK, bn * BN + j * TN:bn * BN + (j + 1) * TN])
                        for k in range(K // TK)] for j in range(TILES_IN_BLOCK_N)]
            for i in range(TILES_IN_BLOCK_M):
                for j in range(TILES_IN_BLOCK_N):
                    acc = nl.ndarray((TM, TN), dtype=nl.float32, buffer=nl.psum)
                    for k in range(K // TK):
                        nisa.nc_matmul(dst=acc, stationary=a_tiles[i][k], moving=b_tiles[j][k], accumulate=k > 0)
                    out = nl.copy(acc, dtype=result.dtype)
                    m0, n0 = bm * BM + i * TM, bn * BN + j * TN
                    nl.store(result[m0:m0 + TM, n0:n0 + TN], value=out)
    return result


@nki.jit
def matmul_optimized(lhsT, rhs, TILES_IN_BLOCK_M=16, TILES_IN_BLOCK_N=2, TILES_IN_BLOCK_K=8):
    """Level 4: blocks on all three dims, K-partial sums accumulated in SBUF, big DMAs.

    As the tutorial's ``nki_matmul_fully_optimized_`` (same block parameters): the loop
    order N-block -> K-block -> M-block loads each ``rhs`` block ``[BK, BN]`` exactly
    once and each ``lhsT`` block once per N-block, one ``[128, BN]`` / ``[128, BM]``
    DMA per 128 contraction rows; the PSUM result of each output tile's K-block is added
    into an SBUF accumulator holding that tile's whole N-block, and each accumulator
    row block is stored with one DMA at the end. The tutorial accumulates in the
    output dtype (bf16); here the accumulators are fp32 (one extra cast-copy per output
    tile) so the K-blocks add without bf16 rounding.
    """
    K, M = lhsT.shape
    _, N = rhs.shape
    TK, TM, TN = _tiles()
    BM, BN, BK = TM * TILES_IN_BLOCK_M, TN * TILES_IN_BLOCK_N, TK * TILES_IN_BLOCK_K
    assert M % BM == 0 and N % BN == 0 and K % BK == 0, "M, N, K must be multiples of the block sizes"
    result = nl.ndarray((M, N), dtype=lhsT.dtype, buffer=nl.shared_hbm)
    for bn in range(N // BN):
        sums = [nl.zeros((TM, BN), dtype=nl.float32, buffer=nl.sbuf) for _ in range(M // TM)]
        for bk in range(K // BK):
            b_block = nl.ndarray((TK, TILES_IN_BLOCK_K, BN), dtype=rhs.dtype, buffer=nl.sbuf)
            for k in range(TILES_IN_BLOCK_K):
                k0 = bk * BK + k * TK
                nisa.dma_copy(dst=b_block[:, k, :], src=rhs[k0:k0 + TK, bn * BN:(bn + 1) * BN])
            for bm in range(M // BM):
                a_block = nl.ndarray((TK, TILES_IN_BLOCK_K, BM), dtype=lhsT.dtype, buffer=nl.sbuf)
                for k in range(TILES_IN_BLOCK_K):
                    k0 = bk * BK + k * TK
                    nisa.dma_copy(dst=a_block[:, k, :], src=lhsT[k0:k0 + TK, bm * BM:(bm + 1) * BM])
                for j in range(TILES_IN_BLOCK_N):
                    for i in range(TILES_IN_BLOCK_M):
                        acc = nl.ndarray((TM, TN), dtype=nl.float32, buffer=nl.psum)
                        for k in range(TILES_IN_BLOCK_K):
                            nisa.nc_matmul(dst=acc, stationary=a_block[:, k, i * TM:(i + 1) * TM],
                                           moving=b_block[:, k, j * TN:(j + 1) * TN], accumulate=k > 0)
                        part = sums[bm * TILES_IN_BLOCK_M + i][:, j * TN:(j + 1) * TN]
                        nisa.tensor_tensor(dst=part, data1=part, data2=acc, op=nl.add)
        for t in range(M // TM):
            out = nl.copy(sums[t], dtype=result.dtype)
            nl.store(result[t * TM:(t + 1) * TM, bn * BN:(bn + 1) * BN], value=out)
    return result


LEVELS = {
    "tiled": matmul_tiled,
    "hoisted loads": matmul_hoisted,
    "blocked": matmul_blocked,
    "fully optimized": matmul_optimized,
}


def main() -> None:
    import ml_dtypes
    import numpy as np

    rng = np.random.default_rng(0)
    K, M, N = 1024, 2048, 1024
    lhsT = rng.standard_normal((K, M)).astype(ml_dtypes.bfloat16)
    rhs = rng.standard_normal((K, N)).astype(ml_dtypes.bfloat16)
    a64, b64 = lhsT.astype(np.float64), rhs.astype(np.float64)
    expected = a64.T @ b64
    # one bf16 rounding of the result plus an fp32 sum of K exact bf16 products
    bound = 2.0 ** -8 * np.abs(expected) + K * 2.0 ** -24 * (np.abs(a64).T @ np.abs(b64))
    for name, kernel in LEVELS.items():
        out, cost = nki.profile(kernel)(lhsT, rhs)
        err = np.abs(out.astype(np.float64) - expected)
        assert (err <= bound).all(), f"{name}: error {err.max():.3e} above its bound"
        print(f"{name:>16}: max rel. error {err.max() / np.abs(expected).max():.2e} (within the bf16 bound); "
              f"modelled {cost.latency_seconds * 1e6:8.1f} us on {cost.target}, HFU {cost.hfu:.1%}")


if __name__ == "__main__":
    main()
