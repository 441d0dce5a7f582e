"""Shared machinery of the instruction modules: the :class:`NkiInstruction` handle and
:class:`NkiActivationRangeWarning`, run state (NeuronCore version, per-core engine
registers and RNGs, instruction recording), argument and operand checks (enums, tensors,
buffers, partitions, layouts), tile data access (reads, stores, uninitialised-register
reads), and call-style detection (dst-first vs legacy, legacy dtype/mask handling).
"""

from __future__ import annotations

import builtins
import enum
import functools
import inspect
import math
import warnings
import weakref
from typing import Any, Callable, Sequence

import numpy as np

from torchneuron.nki import context, registry
from torchneuron.nki.dtypes import NkiDType, resolve, round_tf32
from torchneuron.nki.errors import NkiUninitializedReadError, fail, kernel_location
from torchneuron.nki.indexing import MaskExpr, prefix_kept
from torchneuron.nki.instruction import Engine, Instruction, RecordTable
from torchneuron.nki.isa.enums import ENGINE_NAME, ENGINE_TITLE, engine
from torchneuron.nki.memory import Allocation, Buffer
from torchneuron.nki.ops import AluOp, alu_op
from torchneuron.nki.tensor import NkiTensor


class NkiActivationRangeWarning(UserWarning):
    """A ScalarE activation got inputs outside its function's valid range (invalid output on hardware)."""


# ============================================================================ instruction handle
class NkiInstruction:
    """Handle to an executed instruction (returned by dst-first ISA calls).

    ``c.depends_on(a, b)`` adds scheduling edges (c runs after a and b): the producers'
    indices are recorded in ``c``'s ``attrs["depends_on"]`` for the cost model.
    """

    __slots__ = ("instruction",)

    def __init__(self, instruction: Instruction) -> None:
        self.instruction = instruction

    @property
    def index(self) -> int:
        return self.instruction.index

    def depends_on(self, *producers: "NkiInstruction") -> "NkiInstruction":
        edges = list(self.instruction.attrs.get("depends_on", ()))
        for producer in producers:
            if isinstance(producer, NkiInstruction):
                index = producer.instruction.index
            elif isinstance(producer, Instruction):
                index = producer.index
            else:
                raise TypeError(f"depends_on takes instruction handles returned by nisa calls, got "
                                f"{type(producer).__name__}")
            if index >= self.instruction.index:
                raise ValueError(f"instruction {self.instruction.index} ({self.instruction.opcode}) cannot "
                                 f"depend on instruction {index}, which runs after it")
            if index not in edges:
                edges.append(index)
        _records().update_attrs(self.instruction, depends_on=edges)
        return self

    def __repr__(self) -> str:
        return f"NkiInstruction({self.instruction.index}: {self.instruction.opcode} on {self.instruction.engine})"


def _records() -> Any:
    """The active run's record table (a fresh one outside a run: the change is then not shared)."""
    run = context.maybe_current()
    return run.records if run is not None else RecordTable()


# ============================================================================ run state
_TARGET_VERSION: dict[str, int] = {}


def run_and_version() -> tuple[context.KernelRun, int]:
    """The active run and its NeuronCore version (2, 3 or 4), cached per chip name."""
    run = context.current()
    chip = run.target
    version = _TARGET_VERSION.get(chip.name)
    if version is None:
        text = str(chip.neuroncore_version).lstrip("vV")
        version = int(text) if text.isdigit() else {"trn1": 2, "inf2": 2, "trn2": 3, "trn3": 4}.get(chip.name, 3)
        _TARGET_VERSION[chip.name] = version
    return run, version


class CoreState:
    """Per-physical-core engine state kept for the length of a run (decisions 6 and 12)."""

    def __init__(self, core: int) -> None:
        self.act_acc = np.full(128, np.nan, dtype=np.float32)  # ScalarE reduce registers
        self.act_valid = np.zeros(128, dtype=bool)
        self.dve_acc = np.full(128, np.nan, dtype=np.float32)  # VectorE accumulators
        self.dve_valid = np.zeros(128, dtype=bool)
        self.rng = {Engine.VECTOR: np.random.default_rng(2 * core),
                    Engine.GPSIMD: np.random.default_rng(2 * core + 1)}
        self.warned: set = set()


def core_state(run: context.KernelRun) -> CoreState:
    states = run.__dict__.get("_isa_states")
    if states is None:
        states = run.__dict__.setdefault("_isa_states", {})
    program = context.current_program()
    core = program % run.lnc if run.lnc > 1 else 0
    state = states.get(core)
    if state is None:
        state = states.setdefault(core, CoreState(core))
    return state


def record(run: context.KernelRun, opcode: str, eng: str, reads: Sequence[NkiTensor],
           writes: Sequence[NkiTensor], flops: int = 0, name: str | None = None,
           **attrs: Any) -> NkiInstruction:
    if name is not None:
        attrs["name"] = name
    instruction = run.record(opcode, eng, tuple(t.operand() for t in reads), tuple(t.operand() for t in writes),
                             kernel_location(), flops=int(flops), **attrs)
    return NkiInstruction(instruction)


# ============================================================================ argument helpers
def as_enum(instr: str, param: str, value: Any, kind: type[enum.Enum], aliases: dict | None = None) -> Any:
    """``value`` as a member of ``kind``.

    NKI 0.3.0's migration guide says raw ints are no longer accepted (``dge_mode=2``), yet AWS's
    production kernels pass them (``nisa.dma_copy(..., dge_mode=3)``) and run: an int equal to a
    member's value is that member; any other int raises naming the members and their values.
    """
    if isinstance(value, kind):
        return value
    if value is None and "unknown" in kind.__members__:
        return kind.unknown
    if value is None and "idle" in kind.__members__:
        return kind.idle
    if aliases and isinstance(value, str) and value in aliases:
        return aliases[value]
    if isinstance(value, enum.Enum) and value.name in kind.__members__ and type(value).__name__ == kind.__name__:
        return kind[value.name]  # the same enum from another import of this module
    integer = isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))
    if integer:
        for member in kind:
            if isinstance(member.value, int) and member.value == int(value):
                return member
    members = ", ".join(f"nisa.{kind.__name__}.{m.name}" + (f" (= {m.value})" if isinstance(m.value, int) else "")
                        for m in kind)
    what = f"the int {int(value)} is no member's value" if integer else f"got {value!r}"
    raise TypeError(f"{instr}: {param} must be a member of nisa.{kind.__name__} ({members}) or its int value; "
                    f"{what}")


# Instructions that take indirect views as they are (they resolve the offsets themselves, with oob_mode).
INDIRECT_AWARE = frozenset(("dma_copy", "dma_compute", "dma_transpose"))


def as_tensor(instr: str, role: str, value: Any) -> NkiTensor:
    if not isinstance(value, NkiTensor):
        raise TypeError(f"{instr}: {role} must be an NKI tensor (a tile from nl.ndarray/nl.load or a view of "
                        f"one), got {type(value).__name__}")
    if value._indirect is not None and instr not in INDIRECT_AWARE:
        if value._indirect.kind == "vector":
            fail(instr, f"{role} {value.name!r} is a vector_offset (gather/scatter) view of an HBM tensor; only "
                 "DMA instructions (nisa.dma_copy, nisa.dma_compute) move data through one")
        return value.concrete(instr)  # a scalar_offset view: the offset register is read as the engine runs
    return value


def scalar_value(instr: str, role: str, value: Any) -> float:
    if isinstance(value, (bool, np.bool_)):
        return float(value)
    if isinstance(value, (int, float, np.integer, np.floating)):
        return float(value)
    raise TypeError(f"{instr}: {role} must be a number or a ({'P'}, 1) tile, got {type(value).__name__}")


def alu_operator(instr: str, role: str, op: Any) -> AluOp:
    if op is None:
        raise TypeError(f"{instr}: {role} is required (e.g. nl.add)")
    return alu_op(op)


INT32 = ("int32", "uint32")


# ============================================================================ operand rules
def allowed_starts(partitions: int) -> tuple[int, ...]:
    """Rule 6 (facts 2, 6): the partitions an engine operand spanning ``partitions`` may start at."""
    if partitions > 64:
        return (0,)
    if partitions > 32:
        return (0, 64)
    return (0, 32, 64, 96)


def _start_rule(instr: str, role: str, t: NkiTensor, start: int, partitions: int) -> None:
    """Rule 6 (facts 2, 6): allowed start partitions depend on the partition span."""
    allowed = allowed_starts(partitions)
    if start not in allowed:
        span = "more than 64" if partitions > 64 else ("33 to 64" if partitions > 32 else "1 to 32")
        places = str(allowed[0]) if len(allowed) == 1 else \
            ", ".join(map(str, allowed[:-1])) + f" or {allowed[-1]}"
        fail(instr, f"{role} {t.name!r} starts at partition {start} and spans {partitions} partitions; an "
             f"operand spanning {span} partitions must start at partition {places} (start-partition rule); "
             "allocate or slice the tile so it starts there")


def engine_operand(instr: str, role: str, t: Any, eng: str) -> NkiTensor:
    """Rules 1, 3, 6, 7, 8 for one compute-engine operand; returns the tensor."""
    t = as_tensor(instr, role, t)
    buffer = t._alloc.buffer
    title = ENGINE_TITLE[eng]
    if buffer is Buffer.psum and eng in (Engine.TENSOR, Engine.GPSIMD) and not role.startswith("dst") \
            and context.current().legacy:
        from torchneuron.nki.isa.legalise import (
            psum_operand_to_sbuf,  # legalise imports this module
        )

        t = psum_operand_to_sbuf(instr, role, t, title)
        buffer = t._alloc.buffer
    if not buffer.on_chip:
        fail(instr, f"{role} {t.name!r} is in {buffer.value}; {title} reads and writes only on-chip memory "
             "(SBUF/PSUM): copy it into SBUF with nisa.dma_copy / nl.load first")
    if buffer is Buffer.psum and eng == Engine.GPSIMD:
        fail(instr, f"{role} {t.name!r} is in PSUM, which GpSimd cannot access; use SBUF tiles, or run the "
             "instruction on VectorE/ScalarE")
    data = t._data
    partitions = data.shape[0] if data.ndim else 1
    if partitions > 128:
        fail(instr, f"{role} partition dimension {partitions} exceeds maximum 128 (tile {t.name!r}, shape "
             f"{list(t.shape)}); split it into tiles of at most 128 partitions")
    if partitions > 1 and data.strides[0] != t._alloc.data.strides[0]:
        step = data.strides[0] // t._alloc.data.strides[0] if t._alloc.data.strides[0] else 0
        fail(instr, f"{role} {t.name!r} strides over partitions (every {step} partitions); an operand must "
             "span contiguous partitions: slice dim 0 with step 1")
    _start_rule(instr, role, t, t.start_partition, partitions)
    if eng in (Engine.VECTOR, Engine.SCALAR):
        free = t.free_size
        limit = 4096 if buffer is Buffer.psum else 65536
        if free > limit:
            where = "PSUM" if buffer is Buffer.psum else "SBUF"
            fail(instr, f"{role} {t.name!r} has {free} elements per partition, above {title}'s limit of "
                 f"{limit} for {where} operands; tile the free dimension")
    return t


def same_partitions(instr: str, a_role: str, a: NkiTensor, b_role: str, b: NkiTensor) -> None:
    if a.shape[0] != b.shape[0]:
        fail(instr, f"{b_role} spans {b.shape[0]} partitions but {a_role} spans {a.shape[0]}; they must span the "
             "same partition count (the engine moves data within its lanes)")


def same_layout(instr: str, a_role: str, a: NkiTensor, b_role: str, b: NkiTensor) -> None:
    """Same partition count and same elements per partition (facts 4.3 / 6 rule 8)."""
    same_partitions(instr, a_role, a, b_role, b)
    if a.free_size != b.free_size:
        fail(instr, f"{b_role} has {b.free_size} elements per partition (shape {list(b.shape)}) but {a_role} has "
             f"{a.free_size} (shape {list(a.shape)}); they must match")


def vector_operand(instr: str, role: str, value: Any, partitions: int, eng: str,
                   reads: list[NkiTensor], integer: bool = False) -> Any:
    """A scalar operand or a (P, 1) tile as an array broadcasting against (P, F) values."""
    if isinstance(value, NkiTensor):
        t = engine_operand(instr, role, value, eng)
        if t.shape[0] != partitions or t.free_size != 1:
            fail(instr, f"{role} must be a scalar or a ({partitions}, 1) tile (one value per partition of the "
                 f"data), got shape {list(t.shape)}")
        reads.append(t)
        raw = read_values(t, instr)
        if integer:
            return raw.reshape(partitions, 1)
        return raw.astype(np.float32).reshape(partitions, 1)
    if integer:
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
            if isinstance(value, (float, np.floating)) and float(value).is_integer():
                return np.int64(int(value))
            raise TypeError(f"{instr}: bit-vector {role} must be an integer, got {value!r}")
        return np.int64(int(value))
    return np.float32(scalar_value(instr, role, value))


# ============================================================================ data access
def written_marks(mask: np.ndarray) -> tuple[int, int, int]:
    """Written-mask values: non-matmul write, matmul group open, matmul group closed."""
    full = int(np.iinfo(mask.dtype).max)
    return full, full - 1, full - 2


def read_values(t: NkiTensor, instr: str) -> np.ndarray:
    """``t``'s storage values after the uninitialised-read check; a PSUM read closes matmul groups."""
    data = t.read(instr)
    if t._alloc.buffer is Buffer.psum:
        mask = t._mask
        if mask.flags.writeable and mask.size:
            _, open_, closed = written_marks(mask)
            hit = mask == open_
            if hit.any():
                mask[hit] = closed
    return data


def fp32_values(t: NkiTensor, instr: str) -> np.ndarray:
    """Values as a float32 (P, F) array: engines compute in fp32 (facts 4)."""
    if t.dtype.is_packed_mx:
        fail(instr, f"{t.name!r} is {t.dtype.name}, a packed MX type (four quantised values per element): only "
             "nisa.nc_matmul_mx reads its values; copy it bit for bit (same dtype) or dequantise it in a matmul")
    data = read_values(t, instr)
    values = data.astype(np.float32)
    if t.dtype.name == "tfloat32":
        values = round_tf32(values)
    return _as_2d(values)


def raw_values(t: NkiTensor, instr: str) -> np.ndarray:
    """Storage values as a (P, F) array (bit-exact paths)."""
    return _as_2d(read_values(t, instr))


def _as_2d(data: np.ndarray) -> np.ndarray:
    """``data`` as (partitions, free elements); an empty access (a legacy constant-False mask) stays empty."""
    rows = data.shape[0] if data.ndim else 1
    return data.reshape(rows, data.size // rows if rows else 0)


def store_values(dst: NkiTensor, values: Any, where: np.ndarray | None = None) -> None:
    """Write (P, F)-shaped ``values`` into ``dst`` (rounding into its dtype)."""
    shape = dst._data.shape
    values = np.asarray(values)
    if values.shape != shape and values.size == math.prod(shape):
        values = values.reshape(shape)
    if where is not None and where.shape != shape:
        where = np.broadcast_to(where.reshape(shape) if where.size == math.prod(shape) else where, shape)
    dst.write(values, where=where)


def warn_once(run: context.KernelRun, key: Any, message: str, category: type[Warning]) -> None:
    state = core_state(run)
    location = kernel_location()
    full_key = (key, str(location))
    if full_key in state.warned:
        return
    state.warned.add(full_key)
    where = f"{location}: " if location is not None else ""
    warnings.warn(f"{where}{message}", category, stacklevel=4)


def registers_read(run: context.KernelRun, instr: str, valid: np.ndarray, lanes: slice, what: str) -> None:
    """Apply the uninitialised-read policy to engine registers never reset (decision 6)."""
    if valid[lanes].all():
        return
    policy = context.uninitialized_policy()
    if policy == "ignore":
        return
    message = (f"reads {what} accumulator registers of partitions {lanes.start}..{lanes.stop - 1} that no "
               "instruction reset (they hold NaN); start the accumulation with reduce_cmd=reset_reduce")
    if policy == "error":
        fail(instr, message, NkiUninitializedReadError)
    context.warn_uninitialized(instr, message, kernel_location())


def partition_lanes(t: NkiTensor) -> slice:
    start = t.start_partition
    return slice(start, start + t.shape[0])


# ============================================================================ call styles
def _binds_current(args: tuple, kwargs: dict, names: tuple[str, ...], required: tuple[str, ...],
                   tensors: tuple[str, ...]) -> bool:
    """True when the call fits the dst-first signature with every tensor-only parameter a tensor."""
    if len(args) > len(names):
        return False
    bound = dict(zip(names, args))
    for key in kwargs:
        if key in bound:
            return False
    for param in required:
        if param not in bound and param not in kwargs:
            return False
    for param in tensors:
        value = bound[param] if param in bound else kwargs.get(param)
        if not isinstance(value, NkiTensor):
            return False
    return True


# Fresh result tiles of legacy calls given a mask= (weakly held): legacy NKI applied a mask to
# the whole statement, so ``t[...] = nisa.op(..., mask=m)`` writes only the masked part of ``t``
# (``nl``'s ``legacy.assign_into`` asks :func:`masked_legacy_result`).
_MASKED_LEGACY_RESULTS: "weakref.WeakValueDictionary[int, Allocation]" = weakref.WeakValueDictionary()


def masked_legacy_result(value: Any) -> bool:
    """True when ``value`` is the fresh result tile of a legacy ISA call restricted by ``mask=``."""
    return isinstance(value, NkiTensor) and _MASKED_LEGACY_RESULTS.get(value._alloc.id) is value._alloc


def _dual(tensors: tuple[str, ...], legacy: Callable[..., Any],
          legacy_only: tuple[str, ...] = ("mask", "dtype")) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Give a dst-first ISA function its legacy (result-returning) call style (module docstring)."""

    def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
        code = fn.__code__
        names = code.co_varnames[:code.co_argcount]
        required = names[:len(names) - len(fn.__defaults__ or ())]
        legacy_sig = inspect.signature(legacy)
        current_sig = inspect.signature(fn)

        @functools.wraps(fn)
        def call(*args: Any, **kwargs: Any) -> Any:
            if "dst" in kwargs and "dtype" in kwargs and "dtype" not in names:
                _drop_matching_dtype(fn.__name__, kwargs)  # dst-first with dtype= (AWS's beta-2 tutorials)
            if not any(key in kwargs for key in legacy_only) and (
                    "dst" in kwargs or _binds_current(args, kwargs, names, required, tensors)):
                return fn(*args, **kwargs)
            try:
                legacy_sig.bind(*args, **kwargs)
            except TypeError as exc:
                raise TypeError(f"nisa.{fn.__name__}: the arguments fit neither the dst-first signature "
                                f"{fn.__name__}{current_sig} (which needs dst and the input tiles) nor the "
                                f"legacy one {fn.__name__}{legacy_sig}: {exc}") from None
            result = legacy(*args, **kwargs)
            if kwargs.get("mask") is not None and kwargs.get("mask") is not True and isinstance(result, NkiTensor):
                _MASKED_LEGACY_RESULTS[result._alloc.id] = result._alloc
            return result

        call.legacy = legacy  # type: ignore[attr-defined]
        return call

    return wrap


def instruction(name: str, costs: dict[str, Any], *, legacy: Callable[..., Any] | None = None,
                tensors: tuple[str, ...] = (), legacy_only: tuple[str, ...] = ("mask", "dtype"),
                min_version: int = 2, hint: str = "", simulated: bool = True,
                ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Declare the ISA instruction ``name`` (:mod:`torchneuron.nki.registry`): the decorated
    function is its semantics; ``costs`` maps each engine it may run on to its cost formula
    (:mod:`torchneuron.nki.cost.formulas`); ``legacy`` is its legacy result-returning form
    (dispatched by :func:`_dual` on ``tensors``); ``min_version`` is its legality hook: an
    older target is refused before any argument is read, with ``hint`` as the way out."""

    def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
        call = _dual(tensors, legacy, legacy_only)(fn) if legacy is not None else fn
        if min_version > 2:
            inner = call

            @functools.wraps(fn)
            def call(*args: Any, **kwargs: Any) -> Any:
                _require_version(name, min_version, hint)
                return inner(*args, **kwargs)

            if legacy is not None:
                call.legacy = legacy  # type: ignore[attr-defined]
        spec = registry.register(registry.InstructionSpec(
            name=name, costs=dict(costs), semantics=fn, legacy=legacy, min_version=min_version, simulated=simulated))
        call.spec = spec  # type: ignore[attr-defined]
        return call

    return wrap


def _require_version(name: str, needed: int, hint: str) -> None:
    """The legality hook of :func:`instruction`: ``name`` needs NeuronCore-v``needed`` or newer."""
    run, version = run_and_version()
    if version >= needed:
        return
    if needed >= 4:
        text = f"{name} is available only on NeuronCore-v4 (trn3)"
    else:
        text = f"{name} needs NeuronCore-v3 or newer (trn2/trn3)"
    fail(name, f"{text}; target {run.target.name} is NeuronCore-v{version}" + (f": {hint}" if hint else ""))


def _drop_matching_dtype(instr: str, kwargs: dict[str, Any]) -> None:
    """Accept ``dtype=`` next to ``dst=``: the instruction writes dst's dtype, so a different
    ``dtype=`` has no effect (AWS's matmul tutorial passes one) and is reported once per line."""
    dst, dtype = kwargs["dst"], kwargs.pop("dtype")
    if dtype is None or not isinstance(dst, NkiTensor):
        return
    if resolve(dtype) is not dst.dtype:
        run = context.maybe_current()
        if run is not None:
            warn_once(run, ("dtype", instr), f"nisa.{instr}: dtype={resolve(dtype).name} differs from dst "
                      f"{dst.name!r}'s dtype {dst.dtype.name} and is ignored: a dst-first instruction writes "
                      "dst's dtype (allocate dst with the dtype you want)", UserWarning)


def legacy_dtype(dtype: Any, *inputs: Any) -> NkiDType:
    """The legacy ``dtype=`` (resolved), else the (promoted) dtype of the input tiles."""
    if dtype is not None:
        return resolve(dtype)
    dts = [t.dtype for t in inputs if isinstance(t, NkiTensor)]
    if not dts:
        return resolve("float32")
    if len(dts) == 1 or all(d is dts[0] for d in dts):
        return dts[0]
    floats = [d for d in dts if d.is_float]
    if floats:
        widest = builtins.max(d.itemsize for d in floats)
        best = {d.name for d in floats if d.itemsize == widest}
        if len(best) > 1:  # e.g. bfloat16 with float16: neither holds the other
            return resolve("float32")
        return resolve(best.pop())
    widest = builtins.max(d.itemsize for d in dts)
    signed = any(d.kind == "int" for d in dts)
    return resolve(f"{'int' if signed else 'uint'}{8 * widest}")


def buffer_of(value: Any, default: Buffer = Buffer.sbuf) -> Buffer:
    if value is None:
        return default
    if isinstance(value, Buffer):
        return value
    for attr in ("value", "name"):
        text = getattr(value, attr, None)
        if isinstance(text, str) and text in Buffer.__members__:
            return Buffer[text]
    inner = getattr(value, "buffer", None)
    if isinstance(inner, Buffer):
        return inner
    raise TypeError(f"buffer must be nl.sbuf, nl.psum, nl.hbm or nl.shared_hbm, got {value!r}")


def new_tile(shape: Sequence[int], dtype: NkiDType, buffer: Buffer = Buffer.sbuf, name: str = "") -> NkiTensor:
    """Allocate and place a fresh tile for a legacy call's result."""
    shape = tuple(int(s) for s in shape)
    if len(shape) < 2 and buffer.on_chip:
        shape = shape + (1,) * (2 - len(shape))
    run = context.current()
    alloc = Allocation.create(buffer, shape, dtype, name or "tile", precise=run.precise_fp)
    tile = NkiTensor(alloc)
    run.memory().place(alloc, None, tile)
    return tile


def mask_counts(instr: str, mask: Any, shape: tuple[int, ...]) -> tuple[int, ...] | None:
    """Leading extents a legacy ``mask=`` keeps, per dim of ``shape`` (None: the whole tile)."""
    if mask is None or mask is True:
        return None
    if mask is False:
        return tuple(0 for _ in shape)
    if not isinstance(mask, MaskExpr):
        raise TypeError(f"{instr}: mask must be a comparison of legacy index expressions (e.g. i_p < n), got "
                        f"{type(mask).__name__}")
    counts = list(shape)
    for term in mask.terms:
        expr, op, bound = term
        dim = expr.position
        if not 0 <= dim < len(shape) or expr.count != shape[dim]:
            fail(instr, f"mask bound '{op} {bound}' is on an index of {expr.count} values at position {dim}, which "
                 f"does not index a dimension of the {list(shape)} result; masks must bound the result's own "
                 "indices")
        kept = prefix_kept(instr, expr, term, f"'{op} {bound}'")
        counts[dim] = builtins.min(counts[dim], kept)
    return tuple(counts)


def _cut(t: Any, key: tuple[slice, ...], shape: tuple[int, ...]) -> Any:
    if not isinstance(t, NkiTensor):
        return t
    if tuple(t.shape) == shape:
        return t[key]
    if t.shape and t.shape[0] == shape[0]:
        return t[key[:1]]
    return t


def masked_operands(instr: str, mask: Any, dst: NkiTensor, *inputs: Any) -> tuple[NkiTensor, list[Any]] | None:
    """``dst`` and same-shaped inputs restricted to the mask's leading box (None: nothing to do)."""
    counts = mask_counts(instr, mask, tuple(dst.shape))
    if counts is None:
        return dst, list(inputs)
    if 0 in counts:
        return None
    key = tuple(slice(0, c) for c in counts)
    shape = tuple(dst.shape)
    return dst[key], [_cut(t, key, shape) for t in inputs]


# ============================================================================ helpers shared by the instruction modules
def buffer_rule(instr: str, role: str, t: NkiTensor, want: Buffer, why: str) -> None:
    if t._alloc.buffer is not want:
        fail(instr, f"{role} {t.name!r} is in {t._alloc.buffer.value}, but {why}")


def choose_engine(instr: str, requested: engine, allowed: tuple[engine, ...]) -> None:
    if requested not in allowed:
        names = ", ".join(ENGINE_TITLE[ENGINE_NAME[e]] for e in allowed)
        fail(instr, f"{instr} runs on {names}, not {requested.name} (engine=nisa.engine.{requested.name})")


def apply_alu(spec: AluOp, x: np.ndarray, value: Any, reverse: bool) -> np.ndarray:
    if spec.arity == 1:
        return spec.fn(x)
    return spec.fn(value, x) if reverse else spec.fn(x, value)
