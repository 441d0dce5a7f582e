"""MX instructions (torchneuron/nki/isa/mx_ops.py, torchneuron/nki/mx.py): the packed x4 dtypes,
``nc_matmul_mx`` and ``quantize_mx`` on trn3 against NumPy references written from NKI's documented
behaviour (OCP MX: 32-value groups of 8 partitions x 4 quad lanes, E8M0 scales ``2**(c - 127)``, scales
in row ``32 * (p // 32) + (p % 32) // 8`` of the data's quadrant; quantize_mx's scale
``2**(floor(log2 amax) - (E_max - 1))``), and their refusal on targets without MX."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest

import torchneuron.nki as nki
import torchneuron.nki.isa as nisa
import torchneuron.nki.language as nl
from torchneuron.hardware.specs import get_chip
from torchneuron.nki import registry
from torchneuron.nki.cost import CostOptions
from torchneuron.nki.cost.model import CostModel
from torchneuron.nki.errors import NkiValidationError
from torchneuron.nki.memory import Buffer

from nki_isa_support import fails as _fails, put as _put, run as _run, tile as _tile

SBUF, PSUM = Buffer.sbuf, Buffer.psum
ELEMENT = {"float8_e4m3fn_x4": ml_dtypes.float8_e4m3fn, "float8_e5m2_x4": ml_dtypes.float8_e5m2,
           "float4_e2m1fn_x4": ml_dtypes.float4_e2m1fn}
RNG = np.random.default_rng(7)


# ---------------------------------------------------------------------------- the reference
def _codes(shape, dtype):
    """Random finite element codes (one per byte) of an MX element type."""
    if dtype == "float4_e2m1fn_x4":
        return RNG.integers(0, 16, shape, dtype=np.uint8)
    codes = RNG.integers(0, 256, shape, dtype=np.uint8)
    values = codes.view(ELEMENT[dtype]).astype(np.float32)
    codes[~np.isfinite(values)] = 0
    return codes


def _words(codes, dtype):
    """``[P, F, 4]`` element codes packed into x4 words: lane j at bits 8j (fp8) or 4j (fp4), as AWS's
    MXFP guide packs them (fp8: four bytes viewed as one little-endian uint32; fp4: low nibble first)."""
    bits = 4 if dtype == "float4_e2m1fn_x4" else 8
    word = np.uint16 if bits == 4 else np.uint32
    out = np.zeros(codes.shape[:2], dtype=np.uint64)
    for lane in range(4):
        out |= codes[:, :, lane].astype(np.uint64) << np.uint64(bits * lane)
    return out.astype(word)


def _values(codes, dtype):
    return codes.view(ELEMENT[dtype]).astype(np.float64)


def _row(p):
    return 32 * (p // 32) + (p % 32) // 8


def _expand(scale_tile, partitions):
    """Per data partition p, the factor ``2**(c - 127)`` of its group's scale row."""
    return np.stack([2.0 ** (scale_tile[_row(p)].astype(np.float64) - 127) for p in range(partitions)])


def _reference_matmul(s_codes, s_scale, s_dtype, m_codes, m_scale, m_dtype):
    p = s_codes.shape[0]
    x = _values(s_codes, s_dtype) * _expand(s_scale, p)[:, :, None]
    y = _values(m_codes, m_dtype) * _expand(m_scale, p)[:, :, None]
    return np.einsum("pmj,pnj->mn", x, y)


def _scales(partitions, free, low=118, high=136):
    """A scale tile of ``partitions`` rows; rows no group uses hold garbage the instruction must ignore."""
    return RNG.integers(low, high, (partitions, free), dtype=np.uint8)


def _mx_operands(p, free, dtype, scale_rows=None):
    codes = _codes((p, free, 4), dtype)
    scale = _scales(scale_rows or p, free)
    return codes, scale


# ---------------------------------------------------------------------------- dtypes
def test_packed_mx_dtypes_are_nki_names_with_their_word_sizes():
    import torchneuron.nki.dtype as nt

    for name, size in (("float8_e4m3fn_x4", 4), ("float8_e5m2_x4", 4), ("float4_e2m1fn_x4", 2)):
        dtype = getattr(nl, name)
        assert getattr(nt, name) is dtype and name in nl.__all__
        assert dtype.itemsize == size and dtype == name and str(dtype) == name


def test_a_module_that_only_mentions_the_x4_types_imports(tmp_path):
    import subprocess
    import sys

    path = tmp_path / "mentions.py"
    path.write_text("import torchneuron.nki\nimport nki.language as nl\n"
                    "KINDS = {nl.float8_e4m3fn_x4, nl.float8_e5m2_x4, nl.float4_e2m1fn_x4}\nprint(len(KINDS))\n")
    import os
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    done = subprocess.run([sys.executable, str(path)], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "3"


# ---------------------------------------------------------------------------- nc_matmul_mx
@pytest.mark.parametrize("s_dtype, m_dtype", [("float8_e4m3fn_x4", "float8_e5m2_x4"),
                                              ("float4_e2m1fn_x4", "float8_e4m3fn_x4"),
                                              ("float4_e2m1fn_x4", "float4_e2m1fn_x4")])
def test_nc_matmul_mx_dequantises_each_group_and_contracts_partitions_and_quad_lanes(s_dtype, m_dtype):
    p, m, n = 128, 64, 96
    s_codes, s_scale = _mx_operands(p, m, s_dtype)
    m_codes, m_scale = _mx_operands(p, n, m_dtype)
    got = {}

    def kernel():
        dst = _tile((m, n), "float32", PSUM)
        nisa.nc_matmul_mx(dst=dst, stationary=_put(_words(s_codes, s_dtype), s_dtype),
                          moving=_put(_words(m_codes, m_dtype), m_dtype),
                          stationary_scale=_put(s_scale.view(ml_dtypes.float8_e8m0fnu) if m_dtype != s_dtype
                                                else s_scale),
                          moving_scale=_put(m_scale, "uint8"))
        got["out"] = dst.values().copy()
    _run(kernel, target="trn3")
    want = _reference_matmul(s_codes, s_scale, s_dtype, m_codes, m_scale, m_dtype)
    np.testing.assert_allclose(got["out"], want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


def test_nc_matmul_mx_accumulates_into_bf16_psum_with_compact_scales_of_one_quadrant():
    """32 partitions keep their 4 scale rows in a [4, F] tile; a second matmul adds to the open group."""
    p, m, n = 32, 16, 40
    parts = [(_mx_operands(p, m, "float8_e4m3fn_x4", 4), _mx_operands(p, n, "float8_e5m2_x4", 4))
             for _ in range(2)]
    got = {}

    def kernel():
        dst = _tile((m, n), "bfloat16", PSUM)
        for (s_codes, s_scale), (m_codes, m_scale) in parts:
            nisa.nc_matmul_mx(dst, _put(_words(s_codes, "float8_e4m3fn_x4"), "float8_e4m3fn_x4"),
                              _put(_words(m_codes, "float8_e5m2_x4"), "float8_e5m2_x4"),
                              _put(s_scale, "uint8"), _put(m_scale, "uint8"))
        got["out"] = dst.values().astype(np.float32)
    _run(kernel, target="trn3")
    want = sum(_reference_matmul(s_c, s_s, "float8_e4m3fn_x4", m_c, m_s, "float8_e5m2_x4")
               for (s_c, s_s), (m_c, m_s) in parts)
    np.testing.assert_allclose(got["out"], want, rtol=2 ** -7, atol=2 ** -7 * np.abs(want).max())


def test_nc_matmul_mx_reads_scales_packed_at_a_quadrant_offset():
    """The MXFP guide packs two tensors' scales in one tile: the second at 4 partitions into each quadrant."""
    p, m, n = 64, 32, 32
    s_codes, m_codes = _codes((p, m, 4), "float8_e4m3fn_x4"), _codes((p, n, 4), "float8_e4m3fn_x4")
    packed = _scales(p, max(m, n))
    got = {}

    def kernel():
        dst = _tile((m, n), "float32", PSUM)
        scales = _put(packed, "uint8")
        nisa.nc_matmul_mx(dst, _put(_words(s_codes, "float8_e4m3fn_x4"), "float8_e4m3fn_x4"),
                          _put(_words(m_codes, "float8_e4m3fn_x4"), "float8_e4m3fn_x4"),
                          scales[0:, 0:m], scales[4:, 0:n])
        got["out"] = dst.values().copy()
    _run(kernel, target="trn3")
    want = _reference_matmul(s_codes, packed[:, :m], "float8_e4m3fn_x4", m_codes, packed[4:, :n],
                             "float8_e4m3fn_x4")
    np.testing.assert_allclose(got["out"], want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


def test_nc_matmul_mx_from_a_kernel_loading_uint32_words_viewed_as_x4():
    @nki.jit
    def mx_matmul(s_words, s_scale, m_words, m_scale):
        st = nl.load(s_words.view(nl.float8_e5m2_x4))
        mv = nl.load(m_words.view(nl.float8_e5m2_x4))
        acc = nl.ndarray((st.shape[1], mv.shape[1]), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_matmul_mx(dst=acc, stationary=st, moving=mv, stationary_scale=nl.load(s_scale),
                          moving_scale=nl.load(m_scale))
        out = nl.ndarray(acc.shape, dtype=nl.float32, buffer=nl.shared_hbm)
        nl.store(out, value=nl.copy(acc))
        return out

    s_codes, s_scale = _mx_operands(128, 128, "float8_e5m2_x4")
    m_codes, m_scale = _mx_operands(128, 512, "float8_e5m2_x4")
    out = nki.simulate(mx_matmul, target="trn3")(_words(s_codes, "float8_e5m2_x4"), s_scale,
                                                 _words(m_codes, "float8_e5m2_x4"), m_scale)
    want = _reference_matmul(s_codes, s_scale, "float8_e5m2_x4", m_codes, m_scale, "float8_e5m2_x4")
    np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


def _matmul_mx_call(p=128, m=64, n=64, s_dtype="float8_e4m3fn_x4", scale_rows=None, scale_start=0, **kwargs):
    def kernel():
        s_codes, s_scale = _mx_operands(p, m, s_dtype, scale_rows)
        m_codes, m_scale = _mx_operands(p, n, "float8_e4m3fn_x4")
        scales = _put(s_scale, "uint8")
        nisa.nc_matmul_mx(_tile((m, n), "float32", PSUM), _put(_words(s_codes, s_dtype), s_dtype),
                          _put(_words(m_codes, "float8_e4m3fn_x4"), "float8_e4m3fn_x4"),
                          scales[scale_start:], _put(m_scale, "uint8"), **kwargs)
    return kernel


@pytest.mark.parametrize("call, needles", [
    (_matmul_mx_call(p=96), ("spans 96 partitions", "32, 64 or 128")),
    (_matmul_mx_call(m=63), ("stationary free size is 63", "even")),
    (_matmul_mx_call(scale_rows=99), ("stationary_scale", "spans 99 partitions", "at least 100")),
    (_matmul_mx_call(scale_start=2), ("starts at partition 2", "0, 4, 8 or 12")),
    (_matmul_mx_call(tile_position=(0, 64), tile_size=(64, 64)), ("row tiling only",)),
])
def test_nc_matmul_mx_enforces_its_documented_layout(call, needles):
    _fails(call, *needles, target="trn3")


def test_nc_matmul_refuses_packed_tiles_and_points_at_nc_matmul_mx():
    def kernel():
        words = _put(np.zeros((32, 8), np.uint32), "float8_e4m3fn_x4")
        nisa.nc_matmul(_tile((8, 8), "float32", PSUM), words, words)
    _fails(kernel, "float8_e4m3fn_x4", "nisa.nc_matmul_mx", target="trn3")


# ---------------------------------------------------------------------------- quantize_mx
def _reference_quantize(values, dtype):
    """Codes [P, F, 4] and scale codes [P // 8, F] per quantize_mx's documented formula."""
    e_max = {"float8_e4m3fn_x4": 8, "float8_e5m2_x4": 15}[dtype]
    p, f, _ = values.shape
    codes = np.zeros(values.shape, np.uint8)
    scales = np.zeros((p // 8, f), np.uint8)
    for g in range(p // 8):
        for c in range(f):
            block = values[8 * g:8 * g + 8, c, :].astype(np.float64)
            amax = np.abs(block).max()
            exp = -127 if amax == 0 else max(-127, min(127, math.floor(math.log2(amax)) - (e_max - 1)))
            scales[g, c] = exp + 127
            codes[8 * g:8 * g + 8, c, :] = (block / 2.0 ** exp).astype(ELEMENT[dtype]).view(np.uint8)
    return codes, scales


def _unpack_fp8(words):
    return np.stack([(words >> np.uint32(8 * lane)) & np.uint32(0xFF) for lane in range(4)], -1).astype(np.uint8)


@pytest.mark.parametrize("dtype", ["float8_e4m3fn_x4", "float8_e5m2_x4"])
@pytest.mark.parametrize("src_dtype", ["bfloat16", "float16"])
def test_quantize_mx_follows_the_documented_scale_formula(dtype, src_dtype):
    p, f = 64, 24
    src = (RNG.standard_normal((p, f * 4)) * np.exp2(RNG.integers(-6, 6, (p, 1)))).astype(np.float32)
    src[0:8, 0:4] = 0.0  # an all-zero group: scale 2**-127
    src = src.astype(ml_dtypes.bfloat16 if src_dtype == "bfloat16" else np.float16)
    got = {}

    def kernel():
        dst, scale = _tile((p, f), dtype), _tile((p, f), "float8_e8m0fnu")
        nisa.quantize_mx(dst=dst, src=_put(src, src_dtype), dst_scale=scale)
        got["words"], got["scale"] = dst.values().copy(), scale.values().view(np.uint8).copy()
    _run(kernel, target="trn3", uninitialized="ignore")
    codes, scales = _reference_quantize(src.astype(np.float32).reshape(p, f, 4), dtype)
    np.testing.assert_array_equal(_unpack_fp8(got["words"]), codes)
    rows = [_row(q) for q in range(0, p, 8)]
    np.testing.assert_array_equal(got["scale"][rows], scales)
    assert scales[0, 0] == 0


def test_quantize_mx_writes_only_its_scale_rows_so_two_tensors_share_a_tile():
    p, f = 128, 16
    a, b = (RNG.standard_normal((p, 4 * f)).astype(ml_dtypes.bfloat16) for _ in range(2))
    got = {}

    def kernel():
        scales = _put(np.full((p, f), 7, np.uint8), "uint8")
        qa, qb = _tile((p, f), "float8_e4m3fn_x4"), _tile((p, f), "float8_e4m3fn_x4")
        nisa.quantize_mx(qa, _put(a, "bfloat16"), scales[0:])
        nisa.quantize_mx(qb, _put(b, "bfloat16"), scales[4:])
        got["scale"] = scales.values().copy()
    _run(kernel, target="trn3")
    _, sa = _reference_quantize(a.astype(np.float32).reshape(p, f, 4), "float8_e4m3fn_x4")
    _, sb = _reference_quantize(b.astype(np.float32).reshape(p, f, 4), "float8_e4m3fn_x4")
    rows = np.array([_row(q) for q in range(0, p, 8)])
    np.testing.assert_array_equal(got["scale"][rows], sa)
    np.testing.assert_array_equal(got["scale"][rows + 4], sb)
    untouched = np.setdiff1d(np.arange(p), np.concatenate([rows, rows + 4]))
    assert (got["scale"][untouched] == 7).all()


def test_quantize_then_matmul_mx_approximates_the_bf16_product():
    k, m, n = 512, 128, 256
    x = RNG.standard_normal((k, m)).astype(np.float32)
    y = RNG.standard_normal((k, n)).astype(np.float32)

    def interleave(a):  # contraction k = 128 j + p -> partition p, quad lane j (trainium3 arch guide)
        return a.reshape(4, 128, -1).transpose(1, 2, 0).reshape(128, -1).astype(ml_dtypes.bfloat16)

    got = {}

    def kernel():
        qx, sx = _tile((128, m), "float8_e4m3fn_x4"), _tile((128, m), "uint8")
        qy, sy = _tile((128, n), "float8_e4m3fn_x4"), _tile((128, n), "uint8")
        nisa.quantize_mx(qx, _put(interleave(x), "bfloat16"), sx)
        nisa.quantize_mx(qy, _put(interleave(y), "bfloat16"), sy)
        dst = _tile((m, n), "float32", PSUM)
        nisa.nc_matmul_mx(dst, qx, qy, sx, sy)
        got["out"] = dst.values().copy()
    _run(kernel, target="trn3")
    want = x.T.astype(np.float64) @ y
    # e4m3 keeps 3 mantissa bits: a value rounds by at most 2**-4 relative (rms ~0.036), a product by ~0.05
    error = np.sqrt(np.mean((got["out"] - want) ** 2) / np.mean(want ** 2))
    assert error < 0.08


@pytest.mark.parametrize("make, needles", [
    (lambda: (_tile((32, 8), "float4_e2m1fn_x4"), _put(np.ones((32, 32), ml_dtypes.bfloat16)), _tile((4, 8), "uint8")),
     ("float4_e2m1fn_x4", "no fp4 output")),
    (lambda: (_tile((32, 8), "float8_e4m3fn_x4"), _put(np.ones((32, 32), np.float32)), _tile((4, 8), "uint8")),
     ("float32", "bfloat16 or float16")),
    (lambda: (_tile((32, 4), "float8_e4m3fn_x4"), _put(np.ones((32, 32), ml_dtypes.bfloat16)), _tile((4, 4), "uint8")),
     ("dst has shape [32, 4]", "32 partitions of 8")),
    (lambda: (_tile((16, 8), "float8_e4m3fn_x4"), _put(np.ones((16, 32), ml_dtypes.bfloat16)), _tile((2, 8), "uint8")),
     ("spans 16 partitions",)),
])
def test_quantize_mx_enforces_its_documented_rules(make, needles):
    def kernel():
        dst, src, scale = make()
        nisa.quantize_mx(dst, src, scale)
    _fails(kernel, *needles, target="trn3")


# ---------------------------------------------------------------------------- packed tiles elsewhere
def test_packed_tiles_memset_to_zero_only_and_are_no_engine_operand():
    got = {}

    def zeroed():
        t = _tile((32, 8), "float8_e5m2_x4")
        nisa.memset(t, 0.0)
        got["bits"] = t.values().copy()
    _run(zeroed, target="trn3")
    assert got["bits"].dtype == np.uint32 and not got["bits"].any()

    def nonzero():
        nisa.memset(_tile((32, 8), "float8_e5m2_x4"), 1.0)
    _fails(nonzero, "can only be memset to 0", target="trn3")

    def arithmetic():
        words = _put(np.zeros((32, 8), np.uint32), "float8_e4m3fn_x4")
        nisa.tensor_copy(dst=_tile((32, 8), "float32"), src=words)
    _fails(arithmetic, "packed MX type", "only nisa.nc_matmul_mx reads its values", target="trn3")


# ---------------------------------------------------------------------------- targets without MX
@pytest.mark.parametrize("target", ["trn1", "trn2"])
def test_mx_is_refused_on_targets_without_it_naming_the_target(target):
    def matmul():
        nisa.nc_matmul_mx(None, None, None, None, None)
    _fails(matmul, "nc_matmul_mx is available only on NeuronCore-v4 (trn3)", f"target {target}", target=target)

    def quantize():
        nisa.quantize_mx(None, None, None)
    _fails(quantize, "quantize_mx is available only on NeuronCore-v4", f"target {target}", target=target)

    @nki.jit
    def mx_load(words):
        out = nl.ndarray(words.shape, dtype=words.dtype, buffer=nl.shared_hbm)
        nl.store(out, value=nl.load(words.view(nl.float8_e4m3fn_x4)).view(nl.uint32))
        return out

    with pytest.raises(NkiValidationError, match=f"packed MX type.*target {target} is NeuronCore-v"):
        nki.simulate(mx_load, target=target)(np.zeros((32, 8), np.uint32))

    @nki.jit
    def mx_tile(words):
        t = nl.ndarray((32, 8), dtype=nl.float4_e2m1fn_x4, buffer=nl.sbuf)
        return words

    with pytest.raises(NkiValidationError, match=f"float4_e2m1fn_x4 is a packed MX type.*target {target}"):
        nki.simulate(mx_tile, target=target)(np.zeros((32, 8), np.uint32))


def test_mx_load_on_trn3_moves_the_words_bit_for_bit():
    @nki.jit
    def mx_load(words):
        out = nl.ndarray(words.shape, dtype=words.dtype, buffer=nl.shared_hbm)
        nl.store(out, value=nl.load(words.view(nl.float8_e4m3fn_x4)).view(nl.uint32))
        return out

    words = RNG.integers(0, 2 ** 32, (32, 8), dtype=np.uint32)
    np.testing.assert_array_equal(nki.simulate(mx_load, target="trn3")(words), words)


# ---------------------------------------------------------------------------- declarations and cost
def test_mx_instructions_are_one_declaration_each_with_a_cost():
    for name, engine in (("nc_matmul_mx", "tensor"), ("quantize_mx", "vector")):
        spec = registry.spec(name)
        assert spec.min_version == 4 and spec.simulated and spec.engines == (engine,)


def test_mx_cost_counts_four_values_per_quad():
    """nc_matmul_mx: nc_matmul's cycles on the x4 sizes, 4x the FLOPs ("v4 MX matmul gives 4x", facts 9);
    quantize_mx: four source elements per partition per cycle (trainium3 architecture guide)."""
    p, m, n, f = 128, 128, 512, 2048
    src = RNG.standard_normal((p, f)).astype(ml_dtypes.bfloat16)

    def kernel():
        q, s = _tile((p, f // 4), "float8_e4m3fn_x4"), _tile((p, f // 4), "uint8")
        nisa.quantize_mx(q, _put(src, "bfloat16"), s)
        nisa.nc_matmul_mx(_tile((m, n), "float32", PSUM), q[:, 0:m], q[:, 0:n], s[:, 0:m], s[:, 0:n])
    run = _run(kernel, target="trn3")
    model = CostModel(get_chip("trn3"), CostOptions())
    quant = next(i for i in run.instructions if i.opcode == "quantize_mx")
    matmul = next(i for i in run.instructions if i.opcode == "nc_matmul_mx")
    assert matmul.flops == 2 * (4 * p) * m * n
    assert model.cost(quant).cycles == f / 4
    assert model.cost(matmul).cycles == max(min(64, m), n)
