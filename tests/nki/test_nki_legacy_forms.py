"""Legacy (NKI Beta 1) call and index forms found in AWS's kernels (issue 17), against NumPy."""


import ml_dtypes
import numpy as np
import pytest

import torchneuron.nki as nki
import torchneuron.nki.isa as nisa
import torchneuron.nki.language as nl
from torchneuron.nki import NkiValidationError

RNG = np.random.default_rng(1717)


def simulate(kernel, *args, target="trn2"):
    return nki.simulate(kernel, target=target)(*args)


# ------------------------------------------------- masked last tile with a two-variable dim
@nki.jit
def max_pool_stride1(a, k):
    """Legacy 2-D max pool: rows i_h + i_kh span two variables; the last partial tile is masked on i_h."""
    h_in, w_in = a.shape
    h_out, w_out = h_in - (k - 1), w_in - (k - 1)
    out = nl.ndarray((h_out, w_out), dtype=a.dtype, buffer=nl.shared_hbm)
    for t in nl.affine_range((h_in + 127) // 128):
        i_h, i_kh, i_w = nl.mgrid[0:128, 0:k, 0:w_in]
        rows = nl.load(a[t * 128 + i_h + i_kh, i_w], mask=(t * 128 + i_h < h_out))
        j_h, j_kh, j_w, j_kw = nl.mgrid[0:128, 0:k, 0:w_out, 0:k]
        pooled = nl.max(rows[j_h, j_kh, j_w + j_kw], axis=[1, 3], mask=(t * 128 + j_h < h_out))
        o_h, o_w = nl.mgrid[0:128, 0:w_out]
        nl.store(out[t * 128 + o_h, o_w], value=pooled, mask=(t * 128 + o_h < h_out))
    return out


def _max_pool_reference(a, k):
    h, w = a.shape[0] - k + 1, a.shape[1] - k + 1
    windows = np.lib.stride_tricks.sliding_window_view(a, (k, k))
    return windows.reshape(h, w, k * k).max(axis=2)


@pytest.mark.parametrize("rows", [200, 260])
def test_masked_two_variable_index_stays_in_bounds(rows):
    a = RNG.standard_normal((rows, 24)).astype(np.float32)
    out = simulate(max_pool_stride1, a, 3)
    assert np.array_equal(out, _max_pool_reference(a, 3))


@nki.jit
def unmasked_overrun(a):
    """The same two-variable rows without a mask: the last tile reads past the end."""
    out = nl.ndarray((128, 3, a.shape[1]), dtype=a.dtype, buffer=nl.shared_hbm)
    i_h, i_kh, i_w = nl.mgrid[0:128, 0:3, 0:a.shape[1]]
    nl.store(out, value=nl.load(a[i_h + i_kh, i_w]))
    return out


def test_unmasked_two_variable_overrun_is_refused():
    with pytest.raises(NkiValidationError, match="out of bounds"):
        simulate(unmasked_overrun, np.zeros((129, 8), np.float32))


# ------------------------------------------------- legacy sequence_bounds returns its tile
@nki.jit
def bounds_of(ids):
    out = nl.ndarray((1, 2, ids.shape[1]), dtype=nl.float32, buffer=nl.shared_hbm)
    nl.store(out, value=nisa.sequence_bounds(segment_ids=nl.load(ids), dtype=nl.float32))
    return out


@nki.jit
def bounds_default_dtype(ids):
    out = nl.ndarray((1, 2, ids.shape[1]), dtype=ids.dtype, buffer=nl.shared_hbm)
    bounds = nisa.sequence_bounds(segment_ids=nl.load(ids))
    assert bounds.dtype == ids.dtype and tuple(bounds.shape) == (1, 2, ids.shape[1])
    nl.store(out, value=bounds)
    return out


def _bounds_reference(ids):
    n = len(ids)
    start, end = np.zeros(n, np.int64), np.zeros(n, np.int64)
    for i, v in enumerate(ids):
        if v == 0:
            start[i], end[i] = n, -1
            continue
        j = i
        while j > 0 and ids[j - 1] == v:
            j -= 1
        e = i
        while e + 1 < n and ids[e + 1] == v:
            e += 1
        start[i], end[i] = j, e + 1
    return np.stack([start, end])[None]


def test_sequence_bounds_legacy_return_style():
    ids = np.array([[1, 1, 2, 2, 2, 0, 0, 3, 4, 4]], np.int32)
    assert np.array_equal(simulate(bounds_default_dtype, ids), _bounds_reference(ids[0]))
    assert np.array_equal(simulate(bounds_of, ids.astype(np.float32)), _bounds_reference(ids[0]).astype(np.float32))


# ------------------------------------------------- legacy dma_transpose with dge_mode=
@nki.jit
def transpose_on_dma(a):
    out = nl.ndarray((a.shape[1], a.shape[0]), dtype=a.dtype, buffer=nl.shared_hbm)
    nl.store(out, value=nisa.dma_transpose(a, dge_mode=nisa.dge_mode.hwdge))
    return out


def test_dma_transpose_legacy_dge_mode():
    a = RNG.standard_normal((16, 96)).astype(ml_dtypes.bfloat16)
    assert np.array_equal(simulate(transpose_on_dma, a), a.T)


# ------------------------------------------------- indexing an HBM tensor by a tile of row numbers
@nki.jit
def gather_rows(table, idx):
    """Legacy indirect load: row p of the tile is table[idx[p], :]."""
    out = nl.ndarray((idx.shape[0], table.shape[1]), dtype=table.dtype, buffer=nl.shared_hbm)
    i_p = nl.arange(idx.shape[0])[:, None]
    i_f = nl.arange(table.shape[1])[None, :]
    rows = nl.load(idx[i_p, 0])
    nl.store(out, value=nl.load(table[rows, i_f]))
    return out


@nki.jit
def scatter_rows(table, idx, updates):
    """Legacy indirect store: updates[p] lands in row idx[p] of a copy of table."""
    out = nl.ndarray(table.shape, dtype=table.dtype, buffer=nl.shared_hbm)
    for b in nl.affine_range(table.shape[0] // 128):
        nl.store(out[b * 128:(b + 1) * 128, :], value=nl.load(table[b * 128:(b + 1) * 128, :]))
    nl.store(out[nl.load(idx), :], value=nl.load(updates))
    return out


def test_load_through_an_index_tile_gathers_rows():
    table = RNG.standard_normal((300, 40)).astype(np.float32)
    idx = RNG.integers(0, 300, (128, 1)).astype(np.int32)  # repeats allowed
    assert np.array_equal(simulate(gather_rows, table, idx), table[idx[:, 0]])
    assert np.array_equal(simulate(gather_rows, table, idx[:16].astype(np.uint16)), table[idx[:16, 0]])


def test_store_through_an_index_tile_scatters_rows():
    table = RNG.standard_normal((256, 40)).astype(np.float32)
    idx = RNG.permutation(256)[:100].reshape(100, 1).astype(np.int32)
    updates = RNG.standard_normal((100, 40)).astype(np.float32)
    expected = table.copy()
    expected[idx[:, 0]] = updates
    assert np.array_equal(simulate(scatter_rows, table, idx, updates), expected)


def test_index_tile_out_of_bounds_or_not_integer_is_refused():
    table = np.zeros((64, 8), np.float32)
    with pytest.raises(NkiValidationError, match=r"holds row 64, out of bounds for dimension 0 .* size 64"):
        simulate(gather_rows, table, np.full((4, 1), 64, np.int32))
    with pytest.raises(NkiValidationError, match=r"needs an integer \[P, 1\] tile of row numbers, got float32"):
        simulate(gather_rows, table, np.zeros((4, 1), np.float32))


# ------------------------------------------------- a tensor with two block dims, indexed one block dim at a time
def _fill_rows(blocks, src, head):
    """A helper taking a one-block-dim tensor, as AWS's flash-attention backward passes dy_o_sum[i_q_head]."""
    for j in nl.affine_range(blocks.shape[0]):
        blocks[j] = nl.load(src[head, j])


@nki.jit
def two_block_dims(a):
    heads, tiles = a.shape[0], a.shape[1]
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    buf = nl.ndarray((heads, tiles, nl.par_dim(128), a.shape[3]), dtype=a.dtype, buffer=nl.sbuf)
    for h in nl.affine_range(heads):
        _fill_rows(buf[h], a, h)
    for h in nl.affine_range(heads):
        for j in nl.affine_range(tiles):
            nl.store(out[h, j], value=nl.multiply(buf[h, j], 3.0))
    return out


def test_two_block_dims_indexed_one_at_a_time():
    a = RNG.standard_normal((2, 3, 128, 16)).astype(np.float32)
    assert np.array_equal(simulate(two_block_dims, a), a * np.float32(3.0))


@nki.jit
def gather_per_batch(table, idx, n_valid):
    """a[b, idx, i_f] with a legacy affine column index and a partition mask (AWS's resize-nearest style)."""
    out = nl.ndarray((table.shape[0], idx.shape[0], table.shape[2]), dtype=table.dtype, buffer=nl.shared_hbm)
    i_p = nl.arange(idx.shape[0])[:, None]
    i_f = nl.arange(table.shape[2])[None, :]
    rows = nl.load(idx)
    for b in nl.affine_range(table.shape[0]):
        tile = nl.load(table[b, rows, i_f], mask=(i_p < n_valid))
        nl.store(out[b, i_p, i_f], value=tile, mask=(i_p < n_valid))
    return out


def test_index_tile_after_integer_indices_with_a_partition_mask():
    table = RNG.standard_normal((2, 50, 24)).astype(np.float32)
    idx = RNG.integers(0, 50, (32, 1)).astype(np.int32)
    idx[20:] = 999  # past the end, but masked off: never read
    out = nki.simulate(gather_per_batch, target="trn2", uninitialized="ignore")(table, idx, 20)
    assert np.array_equal(out[:, :20], table[:, idx[:20, 0]])


@nki.jit
def masked_by_compile_time_condition(a, n):
    """mask=(i_p < 64) & (python condition): a constant True keeps the mask, False drops the load."""
    out = nl.ndarray((128, a.shape[1]), dtype=a.dtype, buffer=nl.shared_hbm)
    i_p, i_f = nl.mgrid[0:128, 0:a.shape[1]]
    nl.store(out, value=0.0)
    tile = nl.load(a[i_p, i_f], mask=(i_p < 64) & (n > 0))
    nl.store(out[i_p, i_f], value=tile, mask=(i_p < 64) & (n > 0))
    return out


def test_mask_combined_with_a_python_bool():
    a = RNG.standard_normal((128, 8)).astype(np.float32)
    kept = simulate(masked_by_compile_time_condition, a, 1)
    assert np.array_equal(kept[:64], a[:64]) and not kept[64:].any()
    assert not simulate(masked_by_compile_time_condition, a, 0).any()


def test_nc_version_is_ordered():
    assert nisa.nc_version.gen3 >= nisa.nc_version.gen2 and nisa.nc_version.gen4 > nisa.nc_version.gen3
    assert sorted([nisa.nc_version.gen4, nisa.nc_version.gen2]) == [nisa.nc_version.gen2, nisa.nc_version.gen4]
