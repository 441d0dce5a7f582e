"""Kernels that used to give wrong numbers without an error (issue 17, "silent wrong results").

Each case runs a legacy (``nl.arange`` / returning-ISA) and, where the idiom
exists there, a current-style kernel against a NumPy reference.
"""


import ml_dtypes
import numpy as np
import pytest

import torchneuron.nki as nki
import torchneuron.nki.isa as nisa
import torchneuron.nki.language as nl
from torchneuron import config
from torchneuron.nki import NkiValidationError
from torchneuron.testing import assert_close_to_reference, matmul_tolerance

RNG = np.random.default_rng(17)


def simulate(kernel, *args, target="trn2", **kwargs):
    return nki.simulate(kernel, target=target, uninitialized="error", **kwargs)(*args)


# ------------------------------------------- 1. affine indices laid out by iterator role
@nki.jit
def store_transposed(a):
    """Legacy: the tile's partition iterator walks the second dim of the output (a transposing store)."""
    rows, cols = a.shape
    out = nl.ndarray((cols, rows), dtype=a.dtype, buffer=nl.shared_hbm)
    i_p = nl.arange(rows)[:, None]
    i_f = nl.arange(cols)[None, :]
    nl.store(out[i_f, i_p], value=nl.load(a[i_p, i_f]))
    return out


@nki.jit
def load_transposed(a):
    """Legacy: ``nl.load(a[i_f, i_p])`` reads a transposed tile."""
    rows, cols = a.shape
    out = nl.ndarray((cols, rows), dtype=a.dtype, buffer=nl.shared_hbm)
    i_p = nl.arange(cols)[:, None]
    i_f = nl.arange(rows)[None, :]
    nl.store(out[i_p, i_f], value=nl.load(a[i_f, i_p]))
    return out


@nki.jit
def store_transposed_blocks(a):
    """Legacy: ``out[i_f * 128 + i_f2, i_p]``, a multi-term index on the first dim of a transposed store."""
    rows, cols = a.shape  # rows = 64 partitions, cols = 2 * 128
    out = nl.ndarray((cols, rows), dtype=a.dtype, buffer=nl.shared_hbm)
    i_p = nl.arange(rows)[:, None, None]
    i_f = nl.arange(cols // 128)[None, :, None]
    i_f2 = nl.arange(128)[None, None, :]
    tile = nl.load(a.reshape((rows, cols // 128, 128)))
    nl.store(out[i_f * 128 + i_f2, i_p], value=tile)
    return out


def test_store_through_transposing_affine_index():
    a = RNG.standard_normal((128, 64)).astype(np.float32)
    np.testing.assert_array_equal(simulate(store_transposed, a), a.T)


def test_load_through_transposing_affine_index():
    a = RNG.standard_normal((128, 64)).astype(np.float32)
    np.testing.assert_array_equal(simulate(load_transposed, a), a.T)


def test_transposing_store_with_a_two_term_index():
    a = RNG.standard_normal((64, 256)).astype(np.float32)
    np.testing.assert_array_equal(simulate(store_transposed_blocks, a), a.T)


@nki.jit
def permute_free_axes(x, f1, f2):
    """Legacy SBUF-to-SBUF transpose of two free axes by index arithmetic (AWS's transpose2d tutorial idiom)."""
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    tile = nl.load(x)
    i_p = nl.arange(x.shape[0])[:, None, None]
    i_f1 = nl.arange(f1)[None, :, None]
    i_f2 = nl.arange(f2)[None, None, :]
    result = nl.ndarray((x.shape[0], f1 * f2), dtype=x.dtype)
    result[i_p, i_f2 * f1 + i_f1] = nl.copy(tile[i_p, i_f1 * f2 + i_f2])
    nl.store(out, value=result)
    return out


def test_two_term_free_index_permutes_free_axes():
    x = np.arange(5 * 12, dtype=np.int8).reshape(5, 12)
    expected = x.reshape(5, 3, 4).transpose(0, 2, 1).reshape(5, 12)
    np.testing.assert_array_equal(simulate(permute_free_axes, x, 3, 4), expected)


@nki.jit
def load_column(idx):
    i_p = nl.arange(idx.shape[0])[:, None]
    tile = nl.load(idx[i_p])
    out = nl.ndarray(tuple(tile.shape), dtype=idx.dtype, buffer=nl.shared_hbm)
    nl.store(out, value=tile)
    return out


def test_partition_index_of_a_1d_tensor_loads_a_column_tile():
    idx = np.arange(64, dtype=np.int32)
    out = simulate(load_column, idx)
    assert out.shape == (64, 1)
    np.testing.assert_array_equal(out[:, 0], idx)


@nki.jit
def masked_transposed_store(a, n):
    """Legacy: the last partial tile of a transposing store bounded by a mask on the partition iterator."""
    cols = a.shape[1]
    out = nl.ndarray((cols, n), dtype=a.dtype, buffer=nl.shared_hbm)
    for i in nl.affine_range((n + 127) // 128):
        i_p = nl.arange(128)[:, None]
        i_f = nl.arange(cols)[None, :]
        tile = nl.load(a[i * 128 + i_p, i_f], mask=(i * 128 + i_p < n))
        nl.store(out[i_f, i * 128 + i_p], value=tile, mask=(i * 128 + i_p < n))
    return out


def test_masked_transposing_store_of_a_partial_tile():
    a = RNG.standard_normal((200, 16)).astype(np.float32)
    np.testing.assert_array_equal(simulate(masked_transposed_store, a, 200), a.T)


@nki.jit
def transpose_on_chip_by_index(a):
    tile = nl.load(a)
    i_p = nl.arange(a.shape[0])[:, None]
    i_f = nl.arange(a.shape[1])[None, :]
    return tile[i_f, i_p]


def test_on_chip_transposing_index_is_refused():
    with pytest.raises(NkiValidationError, match="partition dimension along another axis"):
        simulate(transpose_on_chip_by_index, np.zeros((64, 64), np.float32))


# ---------------------------------- 2. legacy psum[...] += nisa.nc_matmul(...) into fresh PSUM
@nki.jit
def matmul_accumulate_legacy(a_t, b):
    """Legacy: accumulate K tiles into an uninitialised PSUM tile with the returning nc_matmul."""
    k, m = a_t.shape
    out = nl.ndarray((m, b.shape[1]), dtype=nl.float32, buffer=nl.shared_hbm)
    acc = nl.ndarray((m, b.shape[1]), dtype=nl.float32, buffer=nl.psum)
    for kt in nl.affine_range(k // 128):
        at = nl.load(a_t[kt * 128:(kt + 1) * 128, :])
        bt = nl.load(b[kt * 128:(kt + 1) * 128, :])
        acc[...] += nisa.nc_matmul(at, bt)
    nl.store(out, value=nl.copy(acc))
    return out


@nki.jit
def matmul_accumulate_current(a_t, b):
    """Current: the same accumulation with dst-first nc_matmul and accumulate=(k > 0)."""
    k, m = a_t.shape
    out = nl.ndarray((m, b.shape[1]), dtype=nl.float32, buffer=nl.shared_hbm)
    acc = nl.ndarray((m, b.shape[1]), dtype=nl.float32, buffer=nl.psum)
    for kt in range(k // 128):
        at = nl.load(a_t[kt * 128:(kt + 1) * 128, :])
        bt = nl.load(b[kt * 128:(kt + 1) * 128, :])
        nisa.nc_matmul(dst=acc, stationary=at, moving=bt, accumulate=kt > 0)
    res = nl.ndarray(acc.shape, dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=res, src=acc)
    nl.store(out, value=res)
    return out


@pytest.mark.parametrize("kernel", [matmul_accumulate_legacy, matmul_accumulate_current])
def test_matmul_accumulation_into_fresh_psum(kernel):
    a_t = RNG.standard_normal((384, 128)).astype(np.float32)
    b = RNG.standard_normal((384, 256)).astype(np.float32)
    out = simulate(kernel, a_t, b)
    assert_close_to_reference(out, a_t.T.astype(np.float64) @ b, matmul_tolerance(a_t.T, b))
    first = next(i for i in kernel.last_run.instructions if i.opcode == "nc_matmul")
    assert first.attrs["accumulate"] is False  # the group starts with an overwrite, as the record says


@nki.jit
def matmul_add_onto_copied_psum(a_t, b, c):
    """Legacy ``+=`` of a matmul onto PSUM holding other data (a tensor_copy): an element-wise add."""
    out = nl.ndarray((128, 128), dtype=nl.float32, buffer=nl.shared_hbm)
    acc = nl.ndarray((128, 128), dtype=nl.float32, buffer=nl.psum)
    acc[...] = nl.load(c)
    acc[...] += nisa.nc_matmul(nl.load(a_t), nl.load(b))
    nl.store(out, value=nl.copy(acc))
    return out


def test_matmul_add_onto_initialised_psum_keeps_its_contents():
    a_t, b, c = (RNG.standard_normal((128, 128)).astype(np.float32) for _ in range(3))
    out = simulate(matmul_add_onto_copied_psum, a_t, b, c)
    assert_close_to_reference(out, c + a_t.T.astype(np.float64) @ b, matmul_tolerance(a_t.T, b) + 2 * np.abs(c) * 2.0 ** -24)


# ------------------------------------------- 3. nested @nki.jit helpers inline into the caller
@nki.jit
def add_one_rows_jit(x, out):
    pid = nl.program_id(0)
    rows = slice(pid * 128, (pid + 1) * 128)
    nl.store(out[rows, :], value=nl.add(nl.load(x[rows, :]), 1.0))


def add_one_rows_plain(x, out):
    pid = nl.program_id(0)
    rows = slice(pid * 128, (pid + 1) * 128)
    nl.store(out[rows, :], value=nl.add(nl.load(x[rows, :]), 1.0))


@nki.jit
def outer_with_jit_helper(x):
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    add_one_rows_jit(x, out)
    return out


@nki.jit
def outer_with_plain_helper(x):
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    add_one_rows_plain(x, out)
    return out


def test_nested_jit_helper_runs_in_the_callers_programs():
    x = RNG.standard_normal((256, 64)).astype(np.float32)
    with pytest.warns(UserWarning, match="remove the decorator") as caught:
        out = simulate(outer_with_jit_helper[2], x)
    np.testing.assert_array_equal(out, x + np.float32(1.0))  # program 1 wrote rows 128..255
    assert caught[0].filename == __file__  # the warning points at the kernel's call
    assert len(outer_with_jit_helper.last_run.instructions) == 6  # load, add, store per program
    assert add_one_rows_jit.last_run is None  # never a launch of its own


def test_nested_jit_helper_is_costed_inside_its_caller():
    x = RNG.standard_normal((256, 64)).astype(np.float32)
    with pytest.warns(UserWarning, match="inlined"):
        _, nested = nki.profile(outer_with_jit_helper[2], target="trn2")(x)
    _, plain = nki.profile(outer_with_plain_helper[2], target="trn2")(x)
    assert nested.latency_us == plain.latency_us > 0
    assert nested.instruction_counts == plain.instruction_counts


def test_nested_jit_helper_with_a_launch_grid_is_refused():
    @nki.jit
    def outer(x):
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        add_one_rows_jit[2](x, out)
        return out

    with pytest.raises(TypeError, match="inlined into its caller"):
        simulate(outer, np.zeros((128, 4), np.float32))


# ---------------------------------------------------------------- 4. NKI_PRECISE_FP=0
@nki.jit
def small_increment_bf16(x):
    """x + 1e-3 - x in bf16 tiles: 0 when tiles round to bf16 (1 + 1e-3 is 1 in bf16), 1e-3 when widened."""
    out = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.shared_hbm)
    tile = nl.load(x)
    nl.store(out, value=nl.subtract(nl.add(tile, 1e-3), tile))
    return out


@nki.jit
def small_increment_bf16_isa(x):
    out = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.shared_hbm)
    tile = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=tile, src=x)
    bumped = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=bumped, data=tile, op0=nl.add, operand0=1e-3)
    diff = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=diff, data1=bumped, data2=tile, op=nl.subtract)
    nisa.dma_copy(dst=out, src=diff)
    return out


@pytest.mark.parametrize("kernel", [small_increment_bf16, small_increment_bf16_isa])
def test_precise_fp_off_keeps_low_precision_tiles_in_fp32(kernel):
    x = np.ones((128, 8), ml_dtypes.bfloat16)
    np.testing.assert_array_equal(simulate(kernel, x), 0.0)
    with config.override(NKI_PRECISE_FP="0"):
        widened = simulate(kernel, x)
    expected = (np.float32(1.0) + np.float32(1e-3)) - np.float32(1.0)
    np.testing.assert_array_equal(widened, np.full((128, 8), expected, np.float32))


def test_precise_fp_setting_is_checked():
    with config.override(NKI_PRECISE_FP="sometimes"):
        with pytest.raises(ValueError, match="NKI_PRECISE_FP='sometimes' is not valid"):
            simulate(small_increment_bf16, np.ones((128, 8), ml_dtypes.bfloat16))


@nki.jit
def bitcast_bf16(x):
    out = nl.ndarray(x.shape, dtype=nl.int16, buffer=nl.shared_hbm)
    tile = nl.load(x)
    nl.store(out, value=nl.copy(tile.view(nl.int16)))
    return out


def test_bit_views_of_widened_tiles_are_refused():
    with config.override(NKI_PRECISE_FP="0"):
        with pytest.raises(NkiValidationError, match="NKI_PRECISE_FP=0"):
            simulate(bitcast_bf16, np.ones((128, 8), ml_dtypes.bfloat16))
