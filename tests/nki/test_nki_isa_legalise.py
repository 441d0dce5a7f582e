"""Legacy kernels that relied on the legacy NKI compiler's inserted copies (issue 17).

A PSUM tile fed to TensorE or GpSimd is legal only after a copy to SBUF, which the
legacy toolchain inserted: a kernel file importing ``neuronxcc.nki`` runs, with the
copy simulated, recorded (so costed) and noted once; the same kernel written against
current ``nki`` is still refused with the architectural rule.
"""

import importlib.util
import warnings

import numpy as np
import pytest

import torchneuron.nki as nki
from torchneuron.nki import NkiValidationError
from torchneuron.nki.isa.legalise import LegacyLegalisationNote
from torchneuron.testing import assert_close_to_reference, matmul_tolerance

KERNELS = '''
{imports}

@nki.jit
def qk_then_pv(q, k, v):
    """Attention on one tile: nl.transpose's PSUM result is the moving operand of nl.matmul."""
    out = nl.ndarray((q.shape[1], q.shape[0]), dtype=q.dtype, buffer=nl.shared_hbm)
    scores = nl.copy(nl.matmul(nl.load(q), nl.load(k), transpose_x=True))
    v_t = nl.transpose(nl.load(v))
    nl.store(out, value=nl.copy(nl.matmul(scores, v_t)))
    return out


@nki.jit
def qk_then_pv_explicit(q, k, v):
    """qk_then_pv with the copy to SBUF written out, as current NKI requires."""
    out = nl.ndarray((q.shape[1], q.shape[0]), dtype=q.dtype, buffer=nl.shared_hbm)
    scores = nl.copy(nl.matmul(nl.load(q), nl.load(k), transpose_x=True))
    v_t = nl.copy(nl.transpose(nl.load(v)))
    nl.store(out, value=nl.copy(nl.matmul(scores, v_t)))
    return out


@nki.jit
def causal_mask_of_matmul(a, b):
    """affine_select (GpSimd) straight on a matmul result in PSUM."""
    n = a.shape[1]
    out = nl.ndarray((n, n), dtype=nl.float32, buffer=nl.shared_hbm)
    scores = nl.matmul(nl.load(a), nl.load(b), transpose_x=True)
    i_p, i_f = nl.mgrid[0:n, 0:n]
    masked = nisa.affine_select(pred=(i_p - i_f >= 0), on_true_tile=scores, on_false_value=-9984.0)
    nl.store(out, value=masked)
    return out


@nki.jit
def int_partition_broadcast(a):
    """An int32 [1, F] row broadcast across 128 partitions."""
    out = nl.ndarray((128, a.shape[1]), dtype=a.dtype, buffer=nl.shared_hbm)
    nl.store(out, value=nl.broadcast_to(nl.load(a), (128, a.shape[1])))
    return out


@nki.jit
def rotating_blocks(a):
    """Four 128-row blocks through a block tensor whose manual allocation rotates over 2 slots."""
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    blocks = nl.ndarray((4, nl.par_dim(128), a.shape[1]), dtype=a.dtype,
                        buffer=nki.compiler.sbuf.mod_alloc(base_addr=0, num_free_tiles=(2,)))
    for b in nl.affine_range(4):
        blocks[b] = nl.load(a[b * 128:(b + 1) * 128, :])
        nl.store(out[b * 128:(b + 1) * 128, :], value=nl.multiply(blocks[b], 2.0))
    return out


@nki.jit
def psum_blocks_all_live(a, b):
    """Twelve one-bank matmul results in a PSUM block tensor, all written before any is read
    (AWS's attention tutorial v3 keeps its qk scores this way)."""
    out = nl.ndarray((12, 128, 512), dtype=nl.float32, buffer=nl.shared_hbm)
    scores = nl.ndarray((12, nl.par_dim(128), 512), dtype=nl.float32, buffer=nl.psum)
    for i in nl.affine_range(12):
        scores[i] = nl.matmul(nl.load(a), nl.load(b), transpose_x=True)
    for i in nl.affine_range(12):
        nl.store(out[i], value=nl.copy(scores[i]))
    return out


@nki.jit
def masked_causal_psum(a, b, m, f):
    """affine_select on a PSUM matmul result under a legacy mask that keeps an m x f box (flash attention's
    masked affine_selects): the whole statement writes only inside the box."""
    n = a.shape[1]
    out = nl.ndarray((n, n), dtype=nl.float32, buffer=nl.shared_hbm)
    scores = nl.ndarray((n, n), dtype=nl.float32, buffer=nl.psum)
    scores[...] = nisa.nc_matmul(nl.load(a), nl.load(b))
    res = nl.full((n, n), 7.0, dtype=nl.float32, buffer=nl.sbuf)
    i_p, i_f = nl.mgrid[0:n, 0:n]
    res[...] = nisa.affine_select(pred=(i_p - i_f >= 0), on_true_tile=scores, on_false_value=-9984.0,
                                  mask=(i_p < m) & (i_f < f))
    nl.store(out, value=res)
    return out


@nki.jit
def keep_where(flag, x):
    """A bool kernel argument as a predicate (nl.bool_ is stored as a byte)."""
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    nl.store(out, value=nl.where(nl.load(flag), nl.load(x), 0.0))
    return out


@nki.jit
def zero_tail(x, valid):
    """Rows past ``valid`` zeroed by a memset of a slice that starts at partition ``valid``."""
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    t = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
    t[0:valid] = nl.load(x[0:valid])
    nisa.memset(dst=t[valid:x.shape[0]], value=0.0)
    nl.store(out, value=t)
    return out

'''
LEGACY = "import neuronxcc.nki as nki\nimport neuronxcc.nki.language as nl\nimport neuronxcc.nki.isa as nisa"
CURRENT = "import nki\nimport nki.language as nl\nimport nki.isa as nisa"


def _module(tmp_path, name, imports):
    path = tmp_path / f"{name}.py"
    path.write_text(KERNELS.format(imports=imports))
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def legacy(tmp_path):
    return _module(tmp_path, "legacy_attention_kernels", LEGACY)


@pytest.fixture
def current(tmp_path):
    return _module(tmp_path, "current_attention_kernels", CURRENT)


def _inputs(n=128, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((n, n)).astype(np.float32) for _ in range(3)]


def test_psum_moving_operand_is_copied_for_a_legacy_kernel(legacy):
    q, k, v = _inputs()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = nki.simulate(legacy.qk_then_pv, target="trn2")(q, k, v)
    scores = q.T @ k
    tolerance = matmul_tolerance(scores, v.T) + matmul_tolerance(q.T, k) @ np.abs(v.T)
    assert_close_to_reference(out, scores @ v.T, atol=tolerance)
    notes = [w for w in caught if issubclass(w.category, LegacyLegalisationNote)]
    assert len(notes) == 1 and "TensorE" in str(notes[0].message)
    # the inserted copy is the one current NKI wants written out (issued at the matmul that needs it)
    inserted = [(i.opcode, i.engine) for i in legacy.qk_then_pv.last_run.instructions]
    nki.simulate(legacy.qk_then_pv_explicit, target="trn2")(q, k, v)
    written = [(i.opcode, i.engine) for i in legacy.qk_then_pv_explicit.last_run.instructions]
    assert sorted(inserted) == sorted(written)


def test_psum_operand_of_gpsimd_is_copied_for_a_legacy_kernel(legacy):
    a, b, _ = _inputs(64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", LegacyLegalisationNote)
        out = nki.simulate(legacy.causal_mask_of_matmul, target="trn2")(a, b)
    scores = a.T @ b
    expected = np.where(np.tril(np.ones_like(scores, dtype=bool)), scores, np.float32(-9984.0))
    assert_close_to_reference(out, expected, atol=matmul_tolerance(a.T, b))


def test_current_kernel_keeps_the_strict_rule(current):
    q, k, v = _inputs()
    with pytest.raises(NkiValidationError, match="TensorE reads its inputs only from SBUF"):
        nki.simulate(current.qk_then_pv, target="trn2")(q, k, v)
    a, b, _ = _inputs(64)
    with pytest.raises(NkiValidationError, match="GpSimd cannot access"):
        nki.simulate(current.causal_mask_of_matmul, target="trn2")(a, b)


def test_inserted_copy_costs_what_the_written_copy_costs(legacy, current):
    q, k, v = _inputs()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", LegacyLegalisationNote)
        _, inserted = nki.profile(legacy.qk_then_pv, target="trn2")(q, k, v)
    _, written = nki.profile(current.qk_then_pv_explicit, target="trn2")(q, k, v)
    assert inserted.instruction_counts == written.instruction_counts
    assert inserted.engine_busy_ns == pytest.approx(written.engine_busy_ns)


def test_int32_partition_broadcast_is_exact_for_a_legacy_kernel(legacy, current):
    row = np.array([[2**31 - 1, -(2**31), 16777217, -3, 0]], np.int32)  # 16777217 is not a float32
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = nki.simulate(legacy.int_partition_broadcast, target="trn2")(row)
    assert out.dtype == np.int32 and np.array_equal(out, np.broadcast_to(row, (128, row.shape[1])))
    assert any(issubclass(w.category, LegacyLegalisationNote) for w in caught)
    assert [i.opcode for i in legacy.int_partition_broadcast.last_run.instructions].count("dma_copy") == 3
    with pytest.raises(NkiValidationError, match="takes float inputs"):
        nki.simulate(current.int_partition_broadcast, target="trn2")(row)


def test_manual_allocation_is_automatic_placement_for_a_legacy_kernel(legacy, current):
    a = np.random.default_rng(3).standard_normal((512, 64)).astype(np.float32)
    with pytest.warns(UserWarning, match=r"mod_alloc: legacy NKI's manual allocation is taken as sbuf"):
        out = nki.simulate(legacy.rotating_blocks, target="trn2")(a)
    assert np.array_equal(out, a * 2)
    with pytest.raises(NkiValidationError, match=r"allocators were removed in NKI 0\.2\.0"):
        nki.simulate(current.rotating_blocks, target="trn2")(a)


def test_psum_overflow_of_legacy_block_tiles_says_the_compiler_mapping_is_not_simulated(legacy, current):
    a = np.ones((128, 128), np.float32)
    b = np.ones((128, 512), np.float32)
    with pytest.raises(NkiValidationError, match="PSUM capacity exceeded") as info:
        nki.simulate(legacy.psum_blocks_all_live, target="trn2")(a, b)
    text = str(info.value)
    assert "logical blocks of legacy block tensors" in text and "not simulate" in text, text
    with pytest.raises(NkiValidationError, match="PSUM capacity exceeded") as info:
        nki.simulate(current.psum_blocks_all_live, target="trn2")(a, b)
    assert "legacy block tensors" not in str(info.value)


# ---------------------------------------------------------------------------- issue 28, item 10
def test_masked_affine_select_of_psum_writes_only_the_masked_box(legacy):
    a, b, _ = _inputs(128)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", LegacyLegalisationNote)
        out = nki.simulate(legacy.masked_causal_psum, target="trn2")(a, b, 100, 64)
    scores = a.T @ b
    expected = np.full_like(scores, 7.0)
    box = np.where(np.tril(np.ones_like(scores, dtype=bool)), scores, np.float32(-9984.0))
    expected[:100, :64] = box[:100, :64]
    assert_close_to_reference(out, expected, atol=matmul_tolerance(a.T, b))


def test_bool_kernel_arguments_are_bytes(legacy, current):
    rng = np.random.default_rng(3)
    flag, x = rng.random((128, 16)) > 0.5, rng.standard_normal((128, 16)).astype(np.float32)
    for module in (legacy, current):
        out = nki.simulate(module.keep_where, target="trn2")(flag, x)
        np.testing.assert_array_equal(out, np.where(flag, x, np.float32(0.0)))


def test_memset_of_a_slice_at_a_forbidden_start_partition_is_staged_for_a_legacy_kernel(legacy, current):
    x = np.random.default_rng(4).standard_normal((128, 8)).astype(np.float32)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = nki.simulate(legacy.zero_tail, target="trn2")(x, 100)
    expected = x.copy()
    expected[100:] = 0.0
    np.testing.assert_array_equal(out, expected)
    notes = [w for w in caught if issubclass(w.category, LegacyLegalisationNote)]
    assert len(notes) == 1 and "starts at partition 100" in str(notes[0].message)
    ops = [(i.opcode, i.engine) for i in legacy.zero_tail.last_run.instructions]
    assert ("memset", "vector") in ops and ops.index(("memset", "vector")) < len(ops) - 2
    assert ops[ops.index(("memset", "vector")) + 1][0] == "dma_copy"  # the staged constant moved into place
    with pytest.raises(NkiValidationError, match="starts at partition 100"):
        nki.simulate(current.zero_tail, target="trn2")(x, 100)
    # a start the rule allows needs no staging
    np.testing.assert_array_equal(nki.simulate(current.zero_tail, target="trn2")(x, 96)[96:], 0.0)
