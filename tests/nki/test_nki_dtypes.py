"""Conversions into NKI dtypes on a store (torchneuron/nki/dtypes.py): engines compute in fp32
and a store into an integer tile truncates toward zero, as AWS's NumPy-based simulator does and
as AWS's resize_nearest_fixed_dma_kernel relies on (its int32 position / width must give the row
below, not the nearest row)."""

from __future__ import annotations

import numpy as np

import torchneuron.nki as nki
import torchneuron.nki.isa as nisa
import torchneuron.nki.language as nl


@nki.jit
def float_to_int(x):
    out = nl.ndarray(x.shape, dtype=nl.int32, buffer=nl.shared_hbm)
    ints = nl.ndarray(x.shape, dtype=nl.int32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=ints, src=nl.load(x))
    nl.store(out, value=ints)
    return out


@nki.jit
def row_of_position(width):
    """The flattened position -> row step of a nearest-neighbour resize: int32 / int stays int32."""
    out = nl.ndarray((128, 1), dtype=nl.int32, buffer=nl.shared_hbm)
    pos = nl.ndarray((128, 1), dtype=nl.int32, buffer=nl.sbuf)
    nisa.iota(dst=pos, pattern=[[0, 1]], offset=2200, channel_multiplier=1)
    nl.store(out, value=nl.divide(pos, width))
    return out


def test_fp32_to_int_truncates_toward_zero():
    x = np.array([[2.7, -2.7, 58.97, -0.5, 0.5, 1e9]], np.float32).repeat(2, axis=0)
    got = nki.simulate(float_to_int)(x)
    np.testing.assert_array_equal(got, np.trunc(x).astype(np.int32))
    assert got[0].tolist() == [2, -2, 58, 0, 0, 1_000_000_000]


def test_integer_position_divided_by_width_gives_the_row_below():
    rows = nki.simulate(row_of_position)(38)
    expected = (2200 + np.arange(128)) // 38  # 2241 / 38 = 58.97 -> row 58
    np.testing.assert_array_equal(rows[:, 0], expected)
