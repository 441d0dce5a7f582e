"""OCP microscaling (MX) as NeuronCore-v4 lays it out: packed quads, E8M0 scales, scale rows.

What the simulator's ``nc_matmul_mx`` and ``quantize_mx`` share, with no simulator state:

- **Quads.** An x4 element holds four quantised values of one contraction run: element ``j``
  of the quad sits at bits ``8j..8j+7`` (fp8, a 32-bit word) or ``4j..4j+3`` (fp4, a 16-bit
  word), lower address first: the byte order of AWS's MXFP matmul guide, whose host code packs
  ``ml_dtypes`` arrays by viewing four fp8 bytes as one ``uint32`` and two fp4 codes per byte,
  low nibble first. A ``[P, F]`` x4 tile is the ``[P, F, 4]`` values of the guide's
  interleaved layout; the contraction runs over the partitions and the four quad lanes.
- **Scales.** One E8M0 scale per group of 32 values, 8 partitions x 4 quad lanes, i.e. one
  x4 element on each of 8 partitions (trainium3 architecture guide). Its code ``c`` means
  ``2**(c - 127)``; 255 is NaN. Scales stay in the SBUF quadrant of their group: data partition
  ``p`` (from the data tile's first partition) reads scale row ``32 * (p // 32) + (p % 32) // 8``
  of the scale tile, which starts 0, 4, 8 or 12 partitions into that quadrant (the MXFP guide's
  scale packing); a scale tile's free size is the x4 tile's.
- **Quantisation** (``nisa.quantize_mx``'s documented formula): for a group with largest
  magnitude ``a``, the scale is ``2**(floor(log2 a) - (E_max - 1))`` with ``E_max`` 8 for
  float8_e4m3fn and 15 for float8_e5m2 (twice OCP's sample scale, so no value saturates); an
  all-zero group gets ``2**-127``; values are divided by the scale and rounded to the element
  type (round to nearest even, ``ml_dtypes``).
"""

from __future__ import annotations

import numpy as np

from torchneuron.nki import context
from torchneuron.nki.dtypes import NkiDType
from torchneuron.nki.errors import fail

__all__ = ["GROUP_PARTITIONS", "QUAD", "SCALE_OFFSETS", "pack", "unpack", "scale_factors", "scale_rows",
           "scale_partitions", "quantize", "decode", "E_MAX", "require_mx_target", "MX_VERSION"]

MX_VERSION = 4  # NeuronCore-v4 (trn3) is the first with MX (nki-api-facts.md 3.8, 4.1, 6 rule 7)

QUAD = 4  # values per x4 element
GROUP_PARTITIONS = 8  # partitions per 32-value scaling group (8 x 4 lanes)
QUADRANT = 32  # SBUF partitions per quadrant
SCALE_OFFSETS = (0, 4, 8, 12)  # a scale tile's start within its quadrant (MXFP guide, scale packing)
E8M0_BIAS = 127
E8M0_NAN = 255
# Largest unbiased exponent of each element type (nisa.quantize_mx's scale formula).
E_MAX = {"float8_e4m3fn_x4": 8, "float8_e5m2_x4": 15}


def require_mx_target(what: str, dtype: NkiDType) -> None:
    """Refuse a packed MX tile on a target without MX, naming the target (outside a kernel: no check)."""
    run = context.maybe_current()
    if run is None or not dtype.is_packed_mx:
        return
    version = str(run.target.neuroncore_version).lstrip("vV")
    if version.isdigit() and int(version) < MX_VERSION:
        fail(what, f"{dtype.name} is a packed MX type, available only on NeuronCore-v4 (trn3); target "
             f"{run.target.name} is NeuronCore-v{version}, which has no MX: run with target='trn3' "
             "(NEURON_PLATFORM_TARGET_OVERRIDE=trn3) or use nc_matmul with fp8/bf16 inputs")


def _bits(dtype: NkiDType) -> int:
    return 8 * dtype.itemsize // QUAD


def unpack(words: np.ndarray, dtype: NkiDType) -> np.ndarray:
    """The ``[..., 4]`` element values (as ``dtype.element``) of packed x4 ``words``."""
    bits = _bits(dtype)
    words = np.ascontiguousarray(words, dtype=dtype.storage)
    if bits == 8:
        return words.view(np.uint8).reshape(words.shape + (QUAD,)).view(dtype.element)
    shifts = np.arange(QUAD, dtype=np.uint16) * bits
    codes = ((words[..., None] >> shifts) & ((1 << bits) - 1)).astype(np.uint8)
    return codes.view(dtype.element)


_VALUE_TABLES: dict[str, np.ndarray] = {}


def decode(words: np.ndarray, dtype: NkiDType) -> np.ndarray:
    """The ``[..., 4]`` float32 values of packed x4 ``words``: :func:`unpack` through a table of every
    element code's value (a table lookup is many times faster than ``ml_dtypes``' cast)."""
    table = _VALUE_TABLES.get(dtype.name)
    if table is None:
        codes = np.arange(1 << _bits(dtype), dtype=np.uint8)
        table = _VALUE_TABLES.setdefault(dtype.name, codes.view(dtype.element).astype(np.float32))
    return table[unpack(words, dtype).view(np.uint8)]


def pack(values: np.ndarray, dtype: NkiDType) -> np.ndarray:
    """Packed x4 words of ``[..., 4]`` element values (already of ``dtype.element``)."""
    bits = _bits(dtype)
    codes = np.ascontiguousarray(values, dtype=dtype.element).view(np.uint8)
    if bits == 8:
        return codes.view(np.uint32).reshape(codes.shape[:-1])
    shifts = np.arange(QUAD, dtype=np.uint16) * bits
    return np.bitwise_or.reduce((codes.astype(np.uint16) & ((1 << bits) - 1)) << shifts, axis=-1).astype(np.uint16)


def scale_factors(codes: np.ndarray) -> np.ndarray:
    """E8M0 codes (uint8 bits) as float32 factors ``2**(c - 127)``; code 255 is NaN."""
    codes = np.asarray(codes)
    return _SCALE_TABLE[codes.view(np.uint8) if codes.dtype != np.uint8 else codes]


_SCALE_TABLE = np.where(np.arange(256) == E8M0_NAN, np.float32(np.nan),
                        np.ldexp(1.0, np.minimum(np.arange(256), 254) - E8M0_BIAS)).astype(np.float32)


def scale_rows(partitions: int) -> list[tuple[int, int]]:
    """Per quadrant the data spans, the (first, count) scale rows of its groups, from the scale tile's start."""
    rows = []
    for start in range(0, partitions, QUADRANT):
        span = min(QUADRANT, partitions - start)
        rows.append((start, -(-span // GROUP_PARTITIONS)))
    return rows


def scale_partitions(partitions: int) -> int:
    """Partitions a scale tile must span for a data tile of ``partitions`` partitions."""
    first, count = scale_rows(partitions)[-1]
    return first + count


def quantize(values: np.ndarray, dtype: NkiDType) -> tuple[np.ndarray, np.ndarray]:
    """``[P, F, 4]`` float32 values as packed ``[P, F]`` x4 words and ``[P // 8, F]`` E8M0 codes.

    A group holding a NaN or an infinity gets the NaN scale (255), as OCP MX marks a block
    whose scale is not a number (assumption: the hardware's handling is not published).
    """
    p, f, _ = values.shape
    groups = values.reshape(p // GROUP_PARTITIONS, GROUP_PARTITIONS, f, QUAD)
    amax = np.max(np.abs(groups), axis=(1, 3))
    finite = np.isfinite(amax)
    _mantissa, exponent = np.frexp(np.where(finite & (amax > 0), amax, np.float32(1.0)))
    floor_log2 = exponent.astype(np.int32) - 1  # frexp: a = m * 2**e with 0.5 <= m < 1
    scale = floor_log2 - (E_MAX[dtype.name] - 1)
    scale = np.where(amax > 0, np.clip(scale, -E8M0_BIAS, E8M0_BIAS), -E8M0_BIAS)
    codes = np.where(finite, scale + E8M0_BIAS, E8M0_NAN).astype(np.uint8)
    factor = np.ldexp(np.float32(1.0), scale).astype(np.float32)
    expanded = np.repeat(factor, GROUP_PARTITIONS, axis=0)[:, :, None]
    quantised = (values / expanded).astype(dtype.element)
    return pack(quantised, dtype), codes
