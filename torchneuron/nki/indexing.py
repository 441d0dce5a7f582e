"""Index objects kernels use to address tiles: ``nl.ds`` and the legacy ``nl.arange``/``nl.mgrid``.

Current NKI indexes with integers, slices and ``nl.ds(start, size)``. Legacy
kernels build affine index expressions from ``nl.arange`` / ``nl.mgrid``
(``t[k * 128 + i_p, i_f]``) and masks from comparisons on them
(nki-api-facts.md: 10). Every affine index here has one iteration variable
and unit-free coefficients, so it becomes a strided slice: tiles stay numpy
views and instructions stay vectorised.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["ds", "DynamicSlice", "arange", "AffineIndex", "AffineExpr", "AffinePredicate", "MaskExpr", "mgrid",
           "to_slice"]


@dataclass(frozen=True)
class DynamicSlice:
    """``nl.ds(start, size)``: ``size`` elements from ``start``."""

    start: int
    size: int
    step: int = 1

    def as_slice(self) -> slice:
        return slice(self.start, self.start + self.size * self.step, self.step)


def ds(start: Any, size: int) -> DynamicSlice:
    """A slice of ``size`` elements starting at ``start`` (``t[nl.ds(i * 128, 128), :]``).

    ``start`` may be known only on the device - a register or a ``(1, 1)`` SBUF tile: the view then
    moves by its value when an instruction runs (a ``scalar_offset`` access, dynamic_ap.py)."""
    if type(start).__name__ == "VirtualRegister" or hasattr(start, "_indirect"):
        return DynamicSlice(start, int(size))  # type: ignore[arg-type]
    return DynamicSlice(int(start), int(size))


@dataclass(frozen=True)
class AffineIndex:
    """``offset + step * v`` for an iteration variable ``v`` in ``range(count)``.

    ``position``/``rank`` remember where the variable was broadcast
    (``nl.arange(n)[:, None]`` is position 0 of rank 2); indexing ignores them,
    because each index position of a tile takes its own expression.
    """

    offset: int
    step: int
    count: int
    position: int = 0
    rank: int = 1
    var: int = 0  # identity of the iteration variable, for masks

    def __getitem__(self, key: Any) -> "AffineIndex":
        keys = key if isinstance(key, tuple) else (key,)
        positions = [i for i, k in enumerate(keys) if not (k is None)]
        if len(positions) != 1 or keys[positions[0]] != slice(None):
            raise IndexError("a legacy nl.arange index takes one ':' and Nones, e.g. nl.arange(128)[:, None]")
        return AffineIndex(self.offset, self.step, self.count, positions[0], len(keys), self.var)

    def _affine(self, scale: int, shift: int) -> "AffineIndex":
        return AffineIndex(self.offset * scale + shift, self.step * scale, self.count, self.position,
                           self.rank, self.var)

    def __add__(self, other: Any) -> "AffineIndex":
        if isinstance(other, (AffineIndex, AffineExpr)):
            return AffineExpr.of(self) + other
        return self._affine(1, _int(other, "+"))

    __radd__ = __add__

    def __sub__(self, other: Any) -> "AffineIndex":
        if isinstance(other, (AffineIndex, AffineExpr)):
            return AffineExpr.of(self) - other
        return self._affine(1, -_int(other, "-"))

    def __neg__(self) -> "AffineIndex":
        return self._affine(-1, 0)

    def __mul__(self, other: Any) -> "AffineIndex":
        return self._affine(_int(other, "*"), 0)

    __rmul__ = __mul__

    def __rsub__(self, other: Any) -> "AffineIndex":
        return self._affine(-1, _int(other, "-"))

    def _compare(self, op: str, other: Any) -> "MaskExpr":
        if isinstance(other, (AffineIndex, AffineExpr)):
            return AffinePredicate(AffineExpr.of(self) - other, op)  # type: ignore[return-value]
        return MaskExpr(((self, op, _int(other, op)),))

    def __lt__(self, other: Any) -> "MaskExpr":
        return self._compare("<", other)

    def __le__(self, other: Any) -> "MaskExpr":
        return self._compare("<=", other)

    def __gt__(self, other: Any) -> "MaskExpr":
        return self._compare(">", other)

    def __ge__(self, other: Any) -> "MaskExpr":
        return self._compare(">=", other)

    def values(self) -> range:
        return range(self.offset, self.offset + self.step * self.count, self.step) if self.step > 0 else \
            range(self.offset, self.offset + self.step * self.count, self.step)

    def valid_count(self, masks: "MaskExpr | None") -> int:
        """How many leading values of the variable satisfy every bound in ``masks`` on it.

        Legacy masks bound indices (``i * 128 + i_p < n``); a satisfied prefix keeps
        the access a slice. Non-prefix masks are rejected by the caller.
        """
        if masks is None:
            return self.count
        count = self.count
        for expr, op, bound in masks.terms:
            if expr.var != self.var:
                continue
            valid = [_holds(expr.offset + expr.step * v, op, bound) for v in range(self.count)]
            prefix = valid.index(False) if False in valid else self.count
            if any(valid[prefix:]):
                raise IndexError("a legacy mask must keep a leading run of each index "
                                 "(e.g. i_p < n); rewrite it with min()/slice() bounds")
            count = min(count, prefix)
        return count


def _holds(value: int, op: str, bound: int) -> bool:
    return {"<": value < bound, "<=": value <= bound, ">": value > bound, ">=": value >= bound}[op]


@dataclass(frozen=True)
class AffineExpr:
    """``offset + sum(terms)`` over several iteration variables (legacy ``iota(i_p + i_f)``).

    Sums of indices of different variables are not slices, so they cannot index a
    tile; ``nisa.iota`` and ``nisa.affine_select`` evaluate them, and comparing two
    index expressions gives an :class:`AffinePredicate` (``iy < ix``).
    """

    terms: tuple[AffineIndex, ...]
    offset: int = 0

    @staticmethod
    def of(value: "AffineIndex | AffineExpr") -> "AffineExpr":
        return value if isinstance(value, AffineExpr) else AffineExpr((value,), 0)

    def __add__(self, other: Any) -> "AffineExpr":
        if isinstance(other, (AffineIndex, AffineExpr)):
            terms = list(self.terms)
            for term in AffineExpr.of(other).terms:
                same = next((i for i, t in enumerate(terms) if t.var == term.var and t.position == term.position),
                            None)
                if same is None:
                    terms.append(term)
                else:  # the same variable twice: add the coefficients
                    t = terms[same]
                    terms[same] = AffineIndex(t.offset + term.offset, t.step + term.step, t.count, t.position,
                                              t.rank, t.var)
            return AffineExpr(tuple(terms), self.offset + AffineExpr.of(other).offset)
        return AffineExpr(self.terms, self.offset + _int(other, "+"))

    __radd__ = __add__

    def __mul__(self, other: Any) -> "AffineExpr":
        k = _int(other, "*")
        return AffineExpr(tuple(t * k for t in self.terms), self.offset * k)

    __rmul__ = __mul__

    def __neg__(self) -> "AffineExpr":
        return self * -1

    def __sub__(self, other: Any) -> "AffineExpr":
        if isinstance(other, (AffineIndex, AffineExpr)):
            return self + AffineExpr.of(other) * -1
        return self + -_int(other, "-")

    def __rsub__(self, other: Any) -> "AffineExpr":
        return self * -1 + other

    def _compare(self, op: str, other: Any) -> "AffinePredicate":
        if isinstance(other, (AffineIndex, AffineExpr)):
            return AffinePredicate(self - other, op)
        return AffinePredicate(self - _int(other, op), op)

    def __lt__(self, other: Any) -> "AffinePredicate":
        return self._compare("<", other)

    def __le__(self, other: Any) -> "AffinePredicate":
        return self._compare("<=", other)

    def __gt__(self, other: Any) -> "AffinePredicate":
        return self._compare(">", other)

    def __ge__(self, other: Any) -> "AffinePredicate":
        return self._compare(">=", other)


@dataclass(frozen=True)
class AffinePredicate:
    """``expr op 0`` for an :class:`AffineExpr` (legacy ``affine_select(pred=(iy < ix), ...)``)."""

    expr: AffineExpr
    op: str

    def __and__(self, other: Any) -> Any:
        raise TypeError("affine predicates over several indices cannot be combined with &; use nl.where for "
                        "compound conditions")


@dataclass(frozen=True)
class MaskExpr:
    """A conjunction of bounds on iteration variables (legacy ``mask=``)."""

    terms: tuple[tuple[AffineIndex, str, int], ...]

    def __and__(self, other: "MaskExpr | bool") -> "MaskExpr | bool":
        if isinstance(other, (bool, np.bool_)):  # a compile-time condition (``(2 * i + g) * 128 < n``)
            return self if other else False
        if not isinstance(other, MaskExpr):
            raise TypeError("masks combine with & only with other index comparisons or Python bools")
        return MaskExpr(self.terms + other.terms)

    __rand__ = __and__


def _int(value: Any, op: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        try:
            import numpy as np

            if isinstance(value, np.integer):
                return int(value)
        except ImportError:  # pragma: no cover
            pass
        raise TypeError(f"legacy index arithmetic '{op}' takes Python ints, got {type(value).__name__}")
    return value


_var_ids = iter(range(1, 1 << 62))


def arange(*args: int) -> AffineIndex:
    """Legacy ``nl.arange(n)`` / ``nl.arange(start, stop)``: an iteration variable as an index."""
    start, stop = (0, args[0]) if len(args) == 1 else (args[0], args[1])
    return AffineIndex(start, 1, stop - start, var=next(_var_ids))


class _MGrid:
    """Legacy ``nl.mgrid[0:128, 0:512]``: one index per dimension (also as ``.p``, ``.x``, ``.y``...)."""

    class Grid(tuple):
        @property
        def p(self) -> AffineIndex:
            return self[0]

        @property
        def x(self) -> AffineIndex:
            return self[1]

        @property
        def y(self) -> AffineIndex:
            return self[2]

        @property
        def z(self) -> AffineIndex:
            return self[3]

    def __getitem__(self, key: Any) -> "_MGrid.Grid":
        keys = key if isinstance(key, tuple) else (key,)
        out = []
        for position, k in enumerate(keys):
            if not isinstance(k, slice) or k.stop is None:
                raise IndexError("nl.mgrid takes bounded slices, e.g. nl.mgrid[0:128, 0:512]")
            start = k.start or 0
            out.append(AffineIndex(start, 1, k.stop - start, position, len(keys), next(_var_ids)))
        return _MGrid.Grid(out)


mgrid = _MGrid()


def to_slice(index: Any, masks: MaskExpr | None = None) -> slice:
    """A slice for a ``ds`` / affine index (``masks`` may shorten it)."""
    if isinstance(index, DynamicSlice):
        return index.as_slice()
    if isinstance(index, AffineIndex):
        count = index.valid_count(masks)
        if index.step == 0:
            raise IndexError("a legacy affine index must use its iteration variable (step 0)")
        stop = index.offset + index.step * count
        return slice(index.offset, stop if stop >= 0 else None, index.step)
    raise TypeError(f"not a range index: {index!r}")


def prefix_kept(instr: str, expr: Any, term: Any, described: str) -> int:
    """How many leading indices of ``expr`` the mask bound ``term`` keeps; a bound that keeps no
    leading run (the simulator applies masks as prefixes) is refused at ``instr``."""
    from torchneuron.nki.errors import fail

    try:
        return expr.valid_count(MaskExpr((term,)))
    except IndexError as exc:
        fail(instr, f"mask bound {described} does not keep a leading run of its index ({exc}); only prefix "
             "masks such as i_p < n are simulated: bound the slice with min() instead")

