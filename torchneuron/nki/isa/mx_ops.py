"""MX (microscaling) instructions of NeuronCore-v4: ``nc_matmul_mx`` on TensorE and
``quantize_mx`` on VectorE, over the packed x4 dtypes and E8M0 scale tiles of
:mod:`torchneuron.nki.mx` (layouts, packing and the quantisation formula are documented there).
Both are refused on trn1/trn2 before an argument is read, naming the target (their
declarations' ``min_version=4``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from torchneuron.nki import mx
from torchneuron.nki.cost import formulas as F
from torchneuron.nki.errors import fail
from torchneuron.nki.instruction import Engine
from torchneuron.nki.isa.core import (
    NkiInstruction, as_tensor, buffer_rule, engine_operand, fp32_values, instruction, raw_values, record,
    run_and_version,
)
from torchneuron.nki.isa.tensor_ops import MatmulShape, check_sizes, matmul_operands, matmul_values, sgemm, tiling
from torchneuron.nki.memory import Buffer
from torchneuron.nki.tensor import NkiTensor

_SCALE_DTYPES = ("float8_e8m0fnu", "uint8")  # nc_matmul_mx / quantize_mx stubs: e8m0 preferred, uint8 accepted
_MATMUL_PARTITIONS = (32, 64, 128)
_HINT = "use nc_matmul with fp8 or bf16 inputs on this target, or run with target='trn3'"


# ============================================================================ operand rules
def _data_partitions(instr: str, role: str, t: NkiTensor, allowed: tuple[int, ...]) -> int:
    partitions = t.shape[0]
    if partitions not in allowed:
        fail(instr, f"{role} {t.name!r} spans {partitions} partitions; MX data spans "
             f"{', '.join(map(str, allowed[:-1]))} or {allowed[-1]} partitions (whole 32-partition quadrants "
             "of 8-partition scaling groups)" + (
                 "; nc_matmul_mx takes 32, 64 or 128 (AWS's nki-library: 'supports partition dim of 32, 64, "
                 "128 but not 96'): pad the contraction with zeros" if allowed == _MATMUL_PARTITIONS else ""))
    return partitions


def _packed(instr: str, role: str, t: NkiTensor, fp8_only: bool = False) -> None:
    if not t.dtype.is_packed_mx or (fp8_only and t.dtype.name not in mx.E_MAX):
        kinds = "float8_e4m3fn_x4 or float8_e5m2_x4" if fp8_only else \
            "float8_e4m3fn_x4, float8_e5m2_x4 or float4_e2m1fn_x4"
        extra = " (quantize_mx has no fp4 output)" if fp8_only and t.dtype.is_packed_mx else ""
        fail(instr, f"{role} {t.name!r} is {t.dtype.name}; it must be a packed MX type, {kinds}{extra}")


def _scale_operand(instr: str, role: str, scale: Any, data: NkiTensor, data_role: str) -> NkiTensor:
    """A scale tile: SBUF, uint8/float8_e8m0fnu, in the data's quadrant at offset 0/4/8/12, with one
    column per x4 column of the data and rows for every scaling group (:mod:`torchneuron.nki.mx`)."""
    scale = as_tensor(instr, role, scale)
    buffer_rule(instr, role, scale, Buffer.sbuf, "MX scales are read from and written to SBUF")
    if scale.dtype.name not in _SCALE_DTYPES:
        fail(instr, f"{role} {scale.name!r} is {scale.dtype.name}; MX scales are float8_e8m0fnu (or uint8)")
    start, data_start = scale.start_partition, data.start_partition
    if start // mx.QUADRANT != data_start // mx.QUADRANT or start % mx.QUADRANT not in mx.SCALE_OFFSETS:
        fail(instr, f"{role} {scale.name!r} starts at partition {start}; the scales of {data_role} (from partition "
             f"{data_start}) start in its quadrant, at partition {data_start // 32 * 32} plus 0, 4, 8 or 12")
    needed = mx.scale_partitions(data.shape[0])
    if scale.shape[0] < needed:
        fail(instr, f"{role} {scale.name!r} spans {scale.shape[0]} partitions; {data_role}'s "
             f"{data.shape[0]} partitions keep their scales in rows 0-3 of each quadrant, so it must span at least "
             f"{needed} (allocate it with the data's partition count)")
    if scale.free_size != data.free_size:
        fail(instr, f"{role} {scale.name!r} has {scale.free_size} elements per partition; it holds one scale per "
             f"x4 element of {data_role}'s partition groups: {data.free_size}")
    return scale


def _scale_row_views(scale: NkiTensor, partitions: int) -> list[NkiTensor]:
    """The views of the rows of ``scale`` that data of ``partitions`` partitions uses, one per quadrant."""
    return [scale[first:first + count] for first, count in mx.scale_rows(partitions)]


# ============================================================================ nc_matmul_mx
def _expanded_factors(rows: list[NkiTensor], partitions: int, instr: str) -> np.ndarray:
    """Per data partition, the ``[P, F]`` float32 scale factors of its group."""
    parts = []
    for view, (first, count) in zip(rows, mx.scale_rows(partitions)):
        codes = raw_values(view, instr).view(np.uint8)
        span = min(mx.QUADRANT, partitions - first)
        parts.append(np.repeat(mx.scale_factors(codes), mx.GROUP_PARTITIONS, axis=0)[:span])
    return np.concatenate(parts, axis=0)


def _dequantized(instr: str, data: NkiTensor, rows: list[NkiTensor]) -> np.ndarray:
    """``[4P, F]``: the data's values times their scales, contraction index (quad lane, partition)."""
    values = mx.decode(raw_values(data, instr), data.dtype)  # [P, F, 4]
    values = values * _expanded_factors(rows, data.shape[0], instr)[:, :, None]
    return values.transpose(2, 0, 1).reshape(-1, values.shape[1])


def _mx_matmul_checks(instr: str, dst: NkiTensor, stationary: NkiTensor, moving: NkiTensor,
                      tile_position: Any, tile_size: Any, version: int) -> MatmulShape:
    for role, t in (("stationary", stationary), ("moving", moving)):
        _packed(instr, role, t)
        _data_partitions(instr, role, t, _MATMUL_PARTITIONS)
    rows, cols = tiling(instr, tile_position, tile_size, version)
    if cols != 128 or (tile_position and int(tuple(tile_position)[1]) != 0):
        fail(instr, f"tile_size column {cols} / tile_position {tuple(tile_position or ())}: nc_matmul_mx has row "
             "tiling only (column size 128, start column 0)")
    shape = MatmulShape(stationary.shape[0], stationary.free_size, moving.free_size)
    if shape.m % 2:
        fail(instr, f"stationary free size is {shape.m}; nc_matmul_mx needs an even stationary free size")
    if dst.dtype.name not in ("float32", "bfloat16"):
        fail(instr, f"dst dtype is {dst.dtype.name}; nc_matmul_mx writes float32 or bfloat16 PSUM")
    check_sizes(instr, version, stationary, moving, dst, shape, rows, cols)
    return shape


def nc_matmul_mx(dst: NkiTensor, stationary: NkiTensor, moving: NkiTensor, stationary_scale: NkiTensor,
                 moving_scale: NkiTensor, tile_position: Any = None, tile_size: Any = None, accumulate: Any = None,
                 name: str | None = None) -> NkiInstruction:
    """``dst = dequant(stationary).T @ dequant(moving)`` over MX quads on TensorE, accumulating in fp32
    PSUM as ``nc_matmul`` does (nki-api-facts.md 4.1; the scale layout is :mod:`torchneuron.nki.mx`'s)."""
    instr = "nc_matmul_mx"
    run, version = run_and_version()
    dst, stationary, moving = matmul_operands(instr, dst, stationary, moving)
    shape = _mx_matmul_checks(instr, dst, stationary, moving, tile_position, tile_size, version)
    s_scale = _scale_operand(instr, "stationary_scale", stationary_scale, stationary, "stationary")
    m_scale = _scale_operand(instr, "moving_scale", moving_scale, moving, "moving")
    s_rows, m_rows = _scale_row_views(s_scale, shape.contraction), _scale_row_views(m_scale, shape.contraction)

    def product() -> np.ndarray:
        return sgemm(_dequantized(instr, stationary, s_rows).T, _dequantized(instr, moving, m_rows))

    resolved, reads = matmul_values(instr, run, version, dst, stationary, moving, shape, False,
                                    None if accumulate is None else bool(accumulate), product)
    contraction = mx.QUAD * shape.contraction
    return record(run, instr, Engine.TENSOR, reads + s_rows + m_rows, [dst],
                  flops=2 * contraction * shape.m * shape.n, name=name, op="matmul_mx", stationary_free=shape.m,
                  moving_free=shape.n, contraction=contraction, accumulate=resolved,
                  accumulate_requested=accumulate, tile_position=tuple(tile_position or ()),
                  tile_size=tuple(tile_size or ()))


# The facts (9): "v4 MX matmul gives 4x", a 4x larger contraction in the same MultiplyMoving cycles,
# so nc_matmul's formula applies to the x4 free sizes (TensorE's datapath: 8x128 MXFP8 vs 2x128 BF16, facts 7).
nc_matmul_mx = instruction("nc_matmul_mx", {Engine.TENSOR: F.matmul}, min_version=mx.MX_VERSION,
                           hint=_HINT)(nc_matmul_mx)


# ============================================================================ quantize_mx
def quantize_mx(dst: NkiTensor, src: NkiTensor, dst_scale: NkiTensor, name: str | None = None) -> NkiInstruction:
    """Quantise bf16/fp16 ``src`` into MXFP8 quads ``dst`` and E8M0 scales ``dst_scale`` on VectorE
    (NKI's ``quantize_mx`` stub: its scale formula, layout and tile rules; :mod:`torchneuron.nki.mx`)."""
    instr = "quantize_mx"
    run, _version = run_and_version()
    ve = Engine.VECTOR
    src = engine_operand(instr, "src", src, ve)
    dst = engine_operand(instr, "dst", dst, ve)
    for role, t in (("src", src), ("dst", dst)):
        buffer_rule(instr, role, t, Buffer.sbuf, "quantize_mx reads and writes SBUF only")
    if src.dtype.name not in ("bfloat16", "float16"):
        fail(instr, f"src {src.name!r} is {src.dtype.name}; quantize_mx takes bfloat16 or float16")
    _packed(instr, "dst", dst, fp8_only=True)
    partitions = _data_partitions(instr, "src", src, (32, 64, 96, 128))
    if src.free_size % mx.QUAD:
        fail(instr, f"src has {src.free_size} elements per partition, not a multiple of 4 (one x4 quad each)")
    if dst.shape[0] != partitions or dst.free_size * mx.QUAD != src.free_size:
        fail(instr, f"dst has shape {list(dst.shape)}; it packs four src elements per x4 element: "
             f"{partitions} partitions of {src.free_size // mx.QUAD} elements")
    scale = _scale_operand(instr, "dst_scale", dst_scale, dst, "dst")
    rows = _scale_row_views(scale, partitions)
    if run.compute_values:
        words, codes = mx.quantize(fp32_values(src, instr).reshape(partitions, -1, mx.QUAD), dst.dtype)
        dst.write(words)
        for view, (first, count), group in zip(rows, mx.scale_rows(partitions), range(0, partitions, mx.QUADRANT)):
            bits = codes[group // mx.GROUP_PARTITIONS: group // mx.GROUP_PARTITIONS + count]
            view.write(bits.reshape(view.shape).view(view.dtype.storage))
    return record(run, instr, ve, [src], [dst] + rows, name=name)


quantize_mx = instruction("quantize_mx", {Engine.VECTOR: F.quantize_mx}, min_version=mx.MX_VERSION,
                          hint=_HINT)(quantize_mx)
