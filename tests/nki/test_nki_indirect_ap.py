"""Indirect (dynamic) access patterns of current NKI (torchneuron/nki/dynamic_ap.py): ``.ap(vector_offset=...)``
gathers and scatters rows, ``.ap(scalar_offset=...)`` moves a whole access by a runtime value, ``select`` /
``vector_select`` / ``nl.ds`` with a runtime start build the same views, ``dma_compute`` adds through them
(scatter-add, gather-add), and every index is bounds-checked when the instruction runs (``oob_mode``).

The expected values follow NKI's access-pattern guide (aws-neuron-sdk ``nki/deep-dives/nki-aps.rst``): the
element an indirect access reaches is ``offset + index * prod(shape[indirect_dim + 1:]) + sum(stride_k * i_k)``,
and with ``vector_offset`` the pattern's first stride is replaced by that row pitch."""

from __future__ import annotations

import numpy as np
import pytest

import torchneuron.nki as nki
import torchneuron.nki.isa as nisa
import torchneuron.nki.language as nl
from torchneuron.nki import NkiValidationError
from nki_language_support import run

RNG = np.random.default_rng(28)


def _load(src, dtype=None):
    tile = nl.ndarray(src.shape, dtype or src.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=tile, src=src)
    return tile


# ---------------------------------------------------------------------------- vector_offset gather / scatter
def test_moe_token_gather_by_index_tile():
    tokens = RNG.standard_normal((300, 64)).astype(np.float32)
    idx = RNG.integers(0, 300, size=(128, 1)).astype(np.int32)

    def gather(hidden, index):
        P, H = index.shape[0], hidden.shape[1]
        rows = _load(index)
        out_sb = nl.ndarray((P, H), hidden.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=out_sb, src=hidden.ap(pattern=[[H, P], [1, H]], offset=0, vector_offset=rows,
                                                indirect_dim=0))
        out = nl.ndarray((P, H), hidden.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=out_sb)
        return out

    out, rec = run(gather, tokens, idx)
    np.testing.assert_array_equal(out, tokens[idx[:, 0]])
    ins = [i for i in rec.instructions if i.attrs.get("indirect")][0]
    assert ins.attrs["indirect"] == "vector" and ins.attrs["dge_mode"] == "swdge"
    assert ins.attrs["descriptors"] == 128 and ins.attrs["descriptor_bytes"] == 64 * 4


def test_vector_offset_row_pitch_comes_from_the_base_tensor_and_offset_selects_a_slice():
    # (T, 2, H) output, shard 1's half of each token row: offset H, row pitch 2H (the shape, not the pattern)
    T, H = 40, 16
    base = RNG.standard_normal((T, 2, H)).astype(np.float32)
    idx = np.array([[3], [0], [39], [7]], np.uint32)

    def kernel(x, index):
        rows = _load(index)
        sb = nl.ndarray((4, H), x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=sb, src=x.ap(pattern=[[999, 4], [1, H]], offset=H, vector_offset=rows, indirect_dim=0))
        out = nl.ndarray((4, H), x.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=sb)
        return out

    out, _ = run(kernel, base, idx)
    np.testing.assert_array_equal(out, base[idx[:, 0], 1, :])


def test_scatter_rows_by_index_tile_and_vector_select():
    values = RNG.standard_normal((8, 32)).astype(np.float32)
    idx = np.array([[5], [1], [9], [0], [2], [11], [7], [3]], np.int32)

    def scatter(src, index):
        rows = _load(index)
        data = _load(src)
        out = nl.ndarray((12, 32), src.dtype, buffer=nl.shared_hbm)
        zeros = nl.ndarray((12, 32), src.dtype, buffer=nl.sbuf)
        nisa.memset(dst=zeros, value=0.0)
        nisa.dma_copy(dst=out, src=zeros)
        nisa.dma_copy(dst=out.ap(pattern=[[32, 8], [1, 32]], vector_offset=rows, indirect_dim=0), src=data)
        back = nl.ndarray((8, 32), src.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=back, src=out.vector_select(0, rows))  # the same rows read back
        again = nl.ndarray((8, 32), src.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=again, src=back)
        return out, again

    (out, again), _ = run(scatter, values, idx)
    want = np.zeros((12, 32), np.float32)
    want[idx[:, 0]] = values
    np.testing.assert_array_equal(out, want)
    np.testing.assert_array_equal(again, values)


def test_out_of_range_index_names_the_index_the_partition_and_the_tensor():
    tokens = np.zeros((50, 8), np.float32)
    idx = np.arange(16, dtype=np.int32).reshape(16, 1)
    idx[9, 0] = 50

    def gather(hidden, index):
        rows = _load(index)
        sb = nl.ndarray((16, 8), hidden.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=sb, src=hidden.ap(pattern=[[8, 16], [1, 8]], vector_offset=rows, indirect_dim=0))
        out = nl.ndarray((16, 8), hidden.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=sb)
        return out

    with pytest.raises(NkiValidationError) as err:
        run(gather, tokens, idx)
    text = str(err.value)
    for part in ("holds 50", "partition 9", "'arg0'", "dimension 0", "size 50", "oob_mode"):  # arg0: 'hidden' 
        assert part in text, (part, text)


def test_oob_mode_skip_leaves_skipped_rows_untouched():
    tokens = RNG.standard_normal((20, 8)).astype(np.float32)
    idx = np.array([[2], [20], [-1], [19]], np.int32)  # rows 1 and 2 are out of range

    def gather(hidden, index):
        rows = _load(index)
        sb = nl.ndarray((4, 8), hidden.dtype, buffer=nl.sbuf)
        nisa.memset(dst=sb, value=7.0)
        nisa.dma_copy(dst=sb, src=hidden.ap(pattern=[[8, 4], [1, 8]], vector_offset=rows, indirect_dim=0),
                      oob_mode=nisa.oob_mode.skip)
        out = nl.ndarray((4, 8), hidden.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=sb)
        return out

    out, _ = run(gather, tokens, idx)
    np.testing.assert_array_equal(out[[0, 3]], tokens[[2, 19]])
    np.testing.assert_array_equal(out[[1, 2]], np.full((2, 8), 7.0, np.float32))


def test_vector_offset_refuses_hwdge_and_a_partition_count_mismatch():
    def hw(hidden, index):
        rows = _load(index)
        sb = nl.ndarray((4, 8), hidden.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=sb, src=hidden.ap(pattern=[[8, 4], [1, 8]], vector_offset=rows, indirect_dim=0),
                      dge_mode=nisa.dge_mode.hwdge)

    with pytest.raises(NkiValidationError, match="swdge"):
        run(hw, np.zeros((10, 8), np.float32), np.zeros((4, 1), np.int32))

    def rows_mismatch(hidden, index):
        rows = _load(index)
        hidden.ap(pattern=[[8, 8], [1, 8]], vector_offset=rows, indirect_dim=0)

    with pytest.raises(NkiValidationError, match="4 partitions"):
        run(rows_mismatch, np.zeros((10, 8), np.float32), np.zeros((4, 1), np.int32))


# ---------------------------------------------------------------------------- scatter-add / gather-add
def test_dma_compute_scatter_add_of_expert_outputs():
    T, H = 16, 8
    expert_out = RNG.standard_normal((4, H)).astype(np.float32)
    start = RNG.standard_normal((T, H)).astype(np.float32)
    idx = np.array([[3], [10], [0], [15]], np.int32)

    def combine(acc_in, update, index):
        rows = _load(index)
        upd = _load(update)
        acc = nl.ndarray((T, H), acc_in.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=acc, src=acc_in)
        view = acc.ap(pattern=[[H, 4], [1, H]], vector_offset=rows, indirect_dim=0)
        nisa.dma_compute(dst=view, srcs=[view, upd], reduce_op=nl.add)
        return acc

    out, rec = run(combine, start, expert_out, idx)
    want = start.copy()
    want[idx[:, 0]] += expert_out
    np.testing.assert_allclose(out, want, rtol=0, atol=0)
    ins = [i for i in rec.instructions if i.opcode == "dma_compute"][0]
    assert ins.attrs["indirect"] == "vector" and ins.attrs["dge_mode"] == "swdge"


def test_dma_compute_gather_add_and_repeated_indices_are_refused():
    table = RNG.standard_normal((10, 4)).astype(np.float32)
    idx = np.array([[1], [8], [4]], np.int32)

    def gather_add(tab, index):
        rows = _load(index)
        acc = nl.ndarray((3, 4), tab.dtype, buffer=nl.sbuf)
        nisa.memset(dst=acc, value=1.0)
        nisa.dma_compute(dst=acc, srcs=[acc, tab.ap(pattern=[[4, 3], [1, 4]], vector_offset=rows, indirect_dim=0)],
                         reduce_op=nl.add)
        out = nl.ndarray((3, 4), tab.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=acc)
        return out

    out, _ = run(gather_add, table, idx)
    np.testing.assert_allclose(out, table[idx[:, 0]] + 1.0, rtol=1e-6)

    def repeated(tab, index):
        rows = _load(index)
        upd = nl.ndarray((3, 4), tab.dtype, buffer=nl.sbuf)
        nisa.memset(dst=upd, value=1.0)
        acc = nl.ndarray((10, 4), tab.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=acc, src=tab)
        view = acc.ap(pattern=[[4, 3], [1, 4]], vector_offset=rows, indirect_dim=0)
        nisa.dma_compute(dst=view, srcs=[view, upd], reduce_op=nl.add)

    with pytest.raises(NkiValidationError, match="row 4 .*more than once|unique_indices"):
        run(repeated, table, np.array([[4], [2], [4]], np.int32))


# ---------------------------------------------------------------------------- scalar_offset / dynamic slices
def test_scalar_offset_from_a_tile_and_a_register():
    x = RNG.standard_normal((6, 128, 16)).astype(np.float32)
    which = np.array([[4]], np.int32)

    def kernel(a, sel):
        s = _load(sel)
        sb = nl.ndarray((128, 16), a.dtype, buffer=nl.sbuf)
        # batch sel of a (6, 128, 16) tensor: index * prod(shape[1:]) = index * 2048
        nisa.dma_copy(dst=sb, src=a.ap(pattern=[[16, 128], [1, 16]], offset=0, scalar_offset=s, indirect_dim=0))
        out1 = nl.ndarray((128, 16), a.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out1, src=sb)
        reg = nisa.register_alloc()
        nisa.register_load(reg, s)
        sb2 = nl.ndarray((128, 16), a.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=sb2, src=a.select(0, s))  # the same batch through select with a runtime index
        out2 = nl.ndarray((128, 16), a.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out2, src=sb2)
        # a single element at a register column of row 2 (indirect_dim=2 of the (6, 128, 16) tensor)
        one = nl.ndarray((1, 1), a.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=one, src=a.ap(pattern=[[1, 1], [1, 1]], offset=2 * 16, scalar_offset=reg, indirect_dim=2))
        out3 = nl.ndarray((1, 1), a.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out3, src=one)
        return out1, out2, out3

    (o1, o2, o3), rec = run(kernel, x, which)
    np.testing.assert_array_equal(o1, x[4])
    np.testing.assert_array_equal(o2, x[4])
    np.testing.assert_array_equal(o3, x[0, 2, 4:5].reshape(1, 1))
    ins = [i for i in rec.instructions if i.attrs.get("indirect") == "scalar"]
    assert len(ins) == 3


def test_scalar_offset_is_read_when_the_instruction_runs():
    # one view, an offset tile advanced between its uses (AWS's dynamic-shape kernels step a (1, 1) tile)
    x = RNG.standard_normal((4 * 8, 16)).astype(np.float32)

    def kernel(a):
        start = nl.ndarray((1, 1), nl.int32, buffer=nl.sbuf)
        nisa.memset(dst=start, value=0)
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        src = a.ap(pattern=[[16, 8], [1, 16]], offset=0, scalar_offset=start, indirect_dim=0)
        dst = out.ap(pattern=[[16, 8], [1, 16]], offset=0, scalar_offset=start, indirect_dim=0)
        for _ in range(4):
            t = nl.ndarray((8, 16), a.dtype, buffer=nl.sbuf)
            nisa.dma_copy(dst=t, src=src)
            nisa.dma_copy(dst=dst, src=t)
            nisa.tensor_scalar(dst=start, data=start, op0=nl.add, operand0=8)
        return out

    out, _ = run(kernel, x)
    np.testing.assert_array_equal(out, x)


def test_scalar_offset_out_of_range_error_and_skip():
    x = np.arange(10 * 4, dtype=np.float32).reshape(10, 4)

    def kernel(a, sel, mode):
        s = _load(sel)
        sb = nl.ndarray((3, 4), a.dtype, buffer=nl.sbuf)
        nisa.memset(dst=sb, value=-1.0)
        nisa.dma_copy(dst=sb, src=a.ap(pattern=[[4, 3], [1, 4]], scalar_offset=s, indirect_dim=0), oob_mode=mode)
        out = nl.ndarray((3, 4), a.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=sb)
        return out

    with pytest.raises(NkiValidationError) as err:
        run(kernel, x, np.array([[8]], np.int32), nisa.oob_mode.error)  # rows 8..10: row 10 does not exist
    assert "is 8" in str(err.value) and "'arg0'" in str(err.value) and "scalar_offset" in str(err.value)
    out, _ = run(kernel, x, np.array([[8]], np.int32), nisa.oob_mode.skip)
    np.testing.assert_array_equal(out, np.full((3, 4), -1.0, np.float32))
    out, _ = run(kernel, x, np.array([[7]], np.int32), nisa.oob_mode.error)
    np.testing.assert_array_equal(out, x[7:10])


def test_nl_ds_with_a_runtime_start():
    x = RNG.standard_normal((64, 32)).astype(np.float32)

    def kernel(a, sel):
        s = _load(sel)
        reg = nisa.register_alloc()
        nisa.register_load(reg, s)
        rows = nl.ndarray((16, 32), a.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=rows, src=a[nl.ds(reg, 16), :])
        cols = nl.ndarray((16, 8), a.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=cols, src=a[0:16, nl.ds(s, 8)])
        o1 = nl.ndarray((16, 32), a.dtype, buffer=nl.shared_hbm)
        o2 = nl.ndarray((16, 8), a.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=o1, src=rows)
        nisa.dma_copy(dst=o2, src=cols)
        return o1, o2

    (o1, o2), _ = run(kernel, x, np.array([[20]], np.int32))
    np.testing.assert_array_equal(o1, x[20:36])
    np.testing.assert_array_equal(o2, x[0:16, 20:28])


def test_fori_loop_register_as_scalar_offset():
    # the fori_loop example of NKI's stub: copy element i of a (1, N) row through a (1, 1) tile
    data = RNG.standard_normal((1, 12)).astype(np.float32)

    def kernel(d):
        out = nl.ndarray((1, 12), d.dtype, buffer=nl.shared_hbm)
        temp = nl.ndarray((1, 1), d.dtype, buffer=nl.sbuf)

        def body(i):
            nisa.dma_copy(dst=temp, src=d.ap([[1, 1], [1, 1]], scalar_offset=i, indirect_dim=1))
            nisa.dma_copy(dst=out.ap([[1, 1], [1, 1]], scalar_offset=i, indirect_dim=1), src=temp)

        nl.fori_loop(0, 12, body)
        return out

    out, _ = run(kernel, data)
    np.testing.assert_array_equal(out, data)


def test_indirect_view_rules():
    def both(a):
        t = nl.ndarray((4, 1), nl.int32, buffer=nl.sbuf)
        a.ap([[8, 4], [1, 8]], scalar_offset=t, vector_offset=t)

    with pytest.raises((NkiValidationError, TypeError), match="at most one|mutually exclusive"):
        run(both, np.zeros((8, 8), np.float32))

    def float_index(a):
        t = nl.ndarray((4, 1), nl.float32, buffer=nl.sbuf)
        a.ap([[8, 4], [1, 8]], vector_offset=t)

    with pytest.raises(NkiValidationError, match="integer"):
        run(float_index, np.zeros((8, 8), np.float32))

    def on_chip_vector(a):
        t = nl.ndarray((4, 1), nl.int32, buffer=nl.sbuf)
        s = nl.ndarray((8, 8), nl.float32, buffer=nl.sbuf)
        s.ap([[8, 4], [1, 8]], vector_offset=t)

    with pytest.raises(NkiValidationError, match="HBM"):
        run(on_chip_vector, np.zeros((8, 8), np.float32))

    seen = {}

    def flags(a):
        t = nl.ndarray((1, 1), nl.int32, buffer=nl.sbuf)
        seen["plain"] = a.is_indirect()
        seen["ind"] = a.ap([[8, 4], [1, 8]], scalar_offset=t).is_indirect()

    run(flags, np.zeros((8, 8), np.float32))
    assert seen == {"plain": False, "ind": True}


def test_indirect_gather_costs_one_descriptor_per_row():
    # Each index of a vector_offset gather is one descriptor of its row's contiguous bytes (NKI DGE guide:
    # swdge generates them); the transfer is timed like the static copy of as many rows of that size.
    table = RNG.standard_normal((300, 512)).astype(np.float32)
    idx = RNG.permutation(300)[:128].astype(np.int32).reshape(128, 1)

    def kernel(tab, index):
        rows = _load(index)
        gathered = nl.ndarray((128, 64), tab.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=gathered, src=tab.ap(pattern=[[512, 128], [1, 64]], vector_offset=rows, indirect_dim=0))
        static = nl.ndarray((128, 64), tab.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=static, src=tab[0:128, 0:64])
        out = nl.ndarray((128, 64), tab.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=gathered)
        return out

    out, rec = run(kernel, table, idx)
    np.testing.assert_array_equal(out, table[idx[:, 0], :64])
    from torchneuron.nki.cost import instruction_cost

    ind = [i for i in rec.instructions if i.attrs.get("indirect")][0]
    plain = [i for i in rec.instructions if i.opcode == "dma_copy" and i.reads and i.reads[0].shape == (128, 64)
             and not i.attrs.get("indirect") and i.reads[0].buffer == "shared_hbm"][0]
    assert (ind.attrs["descriptors"], ind.attrs["descriptor_bytes"]) == (128, 256)
    assert ind.reads[-1].shape == (128, 64) and ind.reads[-1].buffer == "shared_hbm"
    assert instruction_cost(ind, "trn2").ns == pytest.approx(instruction_cost(plain, "trn2").ns)


def test_nl_load_store_and_compute_engines_through_indirect_views():
    x = RNG.standard_normal((10, 64)).astype(np.float32)
    idx = np.array([[1], [3], [5], [9]], np.int32)

    def kernel(a, index):
        rows = _load(index)
        t = nl.load(a.ap([[64, 4], [1, 64]], vector_offset=rows, indirect_dim=0))  # gather
        out = nl.ndarray((10, 64), a.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=a)
        nl.store(out.ap([[64, 4], [1, 64]], vector_offset=rows, indirect_dim=0), nl.multiply(t, 2.0))  # scatter
        # VectorE reads columns reg..reg+15 of an SBUF tile (the stub's scalar_offset example, indirect_dim=1)
        col = nl.ndarray((1, 1), nl.int32, buffer=nl.sbuf)
        nisa.memset(dst=col, value=40)
        reg = nisa.register_alloc()
        nisa.register_load(reg, col)
        window = nl.ndarray((4, 16), a.dtype, buffer=nl.sbuf)
        nisa.tensor_copy(dst=window, src=t.ap([[64, 4], [1, 16]], scalar_offset=reg, indirect_dim=1))
        win = nl.ndarray((4, 16), a.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=win, src=window)
        return out, win

    (out, win), _ = run(kernel, x, idx)
    want = x.copy()
    want[idx[:, 0]] *= 2
    np.testing.assert_array_equal(out, want)
    np.testing.assert_array_equal(win, x[idx[:, 0], 40:56])


def test_shape_only_estimate_of_an_indirect_kernel_costs_the_same_instructions():
    # compute_values=False (dataless cost estimation) has no index values: the gather/scatter-add still
    # records the same DMAs, and no bounds error is raised for indices it cannot know
    from torchneuron.nki.benchmarking import estimate

    table = RNG.standard_normal((64, 32)).astype(np.float32)
    idx = np.arange(16, dtype=np.int32).reshape(16, 1)

    def kernel(tab, index):
        rows = _load(index)
        upd = nl.ndarray((16, 32), tab.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=upd, src=tab.ap([[32, 16], [1, 32]], vector_offset=rows, indirect_dim=0))
        out = nl.ndarray((64, 32), tab.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=tab)
        view = out.ap([[32, 16], [1, 32]], vector_offset=rows, indirect_dim=0)
        nisa.dma_compute(dst=view, srcs=[view, upd], reduce_op=nl.add)
        return out

    with_values = estimate(nki.jit(kernel), table, idx, target="trn2")
    shapes_only = estimate(nki.jit(kernel), table, idx, target="trn2", compute_values=False)
    assert shapes_only.latency_ns == pytest.approx(with_values.latency_ns)


def test_scalar_offset_skip_of_a_transfer_whose_sides_differ_in_shape():
    # dma_copy sides may differ in shape (equal element counts); a skipped scalar transfer writes nothing
    x = np.arange(6 * 8, dtype=np.float32).reshape(6, 8)

    def kernel(a, sel):
        s = _load(sel)
        sb = nl.ndarray((2, 16), a.dtype, buffer=nl.sbuf)
        nisa.memset(dst=sb, value=-1.0)
        nisa.dma_copy(dst=sb, src=a.ap([[8, 4], [1, 8]], scalar_offset=s, indirect_dim=0),
                      oob_mode=nisa.oob_mode.skip)
        out = nl.ndarray((2, 16), a.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=sb)
        return out

    out, _ = run(kernel, x, np.array([[4]], np.int32))  # rows 4..7 of 6: skipped
    np.testing.assert_array_equal(out, np.full((2, 16), -1.0, np.float32))
    out, _ = run(kernel, x, np.array([[2]], np.int32))
    np.testing.assert_array_equal(out, x[2:6].reshape(2, 16))
