"""Dataless execution: the device's ops run their shape logic only.

Under :func:`dataless` (or ``TORCHNEURON_DATALESS=1`` for the whole process) neuron
tensors keep their sizes, strides, dtypes, devices, aliasing and allocator accounting
but hold no values: each op that reaches the device runs its Meta kernel (or a shape
rule of :mod:`torchneuron.device.dataless_rules`) instead of computing, and is
counted, placed and charged its modelled time exactly as in a normal run. The caching
allocator runs for real on the sizes (its large blocks are mapped without reserving
host memory), so peaks, fragmentation and out-of-memory errors are the normal run's.
That is how a model too large for this machine is sized and timed
(:mod:`torchneuron.plan`).

What the run never computed cannot be read: ``.item()``, ``.tolist()``, printing and
copies to the host return a placeholder, and each such read is listed
(:func:`reads`) with its call site, because a program whose control flow depends on
it may take another branch than the real run. Placeholders are 0 (False), except
where the value is known without data: fills (``zeros``, ``full``, ``fill_``), and
finite checks, because dataless values are assumed finite (``torch.isfinite(x)`` is
true, ``isnan``/``isinf`` false, GradScaler's ``found_inf`` keeps its value). Ops
whose result *shape* depends on values (``nonzero``, boolean masks, ``unique``...)
take the largest shape possible, or the fraction :func:`shape_hints` gives, and are
listed too (:func:`data_dependent_shapes`).

Nothing made without values leaks into a normal run: outside dataless execution, an
op, a copy or a read of such a tensor raises a ``RuntimeError`` saying so.
"""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from torchneuron import _C, config
from torchneuron.device import accounting, dataless_files

__all__ = ["dataless", "is_active", "holds_values", "known_value", "reads", "data_dependent_shapes",
           "shape_hints", "DataRead", "DataDependentShape", "reset", "SETTING"]

SETTING = "TORCHNEURON_DATALESS"

_lock = threading.Lock()
_env_entered = False  # whether TORCHNEURON_DATALESS holds one level of the switch
_depth = 0  # levels of the switch on (the C++ core's count, mirrored for Python readers)


class _State:
    """The switch as compiled code reads it: ``STATE.on`` before each fused kernel (a skipped
    kernel is still charged), ``STATE.written(...)`` for the graph inputs it writes."""

    on = False

    @staticmethod
    def written(*tensors: torch.Tensor) -> None:
        for t in tensors:
            if isinstance(t, torch.Tensor) and t.device.type == "neuron":
                _C._mark_without_values(t)


    @staticmethod
    def check_inputs(*inputs: object) -> None:
        """Compiled code's entry check: its kernels read the inputs' memory, so outside
        dataless execution none may hold no values (one call while there are none)."""
        if STATE.on or _C._storages_without_values() == 0:
            return
        for t in inputs:
            if isinstance(t, torch.Tensor) and t.device.type == "neuron":
                _C._check_holds_values(t, "a compiled graph reading it")


STATE = _State()


def _enter() -> None:
    global _depth
    dataless_files.install()
    with _lock:
        _C._dataless_enter()
        _depth += 1
        STATE.on = True


def _exit() -> None:
    global _depth
    with _lock:
        _C._dataless_exit()
        _depth -= 1
        STATE.on = _depth > 0


@contextlib.contextmanager
def dataless() -> Iterator[None]:
    """Runs the block without data: every neuron op computes shapes, memory and
    modelled time but no values (process-wide while the block runs; blocks nest).

    Example::

        with torchneuron.dataless():
            model = LlamaForCausalLM(config).to("neuron")   # no bytes allocated on the host
            model(ids).loss.backward()
        print(torch.neuron.max_memory_allocated(), torchneuron.device.dataless.reads())
    """
    torch.neuron.init()
    _enter()
    try:
        yield
    finally:
        _exit()


def is_active() -> bool:
    """Whether neuron ops run dataless now."""
    return STATE.on


def holds_values(tensor: torch.Tensor) -> bool:
    """False if ``tensor``'s storage was made or last written under dataless execution."""
    return _C._holds_values(tensor)


def known_value(tensor: torch.Tensor) -> float | None:
    """The value every element of a dataless tensor is known to hold (a fill, a finite
    check), else None."""
    return _C._known_value(tensor)


def configure() -> None:
    """Applies TORCHNEURON_DATALESS (re-run when it changes)."""
    global _env_entered
    wanted = config.get_flag(SETTING)
    if wanted and not _env_entered:
        _enter()
    elif not wanted and _env_entered:
        _exit()
    _env_entered = wanted


# ---- what the run read that it never computed --------------------------------

@dataclass(frozen=True)
class DataRead:
    """A read of values dataless execution never computed, at one call site."""

    what: str  # "item" (.item(), printing one value) or "copy to the host" (.cpu(), .tolist())
    site: str  # "file:line in function", the innermost frame outside torch and torchneuron
    shape: tuple[int, ...]
    dtype: str
    placeholder: float  # the value the read returned
    known: bool  # the value was known without data (a fill, a finite check)
    calls: int


@dataclass(frozen=True)
class DataDependentShape:
    """An op whose result shape depends on values, at one call site, and the shape taken."""

    op: str
    site: str
    elements: int  # how many elements the op was given (the bound's base)
    chosen: int  # the result length used: the bound, or the hint's fraction of it
    hinted: bool
    calls: int


_reads: dict[tuple[str, str, tuple[int, ...], str, float, bool], int] = {}
_shapes: dict[tuple[str, str, int, int, bool], int] = {}
_hints: dict[str, float] = {}


def _user_site(frame) -> str:
    stack = accounting.user_stack(frame, limit=1)
    return stack[0] if stack else "<unknown>"


def observe_read(what: str, shape: list[int], dtype: str, known: float | None) -> float:
    """The C++ core's question on a read of values never computed: notes the call site,
    returns the placeholder (the known value, else 0)."""
    value = 0.0 if known is None else float(known)
    if dataless_files.counts_placeholder_copy():
        return value  # a save's copy: listed as the save it is (dataless_files.skipped_writes)
    key = (what, _user_site(sys._getframe(1)), tuple(shape), dtype, value, known is not None)
    with _lock:
        _reads[key] = _reads.get(key, 0) + 1
    return value


def bounded_length(op: str, elements: int, frame=None) -> int:
    """The result length of a data-dependent op given ``elements`` inputs: the whole of
    them (the largest result possible), or the hint's fraction; noted with the call site."""
    fraction = _hints.get(op.split(".")[0].removeprefix("aten::"))
    chosen = elements if fraction is None else min(elements, int(round(elements * fraction)))
    key = (op, _user_site(frame if frame is not None else sys._getframe(1)), elements, chosen,
           fraction is not None)
    with _lock:
        _shapes[key] = _shapes.get(key, 0) + 1
    return chosen


@contextlib.contextmanager
def shape_hints(**fractions: float) -> Iterator[None]:
    """Result sizes for ops whose shape depends on values, as a fraction of the largest
    possible, by op name: ``shape_hints(nonzero=0.25, masked_select=0.5, unique=0.1)``
    (``nonzero`` also covers boolean-mask indexing, ``unique`` every unique variant).
    Without a hint the largest shape is used, which sizes memory for the worst case."""
    for name, fraction in fractions.items():
        if not 0.0 <= float(fraction) <= 1.0:
            raise ValueError(f"shape_hints({name}={fraction!r}): a fraction between 0 and 1 is expected")
    with _lock:
        saved = dict(_hints)
        _hints.update({name: float(f) for name, f in fractions.items()})
    try:
        yield
    finally:
        with _lock:
            _hints.clear()
            _hints.update(saved)


def reads() -> list[DataRead]:
    """The reads of never-computed values since the last :func:`reset`, most calls first."""
    with _lock:
        rows = [DataRead(what, site, shape, dtype, value, known, calls)
                for (what, site, shape, dtype, value, known), calls in _reads.items()]
    return sorted(rows, key=lambda r: -r.calls)


def data_dependent_shapes() -> list[DataDependentShape]:
    """Ops whose result shapes depended on values since the last :func:`reset`."""
    with _lock:
        rows = [DataDependentShape(op, site, elements, chosen, hinted, calls)
                for (op, site, elements, chosen, hinted), calls in _shapes.items()]
    return sorted(rows, key=lambda r: -r.calls)


def reset() -> None:
    """Forgets the reads, data-dependent shapes and skipped saves noted so far."""
    with _lock:
        _reads.clear()
        _shapes.clear()
    dataless_files.reset()


def install() -> None:
    """Gives the C++ core its shape rules and read observer (once, at registration)."""
    from torchneuron.device import dataless_rules

    _C._set_dataless_hooks(dataless_rules.shape, observe_read, sorted(dataless_rules.PYTHON_OPS))
