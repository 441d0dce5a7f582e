"""nki.isa DMA instructions (torchneuron/nki/isa/dma_ops.py): dma_copy (casts, reshapes, rules, unwritten
memory, clipped legacy views), dma_transpose and dma_compute."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import torchneuron.nki.isa as nisa
from torchneuron.nki.dtypes import resolve
from torchneuron.nki.errors import NkiUninitializedReadError
from torchneuron.nki.memory import Allocation, Buffer
from torchneuron.nki.tensor import NkiTensor

from nki_isa_support import put as _put, rounded as _r
from nki_isa_support import fails as _fails, hbm as _hbm, run as _run, tile as _tile

SBUF, PSUM, HBM = Buffer.sbuf, Buffer.psum, Buffer.shared_hbm
BF16 = ml_dtypes.bfloat16




RNG = np.random.default_rng(2)


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
