"""nki.language basics: dtypes, buffers, tile_size per target, typing, allocation and capacity."""


import ml_dtypes
import numpy as np
import pytest
import torch

import torchneuron.nki as nki
import torchneuron.nki.language as nl
import torchneuron.nki.typing as nt
from torchneuron.nki import NkiValidationError
from torchneuron.nki.context import NkiUninitializedReadWarning
from torchneuron.nki.memory import Buffer

KiB, MiB = 1024, 1024 * 1024


def hold(*tiles):
    """Touch every tile (memset): a tile occupies on-chip memory only between its first and last use."""
    import torchneuron.nki.isa as nisa

    for tile in tiles:
        nisa.memset(dst=tile, value=0 if tile.dtype.is_integer else 0.0)


def run(fn, *args, target="trn2", **kwargs):
    """Simulate ``fn`` on ``target``; return (outputs, the kernel's run record)."""
    kernel = nki.jit(fn)
    out = nki.simulate(kernel, target=target, **kwargs)(*args)
    return out, kernel.last_run


# ------------------------------------------------------------------ imports / namespace
def test_import_styles_give_one_module():
    import torchneuron.nki.language as nl_a
    from torchneuron.nki import language as nl_b

    assert nl_a is nl_b is nki.language
    assert nki.typing is nt
    assert nki.NkiValidationError is NkiValidationError
    assert issubclass(NkiValidationError, AssertionError)
    assert callable(nki.jit) and callable(nki.simulate) and callable(nki.simulate_kernel)
    assert nki.Kernel is type(nki.jit(lambda: None))


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


# ---------------------------------------------------------------------------- typing
def test_typing_annotations_and_legacy_placeholders():
    t = nt.tensor[128, 512]
    assert t.shape == (128, 512) and t.dtype is None and t.ndim == 2
    legacy = nt.tensor[[8192, 4096], nl.bfloat16]
    assert legacy.shape == (8192, 4096) and legacy.dtype is nl.bfloat16 and legacy.size == 8192 * 4096
    assert nt.tensor[128, 512, nl.float32] == nt.tensor[[128, 512], "float32"]
    small = nt.tensor[[4, 8], nl.bfloat16]
    assert small.numpy().dtype == ml_dtypes.bfloat16 and small.numpy().shape == (4, 8)
    r = small.numpy("random", seed=3)
    assert np.array_equal(r, small.numpy("random", seed=3)) and (r.astype(np.float32) < 1).all()
    small.check(np.zeros((4, 8), ml_dtypes.bfloat16))
    with pytest.raises(TypeError, match="shape"):
        small.check(np.zeros((4, 9), ml_dtypes.bfloat16))
    with pytest.raises(TypeError, match="takes dims then an optional dtype"):
        nt.tensor["x"]
    with pytest.raises(TypeError, match="positive int dims"):
        nt.tensor[128, 0]
    with pytest.raises(TypeError, match="annotation"):
        nt.tensor()

    def annotated(x: nt.tensor[128, 512], y: nt.tensor) -> None:
        pass

    assert annotated.__annotations__["x"].shape == (128, 512)


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
    assert seen["name"].startswith("ndarray@test_nki_language_basics.py:")
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


# --------------------------------------------------------------- removed legacy APIs
def test_removed_legacy_apis_name_their_replacement():
    def loop_reduce():
        nl.loop_reduce(None, op=np.add, loop_indices=[0])

    with pytest.raises(NkiValidationError, match="loop_reduce was removed.*nisa.tensor_tensor"):
        run(loop_reduce)

    def atomic():
        nl.atomic_rmw(None, None, np.add)

    with pytest.raises(NkiValidationError, match="atomic_rmw was removed.*dma_compute"):
        run(atomic)

    def allocator():
        nki.compiler.sbuf.mod_alloc(base_addr=0)

    with pytest.raises(NkiValidationError, match=r"allocators were removed.*address=\(partition_offset"):
        run(allocator)

    assert nki.compiler.sbuf.auto_alloc() is nl.sbuf and nki.compiler.psum.auto_alloc() is nl.psum
    with pytest.raises(AttributeError, match="nki.compiler.no_such_directive is not provided"):
        nki.compiler.no_such_directive

    @nki.compiler.skip_middle_end_transformations
    def hinted():
        return 1

    assert hinted() == 1


def test_loops_are_python_ranges():
    assert list(nl.affine_range(3)) == [0, 1, 2]
    assert list(nl.sequential_range(1, 7, 2)) == [1, 3, 5]
    assert list(nl.static_range(2, 4)) == [2, 3]
    with pytest.warns(DeprecationWarning, match="fori_loop"):
        assert list(nl.dynamic_range(3)) == [0, 1, 2]

    total = 0
    for _ in nl.affine_range(8):  # legacy traced the body once; we run Python (total == 8)
        total += 1
    assert total == 8


def test_spmd_grid_dims():
    assert nl.nc(2) == 2 and nl.nc(2).lnc_degree == 2
    assert nl.spmd_dim(nl.nc(2), 2) == 4 and nl.nc(2) * 2 == 4 and 2 * nl.nc(2) == 4
