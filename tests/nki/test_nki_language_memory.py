"""nki.language memory (torchneuron/nki/language/memory.py): dtypes, buffers, tile_size per target,
allocation (ndarray, creation functions, legacy block dims), SBUF/PSUM capacity, and reads of memory
never written."""

import ml_dtypes
import numpy as np
import pytest
import torch

import torchneuron.nki.isa as nisa
import torchneuron.nki.language as nl
from torchneuron.nki import NkiValidationError
from torchneuron.nki.context import NkiUninitializedReadWarning
from torchneuron.nki.errors import NkiUninitializedReadError
from torchneuron.nki.memory import Buffer
from nki_language_support import run

KiB, MiB = 1024, 1024 * 1024


def hold(*tiles):
    """Touch every tile (memset): a tile occupies on-chip memory only between its first and last use."""
    for tile in tiles:
        nisa.memset(dst=tile, value=0 if tile.dtype.is_integer else 0.0)


# ---------------------------------------------------------------------------- dtypes
def test_dtypes_compare_equal_to_every_spelling():
    assert nl.float32 == np.float32 and nl.float32 == "float32"
    assert nl.bfloat16 == ml_dtypes.bfloat16 and nl.bfloat16 == "bfloat16" and nl.bfloat16 == torch.bfloat16
    assert nl.float8_e4m3 == ml_dtypes.float8_e4m3 and nl.float8_e5m2 == "float8_e5m2"
    assert nl.float8_e4m3fn == torch.float8_e4m3fn
    assert nl.tfloat32 == "tfloat32" and nl.tfloat32.itemsize == 4
    assert nl.bool_ == np.bool_ and nl.bool_.itemsize == 1
    assert nl.int8 == np.int8 and nl.uint32 == "uint32" and nl.int32 != nl.uint32
    assert nl.fp32 is nl.float32 and nl.fp16 is nl.float16 and nl.bf16 is nl.bfloat16


def test_legacy_dtype_constants():
    assert nl.fp32.min == float(np.finfo(np.float32).min)
    assert nl.fp32.max == float(np.finfo(np.float32).max)
    assert nl.bf16.max == float(ml_dtypes.finfo(ml_dtypes.bfloat16).max)
    assert nl.fp16.min == float(np.finfo(np.float16).min)
    assert nl.finfo(nl.bfloat16).bits == 16


# --------------------------------------------------------------------------- buffers
def test_buffers_and_predicates():
    assert nl.sbuf is Buffer.sbuf and nl.psum is Buffer.psum
    assert nl.hbm is nl.private_hbm and nl.shared_hbm is Buffer.shared_hbm
    assert nl.MemoryRegion is Buffer
    assert nl.is_sbuf(nl.sbuf) and not nl.is_sbuf(nl.psum)
    assert nl.is_psum(nl.psum)
    assert nl.is_hbm(nl.hbm) and nl.is_hbm(nl.shared_hbm) and not nl.is_hbm(nl.sbuf)
    assert nl.is_on_chip(nl.sbuf) and nl.is_on_chip(nl.psum) and not nl.is_on_chip(nl.private_hbm)


def test_string_buffer_names_are_rejected():
    def kernel():
        nl.ndarray((128, 4), nl.float32, buffer="sbuf")

    with pytest.raises(TypeError, match="strings were removed in NKI 0.3.0.*nl.sbuf"):
        run(kernel)


def test_legacy_buffer_none_means_sbuf():
    seen = {}

    def kernel():
        seen["buffer"] = nl.ndarray((128, 4), nl.float32, buffer=None).buffer

    run(kernel)
    assert seen["buffer"] is nl.sbuf


# ------------------------------------------------------------------------- tile_size
@pytest.mark.parametrize("target, per_partition, total", [
    ("trn1", 192 * KiB, 24 * MiB), ("trn2", 224 * KiB, 28 * MiB), ("trn3", 256 * KiB, 32 * MiB)])
def test_tile_size_follows_the_kernel_target(target, per_partition, total):
    seen = {}

    def kernel():
        ts = nl.tile_size
        seen.update(pmax=ts.pmax, psum_bank_fmax=ts.psum_bank_fmax, psum_fmax=ts.psum_fmax,
                    psum_bank_fmax_bytes=ts.psum_bank_fmax_bytes, banks=ts.psum_num_banks,
                    stat=ts.gemm_stationary_fmax, mov=ts.gemm_moving_fmax, bn=ts.bn_stats_fmax,
                    size=ts.sbuf_size_bytes, fmax_bytes=ts.sbuf_fmax_bytes, fmax=ts.sbuf_fmax,
                    total=ts.total_available_sbuf_size)

    run(kernel, target=target)
    assert seen == dict(pmax=128, psum_bank_fmax=512, psum_fmax=512, psum_bank_fmax_bytes=2048, banks=8,
                        stat=128, mov=512, bn=512, size=total, fmax_bytes=per_partition,
                        fmax=per_partition // 4, total=per_partition)


def test_tile_size_outside_a_kernel_reads_the_target_override(monkeypatch):
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "trn1")
    assert nl.tile_size.sbuf_size_bytes == 24 * MiB
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "gen4")
    assert nl.tile_size.sbuf_fmax_bytes == 256 * KiB


@pytest.mark.parametrize("target, banks", [("trn1", 8), ("trn2", 7), ("trn3", 7)])
def test_psum_banks_reserved_for_pe_transpose(monkeypatch, target, banks):
    monkeypatch.setenv("NKI_DMA_TRANSPOSE_AS_PE_TRANSPOSE", "true")
    seen = {}

    def kernel():
        seen["banks"] = nl.tile_size.psum_num_banks
        tiles = [nl.ndarray((128, 512), nl.float32, buffer=nl.psum) for _ in range(banks)]
        hold(*tiles)
        hold(*tiles)  # all live at once
        seen["held"] = len(tiles)

    run(kernel, target=target)
    assert seen == {"banks": banks, "held": banks}

    def one_too_many():
        tiles = [nl.ndarray((128, 512), nl.float32, buffer=nl.psum) for _ in range(banks + 1)]
        hold(*tiles)
        hold(*tiles)

    with pytest.raises(NkiValidationError, match=f"PSUM capacity exceeded on {target}.*{banks} of {banks} banks"):
        run(one_too_many, target=target)


# ------------------------------------------------------------------------ allocation
def test_ndarray_is_uninitialised_and_named_after_the_kernel_line():
    seen = {}

    def kernel():
        t = nl.ndarray((128, 64), nl.float32)
        i = nl.ndarray((4, 4), nl.int32, buffer=nl.psum, name="acc")
        seen.update(shape=t.shape, name=t.name, nan=bool(np.isnan(t.values()).all()),
                    ints=bool((i.values() == 4).all()), iname=i.name, ibuf=i.buffer)

    run(kernel)
    assert seen["shape"] == (128, 64) and seen["nan"] and seen["ints"]
    assert seen["name"].startswith("ndarray@test_nki_language_memory.py:")
    assert seen["iname"] == "acc" and seen["ibuf"] is nl.psum


def test_partition_dim_limit_and_manual_address():
    def too_tall():
        nl.ndarray((256, 4), nl.float32)

    with pytest.raises(NkiValidationError, match="partition dimension 256 exceeds architecture limitation of 128"):
        run(too_tall)

    def overlap():
        a = nl.ndarray((128, 64), nl.float32, address=(0, 0))
        b = nl.ndarray((128, 64), nl.float32, address=(0, 32))
        hold(a, b, a)

    with pytest.raises(NkiValidationError, match="overlaps live tensor"):
        run(overlap)

    def misaligned():
        nl.ndarray((128, 256), nl.float32, buffer=nl.psum, address=(0, 100))

    with pytest.raises(NkiValidationError, match="bank boundary"):
        run(misaligned)


def test_sbuf_capacity_names_sbuf_and_the_limit():
    def hoard():
        tiles = [nl.ndarray((128, 8192), nl.float32) for _ in range(8)]  # 8 x 32 KiB > 224 KiB
        hold(*tiles)
        hold(*tiles)

    with pytest.raises(NkiValidationError, match=r"SBUF capacity exceeded on trn2.*229376 B per partition"):
        run(hoard, target="trn2")

    def reuse():
        for _ in range(64):
            t = nl.ndarray((128, 8192), nl.float32)  # the previous tile is dead once this one is used
            hold(t, t)

    run(reuse, target="trn2")
    run(hoard, target="trn3")  # 8 x 32 KiB fits trn3's 256 KiB


def test_psum_capacity_names_psum_and_the_banks():
    def hoard():
        tiles = [nl.ndarray((128, 512), nl.float32, buffer=nl.psum) for _ in range(9)]
        hold(*tiles)
        hold(*tiles)

    with pytest.raises(NkiValidationError, match="PSUM capacity exceeded on trn2.*8 of 8 banks"):
        run(hoard)

    def reuse():
        for _ in range(32):
            p = nl.ndarray((128, 512), nl.float32, buffer=nl.psum)
            hold(p, p)
        small = [nl.ndarray((128, 128), nl.float32, buffer=nl.psum) for _ in range(32)]  # 4 per bank
        hold(*small)
        hold(*small)

    run(reuse)


def test_hbm_ndarray_and_outputs():
    def kernel(a):
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        scratch = nl.ndarray((4096, 4096), nl.float32, buffer=nl.hbm)  # HBM: no on-chip capacity
        assert scratch.buffer is nl.private_hbm
        return out

    with pytest.warns(NkiUninitializedReadWarning, match="never written"):
        out, _ = run(kernel, np.zeros((3, 5), np.float32))
    assert out.shape == (3, 5) and np.isnan(out).all()

    def bad_address():
        nl.ndarray((4, 4), nl.float32, buffer=nl.shared_hbm, address=(0, 0))

    with pytest.raises(NkiValidationError, match="on-chip tensors only"):
        run(bad_address)


def test_legacy_block_dims_are_lists_of_tiles():
    seen = {}

    def kernel():
        b = nl.ndarray((3, nl.par_dim(128), 64), nl.bfloat16)
        two = nl.ndarray((2, 2, nl.par_dim(32), 8), nl.float32)
        same = nl.ndarray((nl.par_dim(128), 16), nl.float32)
        seen.update(shape=b.shape, tile=b[1].shape, sub=b[2, :, 0:8].shape, dtype=b.dtype, buffer=b.buffer,
                    distinct=b[0].name != b[1].name, two=two[1, 0].shape, same=same.shape, n=len(b))
        with pytest.raises(TypeError, match="block tensor"):
            nl.exp(b)
        with pytest.raises(IndexError, match="one integer per block dim"):
            b[0:2]
        hbm = nl.ndarray((3, nl.par_dim(128), 64), nl.float32, buffer=nl.hbm)
        seen["hbm"] = hbm.shape

    run(kernel)
    assert seen == dict(shape=(3, 128, 64), tile=(128, 64), sub=(128, 8), dtype=nl.bfloat16, buffer=nl.sbuf,
                        distinct=True, two=(32, 8), same=(128, 16), n=3, hbm=(3, 128, 64))


def test_block_tensor_capacity_counts_every_tile():
    def kernel():
        blocks = nl.ndarray((8, nl.par_dim(128), 8192), nl.float32)  # 8 x 32 KiB per partition
        tiles = [blocks[i] for i in range(8)]
        hold(*tiles)
        hold(*tiles)

    with pytest.raises(NkiValidationError, match="SBUF capacity exceeded"):
        run(kernel, target="trn2")


def test_creation_functions():
    def kernel():
        z = nl.zeros((128, 128), nl.bfloat16)
        o = nl.ones((128, 128), nl.int32)
        f = nl.full((128, 128), 2.5, nl.float32)
        zl = nl.zeros_like(f)
        el = nl.empty_like(f)
        assert el.buffer is nl.sbuf and el.dtype is nl.float32
        i = nl.shared_identity_matrix(128, nl.float32)
        c = nl.shared_constant(np.arange(12, dtype=np.float64).reshape(3, 4))
        assert c.buffer is nl.shared_hbm and c.dtype is nl.float32
        h = nl.zeros((300, 5), nl.float32, buffer=nl.shared_hbm)
        out = nl.ndarray((5, 128, 128), nl.float32, buffer=nl.shared_hbm)
        for k, t in enumerate((z, o, f, zl)):
            nl.store(out[k], nl.copy(t, nl.float32))
        nl.store(out[4], i)
        return out, c, h

    (out, c, h), r = run(kernel)
    assert (out[0] == 0).all() and (out[1] == 1).all() and (out[2] == 2.5).all() and (out[3] == 0).all()
    assert np.array_equal(out[4], np.eye(128))
    assert np.array_equal(c, np.arange(12).reshape(3, 4)) and (h == 0).all()
    memsets = [i for i in r.instructions if i.opcode == "memset"]
    assert len(memsets) >= 5 and [m.attrs["value"] for m in memsets[:4]] == [0, 1, 2.5, 0]

    def bad_fill():
        nl.full((4, 4), 2.5, nl.int32)

    with pytest.raises(TypeError, match="not an integer"):
        run(bad_fill)


def test_uninitialised_reads_warn_or_fail():
    def kernel(a):
        t = nl.ndarray((128, 8), nl.float32)
        u = nl.exp(t)
        out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
        nl.store(out, u)
        return out

    a = np.zeros((128, 8), np.float32)
    with pytest.warns(NkiUninitializedReadWarning, match="no instruction wrote"):
        out, _ = run(kernel, a)
    assert np.isnan(out).all()
    with pytest.raises(NkiUninitializedReadError, match="no instruction wrote"):
        run(kernel, a, uninitialized="error")


def _fill_with_the_lowest_bf16(x):
    # AWS's legacy select_and_scatter_kernel: nl.full(..., fill_value=nl.finfo(kernel_dtype).min) with a
    # bf16 kernel dtype, whose finfo values are ml_dtypes bfloat16 scalars (not np.number)
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    lowest = nl.full(x.shape, dtype=x.dtype, buffer=nl.sbuf, fill_value=nl.finfo(x.dtype).min)
    nl.store(out, nl.maximum(lowest, nl.load(x)))
    return out


def test_fill_value_may_be_an_ml_dtypes_scalar():
    x = np.array([[-1.5, 0.0, 2.0]] * 4, dtype=ml_dtypes.bfloat16)
    assert not isinstance(nl.finfo(nl.bfloat16).min, np.number)
    out, _ = run(_fill_with_the_lowest_bf16, x)
    np.testing.assert_array_equal(out, x)
    full, _ = run(lambda a: _store_full(a, nl.finfo(nl.bfloat16).min), x)
    np.testing.assert_array_equal(full, np.full(x.shape, ml_dtypes.finfo(ml_dtypes.bfloat16).min, ml_dtypes.bfloat16))


def _store_full(x, value):
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    nl.store(out, nl.full(x.shape, value, dtype=x.dtype))
    return out
