"""nki.isa TensorE instructions (torchneuron/nki/isa/tensor_ops.py): nc_matmul (accumulation groups,
shape/dtype/placement rules, tiling, double_row, is_transpose, the legacy form) and nc_transpose."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import torchneuron.nki.isa as nisa
from torchneuron.nki.dtypes import round_tf32
from torchneuron.nki.memory import Buffer
from torchneuron.testing import assert_close_to_reference, matmul_tolerance, unit_roundoff

from nki_isa_support import fails as _fails, put as _put, rounded as _rounded, run as _run, tile as _tile

SBUF, PSUM, HBM = Buffer.sbuf, Buffer.psum, Buffer.shared_hbm
BF16 = ml_dtypes.bfloat16
RNG = np.random.default_rng(0)


# ---------------------------------------------------------------------------- nc_matmul numerics and record
def test_nc_matmul_bf16_matches_fp32_math_on_rounded_inputs():
    a = RNG.standard_normal((128, 96)).astype(np.float32)
    b = RNG.standard_normal((128, 384)).astype(np.float32)
    got = {}

    def kernel():
        sa, sb = _put(a, "bfloat16", name="a"), _put(b, "bfloat16", name="b")
        psum = _tile((96, 384), "float32", PSUM, "psum")
        nisa.nc_matmul(dst=psum, stationary=sa, moving=sb)
        got["c"] = psum.values().copy()
    run = _run(kernel)
    ra, rb = _rounded(a, BF16).T, _rounded(b, BF16)
    assert_close_to_reference(got["c"], ra.astype(np.float64) @ rb, matmul_tolerance(ra, rb))
    ins = run.instructions[-1]
    assert (ins.opcode, ins.engine, ins.flops) == ("nc_matmul", "tensor", 2 * 128 * 96 * 384)
    assert [o.buffer for o in ins.reads] == ["sbuf", "sbuf"] and [o.buffer for o in ins.writes] == ["psum"]
    assert (ins.attrs["stationary_free"], ins.attrs["moving_free"], ins.attrs["contraction"]) == (96, 384, 128)
    assert ins.attrs["perf_mode"] == "none" and ins.attrs["accumulate"] is False
    assert ins.location is not None and ins.location.function == "kernel"


def test_nc_matmul_tf32_inputs_are_rounded_to_10_mantissa_bits():
    a = RNG.standard_normal((64, 32)).astype(np.float32)
    b = RNG.standard_normal((64, 48)).astype(np.float32)
    got = {}

    def kernel():
        sa, sb = _put(a, "float32"), _put(b, "float32")
        ta, tb = sa.view("tfloat32"), sb.view("tfloat32")  # raw fp32 bits read as tf32
        psum = _tile((32, 48), "float32", PSUM)
        nisa.nc_matmul(psum, ta, tb)
        got["c"] = psum.values().copy()
    _run(kernel)
    ta, tb = round_tf32(a).T, round_tf32(b)
    assert_close_to_reference(got["c"], ta.astype(np.float64) @ tb, matmul_tolerance(ta, tb))
    assert not np.allclose(got["c"], a.T @ b, rtol=1e-7, atol=1e-7)


def test_nc_matmul_accumulation_groups():
    a = RNG.standard_normal((128, 64)).astype(np.float32)
    b = RNG.standard_normal((128, 128)).astype(np.float32)
    got = {}

    def kernel():
        sa, sb = _put(a), _put(b)
        psum = _tile((64, 128), "float32", PSUM)
        nisa.nc_matmul(dst=psum, stationary=sa, moving=sb)  # None: first write overwrites
        nisa.nc_matmul(dst=psum, stationary=sa, moving=sb)  # None: group open -> accumulates
        nisa.nc_matmul(dst=psum, stationary=sa, moving=sb, accumulate=True)
        got["three"] = psum.values().copy()
        nisa.nc_matmul(dst=psum, stationary=sa, moving=sb, accumulate=False)
        got["one"] = psum.values().copy()
        out = _tile((64, 128))
        nisa.tensor_copy(dst=out, src=psum)  # reading the result closes the group
        nisa.nc_matmul(dst=psum, stationary=sa, moving=sb)  # None after the read: a new group
        got["restart"] = psum.values().copy()
        nisa.nc_matmul(dst=psum, stationary=sa, moving=sb, accumulate=True)  # explicit True still allowed
        got["two"] = psum.values().copy()
    run = _run(kernel)
    ref = a.T.astype(np.float64) @ b
    for key, n in (("three", 3), ("one", 1), ("restart", 1), ("two", 2)):
        # n accumulated matmuls: one fp32 sum of n * K products, in PSUM's order
        tol = matmul_tolerance(np.tile(a.T, (1, n)), np.tile(b, (n, 1)))
        assert_close_to_reference(got[key], n * ref, tol, msg=key)
    flags = [i.attrs["accumulate"] for i in run.instructions if i.opcode == "nc_matmul"]
    assert flags == [False, True, True, False, False, True]
    accumulating = [i for i in run.instructions if i.opcode == "nc_matmul"][1]
    assert [o.buffer for o in accumulating.reads] == ["sbuf", "sbuf", "psum"]


def test_accumulate_true_on_uninitialised_psum_is_reported():
    def kernel():
        sa, sb = _put(np.ones((8, 8), np.float32)), _put(np.ones((8, 16), np.float32))
        psum = _tile((8, 16), "float32", PSUM)
        nisa.nc_matmul(dst=psum, stationary=sa, moving=sb, accumulate=True)
    _fails(kernel, "accumulate=True onto 128 PSUM elements", "never written", "undefined behaviour",
           "nisa.nc_matmul(dst=psum, stationary=sa, moving=sb, accumulate=True)")


def _accumulate_onto_memset():
    sa, sb = _put(np.ones((8, 8), np.float32)), _put(np.ones((8, 16), np.float32))
    psum = _tile((8, 16), "float32", PSUM)
    nisa.memset(dst=psum, value=0.0)
    nisa.nc_matmul(dst=psum, stationary=sa, moving=sb, accumulate=True)


def test_matmul_accumulating_onto_memset_psum_is_ub_on_v2_v3_only():
    _fails(_accumulate_onto_memset, "non-matmul instruction", "NeuronCore-v3")
    _fails(_accumulate_onto_memset, "NeuronCore-v2", target="trn1")
    _run(_accumulate_onto_memset, target="trn3")


@pytest.mark.parametrize("stat_shape, mov_shape, dst_shape, needles", [
    ((128, 256), (128, 64), (128, 64), ("stationary free size is 256", "limit of 128",
                                        "gemm_stationary_fmax", "split the stationary tile")),
    ((128, 64), (128, 1024), (64, 1024), ("moving free size is 1024", "limit of 512")),
    ((128, 64), (96, 64), (64, 64), ("stationary has 128 partitions and moving 96", "partition axis")),
    ((128, 64), (128, 64), (32, 64), ("dst has shape [32, 64]", "[64, 64]")),
])
def test_nc_matmul_shape_rules(stat_shape, mov_shape, dst_shape, needles):
    def kernel():
        s, m = _tile(stat_shape, "bfloat16"), _tile(mov_shape, "bfloat16")
        nisa.memset(s, 0.0)
        nisa.memset(m, 0.0)
        dst = _tile(dst_shape, "float32", PSUM)
        nisa.nc_matmul(dst=dst, stationary=s, moving=m)
    _fails(kernel, *needles)


def test_nc_matmul_moving_limit_grows_on_v4():
    got = {}

    def kernel():
        s, m = _put(np.ones((4, 2), np.float32)), _put(np.ones((4, 2048), np.float32))
        dst = _tile((2, 2048), "float32", PSUM)
        nisa.nc_matmul(dst=dst, stationary=s, moving=m)
        got["c"] = dst.values().copy()
    _run(kernel, target="trn3")
    np.testing.assert_array_equal(got["c"], np.full((2, 2048), 4.0))
    # on trn2 the same matmul breaks both the moving limit and the one-bank rule
    _fails(kernel, "moving free size is 2048", "limit of 512", "one PSUM bank")


def test_nc_matmul_dst_must_stay_in_one_psum_bank_on_v2_v3():
    def kernel():
        s, m = _put(np.ones((4, 2), np.float32)), _put(np.ones((4, 256), np.float32))
        psum = _tile((2, 1024), "float32", PSUM, "wide")  # two banks
        nisa.nc_matmul(dst=psum[:, 0:256], stationary=s, moving=m)  # bank 0: fine
        nisa.nc_matmul(dst=psum[:, 384:640], stationary=s, moving=m)  # crosses into bank 1
    text = _fails(kernel, "crossing the 2048 B bank boundary", "banks 0 and 1", "one PSUM bank")
    assert "psum[:, 384:640]" in text


def test_nc_matmul_memory_placement_rules():
    def sbuf_dst():
        s, m = _tile((4, 2)), _tile((4, 8))
        nisa.memset(s, 1.0)
        nisa.memset(m, 1.0)
        nisa.nc_matmul(dst=_tile((2, 8)), stationary=s, moving=m)
    _fails(sbuf_dst, "TensorE writes only to PSUM", "buffer=nl.psum")

    def psum_input():
        s, m = _tile((4, 2)), _tile((4, 8), "float32", PSUM)
        nisa.memset(s, 1.0)
        nisa.memset(m, 1.0)
        nisa.nc_matmul(dst=_tile((2, 8), "float32", PSUM), stationary=s, moving=m)
    _fails(psum_input, "moving", "TensorE reads its inputs only from SBUF")


@pytest.mark.parametrize("sd, md, dd, target, needles", [
    ("float32", "bfloat16", "float32", "trn2", ("stationary is float32 and moving is bfloat16",
                                               "float32/tfloat32 too")),
    ("bfloat16", "bfloat16", "bfloat16", "trn2", ("dst dtype is bfloat16", "float32 PSUM",
                                                 "bfloat16 is also allowed on NeuronCore-v4")),
    ("float8_e4m3", "float8_e4m3fn", "float32", "trn3", ("cannot be mixed",)),
    ("float8_e4m3fn", "bfloat16", "float32", "trn2", ("float8_e4m3fn is not a TensorE input type",
                                                     "needs NeuronCore-v4")),
    ("int32", "int32", "float32", "trn2", ("int32 is not a TensorE input type",)),
])
def test_nc_matmul_dtype_rules(sd, md, dd, target, needles):
    def kernel():
        s, m = _tile((4, 2), sd), _tile((4, 8), md)
        nisa.nc_matmul(dst=_tile((2, 8), dd, PSUM), stationary=s, moving=m)
    _fails(kernel, *needles, target=target)


def test_nc_matmul_bf16_dst_on_v4():
    a = RNG.standard_normal((32, 16)).astype(np.float32)
    b = RNG.standard_normal((32, 64)).astype(np.float32)
    got = {}

    def kernel():
        dst = _tile((16, 64), "bfloat16", PSUM)
        nisa.nc_matmul(dst=dst, stationary=_put(a, "bfloat16"), moving=_put(b, "bfloat16"))
        got["c"] = dst.values().astype(np.float32)
    _run(kernel, target="trn3")
    ra, rb = _rounded(a, BF16).T, _rounded(b, BF16)
    # fp32 accumulation, one rounding into the bf16 PSUM tile
    assert_close_to_reference(got["c"], ra.astype(np.float64) @ rb, matmul_tolerance(ra, rb) * (1 + 2 ** -8),
                              rtol=unit_roundoff(BF16))


def test_nc_matmul_fp8_double_row():
    a = RNG.integers(-3, 4, (128, 2, 8)).astype(np.float32)
    b = RNG.integers(-3, 4, (128, 2, 40)).astype(np.float32)
    got = {}

    def kernel():
        dst = _tile((8, 40), "float32", PSUM)
        h = nisa.nc_matmul(dst=dst, stationary=_put(a, "float8_e5m2"), moving=_put(b, "float8_e4m3"),
                           perf_mode=nisa.matmul_perf_mode.double_row)
        got["c"], got["ins"] = dst.values().copy(), h.instruction
    _run(kernel)
    np.testing.assert_array_equal(got["c"], np.einsum("kli,klj->ij", a, b))
    assert got["ins"].attrs["perf_mode"] == "double_row" and got["ins"].attrs["contraction"] == 256
    assert got["ins"].flops == 2 * 256 * 8 * 40
    _fails(kernel, "perf_mode=double_row needs NeuronCore-v3", target="trn1")

    def bf16_double_row():
        s, m = _tile((128, 2, 8), "bfloat16"), _tile((128, 2, 8), "bfloat16")
        nisa.nc_matmul(dst=_tile((8, 8), "float32", PSUM), stationary=s, moving=m, perf_mode="double_row")
    _fails(bf16_double_row, "double_row takes fp8 inputs only")

    def flat_double_row():
        s, m = _tile((128, 8), "float8_e4m3"), _tile((128, 8), "float8_e4m3")
        nisa.nc_matmul(dst=_tile((8, 8), "float32", PSUM), stationary=s, moving=m,
                       perf_mode=nisa.matmul_perf_mode.double_row)
    _fails(flat_double_row, "[P, 2, F]", "dim 1 equal to 2")


def test_nc_matmul_tiling_mode():
    a = RNG.standard_normal((64, 64)).astype(np.float32)
    b = RNG.standard_normal((64, 128)).astype(np.float32)
    got = {}

    def kernel():
        dst = _tile((64, 128), "float32", PSUM)
        h = nisa.nc_matmul(dst, _put(a, "bfloat16"), _put(b, "bfloat16"), tile_position=(64, 64),
                           tile_size=(64, 64))
        got["c"], got["ins"] = dst.values().copy(), h.instruction
    _run(kernel)
    ra, rb = _rounded(a, BF16).T, _rounded(b, BF16)
    assert_close_to_reference(got["c"], ra.astype(np.float64) @ rb, matmul_tolerance(ra, rb))
    assert got["ins"].attrs["tile_position"] == (64, 64) and got["ins"].attrs["tile_size"] == (64, 64)

    def too_big_for_tile():
        s, m = _tile((64, 64), "bfloat16"), _tile((64, 128), "bfloat16")
        nisa.nc_matmul(_tile((64, 128), "float32", PSUM), s, m, tile_position=(0, 0), tile_size=(64, 32))
    _fails(too_big_for_tile, "stationary free size is 64", "limit of 32")
    _fails(too_big_for_tile, "tile_size column size 32", "needs NeuronCore-v3", target="trn1")

    def misplaced():
        s, m = _tile((32, 32), "bfloat16"), _tile((32, 128), "bfloat16")
        nisa.nc_matmul(_tile((32, 128), "float32", PSUM), s, m, tile_position=(32, 0), tile_size=(64, 64))
    _fails(misplaced, "tile_position row 32 must be a multiple of the row size 64")

    def half_set():
        s, m = _tile((32, 32), "bfloat16"), _tile((32, 128), "bfloat16")
        nisa.nc_matmul(_tile((32, 128), "float32", PSUM), s, m, tile_size=(64, 64))
    _fails(half_set, "both must be set")


def test_nc_matmul_is_transpose_is_bit_exact_on_v3():
    data = RNG.standard_normal((32, 16)).astype(np.float32)
    data[3, 5] = np.nan
    data[7, 1] = np.inf
    got = {}

    def kernel():
        identity = _put(np.eye(32, dtype=np.float32), "bfloat16")
        dst = _tile((16, 32), "bfloat16", PSUM)
        h = nisa.nc_matmul(dst=dst, stationary=_put(data, "bfloat16"), moving=identity, is_transpose=True)
        got["t"], got["ins"] = dst.values().astype(np.float32), h.instruction
    _run(kernel)
    np.testing.assert_array_equal(got["t"], _rounded(data, BF16).T)  # NaN and Inf survive
    assert got["ins"].attrs["is_transpose"] is True and got["ins"].flops == 0

    def not_identity():
        dst = _tile((16, 32), "bfloat16", PSUM)
        nisa.nc_matmul(dst=dst, stationary=_put(data, "bfloat16"), moving=_put(np.ones((32, 32), np.float32),
                       "bfloat16"), is_transpose=True)
    _fails(not_identity, "moving must be the 32x32 identity matrix")


# ---------------------------------------------------------------------------- nc_transpose
def test_nc_transpose_on_tensor_and_vector_engines():
    big = RNG.standard_normal((128, 96)).astype(np.float32)
    small = RNG.standard_normal((16, 24)).astype(np.float32)
    got = {}

    def kernel():
        t_dst = _tile((96, 128), "bfloat16", PSUM)
        h1 = nisa.nc_transpose(dst=t_dst, data=_put(big, "bfloat16"))
        v_dst = _tile((24, 16), "float32")
        h2 = nisa.nc_transpose(dst=v_dst, data=_put(small), engine=nisa.engine.vector)
        got.update(t=t_dst.values().astype(np.float32), v=v_dst.values().copy(), e=(h1.instruction.engine,
                                                                                   h2.instruction.engine))
    _run(kernel)
    np.testing.assert_array_equal(got["t"], _rounded(big, BF16).T)
    np.testing.assert_array_equal(got["v"], small.T)
    assert got["e"] == ("tensor", "vector")


def test_tensore_transpose_on_v2_is_a_matmul_that_spreads_nan():
    data = np.arange(12, dtype=np.float32).reshape(4, 3)
    data[1, 2] = np.nan
    got = {}

    def kernel():
        dst = _tile((3, 4), "float32", PSUM)
        nisa.nc_transpose(dst=dst, data=_put(data), engine=nisa.engine.tensor)
        got["t"] = dst.values().copy()
    _run(kernel, target="trn1")
    expected = data.T.copy()
    expected[2, :] = np.nan  # 0 * NaN poisons the whole output row of that column
    np.testing.assert_array_equal(got["t"], expected)
    _run(kernel, target="trn2")
    np.testing.assert_array_equal(got["t"], data.T)


def test_nc_transpose_rules():
    def vector_too_big():
        nisa.nc_transpose(dst=_tile((64, 64)), data=_put(np.zeros((64, 64), np.float32)),
                          engine=nisa.engine.vector)
    _fails(vector_too_big, "VectorE transposes at most [32, 32]", "engine=nisa.engine.tensor")

    def dtype_change():
        nisa.nc_transpose(dst=_tile((8, 8), "float32", PSUM), data=_put(np.zeros((8, 8), np.float32), "bfloat16"))
    _fails(dtype_change, "dst dtype float32 differs from data dtype bfloat16")

    def wrong_engine():
        nisa.nc_transpose(dst=_tile((8, 8)), data=_put(np.zeros((8, 8), np.float32)), engine=nisa.engine.scalar)
    _fails(wrong_engine, "runs on TensorE or VectorE")


# ---------------------------------------------------------------------------- call styles
def test_legacy_nc_matmul_returns_a_psum_result_and_folds_into_accumulation():
    a = RNG.standard_normal((64, 32)).astype(np.float32)
    b = RNG.standard_normal((64, 128)).astype(np.float32)
    got = {}

    def kernel():
        sa, sb = _put(a), _put(b)
        result = nisa.nc_matmul(sa, sb)
        got["legacy"] = (result.shape, result.buffer, result.dtype.name, result.values().copy())
        acc = _tile((32, 128), "float32", PSUM, "acc")
        nisa.memset(acc, 0.0)
        for _ in range(3):
            assert nisa.accumulate_matmul_result(acc, nisa.nc_matmul(sa, sb))
        got["acc"] = acc.values().copy()
    run = _run(kernel)
    shape, buffer, dtype, values = got["legacy"]
    assert (shape, buffer, dtype) == ((32, 128), PSUM, "float32")
    ref = a.T.astype(np.float64) @ b
    assert_close_to_reference(values, ref, matmul_tolerance(a.T, b))
    # memset 0, then three products accumulated in place: one fp32 sum of 3 K products
    assert_close_to_reference(got["acc"], 3 * ref, matmul_tolerance(np.tile(a.T, (1, 3)), np.tile(b, (3, 1))))
    folded = [i for i in run.instructions if i.opcode == "nc_matmul"][1:]
    assert [i.attrs["accumulate"] for i in folded] == [False, True, True]
    assert all(i.attrs["legacy_accumulate"] and i.writes[0].shape == (32, 128) for i in folded)
    assert not any(i.opcode == "tensor_tensor" for i in run.instructions)
