"""The one record of what ran on the neuron devices, and the only reader of it.

Every op, copy, compiled kernel, NKI kernel and collective is recorded once,
in the C++ core: per (op, dtypes) a record (calls, where real Trainium runs
it, bytes a CPU fallback moves), per (op, shapes) a cost entry (modelled
seconds, FLOPs), one counter per link of the copies that leave a device, the
named work the op path does not see (NKI kernels, collectives) and, while a
profiler records, one event per call with its modelled start and duration.
Metrics (:mod:`torchneuron.profiler.metrics`), :func:`torchneuron.estimate`,
``torch.profiler`` traces and the compile counters are views of it; the
compiler, the NKI bridge and the c10d backend record through it. No other
module reads or writes these bindings, so the views always agree.
"""

from __future__ import annotations

import contextlib
import enum
import functools
import threading
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from torchneuron import _C

__all__ = [
    "WorkKind", "OpTotals", "WorkTotals", "Event", "Snapshot", "CompileMetrics",
    "op_totals", "transfers", "host_syncs", "work_totals", "snapshot", "reset",
    "record_work", "recording", "Recorder", "is_recording", "event_clock_ns", "stream_clock",
    "record_compile", "compile_metrics", "reset_compile_metrics", "cost_cache_stats",
    "pinned_cost_cache", "MemorySample", "STACK_TRACE_SETTING", "configure_call_sites",
    "library_prefixes", "user_stack", "keeps_stacks",
]


class WorkKind(enum.IntEnum):
    """What an event is (the C++ core's WorkKind, in its order)."""

    OP = 0
    COPY = 1
    COMPILED_KERNEL = 2
    NKI_KERNEL = 3
    COLLECTIVE = 4
    HOST_SYNC = 5
    CPU_FALLBACK = 6
    MEMORY = 7  # not work: a device's allocated bytes after an allocation or free


# ---- per-op totals ----------------------------------------------------------

@dataclass(frozen=True)
class OpTotals:
    """One (op, dtypes) record: calls, placement and modelled time."""

    op: str
    dtypes: tuple[str, ...]
    cpu_fallback: bool
    reason: str
    calls: int
    bytes_to_host: int  # fallbacks: inputs a real device would send to the host
    bytes_to_device: int  # ... and results it would receive back
    modeled_seconds: float
    internal_calls: int  # fallback calls by PyTorch internals that compute on the host by design


def op_totals() -> list[OpTotals]:
    """Every (op, dtypes) record of the current placement decisions, with its totals."""
    return [OpTotals(op, tuple(dtypes), fallback, reason, calls, bytes_in, bytes_out, seconds, internal)
            for (op, dtypes, fallback, reason, calls, bytes_in, bytes_out, seconds, internal)
            in _C._op_stats()]


def transfers() -> dict[str, tuple[int, int]]:
    """Copies that left a device, per link: ``{link: (copies, bytes)}``, links being
    ``host_to_device``, ``device_to_host``, ``device_to_device_same_chip`` and
    ``device_to_device_cross_chip``. Counted whether or not the cost model is on."""
    return {link: (copies, nbytes) for link, copies, nbytes in _C._transfer_counts()}


def host_syncs() -> int:
    """Host reads that waited for a device (``.item()``, copies to the host)."""
    return _C._host_syncs()


@dataclass(frozen=True)
class WorkTotals:
    """Named device work outside the op path: an NKI kernel or a collective."""

    kind: str  # "nki_kernel" or "collective"
    name: str
    calls: int
    modeled_seconds: float
    flops: float
    bytes: int
    instructions: int  # NKI kernels: instructions issued


def work_totals(kind: WorkKind | None = None) -> list[WorkTotals]:
    """NKI kernels and collectives recorded since the last reset (optionally one kind)."""
    rows = [WorkTotals(*row) for row in _C._work_totals()]
    if kind is not None:
        name = _KIND_NAMES[kind]
        rows = [r for r in rows if r.kind == name]
    return rows


_KIND_NAMES = {WorkKind.NKI_KERNEL: "nki_kernel", WorkKind.COLLECTIVE: "collective"}


def record_work(kind: WorkKind, name: str, device: int, seconds: float, *, flops: float = 0.0,
                nbytes: int = 0, instructions: int = 0, engine: str = "") -> None:
    """Records one run of an NKI kernel or a collective on ``device``: counted under
    ``name``, its modelled ``seconds`` added to the thread's current stream of the device
    (when the cost model is on), and an event while a profiler records."""
    if kind not in _KIND_NAMES:
        raise ValueError(f"record_work records NKI kernels and collectives, not {kind!r}; ops, "
                         "copies and compiled kernels are recorded by the op path")
    _C._record_work(int(kind), name, int(device), float(seconds), float(flops), int(nbytes),
                    int(instructions), engine)


def stream_clock(device: int) -> float:
    """Modelled seconds on the thread's current stream of ``device``."""
    return _C._stream_clock(device)


# ---- compiled kernels ---------------------------------------------------------

def set_kernel_cost(slot: int, seconds: float, flops: float, nbytes: int, name: str) -> None:
    """Sets what one run of compiled-kernel ``slot`` costs (slot == count adds one)."""
    _C._set_kernel_cost(slot, seconds, flops, nbytes, name)


def kernel_calls() -> list[int]:
    """Runs of each compiled-kernel slot since the last reset."""
    return _C._kernel_calls()


charge_kernel = _C._charge_kernel  # charge_kernel(slot, device): one run, called by generated code


# ---- snapshots: what a piece of code added ------------------------------------

@dataclass(frozen=True)
class Snapshot:
    """Everything the record counts, at one moment: :func:`estimate` and tests diff two."""

    cost_entries: dict[int, tuple[tuple, int, float]]  # id -> (description, calls, seconds)
    kernel_calls: list[int]
    transfers: dict[str, tuple[int, int]]
    work: dict[tuple[str, str], WorkTotals]
    host_syncs: int

    def since(self, earlier: Snapshot) -> Snapshot:
        """What was added after ``earlier``."""
        entries = {}
        for key, (description, calls, seconds) in self.cost_entries.items():
            before = earlier.cost_entries.get(key)
            added = calls - (before[1] if before is not None else 0)
            if added > 0:
                entries[key] = (description, added, seconds)
        kernels = [c - (earlier.kernel_calls[i] if i < len(earlier.kernel_calls) else 0)
                   for i, c in enumerate(self.kernel_calls)]
        moved = {link: (c - earlier.transfers.get(link, (0, 0))[0], b - earlier.transfers.get(link, (0, 0))[1])
                 for link, (c, b) in self.transfers.items()}
        work = {}
        for key, w in self.work.items():
            old = earlier.work.get(key)
            if old is None:
                work[key] = w
            elif w.calls > old.calls:
                work[key] = WorkTotals(w.kind, w.name, w.calls - old.calls,
                                       w.modeled_seconds - old.modeled_seconds, w.flops - old.flops,
                                       w.bytes - old.bytes, w.instructions - old.instructions)
        return Snapshot(entries, kernels, moved, work, self.host_syncs - earlier.host_syncs)


def snapshot() -> Snapshot:
    """The record's counters now (call under :func:`pinned_cost_cache` to diff cost entries)."""
    entries = {id(description): (description, calls, seconds)
               for description, calls, seconds in _C._cost_entries()}
    return Snapshot(entries, list(_C._kernel_calls()), transfers(),
                    {(w.kind, w.name): w for w in work_totals()}, host_syncs())


@contextlib.contextmanager
def pinned_cost_cache() -> Iterator[None]:
    """Keeps every per-shape cost entry while the block runs (no flush), so a snapshot
    diff sees every combination the block met."""
    _C._pin_cost_cache(True)
    try:
        yield
    finally:
        _C._pin_cost_cache(False)


def cost_cache_stats() -> tuple[int, int, int]:
    """(combinations cached, capacity, flushes since start) of the per-shape cost cache."""
    return _C._cost_cache_stats()


def reset() -> None:
    """Zeroes every counter of the record (placement decisions and costs stay cached)."""
    _C._reset_stats()
    _C._reset_cost_counts()
    _C._reset_kernel_calls()
    from torchneuron.device import fallback

    fallback.reset_site_counts()  # CPU-fallback calls per call site count from zero too


# ---- per-call events ----------------------------------------------------------

@dataclass(frozen=True)
class Event:
    """One piece of device work, as the record saw it."""

    kind: str  # "op", "copy", "compiled_kernel", "nki_kernel", "collective", "host_sync", "cpu_fallback"
    name: str
    device: int
    stream: int
    device_start: float  # the stream's modelled clock where it started (s)
    seconds: float  # modelled duration
    host_ns: int  # the profiler clock when the host issued it
    bytes: int
    flops: float
    engine: str
    correlation: int  # the host op's profiler correlation id, 0 outside torch.profiler
    site: str = ""  # "file:line in function" that issued it (TORCH_NEURONX_ENABLE_STACK_TRACE)
    stack: tuple[str, ...] = ()  # the user frames of its Python stack, innermost (``site``) first


@dataclass(frozen=True)
class MemorySample:
    """A device's allocated bytes right after an allocation or a free (the trace's memory counter)."""

    device: int
    host_ns: int  # the profiler clock when the host allocated or freed
    allocated: int  # bytes held by live tensors on the device (torch.neuron.memory_allocated)
    work_items: int = 0  # device work items (ops, copies, kernels) the recording saw before it


@contextlib.contextmanager
def recording(*, memory: list[MemorySample] | None = None, events: bool = True) -> Iterator[list[Event]]:
    """Records one :class:`Event` per device work item while the block runs; the list
    yielded is filled when it exits. Recorders are independent: blocks may nest or
    overlap a ``torch.profiler`` session, each gets every event issued while it is open.
    A ``memory`` list, if given, receives a :class:`MemorySample` per allocation and free;
    ``events=False`` keeps only those (the work items are counted, not kept)."""
    kept: list[Event] = []
    recorder = Recorder()
    try:
        yield kept
    finally:
        kept.extend(recorder.close(memory=memory, events=events))


class Recorder:
    """An open recording (what :func:`recording` opens around a block), for code whose
    recordings start and end at different places (one per training step)."""

    def __init__(self) -> None:
        self._mark = _C._open_recording()

    def close(self, *, memory: list[MemorySample] | None = None, events: bool = True) -> list[Event]:
        """The events since the recording opened (and memory samples into ``memory``)."""
        rows, _dropped = _C._close_recording(self._mark)
        kept: list[Event] = []
        work_items = 0
        for row in rows:
            if row[0] != "memory":
                work_items += 1
                if events:
                    stack = tuple(row[-1].split("\n")) if row[-1] else ()
                    kept.append(Event(*row[:-1], site=stack[0] if stack else "", stack=stack))
            elif memory is not None:
                memory.append(MemorySample(device=row[2], host_ns=row[6], allocated=row[7],
                                           work_items=work_items))
        return kept


# Whether events name the Python line that issued them (read by the core while recording).
STACK_TRACE_SETTING = "TORCH_NEURONX_ENABLE_STACK_TRACE"


@functools.cache
def library_prefixes() -> tuple[str, ...]:
    """Where library code lives: torch, torchneuron, the standard library, every
    site-packages directory (a venv's and the user's too, so a venv and the system
    Python name the same line) and frozen modules. A user's call site is the innermost
    frame outside them (the CPU fallback warning, the events' call sites, the OOM
    message and the non-finite report name the same line). Computed once: the packages
    do not move while the process runs."""
    import os
    import site
    import sysconfig

    import torch

    import torchneuron

    dirs = [os.path.dirname(torchneuron.__file__), os.path.dirname(os.__file__),
            os.path.dirname(torch.__file__)]
    dirs += [sysconfig.get_paths()[key] for key in ("purelib", "platlib")]
    dirs += site.getsitepackages() if hasattr(site, "getsitepackages") else []
    dirs.append(site.getusersitepackages())
    unique = dict.fromkeys(os.path.join(os.path.realpath(d), "") for d in dirs if d)
    # Frames name files as imported; a symlinked path is kept beside its real one.
    unique |= dict.fromkeys(os.path.join(d, "") for d in dirs if d)
    return (*unique, "<frozen")


# The most frames a Python stack keeps (the C++ capture's kMaxStackFrames, events.cpp).
MAX_STACK_FRAMES = 64
_keep_stacks = False  # TORCH_NEURONX_ENABLE_STACK_TRACE, as configure_call_sites last applied it


def configure_call_sites() -> None:
    """Applies TORCH_NEURONX_ENABLE_STACK_TRACE (re-run when it changes): to the events'
    call sites in C++ and to the call sites the CPU-fallback observer keeps."""
    global _keep_stacks
    from torchneuron import config

    _keep_stacks = config.get_flag(STACK_TRACE_SETTING)
    _C._set_call_sites(_keep_stacks, list(library_prefixes()))


def keeps_stacks() -> bool:
    """Whether call sites keep their whole user Python stack (TORCH_NEURONX_ENABLE_STACK_TRACE;
    ``torchneuron check`` turns it on while the script runs)."""
    return _keep_stacks


def user_stack(frame, limit: int = MAX_STACK_FRAMES) -> tuple[str, ...]:
    """The user frames of the Python stack from ``frame`` outwards, innermost first, as
    "file:line in function": the same frames and text as an event's stack (the C++
    capture), for the call sites that are counted all run long rather than recorded per
    event (CPU-fallback call sites, host syncs), so a report needs no per-op recording."""
    prefixes = library_prefixes()
    frames = []
    while frame is not None and len(frames) < limit:
        code = frame.f_code
        if not code.co_filename.startswith(prefixes):
            frames.append(f"{code.co_filename}:{frame.f_lineno} in {code.co_name}")
        frame = frame.f_back
    return tuple(frames)


def is_recording() -> bool:
    """True while any recorder (a profiler session, a :func:`recording` block) is open."""
    return _C._event_recording()


def event_clock_ns() -> int:
    """The profiler's clock, on which events' ``host_ns`` are taken."""
    return _C._event_clock_ns()


# ---- compile counters ---------------------------------------------------------

def _sites(counted: Counter) -> list[dict[str, Any]]:
    return [{"site": site, "reason": reason, "count": n} for (site, reason), n in counted.items()]


@dataclass
class CompileMetrics:
    """What ``torch.compile(backend="neuron")`` did since the last reset."""

    compiles: int = 0  # graphs the backend compiled (each forward and backward graph counts)
    cache_hits: int = 0  # of those, served from the persistent compile cache
    cache_misses: int = 0  # ... and generated afresh
    compile_seconds: float = 0.0  # wall time inside the backend
    graph_breaks: int = 0  # Dynamo graph breaks in frames compiled for neuron
    graph_break_reasons: Counter = field(default_factory=Counter)
    recompiles: int = 0  # a frame compiled again (a guard, e.g. an input shape, changed)
    recompile_reasons: list[str] = field(default_factory=list)
    # (the user's "file:line in function", reason) -> count: where each graph broke, and the
    # compiled frame each recompile was for.
    graph_break_sites: Counter = field(default_factory=Counter)
    recompile_sites: Counter = field(default_factory=Counter)
    eager_fallbacks: int = 0  # graphs that failed to compile and run eagerly (fallback execution on)
    partitioned_ops: Counter = field(default_factory=Counter)  # ops left to the device's CPU fallback

    def as_dict(self) -> dict[str, Any]:
        return {
            "compiles": self.compiles,
            "cache_hits": self.cache_hits,
            "cache_misses": self.cache_misses,
            "compile_seconds": self.compile_seconds,
            "graph_breaks": self.graph_breaks,
            "graph_break_reasons": dict(self.graph_break_reasons),
            "recompiles": self.recompiles,
            "recompile_reasons": list(self.recompile_reasons),
            "graph_break_sites": _sites(self.graph_break_sites),
            "recompile_sites": _sites(self.recompile_sites),
            "eager_fallbacks": self.eager_fallbacks,
            "partitioned_ops": dict(self.partitioned_ops),
        }


_compile_lock = threading.Lock()
_compile = CompileMetrics()


def record_compile(**deltas: Any) -> None:
    """Adds to compile counters (numbers), counters of reasons (Counter) or lists of reasons."""
    with _compile_lock:
        for name, delta in deltas.items():
            current = getattr(_compile, name)
            if isinstance(current, Counter):
                current.update(delta)
            elif isinstance(current, list):
                current.extend(delta)
            else:
                setattr(_compile, name, current + delta)


def compile_metrics() -> dict[str, Any]:
    """Compiles, cache hits and misses, compile time, graph breaks and recompiles with reasons."""
    with _compile_lock:
        return _compile.as_dict()


def reset_compile_metrics() -> None:
    """Zeroes the compile counters."""
    global _compile
    with _compile_lock:
        _compile = CompileMetrics()
