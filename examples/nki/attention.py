"""Single-head attention forward, ``softmax(Q K^T / sqrt(d)) V``, for sequences up to 512.

``q``, ``k``, ``v`` are ``[S, d]`` HBM tensors (bf16, ``S`` a multiple of 128 up
to 512, head dim ``d`` <= 128, e.g. 64 or 128). The kernel works on one tile of
128 queries at a time and keeps every intermediate on chip:

* **Layout.** TensorE contracts over the partition axis (layout LC#1,
  nki-api-facts.md: 2): ``nc_matmul(dst, stationary[K, M], moving[K, N])``
  computes ``stationary.T @ moving``. The scores ``Q K^T`` contract over ``d``,
  so both operands must arrive with ``d`` on the partitions: ``Q^T`` and
  ``K^T``. They are loaded row-major (sequence on the partitions, one
  contiguous DMA per 128 rows) and transposed on TensorE with
  ``nisa.nc_transpose`` (SBUF -> PSUM, a matmul against an identity, facts
  4.1), then copied PSUM -> SBUF with ``nisa.tensor_copy`` because TensorE
  reads only SBUF.
* **Scores.** One ``nc_matmul`` per query tile: stationary ``Q^T`` tile
  ``[d, 128]``, moving ``K^T`` ``[d, S]`` (moving free size <= 512 = one fp32
  PSUM bank on NeuronCore-v2/v3, facts 4.1), result ``[128, S]`` fp32 in PSUM.
* **Softmax** over the free axis, read straight from PSUM: VectorE
  ``tensor_reduce(max, negate=True)``; the ``1/sqrt(d)`` scale is folded into
  ScalarE's ``activation(exp, scale=1/sqrt(d), bias=-max/sqrt(d))``, which also
  sums each row in its accumulator (``reduce_op=nl.add``); the probabilities are
  written as bf16 (the next matmul's input type) while the sums stay fp32.
  Normalisation is deferred: ``1/sum`` multiplies the ``[128, d]`` output
  instead of the ``[128, S]`` probabilities.
* **P V.** The second matmul contracts over keys, so the probabilities are
  transposed per 128-key block (``nc_transpose`` into PSUM, ``tensor_copy`` to
  SBUF) and ``nc_matmul(stationary=P^T block [128 keys, 128 queries],
  moving=V block [128 keys, d])`` accumulates the blocks in one fp32 PSUM tile
  (``accumulate=kt > 0``). A final VectorE ``tensor_scalar`` multiplies by
  ``1/sum`` while copying PSUM -> SBUF (and rounding into bf16).
* **Causal mask** (``causal=True``): key blocks after a query tile's last query
  are skipped entirely (only ``q0 + 128`` keys are scored), and the diagonal is
  masked by GpSimd ``nisa.affine_select`` (keep where ``q0 + p - j >= 0``,
  i.e. pattern ``[[-1, keys]]``, ``channel_multiplier=1``, ``offset=q0``). GpSimd
  cannot read PSUM (facts 4.4), so the scores are first copied to SBUF.

Run ``python examples/nki/attention.py`` to check the kernel against NumPy and
print its modelled cost.
"""

from __future__ import annotations

import math

import numpy as np

import torchneuron.nki as nki
import torchneuron.nki.isa as nisa
import torchneuron.nki.language as nl

MASKED = -1.0e30  # fp32 score of a masked position: exp(scale * MASKED - max) == 0


def _transpose_to_sbuf(tile, dst=None):
    """``tile.T`` in SBUF: TensorE transpose into PSUM, then a PSUM -> SBUF copy."""
    rows, cols = tile.shape
    t_psum = nl.ndarray((cols, rows), dtype=tile.dtype, buffer=nl.psum)
    nisa.nc_transpose(dst=t_psum, data=tile)
    if dst is None:
        dst = nl.ndarray((cols, rows), dtype=tile.dtype, buffer=nl.sbuf)
    nisa.tensor_copy(dst=dst, src=t_psum)
    return dst


@nki.jit
def attention_kernel(q, k, v, causal=False):
    """``softmax(q k^T / sqrt(d) [+ causal mask]) v`` for ``[S, d]`` HBM tensors."""
    S, d = q.shape
    P = nl.tile_size.pmax
    assert k.shape == (S, d) and v.shape == (S, d), "q, k and v must all be [S, d]"
    assert S % P == 0 and S <= nl.tile_size.gemm_moving_fmax, f"S={S}: a multiple of {P}, at most 512"
    assert d <= P, f"head dim {d} must be at most {P} (it is the contraction of Q K^T)"
    blocks = S // P
    scale = 1.0 / math.sqrt(d)
    result = nl.ndarray((S, d), dtype=q.dtype, buffer=nl.shared_hbm)

    # K^T [d, S] and the V blocks [128 keys, d] stay in SBUF for every query tile.
    k_t = nl.ndarray((d, S), dtype=k.dtype, buffer=nl.sbuf)
    v_blocks = []
    for b in range(blocks):
        _transpose_to_sbuf(nl.load(k[b * P:(b + 1) * P, :]), dst=k_t[:, b * P:(b + 1) * P])
        v_blocks.append(nl.load(v[b * P:(b + 1) * P, :]))

    for qt in range(blocks):
        q0 = qt * P
        q_t = _transpose_to_sbuf(nl.load(q[q0:q0 + P, :]))  # [d, 128 queries]
        keys = q0 + P if causal else S  # causal: later key blocks are fully masked, skip them
        scores_psum = nl.ndarray((P, keys), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_matmul(dst=scores_psum, stationary=q_t, moving=k_t[:, 0:keys], accumulate=False)
        scores = scores_psum
        if causal:
            scores = nl.ndarray((P, keys), dtype=nl.float32, buffer=nl.sbuf)
            nisa.tensor_copy(dst=scores, src=scores_psum)  # GpSimd reads SBUF only
            nisa.affine_select(dst=scores, pattern=[[-1, keys]], channel_multiplier=1, on_true_tile=scores,
                               on_false_value=MASKED, cmp_op=nl.greater_equal, offset=q0)

        neg_max = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_reduce(dst=neg_max, op=nl.max, data=scores, axis=1, negate=True)
        bias = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=bias, data=neg_max, op0=nl.multiply, operand0=scale)
        probs = nl.ndarray((P, keys), dtype=q.dtype, buffer=nl.sbuf)
        sums = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.activation(dst=probs, op=nl.exp, data=scores, bias=bias, scale=scale, reduce_op=nl.add,
                        reduce_res=sums, reduce_cmd=nisa.reduce_cmd.reset_reduce)
        inv_sums = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.reciprocal(dst=inv_sums, data=sums)

        out_psum = nl.ndarray((P, d), dtype=nl.float32, buffer=nl.psum)
        for kt in range(keys // P):
            probs_t = _transpose_to_sbuf(probs[:, kt * P:(kt + 1) * P])  # [128 keys, 128 queries]
            nisa.nc_matmul(dst=out_psum, stationary=probs_t, moving=v_blocks[kt], accumulate=kt > 0)
        out = nl.ndarray((P, d), dtype=q.dtype, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=out, data=out_psum, op0=nl.multiply, operand0=inv_sums)
        nl.store(result[q0:q0 + P, :], value=out)
    return result


def reference(q: np.ndarray, k: np.ndarray, v: np.ndarray, causal: bool = False,
              with_probs: bool = False) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
    """Attention in float64 from the kernel's (bf16) inputs; optionally also the probabilities."""
    q64, k64, v64 = (t.astype(np.float64) for t in (q, k, v))
    s = q64 @ k64.T / math.sqrt(q.shape[1])
    if causal:
        s = np.where(np.tril(np.ones(s.shape, dtype=bool)), s, -np.inf)
    p = np.exp(s - s.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    out = p @ v64
    return (out, p) if with_probs else out


def main() -> None:
    import ml_dtypes

    rng = np.random.default_rng(0)
    for S, d, causal in ((512, 128, False), (512, 64, True), (256, 64, False)):
        q, k, v = (rng.standard_normal((S, d)).astype(ml_dtypes.bfloat16) for _ in range(3))
        out, cost = nki.profile(attention_kernel)(q, k, v, causal=causal)
        ref, probs = reference(q, k, v, causal, with_probs=True)
        err = np.abs(out.astype(np.float64) - ref)
        # bf16 rounding of the probabilities (relative 2^-8 each, so at most 2^-8 * sum_j p_ij |v_j|) and of
        # the output, plus small fp32 terms (derived in tests/nki/test_nki_examples.py)
        bound = 2.0 ** -8 * (np.abs(ref) + 1.01 * probs @ np.abs(v.astype(np.float64)))
        assert (err <= bound).all(), f"error {err.max():.3e} above its bound"
        print(f"attention S={S} d={d} causal={causal}: max abs. error {err.max():.2e} (max |out| "
              f"{np.abs(ref).max():.2f}, within the bf16 bound); modelled {cost.latency_us:.2f} us on {cost.target}, "
              f"HFU {cost.hfu:.1%}")
    print(cost.table(top=8))


if __name__ == "__main__":
    main()
