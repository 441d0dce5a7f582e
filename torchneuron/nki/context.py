"""The state of one kernel run: target chip, on-chip memory, the instruction log.

A run is entered by :mod:`torchneuron.nki.kernel` around each launch; ISA and
language functions find it with :func:`current`. LNC2 launches run their two
programs in two threads over the same run, so the program index is
thread-local while the log is shared (appends are serialised).
"""

from __future__ import annotations

import contextlib
import os
import threading
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

from torchneuron import config
from torchneuron.hardware.specs import ChipSpec, get_chip
from torchneuron.nki.errors import NkiInstructionLimitError, SourceLocation, fail, kernel_loops
from torchneuron.nki.instruction import Instruction, Operand, RecordTable
from torchneuron.nki.memory import Allocation, Buffer, OnChipMemory

__all__ = [
    "KernelRun", "current", "maybe_current", "in_program", "running", "program_id", "num_programs", "program_ndim",
    "uninitialized_policy", "warn_uninitialized", "default_target", "NkiUninitializedReadWarning",
    "UNINITIALIZED_ENV", "PRECISE_FP_ENV", "TARGET_ENV", "usable_psum_banks", "MAX_INSTRUCTIONS_ENV",
    "resolve_max_instructions", "on_release", "precise_fp",
]

TARGET_ENV = "NEURON_PLATFORM_TARGET_OVERRIDE"
PRECISE_FP_ENV = "NKI_PRECISE_FP"
UNINITIALIZED_ENV = "TORCHNEURON_NKI_UNINITIALIZED"
MAX_INSTRUCTIONS_ENV = "TORCHNEURON_NKI_MAX_INSTRUCTIONS"
_POLICIES = ("warn", "error", "ignore")


class NkiUninitializedReadWarning(UserWarning):
    """An instruction read memory no instruction had written (NaN-filled)."""


def default_target() -> ChipSpec:
    """The simulated chip: ``NEURON_PLATFORM_TARGET_OVERRIDE``, else the neuron device's chip.

    AWS's simulator falls back to trn3 when no chip is detected
    (nki-api-facts.md: 8); here the modelled device always has a chip, the one
    ``torch.neuron`` simulates (Trn2 unless configured otherwise).
    """
    name = (config.get(TARGET_ENV) or "").strip()
    if name:
        return get_chip(name)
    from torchneuron.hardware.topology import topology_from_env

    return topology_from_env(config.environ()).chip


PE_TRANSPOSE_ENV = "NKI_DMA_TRANSPOSE_AS_PE_TRANSPOSE"


def usable_psum_banks(chip: ChipSpec) -> int:
    """PSUM banks kernels may use: 8, or 7 on trn2+ when ``NKI_DMA_TRANSPOSE_AS_PE_TRANSPOSE`` is
    true (bank 7 is then reserved for ``nc_transpose``; nki-api-facts.md: 3.9 ``psum_num_banks``)."""
    banks = chip.psum_banks or 8
    reserved = config.get_flag(PE_TRANSPOSE_ENV)  # 1/true or 0/false; anything else is an error
    return banks - 1 if reserved and chip.neuroncore_version != "v2" else banks


@dataclass
class KernelRun:
    """Everything one launch of a kernel produced or checked."""

    kernel_name: str
    target: ChipSpec
    grid: tuple[int, ...] = (1,)
    lnc: int = 1  # programs that run concurrently on separate physical cores (LNC2)
    uninitialized: str = "warn"
    precise_fp: bool = True
    # A legacy (neuronxcc.nki) kernel: the legacy compiler's legalisations apply (dialect.py).
    legacy: bool = False
    # Instructions the launch may issue before it is stopped (a runaway loop would grow the log
    # until the host runs out of memory): TORCHNEURON_NKI_MAX_INSTRUCTIONS or simulate(max_instructions=).
    max_instructions: int = 1_000_000
    instructions: list[Instruction] = field(default_factory=list)
    # Shares identical operands, attrs and locations between the log's records (instruction.py);
    # emptied at release, when no record is added any more.
    records: RecordTable = field(default_factory=RecordTable, repr=False)
    memories: dict[int, OnChipMemory] = field(default_factory=dict)
    # False: shape-only run (cost estimation of big kernels): isa skips value computation.
    compute_values: bool = True
    # Who provides HBM tensors the kernel allocates (outputs, scratch): the torch bridge
    # places them in neuron device memory so outputs come back without a copy.
    hbm_factory: Callable[[Buffer, tuple[int, ...], Any, str], Allocation] | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    # first and last instruction index touching each on-chip allocation
    lifetimes: dict[int, list[int]] = field(default_factory=dict, repr=False)
    _warned: set = field(default_factory=set, repr=False)

    def memory(self) -> OnChipMemory:
        """On-chip memory of the physical core the calling program runs on."""
        core = _local.program % self.lnc if self.lnc > 1 else 0
        with self._lock:
            if core not in self.memories:
                self.memories[core] = OnChipMemory(
                    self.target.sbuf_bytes_per_partition or self.target.sbuf_bytes_per_core // 128,
                    usable_psum_banks(self.target), self.target.sbuf_partitions or 128, self.target.name)
            return self.memories[core]

    def allocate_hbm(self, buffer: Buffer, shape: tuple[int, ...], dtype: Any, name: str) -> Allocation:
        """A fresh (uninitialised) HBM allocation; ``nl.ndarray(..., buffer=nl.shared_hbm)`` lands here
        (``language`` makes shared-HBM declarations one tensor for all programs of a launch)."""
        if self.hbm_factory is not None:
            return self.hbm_factory(buffer, shape, dtype, name)
        return Allocation.create(buffer, shape, dtype, name, fill=self.compute_values)

    def record(self, opcode: str, engine: str, reads: tuple[Operand, ...], writes: tuple[Operand, ...],
               location: SourceLocation | None, flops: int = 0, **attrs: object) -> Instruction:
        with self._lock:
            index = len(self.instructions)
            if index >= self.max_instructions:
                self._stop_runaway(opcode, location)
            records = self.records
            instruction = Instruction(index, opcode, engine, records.operands(reads), records.operands(writes),
                                      records.attrs(attrs), records.location(location), _local.program, flops)
            self.instructions.append(instruction)
            for operand in reads + writes:
                if operand.buffer in _ON_CHIP:
                    span = self.lifetimes.get(operand.allocation)
                    if span is None:
                        self.lifetimes[operand.allocation] = [index, index]
                    else:
                        span[1] = index
        return instruction

    def _stop_runaway(self, opcode: str, location: SourceLocation | None) -> None:
        loops = kernel_loops()
        if loops:
            where = " > ".join(f"{os.path.basename(loop.filename)}:{loop.lineno} ({loop.line})" for loop in loops)
            inside = f"; it is still issuing them inside the loop{'s' if len(loops) > 1 else ''} at {where}"
        else:
            inside = ""
        raise NkiInstructionLimitError(
            opcode, f"kernel {self.kernel_name!r} issued {self.max_instructions} instructions, the simulator's "
            f"instruction budget, without finishing{inside}. Check that the loop ends; a kernel meant to run "
            f"longer can raise the budget with {MAX_INSTRUCTIONS_ENV} or nki.simulate(kernel, "
            "max_instructions=...)", location)

    def release(self) -> None:
        """Drop everything the finished run holds on the device or host (HBM tensors it allocated,
        per-core ISA state, the thread's retarget record); the instruction log, placements and
        statistics stay for ``kernel.last_run``, reports and the cost model."""
        self.hbm_factory = None
        self.records = RecordTable()
        for key in ("_nl_shared_hbm", "_isa_states"):
            self.__dict__.pop(key, None)
        for hook in _release_hooks:
            hook(self)

    def check_memory(self) -> None:
        """Raise if live on-chip tiles overflowed SBUF or PSUM anywhere in the run."""
        for memory in self.memories.values():
            memory.check(self.instructions, self.lifetimes, legacy=self.legacy)


_ON_CHIP = ("sbuf", "psum")
_local = threading.local()
_local.program = 0
_runs: list[KernelRun] = []  # stack of active runs (kernels are not nested, but tools may be)


def current() -> KernelRun:
    """The active run; NKI instructions outside a kernel launch are an error."""
    run = maybe_current()
    if run is None:
        fail("nki", "NKI instructions run only inside a kernel: decorate the function with @nki.jit and "
             "call it (or use nki.simulate(kernel)(...))")
    return run


def in_program() -> bool:
    """True while the calling thread runs a program of a launch (a kernel body is executing)."""
    return getattr(_local, "run", None) is not None


def maybe_current() -> KernelRun | None:
    run = getattr(_local, "run", None)
    return run if run is not None else (_runs[-1] if _runs else None)


@contextlib.contextmanager
def running(run: KernelRun) -> Iterator[KernelRun]:
    _runs.append(run)
    try:
        yield run
    finally:
        _runs.remove(run)


@contextlib.contextmanager
def as_program(run: KernelRun, index: tuple[int, ...]) -> Iterator[None]:
    """Run the calling thread's code as SPMD program ``index`` of ``run``."""
    previous = (getattr(_local, "run", None), getattr(_local, "program", 0), getattr(_local, "index", (0,)))
    _local.run = run
    _local.index = index
    flat = 0
    for i, n in zip(index, run.grid):
        flat = flat * n + i
    _local.program = flat
    try:
        yield
    finally:
        _local.run, _local.program, _local.index = previous


def current_program() -> int:
    """The flat index of the calling thread's SPMD program (0 outside a launch)."""
    return getattr(_local, "program", 0)


def program_id(axis: int = 0) -> int:
    """Index of the running program along ``axis`` of the launch grid (0 or 1 under LNC2)."""
    run = current()
    index = getattr(_local, "index", (0,))
    if not 0 <= axis < len(run.grid):
        fail("program_id", f"axis {axis} is out of range for a launch grid of {len(run.grid)} dimension(s)")
    return index[axis]


def num_programs(axes: int | tuple[int, ...] | None = 0) -> int:
    """Programs along ``axes`` of the launch grid (all axes when ``None``)."""
    run = current()
    if axes is None:
        axes = tuple(range(len(run.grid)))
    if isinstance(axes, int):
        axes = (axes,)
    total = 1
    for axis in axes:
        if not 0 <= axis < len(run.grid):
            fail("num_programs", f"axis {axis} is out of range for a launch grid of {len(run.grid)} "
                 "dimension(s)")
        total *= run.grid[axis]
    return total


def program_ndim() -> int:
    return len(current().grid)


_release_hooks: list[Callable[[KernelRun], None]] = []


def on_release(hook: Callable[[KernelRun], None]) -> None:
    """Call ``hook(run)`` when a run finishes (modules with per-thread state about a run clear it)."""
    _release_hooks.append(hook)


def precise_fp() -> bool:
    """``NKI_PRECISE_FP``: 1 (default) stores low-precision floats in their dtype, 0 widens on-chip tiles to fp32."""
    return bool(config.get_flag(PRECISE_FP_ENV))


def resolve_max_instructions(value: int | None) -> int:
    """The instruction budget of a launch: ``value`` if given, else ``TORCHNEURON_NKI_MAX_INSTRUCTIONS``."""
    if value is not None:
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"max_instructions={value!r} must be a positive int (instructions one launch may "
                             "issue on the simulator)")
        return value
    return int(config.value(MAX_INSTRUCTIONS_ENV))  # checked there, naming the variable


def uninitialized_policy() -> str:
    run = maybe_current()
    return run.uninitialized if run is not None else "ignore"


def resolve_uninitialized_policy(value: str | None) -> str:
    if not value:
        return str(config.value(UNINITIALIZED_ENV))  # checked there, naming the variable
    if value not in _POLICIES:
        raise ValueError(f"uninitialized={value!r} must be one of {_POLICIES}")
    return value


def warn_uninitialized(instruction: str, message: str, location: SourceLocation | None) -> None:
    """Warn once per kernel line about a read of never-written memory."""
    run = maybe_current()
    key = (instruction, str(location))
    if run is not None:
        with run._lock:
            if key in run._warned:
                return
            run._warned.add(key)
    where = f"{location}: " if location is not None else ""
    warnings.warn(f"{where}{instruction}: {message}", NkiUninitializedReadWarning, stacklevel=4)
