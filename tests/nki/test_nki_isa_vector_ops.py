"""nki.isa VectorE / GpSimd element-wise instructions (torchneuron/nki/isa/vector_ops.py): tensor_tensor,
tensor_scalar, tensor_reduce, tensor_partition_reduce, tensor_copy (plain and predicated) and memset."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import torchneuron.nki.isa as nisa
from torchneuron.nki.memory import Buffer
from torchneuron.testing import assert_close_to_reference, sum_tolerance, unit_roundoff

from nki_isa_support import rounded as _r
from nki_isa_support import fails as _fails, put as _put, run as _run, tile as _tile

SBUF, PSUM, HBM = Buffer.sbuf, Buffer.psum, Buffer.shared_hbm
BF16 = ml_dtypes.bfloat16



RNG = np.random.default_rng(1)


# ---------------------------------------------------------------------------- tensor_tensor
@pytest.mark.parametrize("op, ref", [(np.add, np.add), (np.subtract, np.subtract), (np.multiply, np.multiply),
                                     (np.maximum, np.maximum), ("divide", np.divide)])
def test_tensor_tensor_bf16_matches_fp32_math_rounded(op, ref):
    a = RNG.standard_normal((64, 48)).astype(np.float32)
    b = RNG.standard_normal((64, 48)).astype(np.float32) + 3
    got = {}

    def kernel():
        out = _tile((64, 48), "bfloat16")
        h = nisa.tensor_tensor(dst=out, data1=_put(a, "bfloat16"), data2=_put(b, "bfloat16"), op=op)
        got["c"], got["ins"] = out.values().astype(np.float32), h.instruction
    _run(kernel)
    np.testing.assert_array_equal(got["c"], _r(ref(_r(a), _r(b))))
    ins = got["ins"]
    assert (ins.opcode, ins.engine, ins.attrs["engine_requested"]) == ("tensor_tensor", "vector", "unknown")
    assert ins.attrs["op"] == (op if isinstance(op, str) else op.__name__)
    assert [o.buffer for o in ins.reads] == ["sbuf", "sbuf"] and ins.writes[0].dtype == "bfloat16"


def test_tensor_tensor_comparisons_give_one_or_zero():
    a, b = np.array([[1.0, 2.0, 3.0, 4.0]], np.float32), np.array([[2.0, 2.0, 2.0, 2.0]], np.float32)
    got = {}

    def kernel():
        out = _tile((1, 4))
        nisa.tensor_tensor(out, _put(a), _put(b), "greater_equal")
        got["c"] = out.values().copy()
    _run(kernel)
    np.testing.assert_array_equal(got["c"], [[0, 1, 1, 1]])


def test_int32_tensor_tensor_runs_exactly_on_gpsimd():
    a = np.array([[2**30 + 1, -7, 7, 5]], np.int32)
    b = np.array([[3, 2, -2, 0]], np.int32)
    got = {}

    def kernel():
        out = _tile((1, 4), "int32")
        h = nisa.tensor_tensor(out, _put(a), _put(b), np.add)
        q = _tile((1, 4), "int32")
        nisa.tensor_tensor(q, _put(a), _put(b), "divide")
        v = _tile((1, 4), "int32")
        h3 = nisa.tensor_tensor(v, _put(a), _put(b), np.add, engine=nisa.engine.vector)
        got.update(sum=out.values().copy(), q=q.values().copy(), v=v.values().copy(),
                   engines=(h.instruction.engine, h3.instruction.engine))
    _run(kernel)
    np.testing.assert_array_equal(got["sum"], (a.astype(np.int64) + b).astype(np.int32))  # exact 2**30 + 4
    np.testing.assert_array_equal(got["q"], [[2**30 // 3, -3, -3, 0]])  # truncation toward zero
    assert got["engines"] == ("gpsimd", "vector")
    assert got["v"][0, 0] == np.float32(2**30 + 4)  # VectorE casts through fp32


def test_bitvec_tensor_tensor_acts_on_bits():
    a = np.array([[0b1100, 0xFF, -1, 7]], np.int32)
    b = np.array([[0b1010, 0x0F, 1, 2]], np.int32)
    got = {}

    def kernel():
        out = _tile((1, 4), "int32")
        nisa.tensor_tensor(out, _put(a), _put(b), np.bitwise_xor)
        got["x"] = out.values().copy()
        sh = _tile((1, 4), "int32")
        nisa.tensor_tensor(sh, _put(a), _put(b), "right_shift")
        got["s"] = sh.values().copy()
    _run(kernel)
    np.testing.assert_array_equal(got["x"], a ^ b)
    np.testing.assert_array_equal(got["s"], (a.view(np.uint32) >> b.view(np.uint32)).view(np.int32))  # logical

    def floats():
        nisa.tensor_tensor(_tile((1, 4)), _put(np.ones((1, 4), np.float32)), _put(np.ones((1, 4), np.float32)),
                           np.bitwise_and)
    _fails(floats, "bit-vector op bitwise_and acts on integer bit patterns", "float32")


def test_tensor_tensor_rules():
    def both_psum():
        a, b = _put(np.ones((4, 8), np.float32), buffer=PSUM), _put(np.ones((4, 8), np.float32), buffer=PSUM)
        nisa.tensor_tensor(dst=_tile((4, 8)), data1=a, data2=b, op=np.add)
    _fails(both_psum, "data1 and data2 are both in PSUM", "at most one")

    def power_psum():
        a, b = _put(np.ones((4, 8), np.float32), buffer=PSUM), _put(np.ones((4, 8), np.float32))
        nisa.tensor_tensor(dst=_tile((4, 8)), data1=a, data2=b, op="power")
    _fails(power_psum, "is in PSUM, which GpSimd cannot access")

    def shapes():
        nisa.tensor_tensor(_tile((4, 8)), _put(np.ones((4, 8), np.float32)), _put(np.ones((4, 4), np.float32)),
                           np.add)
    _fails(shapes, "data2 has 4 elements per partition", "data1 has 8")

    def abs_max():
        nisa.tensor_tensor(_tile((4, 8)), _put(np.ones((4, 8), np.float32)), _put(np.ones((4, 8), np.float32)),
                           "abs_max")
    _fails(abs_max, "abs_max needs NeuronCore-v4")
    _run(abs_max, target="trn3")

    def on_scalar():
        nisa.tensor_tensor(_tile((4, 8)), _put(np.ones((4, 8), np.float32)), _put(np.ones((4, 8), np.float32)),
                           np.add, engine=nisa.engine.scalar)
    _fails(on_scalar, "tensor_tensor runs on VectorE, GpSimd, not scalar")


def test_power_runs_on_gpsimd():
    got = {}

    def kernel():
        out = _tile((2, 3))
        h = nisa.tensor_tensor(out, _put(np.full((2, 3), 2.0, np.float32)), _put(np.full((2, 3), 3.0, np.float32)),
                               "power")
        got["c"], got["e"] = out.values().copy(), h.instruction.engine
    _run(kernel)
    np.testing.assert_array_equal(got["c"], np.full((2, 3), 8.0))
    assert got["e"] == "gpsimd"


# ---------------------------------------------------------------------------- tensor_scalar
def test_tensor_scalar_two_ops_vectors_and_reverse():
    x = RNG.standard_normal((32, 16)).astype(np.float32)
    v = RNG.standard_normal((32, 1)).astype(np.float32)
    got = {}

    def kernel():
        out = _tile((32, 16))
        h = nisa.tensor_scalar(dst=out, data=_put(x), op0=np.subtract, operand0=_put(v), reverse0=True,
                               op1=np.multiply, operand1=2.0)
        got["a"], got["ins"] = out.values().copy(), h.instruction
        out2 = _tile((32, 16))
        nisa.tensor_scalar(out2, _put(x), "abs", None, op1=np.subtract, operand1=1.0, reverse1=True)
        got["b"] = out2.values().copy()
    _run(kernel)
    np.testing.assert_allclose(got["a"], (v - x) * 2.0, rtol=1e-6)
    np.testing.assert_allclose(got["b"], 1.0 - np.abs(x), rtol=1e-6)
    ins = got["ins"]
    assert (ins.engine, ins.attrs["op0"], ins.attrs["op1"], ins.attrs["reverse0"]) == ("vector", "subtract",
                                                                                    "multiply", True)
    assert [o.free_elements for o in ins.reads] == [16, 1]  # data first, then the (P, 1) operand


def test_tensor_scalar_engine_rules():
    def pair(op0, op1, engine):
        def body():
            nisa.tensor_scalar(_tile((4, 8)), _put(np.ones((4, 8), np.float32)), op0, 2.0, op1=op1,
                               operand1=None if op1 is None else 1.0, engine=engine)
        return body
    _run(pair(np.multiply, np.add, nisa.engine.scalar))
    _run(pair(np.add, None, nisa.engine.scalar))
    _fails(pair(np.subtract, None, nisa.engine.scalar), "ScalarE on NeuronCore-v3 supports only the op pairs",
           "(subtract, None)")
    _fails(pair(np.add, np.multiply, nisa.engine.scalar), "NeuronCore-v2 supports only", target="trn1")
    _run(pair(np.subtract, np.maximum, nisa.engine.scalar), target="trn3")
    _fails(pair(np.add, None, nisa.engine.gpsimd), "GpSimd runs tensor_scalar only for rsqrt")

    def bitvec_on_scalar():
        nisa.tensor_scalar(_tile((4, 8), "int32"), _put(np.ones((4, 8), np.int32)), np.bitwise_and, 1,
                           engine=nisa.engine.scalar)
    _fails(bitvec_on_scalar, "bit-vector ops (bitwise_and) run on VectorE only")

    def mixed():
        nisa.tensor_scalar(_tile((4, 8), "int32"), _put(np.ones((4, 8), np.int32)), np.bitwise_and, 1,
                           op1=np.add, operand1=1)
    _fails(mixed, "mix bit-vector and arithmetic")

    def dangling_operand1():
        nisa.tensor_scalar(_tile((4, 8)), _put(np.ones((4, 8), np.float32)), np.add, 1.0, operand1=2.0)
    _fails(dangling_operand1, "operand1 is given but op1 is None")

    def bad_vector():
        nisa.tensor_scalar(_tile((4, 8)), _put(np.ones((4, 8), np.float32)), np.add, _put(np.ones((4, 2),
                           np.float32)))
    _fails(bad_vector, "operand0 must be a scalar or a (4, 1) tile", "[4, 2]")


def test_tensor_scalar_rsqrt_defaults_to_gpsimd():
    got = {}

    def kernel():
        out = _tile((2, 4))
        h = nisa.tensor_scalar(out, _put(np.full((2, 4), 4.0, np.float32)), "rsqrt", 0)
        got["c"], got["e"] = out.values().copy(), h.instruction.engine
    _run(kernel)
    np.testing.assert_allclose(got["c"], np.full((2, 4), 0.5))
    assert got["e"] == "gpsimd"


def test_tensor_scalar_bitvec_shift_on_integers():
    got = {}

    def kernel():
        out = _tile((1, 4), "uint32")
        nisa.tensor_scalar(out, _put(np.array([[0xF0, 0x100, 3, 0xFFFFFFFF]], np.uint32)), "right_shift", 4)
        got["c"] = out.values().copy()
    _run(kernel)
    np.testing.assert_array_equal(got["c"], [[0xF, 0x10, 0, 0x0FFFFFFF]])


# ---------------------------------------------------------------------------- tensor_reduce
def test_tensor_reduce_axes_negate_and_rounding():
    x = RNG.standard_normal((16, 4, 6, 8)).astype(np.float32)
    got = {}

    def kernel():
        data = _put(x, "bfloat16")
        last = _tile((16, 4, 6), "bfloat16")
        nisa.tensor_reduce(dst=last, op=np.add, data=data, axis=3)
        two = _tile((16, 4))
        h = nisa.tensor_reduce(dst=two, op=np.max, data=data, axis=(2, 3), negate=True)
        allf = _tile((16, 1))
        nisa.tensor_reduce(dst=allf, op="multiply", data=_put(np.full((16, 4, 6, 8), 1.01, np.float32)),
                           axis=[1, 2, 3])
        got.update(last=last.values().astype(np.float32), two=two.values().copy(), all=allf.values().copy(),
                   ins=h.instruction)
    _run(kernel)
    xr = _r(x)
    # fp32 sum of 8 terms (any order) rounded once to bf16; the reference is exact
    assert_close_to_reference(got["last"], xr.astype(np.float64).sum(axis=3), sum_tolerance(xr, 3),
                              rtol=unit_roundoff(BF16) * (1 + 1e-3))
    np.testing.assert_array_equal(got["two"], -xr.max(axis=(2, 3)))
    np.testing.assert_allclose(got["all"], np.full((16, 1), np.float32(1.01) ** 192), rtol=1e-4)
    assert got["ins"].attrs["op"] == "maximum" and got["ins"].attrs["negate"] is True


@pytest.mark.parametrize("axis, needles", [(0, ("includes axis 0, the partition axis",
                                                "nisa.tensor_partition_reduce")),
                                           ((1, 2), ("must be the trailing contiguous free axes",)),
                                           ((1, 3), ("must be the trailing contiguous",))])
def test_tensor_reduce_axis_rules(axis, needles):
    def body():
        nisa.tensor_reduce(dst=_tile((4, 1)), op=np.add, data=_put(np.ones((4, 2, 3, 5), np.float32)), axis=axis)
    _fails(body, *needles)


def test_tensor_reduce_dst_size_and_op_rules():
    def wrong_dst():
        nisa.tensor_reduce(dst=_tile((4, 3)), op=np.add, data=_put(np.ones((4, 2, 3), np.float32)), axis=2)
    _fails(wrong_dst, "dst has 3 elements per partition", "leaves 2")

    def not_reducible():
        nisa.tensor_reduce(dst=_tile((4, 1)), op=np.divide, data=_put(np.ones((4, 8), np.float32)), axis=1)
    _fails(not_reducible, "divide is not a legal reduction op")

    def bitvec_negate():
        nisa.tensor_reduce(dst=_tile((4, 1), "int32"), op=np.bitwise_or, data=_put(np.ones((4, 8), np.int32)),
                           axis=1, negate=True)
    _fails(bitvec_negate, "negate=True applies to arithmetic reductions only")


def test_tensor_partition_reduce():
    x = RNG.standard_normal((64, 5, 3)).astype(np.float32)
    got = {}

    def kernel():
        data = _put(x)
        for op in ("add", "average", np.max):
            out = _tile((1, 5, 3))
            h = nisa.tensor_partition_reduce(dst=out, op=op, data=data)
            got[h.instruction.attrs["op"]] = out.values().copy()
            assert h.instruction.engine == "gpsimd"
    _run(kernel)
    x64, tol = x.astype(np.float64), sum_tolerance(x, 0, keepdims=True)
    assert_close_to_reference(got["add"], x64.sum(axis=0, keepdims=True), tol)
    assert_close_to_reference(got["average"], x64.mean(axis=0, keepdims=True), tol / 64,
                              rtol=2 * unit_roundoff(np.float32))
    np.testing.assert_array_equal(got["maximum"], x.max(axis=0, keepdims=True))


# ---------------------------------------------------------------------------- copies and memset
def test_tensor_copy_is_bit_exact_for_equal_dtypes_and_casts_through_fp32_otherwise():
    payload = np.array([[0x7FC01234, 0x3F800000, 0xFF800000, 1]], np.uint32).view(np.float32)
    x = RNG.standard_normal((8, 32)).astype(np.float32)
    got = {}

    def kernel():
        same = _tile((1, 4))
        nisa.tensor_copy(dst=same, src=_put(payload))
        down = _tile((8, 32), "bfloat16")
        h = nisa.tensor_copy(dst=down, src=_put(x), engine=nisa.engine.scalar)
        to_int = _tile((8, 32), "int16")
        nisa.tensor_copy(dst=to_int, src=_put(x * 100), engine=nisa.engine.gpsimd)
        got.update(same=same.values().copy(), down=down.values().astype(np.float32),
                   int=to_int.values().copy(), ins=h.instruction)
    _run(kernel)
    np.testing.assert_array_equal(got["same"].view(np.uint32), payload.view(np.uint32))  # NaN payload kept
    np.testing.assert_array_equal(got["down"], _r(x))
    np.testing.assert_array_equal(got["int"], np.trunc(x * 100).astype(np.int16))  # toward zero
    assert (got["ins"].engine, got["ins"].attrs["cast"]) == ("scalar", True)


def test_tensor_copy_rules():
    def scalar_v2():
        nisa.tensor_copy(dst=_tile((4, 8)), src=_put(np.ones((4, 8), np.float32)), engine=nisa.engine.scalar)
    _fails(scalar_v2, "not supported on ScalarE on NeuronCore-v2", "activation(op=nl.copy)", target="trn1")

    def gpsimd_psum():
        nisa.tensor_copy(dst=_tile((4, 8)), src=_put(np.ones((4, 8), np.float32), buffer=PSUM),
                         engine=nisa.engine.gpsimd)
    _fails(gpsimd_psum, "PSUM, which GpSimd cannot access")

    def partitions():
        nisa.tensor_copy(dst=_tile((8, 4)), src=_put(np.ones((4, 8), np.float32)))
    _fails(partitions, "dst spans 8 partitions but src spans 4")

    def reshaped():  # same partitions and elements per partition: allowed
        nisa.tensor_copy(dst=_tile((4, 2, 4)), src=_put(np.ones((4, 8), np.float32)))
    _run(reshaped)


def test_tensor_copy_predicated():
    x = RNG.standard_normal((8, 16)).astype(np.float32)
    pred = (RNG.random((8, 16)) < 0.5).astype(np.uint8)
    got = {}

    def kernel():
        dst = _put(np.zeros((8, 16), np.float32), name="dst")
        nisa.tensor_copy_predicated(dst=dst, src=_put(x), predicate=_put(pred))
        got["a"] = dst.values().copy()
        nisa.tensor_copy_predicated(dst, 7.0, _put(pred), reverse_pred=True)
        got["b"] = dst.values().copy()
    _run(kernel)
    np.testing.assert_array_equal(got["a"], np.where(pred, x, 0))
    np.testing.assert_array_equal(got["b"], np.where(pred, x, 7.0))

    def float_predicate():
        nisa.tensor_copy_predicated(_tile((8, 16)), _put(x), _put(pred.astype(np.float32)))
    _fails(float_predicate, "predicate dtype is float32", "uint8, uint16 or uint32")


def test_memset_value_type_must_match_dst_dtype():
    got = {}

    def kernel():
        a, b = _tile((4, 8), "int32"), _tile((4, 8), "bfloat16")
        nisa.memset(dst=a, value=3)
        h = nisa.memset(dst=b, value=0, engine=nisa.engine.gpsimd)
        got.update(a=a.values().copy(), b=b.values().astype(np.float32), ins=h.instruction)
    _run(kernel)
    np.testing.assert_array_equal(got["a"], np.full((4, 8), 3))
    np.testing.assert_array_equal(got["b"], np.zeros((4, 8)))
    assert (got["ins"].engine, got["ins"].attrs["value"]) == ("gpsimd", 0.0)

    def float_into_int():
        nisa.memset(dst=_tile((4, 8), "int32"), value=2.0)
    _fails(float_into_int, "value 2.0 is a float but dst 't' is int32", "since NKI 0.3.0", "value=2")

    def out_of_range():
        nisa.memset(dst=_tile((4, 8), "uint8"), value=300)
    _fails(out_of_range, "300 does not fit dst dtype uint8")

    def on_tensor_engine():
        nisa.memset(dst=_tile((4, 8)), value=1.0, engine=nisa.engine.tensor)
    _fails(on_tensor_engine, "memset runs on VectorE, GpSimd")
