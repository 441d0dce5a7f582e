"""LayerNorm: ``y = (x - mean) * rsqrt(var + eps) * gamma + beta`` over the last axis of ``[N, D]``.

Rows go on the partitions, 128 per tile (last tile ``min(128, N - r0)`` rows).
The per-row mean and (population) variance come from VectorE's batch-norm
statistics instructions (nki-api-facts.md: 4.3) rather than two passes of
reductions:

1. ``nisa.bn_stats`` on each chunk of at most ``nl.tile_size.bn_stats_fmax``
   (512) elements writes 6 numbers per row (count, mean, var*count of the even
   and of the odd elements) into its slice of one ``[P, 6 * chunks]`` tile;
2. one ``nisa.bn_aggr`` merges all chunks into ``(mean, var)`` per row;
3. ``nisa.tensor_scalar(op0=add, operand0=eps, op1=rsqrt)`` gives
   ``rstd = 1/sqrt(var + eps)`` (GpSimd: the precise rsqrt path of
   ``nl.rsqrt``, facts 3.3 / 4.3);
4. ``nisa.tensor_scalar(op0=subtract, operand0=mean, op1=multiply,
   operand1=rstd)`` normalises the tile in one VectorE pass (two per-row
   columns, one instruction);
5. ``gamma`` and ``beta`` (shape ``[D]``, loaded once onto every partition
   through a stride-0 HBM view) are applied with two ``tensor_tensor`` ops.

Statistics and the normalised tile stay in fp32; only ``y`` is rounded into
``x``'s dtype (bf16 here).

Run ``python examples/nki/layernorm.py`` to check the kernel against torch and
print its modelled cost.
"""

from __future__ import annotations

import numpy as np

import torchneuron.nki as nki
import torchneuron.nki.isa as nisa
import torchneuron.nki.language as nl

EPS = 1e-5


def _rows_everywhere(v, P):
    """A ``[P, D]`` SBUF tile holding the HBM vector ``v`` ([D]) on every partition (one DMA)."""
    D = v.shape[0]
    tile = nl.ndarray((P, D), dtype=v.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=tile, src=v.reshape((1, D)).broadcast(0, P))
    return tile


@nki.jit
def layernorm_kernel(x, gamma, beta, eps=EPS):
    """LayerNorm of an ``[N, D]`` HBM tensor with affine parameters ``gamma``, ``beta`` of shape ``[D]``."""
    N, D = x.shape
    assert gamma.shape == (D,) and beta.shape == (D,), "gamma and beta must have shape (D,)"
    P = nl.tile_size.pmax
    FMAX = nl.tile_size.bn_stats_fmax
    chunks = (D + FMAX - 1) // FMAX
    result = nl.ndarray((N, D), dtype=x.dtype, buffer=nl.shared_hbm)
    gamma_tile = _rows_everywhere(gamma, P)
    beta_tile = _rows_everywhere(beta, P)
    for r in range((N + P - 1) // P):
        r0 = r * P
        rows = min(P, N - r0)
        x_tile = nl.load(x[r0:r0 + rows, :])
        stats = nl.ndarray((rows, 6 * chunks), dtype=nl.float32, buffer=nl.sbuf)
        for c in range(chunks):
            c0 = c * FMAX
            nisa.bn_stats(dst=stats[:, 6 * c:6 * (c + 1)], data=x_tile[:, c0:min(D, c0 + FMAX)])
        mean_var = nl.ndarray((rows, 2), dtype=nl.float32, buffer=nl.sbuf)
        nisa.bn_aggr(dst=mean_var, data=stats)
        mean = mean_var[:, 0:1]
        rstd = nl.ndarray((rows, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=rstd, data=mean_var[:, 1:2], op0=nl.add, operand0=float(eps), op1=nl.rsqrt)
        normed = nl.ndarray((rows, D), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=normed, data=x_tile, op0=nl.subtract, operand0=mean, op1=nl.multiply,
                           operand1=rstd)
        nisa.tensor_tensor(dst=normed, data1=normed, data2=gamma_tile[0:rows, :], op=nl.multiply)
        y = nl.ndarray((rows, D), dtype=x.dtype, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=y, data1=normed, data2=beta_tile[0:rows, :], op=nl.add)
        nl.store(result[r0:r0 + rows, :], value=y)
    return result


def reference(x: np.ndarray, gamma: np.ndarray, beta: np.ndarray, eps: float = EPS) -> np.ndarray:
    """``torch.nn.functional.layer_norm`` in float64 from the kernel's (bf16) inputs."""
    import torch

    t = torch.from_numpy(x.astype(np.float64))
    return torch.nn.functional.layer_norm(t, (x.shape[-1],), torch.from_numpy(gamma.astype(np.float64)),
                                          torch.from_numpy(beta.astype(np.float64)), eps).numpy()


def main() -> None:
    import ml_dtypes

    rng = np.random.default_rng(0)
    for n, d in ((384, 1536), (100, 700)):
        x = (2 + 3 * rng.standard_normal((n, d))).astype(ml_dtypes.bfloat16)
        gamma = (1 + 0.2 * rng.standard_normal(d)).astype(ml_dtypes.bfloat16)
        beta = (0.1 * rng.standard_normal(d)).astype(ml_dtypes.bfloat16)
        out, cost = nki.profile(layernorm_kernel)(x, gamma, beta)
        ref = reference(x, gamma, beta)
        err = np.abs(out.astype(np.float64) - ref)
        # one bf16 rounding of y, plus fp32 terms far below it: the statistics move z = (x - mean) * rstd
        # by <= d U32 (max|x| rstd + |z|) (derived in tests/nki/test_nki_examples.py)
        x64, g64 = x.astype(np.float64), gamma.astype(np.float64)
        rstd = 1 / np.sqrt(x64.var(axis=1, keepdims=True) + EPS)
        z = (x64 - x64.mean(axis=1, keepdims=True)) * rstd
        fp32 = 2 * d * 2.0 ** -24 * (np.abs(g64) * (np.abs(x64).max(axis=1, keepdims=True) * rstd + np.abs(z))
                                     + np.abs(beta.astype(np.float64)))
        bound = 2.0 ** -8 * np.abs(ref) + fp32
        assert (err <= bound).all(), f"error {err.max():.3e} above its bound"
        print(f"layernorm ({n}, {d}) bf16: max abs. error {err.max():.2e} (max |y| {np.abs(ref).max():.2f}, "
              f"within one bf16 rounding); modelled {cost.latency_us:.2f} us on {cost.target}")
    print(cost.table(top=8))


if __name__ == "__main__":
    main()
