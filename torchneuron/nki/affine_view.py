"""Legacy affine indices whose iterators are laid out by their *role*, not by the dim they index.

In legacy NKI an index expression is a NumPy-style broadcast of its iteration
variables: ``i_p = nl.arange(128)[:, None]`` is the tile's partition axis and
``i_f = nl.arange(64)[None, :]`` its free axis wherever they appear. So
``out[i_f, i_p]`` addresses a transposed HBM region (the tile's partition axis
walks ``out``'s second dim), ``t[i_p, i_f2 * 64 + i_f1]`` splits one dim over two
free axes, and ``idx[i_p]`` of a 1-D tensor is a ``[P, 1]`` tile
(nki-api-facts.md: 10, "indexing"). This module turns such a key into the strided
view it addresses: result axis ``k`` is the variable broadcast at position ``k``
(size 1 where no variable is), with stride the sum of that variable's
coefficients times the dims' strides. Keys whose variables already sit in dim
order are left to ``NkiTensor.__getitem__``'s plain slicing (same result).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from torchneuron.nki.errors import fail
from torchneuron.nki.indexing import AffineExpr, AffineIndex

__all__ = ["needs_positioned_view", "PositionedView", "positioned_view"]


def _is_int(k: Any) -> bool:
    return isinstance(k, (int, np.integer)) and not isinstance(k, bool)


def _terms(k: Any) -> tuple[int, tuple[AffineIndex, ...]]:
    """(constant offset, variable terms with unit offsets) of an affine key."""
    if isinstance(k, AffineIndex):
        return k.offset, (k,)
    terms = tuple(k.terms)
    return k.offset + sum(t.offset for t in terms), terms


def _rank(keys: Sequence[Any]) -> int:
    return max((t.rank for k in keys if not _is_int(k) for t in _terms(k)[1]), default=1)


def needs_positioned_view(keys: Sequence[Any], ndim: int) -> bool:
    """True when ``keys`` index by iterator role in a way plain per-dim slicing would get wrong.

    That is: every key is an int or an affine expression (one per dim), at least one
    variable was broadcast (``[:, None]``, ``nl.mgrid``) or one dim sums several
    variables, and the variables do not already appear in order, one per remaining dim.
    """
    if len(keys) != ndim or not keys:
        return False
    if not all(_is_int(k) or isinstance(k, (AffineIndex, AffineExpr)) for k in keys):
        return False
    affine = [k for k in keys if not _is_int(k)]
    if not affine:
        return False
    multi = any(len({t.var for t in _terms(k)[1]}) > 1 for k in affine)
    rank = _rank(keys)
    if not multi and rank == 1:
        return False  # rank-1 nl.arange in several dims: an outer product, plain slicing is right
    positions = [_terms(k)[1][0].position + rank - _terms(k)[1][0].rank for k in affine]
    return multi or positions != list(range(len(affine))) or len(affine) != rank


@dataclass(frozen=True)
class PositionedView:
    """Where a positioned key lands: the view's origin offset (elements, per dim), per-axis counts and strides."""

    origin: tuple[int, ...]      # element index of the view's first element, per dim of the tensor
    counts: tuple[int, ...]      # elements per result axis, clipped at an HBM tensor's edge
    full_counts: tuple[int, ...]  # elements per result axis as written (differs when clipped)
    steps: tuple[tuple[int, ...], ...]  # per result axis: its element step along each tensor dim
    axis_vars: tuple[int | None, ...] = ()  # per result axis: the index variable walking it (None: none)


def positioned_view(keys: Sequence[Any], shape: Sequence[int], name: str, on_chip: bool) -> PositionedView:
    """Resolve ``keys`` (see :func:`needs_positioned_view`) against a tensor of ``shape``.

    Fails at the kernel line when the expression leaves the tensor (an HBM access
    may run past the end along the outermost variable of a dim, to be bounded by the
    instruction's legacy ``mask=``), when two variables share a result axis, or when
    an on-chip tile would lose its partition dim (a transpose needs TensorE or a DMA).
    """
    rank = _rank(keys)
    ndim = len(shape)
    origin = [0] * ndim
    axis_var: dict[int, AffineIndex] = {}
    steps = [[0] * ndim for _ in range(rank)]
    dim_vars: list[list[tuple[int, AffineIndex]]] = [[] for _ in range(ndim)]
    for dim, k in enumerate(keys):
        if _is_int(k):
            origin[dim] = int(k) + (shape[dim] if int(k) < 0 else 0)
            continue
        offset, terms = _terms(k)
        origin[dim] = offset
        for t in terms:
            axis = t.position + rank - t.rank
            if axis in axis_var and axis_var[axis].var != t.var:
                fail("index", f"two different legacy index variables both run along axis {axis} of the tile "
                     f"indexing dimension {dim} of {name!r}; give each nl.arange its own axis "
                     "(e.g. nl.arange(n)[:, None] and nl.arange(m)[None, :])")
            axis_var[axis] = t
            steps[axis][dim] += t.step
            dim_vars[dim].append((axis, t))
    counts = [axis_var[a].count if a in axis_var else 1 for a in range(rank)]
    full = list(counts)
    if on_chip:
        p_axes = [a for a, _ in dim_vars[0]]
        if p_axes not in ([], [0]) or any(steps[0][d] for d in range(1, ndim)):
            fail("index", f"this legacy index walks on-chip tile {name!r}'s partition dimension along another "
                 "axis of the result (a transpose); on-chip views keep partitions first - transpose with "
                 "nisa.nc_transpose / nl.transpose, or with a DMA from HBM")
    for dim in range(ndim):
        size = shape[dim]
        low = high = origin[dim]
        for axis in range(rank):
            extent = steps[axis][dim] * (counts[axis] - 1)
            low, high = low + min(0, extent), high + max(0, extent)
        if 0 <= low and high < size:
            continue
        # An HBM access may run past the end along the first (outermost) variable of a dim whose
        # steps are all positive - ``in_tensor[i_h + i_kh, i_w]`` with ``mask=(i_h < n)`` - when
        # the other variables' reach still fits: the mask must then cut that axis (checked by the
        # instruction), as legacy kernels bound their last partial tile.
        axes = sorted({a for a, _ in dim_vars[dim]})
        if not on_chip and axes and all(steps[a][dim] > 0 for a in axes) and 0 <= origin[dim] < size:
            axis, step = axes[0], steps[axes[0]][dim]
            reach = origin[dim] + sum(steps[a][dim] * (counts[a] - 1) for a in axes[1:])
            counts[axis] = min(counts[axis], max(0, (size - 1 - reach) // step + 1))
            continue
        bad = low if low < 0 else high
        fail("index", f"the legacy index on dimension {dim} of {name!r} with size {size} reaches element {bad}: "
             "out of bounds")
    return PositionedView(tuple(origin), tuple(counts), tuple(full), tuple(tuple(s) for s in steps),
                          tuple(axis_var[a].var if a in axis_var else None for a in range(rank)))


def strided(array: np.ndarray, view: PositionedView) -> np.ndarray:
    """The NumPy view of ``array`` (same shape as the tensor) that ``view`` addresses (shares memory)."""
    base = array[tuple(slice(o, None) if o < n else slice(n, None) for o, n in zip(view.origin, array.shape))]
    strides = tuple(sum(step * s for step, s in zip(axis_steps, array.strides)) for axis_steps in view.steps)
    return np.lib.stride_tricks.as_strided(base, view.counts, strides, writeable=array.flags.writeable)
