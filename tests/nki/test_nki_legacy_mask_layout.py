"""Legacy ``mask=`` on instructions whose output layout differs from their input's (issue 31, item 1).

A legacy mask bounds the kernel's index variables: in
``u[p, q] = nisa.nc_transpose(t[i, j], mask=(i < 72) & (j < 44))`` the element ``(i, j)``
that passes lands at ``u[j, i]``, so the instruction must write ``u[:44, :72]``. Each case
tiles a matrix whose last tiles are partial, masks the partial tile, and compares with NumPy.
The SBUF result tiles are pre-filled with a sentinel (and reads of unwritten memory are
errors), so a write that misses part of the valid region fails the comparison.
"""

import numpy as np
import pytest

import torchneuron.nki as nki
import torchneuron.nki.isa as nisa
import torchneuron.nki.language as nl
from torchneuron.nki import NkiValidationError

SENTINEL = -777.0
RNG = np.random.default_rng(31)


def simulate(kernel, *args, target="trn2"):
    return nki.simulate(kernel, target=target, uninitialized="error")(*args)


def _tiled_transpose(engine, tile, use_nl):
    """A legacy tiled transpose kernel: masked load, masked transpose, masked transposing store."""

    def kernel(a):
        rows, cols = a.shape
        out = nl.ndarray((cols, rows), dtype=a.dtype, buffer=nl.shared_hbm)
        for r in nl.affine_range((rows + tile - 1) // tile):
            for c in nl.affine_range((cols + tile - 1) // tile):
                loaded = nl.ndarray((tile, tile), dtype=a.dtype, buffer=nl.sbuf)
                result = nl.ndarray((nl.par_dim(tile), tile), dtype=a.dtype, buffer=nl.sbuf)
                result[...] = SENTINEL
                i = nl.arange(tile)[:, None]
                j = nl.arange(tile)[None, :]
                mask = (r * tile + i < rows) & (c * tile + j < cols)
                loaded[i, j] = nl.load(a[r * tile + i, c * tile + j], mask=mask)
                p = nl.arange(tile)[:, None]
                q = nl.arange(tile)[None, :]
                if use_nl:
                    moved = nl.transpose(loaded[i, j], mask=mask)
                    result[p, q] = nl.copy(moved, mask=(r * tile + q < rows) & (c * tile + p < cols))
                elif engine is None:
                    result[p, q] = nisa.nc_transpose(loaded[i, j], mask=mask)
                else:
                    result[p, q] = nisa.nc_transpose(loaded[i, j], mask=mask, engine=engine)
                nl.store(out[c * tile + p, r * tile + q], result[p, q],
                         mask=(r * tile + q < rows) & (c * tile + p < cols))
        return out

    return nki.jit(kernel)


def _reused_transpose(tile):
    """The same through one SBUF result tile reused by every iteration (stale data from the previous
    tile, not NaN, is what a missed write would leave)."""

    def kernel(a):
        rows, cols = a.shape
        out = nl.ndarray((cols, rows), dtype=a.dtype, buffer=nl.shared_hbm)
        result = nl.ndarray((nl.par_dim(tile), tile), dtype=a.dtype, buffer=nl.sbuf)
        result[...] = SENTINEL
        loaded = nl.ndarray((tile, tile), dtype=a.dtype, buffer=nl.sbuf)
        for r in nl.sequential_range((rows + tile - 1) // tile):
            for c in nl.sequential_range((cols + tile - 1) // tile):
                i = nl.arange(tile)[:, None]
                j = nl.arange(tile)[None, :]
                mask = (r * tile + i < rows) & (c * tile + j < cols)
                loaded[i, j] = nl.load(a[r * tile + i, c * tile + j], mask=mask)
                p = nl.arange(tile)[:, None]
                q = nl.arange(tile)[None, :]
                result[p, q] = nisa.nc_transpose(loaded[i, j], mask=mask)
                nl.store(out[c * tile + p, r * tile + q], result[p, q],
                         mask=(r * tile + q < rows) & (c * tile + p < cols))
        return out

    return nki.jit(kernel)


# (rows, cols) for 128-tiles: partition-partial, free-partial, both, and the 200 x 300
TENSOR_SHAPES = {"partition-partial": (200, 128), "free-partial": (128, 300), "both": (72, 44),
                 "both-tiled": (200, 300)}
# VectorE transposes at most 32 x 32
VECTOR_SHAPES = {"partition-partial": (40, 32), "free-partial": (32, 50), "both": (40, 50)}


@pytest.mark.parametrize("shape", TENSOR_SHAPES.values(), ids=TENSOR_SHAPES.keys())
def test_masked_partial_tile_transpose_on_tensor_engine(shape):
    a = RNG.standard_normal(shape).astype(np.float32)
    out = simulate(_tiled_transpose(None, 128, use_nl=False), a)
    np.testing.assert_array_equal(out, a.T)


@pytest.mark.parametrize("shape", VECTOR_SHAPES.values(), ids=VECTOR_SHAPES.keys())
def test_masked_partial_tile_transpose_on_vector_engine(shape):
    a = RNG.standard_normal(shape).astype(np.float32)
    out = simulate(_tiled_transpose(nisa.vector_engine, 32, use_nl=False), a)
    np.testing.assert_array_equal(out, a.T)


@pytest.mark.parametrize("shape", TENSOR_SHAPES.values(), ids=TENSOR_SHAPES.keys())
def test_masked_partial_tile_nl_transpose(shape):
    a = RNG.standard_normal(shape).astype(np.float32)
    out = simulate(_tiled_transpose(None, 128, use_nl=True), a)
    np.testing.assert_array_equal(out, a.T)


@pytest.mark.parametrize("shape", [(200, 300), (300, 200), (200, 128), (128, 300)],
                         ids=["both", "both-wide", "partition-partial", "free-partial"])
def test_masked_transpose_through_a_reused_tile(shape):
    a = RNG.standard_normal(shape).astype(np.float32)
    np.testing.assert_array_equal(simulate(_reused_transpose(128), a), a.T)


@nki.jit
def _masked_transpose_output_vars(a):
    """The mask written in the *output's* variables, which the transpose cannot match to its input."""
    t = nl.load(a)
    i = nl.arange(a.shape[0])[:, None]
    j = nl.arange(a.shape[1])[None, :]
    p = nl.arange(a.shape[1])[:, None]
    q = nl.arange(a.shape[0])[None, :]
    out = nl.ndarray((a.shape[1], a.shape[0]), dtype=a.dtype, buffer=nl.sbuf)
    out[p, q] = nisa.nc_transpose(t[i, j], mask=(p < 10))
    return out


def test_a_mask_whose_variables_index_no_input_raises_naming_them():
    a = RNG.standard_normal((16, 24)).astype(np.float32)
    with pytest.raises(NkiValidationError, match=r"nc_transpose.*'i < 10' \(i = nl.arange\(24\) at axis 0"):
        simulate(_masked_transpose_output_vars, a)


def _masked_matmul(k_valid, m_valid, n_valid, via_nl):
    """``stationary [K, M] x moving [K, N]`` with each of K, M, N cut by its own variable's bound."""

    def kernel(s, m):
        k_size, m_size = s.shape
        n_size = m.shape[1]
        out = nl.ndarray((m_size, n_size), dtype=nl.float32, buffer=nl.shared_hbm)
        st = nl.load(s)
        mv = nl.load(m)
        i_k = nl.arange(k_size)[:, None]
        i_m = nl.arange(m_size)[None, :]
        i_n = nl.arange(n_size)[None, :]
        mask = (i_k < k_valid) & (i_m < m_valid) & (i_n < n_valid)
        res = nl.ndarray((m_size, n_size), dtype=nl.float32, buffer=nl.psum)
        res[...] = SENTINEL
        if via_nl:
            res[...] = nl.matmul(st[i_k, i_m], mv[i_k, i_n], transpose_x=True, mask=mask)
        else:
            res[...] = nisa.nc_matmul(st[i_k, i_m], mv[i_k, i_n], mask=mask)
        nl.store(out, nl.copy(res))
        return out

    return nki.jit(kernel)


@pytest.mark.parametrize("via_nl", [False, True], ids=["nisa.nc_matmul", "nl.matmul"])
@pytest.mark.parametrize("valid", [(128, 40, 300), (128, 96, 24), (50, 96, 300), (70, 30, 200)],
                         ids=["M-partial", "N-partial", "K-partial", "all"])
def test_masked_matmul_matches_the_axes_by_variable(valid, via_nl):
    k, m, n = valid
    s = RNG.standard_normal((128, 96)).astype(np.float32)
    mv = RNG.standard_normal((128, 300)).astype(np.float32)
    expected = np.full((96, 300), SENTINEL, dtype=np.float32)
    expected[:m, :n] = s[:k, :m].T @ mv[:k, :n]
    out = simulate(_masked_matmul(k, m, n, via_nl), s, mv)
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-4)


@nki.jit
def _masked_load_transpose2d(a):
    """A tiled ``nl.load_transpose2d`` whose last tiles are partial, masked in the source's variables."""
    rows, cols = a.shape
    out = nl.ndarray((cols, rows), dtype=a.dtype, buffer=nl.shared_hbm)
    for r in nl.affine_range((rows + 127) // 128):
        for c in nl.affine_range((cols + 127) // 128):
            i = nl.arange(128)[:, None]
            j = nl.arange(128)[None, :]
            result = nl.ndarray((128, 128), dtype=a.dtype, buffer=nl.sbuf)
            result[...] = SENTINEL
            p = nl.arange(128)[:, None]
            q = nl.arange(128)[None, :]
            result[p, q] = nl.load_transpose2d(a[r * 128 + i, c * 128 + j],
                                               mask=(r * 128 + i < rows) & (c * 128 + j < cols))
            nl.store(out[c * 128 + p, r * 128 + q], result[p, q],
                     mask=(r * 128 + q < rows) & (c * 128 + p < cols))
    return out


def test_masked_partial_tile_load_transpose2d():
    a = RNG.standard_normal((200, 300)).astype(np.float32)
    np.testing.assert_array_equal(simulate(_masked_load_transpose2d, a), a.T)
