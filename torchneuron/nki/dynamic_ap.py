"""Indirect (dynamic) access patterns: ``t.ap(..., scalar_offset=..., vector_offset=..., indirect_dim=d)``.

NKI's access-pattern guide (aws-neuron-sdk ``nki/deep-dives/nki-aps.rst``) defines where such an
access starts: ``offset + index * prod(t.shape[d + 1:])``, the index read **when the instruction
runs** from a ``(1, 1)`` SBUF tile or a register (``scalar_offset``: the whole pattern moves), or
one index per partition from a ``(P, 1)`` SBUF tile (``vector_offset``: partition ``p`` starts at
its own index, the pattern's first stride is replaced by that row pitch, only ``indirect_dim=0``
and only on an HBM tensor). So one view built before a loop follows an offset tile the loop
advances, as AWS's dynamic-shape kernels use it.

An :class:`IndirectPattern` is that description; :meth:`IndirectPattern.resolve` turns it into
the element numbers of one execution, bounds-checked: an index is in bounds when it lies in
``0 .. t.shape[d] - 1`` and its whole access stays inside the tensor's storage. Out of bounds is
an error naming the index, its partition, the tensor and the dimension (``oob_mode=error``), or
the row (``vector_offset``) / the whole transfer (``scalar_offset``) is skipped
(``oob_mode=skip``), as ``nisa.dma_copy``'s docstring describes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from torchneuron.nki.dtypes import NkiDType
from torchneuron.nki.errors import fail

__all__ = ["IndirectPattern", "Resolved"]


@dataclass(frozen=True)
class Resolved:
    """One execution of an indirect access: element numbers into the storage, and the rows kept."""

    flat: np.ndarray    # int64, the access's shape: element numbers into the flat storage
    valid: np.ndarray   # bool per row (dim 0 of the access); False rows are skipped (oob_mode=skip)
    indices: np.ndarray  # the index values read (one for scalar_offset, one per row for vector_offset)

    @property
    def all_valid(self) -> bool:
        return bool(self.valid.all())


@dataclass(frozen=True)
class IndirectPattern:
    """An access pattern whose start depends on a runtime index (module docstring)."""

    kind: str                  # "scalar" or "vector"
    source: Any                # NkiTensor (SBUF index tile) or VirtualRegister
    tensor: str                # name of the tensor .ap() was called on
    dim: int                   # indirect_dim
    dim_size: int              # that tensor's size along it
    span: int                  # indices one access covers along ``dim`` (nl.ds size; 1 for .ap)
    scale: int                 # elements per index step (the tensor's stride along ``dim``)
    begin: int                 # static start element (view offset + offset=)
    strides: tuple[int, ...]
    counts: tuple[int, ...]
    dtype: NkiDType
    data: np.ndarray           # the allocation's storage, flat, as ``dtype``
    mask: np.ndarray           # its written-mask, flat

    # ------------------------------------------------------------------ index values
    def index_values(self, instr: str) -> np.ndarray:
        """The offsets as int64 (reading the index tile checks that it was written)."""
        from torchneuron.nki.tensor import NkiTensor

        source = self.source
        if isinstance(source, NkiTensor):
            return np.asarray(source.read(instr)).reshape(-1).astype(np.int64)
        return np.array([int(source.value)], dtype=np.int64)

    def _source_name(self) -> str:
        from torchneuron.nki.tensor import NkiTensor

        return repr(self.source.name) if isinstance(self.source, NkiTensor) else "(a register)"

    # ------------------------------------------------------------------ resolution
    def resolve(self, instr: str, skip: bool = False, compute_values: bool = True) -> Resolved:
        """Element numbers of this execution; out-of-bounds indices fail unless ``skip``."""
        rows = self.counts[0] if self.counts else 1
        if not compute_values:  # a shape-only run: no values, index 0 stands for every index
            indices = np.zeros(rows if self.kind == "vector" else 1, dtype=np.int64)
        else:
            indices = self.index_values(instr)
        inner = np.zeros((), dtype=np.int64)
        first = 1 if self.kind == "vector" else 0
        for stride, count in zip(self.strides[first:], self.counts[first:]):
            inner = inner[..., None] + np.arange(count, dtype=np.int64) * stride
        if self.kind == "vector":
            starts = self.begin + indices * self.scale
            flat = starts.reshape((rows,) + (1,) * inner.ndim) + inner
        else:
            flat = self.begin + int(indices[0]) * self.scale + inner
        if flat.size == 0:
            return Resolved(flat.reshape(self.counts), np.ones(rows, dtype=bool), indices)
        per_row = flat.reshape(rows, -1)
        low, high = per_row.min(axis=1), per_row.max(axis=1)
        if self.kind == "vector":
            idx = indices
        else:
            idx = np.full(rows, indices[0])
            low, high = np.full(rows, low.min()), np.full(rows, high.max())
        ok = (idx >= 0) & (idx + self.span - 1 < self.dim_size) & (low >= 0) & (high < self.data.size)
        if not ok.all() and not skip and compute_values:  # a shape-only run has no index values to check
            self._out_of_bounds(instr, int(np.argmin(ok)), idx, low, high)
        if self.kind == "scalar" and not ok.all():
            ok = np.zeros(rows, dtype=bool)
        return Resolved(flat.reshape(self.counts), ok, indices)

    def _out_of_bounds(self, instr: str, row: int, idx: np.ndarray, low: np.ndarray, high: np.ndarray) -> None:
        value = int(idx[row])
        if self.kind == "vector":
            who = f"vector_offset {self._source_name()} holds {value} at partition {row}"
        else:
            who = f"scalar_offset {self._source_name()} is {value}"
        if value < 0 or value + self.span - 1 >= self.dim_size:
            reach = f"{value}" if self.span == 1 else f"{value}..{value + self.span - 1}"
            where = f"index {reach} is out of bounds for dimension {self.dim} of {self.tensor!r} with size " \
                    f"{self.dim_size}"
        else:
            bad = int(low[row]) if low[row] < 0 else int(high[row])
            where = f"the access then reaches element {bad} of {self.tensor!r}, outside its {self.data.size} " \
                    f"{self.dtype.name} elements"
        fail(instr, f"{who}: {where} (an indirect DMA with oob_mode=error stops here); keep the offsets inside "
             "the tensor, or pass oob_mode=nisa.oob_mode.skip to skip out-of-bounds "
             + ("rows" if self.kind == "vector" else "transfers"))

    # ------------------------------------------------------------------ descriptors
    def contiguous_run(self) -> int:
        """Elements each descriptor moves: the trailing dims of the per-row pattern that are contiguous."""
        first = 1 if self.kind == "vector" else 0
        run = 1
        for stride, count in reversed(list(zip(self.strides[first:], self.counts[first:]))):
            if count == 1:
                continue
            if stride != run:
                break
            run *= count
        return max(run, 1)

    def row_elements(self) -> int:
        first = 1 if self.kind == "vector" else 0
        return math.prod(self.counts[first:]) if len(self.counts) > first else 1
