"""nki.isa selection and random instructions (torchneuron/nki/isa/vector_select.py): select_reduce,
range_select, max8/nc_find_index8/nc_match_replace8, nc_stream_shuffle, rng, dropout and rand2."""

from __future__ import annotations

import numpy as np

import torchneuron.nki.isa as nisa

from nki_isa_support import fails as _fails, put as _put, run as _run, tile as _tile

RNG = np.random.default_rng(1)


# ---------------------------------------------------------------------------- selection and top-8
def test_select_reduce_and_range_select():
    x = RNG.standard_normal((8, 32)).astype(np.float32)
    pred = (RNG.random((8, 32)) < 0.5).astype(np.uint8)
    lo = np.arange(8, dtype=np.float32).reshape(8, 1)
    hi = lo + 10
    got = {}

    def kernel():
        out, res = _tile((8, 32)), _tile((8, 1))
        nisa.select_reduce(dst=out, predicate=_put(pred), on_true=_put(x), on_false=-5.0, reduce_res=res,
                           reduce_cmd=nisa.reduce_cmd.reset_reduce)
        got["sel"], got["selmax"] = out.values().copy(), res.values().copy()
        out2, res2 = _tile((8, 32)), _tile((8, 1))
        nisa.range_select(dst=out2, on_true_tile=_put(x), comp_op0="greater_equal", comp_op1="less",
                          bound0=_put(lo), bound1=_put(hi), reduce_res=res2, range_start=2)
        got["rng"], got["rngmax"] = out2.values().copy(), res2.values().copy()
    _run(kernel)
    sel = np.where(pred != 0, x, -5.0)
    np.testing.assert_array_equal(got["sel"], sel)
    np.testing.assert_array_equal(got["selmax"], sel.max(axis=1, keepdims=True))
    index = 2 + np.arange(32)[None, :]
    keep = (index >= lo) & (index < hi)
    rng = np.where(keep, x, np.finfo(np.float32).min)
    np.testing.assert_array_equal(got["rng"], rng)
    np.testing.assert_array_equal(got["rngmax"], rng.max(axis=1, keepdims=True))
    _fails(kernel, "range_select needs NeuronCore-v3", target="trn1")

    def bad_fill():
        nisa.range_select(dst=_tile((8, 32)), on_true_tile=_put(x), comp_op0="less", comp_op1="less",
                          bound0=_put(lo), bound1=_put(hi), on_false_value=0.0)
    _fails(bad_fill, "on_false_value must be FP32_MIN")


def test_max8_find_index8_and_match_replace8():
    x = RNG.permutation(np.arange(128 * 40, dtype=np.float32)).reshape(128, 40)
    dups = np.array([[1, 2, 3, 4, 8, 8, 8, 8, 8, 8, 8, 0, 0, 0, 0, 0]], np.float32)
    got = {}

    def kernel():
        data = _put(x)
        top = _tile((128, 8))
        nisa.max8(dst=top, src=data)
        idx = _tile((128, 8), "uint32")
        nisa.nc_find_index8(dst=idx, data=data, vals=top)
        repl, ridx = _tile((128, 40)), _tile((128, 8), "uint32")
        nisa.nc_match_replace8(dst=repl, data=data, vals=top, imm=-1.0, dst_idx=ridx)
        d = _put(dups)
        vals = _put(np.array([[3, 8, 8, 8, 8, 8, 8, 8]], np.float32))
        fi, mi = _tile((1, 8), "uint32"), _tile((1, 8), "uint32")
        nisa.nc_find_index8(dst=fi, data=d, vals=vals)
        nisa.nc_match_replace8(dst=_tile((1, 16)), data=d, vals=vals, imm=0.0, dst_idx=mi)
        missing = _tile((1, 8), "uint16")
        nisa.nc_find_index8(dst=missing, data=d, vals=_put(np.full((1, 8), 99.0, np.float32)))
        got.update(top=top.values().copy(), idx=idx.values().copy(), repl=repl.values().copy(),
                   ridx=ridx.values().copy(), fi=fi.values().copy(), mi=mi.values().copy(),
                   missing=missing.values().copy())
    _run(kernel)
    order = np.argsort(-x, axis=1)[:, :8]
    np.testing.assert_array_equal(got["top"], np.take_along_axis(x, order, axis=1))
    np.testing.assert_array_equal(got["idx"], order)
    np.testing.assert_array_equal(got["ridx"], order)
    expected = x.copy()
    np.put_along_axis(expected, order, -1.0, axis=1)
    np.testing.assert_array_equal(got["repl"], expected)
    np.testing.assert_array_equal(got["fi"], [[2, 4, 5, 6, 7, 8, 9, 10]])  # duplicates: ascending
    np.testing.assert_array_equal(got["mi"], [[2, 10, 9, 8, 7, 6, 5, 4]])  # AWS docstring example
    np.testing.assert_array_equal(got["missing"], np.full((1, 8), 0xFFFF))

    def too_small():
        nisa.max8(dst=_tile((4, 8)), src=_put(np.ones((4, 4), np.float32)))
    _fails(too_small, "4 elements per partition", "8 to 16384")


def test_nc_stream_shuffle_moves_within_quadrants():
    x = np.arange(64 * 3, dtype=np.float32).reshape(64, 3)
    mask = [(i + 1) % 32 for i in range(32)]
    mask[5] = 255
    got = {}

    def kernel():
        dst = _put(np.full((64, 3), -1.0, np.float32), name="dst")
        nisa.nc_stream_shuffle(dst=dst, src=_put(x), shuffle_mask=mask)
        got["c"] = dst.values().copy()
    _run(kernel)
    rows = np.arange(64)
    expected = x[(rows // 32) * 32 + (rows % 32 + 1) % 32]
    expected[[5, 37]] = -1.0
    np.testing.assert_array_equal(got["c"], expected)


# ---------------------------------------------------------------------------- random
def test_rng_is_deterministic_per_run_and_reseedable():
    got = []

    def kernel():
        seed = _put(np.array([[1234]], np.int32))
        a, b, c = _tile((4, 16), "uint32"), _tile((4, 16), "uint16"), _tile((4, 16), "uint32")
        nisa.set_rng_seed(src_seeds=seed)
        nisa.rng(dst=a)
        nisa.rng(dst=b)
        nisa.set_rng_seed(seed)
        nisa.rng(c)
        got.append((a.values().copy(), b.values().copy(), c.values().copy()))
    _run(kernel)
    _run(kernel)
    (a1, b1, c1), (a2, _b2, _c2) = got
    np.testing.assert_array_equal(a1, c1)  # same seed, same sequence
    np.testing.assert_array_equal(a1, a2)  # same run, same numbers
    assert not np.array_equal(a1[:, :8], b1[:, :8].astype(np.uint32)) and len(np.unique(a1)) > 32

    def float_dst():
        nisa.rng(dst=_tile((4, 16)))
    _fails(float_dst, "dst must be an integer tile")

    def gpsimd_v2():
        nisa.rng(dst=_tile((4, 16), "uint32"), engine=nisa.engine.gpsimd)
    _fails(gpsimd_v2, "needs NeuronCore-v3", target="trn1")


def test_dropout_and_rand2():
    x = RNG.standard_normal((16, 64)).astype(np.float32)
    got = {}

    def kernel():
        keep_all, drop_all, half = _tile((16, 64)), _tile((16, 64)), _tile((16, 64))
        nisa.dropout(dst=keep_all, data=_put(x), prob=0.0)
        nisa.dropout(dst=drop_all, data=_put(x), prob=1.0)
        nisa.dropout(dst=half, data=_put(x), prob=_put(np.full((16, 1), 0.5, np.float32)))
        r = _tile((16, 64))
        nisa.rand2(dst=r, min=-2.0, max=3.0)
        got.update(keep=keep_all.values().copy(), drop=drop_all.values().copy(), half=half.values().copy(),
                   r=r.values().copy())
    _run(kernel, target="trn3")
    np.testing.assert_array_equal(got["keep"], x)
    np.testing.assert_array_equal(got["drop"], np.zeros_like(x))
    kept = got["half"] != 0
    assert 0.35 < kept.mean() < 0.65 and np.array_equal(got["half"][kept], x[kept])
    assert got["r"].min() >= -2 and got["r"].max() < 3 and got["r"].std() > 1
    _fails(kernel, "rand2 is available only on NeuronCore-v4")
