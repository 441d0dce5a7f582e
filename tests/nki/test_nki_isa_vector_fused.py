"""nki.isa fused VectorE instructions (torchneuron/nki/isa/vector_fused.py, accumulators.py): reciprocal and
exponential, scalar_tensor_tensor, tensor_scalar_reduce and its accumulators, cumulative scans and bn_stats/bn_aggr."""

from __future__ import annotations

import numpy as np
import pytest

import torchneuron.nki.isa as nisa
from torchneuron.nki.errors import NkiUninitializedReadError
from torchneuron.nki.memory import Buffer
from torchneuron.testing import accumulation_tolerance, assert_close_to_reference, sum_tolerance, unit_roundoff

from nki_isa_support import fails as _fails, put as _put, run as _run, tile as _tile

SBUF, PSUM, HBM = Buffer.sbuf, Buffer.psum, Buffer.shared_hbm
RNG = np.random.default_rng(1)


def test_reciprocal_and_exponential():
    x = RNG.random((16, 32)).astype(np.float32) + 0.5
    m = RNG.random((16, 1)).astype(np.float32)
    got = {}

    def kernel():
        r = _tile((16, 32))
        nisa.reciprocal(dst=r, data=_put(x))
        e = _tile((16, 32))
        total = _tile((16, 1))
        h = nisa.exponential(dst=e, src=_put(x), max_value=_put(m), reduce_res=total,
                             reduce_cmd=nisa.reduce_cmd.reset_reduce)
        nisa.exponential(dst=e, src=_put(x), max_value=1.0, reduce_res=total, reduce_cmd=nisa.reduce_cmd.reduce)
        got.update(r=r.values().copy(), e=e.values().copy(), total=total.values().copy(), ins=h.instruction)
    _run(kernel, target="trn3")
    np.testing.assert_allclose(got["r"], 1 / x, rtol=1e-6)
    np.testing.assert_allclose(got["e"], np.exp(x - 1.0), rtol=1e-6)
    expected = np.exp(x - m).sum(axis=1, keepdims=True) + np.exp(x - 1.0).sum(axis=1, keepdims=True)
    # 64 positive terms accumulated in some order (relative gamma_64 each side), exps within a few ulp
    rtol = accumulation_tolerance(1.0, 64, np.float32) + 8 * unit_roundoff(np.float32)
    assert_close_to_reference(got["total"], expected, rtol=rtol)
    assert got["ins"].engine == "vector" and got["ins"].attrs["reduce_res"] is True
    _fails(kernel, "exponential is available only on NeuronCore-v4", "nisa.activation")


# ---------------------------------------------------------------------------- fused and accumulating
def test_scalar_tensor_tensor():
    x, y = RNG.standard_normal((8, 12)).astype(np.float32), RNG.standard_normal((8, 12)).astype(np.float32)
    v = RNG.standard_normal((8, 1)).astype(np.float32)
    got = {}

    def kernel():
        out = _tile((8, 12))
        nisa.scalar_tensor_tensor(dst=out, data=_put(x), op0=np.subtract, operand0=_put(v), op1=np.multiply,
                                  operand1=_put(y))
        got["a"] = out.values().copy()
    _run(kernel)
    np.testing.assert_allclose(got["a"], (x - v) * y, rtol=1e-6)

    def both_psum():
        nisa.scalar_tensor_tensor(dst=_tile((8, 12)), data=_put(x, buffer=PSUM), op0=np.add, operand0=1.0,
                                  op1=np.add, operand1=_put(y, buffer=PSUM))
    _fails(both_psum, "data and operand1 are both in PSUM")


def test_tensor_scalar_reduce_accumulators():
    x = RNG.standard_normal((8, 16)).astype(np.float32)
    got = {}

    def kernel():
        out, res = _tile((8, 16)), _tile((8, 1))
        nisa.tensor_scalar_reduce(dst=out, data=_put(x), op0=np.multiply, operand0=2.0, reduce_op=np.add)
        nisa.tensor_scalar_reduce(dst=out, data=_put(x), op0=np.add, operand0=1.0, reduce_op=np.add,
                                  reduce_res=res, reduce_cmd=nisa.reduce_cmd.reduce, reduce_res_negate=True)
        got["sum"] = res.values().copy()
        nisa.tensor_scalar_reduce(dst=out, data=_put(x), op0=np.multiply, operand0=1.0, reduce_op=np.max,
                                  reduce_res=res, reduce_cmd=nisa.reduce_cmd.load_reduce, reduce_init=100.0)
        got["max"] = res.values().copy()
    _run(kernel)
    terms = np.concatenate([2 * x, x + np.float32(1)], axis=1)  # as the engine rounds them
    expected = terms.astype(np.float64).sum(axis=1, keepdims=True)
    assert_close_to_reference(got["sum"], -expected, sum_tolerance(terms, 1, keepdims=True))
    np.testing.assert_array_equal(got["max"], np.full((8, 1), 100.0))

    def reverse():
        nisa.tensor_scalar_reduce(dst=_tile((8, 16)), data=_put(x), op0=np.subtract, operand0=1.0,
                                  reduce_op=np.add, reverse0=True)
    _fails(reverse, "reverse0=True is not supported")

    def init_without_load():
        nisa.tensor_scalar_reduce(dst=_tile((8, 16)), data=_put(x), op0=np.add, operand0=1.0, reduce_op=np.add,
                                  reduce_init=1.0)
    _fails(init_without_load, "reduce_init may be set only with reduce_cmd=load_reduce")


def test_reading_vector_accumulators_never_reset_follows_the_policy():
    def kernel():
        nisa.tensor_scalar_reduce(dst=_tile((8, 16)), data=_put(np.ones((8, 16), np.float32)), op0=np.add,
                                  operand0=1.0, reduce_op=np.add, reduce_res=_tile((8, 1)),
                                  reduce_cmd=nisa.reduce_cmd.reduce)
    _fails(kernel, "accumulator registers of partitions 0..7 that no instruction reset",
           error=NkiUninitializedReadError)


@pytest.mark.parametrize("op1", ["add", "subtract", "multiply", "maximum", "minimum"])
def test_tensor_scalar_cumulative_matches_a_sequential_scan(op1):
    x = RNG.uniform(0.5, 1.5, (4, 20)).astype(np.float32)
    got = {}

    def kernel():
        out = _tile((4, 20))
        nisa.tensor_scalar_cumulative(dst=out, src=_put(x), op0=np.multiply, op1=op1, imm0=0.5,
                                      imm1=2.0, reduce_cmd=nisa.reduce_cmd.load_reduce)
        got["c"] = out.values().copy()
    _run(kernel)
    fn = {"add": np.add, "subtract": np.subtract, "multiply": np.multiply, "maximum": np.maximum,
          "minimum": np.minimum}[op1]
    reg = np.full(4, 2.0, np.float32)
    ref = np.empty_like(x)
    for i in range(x.shape[1]):
        reg = fn(x[:, i] * np.float32(0.5), reg).astype(np.float32)
        ref[:, i] = reg
    np.testing.assert_allclose(got["c"], ref, rtol=1e-5, atol=1e-5)


def test_tensor_scalar_cumulative_rejects_int32():
    def body():
        nisa.tensor_scalar_cumulative(dst=_tile((4, 8), "int32"), src=_put(np.ones((4, 8), np.int32)),
                                      op0=np.add, op1=np.add, imm0=1.0)
    _fails(body, "int32 is not supported", "excluded by the ISA")


def test_tensor_tensor_scan_matches_the_documented_recurrence():
    a, b = RNG.uniform(0.5, 1, (8, 30)).astype(np.float32), RNG.standard_normal((8, 30)).astype(np.float32)
    init = RNG.standard_normal((8, 1)).astype(np.float32)
    got = {}

    def kernel():
        out = _tile((8, 30))
        nisa.tensor_tensor_scan(dst=out, data0=_put(a), data1=_put(b), initial=_put(init), op0=np.multiply,
                                op1=np.add)
        got["c"] = out.values().copy()
        out2 = _tile((8, 30))
        nisa.tensor_tensor_scan(out2, _put(a), _put(b), 1.0, np.subtract, np.subtract, reverse0=True,
                                reverse1=True)
        got["r"] = out2.values().copy()
    _run(kernel)
    ref, ref_r = np.empty_like(a), np.empty_like(a)
    state, state_r = init[:, 0], np.ones(8, np.float32)
    for i in range(a.shape[1]):
        state = a[:, i] * state + b[:, i]
        state_r = b[:, i] - (state_r - a[:, i])
        ref[:, i], ref_r[:, i] = state, state_r
    np.testing.assert_allclose(got["c"], ref, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got["r"], ref_r, rtol=1e-5, atol=1e-5)


def test_bn_stats_and_bn_aggr_give_mean_and_variance():
    x = RNG.standard_normal((32, 1024)).astype(np.float32) * 3 + 1
    got = {}

    def kernel():
        data = _put(x)
        stats = _tile((32, 12))
        for i in range(2):
            nisa.bn_stats(dst=stats[:, 6 * i:6 * i + 6], data=data[:, 512 * i:512 * (i + 1)])
        mv = _tile((32, 2))
        nisa.bn_aggr(dst=mv, data=stats)
        got["mv"], got["stats"] = mv.values().copy(), stats.values().copy()
    _run(kernel)
    x64 = x.astype(np.float64)
    # the mean: a 1024-term fp32 sum (two chunks of 512 aggregated) / n; the variance: sums of
    # non-negative squares (relative gamma_n), the chunk means entering at second order
    assert_close_to_reference(got["mv"][:, 0], x64.mean(axis=1), sum_tolerance(x, 1) / 1024,
                              rtol=4 * unit_roundoff(np.float32))
    assert_close_to_reference(got["mv"][:, 1], x64.var(axis=1),
                              rtol=accumulation_tolerance(1.0, 1024, np.float32))
    np.testing.assert_array_equal(got["stats"][:, [0, 3]], np.full((32, 2), 256.0))

    def too_wide():
        nisa.bn_stats(dst=_tile((32, 6)), data=_put(x))
    _fails(too_wide, "1024 elements per partition", "limit of 512", "bn_stats_fmax")
