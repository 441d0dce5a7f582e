"""RMSNorm: ``y = x * rsqrt(mean(x^2, axis=-1) + eps) * w`` for ``x`` of shape ``[N, D]``.

Rows go on the partitions, 128 per tile (the last tile ``min(128, N - r0)``
rows), and each row's statistics are a free-axis reduction (layout LC#2,
nki-api-facts.md: 2). The weight ``w`` (shape ``[D]``) is needed on every
partition: one DMA reads the same HBM row into all 128 partitions through a
stride-0 view (``w.reshape((1, D)).broadcast(0, 128)``), once, outside the
row loop. Per row tile:

1. ``nisa.activation(op=nl.square, reduce_op=nl.add, reduce_res=ss)`` on
   ScalarE squares the row and sums it in the same instruction (the
   accumulator read-out is the only extra cost, facts 4.2 / 9);
2. ``nisa.activation(op=nl.rsqrt, data=ss, scale=1/D, bias=eps)`` on ScalarE
   gives ``rsqrt(ss/D + eps)`` in one instruction: the mean's ``1/D`` rides in
   ``scale`` and ``eps`` in ``bias`` (a ``(P, 1)`` tile: NeuronCore-v2 takes
   no scalar bias, facts 4.2);
3. ``nisa.scalar_tensor_tensor(op0=multiply, operand0=rstd, op1=multiply,
   operand1=w)`` on VectorE computes ``(x * rstd) * w`` in one pass: a
   per-row column and a full tile in the same instruction.

Statistics stay in fp32; only ``y`` is rounded into ``x``'s dtype (bf16 here).

Run ``python examples/nki/rmsnorm.py`` to check the kernel against NumPy and
print its modelled cost.
"""

from __future__ import annotations

import numpy as np

import torchneuron.nki as nki
import torchneuron.nki.isa as nisa
import torchneuron.nki.language as nl

EPS = 1e-6


@nki.jit
def rmsnorm_kernel(x, w, eps=EPS):
    """RMSNorm of an ``[N, D]`` HBM tensor with weight ``w`` of shape ``[D]``."""
    N, D = x.shape
    assert w.shape == (D,), f"w must have shape ({D},), got {w.shape}"
    P = nl.tile_size.pmax
    result = nl.ndarray((N, D), dtype=x.dtype, buffer=nl.shared_hbm)
    # w on every partition: one DMA from a stride-0 (partition-broadcast) view of the HBM row.
    w_tile = nl.ndarray((P, D), dtype=w.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=w_tile, src=w.reshape((1, D)).broadcast(0, P))
    eps_col = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=eps_col, value=float(eps))
    for r in range((N + P - 1) // P):
        r0 = r * P
        rows = min(P, N - r0)
        x_tile = nl.load(x[r0:r0 + rows, :])
        squares = nl.ndarray((rows, D), dtype=nl.float32, buffer=nl.sbuf)  # scratch: only the sums are used
        ss = nl.ndarray((rows, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.activation(dst=squares, op=nl.square, data=x_tile, reduce_op=nl.add, reduce_res=ss,
                        reduce_cmd=nisa.reduce_cmd.reset_reduce)
        rstd = nl.ndarray((rows, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.activation(dst=rstd, op=nl.rsqrt, data=ss, scale=1.0 / D, bias=eps_col[0:rows, :])
        y = nl.ndarray((rows, D), dtype=x.dtype, buffer=nl.sbuf)
        nisa.scalar_tensor_tensor(dst=y, data=x_tile, op0=nl.multiply, operand0=rstd, op1=nl.multiply,
                                  operand1=w_tile[0:rows, :])
        nl.store(result[r0:r0 + rows, :], value=y)
    return result


def reference(x: np.ndarray, w: np.ndarray, eps: float = EPS) -> np.ndarray:
    """RMSNorm in float64 from the kernel's (bf16) inputs."""
    x64, w64 = x.astype(np.float64), w.astype(np.float64)
    return x64 / np.sqrt(np.mean(x64 * x64, axis=-1, keepdims=True) + eps) * w64


def main() -> None:
    import ml_dtypes

    rng = np.random.default_rng(0)
    for n, d in ((512, 2048), (130, 96)):
        x = rng.standard_normal((n, d)).astype(ml_dtypes.bfloat16)
        w = (1 + 0.1 * rng.standard_normal(d)).astype(ml_dtypes.bfloat16)
        out, cost = nki.profile(rmsnorm_kernel)(x, w)
        ref = reference(x, w)
        rel = (np.abs(out.astype(np.float64) - ref) / np.abs(ref)).max()
        bound = 2.0 ** -8 + (d / 2 + 6) * 2.0 ** -24  # one bf16 rounding + fp32 sum of squares, rsqrt, multiplies
        assert rel <= bound, f"relative error {rel:.3e} above {bound:.3e}"
        print(f"rmsnorm ({n}, {d}) bf16: max rel. error {rel:.2e} <= bound {bound:.2e} (one bf16 rounding); "
              f"modelled {cost.latency_us:.2f} us on {cost.target}")
    print(cost.table(top=6))


if __name__ == "__main__":
    main()
