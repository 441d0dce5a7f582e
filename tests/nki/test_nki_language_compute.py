"""nki.language compute functions (torchneuron/nki/language/compute.py) against NumPy/torch references, and
the ISA instructions they lower to: element-wise, reductions, softmax/rms_norm, selection and broadcasting.

Elementwise results are compared with a few-ulp rtol. Sums, matmuls and everything built on
them are summed in another order by the simulator than by NumPy/torch (and that order differs
between CPUs and BLAS builds), so they are checked against torchneuron.testing's bounds,
which scale with the operands; max/min and data movement are exact.
"""

import ml_dtypes
import numpy as np
import pytest
import torch

import torchneuron.nki.isa as nisa
import torchneuron.nki.language as nl
from torchneuron.nki import NkiValidationError
from torchneuron.testing import (accumulation_tolerance, assert_close_to_reference, sum_tolerance, unit_roundoff)
from nki_language_support import run, opcodes

BF16 = ml_dtypes.bfloat16
RNG = np.random.default_rng(0)


def rand(*shape, dtype=np.float32, low=-2.0, high=2.0):
    return RNG.uniform(low, high, shape).astype(dtype)


def elementwise(fn, *arrays, out_dtype=None):
    """Run ``fn`` on loaded tiles of ``arrays``; return the stored result and the run."""

    def kernel(*hbm):
        tiles = [nl.load(t) for t in hbm]
        res = fn(*tiles)
        out = nl.ndarray(res.shape, res.dtype, buffer=nl.shared_hbm)
        nl.store(out, res)
        return out

    return run(kernel, *arrays)


# ------------------------------------------------------------------------------- nki_op
def test_nl_functions_are_isa_operators():
    for fn, name in [(nl.add, "add"), (nl.subtract, "subtract"), (nl.multiply, "multiply"),
                     (nl.maximum, "maximum"), (nl.minimum, "minimum"), (nl.exp, "exp"), (nl.relu, "relu"),
                     (nl.copy, "copy"), (nl.abs, "abs"), (nl.rsqrt, "rsqrt"), (nl.max, "maximum"),
                     (nl.sum, "add"), (nl.bitwise_and, "bitwise_and"), (nl.tanh, "tanh")]:
        assert fn.nki_op == name

    a, b = rand(128, 64), rand(128, 64)

    def kernel(x, y):
        xt, yt = nl.load(x), nl.load(y)
        c = nl.ndarray(xt.shape, nl.float32)
        nisa.tensor_tensor(dst=c, data1=xt, data2=yt, op=nl.maximum)
        d = nl.ndarray(xt.shape, nl.float32)
        nisa.activation(dst=d, op=nl.exp, data=c)
        out = nl.ndarray(xt.shape, nl.float32, buffer=nl.shared_hbm)
        nl.store(out, d)
        return out

    out, _ = run(kernel, a, b)
    np.testing.assert_allclose(out, np.exp(np.maximum(a, b)), rtol=1e-6)


# --------------------------------------------------------------------------- binary ops
@pytest.mark.parametrize("fn, ref", [
    (nl.add, np.add), (nl.subtract, np.subtract), (nl.multiply, np.multiply), (nl.divide, np.divide),
    (nl.maximum, np.maximum), (nl.minimum, np.minimum), (nl.fmod, np.fmod), (nl.mod, np.mod),
])
def test_binary_tile_tile_fp32(fn, ref):
    a, b = rand(128, 96), rand(128, 96, low=0.5, high=3.0)
    out, r = elementwise(fn, a, b)
    np.testing.assert_allclose(out, ref(a, b), rtol=1e-6, atol=1e-6)
    assert opcodes(r).count("tensor_tensor") == 1


def test_binary_bf16_rounds_like_hardware():
    a, b = rand(128, 64, dtype=BF16), rand(128, 64, dtype=BF16)
    out, _ = elementwise(nl.add, a, b)
    assert out.dtype == BF16
    expect = (a.astype(np.float32) + b.astype(np.float32)).astype(BF16)
    assert np.array_equal(out.view(np.uint16), expect.view(np.uint16))


def test_binary_promotes_mixed_dtypes():
    a, b = rand(128, 8, dtype=BF16), rand(128, 8, dtype=np.float16)
    out, _ = elementwise(nl.multiply, a, b)
    assert out.dtype == np.float32  # (float16, bfloat16) -> float32
    np.testing.assert_allclose(out, a.astype(np.float32) * b.astype(np.float32), rtol=1e-6)
    ints = RNG.integers(-5, 5, (128, 8)).astype(np.int32)
    out, _ = elementwise(lambda x, y: nl.add(x, y), ints, rand(128, 8, dtype=np.float16))
    assert out.dtype == np.float16


def test_scalar_operands_lower_to_tensor_scalar():
    a = rand(128, 32)
    out, r = elementwise(lambda x: nl.subtract(3.0, x), a)
    np.testing.assert_allclose(out, 3.0 - a, rtol=1e-6)
    assert opcodes(r).count("tensor_scalar") == 1 and "tensor_tensor" not in opcodes(r)
    out, _ = elementwise(lambda x: nl.power(x, 2), np.abs(a))
    np.testing.assert_allclose(out, np.abs(a) ** 2, rtol=1e-5)
    with pytest.raises(TypeError, match="at least one operand must be a tile"):
        nl.add(1.0, 2.0)


def test_column_operand_broadcasts_along_free_dim():
    a, col = rand(128, 512), rand(128, 1)
    out, r = elementwise(lambda x, c: nl.multiply(x, c), a, col)
    np.testing.assert_allclose(out, a * col, rtol=1e-6)
    assert "tensor_scalar" in opcodes(r)
    out, _ = elementwise(lambda x, c: nl.subtract(c, x), a, col)  # reversed operand order
    np.testing.assert_allclose(out, col - a, rtol=1e-6)

    def kernel(x):
        t = nl.load(x)
        s = nl.sum(t, axis=1)  # shape (P,) acts as a per-partition column too
        res = nl.divide(t, s)
        out = nl.ndarray(res.shape, res.dtype, buffer=nl.shared_hbm)
        nl.store(out, res)
        return out

    out, _ = run(kernel, a)
    s = a.astype(np.float64).sum(axis=1, keepdims=True)
    ds = sum_tolerance(a, 1, keepdims=True)  # |fp32 row sum - s|, any order
    assert (np.abs(s) > 2 * ds).all()
    # a / (s + e) with |e| <= ds differs from a / s by <= |a| ds / (|s| (|s| - ds)), plus the division's rounding
    bound = np.abs(a) * ds / (np.abs(s) * (np.abs(s) - ds)) + 2 * unit_roundoff(np.float32) * np.abs(a / s)
    assert_close_to_reference(out, a / s, bound)


def test_free_and_partition_broadcasting():
    a, row = rand(128, 4, 16), rand(128, 1, 16)
    out, _ = elementwise(lambda x, y: nl.add(x, y), a, row)
    np.testing.assert_allclose(out, a + row, rtol=1e-6)
    a2, top = rand(64, 700), rand(1, 700)
    out, r = elementwise(lambda x, y: nl.add(x, y), a2, top)  # 1 -> 64 partitions via TensorE
    np.testing.assert_allclose(out, a2 + top, rtol=1e-6)
    assert opcodes(r).count("nc_matmul") == 2  # 700 columns in pieces of <= 512


def test_comparisons_logical_and_bitwise():
    a, b = rand(128, 16), rand(128, 16)
    a[:, 0] = b[:, 0]
    for fn, ref in [(nl.equal, np.equal), (nl.not_equal, np.not_equal), (nl.less, np.less),
                    (nl.less_equal, np.less_equal), (nl.greater, np.greater),
                    (nl.greater_equal, np.greater_equal)]:
        out, _ = elementwise(fn, a, b)
        assert out.dtype == np.float32 and np.array_equal(out, ref(a, b).astype(np.float32))
    out, _ = elementwise(lambda x, y: nl.greater(x, y, dtype=nl.uint8), a, b)
    assert out.dtype == np.uint8 and np.array_equal(out, (a > b).astype(np.uint8))
    p, q = (RNG.random((128, 8)) > 0.5).astype(np.float32), (RNG.random((128, 8)) > 0.5).astype(np.float32)
    for fn, ref in [(nl.logical_and, np.logical_and), (nl.logical_or, np.logical_or),
                    (nl.logical_xor, np.logical_xor)]:
        out, _ = elementwise(fn, p, q)
        assert np.array_equal(out, ref(p, q).astype(np.float32))
    out, _ = elementwise(nl.logical_not, p)
    assert np.array_equal(out, 1.0 - p)
    i, j = RNG.integers(0, 1 << 20, (128, 8)).astype(np.int32), RNG.integers(0, 7, (128, 8)).astype(np.int32)
    for fn, ref in [(nl.bitwise_and, np.bitwise_and), (nl.bitwise_or, np.bitwise_or),
                    (nl.bitwise_xor, np.bitwise_xor), (nl.left_shift, np.left_shift),
                    (nl.right_shift, np.right_shift)]:
        out, _ = elementwise(fn, i, j)
        assert np.array_equal(out, ref(i, j)), fn.__name__
    out, _ = elementwise(nl.invert, i)
    assert np.array_equal(out, np.invert(i))


# ---------------------------------------------------------------------------- unary ops
@pytest.mark.parametrize("fn, ref, low, high", [
    (nl.exp, np.exp, -3, 3), (nl.log, np.log, 0.1, 5), (nl.sqrt, np.sqrt, 0.1, 5), (nl.tanh, np.tanh, -3, 3),
    (nl.sigmoid, lambda x: 1 / (1 + np.exp(-x)), -4, 4), (nl.relu, lambda x: np.maximum(x, 0), -2, 2),
    (nl.abs, np.abs, -2, 2), (nl.square, np.square, -2, 2), (nl.negative, np.negative, -2, 2),
    (nl.reciprocal, np.reciprocal, 0.5, 4), (nl.rsqrt, lambda x: 1 / np.sqrt(x), 0.5, 4),
    (nl.sign, np.sign, -2, 2), (nl.arctan, np.arctan, -1.5, 1.5),
    (nl.silu, lambda x: x / (1 + np.exp(-x)), -3, 3),
    (nl.gelu, lambda x: torch.nn.functional.gelu(torch.from_numpy(x)).numpy(), -3, 3),
    (nl.gelu_apprx_tanh, lambda x: torch.nn.functional.gelu(torch.from_numpy(x), approximate="tanh").numpy(),
     -3, 3),
    (nl.erf, lambda x: torch.erf(torch.from_numpy(x)).numpy(), -2, 2),
    (nl.softplus, lambda x: np.log1p(np.exp(x)), -3, 3),
    (nl.mish, lambda x: x * np.tanh(np.log1p(np.exp(x))), -3, 3),
])
def test_unary_fp32(fn, ref, low, high):
    a = rand(128, 64, low=low, high=high)
    out, _ = elementwise(fn, a)
    np.testing.assert_allclose(out, ref(a), rtol=2e-5, atol=2e-6)


def test_unary_engine_lowering():
    a = rand(128, 8, low=0.5, high=2)
    for fn, opcode, engine in [(nl.exp, "activation", "scalar"), (nl.abs, "tensor_scalar", "vector"),
                               (nl.reciprocal, "reciprocal", "vector"), (nl.rsqrt, "tensor_scalar", "gpsimd")]:
        _, r = elementwise(fn, a)
        compute = [i for i in r.instructions if i.opcode not in ("dma_copy",)]
        assert [(i.opcode, i.engine) for i in compute] == [(opcode, engine)], fn.__name__


def test_rsqrt_rejects_psum():
    def kernel(x):
        p = nl.ndarray((128, 8), nl.float32, buffer=nl.psum)
        nisa.tensor_copy(dst=p, src=nl.load(x))
        nl.rsqrt(p)

    with pytest.raises(NkiValidationError, match="GpSimd, which cannot read PSUM"):
        run(kernel, rand(128, 8, low=1, high=2))


def test_trig_is_range_reduced_and_rounding_functions_are_exact():
    a = rand(128, 256, low=-20, high=20)
    for fn, ref in [(nl.sin, np.sin), (nl.cos, np.cos)]:
        out, r = elementwise(fn, a)
        np.testing.assert_allclose(out, ref(a), atol=2e-5)
        assert "activation" in opcodes(r)
    t = rand(128, 64, low=-1.2, high=1.2)
    out, _ = elementwise(nl.tan, t)
    np.testing.assert_allclose(out, np.tan(t), rtol=1e-4, atol=1e-5)
    x = rand(128, 64, low=-50, high=50)
    x[:, :4] = [-3.0, 3.0, -0.0, 2.5]
    for fn, ref in [(nl.floor, np.floor), (nl.ceil, np.ceil), (nl.trunc, np.trunc)]:
        out, _ = elementwise(fn, x)
        assert np.array_equal(out, ref(x)), fn.__name__


# --------------------------------------------------------------------------- reductions
@pytest.mark.parametrize("fn, ref", [(nl.sum, np.sum), (nl.max, np.max), (nl.min, np.min), (nl.prod, np.prod),
                                     (nl.mean, np.mean)])
def test_reductions(fn, ref):
    a = rand(128, 8, 16, low=0.5, high=1.5)
    u = unit_roundoff(np.float32)
    for axis, keep in [(2, False), ([1, 2], True), ((-1,), True)]:
        out, _ = elementwise(lambda x: fn(x, axis=axis, keepdims=keep), a)
        axes = tuple(d % 3 for d in (axis if isinstance(axis, (list, tuple)) else [axis]))
        n = int(np.prod([a.shape[d] for d in axes]))
        expect = ref(a.astype(np.float64), axis=axes, keepdims=keep)
        if fn in (nl.max, nl.min):  # no rounding: exact
            assert np.array_equal(out, expect.astype(np.float32))
        elif fn is nl.sum:
            assert_close_to_reference(out, expect, sum_tolerance(a, axes, keepdims=keep))
        elif fn is nl.mean:  # the sum's bound / n, and the multiply by 1/n
            assert_close_to_reference(out, expect, sum_tolerance(a, axes, keepdims=keep) / n, rtol=2 * u)
        else:  # a product of n positive factors: relative error <= gamma_n in any order
            assert_close_to_reference(out, expect, rtol=accumulation_tolerance(1.0, n, np.float32))


def test_mean_accumulates_in_fp32_and_var_keeps_dims():
    a = rand(128, 512, dtype=BF16)
    out, _ = elementwise(lambda x: nl.mean(x, axis=1), a)
    assert out.dtype == BF16 and out.shape == (128,)
    # fp32 accumulation (any order) then one bf16 rounding: a bf16 accumulation of 512 terms would be
    # off by ~1e-3, far above this bound (~3e-5 |x| plus half a bf16 ulp of the mean)
    expect = a.astype(np.float64).mean(axis=1)
    assert_close_to_reference(out, expect, sum_tolerance(a, 1) / 512, rtol=2 * unit_roundoff(BF16))
    b = rand(128, 64)
    out, _ = elementwise(lambda x: nl.var(x, axis=1), b)
    assert out.shape == (128, 1)
    # two-pass variance: a sum of 64 non-negative squares (relative gamma_64 per order) of exactly
    # rounded differences (3 u), the mean's error entering only at second order
    rtol = accumulation_tolerance(1.0, 64, np.float32) + 8 * unit_roundoff(np.float32)
    assert_close_to_reference(out, b.astype(np.float64).var(axis=1, keepdims=True), rtol=rtol)
    out, _ = elementwise(lambda x: nl.all(x, axis=1), (b > -1.9).astype(np.float32))
    assert np.array_equal(out, (b > -1.9).all(axis=1).astype(np.float32))


def test_reduction_axis_rules():
    a = rand(128, 8, 16)
    with pytest.raises(NkiValidationError, match="partition dim 0 cannot be reduced"):
        elementwise(lambda x: nl.sum(x, axis=0), a)
    # A non-trailing free axis reduces over a permuted access pattern (AWS's average-pool tutorial
    # sums axis=[2, 4]; language decision 13): the values of NumPy's max.
    out, _ = elementwise(lambda x: nl.max(x, axis=1), a)
    np.testing.assert_array_equal(out, a.max(axis=1))


# ---------------------------------------------------------------- activations and norms
def test_softmax_and_rms_norm():
    a = rand(128, 256, low=-4, high=4)
    u = unit_roundoff(np.float32)
    out, r = elementwise(lambda x: nl.softmax(x, axis=1), a)
    ref = torch.softmax(torch.from_numpy(a), dim=1).numpy()
    # e_i / sum(e): the fp32 sum of n positive terms (relative gamma_n per order), the exps (a few ulp:
    # NumPy's and torch's SIMD exp) and the division
    rtol = accumulation_tolerance(1.0, 256, np.float32) + 16 * u
    assert_close_to_reference(out, ref, rtol=rtol)
    assert opcodes(r).count("activation") == 1
    b = rand(128, 4, 32)
    out, _ = elementwise(lambda x: nl.softmax(x, axis=2), b)
    rtol = accumulation_tolerance(1.0, 32, np.float32) + 16 * u
    assert_close_to_reference(out, torch.softmax(torch.from_numpy(b), dim=2).numpy(), rtol=rtol)
    w = rand(128, 256, low=0.5, high=1.5)
    # against float64: the fp32 mean of 256 squares is within gamma_256 (relative), the rsqrt halves
    # that; then a few roundings (square, +eps, rsqrt, two multiplies)
    rtol = accumulation_tolerance(1.0, 256, np.float32) / 4 + 8 * u
    out, _ = elementwise(lambda x, g: nl.rms_norm(x, g, axis=1, n=256), a, w)
    a64 = a.astype(np.float64)
    ref = a64 / np.sqrt((a64 ** 2).mean(axis=1, keepdims=True) + 1e-6) * w
    assert_close_to_reference(out, ref, rtol=rtol)
    row = rand(1, 256, low=0.5, high=1.5)
    out, _ = elementwise(lambda x, g: nl.rms_norm(x, g, axis=1, n=256), a, row)  # weight row broadcast
    assert_close_to_reference(out, a64 / np.sqrt((a64 ** 2).mean(axis=1, keepdims=True) + 1e-6) * row, rtol=rtol)


def test_dropout_where_and_rand():
    a = rand(128, 512, low=1, high=2)
    out, _ = elementwise(lambda x: nl.dropout(x, 0.25), a)
    kept = out != 0
    assert 0.65 < kept.mean() < 0.85 and np.array_equal(out[kept], a[kept])
    cond = (RNG.random((128, 64)) > 0.5).astype(np.float32)
    x, y = rand(128, 64), rand(128, 64)
    out, _ = elementwise(nl.where, cond, x, y)
    assert np.array_equal(out, np.where(cond != 0, x, y))
    out, _ = elementwise(lambda c, v: nl.where(c, v, 0.0), cond, x)
    assert np.array_equal(out, np.where(cond != 0, x, 0.0))

    def rand_kernel():
        seed = nl.full((1, 1), 42, nl.int32)
        nl.random_seed(seed)
        u = nl.rand((128, 256), nl.float32)
        nl.random_seed(seed)
        v = nl.rand((128, 256), nl.bfloat16)
        out = nl.ndarray((2, 128, 256), nl.float32, buffer=nl.shared_hbm)
        nl.store(out[0], u)
        nl.store(out[1], nl.copy(v, nl.float32))
        return out

    out, _ = run(rand_kernel)
    assert (out >= 0).all() and (out < 1).all() and 0.45 < out[0].mean() < 0.55
    assert np.array_equal(out[0].astype(BF16).astype(np.float32) >= 0, np.ones_like(out[0], bool))


def test_broadcast_to_expand_dims_and_gather():
    def kernel(a, col):
        t, c = nl.load(a), nl.load(col)
        assert nl.broadcast_to(t, t.shape) is t
        b = nl.broadcast_to(c, (128, 16))
        e = nl.expand_dims(t, 2)
        assert e.shape == (128, 16, 1)
        out = nl.ndarray((128, 16), nl.float32, buffer=nl.shared_hbm)
        nl.store(out, nl.add(b, t))
        return out

    a, col = rand(128, 16), rand(128, 1)
    out, _ = run(kernel, a, col)
    np.testing.assert_allclose(out, a + col, rtol=1e-6)

    data = rand(128, 4, 8)
    idx = RNG.integers(0, 32, (128, 4, 8)).astype(np.uint32)

    def gather(d, i):
        g = nl.gather_flattened(nl.load(d), nl.load(i))
        out = nl.ndarray(g.shape, g.dtype, buffer=nl.shared_hbm)
        nl.store(out, g)
        return out

    out, _ = run(gather, data, idx)
    expect = np.take_along_axis(data.reshape(128, -1), idx.reshape(128, -1).astype(np.int64), axis=1)
    assert np.array_equal(out, expect.reshape(idx.shape))


def _add_and_scale_by_a_loaded_element(x):
    # AWS's legacy flash_attn_bwd: sink = nl.load(sinks[b, h]) (a 0-d tile), then
    # nl.add(nl.zeros((par_dim(q), 1)), sink): the element is used as a scalar of every partition
    plane = nl.ndarray((128, 1), dtype=x.dtype, buffer=nl.shared_hbm)
    scaled = nl.ndarray((128, 8), dtype=x.dtype, buffer=nl.shared_hbm)
    element = nl.load(x[1, 2])
    nl.store(plane, nl.add(nl.zeros((128, 1), dtype=x.dtype), element))
    nl.store(scaled, nl.multiply(element, nl.full((128, 8), 3.0, dtype=x.dtype)))
    alone = nl.ndarray((1, 3), dtype=x.dtype, buffer=nl.shared_hbm)  # with a scalar, alone: [1, 1] results
    nl.store(alone[0:1, 0:1], nl.add(element, 1.0))
    nl.store(alone[0:1, 1:2], element * element)
    nl.store(alone[0:1, 2:3], nl.exp(element))
    return plane, scaled, alone


def test_a_0d_tile_operand_is_broadcast_to_every_partition():
    x = np.arange(16, dtype=np.float32).reshape(4, 4) - 5.5
    (plane, scaled, alone), _ = run(_add_and_scale_by_a_loaded_element, x)
    np.testing.assert_array_equal(plane, np.full((128, 1), x[1, 2], np.float32))
    np.testing.assert_array_equal(scaled, np.full((128, 8), 3 * x[1, 2], np.float32))
    np.testing.assert_array_equal(alone[0, :2], [x[1, 2] + 1, x[1, 2] * x[1, 2]])
    assert_close_to_reference(alone[0, 2:], np.exp(x[1, 2:3].astype(np.float64)), rtol=2 * unit_roundoff(np.float32))
