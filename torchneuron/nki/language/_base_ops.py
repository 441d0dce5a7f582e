"""Shared internals of ``nl``: lazy ``nki.isa`` access, the thread-local state (the
retarget record and ``no_reorder`` scopes), the program id, and the argument
normalisers (ints, dtypes, buffers, shapes, scalars, tiles), result naming, and the
legacy block-dim types (``par_dim``, :class:`BlockTensor`) that shapes and tiles are
checked against, used by every other ``nl`` module. It imports no other ``nl`` module:
the ``nl`` modules import each other at the top, in one direction (no import cycle)."""

from __future__ import annotations

import builtins as _b
import itertools
import math
import os
import sys
import threading
from typing import Any, Sequence

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


def _region(shape: Sequence[int]) -> tuple[slice, ...]:
    return tuple(slice(0, n) for n in shape)


# ================================================================ legacy block dims
class ParDim(int):
    """Legacy ``nl.par_dim(n)``: marks the partition dimension inside a shape."""

    def __repr__(self) -> str:
        return f"nl.par_dim({int(self)})"


def par_dim(size: int) -> ParDim:
    """Legacy: mark ``size`` as the partition dim of a shape (``(nb, nl.par_dim(128), F)``)."""
    return ParDim(_int(size, "par_dim"))


class BlockTensor:
    """A legacy on-chip tensor with block dims before its partition dim (``nl.par_dim``).

    It is a Python list of separately allocated tiles (decision 3): ``t[i]`` is
    tile ``i`` (``t[i, j]`` for two block dims; ``t[i]`` of two block dims is the block
    tensor of row ``i``'s blocks, sharing its tiles), ``t[i, p, f]`` indexes into it,
    and ``t[i, ...] = x`` assigns into it. Compute functions take tiles, not
    block tensors, as in legacy NKI.
    """

    def __init__(self, block_shape: tuple[int, ...], tiles: list[NkiTensor], name: str) -> None:
        self.block_shape = tuple(block_shape)
        self.tiles = tiles
        self._name = name

    @property
    def shape(self) -> tuple[int, ...]:
        return self.block_shape + tuple(self.tiles[0].shape)

    @property
    def dtype(self) -> NkiDType:
        return self.tiles[0].dtype

    @property
    def buffer(self) -> Buffer:
        return self.tiles[0].buffer

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def name(self) -> str:
        return self._name

    def __len__(self) -> int:
        return self.block_shape[0]

    def __repr__(self) -> str:
        return (f"BlockTensor(name={self._name!r}, blocks={list(self.block_shape)}, "
                f"tile={list(self.tiles[0].shape)}, dtype={self.dtype.name}, buffer={self.buffer.value})")

    def __getitem__(self, key: Any) -> "NkiTensor | BlockTensor":
        keys = list(key) if isinstance(key, tuple) else [key]
        if keys and keys[0] is Ellipsis and len(keys) == 1:
            return self
        nb = len(self.block_shape)
        lead = 0
        while lead < len(keys) and isinstance(keys[lead], (int, np.integer)) and not isinstance(keys[lead], bool):
            lead += 1
        if 0 < lead < nb and _b.all(k is Ellipsis or k == slice(None) for k in keys[lead:]):
            return self._sub_blocks(keys[:lead])  # t[i] of (nb1, nb2, par_dim, F): a (nb2, par_dim, F) block tensor
        head, rest = keys[:nb], keys[nb:]
        if len(head) < nb or not _b.all(isinstance(k, (int, np.integer)) and not isinstance(k, bool)
                                         for k in head):
            raise IndexError(f"legacy block tensor {self._name!r} (blocks {list(self.block_shape)}) is "
                             f"indexed with one integer per block dim first, e.g. t[i] or t[i, :, :]; "
                             f"got {key!r}")
        flat = self._flat_block(head)
        tile = self.tiles[flat]
        return tile[tuple(rest)] if rest else tile

    def _flat_block(self, head: list[Any]) -> int:
        """The row-major number of the first block under the leading block indices ``head``, bounds-checked."""
        flat = 0
        for k, n in zip(head, self.block_shape):
            k = int(k)
            if not -n <= k < n:
                fail("index", f"block index {k} is out of bounds for block dim of size {n} of {self._name!r}")
            flat = flat * n + (k % n)
        return flat

    def _sub_blocks(self, head: list[Any]) -> "BlockTensor":
        """The block tensor of the blocks under the leading block indices ``head`` (a view: same tiles)."""
        flat = self._flat_block(head)
        inner = self.block_shape[len(head):]
        count = math.prod(inner)
        index = "".join(f"[{int(k)}]" for k in head)
        return BlockTensor(inner, self.tiles[flat * count:(flat + 1) * count], f"{self._name}{index}")

    def __setitem__(self, key: Any, value: Any) -> None:
        target = self[key]
        if not isinstance(target, NkiTensor):
            raise IndexError(f"assign into one tile of block tensor {self._name!r} at a time (t[i] = x)")
        if isinstance(value, NkiTensor) and value.same_memory(target):
            return  # result of an in-place ``t[i, ...] += x``
        from torchneuron.nki import language  # the assignment hook is a legacy op, resolved at call time

        language._assign(target, value)
