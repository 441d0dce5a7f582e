"""Row softmax of an ``[N, D]`` tensor over its free axis, split across VectorE and ScalarE.

Rows go on the partitions (128 per tile, layout LC#2: reductions run along
free axes, nki-api-facts.md: 2), so every row of a tile is reduced in the
same instruction. Per tile of rows, the numerically stable softmax
``exp(x - max) / sum(exp(x - max))`` is four instructions:

1. ``nisa.tensor_reduce(op=nl.max, negate=True)`` on VectorE gives ``-max``
   per row as a ``(P, 1)`` column (``negate`` is free, facts 4.3);
2. ``nisa.activation(op=nl.exp, bias=-max, reduce_op=nl.add,
   reduce_cmd=reset_reduce, reduce_res=sums)`` on ScalarE computes
   ``exp(x + bias)`` and, in the same instruction, its row sums in ScalarE's
   accumulator registers (bias and reduction cost nothing extra, facts 4.2 / 9);
3. ``nisa.reciprocal`` on VectorE turns the ``(P, 1)`` sums into ``1/sum``
   (the precise reciprocal; only P values, so its 8N cost is the MIN_II floor);
4. ``nisa.tensor_scalar(op0=nl.multiply, operand0=1/sum)`` on VectorE scales
   each row by its own column value.

The exponentials stay in fp32 in SBUF so the normalisation divides unrounded
values; only the result is rounded into the output dtype (bf16 here). The
last row block is ``min(128, N - r0)`` rows (current NKI edge idiom).

Run ``python examples/nki/softmax.py`` to check the kernel against NumPy and
print its modelled cost.
"""

from __future__ import annotations

import numpy as np

import torchneuron.nki as nki
import torchneuron.nki.isa as nisa
import torchneuron.nki.language as nl


@nki.jit
def softmax_kernel(x):
    """``softmax(x, axis=-1)`` for an ``[N, D]`` HBM tensor; rows tiled by 128, a row fits one tile."""
    N, D = x.shape
    P = nl.tile_size.pmax
    result = nl.ndarray((N, D), dtype=x.dtype, buffer=nl.shared_hbm)
    for r in range((N + P - 1) // P):
        r0 = r * P
        rows = min(P, N - r0)
        x_tile = nl.load(x[r0:r0 + rows, :])
        neg_max = nl.ndarray((rows, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_reduce(dst=neg_max, op=nl.max, data=x_tile, axis=1, negate=True)
        exps = nl.ndarray((rows, D), dtype=nl.float32, buffer=nl.sbuf)
        sums = nl.ndarray((rows, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.activation(dst=exps, op=nl.exp, data=x_tile, bias=neg_max, scale=1.0, reduce_op=nl.add,
                        reduce_res=sums, reduce_cmd=nisa.reduce_cmd.reset_reduce)
        inv_sums = nl.ndarray((rows, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.reciprocal(dst=inv_sums, data=sums)
        y = nl.ndarray((rows, D), dtype=x.dtype, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=y, data=exps, op0=nl.multiply, operand0=inv_sums)
        nl.store(result[r0:r0 + rows, :], value=y)
    return result


def reference(x: np.ndarray) -> np.ndarray:
    """Softmax over the last axis in float64 (the exact value the kernel approximates)."""
    x64 = x.astype(np.float64)
    e = np.exp(x64 - x64.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def main() -> None:
    import ml_dtypes

    rng = np.random.default_rng(0)
    for shape in ((512, 1024), (200, 333)):
        x = (3 * rng.standard_normal(shape)).astype(ml_dtypes.bfloat16)
        out, cost = nki.profile(softmax_kernel)(x)
        rel = np.abs(out.astype(np.float64) - reference(x)) / reference(x)
        bound = 2.0 ** -8 + (shape[1] + 6) * 2.0 ** -24  # one bf16 rounding + fp32 exp/sum/reciprocal/multiply
        assert rel.max() <= bound, f"relative error {rel.max():.3e} above {bound:.3e}"
        print(f"softmax {shape} bf16: max rel. error {rel.max():.2e} <= bound {bound:.2e} (one bf16 rounding); "
              f"modelled {cost.latency_us:.2f} us on {cost.target}")
    print(cost.table(top=6))


if __name__ == "__main__":
    main()
