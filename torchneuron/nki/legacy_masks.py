"""Legacy ``mask=`` on instructions whose output layout is not their input's (transposes, matmuls).

A legacy mask is an expression in the kernel's index variables, not in output positions:
in ``u[p, q] = nisa.nc_transpose(t[i, j], mask=(i < 72) & (j < 44))`` element ``(i, j)``
lands at ``u[j, i]``, so the instruction writes ``u[:44, :72]``. Applied to the result by
position it would write ``u[:72, :44]``: part of the valid result missed, part taken from
masked-out input (issue 31). Views made by legacy indexing remember which variable walks
each axis (``NkiTensor.axis_vars``); :func:`mapped_mask_counts` matches each bound to an
instruction axis through them and refuses, naming the variables, when it cannot.
"""

from __future__ import annotations

import builtins
from typing import Any, Sequence

from torchneuron.nki.errors import fail
from torchneuron.nki.indexing import MaskExpr, prefix_kept
from torchneuron.nki.tensor import NkiTensor

__all__ = ["describe_mask_term", "mapped_mask_counts"]


def describe_mask_term(term: tuple[Any, str, int]) -> str:
    """A legacy mask bound as the kernel wrote it, with its variable (``128 + i < 200, i = nl.arange(128)
    at axis 0 of 2``), for errors."""
    expr, op, bound = term
    scaled = "i" if expr.step == 1 else f"{expr.step} * i"
    lhs = scaled if expr.offset == 0 else f"{expr.offset} + {scaled}"
    return f"'{lhs} {op} {bound}' (i = nl.arange({expr.count}) at axis {expr.position} of {expr.rank})"


def mapped_mask_counts(instr: str, mask: Any, axes: dict[str, int],
                       operands: Sequence[tuple[str, NkiTensor, tuple[str, ...]]]) -> dict[str, int] | None:
    """Leading extents a legacy ``mask=`` keeps on each named iteration axis of an instruction whose
    output layout differs from its inputs' (transposes, matmuls); None: the whole instruction.

    A mask is an expression in the kernel's index variables, not in output positions: in
    ``u[p, q] = nisa.nc_transpose(t[i, j], mask=(i < 72) & (j < 44))`` element ``(i, j)`` lands
    at ``u[j, i]``. So each bound is matched, by variable identity, to the input axis its
    variable indexes (``operands``: role, input view, the named axis each dim walks); a bound
    whose variable indexes no input axis raises, naming the instruction and the variables.
    """
    if mask is None or mask is True:
        return None
    if mask is False:
        return {name: 0 for name in axes}
    if not isinstance(mask, MaskExpr):
        raise TypeError(f"{instr}: mask must be a comparison of legacy index expressions (e.g. i_p < n), got "
                        f"{type(mask).__name__}")
    where: dict[int, set[str]] = {}
    for _role, tensor, names in operands:
        for dim, var in enumerate(tensor.axis_vars or ()):
            if var is not None and dim < len(names):
                where.setdefault(var, set()).add(names[dim])
    counts = dict(axes)
    unmatched: list[str] = []
    for term in mask.terms:
        expr = term[0]
        found = where.get(expr.var, set())
        if len(found) != 1:
            if found:
                fail(instr, f"mask bound {describe_mask_term(term)} is on a variable that indexes several axes "
                     f"({', '.join(sorted(found))}) of the inputs; give each axis its own nl.arange")
            unmatched.append(describe_mask_term(term))
            continue
        (name,) = found
        kept = prefix_kept(instr, expr, term, describe_mask_term(term))
        counts[name] = builtins.min(counts[name], kept)
    if unmatched:
        roles = ", ".join(f"{role}{list(t.shape)}" for role, t, _ in operands)
        fail(instr, f"legacy mask bound(s) {'; '.join(unmatched)} use index variables that index none of the "
             f"inputs ({roles}); {instr} moves elements between axes, so a mask is matched to the axes through "
             f"the variables the inputs are indexed with: index the inputs with those variables "
             "(e.g. nisa.nc_transpose(t[i, j], mask=(i < n) & (j < m))) or slice them to the valid region instead")
    return counts
