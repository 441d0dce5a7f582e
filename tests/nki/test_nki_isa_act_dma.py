"""nki.isa: ScalarE activations, GpSimd generators and gathers, DMA, registers."""

from __future__ import annotations


import ml_dtypes
import numpy as np
import pytest
import torch

import torchneuron.nki.isa as nisa
from torchneuron.nki import context
from torchneuron.nki.dtypes import resolve
from torchneuron.nki.errors import NkiUninitializedReadError, NkiValidationError
from torchneuron.nki.kernel import simulate
from torchneuron.nki.memory import Allocation, Buffer
from torchneuron.nki.tensor import NkiTensor

SBUF, PSUM, HBM = Buffer.sbuf, Buffer.psum, Buffer.shared_hbm
BF16 = ml_dtypes.bfloat16
from torchneuron.testing import accumulation_tolerance, assert_close_to_reference, unit_roundoff
from nki_isa_support import put, rounded as _rounded
from nki_isa_support import fails as _fails, hbm as _hbm, run as _run, tile as _tile


def _put(values, dtype=None, buffer=SBUF, name="t"):
    return put(values, dtype, buffer, name)


def _r(values, dtype=BF16):
    return _rounded(values, dtype)
RNG = np.random.default_rng(2)


# ---------------------------------------------------------------------------- activation
def test_activation_scale_bias_and_functions_against_torch():
    x = RNG.standard_normal((64, 40)).astype(np.float32)
    scale = RNG.uniform(0.5, 1.5, (64, 1)).astype(np.float32)
    bias = RNG.standard_normal((64, 1)).astype(np.float32)
    got = {}

    def kernel():
        data = _put(x, "bfloat16")
        for name, op in (("exp", "exp"), ("gelu", "gelu"), ("silu", "silu"), ("tanh", np.tanh)):
            out = _tile((64, 40))
            h = nisa.activation(dst=out, op=op, data=data, bias=_put(bias), scale=_put(scale))
            got[name] = out.values().copy()
        got["ins"] = h.instruction
        out = _tile((64, 40), "bfloat16")
        nisa.activation(out, "copy", data, scale=2.0)
        got["copy"] = out.values().astype(np.float32)
    _run(kernel)
    pre = torch.from_numpy(_r(x) * scale + bias)
    np.testing.assert_allclose(got["exp"], torch.exp(pre).numpy(), rtol=1e-6)
    np.testing.assert_allclose(got["gelu"], torch.nn.functional.gelu(pre).numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got["silu"], torch.nn.functional.silu(pre).numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got["tanh"], torch.tanh(pre).numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(got["copy"], _r(2 * _r(x)))
    ins = got["ins"]
    assert (ins.opcode, ins.engine, ins.attrs["op"], ins.attrs["bias"], ins.attrs["scale"]) == (
        "activation", "scalar", "tanh", "vector", "vector")
    assert [o.free_elements for o in ins.reads] == [40, 1, 1] and ins.attrs["reduce_res"] is False


def test_activation_scalar_bias_needs_v3():
    def body():
        nisa.activation(dst=_tile((4, 8)), op="exp", data=_put(np.zeros((4, 8), np.float32)), bias=1.0)
    _run(body)
    _fails(body, "bias must be a (4, 1) vector on NeuronCore-v2", target="trn1")

    def reciprocal_bias():
        nisa.activation(dst=_tile((4, 8)), op="reciprocal", data=_put(np.ones((4, 8), np.float32)),
                        bias=_put(np.ones((4, 1), np.float32)))
    _fails(reciprocal_bias, "does not support a bias on NeuronCore-v2", target="trn1")


def test_activation_reduction_registers_persist_across_instructions():
    x = RNG.standard_normal((32, 16)).astype(np.float32)
    got = {}

    def kernel():
        data, res = _put(x), _tile((32, 1))
        out = _tile((32, 16))
        nisa.activation(dst=out, op="exp", data=data, reduce_op=np.add, reduce_cmd=nisa.reduce_cmd.reset_reduce)
        nisa.activation(dst=out, op="square", data=data, reduce_op=np.add, reduce_cmd=nisa.reduce_cmd.reduce)
        h = nisa.activation(dst=out, op="copy", data=data, reduce_res=res)  # idle: read the registers out
        got["acc"], got["ins"] = res.values().copy(), h.instruction
        nisa.activation_reduce(dst=out, op="abs", data=data, reduce_op=np.add, reduce_res=res)
        got["abs"] = res.values().copy()
        nisa.activation(dst=out, op="exp", data=data, reduce_cmd=nisa.reduce_cmd.reset)
        nisa.activation(dst=out, op="exp", data=data, reduce_res=res)
        got["reset"] = res.values().copy()
    _run(kernel)
    expected = np.exp(x).sum(axis=1, keepdims=True) + (x * x).sum(axis=1, keepdims=True)
    # sums of non-negative terms in the registers' order: relative gamma_n per order (+ the exps' ulps)
    u = unit_roundoff(np.float32)
    assert_close_to_reference(got["acc"], expected, rtol=accumulation_tolerance(1.0, 32, np.float32) + 8 * u)
    assert_close_to_reference(got["abs"], np.abs(x).astype(np.float64).sum(axis=1, keepdims=True),
                              rtol=accumulation_tolerance(1.0, 16, np.float32))
    np.testing.assert_array_equal(got["reset"], np.zeros((32, 1)))
    assert got["ins"].attrs["reduce_res"] is True and got["ins"].attrs["reduce_cmd"] == "idle"


def test_activation_reduction_rules():
    def max_reduce():
        nisa.activation(dst=_tile((4, 8)), op="exp", data=_put(np.zeros((4, 8), np.float32)), reduce_op=np.max,
                        reduce_cmd=nisa.reduce_cmd.reset_reduce)
    _fails(max_reduce, "reduce_op maximum is not supported here", "add")

    def missing_op():
        nisa.activation(dst=_tile((4, 8)), op="exp", data=_put(np.zeros((4, 8), np.float32)),
                        reduce_cmd=nisa.reduce_cmd.reduce)
    _fails(missing_op, "reduce_cmd=reduce accumulates the activation: pass reduce_op=nl.add")

    def max_reduce_v3():
        res = _tile((4, 1))
        nisa.activation_reduce(dst=_tile((4, 8)), op="copy", data=_put(np.arange(32, dtype=np.float32)
                               .reshape(4, 8)), reduce_op=np.max, reduce_res=res)
        assert res.values()[:, 0].tolist() == [7, 15, 23, 31]
    _run(max_reduce_v3)
    _fails(max_reduce_v3, "reduce_op maximum is not supported", "add on NeuronCore-v2", target="trn1")

    def never_reset():
        nisa.activation(dst=_tile((4, 8)), op="exp", data=_put(np.zeros((4, 8), np.float32)),
                        reduce_res=_tile((4, 1)))
    _fails(never_reset, "ScalarE accumulator registers", "no instruction reset", error=NkiUninitializedReadError)


def test_activation_outside_the_valid_range_warns():
    def kernel():
        out = _tile((2, 4))
        nisa.activation(dst=out, op="sin", data=_put(np.array([[0.5, 9.0, -1.0, 2.0]] * 2, np.float32)))
        nisa.activation(dst=out, op="log", data=_put(np.array([[1.0, 2.0, 3.0, 0.0]] * 2, np.float32)))
        nisa.activation(dst=out, op="exp", data=_put(np.full((2, 4), 100.0, np.float32)))
    with pytest.warns(nisa.NkiActivationRangeWarning) as record:
        _run(kernel)
    messages = [str(w.message) for w in record]
    assert len(messages) == 2
    assert "activation function sin is valid only on [-3.14159, 3.14159]" in messages[0]
    assert "input in [-1, 9]" in messages[0] and "nl.sin" in messages[0]
    assert "log is valid only on [5.42101e-20, 1.84467e+19]" in messages[1] and "[0, 3]" in messages[1]
    assert "test_nki_isa_act_dma.py:" in messages[0]


def test_activation_layout_rules():
    def mismatch():
        nisa.activation(dst=_tile((4, 6)), op="exp", data=_put(np.zeros((4, 8), np.float32)))
    _fails(mismatch, "dst has 6 elements per partition", "data has 8")

    def bad_scale():
        nisa.activation(dst=_tile((4, 8)), op="exp", data=_put(np.zeros((4, 8), np.float32)),
                        scale=_put(np.ones((2, 1), np.float32)))
    _fails(bad_scale, "scale must be a scalar or a (4, 1) tile")

    with pytest.raises(TypeError, match="not an activation function"):
        _run(lambda: nisa.activation(dst=_tile((4, 8)), op=np.add, data=_put(np.zeros((4, 8), np.float32))))


def test_activate2_is_v4_only_and_restricts_op_pairs():
    x = RNG.standard_normal((16, 8)).astype(np.float32)
    got = {}

    def kernel():
        out, res = _tile((16, 8)), _tile((16, 1))
        nisa.activate2(dst=out, op="prelu", data=_put(x), imm0=2.0, imm1=0.5, op0=np.multiply, op1=np.add,
                       relu_param=0.1, reduce_op="abs_max", reduce_res=res,
                       reduce_cmd=nisa.reduce_cmd.reset_reduce)
        got["y"], got["m"] = out.values().copy(), res.values().copy()
    _run(kernel, target="trn3")
    pre = x * 2 + 0.5
    y = np.where(pre > 0, pre, 0.1 * pre)
    np.testing.assert_allclose(got["y"], y, rtol=1e-6)
    np.testing.assert_allclose(got["m"][:, 0], y[np.arange(16), np.abs(y).argmax(axis=1)], rtol=1e-6)
    _fails(kernel, "activate2 is available only on NeuronCore-v4")

    def bad_pair():
        nisa.activate2(dst=_tile((16, 8)), op="exp", data=_put(x), imm0=1.0, imm1=1.0, op0=np.add, op1=np.add)
    _fails(bad_pair, "(op0, op1) = (add, add) is not supported", target="trn3")


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


# ---------------------------------------------------------------------------- DMA
def test_dma_copy_round_trip_cast_and_reshape():
    x = RNG.standard_normal((128, 64)).astype(np.float32)
    got = {}

    def kernel():
        src = _hbm(x)
        tile = _tile((128, 64), "bfloat16")
        h = nisa.dma_copy(dst=tile, src=src)
        back = NkiTensor(Allocation.create(HBM, (64, 128), resolve("float32"), "out"))
        nisa.dma_copy(dst=back, src=tile)  # same element count, different shape: row-major
        hbm2hbm = NkiTensor(Allocation.create(HBM, (128, 64), resolve("float32"), "copy"))
        nisa.dma_copy(dst=hbm2hbm, src=src)
        got.update(tile=tile.values().astype(np.float32), back=back.values().copy(), h2h=hbm2hbm.values().copy(),
                   ins=h.instruction)
    _run(kernel)
    np.testing.assert_array_equal(got["tile"], _r(x))
    np.testing.assert_array_equal(got["back"], _r(x).reshape(64, 128))
    np.testing.assert_array_equal(got["h2h"], x)
    ins = got["ins"]
    assert (ins.opcode, ins.engine, ins.attrs["dge_mode"], ins.attrs["cast"]) == ("dma_copy", "dma", "unknown", True)
    assert [o.buffer for o in ins.reads] == ["shared_hbm"] and [o.buffer for o in ins.writes] == ["sbuf"]


def test_dma_copy_rules():
    def count_mismatch():
        nisa.dma_copy(dst=_tile((4, 8)), src=_hbm(np.zeros((4, 9), np.float32)))
    _fails(count_mismatch, "src has 36 elements", "dst 32", "element counts must match")

    def from_psum():
        nisa.dma_copy(dst=_hbm(np.zeros((4, 8), np.float32)), src=_put(np.ones((4, 8), np.float32), buffer=PSUM))
    _fails(from_psum, "since NKI 0.3.0 DMA cannot read PSUM", "nisa.tensor_copy")

    def hwdge_cast():
        nisa.dma_copy(dst=_tile((4, 8), "bfloat16"), src=_hbm(np.zeros((4, 8), np.float32)),
                      dge_mode=nisa.dge_mode.hwdge)
    _fails(hwdge_cast, "with dge_mode=hwdge the DMA moves raw bytes", "float32", "bfloat16", ".view()")

    def hwdge_v2():
        nisa.dma_copy(dst=_tile((4, 8)), src=_hbm(np.zeros((4, 8), np.float32)), dge_mode=nisa.dge_mode.hwdge,
                      engine=nisa.engine.scalar)
    _run(hwdge_v2)
    _fails(hwdge_v2, "dge_mode=hwdge needs NeuronCore-v3", target="trn1")

    def trigger_without_hwdge():
        nisa.dma_copy(dst=_tile((4, 8)), src=_hbm(np.zeros((4, 8), np.float32)), engine=nisa.engine.sync)
    _fails(trigger_without_hwdge, "engine=sync is valid only with dge_mode=nisa.dge_mode.hwdge")

    def priority_v3():
        nisa.dma_copy(dst=_tile((4, 8)), src=_hbm(np.zeros((4, 8), np.float32)), priority=1)
    _fails(priority_v3, "priority needs NeuronCore-v4")
    _run(priority_v3, target="trn3")


def test_dma_copy_reads_of_unwritten_memory_follow_the_policy():
    def body():
        nisa.dma_copy(dst=_hbm(np.zeros((4, 8), np.float32)), src=_tile((4, 8), name="never_written"))
    _fails(body, "reads 32 of 32 elements of 'never_written'", error=NkiUninitializedReadError)


def test_dma_copy_of_a_clipped_legacy_view_is_out_of_bounds_unless_its_mask_keeps_it_inside():
    import torchneuron.nki.language as nl

    x = np.arange(100 * 8, dtype=np.float32).reshape(100, 8)
    got = {}

    def unmasked():
        i_p = nl.arange(64)[:, None]
        view = _hbm(x)[64 + i_p, :]  # rows 64..127 of a 100-row tensor: 36 exist
        assert view.is_partial and view.shape == (64, 8)
        nisa.dma_copy(dst=_tile((64, 8)), src=view)
    _fails(unmasked, "dma_copy: src 'in' is indexed out of bounds",
           "dimension 0 spans 64 elements but only 36 lie inside the tensor")

    def masked():
        i_p, i_f = nl.mgrid[0:64, 0:8]
        tile = _put(np.full((64, 8), -1.0, np.float32))
        nisa.dma_copy(dst=tile[i_p, i_f], src=_hbm(x)[64 + i_p, i_f], mask=(64 + i_p < 100))
        got["c"] = tile.values().copy()
    _run(masked)
    np.testing.assert_array_equal(got["c"][:36], x[64:])
    np.testing.assert_array_equal(got["c"][36:], -1.0)


def test_dma_transpose_and_dma_compute():
    x = RNG.standard_normal((16, 96)).astype(np.float32).astype(BF16)
    y = RNG.standard_normal((2, 3, 4)).astype(np.float32)
    got = {}

    def kernel():
        t = _tile((96, 16), "bfloat16")
        h = nisa.dma_transpose(dst=t, src=_hbm(x), dge_mode=nisa.dge_mode.hwdge)
        t3 = _tile((4, 3, 2))
        nisa.dma_transpose(t3, _hbm(y))
        total = _tile((2, 12))
        nisa.dma_compute(dst=total, srcs=[_hbm(y), _put(y.reshape(2, 12)), _hbm(y)], reduce_op=np.add)
        got.update(t=t.values().copy(), t3=t3.values().copy(), total=total.values().copy(), ins=h.instruction)
    _run(kernel)
    np.testing.assert_array_equal(got["t"].view(np.uint16), x.T.view(np.uint16))
    np.testing.assert_array_equal(got["t3"], y.transpose(2, 1, 0))
    np.testing.assert_allclose(got["total"], 3 * y.reshape(2, 12), rtol=1e-6)
    assert got["ins"].attrs["transpose"] is True and got["ins"].engine == "dma"

    def wrong_shape():
        nisa.dma_transpose(dst=_tile((96, 16, 1), "bfloat16"), src=_hbm(x))
    _fails(wrong_shape, "must equal the transposed src shape [96, 16] exactly")

    def hwdge_rows():
        nisa.dma_transpose(dst=_tile((96, 8), "bfloat16"), src=_hbm(x[:8]), dge_mode=nisa.dge_mode.hwdge)
    _fails(hwdge_rows, "2-D hwdge transpose needs src.shape[0] == 16")

    def scaled():
        nisa.dma_compute(dst=_tile((2, 12)), srcs=[_hbm(y)], reduce_op=np.add, scales=[2.0])
    _fails(scaled, "scales must be None or one 1.0 per source")

    with pytest.raises(TypeError, match="reordered the parameters"):
        _run(lambda: nisa.dma_compute(_tile((2, 12)), [_hbm(y)], [1.0], np.add))


# ---------------------------------------------------------------------------- registers, multi-core, stubs
def test_registers_move_values_between_tiles():
    got = {}

    def kernel():
        reg, other = nisa.register_alloc(), nisa.register_alloc(7)
        nisa.register_load(reg, _put(np.array([[42]], np.int32)))
        nisa.register_move(other, reg)
        out = _tile((1, 1), "int32")
        nisa.register_store(out, other)
        got["v"], got["reg"] = int(out.values()[0, 0]), other
    _run(kernel)
    assert got["v"] == 42 and got["reg"].value == 42
    with pytest.raises(TypeError, match="known only on the device"):
        bool(got["reg"])


def test_unsimulated_instructions_say_so():
    def barrier():
        nisa.core_barrier(data=_hbm(np.zeros((2, 2), np.float32)), cores=(0, 1))
    _fails(barrier, "launch the kernel as kernel[2]")
    _fails(barrier, "needs NeuronCore-v3", target="trn1")

    def mx():
        nisa.nc_matmul_mx(None, None, None, None, None)
    _fails(mx, "nc_matmul_mx: is not simulated", "packed MX dtypes")


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
