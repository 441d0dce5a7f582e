"""Legacy NKI support in ``nl`` (block dims ``par_dim`` / ``BlockTensor`` are in :mod:`.core`): the
:func:`assign_into` / :func:`accumulate_into` hooks behind ``t[...] = x`` and ``t += x``
(including legacy matmul accumulation, decision 5), the removed APIs that raise with
their replacement, and the legacy ``compiler`` namespace object."""

from __future__ import annotations

import builtins as _b
import sys
import warnings
from typing import Any, Callable

import numpy as np

from torchneuron.nki import context, dialect
from torchneuron.nki.errors import NkiValidationError, fail
from torchneuron.nki.language.compute import add, broadcast_view, column_operand, is_column
from torchneuron.nki.language.control import no_reorder
from torchneuron.nki.language.core import (
    as_scalar, as_tile, is_scalar, is_temporary, nisa, require_on_chip, retarget, state,
)
from torchneuron.nki.language.memory import fill_tensor, float32
from torchneuron.nki.language.movement import copy, copy_to_hbm
from torchneuron.nki.memory import Buffer
from torchneuron.nki.tensor import NkiTensor


# =================================================== legacy assignment hooks


def assign_into(target: NkiTensor, value: Any) -> None:
    """``target[...] = value`` (from ``NkiTensor.__setitem__``): a copy, DMA or memset into ``target``."""
    temporary = is_temporary(sys.getrefcount(value), "assign")
    if is_scalar(value):
        fill_tensor(target, value, "assign")
        return
    value = as_tile(value, "assign", "value")
    if not target.on_chip:
        copy_to_hbm(target, value, "assign")  # a clipped legacy view fails there: no mask= to bound it
        return
    if temporary and value.on_chip and nisa().masked_legacy_result(value):
        box = _written_box(value)
        if box is None:
            return  # its mask kept nothing: the statement writes nothing, as in legacy NKI
        target, value = target[box], value[box]
    if retarget(target, value, temporary):
        return
    if temporary and target.buffer is Buffer.psum and target.shape == value.shape and _matmul_into(target, value):
        return  # the legacy psum[...] = nisa.nc_matmul(a, b): the matmul writes target itself
    if not value.on_chip:
        nisa().dma_copy(dst=target, src=value)
        return
    src = value
    if value.shape != target.shape and value.shape[0] in (target.shape[0], 1):
        try:
            src = broadcast_view(value, target.shape, "assign")
        except (ValueError, AssertionError):
            src = value
    nisa().tensor_copy(dst=target, src=src)


def _written_box(value: NkiTensor) -> tuple[slice, ...] | None:
    """The leading box of ``value`` its instruction wrote (a legacy mask keeps a leading box), or None."""
    written = value._mask != 0
    if not written.any():
        return None
    return tuple(slice(0, int(np.nonzero(written.any(axis=tuple(a for a in range(written.ndim) if a != d)))[0][-1]) + 1)
                 for d in range(written.ndim))


def _matmul_into(target: NkiTensor, value: NkiTensor) -> bool:
    """Retarget the newest legacy ``nisa.nc_matmul`` result ``value`` to write ``target``
    (a new accumulation group); False, with nothing changed, when the matmul could not have
    written ``target`` directly (another dtype, a bank-crossing view...): a copy then assigns it."""
    try:
        return nisa().accumulate_matmul_result(target, value, overwrite=True)
    except NkiValidationError:  # raised by the checks, before anything is written
        return False


def accumulate_into(target: NkiTensor, value: Any) -> None:
    """``target += value`` (from ``NkiTensor.__iadd__``): matmul accumulation or an element-wise add.

    A temporary fresh ``nl.matmul`` result accumulating into a PSUM tile of the
    same shape becomes the matmul itself writing ``target`` (decisions 4 and 5).
    """
    temporary = is_temporary(sys.getrefcount(value), "accumulate")
    if not target.on_chip:
        fail("accumulate", f"{target.name!r} is in {target.buffer.value}; '+=' on HBM needs a read-modify-write "
             "DMA: load the tile, add, and store it back (or use nisa.dma_compute)")
    if isinstance(value, NkiTensor) and target.buffer is Buffer.psum and value.buffer is Buffer.psum:
        fresh = getattr(state, "fresh", None)
        if temporary and fresh is not None and fresh.kind == "matmul" and fresh.result() is value:
            group = _matmul_group(target)
            if group in ("open", "zero") and target.shape == value.shape and \
                    nisa().accumulate_matmul_result(target, value, starts_group=group == "zero"):
                state.fresh = None
                return  # the ISA folds the add into the recorded matmul (no second matmul run)
            if group is not None and retarget(target, value, True, accumulate=group == "open"):
                return
        elif temporary and nisa().accumulate_matmul_result(
                target, value, starts_group=_matmul_group(target) in ("zero", "fresh")):
            return  # legacy ``psum[...] += nisa.nc_matmul(a, b)``: the ISA folds it into the matmul (decision 5)
        staged = copy(value, float32) if value.dtype.is_float else copy(value)
        nisa().tensor_tensor(dst=target, data1=target, data2=staged, op=add)
        return
    if is_scalar(value):
        nisa().tensor_scalar(dst=target, data=target, op0=add, operand0=as_scalar(value))
        return
    value = require_on_chip(as_tile(value, "accumulate", "value"), "accumulate", "value")
    if value.shape != target.shape and is_column(value, target.shape[0]) and target.free_size > 1:
        nisa().tensor_scalar(dst=target, data=target, op0=add, operand0=column_operand(value))
        return
    nisa().tensor_tensor(dst=target, data1=target, data2=broadcast_view(value, target.shape, "accumulate"), op=add)


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
    fresh = getattr(state, "fresh", None)
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
    def enable_stack_allocator(fn: Any = None, log_level: int = 50) -> Any:
        """Legacy allocator choice (and its log level): placement only, never values."""
        return fn if fn is not None else (lambda f: f)

    @staticmethod
    def force_auto_alloc(fn: Any = None) -> Any:
        return fn if fn is not None else (lambda f: f)

    @staticmethod
    def no_reorder(*args: Any, **kwargs: Any) -> Any:
        """``nki.compiler.no_reorder()``: the scheduling barrier ``nl.no_reorder()`` (AWS's attention tutorial)."""
        return no_reorder(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        raise AttributeError(f"nki.compiler.{name} is not provided: torchneuron's nki.compiler has the legacy "
                             "kernel decorators (skip_middle_end_transformations, enable_stack_allocator, "
                             "force_auto_alloc), no_reorder and sbuf/psum.auto_alloc; the legacy manual "
                             f"allocators were removed in {_REMOVED_IN} (allocate with nl.ndarray(..., address=...))")


compiler = _LegacyCompiler()
