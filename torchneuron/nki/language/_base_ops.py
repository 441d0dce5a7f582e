"""Shared internals of ``nl``: lazy ``nki.isa`` access, the thread-local state (the
retarget record and ``no_reorder`` scopes), the program id, and the argument
normalisers (ints, dtypes, buffers, shapes, scalars, tiles) and result naming used
by every other ``nl`` module."""

from __future__ import annotations

import builtins as _b
import itertools
import os
import sys
import threading
from typing import Any

import numpy as np

from torchneuron.nki import context
from torchneuron.nki import dtypes as _dtypes
from torchneuron.nki.dtypes import NkiDType
from torchneuron.nki.errors import fail, located
from torchneuron.nki.memory import Buffer
from torchneuron.nki.tensor import NkiTensor


# ============================================================ ISA access, state


def _isa() -> Any:
    """``torchneuron.nki.isa``, imported on first use (isa imports this module's operators)."""
    from torchneuron.nki import isa

    return isa


_local = threading.local()
_scope_ids = itertools.count(1)


def _program() -> int:
    return getattr(context._local, "program", 0)


# ================================================================ normalisers


def _int(value: Any, op: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"nl.{op}: expected an int, got {type(value).__name__} {value!r}")
    return int(value)


def _dtype(dtype: Any, op: str) -> NkiDType:
    if dtype is None:
        raise located(TypeError, f"nl.{op}: dtype is required (e.g. nl.float32)")
    return _dtypes.resolve(dtype)


def _buffer(buffer: Any, op: str, default: Buffer = Buffer.sbuf) -> Buffer:
    """A Buffer; legacy ``buffer=None`` means sbuf; strings are rejected (NKI 0.3.0)."""
    if buffer is None:
        return default
    if isinstance(buffer, Buffer):
        return buffer
    if isinstance(buffer, str):
        raise TypeError(f"nl.{op}: buffer names as strings were removed in NKI 0.3.0; pass "
                        f"nl.{buffer if buffer in Buffer.__members__ else 'sbuf'} (one of nl.sbuf, nl.psum, "
                        "nl.hbm, nl.private_hbm, nl.shared_hbm), got {buffer!r}")
    raise TypeError(f"nl.{op}: buffer must be nl.sbuf, nl.psum, nl.hbm, nl.private_hbm or nl.shared_hbm, "
                    f"got {buffer!r}")


def _shape(shape: Any, op: str) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(block dims, tile dims) of a shape; block dims precede a legacy ``nl.par_dim``."""
    dims = [shape] if isinstance(shape, (int, np.integer)) else list(shape)
    marks = [i for i, d in enumerate(dims) if isinstance(d, ParDim)]
    ints = tuple(_int(d, op) for d in dims)
    if _b.any(d <= 0 for d in ints):
        raise ValueError(f"nl.{op}: every dimension must be positive, got shape {list(ints)}")
    if len(marks) > 1:
        raise ValueError(f"nl.{op}: a shape has one partition dimension, got nl.par_dim at positions {marks}")
    split = marks[0] if marks else 0
    return ints[:split], ints[split:]


def _is_scalar(value: Any) -> bool:
    return isinstance(value, (int, float, np.number, np.bool_)) or (
        isinstance(value, np.ndarray) and value.ndim == 0)


def _scalar(value: Any) -> float | int:
    value = value.item() if isinstance(value, (np.ndarray, np.generic)) else value
    return int(value) if isinstance(value, (bool, int)) else float(value)


def _tile(value: Any, op: str, what: str = "x") -> NkiTensor:
    if isinstance(value, NkiTensor):
        return value
    if isinstance(value, BlockTensor):
        raise TypeError(f"nl.{op}: {what} is a legacy block tensor {list(value.shape)} (dims before "
                        "nl.par_dim); index it to get a tile, e.g. t[i]")
    raise TypeError(f"nl.{op}: {what} must be a tile (NkiTensor), got {type(value).__name__}")


def _on_chip(value: NkiTensor, op: str, what: str = "x") -> NkiTensor:
    if not value.on_chip:
        fail(op, f"{what} {value.name!r} is in {value.buffer.value}; compute engines read SBUF or PSUM "
             "tiles: load it first with nl.load (or nisa.dma_copy)")
    return value


_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep  # torchneuron/nki/
_OUTSIDE: dict[Any, bool] = {}  # code object -> defined outside torchneuron.nki


def _name(name: str, op: str) -> str:
    """``name``, or ``op@file.py:line`` of the kernel line allocating (cheaper than kernel_location)."""
    if name:
        return name
    frame = sys._getframe(1)
    while frame is not None:
        code = frame.f_code
        outside = _OUTSIDE.get(code)
        if outside is None:
            outside = _OUTSIDE[code] = not os.path.abspath(code.co_filename).startswith(_PACKAGE_DIR)
        if outside:
            return f"{op}@{os.path.basename(code.co_filename)}:{frame.f_lineno}"
        frame = frame.f_back
    return op


# The nl modules use each other's names at call time: imported after the definitions (import cycles).
from torchneuron.nki.language._legacy_ops import BlockTensor, ParDim  # noqa: E402
