"""nki.isa GpSimd instructions (torchneuron/nki/isa/gpsimd_ops.py): iota, affine_select, local_gather,
nc_n_gather, sequence_bounds and nonzero_with_count against AWS's reference semantics."""

from __future__ import annotations

import ml_dtypes
import numpy as np

import torchneuron.nki.isa as nisa
from torchneuron.nki.memory import Buffer

from nki_isa_support import put as _put, rounded as _r
from nki_isa_support import fails as _fails, run as _run, tile as _tile

SBUF, PSUM, HBM = Buffer.sbuf, Buffer.psum, Buffer.shared_hbm
BF16 = ml_dtypes.bfloat16




RNG = np.random.default_rng(2)


# ---------------------------------------------------------------------------- GpSimd
def test_iota_generates_the_affine_pattern():
    got = {}

    def kernel():
        a = _tile((8, 4, 5), "int32")
        h = nisa.iota(dst=a, pattern=[[10, 4], [1, 5]], offset=3, channel_multiplier=100)
        b = _tile((4, 6), "bfloat16")
        nisa.iota(b, [[-1, 6]], offset=300)
        got.update(a=a.values().copy(), b=b.values().astype(np.float32), ins=h.instruction)
    _run(kernel)
    c, w, x = np.meshgrid(np.arange(8), np.arange(4), np.arange(5), indexing="ij")
    np.testing.assert_array_equal(got["a"], 3 + 100 * c + 10 * w + x)
    np.testing.assert_array_equal(got["b"], _r(np.broadcast_to(300 - np.arange(6), (4, 6))))
    assert (got["ins"].engine, got["ins"].attrs["pattern"]) == ("gpsimd", [[10, 4], [1, 5]])

    def wrong_count():
        nisa.iota(dst=_tile((8, 16), "int32"), pattern=[[1, 8]])
    _fails(wrong_count, "generates 8 values per partition but dst holds 16")

    def in_psum():
        nisa.iota(dst=_tile((8, 8), "float32", PSUM), pattern=[[1, 8]])
    _fails(in_psum, "GpSimd cannot access")


def test_affine_select_builds_a_causal_mask():
    x = RNG.standard_normal((64, 64)).astype(np.float32)
    got = {}

    def kernel():
        out = _tile((64, 64))
        nisa.affine_select(dst=out, pattern=[[-1, 64]], channel_multiplier=1, on_true_tile=_put(x),
                           on_false_value=-9984.0, cmp_op="greater_equal")
        got["c"] = out.values().copy()
        half = _tile((64, 64), "bfloat16")
        nisa.affine_select(half, [[-1, 64]], 1, _put(x), -1.0, cmp_op="greater_equal", offset=-1)
        got["h"] = half.values().astype(np.float32)
    _run(kernel)
    np.testing.assert_array_equal(got["c"], np.where(np.tril(np.ones((64, 64), bool)), x, -9984.0))
    np.testing.assert_array_equal(got["h"], np.where(np.tril(np.ones((64, 64), bool), -1), _r(x), -1.0))


def test_local_gather_matches_the_aws_reference():
    src = RNG.random((128, 512, 4)).astype(np.float32)
    index_per_core = RNG.integers(0, 512, (16, 4)).astype(np.uint16)
    index = np.tile(index_per_core, (8, 1)) * 4
    got = {}

    def kernel():
        out = _tile((128, 64, 4))
        h = nisa.local_gather(dst=out, src_buffer=_put(src), index=_put(index), num_elem_per_idx=4,
                              num_valid_indices=64)
        got["c"], got["ins"] = out.values().copy(), h.instruction
    _run(kernel)
    expected = np.empty((128, 64, 4), np.float32)
    for core in range(8):
        rows = slice(16 * core, 16 * core + 16)
        flat = (index[rows] // 4).flatten(order="F")[:64]
        expected[rows] = np.take(src[rows], flat, axis=1)
    np.testing.assert_array_equal(got["c"], expected)
    assert got["ins"].attrs["num_elem_per_idx"] == 4 and got["ins"].attrs["num_valid_indices"] == 64

    def bad_index_dtype():
        nisa.local_gather(dst=_tile((16, 4)), src_buffer=_put(np.ones((16, 8), np.float32)),
                          index=_put(np.zeros((16, 1), np.int32)))
    _fails(bad_index_dtype, "index dtype must be uint16")


def test_nc_n_gather():
    data = RNG.standard_normal((8, 4, 5)).astype(np.float32)
    idx = RNG.integers(0, 20, (8, 7)).astype(np.uint32)
    got = {}

    def kernel():
        out = _tile((8, 7))
        nisa.nc_n_gather(dst=out, data=_put(data), indices=_put(idx))
        got["c"] = out.values().copy()
    _run(kernel)
    np.testing.assert_array_equal(got["c"], np.take_along_axis(data.reshape(8, 20), idx.astype(np.int64), axis=1))


def test_sequence_bounds_matches_the_aws_reference():
    seq = np.array([[0, 0, 3, 3, 3, 5, 7, 7, 0, 9, 9, 9]], np.float32)
    got = {}

    def kernel():
        out = _tile((1, 2, 12))
        nisa.sequence_bounds(dst=out, segment_ids=_put(seq))
        got["b"] = out.values().copy()
    _run(kernel)
    s, n = seq[0], seq.shape[1]
    lo, hi = np.zeros(n), np.zeros(n)
    lo[0] = 0 if s[0] != 0 else n
    for i in range(1, n):
        lo[i] = n if s[i] == 0 else (lo[i - 1] if s[i] == s[i - 1] else i)
    hi[-1] = n if s[-1] != 0 else -1
    for i in range(n - 2, -1, -1):
        hi[i] = -1 if s[i] == 0 else (hi[i + 1] if s[i] == s[i + 1] else i + 1)
    np.testing.assert_array_equal(got["b"], np.stack([lo, hi])[None])


def test_nonzero_with_count_writes_partitions_0_16_32():
    src = np.zeros((32, 8), np.float32)
    src[0] = [0, 1, 1, 0, 0, 1, 0, 0]
    src[16] = [5, 0, 0, 0, 0, 0, 0, 2]
    got = {}

    def kernel():
        out = _put(np.full((32, 9), 77, np.int32))
        nisa.nonzero_with_count(dst=out, src=_put(src), index_offset=16, padding_val=-1)
        got["c"] = out.values().copy()
    _run(kernel)
    assert got["c"][0].tolist() == [17, 18, 21, -1, -1, -1, -1, -1, 3]  # the AWS docstring example
    assert got["c"][16].tolist() == [16, 23, -1, -1, -1, -1, -1, -1, 2]
    assert (got["c"][1:16] == 77).all() and (got["c"][17:] == 77).all()
    _fails(kernel, "needs NeuronCore-v3", target="trn1")
