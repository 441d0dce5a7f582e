"""nki.isa legacy (``neuronxcc.nki``) call style: instructions that return their result tile."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import torchneuron.nki.isa as nisa
from torchneuron.nki import context
from torchneuron.nki.errors import NkiValidationError
from torchneuron.nki.indexing import arange, mgrid
from torchneuron.nki.kernel import simulate
from torchneuron.nki.memory import Buffer

SBUF, PSUM, HBM = Buffer.sbuf, Buffer.psum, Buffer.shared_hbm
BF16 = ml_dtypes.bfloat16
from torchneuron.testing import (accumulation_tolerance, assert_close_to_reference, matmul_tolerance,
                                 sum_tolerance, unit_roundoff)
from nki_isa_support import put, rounded as _r
from nki_isa_support import run as _run, tile as _tile


def _put(values, dtype=None, name="t"):
    return put(values, dtype, name=name)


RNG = np.random.default_rng(3)


def test_legacy_element_wise_calls_return_sbuf_tiles():
    a = RNG.standard_normal((32, 16)).astype(np.float32)
    b = RNG.standard_normal((32, 16)).astype(np.float32)
    v = RNG.standard_normal((32, 1)).astype(np.float32)
    got = {}

    def kernel():
        ta, tb = _put(a, "bfloat16"), _put(b)
        c = nisa.tensor_tensor(ta, tb, op=np.add)
        d = nisa.tensor_tensor(data1=ta, data2=tb, op=np.multiply, dtype="bfloat16")
        e = nisa.tensor_scalar(tb, np.multiply, _put(v), op1=np.add, operand1=1.0)
        f = nisa.activation(op=np.exp, data=tb, bias=_put(v), scale=0.5)
        g = nisa.reciprocal(tb)
        h = nisa.tensor_copy(ta, dtype=np.float32)
        got.update({k: (t.shape, t.buffer, t.dtype.name, t.values().astype(np.float32))
                    for k, t in dict(c=c, d=d, e=e, f=f, g=g, h=h).items()})
    _run(kernel)
    expect = {"c": ("float32", _r(a) + b), "d": ("bfloat16", _r(_r(a) * b)), "e": ("float32", b * v + 1.0),
              "f": ("float32", np.exp(b * 0.5 + v)), "g": ("float32", 1 / b), "h": ("float32", _r(a))}
    for key, (dtype, ref) in expect.items():
        shape, buffer, got_dtype, values = got[key]
        assert (shape, buffer, got_dtype) == ((32, 16), SBUF, dtype), key
        np.testing.assert_allclose(values, ref, rtol=1e-5, atol=1e-6, err_msg=key)


def test_legacy_reductions_and_statistics():
    x = RNG.standard_normal((16, 6, 8)).astype(np.float32)
    shapes, values = {}, {}

    def kernel():
        data = _put(x)
        flat = _put(x.reshape(16, 48))
        tiles = {"sum": nisa.tensor_reduce(np.add, data, axis=[2]),
                 "keep": nisa.tensor_reduce(np.max, data, [1, 2], negate=True, keepdims=True),
                 "part": nisa.tensor_partition_reduce(np.add, data),
                 "mv": nisa.bn_aggr(nisa.bn_stats(flat)),
                 "top": nisa.max8(src=flat)}
        tiles["idx"] = nisa.nc_find_index8(data=flat, vals=tiles["top"])
        shapes.update({k: (t.shape, t.dtype.name) for k, t in tiles.items()})
        values.update({k: t.values().copy() for k, t in tiles.items()})
    _run(kernel)
    assert shapes["sum"][0] == (16, 6) and shapes["keep"][0] == (16, 1, 1) and shapes["part"][0] == (1, 6, 8)
    assert shapes["top"] == ((16, 8), "float32") and shapes["idx"] == ((16, 8), "uint32")
    x64 = x.astype(np.float64)
    assert_close_to_reference(values["sum"], x64.sum(axis=2), sum_tolerance(x, 2))
    np.testing.assert_array_equal(values["keep"], -x.max(axis=(1, 2), keepdims=True))
    assert_close_to_reference(values["part"], x64.sum(axis=0, keepdims=True), sum_tolerance(x, 0, keepdims=True))
    flat = x.reshape(16, 48)
    u = unit_roundoff(np.float32)
    assert_close_to_reference(values["mv"][:, 0], flat.astype(np.float64).mean(1), sum_tolerance(flat, 1) / 48,
                              rtol=4 * u)  # a 48-term sum, divided
    assert_close_to_reference(values["mv"][:, 1], flat.astype(np.float64).var(1),
                              rtol=accumulation_tolerance(1.0, 48, np.float32) + 8 * u)  # non-negative squares
    np.testing.assert_array_equal(values["idx"], np.argsort(-flat, axis=1)[:, :8])


def test_legacy_iota_memset_transpose_and_affine_select():
    x = RNG.standard_normal((128, 128)).astype(np.float32)
    got = {}

    def kernel():
        expr_a = arange(0, 512)[None, :]
        expr_b = arange(0, 128)[:, None]
        got["a"] = nisa.iota(expr_a, dtype=np.int32).values().copy()
        got["d"] = nisa.iota(5 + expr_b * 2, np.int32).values().copy()
        got["e"] = nisa.iota(expr_a + expr_b, dtype="float32").values().copy()
        got["c"] = nisa.iota(expr_a * -1, dtype=np.int32).values().copy()
        m = nisa.memset((8, 4), 2.0, np.int32)  # legacy memset casts the value
        got["m"] = (m.dtype.name, m.values().copy())
        t = nisa.nc_transpose(_put(x, "bfloat16"))
        got["t"] = (t.buffer, t.values().astype(np.float32))
        small = nisa.nc_transpose(_put(x[:8, :16]))
        got["small"] = (small.buffer, small.values().copy())
        ix, iy = mgrid[0:128, 0:128]
        got["sel"] = nisa.affine_select(pred=(iy < ix), on_true_tile=_put(x), on_false_value=-1e30).values().copy()
    _run(kernel)
    np.testing.assert_array_equal(got["a"], np.arange(512)[None, :])
    np.testing.assert_array_equal(got["d"], np.arange(5, 260, 2)[:, None])
    np.testing.assert_array_equal(got["e"], np.arange(512)[None, :] + np.arange(128)[:, None])
    np.testing.assert_array_equal(got["c"], -np.arange(512)[None, :])
    assert got["m"][0] == "int32" and (got["m"][1] == 2).all()
    assert got["t"][0] is PSUM and np.array_equal(got["t"][1], _r(x).T)
    assert got["small"][0] is SBUF and np.array_equal(got["small"][1], x[:8, :16].T)
    expected = x.copy()
    expected[np.triu_indices(128)] = np.float32(-1e30)
    np.testing.assert_array_equal(got["sel"], expected)


def test_legacy_mask_restricts_the_leading_rows_and_columns():
    x = RNG.standard_normal((128, 64)).astype(np.float32)
    got = {}

    def kernel():
        i_p, i_f = arange(128)[:, None], arange(64)[None, :]
        data = _put(x)
        out = nisa.tensor_scalar(data, np.multiply, 2.0, mask=(i_p < 100) & (i_f < 40))
        got["masked"] = out.values().copy()
        got["count"] = context.current().instructions[-1].writes[0].shape
        k = 1
        out2 = nisa.activation(op="copy", data=data, mask=(k * 128 + i_p < 160))
        got["tail"] = out2.values().copy()
        out3 = nisa.tensor_reduce(np.add, data, axis=1, mask=(i_p < 10))
        got["reduce"] = out3.values().copy()
    _run(kernel)
    assert got["count"] == (100, 40)
    np.testing.assert_array_equal(got["masked"][:100, :40], 2 * x[:100, :40])
    assert np.isnan(got["masked"][100:]).all() and np.isnan(got["masked"][:, 40:]).all()
    np.testing.assert_array_equal(got["tail"][:32], x[:32])
    assert np.isnan(got["tail"][32:]).all()
    assert_close_to_reference(got["reduce"][:10, 0], x[:10].astype(np.float64).sum(axis=1), sum_tolerance(x[:10], 1))


def test_legacy_mask_that_is_not_a_prefix_is_rejected():
    def kernel():
        i_p = arange(128)[:, None]
        nisa.tensor_copy(_put(np.ones((128, 4), np.float32)), mask=(i_p >= 64))
    with pytest.raises(NkiValidationError, match="only prefix masks"):
        _run(kernel)


def test_legacy_dtype_promotion():
    got = {}

    def kernel():
        a, b, c = _put(np.ones((4, 4), np.float32), "bfloat16"), _put(np.ones((4, 4), np.float32), "float16"), \
            _put(np.ones((4, 4), np.int16))
        got["bf16+fp16"] = nisa.tensor_tensor(a, b, np.add).dtype.name
        got["bf16+int16"] = nisa.tensor_tensor(a, c, np.add).dtype.name
        got["int16+int16"] = nisa.tensor_tensor(c, c, np.add).dtype.name
    _run(kernel)
    assert got == {"bf16+fp16": "float32", "bf16+int16": "bfloat16", "int16+int16": "int16"}


def test_legacy_dma_copy_keywords():
    def kernel():
        nisa.dma_copy(dst=_tile((4, 4)), src=_put(np.ones((4, 4), np.float32)), dst_rmw_op=np.add)
    with pytest.raises(TypeError, match="removed in NKI 0.3.0.*dma_compute"):
        _run(kernel)


def test_legacy_matmul_with_tiling_and_double_row_strings():
    g = RNG.standard_normal((64, 64)).astype(np.float32)
    h = RNG.standard_normal((64, 512)).astype(np.float32)
    a8 = np.ones((128, 2, 1), np.float32)
    b8 = np.ones((128, 2, 512), np.float32)
    got = {}

    def kernel():
        got["tiled"] = nisa.nc_matmul(_put(g), _put(h), tile_position=(64, 64), tile_size=(64, 64)).values().copy()
        got["dr"] = nisa.nc_matmul(_put(a8, "float8_e5m2"), _put(b8, "float8_e5m2"),
                                   perf_mode="double_row_gen3").values().copy()
    _run(kernel)
    assert_close_to_reference(got["tiled"], g.T.astype(np.float64) @ h, matmul_tolerance(g.T, h))
    np.testing.assert_array_equal(got["dr"], np.full((1, 512), 256.0))


def test_legacy_keyword_instructions_from_the_aws_examples():
    x = RNG.standard_normal((32, 64)).astype(np.float32)
    y = RNG.standard_normal((32, 64)).astype(np.float32)
    v = RNG.standard_normal((32, 1)).astype(np.float32)
    pred = (RNG.random((32, 64)) < 0.5).astype(np.uint8)
    got = {}

    def kernel():
        tx, ty, tv = _put(x), _put(y), _put(v)
        row_max = _tile((32, 1))
        got["tsr"] = nisa.tensor_scalar_reduce(data=tx, op0=np.multiply, operand0=1.0, reduce_op=np.max,
                                               reduce_res=row_max).values().copy()
        got["rowmax"] = row_max.values().copy()
        total = _tile((32, 1))
        got["act"] = nisa.activation_reduce(np.exp, tx, reduce_op=np.add, reduce_res=total, bias=tv).values().copy()
        got["total"] = total.values().copy()
        got["stt"] = nisa.scalar_tensor_tensor(data=tx, op0=np.subtract, operand0=tv, op1=np.multiply,
                                               operand1=ty).values().copy()
        got["scan"] = nisa.tensor_tensor_scan(tx, ty, 0.0, np.multiply, np.add).values().copy()
        dst = _put(np.zeros((32, 64), np.float32), name="dst")
        nisa.tensor_copy_predicated(src=tx, dst=dst, predicate=_put(pred))
        got["pred"] = dst.values().copy()
        out = _put(np.zeros((32, 64), np.float32), name="sel")
        nisa.select_reduce(dst=out, predicate=_put(pred), on_true=tx, on_false=-1.0)
        got["sel"] = out.values().copy()
        lo, hi = _put(np.zeros((32, 1), np.float32)), _put(np.full((32, 1), 10.0, np.float32))
        got["range"] = nisa.range_select(on_true_tile=tx, comp_op0=np.greater_equal, comp_op1=np.less, bound0=lo,
                                         bound1=hi, reduce_cmd=nisa.reduce_cmd.reset_reduce, reduce_op=np.max,
                                         on_false_value=float(np.finfo(np.float32).min)).values().copy()
        got["drop"] = nisa.dropout(tx, prob=0.0).values().copy()
        idx = _tile((32, 8), "uint32")
        got["repl"] = nisa.nc_match_replace8(dst_idx=idx, data=tx, vals=nisa.max8(src=tx), imm=0.0).values().copy()
        got["dt"] = nisa.dma_transpose(_put(x[:16, :32], "bfloat16")).values().astype(np.float32)
    _run(kernel)
    np.testing.assert_array_equal(got["tsr"], x)
    np.testing.assert_array_equal(got["rowmax"], x.max(axis=1, keepdims=True))
    np.testing.assert_allclose(got["act"], np.exp(x + v), rtol=1e-6)
    rtol = accumulation_tolerance(1.0, 64, np.float32) + 8 * unit_roundoff(np.float32)  # 64 positive terms
    assert_close_to_reference(got["total"], np.exp(x + v).sum(axis=1, keepdims=True), rtol=rtol)
    np.testing.assert_allclose(got["stt"], (x - v) * y, rtol=1e-6)
    scan = np.zeros(32, np.float32)
    ref = np.empty_like(x)
    for i in range(64):
        scan = x[:, i] * scan + y[:, i]
        ref[:, i] = scan
    np.testing.assert_allclose(got["scan"], ref, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(got["pred"], np.where(pred, x, 0.0))
    np.testing.assert_array_equal(got["sel"], np.where(pred, x, -1.0))
    keep = np.arange(64)[None, :] < 10
    np.testing.assert_array_equal(got["range"], np.where(keep, x, np.finfo(np.float32).min))
    np.testing.assert_array_equal(got["drop"], x)
    expected = x.copy()
    np.put_along_axis(expected, np.argsort(-x, axis=1)[:, :8], 0.0, axis=1)
    np.testing.assert_array_equal(got["repl"], expected)
    np.testing.assert_array_equal(got["dt"], _r(x[:16, :32]).T)


def test_legacy_assignment_of_a_matmul_into_psum_is_the_matmul_writing_it():
    """``psum[...] = nisa.nc_matmul(a, b)`` places the matmul's output in ``psum`` (no PSUM -> PSUM
    copy), and a later assignment starts a new accumulation group even after ``+=``."""
    import torchneuron.nki as nki
    import torchneuron.nki.language as nl

    @nki.jit
    def assign_matmul(a, b):
        out = nl.ndarray((a.shape[1], b.shape[1]), dtype=nl.float32, buffer=nl.shared_hbm)
        acc = nl.ndarray((a.shape[1], b.shape[1]), dtype=nl.float32, buffer=nl.psum)
        x, y = nl.load(a), nl.load(b)
        acc[...] = nisa.nc_matmul(x, y)
        acc[...] += nisa.nc_matmul(x, y)
        twice = nl.copy(acc)
        acc[...] = nisa.nc_matmul(x, y)
        nl.store(out, value=nl.add(nl.copy(acc), twice))
        return out

    a = RNG.standard_normal((128, 64)).astype(np.float32)
    b = RNG.standard_normal((128, 256)).astype(np.float32)
    got = nki.simulate(assign_matmul)(a, b)
    product = a.T @ b
    assert_close_to_reference(got, 3 * product, atol=3 * matmul_tolerance(a.T, b))
    run = assign_matmul.last_run
    matmuls = [ins for ins in run.instructions if ins.opcode == "nc_matmul"]
    assert [ins.attrs.get("accumulate") for ins in matmuls] == [False, True, False]
    psum_copies = [ins for ins in run.instructions if ins.opcode == "tensor_copy"
                   and ins.reads[0].buffer == "psum" and ins.writes[0].buffer == "psum"]
    assert psum_copies == []


def test_legacy_masked_statement_writes_only_its_masked_part_of_the_target():
    """Legacy NKI applied ``mask=`` to the whole statement: ``t[...] = nisa.op(..., mask=m)`` leaves the
    part of ``t`` outside the mask as it was (AWS's flash attention applies its sliding-window
    affine_select under a mask that is constant False for tiles right of the diagonal)."""
    import warnings

    import torchneuron.nki as nki
    import torchneuron.nki.language as nl

    @nki.jit
    def masked_statements(a, off):
        out = nl.ndarray(a.shape, dtype=nl.float32, buffer=nl.shared_hbm)
        x = nl.load(a)
        i_p, i_f = nl.mgrid[0:a.shape[0], 0:a.shape[1]]
        buf = nl.ndarray(a.shape, dtype=nl.float32, buffer=nl.sbuf)
        buf[...] = nisa.affine_select(pred=(i_p >= i_f), on_true_tile=x, on_false_value=-1.0, dtype=nl.float32)
        buf[...] = nisa.affine_select(pred=(i_f > i_p - 4), on_true_tile=buf, on_false_value=-2.0,
                                      dtype=nl.float32, mask=(off < 0))            # constant False: no effect
        buf[...] = nisa.activation(op=nl.exp, data=buf, mask=(i_p < 3))           # first 3 partitions only
        nl.store(out, value=buf)
        return out

    a = RNG.standard_normal((8, 16)).astype(np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no read of never-written memory
        got = simulate(masked_statements)(a, 0)
    i_p, i_f = np.mgrid[0:8, 0:16]
    expected = np.where(i_p >= i_f, a, -1.0).astype(np.float32)
    expected[:3] = np.exp(expected[:3])
    np.testing.assert_allclose(got, expected, rtol=1e-6)
