"""NKI data types and their host storage.

Current NKI spells dtypes as strings and legacy NKI as numpy / ``ml_dtypes``
dtypes (nki-api-facts.md: 3.8, 10); :func:`resolve` accepts both, plus torch
dtypes, and always returns one :class:`NkiDType`. Storage uses ``ml_dtypes`` so
every store rounds as the hardware does (AWS's ``NKI_PRECISE_FP=1``, the
default); ``tfloat32`` is kept in 32 bits with its mantissa rounded to 10 bits.

The packed MX types (``float8_e4m3fn_x4``, ``float8_e5m2_x4``, ``float4_e2m1fn_x4``; kind
``"mx"``) hold four quantised elements in one 32-bit (fp8) or 16-bit (fp4) word and are
stored as those raw words (``uint32`` / ``uint16``); :mod:`torchneuron.nki.mx` packs and
unpacks them. Engines never compute on them as numbers: only ``nc_matmul_mx`` reads their
values, ``quantize_mx`` writes them, and copies move their bits.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import ml_dtypes
import numpy as np

from torchneuron.nki.errors import located

__all__ = ["NkiDType", "resolve", "DTYPES", "round_tf32", "to_storage", "uint_of_size", "WIDENED", "host_storage"]


@dataclass(frozen=True, eq=False)
class NkiDType:
    """One NKI dtype: its name, the numpy dtype it is stored as, and its size on the device."""

    name: str
    storage: np.dtype
    itemsize: int
    kind: str  # "float", "int", "uint", "bool", "mx" (packed MX quad)
    element: Any = None  # packed MX types: the ml_dtypes type of each of the four elements

    @property
    def dtype(self) -> np.dtype:
        """The NumPy dtype of the values, so an NKI dtype works wherever NumPy takes one
        (``np.dtype(nl.bfloat16)``, ``a.astype(nl.uint16)``), as legacy NKI's NumPy dtypes did."""
        return self.storage

    @property
    def is_float(self) -> bool:
        return self.kind == "float"

    @property
    def is_integer(self) -> bool:
        return self.kind in ("int", "uint", "bool")

    @property
    def is_packed_mx(self) -> bool:
        """True for the x4 packed MX types (four quantised elements per word)."""
        return self.kind == "mx"

    @property
    def min(self) -> float:
        """Lowest finite value (legacy ``nl.fp32.min``)."""
        info = ml_dtypes.finfo(self.storage) if self.is_float else np.iinfo(self.storage)
        return float(info.min) if self.is_float else int(info.min)

    @property
    def max(self) -> float:
        info = ml_dtypes.finfo(self.storage) if self.is_float else np.iinfo(self.storage)
        return float(info.max) if self.is_float else int(info.max)

    def __eq__(self, other: object) -> bool:
        try:
            return resolve(other) is self
        except (TypeError, ValueError):
            return NotImplemented

    def __hash__(self) -> int:
        return hash(self.name)

    def __str__(self) -> str:
        return self.name

    def __repr__(self) -> str:
        return f"nl.{self.name}"


def _dt(name: str, storage: Any, kind: str, itemsize: int | None = None, element: Any = None) -> NkiDType:
    storage = np.dtype(storage)
    return NkiDType(name, storage, itemsize or storage.itemsize, kind, element)


DTYPES: dict[str, NkiDType] = {
    d.name: d
    for d in (
        _dt("bool_", np.uint8, "bool"),
        _dt("int8", np.int8, "int"),
        _dt("int16", np.int16, "int"),
        _dt("int32", np.int32, "int"),
        _dt("int64", np.int64, "int"),
        _dt("uint8", np.uint8, "uint"),
        _dt("uint16", np.uint16, "uint"),
        _dt("uint32", np.uint32, "uint"),
        _dt("uint64", np.uint64, "uint"),
        _dt("float16", np.float16, "float"),
        _dt("float32", np.float32, "float"),
        _dt("bfloat16", ml_dtypes.bfloat16, "float"),
        _dt("tfloat32", np.float32, "float"),
        _dt("float8_e4m3", ml_dtypes.float8_e4m3, "float"),
        _dt("float8_e5m2", ml_dtypes.float8_e5m2, "float"),
        _dt("float8_e4m3fn", ml_dtypes.float8_e4m3fn, "float"),
        _dt("float8_e8m0fnu", ml_dtypes.float8_e8m0fnu, "float"),
        # nki-api-facts.md 3.8; 32-bit fp8 quads and a 16-bit fp4 quad (AWS's MXFP matmul guide)
        _dt("float8_e4m3fn_x4", np.uint32, "mx", element=ml_dtypes.float8_e4m3fn),
        _dt("float8_e5m2_x4", np.uint32, "mx", element=ml_dtypes.float8_e5m2),
        _dt("float4_e2m1fn_x4", np.uint16, "mx", element=ml_dtypes.float4_e2m1fn),
    )
}

_ALIASES = {
    "bool": "bool_", "fp32": "float32", "fp16": "float16", "bf16": "bfloat16", "tf32": "tfloat32",
    "fp8_e4m3": "float8_e4m3", "fp8_e5m2": "float8_e5m2", "float": "float32", "half": "float16",
}

# numpy storage dtype -> NKI dtype, for legacy kernels passing numpy dtypes.
_BY_STORAGE: dict[np.dtype, NkiDType] = {}
for _d in DTYPES.values():
    if _d.name not in ("tfloat32", "bool_") and not _d.is_packed_mx:
        _BY_STORAGE.setdefault(_d.storage, _d)
_BY_STORAGE[np.dtype(np.bool_)] = DTYPES["bool_"]


def resolve(dtype: Any) -> NkiDType:
    """Any dtype spelling (NKI string, numpy, ml_dtypes, torch) as an :class:`NkiDType`."""
    if isinstance(dtype, NkiDType):
        return dtype
    if isinstance(dtype, str):
        name = _ALIASES.get(dtype, dtype)
        if name in DTYPES:
            return DTYPES[name]
        raise located(ValueError, f"unknown NKI dtype {dtype!r}; expected one of {', '.join(sorted(DTYPES))}")
    torch_name = _torch_dtype_name(dtype)
    if torch_name is not None:
        return resolve(torch_name)
    try:
        np_dtype = np.dtype(dtype)
    except TypeError:
        raise located(TypeError, f"expected an NKI dtype (e.g. nl.bfloat16 or 'float32'), got {dtype!r}") from None
    if np_dtype in _BY_STORAGE:
        return _BY_STORAGE[np_dtype]
    if np_dtype == np.float64:
        raise located(TypeError, "float64 is not an NKI dtype: Trainium has no FP64 (use nl.float32)")
    raise located(TypeError, f"numpy dtype {np_dtype} has no NKI equivalent")


def _torch_dtype_name(dtype: Any) -> str | None:
    if type(dtype).__module__ != "torch" or type(dtype).__name__ != "dtype":
        return None
    name = str(dtype).removeprefix("torch.")
    names = {"bool": "bool_", "float8_e4m3fn": "float8_e4m3fn", "float8_e5m2": "float8_e5m2"}
    name = names.get(name, name)
    if name == "float64":
        raise located(TypeError, "torch.float64 has no NKI equivalent: Trainium has no FP64 (use torch.float32)")
    return name


# Stored as float32 under NKI_PRECISE_FP=0 ("all low-precision tensors as fp32", nki-api-facts.md: 8).
# float8_e8m0fnu is an MX scale (an exponent), not a value format: it keeps its bits.
WIDENED = frozenset(("bfloat16", "float16", "float8_e4m3", "float8_e5m2", "float8_e4m3fn"))


def host_storage(dtype: NkiDType, precise: bool) -> np.dtype:
    """The numpy dtype an on-chip tile of ``dtype`` is held in: its own, or float32 when not ``precise``."""
    return np.dtype(np.float32) if not precise and dtype.name in WIDENED else dtype.storage


def round_tf32(values: np.ndarray) -> np.ndarray:
    """Round float32 values to tfloat32's 10 mantissa bits (round to nearest even), kept in 32 bits."""
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    finite = np.isfinite(values)
    lsb = (bits >> 13) & 1
    rounded = ((bits + 0x0FFF + lsb) & np.uint32(0xFFFFE000)).astype(np.uint32)
    return np.where(finite, rounded, bits).view(np.float32)


def to_storage(values: np.ndarray, dtype: NkiDType) -> np.ndarray:
    """``values`` converted (rounded) into ``dtype``'s storage, as a store to device memory does."""
    if dtype.name == "tfloat32":
        return round_tf32(np.asarray(values, dtype=np.float32))
    if dtype.is_packed_mx:
        return _packed_words(np.asarray(values), dtype)
    if dtype.is_integer and np.asarray(values).dtype.kind == "f":
        # Engines compute in fp32 and convert to integers by truncating toward zero, as AWS's
        # NumPy simulator (astype) does; AWS's resize_nearest_fixed_dma_kernel relies on it on
        # hardware (int32 pos / out_w must give 58, not 59, for pos / out_w = 58.97).
        # The facts sheets do not state the rounding mode.
        info = np.iinfo(dtype.storage)
        return np.clip(np.trunc(values), info.min, info.max).astype(dtype.storage)
    return np.asarray(values).astype(dtype.storage, copy=False)


def _packed_words(values: np.ndarray, dtype: NkiDType) -> np.ndarray:
    """Raw words for a packed MX tile: words of its own width move as they are and zero is zero (a
    memset); any other value would be a number cast into packed bits, which no instruction does."""
    if values.dtype.kind in "ui" and values.dtype.itemsize == dtype.itemsize:
        return values.astype(dtype.storage, copy=False)
    if not np.any(values):
        return np.zeros(values.shape, dtype=dtype.storage)
    raise located(TypeError, f"{dtype.name} is a packed MX type: it holds four quantised elements per word, "
                  "written only by nisa.quantize_mx, by copies of packed data and by memset(value=0); "
                  f"got {values.dtype} values to convert")


def uint_of_size(itemsize: int) -> np.dtype:
    """The unsigned integer numpy dtype of ``itemsize`` bytes (used for written-masks)."""
    return np.dtype({1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[itemsize])
