"""Legacy indexing of an HBM tensor by an on-chip index tile: ``nl.load(a[idx, cols])``.

Legacy NKI kernels gather (and scatter) HBM rows through a tile of row numbers: with
``idx`` an integer ``[P, 1]`` SBUF tile, ``nl.load(a[idx, i_f])`` is the ``[P, F]`` tile
whose row ``p`` is ``a[idx[p], i_f]``, and ``nl.store(a[idx, i_f], value=t)`` writes
row ``p`` of ``t`` to ``a[idx[p], i_f]`` - one indirect DMA whose descriptors the
index tile supplies (current NKI spells it ``.ap(vector_offset=idx, indirect_dim=0)``,
nki-api-facts.md: 4.5). An index outside the tensor is an error, as
``oob_mode=error`` is. Only dim 0 may be indexed by a tile.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from torchneuron.nki.errors import fail
from torchneuron.nki.indexing import AffineExpr, AffineIndex

__all__ = ["IndirectRows", "is_index_tile"]


def is_index_tile(key: Any) -> bool:
    """True for an on-chip tile used as an index (``a[idx_tile, ...]``)."""
    from torchneuron.nki.tensor import NkiTensor

    return isinstance(key, NkiTensor) and key.on_chip


@dataclass(frozen=True)
class IndirectRows:
    """HBM ``base`` rows chosen by the ``[P, 1]`` integer tile ``index``; ``rest`` indexes each row."""

    base: Any   # NkiTensor in HBM
    index: Any  # NkiTensor on chip, [P, 1] integers
    rest: tuple

    @staticmethod
    def create(base: Any, index: Any, rest: tuple) -> "IndirectRows":
        if index.dtype.kind not in ("int", "uint") or index.ndim != 2 or index.shape[1] != 1:
            fail("index", f"indexing {base.name!r} by tile {index.name!r} needs an integer [P, 1] tile of row "
                 f"numbers, got {index.dtype.name} {list(index.shape)}")
        if any(is_index_tile(k) for k in rest):
            fail("index", f"only dimension 0 of {base.name!r} may be indexed by a tile")
        rows = IndirectRows(base, index, tuple(rest))
        rows.row(0)  # bounds-check the per-row index now, at the kernel line
        return rows

    @property
    def name(self) -> str:
        return f"{self.base.name}[{self.index.name}]"

    @property
    def shape(self) -> tuple[int, ...]:
        return (self.index.shape[0],) + self.row_shape

    @property
    def row_shape(self) -> tuple[int, ...]:
        """One row's shape; a legacy affine column index (``i_f = nl.arange(C)[None, :]``) is broadcast
        over the partition axis, whose size-1 dim the index tile's partitions take."""
        shape = tuple(self.row(0).shape)
        if len(shape) > 1 and shape[0] == 1 and any(isinstance(k, (AffineIndex, AffineExpr)) for k in self.rest):
            shape = shape[1:]
        return shape

    def first(self, count: int) -> "IndirectRows":
        """The rows of the first ``count`` partitions (a legacy partition mask ``i_p < count``)."""
        return IndirectRows(self.base, self.index[0:count, :], self.rest)

    def row(self, number: int) -> Any:
        """The HBM view ``base[number][rest]`` (bounds-checked)."""
        return self.base[(int(number),) + self.rest]

    def row_numbers(self, instr: str, compute_values: bool) -> np.ndarray:
        """The index tile's values, checked against dim 0 of ``base`` (zeros in a shape-only run)."""
        if not compute_values:
            return np.zeros(self.index.shape[0], dtype=np.int64)
        numbers = self.index.read(instr).reshape(-1).astype(np.int64)
        size = self.base.shape[0]
        bad = numbers[(numbers < 0) | (numbers >= size)]
        if bad.size:
            fail(instr, f"index tile {self.index.name!r} holds row {int(bad[0])}, out of bounds for dimension 0 "
                 f"of {self.base.name!r} with size {size} (an indirect DMA with oob_mode=error)")
        return numbers
