"""``NkiTensor.ap()``: explicit access patterns, with ``dtype=`` reinterpreting the bytes (issue 28, item 1).

Written from NKI's access-pattern guide and the 0.6.0 API stub: a pattern is ``[[stride, count], ...]``
in elements, the shape of the view is the counts, and ``dtype=`` reinterprets the storage (a bit
view), the pattern and offset then counting elements of the new dtype (an int32 ``(128, 256)`` tile
is 512 bfloat16 elements per partition). NumPy's ``ndarray.view`` is the oracle.
"""

import ml_dtypes
import numpy as np
import pytest

import torchneuron.nki as nki
import torchneuron.nki.isa as nisa
import torchneuron.nki.language as nl
from torchneuron.nki import NkiValidationError

RNG = np.random.default_rng(28)


def simulate(kernel, *args):
    return nki.simulate(kernel, target="trn2", uninitialized="error")(*args)


@nki.jit
def int32_tile_as_bfloat16(a):
    """The guide's example: an int32 (128, 256) SBUF tile read as bfloat16 (128, 512)."""
    t = nl.ndarray((128, 256), dtype=nl.int32, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=a)
    out = nl.ndarray((128, 512), dtype=nl.bfloat16, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=t.ap(pattern=[[512, 128], [1, 512]], offset=0, dtype=nl.bfloat16))
    return out


def test_ap_dtype_reinterprets_an_sbuf_tile_and_rescales_the_partition_stride():
    a = RNG.integers(-2**31, 2**31 - 1, size=(128, 256), dtype=np.int32)
    out = simulate(int32_tile_as_bfloat16, a)
    assert out.dtype == ml_dtypes.bfloat16 and out.shape == (128, 512)
    np.testing.assert_array_equal(out.view(np.uint16), a.view(np.uint16))


@nki.jit
def float32_hbm_as_bfloat16_halves(a):
    """An HBM float32 (4, 64) tensor read as bfloat16 with an offset of 2 bfloat16 elements and a step of 2
    (every other half-word: the high halves on a little-endian host, when starting at element 1)."""
    out = nl.ndarray((4, 62), dtype=nl.bfloat16, buffer=nl.shared_hbm)
    t = nl.ndarray((4, 62), dtype=nl.bfloat16, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=a.ap(pattern=[[128, 4], [2, 62]], offset=3, dtype=nl.bfloat16))
    nisa.dma_copy(dst=out, src=t)
    return out


def test_ap_dtype_reinterprets_hbm_with_pattern_and_offset_in_the_new_dtype():
    a = RNG.standard_normal((4, 64)).astype(np.float32)
    halves = a.reshape(-1).view(ml_dtypes.bfloat16)
    expected = np.stack([halves[3 + 128 * r: 3 + 128 * r + 124: 2] for r in range(4)])
    out = simulate(float32_hbm_as_bfloat16_halves, a)
    np.testing.assert_array_equal(out.view(np.uint16), expected.view(np.uint16))


@nki.jit
def uint8_tile_as_float32(a):
    """A narrower-to-wider view: uint8 (8, 64) as float32 (8, 16)."""
    t = nl.ndarray((8, 64), dtype=nl.uint8, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=a)
    out = nl.ndarray((8, 16), dtype=nl.float32, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=t.ap(pattern=[[16, 8], [1, 16]], dtype=nl.float32))
    return out


def test_ap_dtype_to_a_wider_dtype_divides_the_free_size():
    values = RNG.standard_normal((8, 16)).astype(np.float32)
    a = values.view(np.uint8).reshape(8, 64)
    np.testing.assert_array_equal(simulate(uint8_tile_as_float32, a), values)


@nki.jit
def wrong_partition_stride(a):
    t = nl.ndarray((128, 256), dtype=nl.int32, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=a)
    return t.ap(pattern=[[256, 128], [1, 256]], dtype=nl.bfloat16)


def test_ap_dtype_checks_the_partition_stride_in_the_new_dtype():
    a = np.zeros((128, 256), dtype=np.int32)
    with pytest.raises(NkiValidationError, match=r"free element count \(512 bfloat16 elements\), got 256"):
        simulate(wrong_partition_stride, a)


@nki.jit
def ap_of_a_column_slice(a):
    """``.ap()`` on a view starts at the view's storage offset (NKI 0.6.0: offset=None inherits it)."""
    t = nl.ndarray((16, 32), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=a)
    out = nl.ndarray((16, 8), dtype=nl.float32, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=t[:, 8:].ap(pattern=[[32, 16], [2, 8]], offset=1))
    return out


def test_ap_on_a_view_composes_with_its_storage_offset():
    a = RNG.standard_normal((16, 32)).astype(np.float32)
    np.testing.assert_array_equal(simulate(ap_of_a_column_slice, a), a[:, 9:25:2])


@nki.jit
def ap_with_unknown_keyword(a):
    return a.ap(pattern=[[64, 4], [1, 64]], data_type=nl.bfloat16)


def test_ap_rejects_an_unknown_keyword_naming_it():
    with pytest.raises(TypeError, match="data_type"):
        simulate(ap_with_unknown_keyword, np.zeros((4, 64), dtype=np.float32))


@nki.jit
def unused_out_of_range_view(a):
    """Builds a view past the end (e.g. the last iteration's prefetch pattern) and never uses it."""
    t = nl.ndarray((4, 64), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=a)
    _ = t.ap(pattern=[[64, 4], [1, 64]], offset=64)
    out = nl.ndarray((4, 64), dtype=nl.float32, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=t)
    return out


@nki.jit
def used_out_of_range_view(a):
    t = nl.ndarray((4, 64), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=a)
    view = t.ap(pattern=[[64, 4], [1, 64]], offset=64)
    out = nl.ndarray((4, 64), dtype=nl.float32, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=view)
    return out


def test_an_out_of_range_view_is_checked_where_it_is_accessed_not_where_it_is_built():
    a = RNG.standard_normal((4, 64)).astype(np.float32)
    np.testing.assert_array_equal(simulate(unused_out_of_range_view, a), a)
    with pytest.raises(NkiValidationError, match=r"dma_copy.*access pattern \[\[64, 4\], \[1, 64\]\] at offset 64 .*"
                                                 r"reaches element 319, outside its 256 float32 elements"):
        simulate(used_out_of_range_view, a)
