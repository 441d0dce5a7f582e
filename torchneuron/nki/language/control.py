"""Loops, control flow and programs in ``nl``: the ``*_range`` iterators, host-run
``fori_loop``/``while_loop``, ``no_reorder`` scopes, SPMD program queries
(``program_id``, ``num_programs``, ``program_ndim``), ``device_print`` and the legacy
grid dims (``nc``, ``spmd_dim``)."""

from __future__ import annotations

import contextlib
import math
import operator
import warnings
from typing import Any, Callable, Iterator

import numpy as np

from torchneuron.nki import context
from torchneuron.nki.errors import fail
from torchneuron.nki.language.core import (
    as_int, as_tile, last_own_instruction, mask_shape, masked_view, nisa, own_instructions_since, scope_ids, state,
)


# ===================================================== loops and control flow


def _range(op: str, start: Any, stop: Any, step: Any) -> range:
    if stop is None:
        start, stop = 0, start
    return range(as_int(start, op), as_int(stop, op), as_int(step, op))


# Scheduling hints legacy kernels give their loops (AWS's attention tutorial:
# ``sequential_range(n, directives=nki.compiler.no_reorder())``, pipelined attention:
# ``affine_range(n, precise_schedule=True)``): the order of instructions in a loop, never their
# values; the simulator runs every loop in program order, so they change nothing. Any other
# keyword is an error, never silently dropped.
_LOOP_HINTS = ("directives", "precise_schedule")


def _loop_hints(op: str, legacy: dict[str, Any]) -> None:
    unknown = sorted(set(legacy) - set(_LOOP_HINTS))
    if unknown:
        raise TypeError(f"nl.{op}() got unexpected keyword argument(s) {', '.join(unknown)}; it takes start, stop, "
                        f"step and the legacy scheduling hints {', '.join(_LOOP_HINTS)}")


def affine_range(start: Any, stop: Any = None, step: Any = 1, **legacy: Any) -> range:
    """Alias of Python ``range`` (deprecated in current NKI: prefer ``range``)."""
    _loop_hints("affine_range", legacy)
    return _range("affine_range", start, stop, step)


def sequential_range(start: Any, stop: Any = None, step: Any = 1, **legacy: Any) -> range:
    """Alias of Python ``range`` (deprecated in current NKI: prefer ``range``)."""
    _loop_hints("sequential_range", legacy)
    return _range("sequential_range", start, stop, step)


def static_range(start: Any, stop: Any = None, step: Any = 1, **legacy: Any) -> range:
    """Alias of Python ``range`` (deprecated in current NKI: prefer ``range``)."""
    _loop_hints("static_range", legacy)
    return _range("static_range", start, stop, step)


def dynamic_range(start: Any, stop: Any = None, step: Any = 1) -> range:
    """Removed in NKI 0.7.0: runs as ``range`` with a DeprecationWarning; use :func:`fori_loop`."""
    warnings.warn("nl.dynamic_range was removed in NKI 0.7.0; use nl.fori_loop(lower, upper, body)",
                  DeprecationWarning, stacklevel=2)
    return range(_register_value(start if stop is not None else 0),
                 _register_value(stop if stop is not None else start), as_int(step, "dynamic_range"))


def _register_value(value: Any) -> int:
    """The integer held by a loop bound: an int or an ISA register."""
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        return int(value)
    for attr in ("value", "_value"):
        held = getattr(value, attr, None)
        if isinstance(held, (int, np.integer)):
            return int(held)
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"a loop bound must be an int or a register (nisa.register_alloc), got "
                        f"{type(value).__name__}") from None


def _no_dynamic_loop_in_no_reorder(op: str) -> None:
    if getattr(state, "no_reorder", ()):
        fail(op, f"nl.{op} is not allowed inside nl.no_reorder() (nki-api-facts.md: 3.7); move the loop out "
             "or use a static range() loop")


def fori_loop(lower: Any, upper: Any, body_fun: Callable[[Any], Any], step: int = 1) -> None:
    """Runtime loop ``for i in range(lower, upper, step): body_fun(i)``; bounds may be registers.

    ``i`` is a ``nisa.VirtualRegister`` (its value lives on the device: it feeds
    register instructions, not Python arithmetic), as in NKI 0.6/0.7.
    """
    _no_dynamic_loop_in_no_reorder("fori_loop")
    step = as_int(step, "fori_loop")
    if step <= 0:
        fail("fori_loop", f"step must be a positive compile-time int, got {step}")
    register = nisa().VirtualRegister
    for i in range(_register_value(lower), _register_value(upper), step):
        body_fun(register(i))  # a fresh read-only register per iteration, as on the device


def while_loop(init: Any, body_fun: Callable[[Any], Any]) -> None:
    """Runtime loop: while the condition register is non-zero, ``cond = body_fun(cond)``."""
    _no_dynamic_loop_in_no_reorder("while_loop")
    cond = init
    while _register_value(cond) != 0:
        cond = body_fun(cond)
        if cond is None:
            fail("while_loop", "the body must return the next condition register")


@contextlib.contextmanager
def no_reorder() -> Iterator[None]:
    """Keep program order for every instruction issued in this (dynamic) scope (decision 10)."""
    run = context.current()
    scope = next(scope_ids)
    marker = last_own_instruction(run)
    outer = getattr(state, "no_reorder", ())
    state.no_reorder = outer + (scope,)
    try:
        yield
    finally:
        state.no_reorder = outer
        for ins in own_instructions_since(run, marker):
            have = ins.attrs.get("no_reorder")
            scopes = () if have is None else (have if isinstance(have, tuple) else (have,))
            scopes = (scope,) + scopes
            run.records.update_attrs(ins, no_reorder=scopes[0] if len(scopes) == 1 else scopes)


def program_id(axis: int = 0) -> int:
    """Index of this program along ``axis`` of the launch grid (0 or 1 under LNC2)."""
    return context.program_id(axis)


_ALL_AXES = object()


def num_programs(axes: Any = _ALL_AXES) -> int:
    """Programs along ``axes`` (default: axis 0; all axes of a legacy multi-dim grid; decision 8)."""
    if axes is _ALL_AXES:
        axes = None if context.program_ndim() > 1 else 0
    return context.num_programs(axes)


def program_ndim() -> int:
    """Dimensions of the launch grid."""
    return context.program_ndim()


def device_print(print_prefix: str, tensor: Any, *, mask: Any = None) -> None:
    """Print ``print_prefix`` and the tile's values to stdout (simulator behaviour; not an instruction);
    a legacy ``mask=`` prints only the region it keeps."""
    t = as_tile(tensor, "device_print", "tensor")
    t = masked_view(t, mask_shape(mask, tuple(t.shape), "device_print"))
    print(print_prefix, np.asarray(t.values()), flush=True)


class GridDim(int):
    """A legacy launch-grid dim (``nl.nc(2)``, ``nl.spmd_dim(...)``): its size; programs run serially."""

    @property
    def lnc_degree(self) -> int:
        return int(self)

    def __repr__(self) -> str:
        return f"GridDim({int(self)})"


def nc(n: int) -> GridDim:
    """Legacy: a launch-grid dim of ``n`` logical cores (``kernel[nl.nc(2), 2]``)."""
    return GridDim(as_int(n, "nc"))


def spmd_dim(*factors: Any) -> GridDim:
    """Legacy: a launch-grid dim tiled over sub-dims (``nl.spmd_dim(nl.nc(2), 2)`` has size 4)."""
    return GridDim(math.prod(as_int(f, "spmd_dim") for f in factors))
