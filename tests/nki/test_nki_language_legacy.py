"""Legacy ``neuronxcc.nki`` idioms on nki.language, and current vs legacy kernels giving identical results."""

import subprocess
import sys
import textwrap
import warnings

import ml_dtypes
import numpy as np
import pytest

import torchneuron.nki as nki
import torchneuron.nki.isa as nisa
import torchneuron.nki.language as nl
import torchneuron.nki.typing as nt
from torchneuron.nki import NkiValidationError
from torchneuron.testing import assert_close_to_reference, matmul_tolerance, sum_tolerance, unit_roundoff
from nki_language_support import run

BF16 = ml_dtypes.bfloat16
RNG = np.random.default_rng(1)


def opcodes(record):
    return [i.opcode for i in record.instructions]


# ------------------------------------------------- the full small kernel, both styles
@nki.jit
def add_current(a, b):
    """Current NKI: range loops, integer slices, dst-first ISA calls."""
    out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
    rows, cols = a.shape
    for i in range(rows // nl.tile_size.pmax):
        sl = slice(i * 128, (i + 1) * 128)
        at = nl.ndarray((128, cols), a.dtype, buffer=nl.sbuf)
        bt = nl.ndarray((128, cols), b.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=at, src=a[sl, :])
        nisa.dma_copy(dst=bt, src=b[sl, :])
        ct = nl.ndarray((128, cols), a.dtype, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=ct, data1=at, data2=bt, op=nl.add)
        nisa.dma_copy(dst=out[sl, :], src=ct)
    return out


@nki.jit
def add_current_nl(a, b):
    """Current NKI through nl helpers: nl.load / nl.add / nl.store with nl.ds slices."""
    out = nl.ndarray(a.shape, a.dtype, buffer=nl.shared_hbm)
    for i in range(a.shape[0] // 128):
        at = nl.load(a[nl.ds(i * 128, 128), :])
        bt = nl.load(b[nl.ds(i * 128, 128), :])
        nl.store(out[nl.ds(i * 128, 128), :], nl.add(at, bt))
    return out


@nki.jit
def add_legacy(a_tensor, b_tensor):
    """Legacy neuronxcc.nki: mgrid affine indices, affine_range, tile operators."""
    c_tensor = nl.ndarray(a_tensor.shape, dtype=a_tensor.dtype, buffer=nl.shared_hbm)
    i_p, i_f = nl.mgrid[0:128, 0:1024]
    for k in nl.affine_range(a_tensor.shape[0] // 128):
        a_tile = nl.load(a_tensor[k * 128 + i_p, i_f])
        b_tile = nl.load(b_tensor[k * 128 + i_p, i_f])
        c_tile = a_tile + b_tile
        nl.store(c_tensor[k * 128 + i_p, i_f], value=c_tile)
    return c_tensor


@pytest.mark.parametrize("dtype", [np.float32, BF16])
def test_tensor_add_current_and_legacy_styles_agree(dtype):
    a = RNG.normal(size=(256, 1024)).astype(dtype)
    b = RNG.normal(size=(256, 1024)).astype(dtype)
    expect = (a.astype(np.float32) + b.astype(np.float32)).astype(dtype)
    outs = {}
    for kernel in (add_current, add_current_nl, add_legacy):
        out, record = run(kernel, a, b)
        outs[kernel.name] = out
        assert out.dtype == dtype and np.array_equal(out.view(np.uint8), expect.view(np.uint8)), kernel.name
        assert opcodes(record).count("dma_copy") == 6 and opcodes(record).count("tensor_tensor") == 2
        assert "tensor_copy" not in opcodes(record)
    assert np.array_equal(outs["add_current"].view(np.uint8), outs["add_legacy"].view(np.uint8))


def test_simulate_kernel_and_numpy_inputs_updated_in_place():
    a = np.ones((256, 1024), np.float32)
    out = nki.simulate_kernel(add_legacy, a, a)
    assert (out == 2).all()


# --------------------------------------------------------------------- legacy indexing
def test_arange_affine_indexing_and_partial_tiles():
    n = 300
    a = RNG.normal(size=(n, 64)).astype(np.float32)

    def kernel(x):
        out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
        i_p = nl.arange(128)[:, None]
        i_f = nl.arange(64)[None, :]
        for t in nl.affine_range((n + 127) // 128):
            tile = nl.load(x[t * 128 + i_p, i_f], mask=(t * 128 + i_p < n))
            res = nl.exp(tile, mask=(t * 128 + i_p < n))
            nl.store(out[t * 128 + i_p, i_f], value=res, mask=(t * 128 + i_p < n))
        return out

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # masked ops never read the unloaded rows
        out, record = run(kernel, a)
    np.testing.assert_allclose(out, np.exp(a), rtol=1e-6)
    assert opcodes(record) == ["dma_copy", "activation", "dma_copy"] * 3
    last_load = record.instructions[6]
    assert last_load.writes[0].partitions == n - 256


def test_legacy_views_past_the_end_need_a_mask():
    n = 200
    a = RNG.normal(size=(n, 32)).astype(np.float32)

    def unmasked(x):
        out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
        ix, iy = nl.mgrid[0:128, 0:32]
        for t in range(2):
            tile = nl.load(x[t * 128 + ix, iy])  # the second view runs past row 200
            nl.store(out[t * 128 + ix, iy], value=tile)
        return out

    with pytest.raises(NkiValidationError, match=r"test_nki_language_legacy.py:\d+ in unmasked: dma_copy: src "
                       r"'arg0' is indexed out of bounds: dimension 0 spans 128 elements but only 72"):
        run(unmasked, a)

    def masked(x):
        out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
        ix, iy = nl.mgrid[0:128, 0:32]
        for t in range(2):
            tile = nl.load(x[t * 128 + ix, iy], mask=(t * 128 + ix < n))
            nl.store(out[t * 128 + ix, iy], value=tile, mask=(t * 128 + ix < n))
        return out

    out, _ = run(masked, a)
    assert np.array_equal(out, a)


def test_masked_reduction_and_compute_with_mgrid():
    n = 100
    a = RNG.normal(size=(n, 16)).astype(np.float32)

    def kernel(x):
        out = nl.ndarray((n, 1), nl.float32, buffer=nl.shared_hbm)
        ip, jf = nl.mgrid[0:128, 0:16]
        io = nl.arange(128)[:, None]
        tile = nl.load(x[ip, jf], mask=(ip < n))
        s = nl.sum(tile, axis=1, keepdims=True, mask=(ip < n))
        nl.store(out[io, nl.arange(1)[None, :]], value=s, mask=(io < n))
        return out

    out, _ = run(kernel, a)
    assert_close_to_reference(out, a.astype(np.float64).sum(axis=1, keepdims=True), sum_tolerance(a, 1, keepdims=True))


def test_block_dims_with_par_dim():
    a = RNG.normal(size=(384, 64)).astype(np.float32)

    def kernel(x):
        out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
        tiles = nl.ndarray((3, nl.par_dim(128), 64), dtype=x.dtype, buffer=nl.sbuf)
        i = nl.mgrid[0:128, 0:64]
        for k in nl.affine_range(3):
            tiles[k, i.p, i.x] = nl.load(x[k * 128 + i.p, i.x])
        for k in nl.affine_range(3):
            tiles[k] = nl.multiply(tiles[k], 2.0)
            nl.store(out[k * 128 + i.p, i.x], value=tiles[k, i.p, i.x])
        return out

    out, record = run(kernel, a)
    assert np.array_equal(out, a * 2)
    assert "tensor_copy" not in opcodes(record)  # loads and multiplies write the block tiles directly


# -------------------------------------------------------------- matmul accumulation
@nki.jit
def matmul_legacy_tiled(lhsT, rhs):
    """The legacy tutorial's nki_matmul_tiled_: psum += nl.matmul(..., transpose_x=True)."""
    K, M = lhsT.shape
    _, N = rhs.shape
    result = nl.ndarray((M, N), dtype=lhsT.dtype, buffer=nl.shared_hbm)
    for m in nl.affine_range(M // 128):
        for n in nl.affine_range(N // 512):
            res_psum = nl.zeros((128, 512), nl.float32, buffer=nl.psum)
            for k in nl.affine_range(K // 128):
                lhsT_tile = nl.ndarray((128, 128), dtype=lhsT.dtype, buffer=nl.sbuf)
                rhs_tile = nl.ndarray((128, 512), dtype=rhs.dtype, buffer=nl.sbuf)
                lhsT_tile[...] = nl.load(lhsT[k * 128:(k + 1) * 128, m * 128:(m + 1) * 128])
                rhs_tile[...] = nl.load(rhs[k * 128:(k + 1) * 128, n * 512:(n + 1) * 512])
                res_psum += nl.matmul(lhsT_tile[...], rhs_tile[...], transpose_x=True)
            res_sb = nl.copy(res_psum, dtype=result.dtype)
            nl.store(result[m * 128:(m + 1) * 128, n * 512:(n + 1) * 512], value=res_sb)
    return result


def test_psum_accumulation_of_nl_matmul_is_one_accumulation_group():
    lhsT = RNG.normal(size=(384, 256)).astype(BF16)
    rhs = RNG.normal(size=(384, 1024)).astype(BF16)
    out, record = run(matmul_legacy_tiled, lhsT, rhs)
    # one fp32 accumulation group of 3 x 128 products, rounded once into bf16
    ref = lhsT.astype(np.float64).T @ rhs.astype(np.float64)
    tol = matmul_tolerance(lhsT.T, rhs) * (1 + 2 ** -8)
    assert_close_to_reference(out, ref, tol, rtol=unit_roundoff(BF16))
    ops = opcodes(record)
    # per output tile: memset, 3 x (2 loads + matmul), copy, store; no extra copies or adds
    assert ops.count("nc_matmul") == 2 * 2 * 3 and ops.count("dma_copy") == 2 * 2 * (6 + 1)
    assert ops.count("tensor_copy") == 4 and "tensor_tensor" not in ops
    accumulate = [i.attrs["accumulate"] for i in record.instructions if i.opcode == "nc_matmul"]
    assert accumulate == [False, True, True] * 4
    matmul_dst = {i.writes[0].allocation for i in record.instructions if i.opcode == "nc_matmul"}
    assert len(matmul_dst) == 4  # each writes its output tile's PSUM accumulator directly


def test_psum_subscript_accumulation_and_legacy_isa_matmul():
    a = RNG.normal(size=(256, 128)).astype(np.float32)
    b = RNG.normal(size=(256, 64)).astype(np.float32)

    def kernel(x, y):
        out = nl.ndarray((2, 128, 64), nl.float32, buffer=nl.shared_hbm)
        acc = nl.zeros((128, 64), nl.float32, buffer=nl.psum)
        acc2 = nl.zeros((128, 64), nl.float32, buffer=nl.psum)
        for k in nl.affine_range(2):
            xt = nl.load(x[k * 128:(k + 1) * 128, :])
            yt = nl.load(y[k * 128:(k + 1) * 128, :])
            acc[...] += nl.matmul(xt, yt, transpose_x=True)
            acc2[...] += nisa.nc_matmul(xt, yt)  # legacy return-style ISA call
        nl.store(out[0], acc)
        nl.store(out[1], acc2)
        return out

    out, record = run(kernel, a, b)
    ref, tol = a.T.astype(np.float64) @ b, matmul_tolerance(a.T, b)  # one group of 2 x 128 products
    assert_close_to_reference(out[0], ref, tol)
    assert_close_to_reference(out[1], ref, tol)
    assert "tensor_tensor" not in opcodes(record) and opcodes(record).count("nc_matmul") == 4


def test_held_matmul_result_is_added_not_fused():
    a = RNG.normal(size=(128, 128)).astype(np.float32)

    def kernel(x):
        t = nl.load(x)
        acc = nl.zeros((128, 128), nl.float32, buffer=nl.psum)
        p = nl.matmul(t, t, transpose_x=True)
        acc += p  # p is still referenced: an element-wise add, p stays valid
        acc += p
        out = nl.ndarray((2, 128, 128), nl.float32, buffer=nl.shared_hbm)
        nl.store(out[0], acc)
        nl.store(out[1], p)
        return out

    out, record = run(kernel, a)
    ref, tol = a.T.astype(np.float64) @ a, matmul_tolerance(a.T, a)
    assert_close_to_reference(out[0], 2 * ref, 2 * tol)  # 0 + p + p: exactly 2p
    assert_close_to_reference(out[1], ref, tol)
    assert opcodes(record).count("tensor_tensor") == 2


def test_sbuf_accumulation_of_psum_tiles():
    a = RNG.normal(size=(128, 128)).astype(np.float32)

    def kernel(x):
        t = nl.load(x)
        res = nl.zeros((128, 128), nl.float32, buffer=nl.sbuf)
        for _ in nl.affine_range(3):
            psum_tile = nl.matmul(t, t, transpose_x=True)
            res[...] += psum_tile
        res += 1.0
        out = nl.ndarray(res.shape, res.dtype, buffer=nl.shared_hbm)
        nl.store(out, res)
        return out

    out, record = run(kernel, a)
    ref = 3 * (a.T.astype(np.float64) @ a)
    # 3 p (2p exact, one rounding) then + 1 (one rounding)
    bound = 3 * matmul_tolerance(a.T, a) + 4 * unit_roundoff(np.float32) * (np.abs(ref) + 1)
    assert_close_to_reference(out, ref + 1, bound)
    assert opcodes(record).count("tensor_tensor") == 3


def test_fresh_psum_region_starts_a_group():
    a = RNG.normal(size=(128, 64)).astype(np.float32)

    def kernel(x):
        t = nl.load(x)
        acc = nl.ndarray((64, 128), nl.float32, buffer=nl.psum)  # uninitialised: first += overwrites
        for half in range(2):
            cols = slice(half * 64, half * 64 + 64)
            acc[:, cols] += nl.matmul(t, t, transpose_x=True)
            acc[:, cols] += nl.matmul(t, t, transpose_x=True)
        out = nl.ndarray(acc.shape, acc.dtype, buffer=nl.shared_hbm)
        nl.store(out, acc)
        return out

    out, record = run(kernel, a, uninitialized="error")
    twice = np.tile(a.T, (1, 2)), np.tile(a, (2, 1))  # one group of 2 x 128 products per half
    assert_close_to_reference(out, np.tile(twice[0].astype(np.float64) @ twice[1], (1, 2)),
                              np.tile(matmul_tolerance(*twice), (1, 2)))
    assert [i.attrs["accumulate"] for i in record.instructions if i.opcode == "nc_matmul"] == [False, True] * 2


# ---------------------------------------------------------------- tile arithmetic
def test_tile_operators_and_numpy_ufunc_ops():
    a = RNG.uniform(1, 2, size=(128, 64)).astype(np.float32)
    b = RNG.uniform(1, 2, size=(128, 64)).astype(np.float32)

    def kernel(x, y):
        xt, yt = nl.load(x), nl.load(y)
        r1 = (xt + yt) * 2.0 - yt / xt
        r2 = 1.0 - xt ** 2 + (-yt)
        r3 = nisa.tensor_tensor(xt, yt, np.maximum)  # legacy: numpy ufunc as op, result returned
        r4 = nisa.tensor_reduce(np.add, xt, axis=(1,), keepdims=True)
        r3 -= 1.0
        r3 *= yt
        out = nl.ndarray((4, 128, 64), nl.float32, buffer=nl.shared_hbm)
        for k, r in enumerate((r1, r2, r3, nl.broadcast_to(r4, (128, 64)))):
            nl.store(out[k], r)
        return out

    out, _ = run(kernel, a, b)
    np.testing.assert_allclose(out[0], (a + b) * 2 - b / a, rtol=1e-6)
    np.testing.assert_allclose(out[1], 1 - a ** 2 - b, rtol=1e-5)
    np.testing.assert_allclose(out[2], (np.maximum(a, b) - 1) * b, rtol=1e-6)
    assert_close_to_reference(out[3], np.broadcast_to(a.astype(np.float64).sum(axis=1, keepdims=True), (128, 64)),
                              sum_tolerance(a, 1, keepdims=True))


def test_assignments_copy_fill_and_retarget():
    a = RNG.normal(size=(128, 64)).astype(np.float32)

    def kernel(x):
        t = nl.ndarray((128, 64), nl.float32)
        t[...] = nl.load(x)  # temporary: the DMA writes t directly
        held = nl.exp(t)
        u = nl.ndarray((128, 64), nl.float32)
        u[...] = held  # still referenced: a tensor_copy
        u[:, 0:8] = 0.5  # scalar: memset
        out = nl.ndarray((2, 128, 64), nl.float32, buffer=nl.shared_hbm)
        out[0] = u  # HBM target: DMA
        nl.store(out[1], held)
        return out

    out, record = run(kernel, a)
    expect = np.exp(a)
    expect[:, :8] = 0.5
    np.testing.assert_allclose(out[0], expect, rtol=1e-6)
    np.testing.assert_allclose(out[1], np.exp(a), rtol=1e-6)
    assert opcodes(record) == ["dma_copy", "activation", "tensor_copy", "memset", "dma_copy", "dma_copy"]


def test_retargeting_holds_under_dynamos_frame_hook():
    # A torch.compile that fails (torch 2.13) leaves Dynamo's frame-evaluation hook
    # installed; with it, Python calls hold one more reference to their arguments.
    # Temporaries must still be recognised (and held values still copied) afterwards.
    # A child process keeps the hook out of the other tests.
    script = textwrap.dedent("""
        import numpy as np, torch
        import torchneuron.nki as nki, torchneuron.nki.language as nl
        from torchneuron.testing import matmul_tolerance
        def failing_backend(gm, example_inputs):
            raise ValueError("fails on purpose")
        try:
            torch.compile(lambda x: x + 1, backend=failing_backend)(torch.ones(2))
        except Exception:
            pass

        @nki.jit
        def kernel(x, w):
            t = nl.ndarray((128, 128), nl.float32)
            t[...] = nl.load(x)          # temporary: the DMA writes t
            held = nl.exp(t)
            u = nl.ndarray((128, 128), nl.float32)
            u[...] = held                # held by a name: a tensor_copy
            acc = nl.zeros((128, 128), nl.float32, buffer=nl.psum)
            acc += nl.matmul(t, nl.load(w), transpose_x=True)  # temporary: the matmul writes acc
            out = nl.ndarray((2, 128, 128), nl.float32, buffer=nl.shared_hbm)
            nl.store(out[0], u)
            nl.store(out[1], nl.copy(acc))
            return out

        rng = np.random.default_rng(0)
        a, w = (rng.normal(size=(128, 128)).astype(np.float32) for _ in range(2))
        out = nki.simulate(kernel, target="trn2")(a, w)
        assert np.allclose(out[0], np.exp(a), rtol=1e-6)
        assert (np.abs(out[1] - a.T.astype(np.float64) @ w) <= matmul_tolerance(a.T, w)).all()
        print(" ".join(i.opcode for i in kernel.last_run.instructions[:6]))
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split()[-6:] == ["dma_copy", "activation", "tensor_copy", "memset", "dma_copy",
                                        "nc_matmul"]


def test_accumulate_into_hbm_is_rejected():
    def kernel(x):
        x += nl.load(x)

    with pytest.raises(NkiValidationError, match="'\\+=' on HBM"):
        run(kernel, np.zeros((128, 4), np.float32))


# ----------------------------------------------------------------------- SPMD grids
@nki.jit
def spmd_kernel(a):
    b = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    i = nl.program_id(0)
    j = nl.program_id(1)
    a_tile = nl.load(a[i, j])
    nl.store(b[i, j], nl.add(a_tile, float(nl.num_programs(0) * 10 + nl.num_programs(1))))
    return b


@pytest.mark.parametrize("grid", [(4, 2), (nl.spmd_dim(nl.nc(2), 2), 2), (nl.nc(2) * 2, 2)])
def test_spmd_grid_program_ids(grid):
    src = RNG.random((4, 2, 1, 1)).astype(np.float32) * 100
    with pytest.warns(DeprecationWarning, match="SPMD launch grids are legacy"):
        dst = spmd_kernel[grid](src)
    np.testing.assert_allclose(dst, src + 42, rtol=1e-6)
    assert {i.program for i in spmd_kernel.last_run.instructions} == set(range(8))


def test_num_programs_default_counts_every_axis_of_a_legacy_grid():
    seen = []

    @nki.jit
    def kernel():
        seen.append((nl.program_ndim(), nl.num_programs(), nl.num_programs(axes=0), nl.num_programs(axes=None)))

    with pytest.warns(DeprecationWarning):
        nki.simulate(kernel[2, 3], target="trn2")()
    assert set(seen) == {(2, 6, 2, 6)}
    seen.clear()
    nki.simulate(kernel[2], target="trn2")()
    assert set(seen) == {(1, 2, 2, 2)}


def test_legacy_benchmark_placeholder_shapes():
    lhsT = nt.tensor[[512, 256], nl.bfloat16]
    rhs = nt.tensor[[512, 512], nl.bfloat16]
    out = nki.simulate(matmul_legacy_tiled, target="trn2")(lhsT.numpy("random"), rhs.numpy("random"))
    assert out.shape == (256, 512) and out.dtype == BF16


def test_retarget_of_compute_results():
    a = RNG.normal(size=(128, 32)).astype(np.float32)

    def kernel(x):
        t = nl.load(x)
        u = nl.ndarray((128, 32), nl.float32)
        u[...] = nl.exp(t)  # same start partition: the activation's dst becomes u
        u[32:64, :] = nl.exp(t[0:32, :])  # another start partition: re-issued into u[32:64] (checked)
        v = nl.ndarray((128, 32), nl.bfloat16)
        v[...] = nl.exp(t)  # dtype differs: computed in fp32 tile, then a converting copy
        out = nl.ndarray((2, 128, 32), nl.float32, buffer=nl.shared_hbm)
        nl.store(out[0], u)
        nl.store(out[1], nl.copy(v, nl.float32))
        return out

    out, record = run(kernel, a)
    expect = np.exp(a)
    expect[32:64] = np.exp(a[0:32])
    np.testing.assert_allclose(out[0], expect, rtol=1e-6)
    np.testing.assert_allclose(out[1], np.exp(a).astype(BF16).astype(np.float32), rtol=1e-6)
    assert opcodes(record) == ["dma_copy", "activation", "activation", "activation", "tensor_copy",
                               "dma_copy", "tensor_copy", "dma_copy"]
    u_alloc = record.instructions[1].writes[0].allocation
    assert record.instructions[2].writes[0].allocation == u_alloc
    assert record.instructions[2].writes[0].start_partition == 32


def test_lnc2_programs_share_their_output():
    a = RNG.normal(size=(256, 64)).astype(np.float32)

    @nki.jit
    def kernel(x):
        out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
        rows = x.shape[0] // nl.num_programs()
        i = nl.program_id(0)
        t = nl.load(x[i * rows:(i + 1) * rows, :])
        nl.store(out[i * rows:(i + 1) * rows, :], nl.multiply(t, float(i + 1)))
        return out

    out = nki.simulate(kernel[2], target="trn2")(a)
    np.testing.assert_allclose(out[:128], a[:128], rtol=1e-6)
    np.testing.assert_allclose(out[128:], 2 * a[128:], rtol=1e-6)


def test_fori_and_while_loops_with_registers():
    def kernel():
        acc = nl.zeros((1, 1), nl.int32)
        count = nl.full((1, 1), 3, nl.int32)
        reg = nisa.register_alloc()
        nisa.register_load(reg, count)
        seen = []

        def body(i):
            assert isinstance(i, nisa.VirtualRegister)
            seen.append(i.value)
            acc[...] = nl.add(acc, 1)

        nl.fori_loop(0, reg, body, step=1)

        def countdown(r):
            count[...] = nl.subtract(count, 1)
            nisa.register_load(r, count)
            return r

        nl.while_loop(reg, countdown)
        assert seen == [0, 1, 2] and reg.value == 0
        out = nl.ndarray((1, 2), nl.int32, buffer=nl.shared_hbm)
        nl.store(out[:, 0:1], acc)
        nl.store(out[:, 1:2], count)
        return out

    out, _ = run(kernel)
    assert out.tolist() == [[3, 0]]


def test_legacy_dtype_argument_adds_a_cast_instruction():
    # Legacy return-style calls given another dtype get "an additional cast instruction".
    a = RNG.normal(size=(64, 32)).astype(np.float32)

    def kernel(x):
        t = nl.load(x)
        flipped = nisa.nc_transpose(t, dtype=nl.bfloat16)
        same = nisa.nc_transpose(t, dtype=nl.float32)  # no cast when the dtype is unchanged
        out = nl.ndarray((2, 32, 64), nl.float32, buffer=nl.shared_hbm)
        nl.store(out[0], nl.copy(flipped, nl.float32))
        nl.store(out[1], nl.copy(same, nl.float32))
        return out

    out, record = run(kernel, a)
    np.testing.assert_array_equal(out[0], a.T.astype(BF16).astype(np.float32))
    np.testing.assert_array_equal(out[1], a.T)
    # load; transpose + bf16 cast; transpose (no cast); the two nl.copy calls and stores
    written = [(i.opcode, i.writes[0].dtype) for i in record.instructions]
    assert written == [("dma_copy", "float32"), ("nc_transpose", "float32"), ("tensor_copy", "bfloat16"),
                       ("nc_transpose", "float32"), ("tensor_copy", "float32"), ("dma_copy", "float32"),
                       ("tensor_copy", "float32"), ("dma_copy", "float32")]


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
