"""Element-wise addition of two ``[N, M]`` HBM tensors, tiled over partitions and the free axis.

On-chip tiles put rows on the 128 partitions (nki-api-facts.md: 2, layout
LC#2: the parallel axis lies on the partition dim), so the kernel walks the
rows in blocks of ``nl.tile_size.pmax`` = 128 and each row block's columns in
chunks of up to ``FREE_CHUNK`` elements. Each tile is

1. loaded from HBM into SBUF by two DMAs (``nl.load`` -> ``dma_copy``),
2. added on VectorE by one ``nisa.tensor_tensor`` (fp32 arithmetic, rounded on
   write into the output dtype),
3. stored back to HBM (``nl.store`` -> ``dma_copy``).

Shapes that are not multiples of the tile use the current NKI idiom for
edges (nki-api-facts.md: 2, "Slices that run past the end are handled with
Python ``min()`` and ``slice()``"; the legacy ``mask=`` is gone): the last row
block has ``min(128, N - r0)`` partitions and the last column chunk
``min(FREE_CHUNK, M - c0)`` elements. ``FREE_CHUNK`` = 2048 bf16 elements is
4 KiB per partition, the DMA size that saturates an engine (facts 9, DMA).

Run ``python examples/nki/tensor_add.py`` to check the kernel against NumPy
and print its modelled cost.
"""

from __future__ import annotations

import numpy as np

import torchneuron.nki as nki
import torchneuron.nki.isa as nisa
import torchneuron.nki.language as nl

FREE_CHUNK = 2048  # elements per partition per tile (4 KiB of bf16: a saturating DMA)


@nki.jit
def tensor_add(a, b):
    """``a + b`` for ``[N, M]`` HBM tensors of any N and M (edge tiles sliced with ``min``)."""
    assert a.shape == b.shape, f"a {a.shape} and b {b.shape} must have the same shape"
    N, M = a.shape
    P = nl.tile_size.pmax
    result = nl.ndarray((N, M), dtype=a.dtype, buffer=nl.shared_hbm)
    for r in range((N + P - 1) // P):
        r0 = r * P
        rows = min(P, N - r0)  # the tail block covers the remaining rows only
        for c in range((M + FREE_CHUNK - 1) // FREE_CHUNK):
            c0 = c * FREE_CHUNK
            cols = min(FREE_CHUNK, M - c0)
            a_tile = nl.load(a[r0:r0 + rows, c0:c0 + cols])
            b_tile = nl.load(b[r0:r0 + rows, c0:c0 + cols])
            sum_tile = nl.ndarray((rows, cols), dtype=a.dtype, buffer=nl.sbuf)
            nisa.tensor_tensor(dst=sum_tile, data1=a_tile, data2=b_tile, op=nl.add)
            nl.store(result[r0:r0 + rows, c0:c0 + cols], value=sum_tile)
    return result


def reference(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """NumPy reference: add in fp32 (as VectorE does), round once into the inputs' dtype."""
    return (a.astype(np.float32) + b.astype(np.float32)).astype(a.dtype)


def main() -> None:
    import ml_dtypes

    rng = np.random.default_rng(0)
    for shape in ((1024, 4096), (300, 2500)):  # a multiple of the tile, then ragged edges on both axes
        a = rng.standard_normal(shape).astype(ml_dtypes.bfloat16)
        b = rng.standard_normal(shape).astype(ml_dtypes.bfloat16)
        out, cost = nki.profile(tensor_add)(a, b)
        exact = np.array_equal(out.view(np.uint16), reference(a, b).view(np.uint16))
        print(f"tensor_add {shape} bf16: bit-exact vs NumPy: {exact}; modelled {cost.latency_us:.2f} us "
              f"on {cost.target}, MBU {cost.mbu:.1%}")
        assert exact
    print(cost)


if __name__ == "__main__":
    main()
