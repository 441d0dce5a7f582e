"""Shared building blocks of every ``nl`` module, in public names so the concept modules
(memory, movement, compute, control, legacy) import them without reaching into each other:
``nisa()`` (``nki.isa``, imported on first use so importing ``nl`` stays light), the
thread-local ``state`` (the retarget record and ``no_reorder`` scopes), the program id,
the argument normalisers (ints, dtypes, buffers, shapes, scalars, tiles), result naming,
the legacy block-dim types (``par_dim``, :class:`BlockTensor`), legacy-mask helpers, and
instruction issue: every ``nl`` result's final ISA call goes through :func:`emit`, which
remembers it so ``t[...] = <nl call>`` and ``psum += nl.matmul(...)`` can write straight
into ``t`` (package docstring, decision 4) when the value is a temporary. It imports no
other ``nl`` module, so the ``nl`` modules import each other at the top in one direction."""

from __future__ import annotations

import builtins as _b
import itertools
import math
import os
import sys
import threading
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from torchneuron.nki import context
from torchneuron.nki.context import current_program
from torchneuron.nki import dtypes as _dtypes
from torchneuron.nki.dtypes import NkiDType
from torchneuron.nki.errors import fail, located
from torchneuron.nki.indexing import MaskExpr
from torchneuron.nki.instruction import Instruction
from torchneuron.nki.memory import Buffer
from torchneuron.nki.tensor import NkiTensor


# ============================================================ ISA access, state


def nisa() -> Any:
    """``torchneuron.nki.isa``, imported on first use (isa imports this module's operators)."""
    from torchneuron.nki import isa

    return isa


state = threading.local()
scope_ids = itertools.count(1)


# ================================================================ normalisers


def as_int(value: Any, op: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"nl.{op}: expected an int, got {type(value).__name__} {value!r}")
    return int(value)


def as_dtype(dtype: Any, op: str) -> NkiDType:
    if dtype is None:
        raise located(TypeError, f"nl.{op}: dtype is required (e.g. nl.float32)")
    return _dtypes.resolve(dtype)


def as_buffer(buffer: Any, op: str, default: Buffer = Buffer.sbuf) -> Buffer:
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


def split_shape(shape: Any, op: str) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(block dims, tile dims) of a shape; block dims precede a legacy ``nl.par_dim``."""
    dims = [shape] if isinstance(shape, (int, np.integer)) else list(shape)
    marks = [i for i, d in enumerate(dims) if isinstance(d, ParDim)]
    ints = tuple(as_int(d, op) for d in dims)
    if _b.any(d <= 0 for d in ints):
        raise ValueError(f"nl.{op}: every dimension must be positive, got shape {list(ints)}")
    if len(marks) > 1:
        raise ValueError(f"nl.{op}: a shape has one partition dimension, got nl.par_dim at positions {marks}")
    split = marks[0] if marks else 0
    return ints[:split], ints[split:]


def is_scalar(value: Any) -> bool:
    """A Python or NumPy number, a 0-d array, or an ml_dtypes scalar (``nl.finfo(nl.bfloat16).min`` is
    an ``ml_dtypes.bfloat16``, a ``np.generic`` but not a ``np.number``)."""
    return isinstance(value, (int, float, np.number, np.bool_)) or (
        isinstance(value, np.ndarray) and value.ndim == 0) or (
        isinstance(value, np.generic) and type(value).__module__ == "ml_dtypes")


def as_scalar(value: Any) -> float | int:
    value = value.item() if isinstance(value, (np.ndarray, np.generic)) else value
    return int(value) if isinstance(value, (bool, int)) else float(value)


def as_tile(value: Any, op: str, what: str = "x") -> NkiTensor:
    if isinstance(value, NkiTensor):
        return value
    if isinstance(value, BlockTensor):
        raise TypeError(f"nl.{op}: {what} is a legacy block tensor {list(value.shape)} (dims before "
                        "nl.par_dim); index it to get a tile, e.g. t[i]")
    raise TypeError(f"nl.{op}: {what} must be a tile (NkiTensor), got {type(value).__name__}")


def require_on_chip(value: NkiTensor, op: str, what: str = "x") -> NkiTensor:
    if not value.on_chip:
        fail(op, f"{what} {value.name!r} is in {value.buffer.value}; compute engines read SBUF or PSUM "
             "tiles: load it first with nl.load (or nisa.dma_copy)")
    return value


_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep  # torchneuron/nki/
_OUTSIDE: dict[Any, bool] = {}  # code object -> defined outside torchneuron.nki


def result_name(name: str, op: str) -> str:
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


def region_slices(shape: Sequence[int]) -> tuple[slice, ...]:
    return tuple(slice(0, n) for n in shape)


# ================================================================ legacy block dims
class ParDim(int):
    """Legacy ``nl.par_dim(n)``: marks the partition dimension inside a shape."""

    def __repr__(self) -> str:
        return f"nl.par_dim({int(self)})"


def par_dim(size: int) -> ParDim:
    """Legacy: mark ``size`` as the partition dim of a shape (``(nb, nl.par_dim(128), F)``)."""
    return ParDim(as_int(size, "par_dim"))


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
        from torchneuron.nki.language.legacy import (
            assign_into,  # legacy.py builds on this module
        )

        assign_into(target, value)


# ============================================================ instruction issue


@dataclass
class _Fresh:
    """The newest ``nl`` result: how to re-issue its final instruction into another destination."""

    result: "weakref.ref[NkiTensor]"
    run: Any
    instructions: tuple[Instruction, ...]
    reissue: Callable[..., None]
    kind: str
    region: tuple[int, ...] | None = None  # leading sub-box of the result the instruction wrote


def own_instructions_since(run: Any, marker: Instruction | None) -> list[Instruction]:
    """Instructions this program appended after ``marker`` (its newest one before the call)."""
    program = current_program()
    found: list[Instruction] = []
    for ins in reversed(run.instructions):
        if ins is marker:
            break
        if ins.program == program:
            found.append(ins)
    found.reverse()
    return found


def last_own_instruction(run: Any) -> Instruction | None:
    program = current_program()
    for ins in reversed(run.instructions):
        if ins.program == program:
            return ins
    return None


def issue_call(call: Callable[[], Any], tag: dict | None = None) -> list[Instruction]:
    """Run one ISA call; tag the instructions it recorded with ``tag`` attrs (if not set by isa)."""
    run = context.current()
    marker = last_own_instruction(run)
    call()
    new = own_instructions_since(run, marker)
    if tag:
        for ins in new:
            missing = {key: value for key, value in tag.items() if key not in ins.attrs}
            if missing:
                run.records.update_attrs(ins, **missing)
    return new


def emit(out: NkiTensor, issue: Callable[..., Any], kind: str = "", region: tuple[int, ...] | None = None,
         **kw: Any) -> NkiTensor:
    """Issue ``issue(out)`` - the final instruction producing ``out`` - and remember it for retargeting."""
    run = context.current()
    marker = last_own_instruction(run)
    issue(out, **kw)
    new = tuple(own_instructions_since(run, marker))
    state.fresh = _Fresh(weakref.ref(out), run, new, issue, kind, region)
    return out


def _forget_run(run: Any) -> None:
    """A finished run's retarget record goes: it holds the run and the tiles of its last ``nl`` call."""
    fresh = getattr(state, "fresh", None)
    if fresh is not None and fresh.run is run:
        state.fresh = None


context.on_release(_forget_run)


def _take_fresh(value: Any) -> _Fresh | None:
    """The retarget record of ``value`` if it is the newest result and its instructions end the log."""
    fresh = getattr(state, "fresh", None)
    if fresh is None or fresh.result() is not value:
        return None
    state.fresh = None
    if fresh.run is not context.maybe_current() or not _is_tail(fresh):
        return None  # something ran since (it may have read the value): keep the copy
    return fresh


def _is_tail(fresh: _Fresh) -> bool:
    log, n = fresh.run.instructions, len(fresh.instructions)
    return len(log) >= n and _b.all(a is b for a, b in zip(log[len(log) - n:], fresh.instructions))


def _retract(fresh: _Fresh) -> None:
    """Remove ``fresh``'s instructions from the log (they are its newest entries; nothing refers to them)."""
    with fresh.run._lock:
        if fresh.instructions and _is_tail(fresh):
            del fresh.run.instructions[-len(fresh.instructions):]


def retarget(target: NkiTensor, value: NkiTensor, temporary: bool, **kw: Any) -> bool:
    """Write the temporary ``value`` straight into ``target`` (decision 4); False if not possible."""
    if not temporary:
        return False
    fresh = _take_fresh(value)
    if fresh is None:
        return False
    if (target.shape != value.shape or target.dtype != value.dtype or target.buffer is not value.buffer
            or target.is_partial):
        return False
    if not kw and _move_result(fresh, value, target):
        return True
    _retract(fresh)
    fresh.reissue(target, **kw)
    return True


def _move_result(fresh: _Fresh, value: NkiTensor, target: NkiTensor) -> bool:
    """Retarget without running the instruction twice: its destination operand becomes ``target``.

    Done when the recorded instruction with ``target`` as ``dst`` is exactly what
    a re-issue would check and record: ``target`` has ``value``'s shape, dtype and
    buffer, and either the instruction is a DMA (no partition-placement rules)
    or both start at the same SBUF partition. The values it wrote are moved over.
    Otherwise (PSUM, another start partition) the caller re-issues it.
    """
    if len(fresh.instructions) != 1:
        return False
    ins = fresh.instructions[0]
    if ins.opcode != "dma_copy" and (target.buffer is not Buffer.sbuf
                                     or target.start_partition != value.start_partition):
        return False
    old_id = value.operand().allocation
    written = [w for w in ins.writes if w.allocation == old_id]
    if len(written) != 1:
        return False
    box = tuple(fresh.region) if fresh.region is not None else tuple(written[0].shape)
    if len(box) != value.ndim:
        return False
    src, dst = value[region_slices(box)], target[region_slices(box)]
    new = dst.operand()
    ins.writes = tuple(new if w.allocation == old_id else w for w in ins.writes)
    ins.reads = tuple(new if r.allocation == old_id else r for r in ins.reads)
    dst.write(src.values())
    return True


# ======================================================== temporary detection
#
# A value is a temporary when nothing but the call path of ``t[...] = value`` /
# ``t += value`` holds it. How many references that path holds depends on the
# interpreter's state, not only on the CPython version: while a frame-evaluation
# hook is installed (torch.compile's Dynamo installs one and leaves it, checked
# on CPython 3.11 / torch 2.13), Python-to-Python calls are not inlined and each
# keeps one more reference on the caller's stack. So the count a temporary has
# is measured, not assumed: a probe object replays the same path (a C slot into
# a Python method that calls a Python function) with a fresh object.


class _RefProbe:
    """Stand-in target whose ``[...] =`` and ``+=`` take the same path as NkiTensor's."""

    __slots__ = ("refs",)

    def __setitem__(self, key: Any, value: Any) -> None:
        _record_refs(self, value)

    def __iadd__(self, value: Any) -> "_RefProbe":
        _record_refs(self, value)
        return self


def _record_refs(probe: _RefProbe, value: Any) -> None:
    probe.refs = sys.getrefcount(value)  # measured where assign_into/accumulate_into measure theirs


def _temporary_refs(kind: str) -> int:
    """References a temporary has at the top of ``legacy.assign_into`` (kind "assign") or
    ``legacy.accumulate_into`` ("accumulate")."""
    probe = _RefProbe()
    if kind == "assign":
        probe[0] = object()
    else:
        probe += object()
    return probe.refs


def is_temporary(refs: int, kind: str) -> bool:
    """True when ``refs`` (``sys.getrefcount`` of the value at the top of the hook) means no other holder."""
    return refs <= _temporary_refs(kind)


# ================================================================ legacy masks


def mask_shape(mask: Any, shape: tuple[int, ...], op: str) -> tuple[int, ...]:
    """The valid (leading) extent per dim of a legacy ``mask=`` over a tile of ``shape`` (decision 6)."""
    if mask is None:
        return shape
    if isinstance(mask, (bool, np.bool_)):
        return shape if mask else tuple(0 for _ in shape)
    if not isinstance(mask, MaskExpr):
        raise TypeError(f"nl.{op}: mask must be a comparison of nl.arange/nl.mgrid indices, e.g. "
                        f"mask=(i * 128 + i_p < n); got {mask!r}")
    valid = list(shape)
    for term in mask.terms:
        expr = term[0]
        dim = expr.position
        if not 0 <= dim < len(shape):
            fail(op, f"mask bounds index position {dim}, but the tile has {len(shape)} dims")
        try:
            count = expr.valid_count(MaskExpr((term,)))
        except IndexError as exc:
            fail(op, f"{exc}")
        valid[dim] = _b.min(valid[dim], count)
    return tuple(valid)


def masked_view(t: NkiTensor, valid: tuple[int, ...]) -> NkiTensor:
    return t if tuple(valid) == tuple(t.shape) else t[region_slices(valid)]


def elementwise_min(*shapes: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(_b.min(dims) for dims in zip(*shapes))
