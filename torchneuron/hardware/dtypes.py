"""How each torch dtype lives on each Trainium generation: native, converted or not at all.

torch and Trainium name their types differently (Trn2's FP8 is IEEE-style E4M3,
which no torch dtype matches), so this module is the one place that maps torch
dtype *names* (``"float32"``, ``"float8_e4m3fn"``; a ``"torch."`` prefix is
accepted) onto the chip types of :mod:`torchneuron.hardware.specs`. Sources:
trainium-facts.md "Data types" and, for the NKI-level types the facts sheet does
not list (int8, int16, uint16, bool, float8_e5m2, float8_e4m3fn on Trn3,
float8_e8m0fnu), nki-api-facts.md section 3.8.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from types import MappingProxyType

from torchneuron.hardware.specs import ChipSpec, get_chip

__all__ = [
    "Treatment",
    "DtypeSupport",
    "TORCH_DTYPE_ITEMSIZE",
    "dtype_support",
    "dtype_table",
    "normalize_dtype",
]


class Treatment(enum.StrEnum):
    """What the device does with a dtype."""

    NATIVE = "native"  # held and computed in that type
    CONVERTED = "converted"  # held or computed as ``device_dtype``; values noted in ``reason``
    UNSUPPORTED = "unsupported"  # no Trainium type: ops touching it run on CPU


@dataclass(frozen=True, kw_only=True)
class DtypeSupport:
    """One torch dtype on one chip. ``reason`` is user-facing and cites the fact it rests on."""

    dtype: str
    target: str
    treatment: Treatment
    device_dtype: str | None
    itemsize: int
    reason: str

    @property
    def on_device(self) -> bool:
        return self.treatment is not Treatment.UNSUPPORTED


# torch.<dtype>.itemsize for every dtype torch 2.13 defines (packed types count one byte).
TORCH_DTYPE_ITEMSIZE: Mapping[str, int] = MappingProxyType(
    {
        "bool": 1, "uint8": 1, "int8": 1, "int16": 2, "uint16": 2, "int32": 4, "uint32": 4,
        "int64": 8, "uint64": 8, "float16": 2, "bfloat16": 2, "float32": 4, "float64": 8,
        "complex32": 4, "complex64": 8, "complex128": 16,
        "float8_e4m3fn": 1, "float8_e4m3fnuz": 1, "float8_e5m2": 1, "float8_e5m2fnuz": 1,
        "float8_e8m0fnu": 1, "float4_e2m1fn_x2": 1,
        "qint8": 1, "quint8": 1, "qint32": 4, "quint4x2": 1, "quint2x4": 1,
        "bits8": 1, "bits16": 2, "bits1x8": 1, "bits2x4": 1, "bits4x2": 1,
        **{f"{sign}int{bits}": 1 for sign in ("", "u") for bits in range(1, 8)},
    }
)  # fmt: skip

_DATA_TYPES = "trainium-facts.md: Data types"
_NKI_TYPES = "nki-api-facts.md: 3.8 Data types"

_SAME = ("float32", "float16", "bfloat16", "uint8", "int32", "uint32")
_NKI_INTS = ("int8", "int16", "uint16")
_COMPLEX = ("complex32", "complex64", "complex128")
_QUANTIZED = ("qint8", "quint8", "qint32", "quint4x2", "quint2x4")
_FNUZ = ("float8_e4m3fnuz", "float8_e5m2fnuz")


def normalize_dtype(dtype: str) -> str:
    """``"torch.float32"`` or ``"float32"`` -> ``"float32"``.

    Raises:
        TypeError: if ``dtype`` is not a string (pass ``str(tensor.dtype)``).
        ValueError: if it names no torch dtype.
    """
    if not isinstance(dtype, str):
        raise TypeError(
            f"dtype must be a dtype name such as 'float32' (str(tensor.dtype) works), "
            f"got {type(dtype).__name__} {dtype!r}"
        )
    name = dtype.strip().removeprefix("torch.")
    if name not in TORCH_DTYPE_ITEMSIZE:
        raise ValueError(
            f"unknown dtype {dtype!r}; expected a torch dtype name such as 'float32', 'bfloat16', "
            f"'int64' or 'float8_e4m3fn' (known: {', '.join(TORCH_DTYPE_ITEMSIZE)})"
        )
    return name


@lru_cache(maxsize=1024)
def dtype_support(dtype: str, target: str = "trn2", *, native_int64: bool = False) -> DtypeSupport:
    """How ``dtype`` is held on ``target`` (any ``NEURON_PLATFORM_TARGET_OVERRIDE`` spelling).

    Args:
        native_int64: the Trn2/Trn3 compiler flag that makes INT64/UINT64 native;
            without it 64-bit integers are computed as 32-bit.

    Raises:
        ValueError: unknown dtype or target, or ``native_int64`` on a chip without the flag.
    """
    chip = get_chip(target)
    name = normalize_dtype(dtype)
    if native_int64 and "int64" not in chip.flag_gated_dtypes:
        raise ValueError(
            f"native_int64=True is not available on {chip.name} ({chip.marketing_name}): native "
            f"INT64/UINT64 exist only on trn2/trn3 behind a compiler flag ({_DATA_TYPES}); "
            "pass native_int64=False"
        )
    treatment, device_dtype, reason = _rule(name, chip, native_int64)
    return DtypeSupport(
        dtype=name,
        target=chip.name,
        treatment=treatment,
        device_dtype=device_dtype,
        itemsize=TORCH_DTYPE_ITEMSIZE[name],
        reason=reason,
    )


def dtype_table(target: str = "trn2", *, native_int64: bool = False) -> dict[str, DtypeSupport]:
    """:func:`dtype_support` for every torch dtype, keyed by name: the per-target table."""
    return {
        name: dtype_support(name, target, native_int64=native_int64) for name in TORCH_DTYPE_ITEMSIZE
    }


def _rule(name: str, chip: ChipSpec, native_int64: bool) -> tuple[Treatment, str | None, str]:
    native, converted, unsupported = Treatment.NATIVE, Treatment.CONVERTED, Treatment.UNSUPPORTED
    gen = chip.name
    if name in _SAME:
        return native, name, f"{name} is a {gen} type ({_DATA_TYPES})"
    if name == "bool":
        return native, "uint8", f"bool is stored as uint8 0/1, the byte torch uses ({_NKI_TYPES})"
    if name in _NKI_INTS:
        return native, name, f"{name} is an NKI storage type; engines compute in FP32 ({_NKI_TYPES})"
    if name in ("int64", "uint64"):
        narrow = name.replace("64", "32")
        if native_int64:
            return native, name, f"{name} is native on {gen} with native INT64 enabled ({_DATA_TYPES})"
        how = "unless native INT64 is enabled" if chip.flag_gated_dtypes else "(no native INT64 on trn1)"
        return converted, narrow, (
            f"{name} is computed as {narrow} on {gen} {how} ({_DATA_TYPES}); "
            f"values outside the {narrow} range wrap"
        )
    if name == "float64":
        return unsupported, None, (
            f"float64 is not a Trainium dtype (no FP64 on any generation, {_DATA_TYPES}); "
            "cast to float32 or bfloat16"
        )
    if name in _COMPLEX:
        return unsupported, None, (
            f"{name} is not a Trainium dtype (no complex types, {_DATA_TYPES}); keep complex math "
            "on CPU or carry real and imaginary parts as float32 (torch.view_as_real)"
        )
    if name in _QUANTIZED:
        return unsupported, None, (
            f"{name} is a quantized tensor type and Trainium has none ({_DATA_TYPES}); "
            "dequantize, or keep int8/uint8 data with explicit float32 scales"
        )
    if name in TORCH_DTYPE_ITEMSIZE and name.startswith(("bits", "int", "uint")):
        return unsupported, None, (
            f"{name} is a sub-byte or raw-bits container with no Trainium type ({_DATA_TYPES}); "
            "unpack to uint8/int8"
        )
    return _low_precision_rule(name, gen)


def _low_precision_rule(name: str, gen: str) -> tuple[Treatment, str | None, str]:
    """FP8/FP4/MX-scale dtypes: the generations disagree, so one branch per format."""
    native, converted, unsupported = Treatment.NATIVE, Treatment.CONVERTED, Treatment.UNSUPPORTED
    widened = "values are widened exactly to bfloat16 (every FP8 value is a bfloat16 value)"
    if name in _FNUZ:
        return converted, "bfloat16", f"no Trainium uses the {name} encoding ({_NKI_TYPES}); {widened}"
    if gen == "trn1" and name.startswith("float8_e") and name != "float8_e8m0fnu":
        return converted, "bfloat16", (
            f"trn1's FP8 is cFP8 and the facts give no bit layout to match {name} ({_DATA_TYPES}); "
            f"{widened}"
        )
    if name == "float8_e5m2":
        return native, name, f"float8_e5m2 is a TensorE input type on {gen} ({_NKI_TYPES})"
    if name == "float8_e4m3fn":
        if gen == "trn3":
            return native, name, f"OCP float8_e4m3fn is a TensorE input type on trn3 ({_NKI_TYPES})"
        return converted, "bfloat16", (
            "trn2 FP8 is IEEE-style E4M3, not OCP e4m3fn (different NaN/inf encodings and "
            f"range: 240 vs 448) ({_DATA_TYPES}); {widened}"
        )
    if name == "float8_e8m0fnu":
        if gen == "trn3":
            return native, name, f"float8_e8m0fnu is the MX scale type on trn3 ({_NKI_TYPES})"
        return converted, "float32", (
            f"float8_e8m0fnu (MX scales) is trn3-only ({_NKI_TYPES}); powers of two are "
            "held exactly as float32"
        )
    # float4_e2m1fn_x2, the only dtype left.
    if gen == "trn3":
        return native, "mxfp4", f"4-bit e2m1 floats are MX FP4 on trn3 ({_DATA_TYPES})"
    return unsupported, None, (
        f"{name}: 4-bit floats exist only on trn3 (MX FP4, {_DATA_TYPES}); "
        "unpack to bfloat16 or target trn3"
    )
