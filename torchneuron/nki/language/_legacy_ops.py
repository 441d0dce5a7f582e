"""Legacy NKI support in ``nl``: ``par_dim`` and :class:`BlockTensor` block dims, the
``_assign``/``_accumulate`` hooks behind ``t[...] = x`` and ``t += x`` (including
legacy matmul accumulation, decision 5), the removed APIs that raise with their
replacement, and the legacy ``compiler`` namespace object."""

from __future__ import annotations

import builtins as _b
import math
import sys
import warnings
from typing import Any, Callable

import numpy as np

from torchneuron.nki import context, dialect
from torchneuron.nki.dtypes import NkiDType
from torchneuron.nki.errors import fail
from torchneuron.nki.memory import Buffer
from torchneuron.nki.tensor import NkiTensor


class ParDim(int):
    """Legacy ``nl.par_dim(n)``: marks the partition dimension inside a shape."""

    def __repr__(self) -> str:
        return f"nl.par_dim({int(self)})"


def par_dim(size: int) -> ParDim:
    """Legacy: mark ``size`` as the partition dim of a shape (``(nb, nl.par_dim(128), F)``)."""
    return ParDim(_int(size, "par_dim"))


# ================================================================ block tensors


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
        _assign(target, value)



# =================================================== legacy assignment hooks


def _assign(target: NkiTensor, value: Any) -> None:
    """``target[...] = value`` (from ``NkiTensor.__setitem__``): a copy, DMA or memset into ``target``."""
    temporary = _is_temporary(sys.getrefcount(value), "assign")
    if _is_scalar(value):
        _fill(target, value, "assign")
        return
    value = _tile(value, "assign", "value")
    if not target.on_chip:
        _copy_to_hbm(target, value, "assign")  # a clipped legacy view fails there: no mask= to bound it
        return
    if _retarget(target, value, temporary):
        return
    if not value.on_chip:
        _isa().dma_copy(dst=target, src=value)
        return
    src = value
    if value.shape != target.shape and value.shape[0] in (target.shape[0], 1):
        try:
            src = _expand(value, target.shape, "assign")
        except (ValueError, AssertionError):
            src = value
    _isa().tensor_copy(dst=target, src=src)


def _accumulate(target: NkiTensor, value: Any) -> None:
    """``target += value`` (from ``NkiTensor.__iadd__``): matmul accumulation or an element-wise add.

    A temporary fresh ``nl.matmul`` result accumulating into a PSUM tile of the
    same shape becomes the matmul itself writing ``target`` (decisions 4 and 5).
    """
    temporary = _is_temporary(sys.getrefcount(value), "accumulate")
    if not target.on_chip:
        fail("accumulate", f"{target.name!r} is in {target.buffer.value}; '+=' on HBM needs a read-modify-write "
             "DMA: load the tile, add, and store it back (or use nisa.dma_compute)")
    if isinstance(value, NkiTensor) and target.buffer is Buffer.psum and value.buffer is Buffer.psum:
        fresh = getattr(_local, "fresh", None)
        if temporary and fresh is not None and fresh.kind == "matmul" and fresh.result() is value:
            group = _matmul_group(target)
            if group in ("open", "zero") and target.shape == value.shape and \
                    _isa().accumulate_matmul_result(target, value, starts_group=group == "zero"):
                _local.fresh = None
                return  # the ISA folds the add into the recorded matmul (no second matmul run)
            if group is not None and _retarget(target, value, True, accumulate=group == "open"):
                return
        elif temporary and _isa().accumulate_matmul_result(
                target, value, starts_group=_matmul_group(target) in ("zero", "fresh")):
            return  # legacy ``psum[...] += nisa.nc_matmul(a, b)``: the ISA folds it into the matmul (decision 5)
        staged = copy(value, float32) if value.dtype.is_float else copy(value)
        _isa().tensor_tensor(dst=target, data1=target, data2=staged, op=add)
        return
    if _is_scalar(value):
        _isa().tensor_scalar(dst=target, data=target, op0=add, operand0=_scalar(value))
        return
    value = _on_chip(_tile(value, "accumulate", "value"), "accumulate", "value")
    if value.shape != target.shape and _is_column(value, target.shape[0]) and target.free_size > 1:
        _isa().tensor_scalar(dst=target, data=target, op0=add, operand0=_column(value))
        return
    _isa().tensor_tensor(dst=target, data1=target, data2=_expand(value, target.shape, "accumulate"), op=add)


def _box(op: Any) -> tuple[int, int, int, int]:
    """(first row, end row, first byte, end byte within a row) of an operand's extent."""
    lo, hi = op.extent
    pitch = op.row_bytes
    if pitch <= 0 or hi <= lo:
        return (0, 1, lo, _b.max(hi, lo + 1))
    r0, r1 = lo // pitch, (hi - 1) // pitch + 1
    if r1 - r0 == 1:
        return (r0, r1, lo - r0 * pitch, hi - r0 * pitch)
    c0, c1 = lo - r0 * pitch, (hi - 1) - (r1 - 1) * pitch + 1
    return (r0, r1, c0, c1) if c1 > c0 else (r0, r1, 0, pitch)


def _matmul_group(target: NkiTensor) -> str | None:
    """How ``target`` was last written, for a legacy ``+=`` of a matmul (decision 5).

    ``"open"``: by a matmul (accumulate); ``"zero"``: by a zero memset (``nl.zeros``),
    and ``"fresh"``: never (both start a group by overwriting); None: by another
    instruction (an element-wise add is needed instead).
    """
    run = context.current()
    mine = target.operand()
    box = _box(mine)
    fresh = getattr(_local, "fresh", None)
    skip = set(map(id, fresh.instructions)) if fresh is not None else set()
    for ins in reversed(run.instructions):
        if id(ins) in skip:
            continue
        for w in ins.writes:
            if w.allocation != mine.allocation:
                continue
            other = _box(w)
            if box[0] < other[1] and other[0] < box[1] and box[2] < other[3] and other[2] < box[3]:
                if ins.opcode == "nc_matmul":
                    return "open"
                if ins.opcode == "memset" and ins.attrs.get("value") in (0, 0.0):
                    return "zero"
                return None
    return "fresh"


# ===================================================== removed legacy APIs


# NKI Beta 2 (NKI 0.2.0, Neuron 2.27) is the first release of the current ``nki`` namespace; its
# release notes say it "removed several nki.language APIs" of legacy ``neuronxcc.nki`` (Beta 1), and
# these are absent from every later stub (nki-api-facts.md: 0 [S:mig], 10 "removed since legacy").
_REMOVED_IN = "NKI 0.2.0 (Beta 2, Neuron 2.27)"


def _removed(name: str, replacement: str) -> Callable[..., Any]:
    def fn(*args: Any, **kwargs: Any) -> Any:
        fail(name, f"nl.{name} was removed in {_REMOVED_IN}: it exists only in legacy neuronxcc.nki "
             f"(Beta 1); {replacement}")

    fn.__name__ = name
    fn.__doc__ = f"Removed legacy API: {replacement}"
    return fn


loop_reduce = _removed("loop_reduce", "accumulate explicitly, e.g. acc[...] = nl.add(acc, x) or "
                       "nisa.tensor_tensor(dst=acc, data1=acc, data2=x, op=nl.add)")
atomic_rmw = _removed("atomic_rmw", "use nisa.dma_compute (DMA read-add-write) for a read-modify-write of HBM")
all_reduce = _removed("all_reduce", "use the nki.collectives APIs")


_REMOVED_ALLOCATORS = ("alloc", "mod_alloc", "par_alloc")


def _legacy_placement(buffer: Buffer, api: str) -> Buffer:
    """A legacy kernel's manual allocator (``nki.compiler.sbuf.mod_alloc(...)``) as the plain buffer.

    Legacy NKI's direct-allocation APIs place (and, modulo-allocated, rotate) a tensor's
    blocks at fixed addresses. The simulator places every tile itself, each block with its
    own live range, which gives the same values for a kernel that is correct on hardware
    (it never reads a block after its slot was reused) but does not check the manual
    addresses, their overlaps or the kernel's own capacity plan (decision in docs/nki.md).
    """
    warnings.warn(f"{api}: legacy NKI's manual allocation is taken as {buffer.value} with automatic placement "
                  f"(addresses and modulo rotation are not simulated); NKI removed these allocators in "
                  f"{_REMOVED_IN} - use nl.ndarray(..., address=...)", UserWarning, stacklevel=3)
    return buffer


class _LegacyAllocator:
    """``nki.compiler.sbuf`` / ``.psum``: ``auto_alloc()`` is the buffer; manual allocators are removed."""

    def __init__(self, buffer: Buffer) -> None:
        self._buffer = buffer

    def auto_alloc(self) -> Buffer:
        return self._buffer

    def __getattr__(self, name: str) -> Any:
        if name not in _REMOVED_ALLOCATORS:
            raise AttributeError(f"nki.compiler.{self._buffer.value} has no attribute {name!r}")
        buffer = self._buffer.value

        def removed(*args: Any, **kwargs: Any) -> Any:
            caller = sys._getframe(1).f_code.co_filename  # CPython; the file that asks for the allocator
            if dialect.file_imports_legacy(caller):
                return _legacy_placement(self._buffer, f"nki.compiler.{buffer}.{name}")
            fail(f"nki.compiler.{buffer}.{name}",
                 f"nki.compiler allocators were removed in {_REMOVED_IN} (legacy neuronxcc.nki only); since "
                 f"then allocate with nl.ndarray(shape, dtype, "
                 f"buffer=nl.{buffer}, address=(partition_offset, free_offset)) for manual placement, or "
                 "omit address= to let the compiler place it")

        return removed


class _LegacyCompiler:
    """Legacy ``nki.compiler``: hint decorators are no-ops; allocators raise with the replacement."""

    sbuf = _LegacyAllocator(Buffer.sbuf)
    psum = _LegacyAllocator(Buffer.psum)

    @staticmethod
    def skip_middle_end_transformations(fn: Callable[..., Any]) -> Callable[..., Any]:
        return fn

    @staticmethod
    def enable_stack_allocator(fn: Any = None, **kwargs: Any) -> Any:
        return fn if fn is not None else (lambda f: f)

    @staticmethod
    def force_auto_alloc(fn: Any = None, **kwargs: Any) -> Any:
        return fn if fn is not None else (lambda f: f)

    @staticmethod
    def no_reorder(*args: Any, **kwargs: Any) -> Any:
        """``nki.compiler.no_reorder()``: the scheduling barrier ``nl.no_reorder()`` (AWS's attention tutorial)."""
        from torchneuron.nki.language._control_ops import no_reorder

        return no_reorder(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        raise AttributeError(f"nki.compiler.{name} is not provided: torchneuron's nki.compiler has the legacy "
                             "kernel decorators (skip_middle_end_transformations, enable_stack_allocator, "
                             "force_auto_alloc), no_reorder and sbuf/psum.auto_alloc; the legacy manual "
                             f"allocators were removed in {_REMOVED_IN} (allocate with nl.ndarray(..., address=...))")


compiler = _LegacyCompiler()


# The nl modules use each other's names at call time: imported after the definitions (import cycles).
from torchneuron.nki.language._dtype_buffer_ops import float32  # noqa: E402
from torchneuron.nki.language._base_ops import _int, _is_scalar, _isa, _local, _on_chip, _scalar, _tile  # noqa: E402
from torchneuron.nki.language._creation_ops import _fill  # noqa: E402
from torchneuron.nki.language._issue_ops import _is_temporary, _retarget  # noqa: E402
from torchneuron.nki.language._movement_ops import _copy_to_hbm, copy  # noqa: E402
from torchneuron.nki.language._elementwise_ops import _column, _expand, _is_column, add  # noqa: E402
