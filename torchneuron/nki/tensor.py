"""``NkiTensor``: a typed view of one allocation, with NKI's view and partition rules.

A tensor is a numpy view of its allocation's storage plus the matching view of
the written-mask, so every view op (slicing, ``reshape``, ``permute``...)
shares memory and copies nothing, as on the device. On-chip tensors keep dim 0
as the partition dim (nki-api-facts.md: 2): views may not move, reshape or
broadcast it, and stay at least 2-D.

Instructions use :meth:`NkiTensor.read` / :meth:`NkiTensor.write` /
:meth:`NkiTensor.operand`; kernels never touch ``.data``.
"""

from __future__ import annotations

import builtins
import math
from typing import Any, Sequence

import numpy as np

from torchneuron.nki import dtypes as _dtypes
from torchneuron.nki.dtypes import NkiDType, uint_of_size
from torchneuron.nki.errors import NkiUninitializedReadError, fail, kernel_location
from torchneuron.nki import affine_view, context, dynamic_ap, indirect
from torchneuron.nki.indexing import AffineIndex, DynamicSlice, to_slice
from torchneuron.nki.instruction import Operand
from torchneuron.nki.memory import Allocation, Buffer
from torchneuron.nki.mx import require_mx_target

__all__ = ["NkiTensor"]

def _byte_bounds(a: np.ndarray) -> tuple[int, int]:
    """``[low, high)`` byte addresses ``a`` touches (np.byte_bounds, without its Python overhead)."""
    low = high = a.ctypes.data
    for size, stride in zip(a.shape, a.strides):
        if size == 0:
            return low, low
        if stride > 0:
            high += (size - 1) * stride
        else:
            low += (size - 1) * stride
    return low, high + a.itemsize


def _base_address(alloc: Allocation) -> int:
    """Lowest byte address of an allocation's storage (cached: its array never changes)."""
    base = alloc.__dict__.get("_base_address")
    if base is None:
        base = alloc.__dict__["_base_address"] = _byte_bounds(alloc.data)[0]
    return base


def _check_slice(k: slice, size: int, dim: int, name: str) -> None:
    """Fail at the kernel line unless the bounds of slice ``k`` lie inside a dimension of ``size``.

    NumPy clamps slices silently (``a[:, 32:96]`` of a 64-wide tensor is 32 wide);
    a DMA past the end of a tensor reads or overwrites its neighbour on hardware.
    Negative bounds count from the end, as in Python.
    """
    step = 1 if k.step is None else k.step
    for which, bound in (("start", k.start), ("stop", k.stop)):
        if bound is None:
            continue
        value = bound + size if bound < 0 else bound
        limit = size - 1 if step < 0 and which == "start" else size
        if not 0 <= value <= limit:
            text = f"{'' if k.start is None else k.start}:{'' if k.stop is None else k.stop}" + \
                ("" if k.step is None else f":{k.step}")
            fail("index", f"slice {text} is out of bounds for dimension {dim} of {name!r} with size {size} "
                 f"(its {which} {bound} lies outside 0..{size})")


def _is_register(value: Any) -> bool:
    """A ``nisa.VirtualRegister`` (duck-typed: the isa package imports this module)."""
    return type(value).__name__ == "VirtualRegister" and hasattr(value, "value")


def _is_runtime(value: Any) -> bool:
    """An index known only on the device: a register or an on-chip tile."""
    return _is_register(value) or (isinstance(value, NkiTensor) and value.on_chip)


def _axis_vars(keys: list[Any], numpy_keys: list[Any], ndim: int) -> tuple[int | None, ...]:
    """Per axis of a plain-indexed view, the legacy variable indexing it (None: not an affine index).

    Each key gives one axis, except an integer that dropped its dim (an int left in ``numpy_keys``).
    """
    tags = [k.var if type(k) is AffineIndex else None for k, nk in zip(keys, numpy_keys) if type(nk) is not int]
    return tuple(tags) + (None,) * (ndim - len(tags))


class NkiTensor:
    """A tile (SBUF/PSUM) or HBM tensor seen by a kernel."""

    __slots__ = ("_alloc", "_data", "_mask", "_dtype", "_logical_shape", "_axis_vars", "_error", "_indirect",
                 "__weakref__")
    __array_priority__ = 1000  # numpy scalars on the left defer to our operators

    def __init__(self, alloc: Allocation, data: np.ndarray | None = None, mask: np.ndarray | None = None,
                 dtype: NkiDType | None = None, logical_shape: tuple[int, ...] | None = None,
                 axis_vars: tuple[int | None, ...] | None = None) -> None:
        self._alloc = alloc
        self._data = alloc.data if data is None else data
        self._mask = alloc.written if mask is None else mask
        self._dtype = alloc.dtype if dtype is None else dtype
        self._logical_shape = logical_shape
        self._axis_vars = axis_vars
        self._error: str | None = None  # why every access of this view fails (an out-of-range .ap())
        # A dynamic .ap(scalar_offset=/vector_offset=) view: its elements are known only when an
        # instruction runs (torchneuron/nki/dynamic_ap.py); ``_data``/``_mask`` are then placeholders.
        self._indirect: dynamic_ap.IndirectPattern | None = None

    # ----------------------------------------------------------------- metadata
    @property
    def shape(self) -> tuple[int, ...]:
        """The tensor's shape (for a legacy masked HBM access, the full unmasked shape)."""
        return self._logical_shape or tuple(self._data.shape)

    @property
    def dtype(self) -> NkiDType:
        return self._dtype

    @property
    def buffer(self) -> Buffer:
        return self._alloc.buffer

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def name(self) -> str:
        return self._alloc.name

    @property
    def strides(self) -> tuple[int, ...]:
        """Strides in elements."""
        return tuple(s // self._data.itemsize for s in self._data.strides)

    @property
    def offset(self) -> int:
        """Element offset of this view from its allocation's start."""
        lo, _ = _byte_bounds(self._data)
        base, _ = _byte_bounds(self._alloc.data)
        first = lo - base
        # byte_bounds' low end is the first element only when strides are non-negative
        return first // self._data.itemsize

    @property
    def address(self) -> tuple[int, int] | None:
        """``(partition, byte offset)`` given with ``nl.ndarray(..., address=...)``; None when the
        compiler places the tensor (or it is in HBM)."""
        return self._alloc.address

    @property
    def widened(self) -> bool:
        """True for a low-precision float tile held in float32 (``NKI_PRECISE_FP=0``)."""
        return self._data.dtype == np.float32 and self._dtype.name in _dtypes.WIDENED

    @property
    def on_chip(self) -> bool:
        return self._alloc.buffer.on_chip

    @property
    def partition_count(self) -> int:
        """Partitions an on-chip operand spans (dim 0); 1 for scalars-like HBM."""
        return self.shape[0] if self.shape else 1

    @property
    def free_size(self) -> int:
        """Elements per partition (product of the free dims)."""
        return math.prod(self.shape[1:]) if len(self.shape) > 1 else 1

    @property
    def start_partition(self) -> int:
        if not self.on_chip:
            return 0
        return self._alloc.start_partition + self._partition_index()

    @property
    def is_partial(self) -> bool:
        """True for a legacy masked HBM view clipped at the tensor's edge."""
        return self._logical_shape is not None and self._logical_shape != tuple(self._data.shape)

    @property
    def valid_shape(self) -> tuple[int, ...]:
        """Shape of the elements that exist (differs from ``shape`` only for clipped legacy views)."""
        return tuple(self._data.shape)

    def _partition_index(self, lo: int | None = None) -> int:
        if self._data.ndim == 0 or self._alloc.data.ndim == 0:
            return 0
        if lo is None:
            lo = _byte_bounds(self._data)[0]
        row = self._alloc.data.strides[0]
        return int((lo - _base_address(self._alloc)) // row) if row else 0

    def __repr__(self) -> str:
        return (f"NkiTensor(name={self.name!r}, shape={list(self.shape)}, dtype={self.dtype.name}, "
                f"buffer={self.buffer.value})")

    def __len__(self) -> int:
        return self.shape[0]

    def __bool__(self) -> bool:
        """A tensor is truthy: ``if bias:`` on an optional tensor argument is NKI's None check (NKI's
        tensor defines no truth value of its own, so Python's default applies; tensors have no
        comparison operators, so no tile of values can reach a truth test here)."""
        return True

    # ------------------------------------------------------------- data access
    def read(self, instruction: str = "read", *, policy: str | None = None) -> np.ndarray:
        """The values (storage dtype), after checking they were written (per the run's policy)."""
        from torchneuron.nki import context

        if self._indirect is not None:
            return self.read_indirect(self.resolve(instruction), instruction, policy=policy)
        if self._logical_shape is not None:
            self.check_in_bounds(instruction)
        policy = policy or context.uninitialized_policy()
        if policy != "ignore" and self._mask.size and not self._mask.all():
            unwritten = int(self._mask.size - np.count_nonzero(self._mask))
            message = (f"reads {unwritten} of {self._mask.size} elements of {self.name!r} "
                       f"({self.buffer.value}, shape {list(self.valid_shape)}) that no instruction wrote "
                       "(the simulator fills fresh memory with NaN / 4)")
            if policy == "error":
                fail(instruction, message, NkiUninitializedReadError)
            context.warn_uninitialized(instruction, message, kernel_location())
        return self._data

    def check_in_bounds(self, instruction: str, role: str = "") -> None:
        """Fail unless every element of this view exists: a legacy affine index that ran past the end
        of an HBM tensor (a clipped view) must be bounded by the instruction's ``mask=``."""
        if self._error is not None:
            fail(instruction, self._error)
        if self._logical_shape is None or self._logical_shape == tuple(self._data.shape):
            return
        dims = [f"dimension {d} spans {want} elements but only {have} lie inside the tensor"
                for d, (want, have) in enumerate(zip(self._logical_shape, self._data.shape)) if want != have]
        who = f"{role} {self.name!r}" if role else repr(self.name)
        fail(instruction, f"{who} is indexed out of bounds: {'; '.join(dims)}; keep the legacy index inside "
             "the tensor with mask= (e.g. mask=(i * 128 + i_p < n)) or a shorter range")

    def values(self) -> np.ndarray:
        """The values without the written check (for reporting and the torch bridge)."""
        return self._data

    def write(self, values: Any, where: np.ndarray | None = None, instruction: str = "write") -> None:
        """Store ``values`` (converted and rounded to this tensor's dtype) and mark them written."""
        if self._indirect is not None:
            self.write_indirect(self.resolve(instruction), values, where)
            return
        if self._logical_shape is not None:
            self.check_in_bounds(instruction)
        converted = self._converted(values)
        target_shape = self._data.shape
        if where is None:
            self._data[...] = np.broadcast_to(converted, target_shape) if converted.shape != target_shape \
                else converted
            self._mask[...] = np.iinfo(self._mask.dtype).max
        else:
            np.copyto(self._data, np.broadcast_to(converted, target_shape), where=where)
            self._mask[where] = np.iinfo(self._mask.dtype).max

    def _converted(self, values: Any) -> np.ndarray:
        """``values`` in this tensor's storage representation (rounded to its dtype)."""
        if self.widened:  # NKI_PRECISE_FP=0: kept in float32, not rounded to the tile's dtype
            converted = np.asarray(values).astype(np.float32, copy=False)
        else:
            converted = _dtypes.to_storage(np.asarray(values), self._dtype)
        if self._dtype.storage != self._data.dtype and not self.widened:
            converted = converted.view(self._data.dtype)
        return converted

    # ------------------------------------------------------- indirect views
    def is_indirect(self) -> bool:
        """True for a view with a runtime offset (``.ap(scalar_offset=/vector_offset=)``, a dynamic
        ``select``/``vector_select``, ``nl.ds`` with a runtime start)."""
        return self._indirect is not None

    def resolve(self, instruction: str, skip: bool = False) -> "dynamic_ap.Resolved":
        """The elements this indirect view reaches now (its index read), bounds-checked (dynamic_ap)."""
        run = context.maybe_current()
        return self._indirect.resolve(instruction, skip, compute_values=run is None or run.compute_values)

    def read_indirect(self, resolved: "dynamic_ap.Resolved", instruction: str = "read", *,
                      policy: str | None = None) -> np.ndarray:
        """The values of ``resolved``'s kept rows (a gathered copy; skipped rows hold zeros)."""
        pattern = self._indirect
        flat = resolved.flat if resolved.all_valid else resolved.flat[resolved.valid]
        policy = policy or context.uninitialized_policy()
        marks = pattern.mask[flat]
        if policy != "ignore" and marks.size and not marks.all():
            unwritten = int(marks.size - np.count_nonzero(marks))
            message = (f"reads {unwritten} of {marks.size} elements of {self.name!r} ({self.buffer.value}, through "
                       "an indirect access pattern) that no instruction wrote (the simulator fills fresh memory "
                       "with NaN / 4)")
            if policy == "error":
                fail(instruction, message, NkiUninitializedReadError)
            context.warn_uninitialized(instruction, message, kernel_location())
        if resolved.all_valid:
            return pattern.data[flat]
        out = np.zeros(resolved.flat.shape, dtype=pattern.data.dtype)
        out[resolved.valid] = pattern.data[flat]
        return out

    def write_indirect(self, resolved: "dynamic_ap.Resolved", values: Any, where: np.ndarray | None = None) -> None:
        """Scatter ``values`` (the access's shape) to ``resolved``'s kept rows; a repeated element keeps the
        last row's value (partition order)."""
        pattern = self._indirect
        converted = np.broadcast_to(self._converted(values), resolved.flat.shape)
        keep = np.broadcast_to(resolved.valid.reshape((-1,) + (1,) * (resolved.flat.ndim - 1)),
                               resolved.flat.shape)
        if where is not None:
            keep = keep & np.broadcast_to(where, resolved.flat.shape)
        flat = resolved.flat[keep]
        pattern.data[flat] = converted[keep]
        pattern.mask[flat] = np.iinfo(pattern.mask.dtype).max

    def concrete(self, instruction: str) -> "NkiTensor":
        """A ``scalar_offset`` view as the plain view it is now (for compute engines, which read the offset
        register when they run): fails when the offset is out of bounds."""
        pattern = self._indirect
        resolved = self.resolve(instruction)
        start = int(resolved.flat.reshape(-1)[0]) if resolved.flat.size else 0  # element [0, 0, ...]
        item = pattern.data.itemsize
        data = np.lib.stride_tricks.as_strided(pattern.data[start:], pattern.counts,
                                               [s * item for s in pattern.strides])
        mask = np.lib.stride_tricks.as_strided(pattern.mask[start:], pattern.counts,
                                               [s * pattern.mask.itemsize for s in pattern.strides])
        return self._view(data, mask, pattern.dtype)

    def _indirect_operand(self) -> Operand:
        pattern = self._indirect
        resolved = self.resolve("instruction", skip=True)
        item = pattern.dtype.itemsize
        flat = resolved.flat[resolved.valid] if resolved.flat.size else resolved.flat
        lo, hi = (int(flat.min()) * item, (int(flat.max()) + 1) * item) if flat.size else (0, 0)
        rows = self._alloc.data.strides[0] // self._alloc.data.itemsize if self._alloc.data.ndim else 0
        counts = pattern.counts
        partitions = counts[0] if counts else 1
        free = math.prod(counts[1:]) if len(counts) > 1 else 1
        start = self._alloc.start_partition + (lo // item // rows if self.on_chip and rows else 0)
        inner = abs(pattern.strides[-1]) * item if pattern.strides else item
        return Operand(buffer=self.buffer.value, allocation=self._alloc.id, dtype=pattern.dtype.name,
                       shape=tuple(counts), start_partition=start if self.on_chip else 0, partitions=partitions,
                       free_elements=free, itemsize=item, inner_stride_bytes=inner, extent=(lo, hi),
                       row_bytes=int(self._alloc.data.strides[0]) if self._alloc.data.ndim else 0)

    def operand(self) -> Operand:
        """This access as the cost model sees it."""
        if self._indirect is not None:
            return self._indirect_operand()
        if self._logical_shape is not None:
            self.check_in_bounds("instruction")
        lo, hi = _byte_bounds(self._data)
        base = _base_address(self._alloc)
        itemsize = self._dtype.itemsize
        inner = abs(self._data.strides[-1]) // self._data.itemsize * itemsize if self._data.ndim else itemsize
        on_chip = self.on_chip
        if on_chip:
            partitions, free = self.partition_count, self.free_size
        else:
            partitions = self.shape[0] if self.shape else 1
            free = self.size // partitions if partitions else 0
        start = self._alloc.start_partition + self._partition_index(lo) if on_chip else 0
        return Operand(buffer=self.buffer.value, allocation=self._alloc.id, dtype=self._dtype.name,
                       shape=tuple(self.shape), start_partition=start,
                       partitions=partitions, free_elements=free, itemsize=itemsize,
                       inner_stride_bytes=inner, extent=(int(lo - base), int(hi - base)),
                       row_bytes=int(self._alloc.data.strides[0]) if self._alloc.data.ndim else 0)

    def same_memory(self, other: "NkiTensor") -> bool:
        """True when both are the same view of the same allocation."""
        return (self._alloc is other._alloc and self._data.shape == other._data.shape
                and self._data.strides == other._data.strides
                and _byte_bounds(self._data) == _byte_bounds(other._data))

    # ------------------------------------------------------------------ views
    def _view(self, data: np.ndarray, mask: np.ndarray, dtype: NkiDType | None = None,
              logical_shape: tuple[int, ...] | None = None,
              axis_vars: tuple[int | None, ...] | None = None) -> "NkiTensor":
        return NkiTensor(self._alloc, data, mask, dtype or self._dtype, logical_shape, axis_vars)

    @property
    def axis_vars(self) -> tuple[int | None, ...] | None:
        """Per axis, the legacy index variable (``nl.arange``/``nl.mgrid`` identity) that walks it in the
        indexing that made this view (``t[i, j]``), or None; legacy masks on instructions that move data
        between axes (transposes, matmuls) are matched to axes through it."""
        return self._axis_vars

    def __getitem__(self, key: Any) -> "NkiTensor":
        """A view; every index form is bounds-checked against the tensor (a failure names the kernel line).

        Only a legacy affine index (``a[k * 128 + i_p, i_f]``) may run past the end of an HBM
        tensor: the view is then *partial* (clipped), and the instruction using it fails unless a
        legacy ``mask=`` keeps the access inside the tensor (``NkiTensor.check_in_bounds``).
        An HBM tensor indexed by an on-chip tile of row numbers (legacy ``a[idx_tile, cols]``)
        gives an :class:`~torchneuron.nki.indirect.IndirectRows` for ``nl.load`` / ``nl.store``.
        """
        if self._error is not None:
            fail("index", self._error)
        if self._indirect is not None:
            fail("index", f"{self.name!r} is an indirect view (a runtime offset); it cannot be sliced or "
                 "indexed further: slice the tensor first, then take the indirect view of the slice")
        keys = list(key) if isinstance(key, tuple) else [key]
        if not self.on_chip and any(indirect.is_index_tile(k) for k in keys):  # legacy a[b, idx_tile, cols]
            at = next(i for i, k in enumerate(keys) if indirect.is_index_tile(k))
            if not all(isinstance(k, (int, np.integer)) and not isinstance(k, bool) for k in keys[:at]):
                fail("index", f"an index tile may follow only integer indices (a[b, idx, cols]); {self.name!r} is "
                     f"indexed with {key!r}")
            base = self[tuple(keys[:at])] if at else self
            return indirect.IndirectRows.create(base, keys[at], tuple(keys[at + 1:]))
        if any(k is Ellipsis for k in keys):
            at = keys.index(Ellipsis)
            fill = self.ndim - (len(keys) - 1)
            keys[at:at + 1] = [slice(None)] * fill
        if len(keys) > self.ndim:
            raise IndexError(f"too many indices for {self.ndim}-D tensor {self.name!r}: {len(keys)}")
        stored = self._data.shape  # elements that exist (less than ``shape`` in a clipped legacy view)
        shape = self._logical_shape or stored
        if affine_view.needs_positioned_view(keys, self.ndim):
            return self._positioned(keys)
        numpy_keys: list[Any] = []
        logical: list[int] = []
        affine = False
        partial = False
        dropped = 0
        for dim, k in enumerate(keys):
            size = shape[dim]
            if type(k) is slice:
                if self._legacy_clipped_slice(k, size):
                    want = k.stop - k.start  # runs past the end: the instruction's mask= must keep it inside
                    partial = True
                    numpy_keys.append(k)
                    logical.append(want)
                    continue
                if k.start is not None or k.stop is not None or k.step is not None:
                    _check_slice(k, size, dim, self.name)
                want = len(range(*k.indices(size)))
                if size != stored[dim] and len(range(*k.indices(stored[dim]))) != want:
                    partial = True
                numpy_keys.append(k)
                logical.append(want)
            elif isinstance(k, (DynamicSlice, AffineIndex)):
                if type(k) is DynamicSlice and not isinstance(k.start, (int, np.integer)):
                    return self._runtime_slice(keys)  # nl.ds with a register / tile start
                affine = affine or type(k) is AffineIndex
                k, want = self._range_index(k, size, dim)
                if len(range(*k.indices(stored[dim]))) != want:  # clipped (legacy HBM views only)
                    partial = True
                numpy_keys.append(k)
                logical.append(want)
            elif isinstance(k, (int, np.integer)) and not isinstance(k, bool):
                k = int(k)
                if not -size <= k < size:
                    fail("index", f"index {k} is out of bounds for dimension {dim} of {self.name!r} "
                         f"with size {size}")
                if not -stored[dim] <= k < stored[dim]:
                    fail("index", f"index {k} on dimension {dim} of {self.name!r} is out of bounds: a "
                         f"legacy index clipped this view to {stored[dim]} elements")
                # On-chip views keep dim 0 and stay at least 2-D; HBM drops integer-indexed dims.
                keep = self.on_chip and (dim == 0 or self.ndim - dropped - 1 < 2)
                numpy_keys.append(slice(k, k + 1 if k != -1 else None) if keep else k)
                if keep:
                    logical.append(1)
                else:
                    dropped += 1
            else:
                raise TypeError(f"unsupported index {k!r} for NKI tensor {self.name!r}: use ints, slices, "
                                "nl.ds(start, size) or legacy nl.arange/nl.mgrid expressions")
        logical.extend(shape[len(keys):])
        index = tuple(numpy_keys) + (Ellipsis,)  # a 0-d view, never a NumPy scalar, when every dim is an int
        return self._view(self._data[index], self._mask[index],
                          logical_shape=tuple(logical) if partial else None, axis_vars=_axis_vars(keys, numpy_keys, len(logical)) if affine else None)

    def _legacy_clipped_slice(self, k: slice, size: int) -> bool:
        """A legacy kernel's HBM slice ``a[s : s + n]`` that starts inside the tensor and runs past its
        end, as AWS's legacy kernels tile a last partial block and bound it with the instruction's
        ``mask=`` (legacy NKI masks applied to slices and affine indices alike). Current-API kernels
        and on-chip tensors keep the strict slice check."""
        if self.on_chip or k.step not in (None, 1) or not isinstance(k.start, (int, np.integer)) \
                or not isinstance(k.stop, (int, np.integer)) or not 0 <= k.start < size < k.stop:
            return False
        run = context.maybe_current()
        return run is not None and run.legacy

    def _positioned(self, keys: list[Any]) -> "NkiTensor":
        """The view a legacy index addresses by its iterators' roles (``out[i_f, i_p]`` is a transpose)."""
        self._require_whole("index")
        view = affine_view.positioned_view(keys, self.shape, self.name, self.on_chip)
        data = affine_view.strided(self._data, view)
        mask = affine_view.strided(self._mask, view)
        return self._view(data, mask, logical_shape=view.full_counts if view.counts != view.full_counts else None,
                          axis_vars=view.axis_vars)

    def _range_index(self, index: "DynamicSlice | AffineIndex", size: int, dim: int) -> tuple[slice, int]:
        """The slice of an ``nl.ds`` / affine index and its element count, after the bounds rules."""
        if isinstance(index, DynamicSlice):
            start, step, count = index.start, index.step, index.size
        else:
            start, step, count = index.offset, index.step, index.count
        k = to_slice(index)
        if count <= 0:
            return k, 0
        last = start + (count - 1) * step
        if 0 <= start < size and 0 <= last < size:
            return k, count
        if isinstance(index, AffineIndex) and not self.on_chip and 0 <= start and last >= size:
            # A clipped legacy view (past the end, or wholly past it, as AWS's double-buffered
            # kernels index their last, masked-off tile): the instruction's mask= must keep it inside.
            return k, count
        form = f"nl.ds({start}, {count})" if isinstance(index, DynamicSlice) else \
            f"the legacy index {start}" + (f" + {step} * i" if step != 1 else " + i") + f" (i < {count})"
        bad = start if not 0 <= start < size else last
        fail("index", f"{form} is out of bounds for dimension {dim} of {self.name!r} with size {size}: it "
             f"reaches element {bad}")
        raise AssertionError("unreachable")  # fail() raises

    def __setitem__(self, key: Any, value: Any) -> None:
        """``t[...] = x`` copies ``x`` into the view (a tensor_copy, or memset for a scalar)."""
        target = self[key]
        if isinstance(value, NkiTensor) and value.same_memory(target):
            return  # result of an in-place ``t[...] += x``
        from torchneuron.nki.language import legacy  # nl builds on this module: resolved at call time

        legacy.assign_into(target, value)

    def _require_whole(self, op: str) -> None:
        """View ops other than indexing take views whose every element exists (not clipped ones)."""
        if self._indirect is not None:
            fail(op, f"{self.name!r} is an indirect view (a runtime offset); NKI allows no further view of it "
                 "(one dynamic access per tensor): build the view first, then the indirect access")
        if self._logical_shape is not None:
            self.check_in_bounds(op)

    def _check_partition_dim_kept(self, op: str, dims: Sequence[int]) -> None:
        if self.on_chip and dims and dims[0] != 0:
            fail(op, f"on-chip tensor {self.name!r} must keep its partition dimension first "
                 f"(dims[0] must be 0, got {list(dims)})")

    def reshape(self, shape: Sequence[int]) -> "NkiTensor":
        self._require_whole("reshape")
        shape = tuple(int(s) for s in shape)
        if math.prod(shape) != self.size:
            fail("reshape", f"cannot reshape {self.name!r} of shape {list(self.shape)} "
                 f"({self.size} elements) to {list(shape)} ({math.prod(shape)} elements)")
        partitions = self.shape[0] if self.ndim else 1  # a 0-d tile (nl.load(x[b, h])) holds one partition
        if self.on_chip and (shape[0] if shape else 1) != partitions:
            fail("reshape", f"on-chip tensor {self.name!r} cannot change its partition dimension "
                 f"({partitions} -> {shape[0] if shape else 1}); reshape only the free dimensions")
        try:
            data = self._data.view()
            data.shape = shape
            mask = self._mask.view()
            mask.shape = shape
        except AttributeError:
            fail("reshape", f"{self.name!r} is not contiguous enough to view as {list(shape)} without a copy")
        return self._view(data, mask)

    def reshape_dim(self, dim: int, shape: Sequence[int]) -> "NkiTensor":
        new = list(self.shape[:dim]) + list(shape) + list(self.shape[dim + 1:])
        if self.on_chip and dim == 0:
            fail("reshape_dim", f"on-chip tensor {self.name!r} cannot reshape its partition dimension")
        return self.reshape(new)

    def flatten_dims(self, start: int, end: int) -> "NkiTensor":
        new = list(self.shape[:start]) + [math.prod(self.shape[start:end + 1])] + list(self.shape[end + 1:])
        if self.on_chip and start == 0:
            fail("flatten_dims", f"on-chip tensor {self.name!r} cannot fold its partition dimension")
        return self.reshape(new)

    def permute(self, dims: Sequence[int]) -> "NkiTensor":
        self._require_whole("permute")
        dims = tuple(dims)
        self._check_partition_dim_kept("permute", dims)
        return self._view(self._data.transpose(dims), self._mask.transpose(dims))

    def broadcast(self, dim: int, size: int) -> "NkiTensor":
        self._require_whole("broadcast")
        if self.on_chip and dim == 0:
            fail("broadcast", f"on-chip tensor {self.name!r} cannot broadcast its partition dimension")
        if self.shape[dim] != 1:
            fail("broadcast", f"dimension {dim} of {self.name!r} has size {self.shape[dim]}; only size-1 "
                 "dimensions broadcast")
        shape = list(self._data.shape)
        shape[dim] = size
        return self._view(np.broadcast_to(self._data, shape), np.broadcast_to(self._mask, shape))

    def broadcast_to(self, shape: Sequence[int]) -> "NkiTensor":
        """Legacy tile method ``t.broadcast_to(shape)``: ``nl.broadcast_to(t, shape)`` (a new tile if it grows)."""
        from torchneuron.nki import language

        return language.broadcast_to(self, shape)

    def expand_dim(self, dim: int) -> "NkiTensor":
        self._require_whole("expand_dim")
        if self.on_chip and dim == 0:
            fail("expand_dim", f"on-chip tensor {self.name!r} cannot add a dimension before its partitions")
        return self._view(np.expand_dims(self._data, dim), np.expand_dims(self._mask, dim))

    def squeeze_dim(self, dim: int) -> "NkiTensor":
        self._require_whole("squeeze_dim")
        if self.on_chip and dim == 0:
            fail("squeeze_dim", f"on-chip tensor {self.name!r} cannot drop its partition dimension")
        if self.shape[dim] != 1:
            fail("squeeze_dim", f"dimension {dim} of {self.name!r} has size {self.shape[dim]}, not 1")
        return self._view(np.squeeze(self._data, dim), np.squeeze(self._mask, dim))

    def slice(self, dim: int, start: int, end: int, step: int = 1) -> "NkiTensor":
        key: list[Any] = [slice(None)] * self.ndim
        key[dim] = slice(start, end, step)
        return self[tuple(key)]

    def select(self, dim: int, index: Any) -> "NkiTensor":
        """Drop ``dim`` at ``index``: an int, or a ``(1, 1)`` SBUF tile / register read at run time (a
        ``scalar_offset`` access; not on the partition dim of an on-chip tensor)."""
        if _is_runtime(index):
            if self.on_chip and dim == 0:
                fail("select", f"a runtime index cannot select the partition dimension of on-chip tensor "
                     f"{self.name!r}")
            pattern = [[self.strides[d], self.shape[d]] for d in range(self.ndim) if d != dim]
            return self.ap(pattern or [[1, 1]], scalar_offset=index, indirect_dim=dim)
        key: list[Any] = [slice(None)] * self.ndim
        key[dim] = index
        return self[tuple(key)]

    def vector_select(self, dim: int, vector_offset: "NkiTensor") -> "NkiTensor":
        """Partition ``p`` reads index ``vector_offset[p]`` of ``dim`` (must be 0; HBM only): a gather view of
        ``vector_offset.shape[0]`` rows (a ``vector_offset`` access pattern)."""
        if dim != 0:
            fail("vector_select", f"dim must be 0 (the indirect dimension of a vector_offset access), got {dim}")
        rows = vector_offset.shape[0] if isinstance(vector_offset, NkiTensor) and vector_offset.ndim else 1
        pattern = [[self.strides[0], rows]] + [[self.strides[d], self.shape[d]] for d in range(1, self.ndim)]
        return self.ap(pattern, vector_offset=vector_offset, indirect_dim=0)

    def _runtime_slice(self, keys: list[Any]) -> "NkiTensor":
        """``t[..., nl.ds(start, n), ...]`` with ``start`` a register or ``(1, 1)`` tile: the static view
        with the slice at 0, moved by ``start`` along that dim when an instruction runs."""
        runtime = [i for i, k in enumerate(keys) if type(k) is DynamicSlice and not isinstance(k.start, (int,
                                                                                                    np.integer))]
        if len(runtime) > 1:
            fail("index", f"{self.name!r} is indexed with {len(runtime)} runtime nl.ds starts; NKI allows one "
                 "dynamic offset per access")
        at = runtime[0]
        ds_key = keys[at]
        static = list(keys)
        static[at] = DynamicSlice(0, ds_key.size, ds_key.step)
        if ds_key.size > self.shape[at]:
            fail("index", f"nl.ds(..., {ds_key.size}) is longer than dimension {at} of {self.name!r} (size "
                 f"{self.shape[at]})")
        view = self[tuple(static)]
        dropped = 0  # integer keys before ``at`` that dropped their dim (the rule of __getitem__)
        for d, k in enumerate(keys[:at]):
            if isinstance(k, (int, np.integer)) and not isinstance(k, bool):
                if not (self.on_chip and (d == 0 or self.ndim - dropped - 1 < 2)):
                    dropped += 1
        pattern = [[view.strides[d], view.shape[d]] for d in range(view.ndim)]
        return view._ap(pattern, None, ds_key.start, None, at - dropped, None, _scale=self.strides[at],
                        _dim_size=self.shape[at], _span=ds_key.size)

    def view(self, dtype: Any) -> "NkiTensor":
        """Reinterpret the bits as ``dtype``; the last dimension rescales by the size ratio."""
        self._require_whole("view")
        new = _dtypes.resolve(dtype)
        require_mx_target("view", new)
        if self.widened:
            fail("view", f"{self.name!r} ({self.dtype.name}) is held as float32 because NKI_PRECISE_FP=0; a bit "
                 "view needs the tile's real bits: run with NKI_PRECISE_FP=1 (the default)")
        try:
            data = self._data.view(new.storage)
            mask = self._mask.view(uint_of_size(new.storage.itemsize))
        except ValueError as exc:
            fail("view", f"cannot view {self.name!r} ({self.dtype.name}, shape {list(self.shape)}) as "
                 f"{new.name}: {exc}")
        return self._view(data, mask, new)

    def ap(self, pattern: Sequence[Sequence[int]], offset: int | None = None, scalar_offset: Any = None,
           vector_offset: Any = None, indirect_dim: int = 0, dtype: Any = None) -> "NkiTensor":
        """An access pattern ``[[stride, count], ...]`` over the storage under this tensor (nki-api-facts.md: 2).

        The pattern replaces the view's shape and strides; it starts at this view's storage offset plus
        ``offset`` (NKI 0.6.0's stub: ``None`` inherits the view's offset, an int shifts it). With
        ``dtype=`` the storage is reinterpreted as that dtype first (a bit view, no conversion): the
        pattern and ``offset`` then count elements of ``dtype``, and an on-chip partition stride must
        equal the storage's free size rescaled to it (an int32 ``(128, 256)`` tile seen as bfloat16
        has 512 elements per partition).

        ``scalar_offset`` (a ``(1, 1)`` SBUF integer tile or a register) or ``vector_offset`` (a
        ``(P, 1)`` SBUF integer tile; HBM tensors, ``indirect_dim=0``) makes the view indirect: it
        starts ``index * stride(indirect_dim)`` elements further, the index read as each instruction
        runs (torchneuron/nki/dynamic_ap.py).
        """
        return self._ap(pattern, offset, scalar_offset, vector_offset, indirect_dim, dtype)

    def _ap(self, pattern: Sequence[Sequence[int]], offset: int | None, scalar_offset: Any, vector_offset: Any,
            indirect_dim: int, dtype: Any, _scale: int | None = None, _dim_size: int | None = None,
            _span: int = 1) -> "NkiTensor":
        """:meth:`ap`; a runtime ``nl.ds`` passes the stride, size and span of the dim it slices."""
        self._require_whole("ap")
        if vector_offset is not None and scalar_offset is not None:
            fail("ap", "at most one of scalar_offset and vector_offset may be given (they are mutually exclusive)")
        if isinstance(indirect_dim, bool) or not isinstance(indirect_dim, (int, np.integer)) \
                or not 0 <= int(indirect_dim) < builtins.max(self.ndim, 1):
            raise TypeError(f"ap: indirect_dim must be a dimension of the {self.ndim}-D tensor {self.name!r}, "
                            f"got {indirect_dim!r}")
        new = self._dtype if dtype is None else _dtypes.resolve(dtype)
        require_mx_target("ap", new)
        data, mask, item = self._ap_storage(new)
        start = self._ap_start(item, new)
        strides = [int(s) for s, _ in pattern]
        counts = [int(c) for _, c in pattern]
        if self.on_chip and len(self._alloc.shape) > 1:
            free_bytes = math.prod(self._alloc.shape[1:]) * self._alloc.data.itemsize
            if strides[0] * item != free_bytes:
                fail("ap", f"the partition pair's stride must equal the storage's free element count "
                     f"({free_bytes // item}" + (f" {new.name} elements" if new is not self._alloc.dtype else "")
                     + f"), got {strides[0]}")
        begin = start + (0 if offset is None else int(offset))
        if vector_offset is not None or scalar_offset is not None:  # bounds are checked as each instruction runs
            return self._indirect_view(data, mask, item, new, begin, strides, counts, scalar_offset, vector_offset,
                                       int(indirect_dim), _scale, _dim_size, _span)
        reach = [s * (c - 1) for s, c in zip(strides, counts) if c > 0]
        low, high = begin + sum(r for r in reach if r < 0), begin + sum(r for r in reach if r > 0)
        if 0 not in counts and (low < 0 or high >= data.size):
            # NKI checks an access pattern where an instruction uses it: a view built and never
            # accessed is legal, so the error waits for the first read, write or instruction.
            empty = (0,) * len(counts)
            invalid = self._view(data[:0].reshape(empty), mask[:0].reshape(empty), new, logical_shape=tuple(counts))
            invalid._error = (f"access pattern {list(map(list, pattern))} at offset {begin} of {self.name!r} "
                              f"reaches element {low if low < 0 else high}, outside its {data.size} "
                              f"{new.name} elements (0..{data.size - 1})")
            return invalid
        view = np.lib.stride_tricks.as_strided(data[begin:], counts, [s * item for s in strides])
        written = np.lib.stride_tricks.as_strided(mask[begin:], counts, [s * mask.itemsize for s in strides])
        return self._view(view, written, new)

    def _indirect_view(self, data: np.ndarray, mask: np.ndarray, item: int, new: NkiDType, begin: int,
                       strides: list[int], counts: list[int], scalar_offset: Any, vector_offset: Any, dim: int,
                       scale: int | None, dim_size: int | None, span: int) -> "NkiTensor":
        """The view of a dynamic ``.ap()`` (torchneuron/nki/dynamic_ap.py), after NKI's rules on its offsets."""
        kind = "vector" if vector_offset is not None else "scalar"
        source = vector_offset if kind == "vector" else scalar_offset
        if isinstance(source, NkiTensor):
            if source._indirect is not None:
                fail("ap", f"{kind}_offset {source.name!r} is itself an indirect view; load the offsets into a "
                     "plain SBUF tile first")
            if source.buffer is not Buffer.sbuf:
                fail("ap", f"{kind}_offset {source.name!r} is in {source.buffer.value}; the offsets of an indirect "
                     "access are read from SBUF: copy them there with nisa.dma_copy")
            if source.dtype.kind not in ("int", "uint"):
                fail("ap", f"{kind}_offset {source.name!r} is {source.dtype.name}; offsets need an integer tile "
                     "(int32 or uint32)")
            if kind == "scalar" and source.size != 1:
                fail("ap", f"scalar_offset {source.name!r} has shape {list(source.shape)}; it must be a (1, 1) "
                     "SBUF tile or a register (for one offset per partition use vector_offset)")
            if kind == "vector" and (source.free_size != 1 or source.ndim < 1):
                fail("ap", f"vector_offset {source.name!r} has shape {list(source.shape)}; it must be a (P, 1) "
                     "SBUF tile holding one row index per partition")
        elif not _is_register(source):
            raise TypeError(f"ap: {kind}_offset must be an SBUF tile" + (" or a register (nisa.register_alloc)"
                            if kind == "scalar" else "") + f", got {type(source).__name__} (a compile-time "
                            "offset goes in offset=)")
        if kind == "vector":
            if self.on_chip:
                fail("ap", f"vector_offset indexes HBM tensors only; {self.name!r} is in {self.buffer.value} "
                     "(gather within SBUF with nisa.nc_n_gather / nisa.local_gather)")
            if dim != 0:
                fail("ap", f"vector_offset supports only indirect_dim=0 (NKI's access-pattern guide), got {dim}")
            if not isinstance(source, NkiTensor):
                raise TypeError("ap: vector_offset must be a (P, 1) SBUF tile of row indices")
            if source.shape[0] != counts[0]:
                fail("ap", f"vector_offset {source.name!r} holds {source.shape[0]} partitions of indices but the "
                     f"pattern's first pair spans {counts[0]} partitions; they must match")
        if scale is None:
            byte_stride = self._data.strides[dim] if self._data.ndim else item
            if byte_stride % item:
                fail("ap", f"the stride of dimension {dim} of {self.name!r} is not a whole number of {new.name} "
                     "elements")
            scale = byte_stride // item
        elif new.storage.itemsize != self._data.itemsize:
            scale = scale * self._data.itemsize // item
        pattern = dynamic_ap.IndirectPattern(
            kind=kind, source=source, tensor=self.name, dim=dim,
            dim_size=int(self.shape[dim] if dim_size is None else dim_size) if self.ndim else 1, span=span,
            scale=int(scale), begin=begin, strides=tuple(strides), counts=tuple(counts), dtype=new, data=data,
            mask=mask)
        placeholder = np.broadcast_to(data[:1] if data.size else np.zeros(1, data.dtype), tuple(counts))
        placeholder_mask = np.broadcast_to(mask[:1] if mask.size else np.zeros(1, mask.dtype), tuple(counts))
        view = self._view(placeholder, placeholder_mask, new)
        view._indirect = pattern
        return view

    def _ap_storage(self, new: NkiDType) -> tuple[np.ndarray, np.ndarray, int]:
        """The allocation's storage (and written-mask) flattened, reinterpreted as ``new``; its itemsize."""
        data = self._alloc.data.reshape(-1)
        mask = self._alloc.written.reshape(-1)
        if new is self._alloc.dtype or new.storage == data.dtype:
            return data, mask, data.itemsize
        if self._alloc.data.dtype == np.float32 and self._alloc.dtype.name in _dtypes.WIDENED:
            fail("ap", f"dtype={new.name} reinterprets the bits of {self.name!r} ({self._alloc.dtype.name}), which "
                 "is held as float32 because NKI_PRECISE_FP=0: run with NKI_PRECISE_FP=1 (the default)")
        try:
            return data.view(new.storage), mask.view(uint_of_size(new.storage.itemsize)), new.storage.itemsize
        except ValueError as exc:
            fail("ap", f"cannot reinterpret {self.name!r} ({self._alloc.dtype.name}, {data.size} elements) as "
                 f"{new.name}: {exc}")
            raise AssertionError from exc  # fail() raises

    def _ap_start(self, item: int, new: NkiDType) -> int:
        """This view's storage offset, in elements of ``item`` bytes."""
        first = _byte_bounds(self._data)[0] - _base_address(self._alloc)
        if first % item:
            fail("ap", f"{self.name!r} starts {first} bytes into its storage, not a whole number of {new.name} "
                 "elements: reinterpret from an element boundary")
        return first // item

    def is_contiguous(self) -> bool:
        return bool(self._data.flags.c_contiguous)

    # ------------------------------------------------ legacy tile arithmetic
    def _binary(self, op: str, other: Any, reverse: bool = False) -> "NkiTensor":
        from torchneuron.nki import language

        fn = getattr(language, op)
        return fn(other, self) if reverse else fn(self, other)

    def __add__(self, other: Any) -> "NkiTensor":
        return self._binary("add", other)

    def __radd__(self, other: Any) -> "NkiTensor":
        return self._binary("add", other, True)

    def __sub__(self, other: Any) -> "NkiTensor":
        return self._binary("subtract", other)

    def __rsub__(self, other: Any) -> "NkiTensor":
        return self._binary("subtract", other, True)

    def __mul__(self, other: Any) -> "NkiTensor":
        return self._binary("multiply", other)

    def __rmul__(self, other: Any) -> "NkiTensor":
        return self._binary("multiply", other, True)

    def __truediv__(self, other: Any) -> "NkiTensor":
        return self._binary("divide", other)

    def __rtruediv__(self, other: Any) -> "NkiTensor":
        return self._binary("divide", other, True)

    def __pow__(self, other: Any) -> "NkiTensor":
        return self._binary("power", other)

    def __neg__(self) -> "NkiTensor":
        from torchneuron.nki import language

        return language.negative(self)

    def __iadd__(self, other: Any) -> "NkiTensor":
        """Legacy ``psum += nl.matmul(...)`` / ``acc[...] += x``: accumulate into this tensor in place."""
        from torchneuron.nki.language import legacy

        legacy.accumulate_into(self, other)
        return self

    def __isub__(self, other: Any) -> "NkiTensor":
        from torchneuron.nki import language
        from torchneuron.nki.language import legacy

        legacy.assign_into(self, language.subtract(self, other))
        return self

    def __imul__(self, other: Any) -> "NkiTensor":
        from torchneuron.nki import language
        from torchneuron.nki.language import legacy

        legacy.assign_into(self, language.multiply(self, other))
        return self


