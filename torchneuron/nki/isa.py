"""``nki.isa`` (``nisa``): the NKI instruction set, executed by the simulator.

Every function checks the hardware rules of nki-api-facts.md sections 4 and 6 for the
run's target (``context.current().target``: trn1/trn2/trn3 = NeuronCore v2/v3/v4),
computes its result with NumPy on whole tiles (engines compute in fp32; bit-vector ops
and GpSimd int32 arithmetic on integers; TensorE accumulates in fp32 PSUM), writes it
through ``dst.write()`` (which rounds into ``dst``'s dtype) and records exactly one
:class:`~torchneuron.nki.instruction.Instruction` for the cost model.

Call styles
-----------
Current NKI (0.2+) is **dst-first**: ``nisa.tensor_tensor(dst=c, data1=a, data2=b,
op=nl.add)`` writes ``c`` and returns an :class:`NkiInstruction` handle (whose
``.depends_on(*producers)`` adds scheduling edges, recorded as
``attrs["depends_on"] = [instruction indices]``). Legacy ``neuronxcc.nki`` calls return
their result instead: ``c = nisa.tensor_tensor(a, b, np.add)``,
``psum = nisa.nc_matmul(stat, mov)``, ``nisa.activation(op=nl.exp, data=x, ...)``.

**Detection rule.** A call is current-style when ``dst`` is passed by keyword, or when its
arguments bind to the current signature with every tensor-only parameter (``dst`` and the
required input tiles, e.g. ``data1``/``data2`` of tensor_tensor) bound to an
:class:`NkiTensor` and every required parameter present. Anything else is a legacy call:
it is bound to the legacy signature (nki-api-facts.md section 10), a result tile is
allocated (SBUF; PSUM for ``nc_matmul`` and TensorE ``nc_transpose``) with the legacy
``dtype=`` (default: the input dtype, or the promoted dtype of two inputs) and the legacy
``mask=`` restricts the instruction to the leading rows/columns it allows. Legacy-only
keywords (``mask=``, ``dtype=``) route a call with ``dst`` to the legacy path too.
:func:`accumulate_matmul_result` folds the legacy ``psum[...] += nisa.nc_matmul(a, b)`` into
the matmul itself (it then accumulates into ``psum``), as the legacy compiler did.

Masks: a :class:`~torchneuron.nki.indexing.MaskExpr` whose every bound is a prefix bound
on an index variable (``i_p < n``, ``k * 128 + i_f < n``); each term bounds the tile
dimension its index was broadcast to (``nl.arange(n)[:, None]`` is dim 0,
``nl.mgrid`` position k is dim k). The instruction then runs on the leading sub-tile
(inputs sliced alike); other masks raise ``NkiValidationError``.

Engine choice when ``engine=nisa.engine.unknown`` (facts 4.3-4.7; our decision where the
compiler's heuristic is unpublished):

* ``tensor_tensor``: GpSimd for ``nl.power`` and for arithmetic on all-int32/uint32
  operands with nothing in PSUM; VectorE otherwise (always VectorE for bit-vector ops).
* ``tensor_scalar``: GpSimd when an op is ``rsqrt`` and nothing is in PSUM (the documented
  precise path of ``nl.rsqrt``); VectorE otherwise. Never ScalarE unless requested.
* ``tensor_copy``, ``memset``: VectorE.
* ``nc_transpose``: TensorE when ``data`` is in SBUF and ``dst`` in PSUM, else VectorE
  (legacy calls: VectorE for tiles up to 32x32 or PSUM input, else TensorE).

Decisions where the facts are silent (for docs/nki.md)
------------------------------------------------------
1. **PSUM accumulation groups** are tracked per element through the written-mask: a
   TensorE write marks a location "matmul group open"; any non-matmul write (memset,
   tensor_copy, activation...) marks it "initialised by a non-matmul instruction"; a read
   by a non-TensorE instruction closes the group. ``accumulate=None`` accumulates where a
   group is open and overwrites elsewhere (so a PSUM tile reused across output tiles
   restarts its group after it is copied out). ``accumulate=True`` on a never-written
   location, and (v2/v3) on a location last written by a non-matmul instruction, raises
   (UB on hardware, facts 4.1 / rule 12). ``is_transpose=True`` never accumulates.
2. ``is_transpose=True`` on v3+ is a bit-exact pass-through: ``moving`` must be an
   identity matrix and ``dst`` has the input's dtype (2-byte types), or a 2-byte dtype
   holding the zero-extended bits for fp8 input. On v2 it is an ordinary fp32 matmul.
   TensorE ``nc_transpose`` on v2 emulates the identity matmul: a NaN/Inf anywhere in a
   column of ``data`` turns the rest of that output row into NaN.
3. Transposes (``is_transpose``, ``nc_transpose``) record ``flops=0``.
4. ScalarE ``tensor_scalar`` op pairs are restricted to (multiply, add), (multiply, -),
   (add, -) on v2 and v3 (documented for trn2; trn1 assumed alike), not on v4. GpSimd
   runs ``tensor_scalar`` only when one of its ops is ``rsqrt``.
5. ``activation``'s ``reduce_op`` must be ``nl.add``; ``activation_reduce`` also accepts
   max/min on v3+ (the docs restrict only v2 to add).
6. Engine accumulator registers (128 per engine, fp32) live in the run, per physical core
   (ScalarE: activation/activation_reduce/activate2; VectorE: exponential, range_select,
   select_reduce, tensor_scalar_reduce, tensor_scalar_cumulative). They start
   uninitialised (NaN); reading lanes never reset goes through the run's
   uninitialised-read policy.
7. ScalarE activation input outside the function's valid range (facts 5) emits an
   :class:`NkiActivationRangeWarning` (function, range, observed min/max; once per kernel
   line and function) and computes the exact function (hardware output is invalid there;
   AWS's ``sin`` cubic extrapolation is not reproduced: its polynomial is unpublished).
8. ``dma_copy`` rejects PSUM on either side (the facts list HBM<->SBUF, HBM->HBM and
   SBUF->SBUF). Shapes may differ when element counts match: data is copied in row-major
   order. Legacy clipped HBM views copy only their valid box.
9. GpSimd integer ``tensor_tensor``: exact int64 arithmetic wrapped to the dst dtype;
   ``divide``/``mod`` truncate toward zero (C semantics).
10. ``tensor_scalar`` operand tiles are not required to be float32 (docs say they must
    be; kernels commonly pass bf16 vectors and engines cast anyway).
11. ``tensor_tensor_scan`` runs a loop over the free dimension (each step vectorised over
    partitions); ``tensor_scalar_cumulative`` uses ufunc accumulation (sequential fp32),
    and ``subtract`` an alternating-sum closed form.
12. RNG: each run starts every engine's generator from a fixed seed (core index), so
    runs are deterministic; ``set_rng_seed`` reseeds VectorE with the seed's 32 bits.
    ``dropout`` draws U[0,1) per element and keeps values whose draw is >= ``prob``.
13. ``local_gather`` follows AWS's NumPy reference: indices are element offsets within
    each partition's flattened free dims, read per 16-partition core in partition-major
    (Fortran) order; out-of-range indices raise.
14. ``nc_find_index8`` pairs duplicate vals with successive occurrences; ``nc_match_replace8``
    processes vals from 7 down to 0 (facts / AWS docstrings); not-found slots hold all
    ones (unsigned) or -1 (signed).
15. ``tensor_partition_reduce`` writes a one-partition ``dst`` with ``data``'s free size.
16. Not simulated (clear error): ``nc_matmul_mx``/``quantize_mx`` (x4 packed dtypes are not
    NKI dtypes here), ``sendrecv``/``core_barrier`` (LNC programs run one after another),
    tensor indirection (``.indirect()``), ``rand_set_state``/``rand_get_state`` (XORWOW state
    layout unpublished), ``topk`` (its 16-partition snake semantics are ambiguous).
17. The NeuronCore version comes from ``ChipSpec.neuroncore_version`` (trn1 v2, trn2 v3,
    trn3 v4). ``dma_transpose`` runs on every target (``dge_mode=hwdge`` needs v3+);
    ``priority`` needs v4.
18. Legacy calls follow the current register semantics: ``activation(..., reduce_res=r)``
    with the default ``reduce_cmd=idle`` reads the registers out without reducing (AWS's
    legacy examples pass ``reduce_cmd=reset_reduce``); legacy ``range_select`` defaults
    to ``idle`` as its legacy signature did.
19. ``select_reduce`` predicates are int8/uint8/int16/uint16; ``range_select`` bounds are
    float32 (P, 1) tiles; ``nc_stream_shuffle`` mask value 255 leaves the dst partition.
20. TensorE products are computed with NumPy float32 matmul on one BLAS thread (per call,
    thread-local): a tile matmul is too small to gain from OpenBLAS's pool, and waking it
    between other NumPy work cost several times the product itself.
"""

from __future__ import annotations

import builtins
import enum
import functools
import inspect
import math
import threading
import warnings
import weakref
from typing import Any, Callable, Sequence

import numpy as np

from torchneuron.nki import context
from torchneuron.nki.dtypes import NkiDType, resolve, round_tf32
from torchneuron.nki.errors import NkiUninitializedReadError, NkiValidationError, fail, kernel_location
from torchneuron.nki.indexing import AffineIndex, MaskExpr
from torchneuron.nki.instruction import Engine, Instruction
from torchneuron.nki.memory import PSUM_BANK_BYTES, Allocation, Buffer
from torchneuron.nki.ops import ALU_OPS, AluOp, ActivationFn, activation_fn, alu_op, nki_op_name
from torchneuron.nki.tensor import NkiTensor

__all__ = [
    # enums and classes
    "engine", "reduce_cmd", "dge_mode", "oob_mode", "matmul_perf_mode", "nc_version", "dma_engine",
    "NkiValidationError", "NkiInstruction", "NkiActivationRangeWarning", "VirtualRegister",
    "tensor_engine", "vector_engine", "scalar_engine", "gpsimd_engine", "unknown_engine",
    "get_nc_version", "get_nc_sub_version",
    # TensorE
    "nc_matmul", "nc_transpose", "nc_matmul_mx",
    # ScalarE
    "activation", "activation_reduce", "activate2",
    # VectorE
    "tensor_tensor", "tensor_scalar", "tensor_reduce", "tensor_copy", "tensor_copy_predicated", "memset",
    "reciprocal", "exponential", "scalar_tensor_tensor", "tensor_scalar_reduce", "tensor_scalar_cumulative",
    "tensor_tensor_scan", "bn_stats", "bn_aggr", "select_reduce", "range_select", "max8", "nc_find_index8",
    "nc_match_replace8", "nc_stream_shuffle", "dropout", "rng", "rand2", "set_rng_seed",
    "rand_set_state", "rand_get_state", "quantize_mx",
    # GpSimd
    "iota", "affine_select", "local_gather", "nc_n_gather", "tensor_partition_reduce", "sequence_bounds",
    "nonzero_with_count", "topk",
    # DMA
    "dma_copy", "dma_transpose", "dma_compute",
    # registers and multi-core
    "register_alloc", "register_move", "register_load", "register_store", "core_barrier", "sendrecv",
]


# ============================================================================ enums
class engine(enum.Enum):
    """Neuron device engines (facts 4)."""

    tensor = 1
    vector = 5
    scalar = 2
    gpsimd = 3
    dma = 4
    sync = 6
    unknown = 0


class reduce_cmd(enum.Enum):
    """Engine accumulator-register commands."""

    idle = 0
    reset = 1
    reduce = 2
    reset_reduce = 3
    load_reduce = 4


class dge_mode(enum.Enum):
    """DMA descriptor-generation mode."""

    unknown = 0
    swdge = 1
    hwdge = 2
    none = 3


class oob_mode(enum.Enum):
    """Out-of-bounds handling of indirect DMA."""

    error = 0
    skip = 1


class matmul_perf_mode(enum.Enum):
    """TensorE performance mode."""

    none = "none"
    double_row = "double_row"


class nc_version(enum.Enum):
    """NeuronCore generation: gen2 = Trn1/Inf2, gen3 = Trn2, gen4 = Trn3."""

    gen2 = 2
    gen3 = 3
    gen4 = 4


class dma_engine(enum.Enum):
    """DMA engine used by ``sendrecv``."""

    dma = 1
    gpsimd_dma = 2


# Deprecated aliases kept by current NKI (facts 4).
tensor_engine = engine.tensor
vector_engine = engine.vector
scalar_engine = engine.scalar
gpsimd_engine = engine.gpsimd
unknown_engine = engine.unknown

# Parameters named like the enums shadow them inside functions; these names do not.
_Eng = engine
_RCmd = reduce_cmd
_Dge = dge_mode
_Oob = oob_mode
_Perf = matmul_perf_mode

FP32_MIN = float(np.finfo(np.float32).min)

_ENGINE_NAME = {_Eng.tensor: Engine.TENSOR, _Eng.vector: Engine.VECTOR, _Eng.scalar: Engine.SCALAR,
                _Eng.gpsimd: Engine.GPSIMD, _Eng.dma: Engine.DMA, _Eng.sync: Engine.SYNC}
_TITLE = {Engine.TENSOR: "TensorE", Engine.VECTOR: "VectorE", Engine.SCALAR: "ScalarE",
          Engine.GPSIMD: "GpSimd", Engine.DMA: "DMA", Engine.SYNC: "SyncE"}


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
        edges = self.instruction.attrs.setdefault("depends_on", [])
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
        return self

    def __repr__(self) -> str:
        return f"NkiInstruction({self.instruction.index}: {self.instruction.opcode} on {self.instruction.engine})"


# ============================================================================ run state
_TARGET_VERSION: dict[str, int] = {}


def _ctx() -> tuple[context.KernelRun, int]:
    """The active run and its NeuronCore version (2, 3 or 4), cached per chip name."""
    run = context.current()
    chip = run.target
    version = _TARGET_VERSION.get(chip.name)
    if version is None:
        text = str(chip.neuroncore_version).lstrip("vV")
        version = int(text) if text.isdigit() else {"trn1": 2, "inf2": 2, "trn2": 3, "trn3": 4}.get(chip.name, 3)
        _TARGET_VERSION[chip.name] = version
    return run, version


class _CoreState:
    """Per-physical-core engine state kept for the length of a run (decisions 6 and 12)."""

    def __init__(self, core: int) -> None:
        self.act_acc = np.full(128, np.nan, dtype=np.float32)  # ScalarE reduce registers
        self.act_valid = np.zeros(128, dtype=bool)
        self.dve_acc = np.full(128, np.nan, dtype=np.float32)  # VectorE accumulators
        self.dve_valid = np.zeros(128, dtype=bool)
        self.rng = {Engine.VECTOR: np.random.default_rng(2 * core),
                    Engine.GPSIMD: np.random.default_rng(2 * core + 1)}
        self.warned: set = set()


def _core_state(run: context.KernelRun) -> _CoreState:
    states = run.__dict__.get("_isa_states")
    if states is None:
        states = run.__dict__.setdefault("_isa_states", {})
    program = getattr(context._local, "program", 0)
    core = program % run.lnc if run.lnc > 1 else 0
    state = states.get(core)
    if state is None:
        state = states.setdefault(core, _CoreState(core))
    return state


def _record(run: context.KernelRun, opcode: str, eng: str, reads: Sequence[NkiTensor],
            writes: Sequence[NkiTensor], flops: int = 0, name: str | None = None,
            **attrs: Any) -> NkiInstruction:
    if name is not None:
        attrs["name"] = name
    instruction = run.record(opcode, eng, tuple(t.operand() for t in reads), tuple(t.operand() for t in writes),
                             kernel_location(), flops=int(flops), **attrs)
    return NkiInstruction(instruction)


# ============================================================================ argument helpers
def _enum(instr: str, param: str, value: Any, kind: type[enum.Enum], aliases: dict | None = None) -> Any:
    """``value`` as a member of ``kind``; raw ints were rejected in NKI 0.3.0 (facts 4)."""
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
    members = ", ".join(f"nisa.{kind.__name__}.{m}" for m in kind.__members__)
    raise TypeError(f"{instr}: {param} must be a member of nisa.{kind.__name__} ({members}), got {value!r}; "
                    "raw values were rejected in NKI 0.3.0")


def _tensor(instr: str, role: str, value: Any) -> NkiTensor:
    if not isinstance(value, NkiTensor):
        raise TypeError(f"{instr}: {role} must be an NKI tensor (a tile from nl.ndarray/nl.load or a view of "
                        f"one), got {type(value).__name__}")
    return value


def _scalar_value(instr: str, role: str, value: Any) -> float:
    if isinstance(value, (bool, np.bool_)):
        return float(value)
    if isinstance(value, (int, float, np.integer, np.floating)):
        return float(value)
    raise TypeError(f"{instr}: {role} must be a number or a ({'P'}, 1) tile, got {type(value).__name__}")


def _op(instr: str, role: str, op: Any) -> AluOp:
    if op is None:
        raise TypeError(f"{instr}: {role} is required (e.g. nl.add)")
    return alu_op(op)


_INT32 = ("int32", "uint32")


# ============================================================================ operand rules
def _start_rule(instr: str, role: str, t: NkiTensor, start: int, partitions: int) -> None:
    """Rule 6 (facts 2, 6): allowed start partitions depend on the partition span."""
    if partitions > 64:
        allowed = (0,)
    elif partitions > 32:
        allowed = (0, 64)
    else:
        allowed = (0, 32, 64, 96)
    if start not in allowed:
        span = "more than 64" if partitions > 64 else ("33 to 64" if partitions > 32 else "1 to 32")
        places = str(allowed[0]) if len(allowed) == 1 else \
            ", ".join(map(str, allowed[:-1])) + f" or {allowed[-1]}"
        fail(instr, f"{role} {t.name!r} starts at partition {start} and spans {partitions} partitions; an "
             f"operand spanning {span} partitions must start at partition {places} (start-partition rule); "
             "allocate or slice the tile so it starts there")


def _operand(instr: str, role: str, t: Any, eng: str) -> NkiTensor:
    """Rules 1, 3, 6, 7, 8 for one compute-engine operand; returns the tensor."""
    t = _tensor(instr, role, t)
    buffer = t._alloc.buffer
    title = _TITLE[eng]
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


def _same_partitions(instr: str, a_role: str, a: NkiTensor, b_role: str, b: NkiTensor) -> None:
    if a.shape[0] != b.shape[0]:
        fail(instr, f"{b_role} spans {b.shape[0]} partitions but {a_role} spans {a.shape[0]}; they must span the "
             "same partition count (the engine moves data within its lanes)")


def _same_layout(instr: str, a_role: str, a: NkiTensor, b_role: str, b: NkiTensor) -> None:
    """Same partition count and same elements per partition (facts 4.3 / 6 rule 8)."""
    _same_partitions(instr, a_role, a, b_role, b)
    if a.free_size != b.free_size:
        fail(instr, f"{b_role} has {b.free_size} elements per partition (shape {list(b.shape)}) but {a_role} has "
             f"{a.free_size} (shape {list(a.shape)}); they must match")


def _vector_operand(instr: str, role: str, value: Any, partitions: int, eng: str,
                    reads: list[NkiTensor], integer: bool = False) -> Any:
    """A scalar operand or a (P, 1) tile as an array broadcasting against (P, F) values."""
    if isinstance(value, NkiTensor):
        t = _operand(instr, role, value, eng)
        if t.shape[0] != partitions or t.free_size != 1:
            fail(instr, f"{role} must be a scalar or a ({partitions}, 1) tile (one value per partition of the "
                 f"data), got shape {list(t.shape)}")
        reads.append(t)
        raw = _read(t, instr)
        if integer:
            return raw.reshape(partitions, 1)
        return raw.astype(np.float32).reshape(partitions, 1)
    if integer:
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
            if isinstance(value, (float, np.floating)) and float(value).is_integer():
                return np.int64(int(value))
            raise TypeError(f"{instr}: bit-vector {role} must be an integer, got {value!r}")
        return np.int64(int(value))
    return np.float32(_scalar_value(instr, role, value))


# ============================================================================ data access
def _marks(mask: np.ndarray) -> tuple[int, int, int]:
    """Written-mask values: non-matmul write, matmul group open, matmul group closed."""
    full = int(np.iinfo(mask.dtype).max)
    return full, full - 1, full - 2


def _read(t: NkiTensor, instr: str) -> np.ndarray:
    """``t``'s storage values after the uninitialised-read check; a PSUM read closes matmul groups."""
    data = t.read(instr)
    if t._alloc.buffer is Buffer.psum:
        mask = t._mask
        if mask.flags.writeable and mask.size:
            _, open_, closed = _marks(mask)
            hit = mask == open_
            if hit.any():
                mask[hit] = closed
    return data


def _f32(t: NkiTensor, instr: str) -> np.ndarray:
    """Values as a float32 (P, F) array: engines compute in fp32 (facts 4)."""
    data = _read(t, instr)
    values = data.astype(np.float32)
    if t.dtype.name == "tfloat32":
        values = round_tf32(values)
    return values.reshape(data.shape[0] if data.ndim else 1, -1)


def _raw2d(t: NkiTensor, instr: str) -> np.ndarray:
    """Storage values as a (P, F) array (bit-exact paths)."""
    data = _read(t, instr)
    return data.reshape(data.shape[0] if data.ndim else 1, -1)


def _store(dst: NkiTensor, values: Any, where: np.ndarray | None = None) -> None:
    """Write (P, F)-shaped ``values`` into ``dst`` (rounding into its dtype)."""
    shape = dst._data.shape
    values = np.asarray(values)
    if values.shape != shape and values.size == math.prod(shape):
        values = values.reshape(shape)
    if where is not None and where.shape != shape:
        where = np.broadcast_to(where.reshape(shape) if where.size == math.prod(shape) else where, shape)
    dst.write(values, where=where)


def _warn_once(run: context.KernelRun, key: Any, message: str, category: type[Warning]) -> None:
    state = _core_state(run)
    location = kernel_location()
    full_key = (key, str(location))
    if full_key in state.warned:
        return
    state.warned.add(full_key)
    where = f"{location}: " if location is not None else ""
    warnings.warn(f"{where}{message}", category, stacklevel=4)


def _registers_read(run: context.KernelRun, instr: str, valid: np.ndarray, lanes: slice, what: str) -> None:
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


def _lanes(t: NkiTensor) -> slice:
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
            if not any(key in kwargs for key in legacy_only) and (
                    "dst" in kwargs or _binds_current(args, kwargs, names, required, tensors)):
                return fn(*args, **kwargs)
            try:
                legacy_sig.bind(*args, **kwargs)
            except TypeError as exc:
                raise TypeError(f"nisa.{fn.__name__}: the arguments fit neither the dst-first signature "
                                f"{fn.__name__}{current_sig} (which needs dst and the input tiles) nor the "
                                f"legacy one {fn.__name__}{legacy_sig}: {exc}") from None
            return legacy(*args, **kwargs)

        call.legacy = legacy  # type: ignore[attr-defined]
        return call

    return wrap


def _legacy_dtype(dtype: Any, *inputs: Any) -> NkiDType:
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


def _buffer_of(value: Any, default: Buffer = Buffer.sbuf) -> Buffer:
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


def _new_tile(shape: Sequence[int], dtype: NkiDType, buffer: Buffer = Buffer.sbuf, name: str = "") -> NkiTensor:
    """Allocate and place a fresh tile for a legacy call's result."""
    shape = tuple(int(s) for s in shape)
    if len(shape) < 2 and buffer.on_chip:
        shape = shape + (1,) * (2 - len(shape))
    alloc = Allocation.create(buffer, shape, dtype, name or "tile")
    tile = NkiTensor(alloc)
    context.current().memory().place(alloc, None, tile)
    return tile


def _mask_counts(instr: str, mask: Any, shape: tuple[int, ...]) -> tuple[int, ...] | None:
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
        try:
            kept = expr.valid_count(MaskExpr((term,)))
        except IndexError as exc:
            fail(instr, f"mask {op} {bound} does not keep a leading run of its index ({exc}); only prefix masks "
                 "such as i_p < n are simulated: bound the slice with min() instead")
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


def _masked(instr: str, mask: Any, dst: NkiTensor, *inputs: Any) -> tuple[NkiTensor, list[Any]] | None:
    """``dst`` and same-shaped inputs restricted to the mask's leading box (None: nothing to do)."""
    counts = _mask_counts(instr, mask, tuple(dst.shape))
    if counts is None:
        return dst, list(inputs)
    if 0 in counts:
        return None
    key = tuple(slice(0, c) for c in counts)
    shape = tuple(dst.shape)
    return dst[key], [_cut(t, key, shape) for t in inputs]


# ============================================================================ TensorE
_MATMUL_INPUTS = frozenset(("float8_e4m3", "float8_e5m2", "bfloat16", "float16", "tfloat32", "float32"))
_FP8 = frozenset(("float8_e4m3", "float8_e5m2", "float8_e4m3fn"))
_FP32ISH = frozenset(("float32", "tfloat32"))
_PERF_ALIASES = {"none": _Perf.none, "double_row": _Perf.double_row, "double_row_gen3": _Perf.double_row}

# The newest legacy nc_matmul result of each thread, for folding ``psum += nisa.nc_matmul(...)``
# (accumulate_matmul_result): (weak reference to the result tile, its instruction).
_LEGACY_MATMUL = threading.local()


def _buffer_rule(instr: str, role: str, t: NkiTensor, want: Buffer, why: str) -> None:
    if t._alloc.buffer is not want:
        fail(instr, f"{role} {t.name!r} is in {t._alloc.buffer.value}, but {why}")


def _check_bank(instr: str, dst: NkiTensor, version: int) -> None:
    """Rule 3: on v2/v3 a TensorE output stays inside one 2 KiB PSUM bank per partition."""
    alloc = dst._alloc
    data = dst._data
    row = alloc.data.strides[0] if alloc.data.ndim else 0
    low = data.__array_interface__["data"][0] - alloc.data.__array_interface__["data"][0]
    in_row = low % row if row else low
    span = sum((n - 1) * abs(s) for n, s in zip(data.shape[1:], data.strides[1:])) + data.itemsize
    first = alloc.free_offset + in_row
    last = first + span - 1
    if first // PSUM_BANK_BYTES != last // PSUM_BANK_BYTES:
        fail(instr, f"dst {dst.name!r} covers PSUM bytes {first}..{last} of each partition, crossing the "
             f"{PSUM_BANK_BYTES} B bank boundary (banks {first // PSUM_BANK_BYTES} and {last // PSUM_BANK_BYTES}); "
             f"on NeuronCore-v{version} a TensorE output must stay within one PSUM bank (512 fp32 elements per "
             "partition, nl.tile_size.psum_bank_fmax): split the moving free dimension at bank boundaries")


def _tiling(instr: str, tile_position: Any, tile_size: Any, version: int) -> tuple[int, int]:
    """Tiling mode (facts 4.1): (row_size, column_size), (128, 128) when off."""
    position = tuple(tile_position or ())
    size = tuple(tile_size or ())
    if not position and not size:
        return 128, 128
    if bool(position) != bool(size):
        fail(instr, f"tile_position={position} and tile_size={size}: both must be set to enable TensorE tiling "
             "mode (or neither, for the full 128x128 array)")
    if len(position) != 2 or len(size) != 2:
        fail(instr, f"tile_position and tile_size are (row, column) pairs, got {position} and {size}")
    rows, cols = int(size[0]), int(size[1])
    row0, col0 = int(position[0]), int(position[1])
    valid = (32, 64, 128) if version >= 3 else (64, 128)
    for what, value in (("row", rows), ("column", cols)):
        if value not in valid:
            fail(instr, f"tile_size {what} size {value} is not one of {valid} on NeuronCore-v{version}"
                 + (" (32 needs NeuronCore-v3 or newer)" if value == 32 else ""))
    for what, start, extent in (("row", row0, rows), ("column", col0, cols)):
        if start % extent or not 0 <= start <= 128 - extent:
            fail(instr, f"tile_position {what} {start} must be a multiple of the {what} size {extent} with the "
                 f"tile inside the 128x128 array")
    return rows, cols


def _bool_arg(instr: str, param: str, value: Any, allow_none: bool = False) -> bool | None:
    if value is None and allow_none:
        return None
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (int, np.integer)) and value in (0, 1):
        return bool(value)
    raise TypeError(f"{instr}: {param} must be True or False{' or None' if allow_none else ''}, got {value!r}")


_BLAS_THREADS: Any = False  # openblas_set_num_threads_local of NumPy's OpenBLAS, None if unavailable


def _blas_local_threads() -> Any:
    global _BLAS_THREADS
    if _BLAS_THREADS is False:
        _BLAS_THREADS = None
        try:
            import ctypes
            import glob
            import os

            folder = os.path.join(os.path.dirname(np.__file__), os.pardir, "numpy.libs")
            for path in glob.glob(os.path.join(folder, "*openblas*")):
                setter = getattr(ctypes.CDLL(path), "openblas_set_num_threads_local", None)
                if setter is not None:
                    setter.restype, setter.argtypes = ctypes.c_int, [ctypes.c_int]
                    _BLAS_THREADS = setter
                    break
        except OSError:  # pragma: no cover - another BLAS build
            _BLAS_THREADS = None
    return _BLAS_THREADS


def _sgemm(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``a @ b`` in float32 on one BLAS thread.

    A matmul tile is small (at most 128 x 128 x 8192): waking OpenBLAS's thread pool for
    each one, between other NumPy work, costs several times the product itself, so the
    calling thread is switched to single-threaded BLAS for the call (thread-local, restored).
    """
    setter = _blas_local_threads()
    if setter is None:
        return np.matmul(a, b, dtype=np.float32)
    previous = setter(1)
    try:
        return np.matmul(a, b, dtype=np.float32)
    finally:
        setter(previous)


def _write_bits(dst: NkiTensor, bits: np.ndarray) -> None:
    """Store raw bit patterns (same itemsize as dst's storage) and mark them written."""
    shape = dst._data.shape
    dst._data[...] = np.ascontiguousarray(bits).view(dst._data.dtype).reshape(shape)
    dst._mask[...] = np.iinfo(dst._mask.dtype).max


def nc_matmul(dst: NkiTensor, stationary: NkiTensor, moving: NkiTensor, is_stationary_onezero: bool = False,
              is_moving_onezero: bool = False, is_transpose: bool = False, accumulate: bool | None = None,
              tile_position: Sequence[int] = (), tile_size: Sequence[int] = (),
              perf_mode: matmul_perf_mode = matmul_perf_mode.none, name: str | None = None) -> NkiInstruction:
    """``dst = stationary.T @ moving`` on TensorE, accumulating in fp32 PSUM (facts 4.1, rules 3, 4, 12)."""
    instr = "nc_matmul"
    run, version = _ctx()
    te = Engine.TENSOR
    stationary = _operand(instr, "stationary", stationary, te)
    moving = _operand(instr, "moving", moving, te)
    dst = _operand(instr, "dst", dst, te)
    for role, t in (("stationary", stationary), ("moving", moving)):
        _buffer_rule(instr, role, t, Buffer.sbuf, "TensorE reads its inputs only from SBUF: copy it into SBUF "
                     "with nisa.tensor_copy first")
    _buffer_rule(instr, "dst", dst, Buffer.psum, "TensorE writes only to PSUM: allocate dst with buffer=nl.psum "
                 "and copy the result out with nisa.tensor_copy")
    perf = _Perf.none if perf_mode is None else _enum(instr, "perf_mode", perf_mode, _Perf, _PERF_ALIASES)
    accumulate = _bool_arg(instr, "accumulate", accumulate, allow_none=True)
    transpose = bool(_bool_arg(instr, "is_transpose", is_transpose))
    sd, md, dd = stationary.dtype.name, moving.dtype.name, dst.dtype.name
    allowed = _MATMUL_INPUTS | (frozenset(("float8_e4m3fn",)) if version >= 4 else frozenset())
    for role, dname in (("stationary", sd), ("moving", md)):
        if dname not in allowed:
            extra = " (float8_e4m3fn needs NeuronCore-v4, trn3)" if dname == "float8_e4m3fn" else ""
            fail(instr, f"{role} dtype {dname} is not a TensorE input type on NeuronCore-v{version}; use one of "
                 f"{', '.join(sorted(allowed))}{extra}")
    if {sd, md} == {"float8_e4m3", "float8_e4m3fn"}:
        fail(instr, "stationary and moving mix float8_e4m3 (legacy) and float8_e4m3fn (OCP); the two e4m3 "
             "variants cannot be mixed in one matmul: convert one of them")
    if (sd in _FP32ISH) != (md in _FP32ISH):
        fail(instr, f"stationary is {sd} and moving is {md}; if one input is float32/tfloat32 the other must be "
             "float32/tfloat32 too: cast the other input")
    rows, cols = _tiling(instr, tile_position, tile_size, version)
    partitions = stationary.shape[0]
    if perf is _Perf.double_row:
        if version < 3:
            fail(instr, f"perf_mode=double_row needs NeuronCore-v3 or newer (trn2/trn3); target "
                 f"{run.target.name} is NeuronCore-v{version}")
        if sd not in _FP8 or md not in _FP8:
            fail(instr, f"perf_mode=double_row takes fp8 inputs only, got stationary {sd} and moving {md}")
        if transpose:
            fail(instr, "perf_mode=double_row cannot be combined with is_transpose=True")
        if cols != 128:
            fail(instr, f"perf_mode=double_row cannot be combined with column tiling (tile_size column {cols})")
        for role, t in (("stationary", stationary), ("moving", moving)):
            if t.ndim != 3 or t.shape[1] != 2:
                fail(instr, f"perf_mode=double_row splits the contraction as [P, 2, F]: {role} must be 3-D with "
                     f"dim 1 equal to 2, got shape {list(t.shape)}")
        contraction, m_size, n_size = 2 * partitions, stationary.shape[2], moving.shape[2]
    else:
        contraction, m_size, n_size = partitions, stationary.free_size, moving.free_size
    if moving.shape[0] != partitions:
        fail(instr, f"stationary has {partitions} partitions and moving {moving.shape[0]}; the contraction runs over "
             "the partition axis of both inputs (layout LC#1), so their partition sizes must be equal")
    if partitions > rows:
        fail(instr, f"contraction (partition) size is {partitions}, above the tile row size {rows}"
             if rows < 128 else f"contraction (partition) size is {partitions}, above TensorE's 128 rows")
    if m_size > cols:
        limit = "nl.tile_size.gemm_stationary_fmax" if cols == 128 else "the tile_size column size"
        fail(instr, f"stationary free size is {m_size}, above TensorE's limit of {cols} ({limit}); split the "
             "stationary tile")
    if version >= 4:
        n_limit = 8192 if dd == "bfloat16" else 4096
        why = f"8 PSUM banks of {'bf16' if dd == 'bfloat16' else 'fp32'} on NeuronCore-v4"
    else:
        n_limit, why = 512, f"one PSUM bank of fp32, nl.tile_size.gemm_moving_fmax, on NeuronCore-v{version}"
    if n_size > n_limit:
        fail(instr, f"moving free size is {n_size}, above TensorE's limit of {n_limit} ({why}); split the moving "
             "tile")
    if dst.shape[0] != m_size or dst.free_size != n_size:
        fail(instr, f"dst has shape {list(dst.shape)} but must be [stationary free, moving free] = "
             f"[{m_size}, {n_size}]")
    transpose_mode = transpose and version >= 3
    if transpose_mode:
        if accumulate:
            fail(instr, "is_transpose=True cannot accumulate (accumulate=True): a transpose overwrites dst")
        if sd in _FP8:
            if dst.dtype.itemsize != 2:
                fail(instr, f"is_transpose=True on {sd} input writes 16-bit PSUM elements; dst is {dd}")
        elif dd != sd:
            fail(instr, f"is_transpose=True writes the input's dtype: dst must be {sd}, got {dd}")
    elif dd != "float32" and not (version >= 4 and dd == "bfloat16"):
        fail(instr, f"dst dtype is {dd}; TensorE writes float32 PSUM on NeuronCore-v{version}"
             + (" (bfloat16 is also allowed on NeuronCore-v4)" if version < 4 else " or bfloat16"))
    if version < 4:
        _check_bank(instr, dst, version)

    mask = dst._mask
    full, open_, _closed = _marks(mask)
    reads = [stationary, moving]
    if not run.compute_values:  # shape-only run: validate and record, skip the arithmetic
        resolved = (not transpose_mode) and (accumulate if accumulate is not None else bool((mask == open_).all()))
        if resolved:
            reads.append(dst)
    elif transpose_mode:
        s_raw = _read(stationary, instr)
        m_raw = _read(moving, instr)
        identity = m_raw.astype(np.float32).reshape(contraction, n_size)
        if n_size != contraction or not np.array_equal(identity, np.eye(contraction, dtype=np.float32)):
            fail(instr, f"is_transpose=True passes stationary through TensorE against an identity: moving must be "
                 f"the {contraction}x{contraction} identity matrix, got shape {list(moving.shape)} with other values")
        bits = s_raw.reshape(contraction, m_size).T
        if sd in _FP8:
            bits = bits.view(np.uint8).astype(np.uint16)
        _write_bits(dst, bits)
        resolved: bool | None = False
    else:
        s_raw = _read(stationary, instr)
        m_raw = _read(moving, instr)
        a = s_raw.astype(np.float32).reshape(contraction, m_size)
        b = m_raw.astype(np.float32).reshape(contraction, n_size)
        if sd == "tfloat32":
            a = round_tf32(a)
        if md == "tfloat32":
            b = round_tf32(b)
        product = _sgemm(a.T, b)
        where = None
        if accumulate is True:
            if not mask.all():
                missing = int(mask.size - np.count_nonzero(mask))
                fail(instr, f"accumulate=True onto {missing} PSUM elements of {dst.name!r} that were never written "
                     "(undefined behaviour on hardware): start the accumulation group with accumulate=False")
            if version < 4 and (mask == full).any():
                fail(instr, f"accumulate=True onto PSUM {dst.name!r} last written by a non-matmul instruction "
                     f"(memset/tensor_copy...): undefined behaviour on NeuronCore-v{version}; start the "
                     "accumulation with accumulate=False instead of initialising PSUM")
            resolved = True
        elif accumulate is None:
            group = mask == open_
            if group.all():
                resolved = True
            elif group.any():
                resolved, where = None, group.reshape(m_size, n_size)
            else:
                resolved = False
        else:
            resolved = False
        if resolved is not False:
            previous = dst._data.astype(np.float32).reshape(m_size, n_size)
            product = previous + product if where is None else np.where(where, previous + product, product)
            reads.append(dst)
        _store(dst, product)
    mask[...] = open_
    flops = 0 if transpose else 2 * contraction * m_size * n_size
    handle = _record(run, instr, te, reads, [dst], flops=flops, name=name, op="matmul",
                     stationary_free=m_size, moving_free=n_size, contraction=contraction, perf_mode=perf.value,
                     is_transpose=transpose, accumulate=resolved, accumulate_requested=accumulate,
                     tile_position=tuple(tile_position or ()), tile_size=tuple(tile_size or ()),
                     is_stationary_onezero=bool(is_stationary_onezero), is_moving_onezero=bool(is_moving_onezero))
    return handle


def _nc_matmul_legacy(stationary: NkiTensor, moving: NkiTensor, *, is_stationary_onezero: bool = False,
                      is_moving_onezero: bool = False, is_transpose: bool = False, tile_position: Any = (),
                      tile_size: Any = (), mask: Any = None, perf_mode: Any = None, dtype: Any = None,
                      name: str | None = None) -> NkiTensor:
    """Legacy ``psum = nisa.nc_matmul(stationary, moving)``: a fresh fp32 PSUM result tile."""
    instr = "nc_matmul"
    _run, version = _ctx()
    stationary = _tensor(instr, "stationary", stationary)
    moving = _tensor(instr, "moving", moving)
    perf = _Perf.none if perf_mode is None else _enum(instr, "perf_mode", perf_mode, _Perf, _PERF_ALIASES)
    if perf is _Perf.double_row and stationary.ndim == 3 and moving.ndim == 3:
        m_size, n_size = stationary.shape[2], moving.shape[2]
    else:
        m_size, n_size = stationary.free_size, moving.free_size
    if dtype is not None:
        out_dtype = resolve(dtype)
    elif is_transpose and version >= 3:
        out_dtype = resolve("bfloat16") if stationary.dtype.name in _FP8 else stationary.dtype
    else:
        out_dtype = resolve("float32")
    out = _new_tile((m_size, n_size), out_dtype, Buffer.psum, "matmul_psum")
    counts = _mask_counts(instr, mask, (m_size, n_size))
    dst, stat, mov = out, stationary, moving
    if counts is not None:
        if 0 in counts:
            return out
        if stationary.ndim != 2 or moving.ndim != 2:
            fail(instr, "a legacy mask on nc_matmul is simulated for 2-D stationary and moving tiles only")
        dst = out[0:counts[0], 0:counts[1]]
        stat, mov = stationary[:, 0:counts[0]], moving[:, 0:counts[1]]
    handle = nc_matmul(dst, stat, mov, is_stationary_onezero=is_stationary_onezero,
                       is_moving_onezero=is_moving_onezero, is_transpose=is_transpose, tile_position=tile_position,
                       tile_size=tile_size, perf_mode=perf, name=name)
    _LEGACY_MATMUL.last = (weakref.ref(out), handle.instruction)
    return out


nc_matmul = _dual(("dst", "stationary", "moving"), _nc_matmul_legacy)(nc_matmul)


def accumulate_matmul_result(target: NkiTensor, value: NkiTensor) -> bool:
    """Fold the legacy ``psum[...] += nisa.nc_matmul(a, b)`` (or ``+= nl.matmul``) into the matmul.

    When ``value`` is the PSUM result of the program's newest instruction, an
    ``nc_matmul``, that matmul is re-targeted: ``target += value`` in fp32 and the
    recorded instruction now writes (and accumulates into) ``target``, as the legacy
    compiler fused it. Returns False (nothing done) otherwise, so the caller falls back
    to an ordinary element-wise add.
    """
    if not isinstance(value, NkiTensor) or not isinstance(target, NkiTensor):
        return False
    last = getattr(_LEGACY_MATMUL, "last", None)
    if last is None or last[0]() is not value or target._alloc.buffer is not Buffer.psum:
        return False
    instruction = last[1]
    run, version = _ctx()
    newest = next((i for i in reversed(run.instructions) if i.program == instruction.program), None)
    if newest is not instruction or target.shape[0] != value.shape[0] or target.free_size != value.free_size \
            or instruction.writes[0].shape != tuple(value.shape):
        return False
    instr = "nc_matmul"
    target = _operand(instr, "dst", target, Engine.TENSOR)
    if target.dtype.name != "float32" and not (version >= 4 and target.dtype.name == "bfloat16"):
        fail(instr, f"accumulating a matmul into {target.name!r} of dtype {target.dtype.name}; PSUM accumulation "
             "targets must be float32" + (" or bfloat16" if version >= 4 else ""))
    if version < 4:
        _check_bank(instr, target, version)
    previous = target.read(instr).astype(np.float32).reshape(target.shape[0], -1)
    mask = target._mask
    _full, open_, _closed = _marks(mask)
    continuing = bool((mask == open_).all())
    _store(target, previous + value._data.astype(np.float32).reshape(previous.shape))
    mask[...] = open_
    instruction.reads = instruction.reads + (target.operand(),)
    instruction.writes = (target.operand(),) + instruction.writes
    instruction.attrs["accumulate"] = continuing
    instruction.attrs["accumulate_requested"] = None
    instruction.attrs["legacy_accumulate"] = True
    _LEGACY_MATMUL.last = None
    return True


def nc_transpose(dst: NkiTensor, data: NkiTensor, engine: engine = engine.unknown,
                 name: str | None = None) -> NkiInstruction:
    """2-D partition<->free transpose on TensorE (<=128x128, SBUF->PSUM) or VectorE (<=32x32) (facts 4.1)."""
    instr = "nc_transpose"
    run, version = _ctx()
    dst = _tensor(instr, "dst", dst)
    data = _tensor(instr, "data", data)
    requested = _enum(instr, "engine", engine, _Eng)
    chosen = requested
    if chosen is _Eng.unknown:
        chosen = _Eng.tensor if (data._alloc.buffer is Buffer.sbuf and dst._alloc.buffer is Buffer.psum) \
            else _Eng.vector
    if chosen not in (_Eng.tensor, _Eng.vector):
        fail(instr, f"nc_transpose runs on TensorE or VectorE, not {requested.name}")
    eng = _ENGINE_NAME[chosen]
    data = _operand(instr, "data", data, eng)
    dst = _operand(instr, "dst", dst, eng)
    partitions, free = data.shape[0], data.free_size
    if dst.shape[0] != free or dst.free_size != partitions:
        fail(instr, f"dst has shape {list(dst.shape)} but the transpose of data [{partitions}, {free}] (free axes "
             f"flattened) is [{free}, {partitions}]")
    if dst.dtype.name != data.dtype.name:
        fail(instr, f"dst dtype {dst.dtype.name} differs from data dtype {data.dtype.name}; a transpose keeps the "
             "dtype: cast with nisa.tensor_copy afterwards")
    if chosen is _Eng.tensor:
        _buffer_rule(instr, "data", data, Buffer.sbuf, "TensorE reads only SBUF")
        _buffer_rule(instr, "dst", dst, Buffer.psum, "TensorE writes only PSUM (allocate dst with buffer=nl.psum)")
        if free > 128:
            fail(instr, f"data is [{partitions}, {free}]; TensorE transposes at most [128, 128]: split the free "
                 "dimension")
        if version < 4:
            _check_bank(instr, dst, version)
    elif partitions > 32 or free > 32:
        fail(instr, f"data is [{partitions}, {free}]; VectorE transposes at most [32, 32]: use "
             "engine=nisa.engine.tensor (SBUF -> PSUM) for larger tiles")
    raw = _raw2d(data, instr)
    out = raw.T
    if chosen is _Eng.tensor and version == 2 and data.dtype.is_float:
        # v2 has no transpose mode: data.T @ I, where 0 * Inf/NaN poisons every other output of the column.
        values = raw.astype(np.float32)
        bad = ~np.isfinite(values)
        if bad.any():
            others = bad.sum(axis=0)[None, :] - bad
            out = np.where((others > 0).T, np.float32(np.nan), values.T)
    _store(dst, out)
    if chosen is _Eng.tensor:
        dst._mask[...] = _marks(dst._mask)[1]
    return _record(run, instr, eng, [data], [dst], name=name, engine_requested=requested.name,
                   partitions=partitions, free=free)


def _nc_transpose_legacy(data: NkiTensor, *, mask: Any = None, dtype: Any = None, engine: Any = None,
                         name: str | None = None) -> NkiTensor:
    instr = "nc_transpose"
    data = _tensor(instr, "data", data)
    requested = _enum(instr, "engine", engine, _Eng)
    partitions, free = data.shape[0], data.free_size
    chosen = requested
    if chosen is _Eng.unknown:
        small = partitions <= 32 and free <= 32
        chosen = _Eng.vector if small or data._alloc.buffer is Buffer.psum else _Eng.tensor
    buffer = Buffer.psum if chosen is _Eng.tensor else Buffer.sbuf
    out = _new_tile((free, partitions), data.dtype, buffer, "transpose")
    counts = _mask_counts(instr, mask, (free, partitions))
    dst, src = out, data
    if counts is not None:
        if 0 in counts:
            return out
        if data.ndim != 2:
            fail(instr, "a legacy mask on nc_transpose is simulated for 2-D data only")
        dst, src = out[0:counts[0], 0:counts[1]], data[0:counts[1], 0:counts[0]]
    nc_transpose(dst, src, engine=chosen, name=name)
    if dtype is not None and resolve(dtype).name != data.dtype.name:
        # Legacy: "an additional cast instruction is inserted" for a different dtype.
        cast = _new_tile((free, partitions), resolve(dtype), Buffer.sbuf, "transpose_cast")
        tensor_copy(cast, out)
        return cast
    return out


nc_transpose = _dual(("dst", "data"), _nc_transpose_legacy)(nc_transpose)


# ============================================================================ ScalarE
_REDUCE_IDENTITY = {"add": 0.0, "maximum": -np.inf, "minimum": np.inf, "multiply": 1.0,
                    "abs_max": 0.0, "abs_min": np.inf}
_REDUCE_2 = {"add": np.add, "maximum": np.maximum, "minimum": np.minimum, "multiply": np.multiply}


def _reduce_rows(op_name: str, values: np.ndarray) -> np.ndarray:
    """Free-dim reduction of (P, F) fp32 values with one of the register ops."""
    if op_name == "abs_max":
        idx = np.abs(values).argmax(axis=1)
        return values[np.arange(values.shape[0]), idx]
    if op_name == "abs_min":
        idx = np.abs(values).argmin(axis=1)
        return values[np.arange(values.shape[0]), idx]
    return _REDUCE_2[op_name].reduce(values, axis=1).astype(np.float32)


def _combine(op_name: str, reg: np.ndarray, values: np.ndarray) -> np.ndarray:
    if op_name == "abs_max":
        return np.where(np.abs(values) > np.abs(reg), values, reg)
    if op_name == "abs_min":
        return np.where(np.abs(values) < np.abs(reg), values, reg)
    return _REDUCE_2[op_name](reg, values).astype(np.float32)


def _activation_function(instr: str, op: Any) -> ActivationFn:
    name = nki_op_name(op)
    if name == "prelu":  # activate2 applies its relu_param slope; activation has none (slope 0)
        return ActivationFn("prelu", lambda x: np.maximum(x, np.float32(0)))
    return activation_fn(op)


def _check_range(run: context.KernelRun, instr: str, fn: ActivationFn, values: np.ndarray) -> None:
    """Decision 7: ScalarE gives invalid output outside a function's valid range (facts 5)."""
    if fn.valid_range is None or not values.size:
        return
    lo, hi = fn.valid_range
    with np.errstate(invalid="ignore"):
        probe = np.abs(values) if fn.symmetric_range else values
        vmin = float(np.nanmin(probe)) if not np.isnan(probe).all() else lo
        vmax = float(np.nanmax(probe)) if not np.isnan(probe).all() else hi
    if vmin >= lo and vmax <= hi:
        return
    if fn.symmetric_range:
        span = f"+/-[{lo:g}, {hi:g}]"
        observed = f"|input| in [{vmin:g}, {vmax:g}]"
    else:
        span = f"[{lo:g}, {hi:g}]"
        observed = f"input in [{vmin:g}, {vmax:g}]"
    _warn_once(run, (instr, fn.name), f"{instr}: activation function {fn.name} is valid only on {span} but got "
               f"{observed} (after scale and bias); ScalarE produces invalid output there (the simulator computes "
               f"the exact function){'; use nl.sin, which reduces the argument range' if fn.name == 'sin' else ''}",
               NkiActivationRangeWarning)


def _act_reduce(run: context.KernelRun, instr: str, state: _CoreState, lanes: slice, cmd: reduce_cmd,
                reduce_name: str | None, values: np.ndarray, reduce_res: NkiTensor | None,
                writes: list[NkiTensor], partitions: int, registers: str = "act",
                init: Any = None) -> None:
    """Apply ``reduce_cmd`` to an engine's accumulator registers and read them out (facts 4.2 / 4.3)."""
    acc = state.act_acc if registers == "act" else state.dve_acc
    valid = state.act_valid if registers == "act" else state.dve_valid
    identity = _REDUCE_IDENTITY.get(reduce_name or "add", 0.0)
    if cmd in (_RCmd.reset, _RCmd.reset_reduce):
        acc[lanes] = identity
        valid[lanes] = True
    elif cmd is _RCmd.load_reduce:
        acc[lanes] = np.broadcast_to(np.asarray(init, dtype=np.float32).reshape(-1), (partitions,))
        valid[lanes] = True
    if cmd in (_RCmd.reduce, _RCmd.reset_reduce, _RCmd.load_reduce):
        acc[lanes] = _combine(reduce_name or "add", acc[lanes], _reduce_rows(reduce_name or "add", values))
    if reduce_res is not None:
        _registers_read(run, instr, valid, lanes, "ScalarE" if registers == "act" else "VectorE")
        _store(reduce_res, acc[lanes].reshape(partitions, 1))
        writes.append(reduce_res)


def _reduce_res_tile(instr: str, reduce_res: Any, partitions: int, eng: str) -> NkiTensor | None:
    if reduce_res is None:
        return None
    t = _operand(instr, "reduce_res", reduce_res, eng)
    if t.shape[0] != partitions or t.free_size != 1:
        fail(instr, f"reduce_res must be a ({partitions}, 1) tile (one register value per partition), got shape "
             f"{list(t.shape)}")
    return t


def _activation(instr: str, dst: Any, op: Any, data: Any, bias: Any, scale: Any, reduce_op: Any,
                reduce_res: Any, cmd: Any, name: str | None, reduce_ops: tuple[str, ...],
                requested: Any = None) -> NkiInstruction:
    run, version = _ctx()
    se = Engine.SCALAR
    fn = _activation_function(instr, op)
    data = _operand(instr, "data", data, se)
    dst = _operand(instr, "dst", dst, se)
    _same_layout(instr, "data", data, "dst", dst)
    cmd = _enum(instr, "reduce_cmd", cmd, _RCmd)
    if cmd is _RCmd.load_reduce:
        fail(instr, "reduce_cmd.load_reduce is a VectorE accumulator command; ScalarE supports idle, reset, reduce "
             "and reset_reduce")
    partitions = data.shape[0]
    reads = [data]
    x = _f32(data, instr)
    scale_v = _vector_operand(instr, "scale", scale, partitions, se, reads)
    if isinstance(scale_v, np.ndarray) or scale_v != 1.0:
        x = x * scale_v
    bias_kind = "none"
    if bias is not None:
        if isinstance(bias, NkiTensor):
            if bias.dtype.name == "tfloat32":
                fail(instr, "bias may be any dtype except tfloat32; cast it to float32")
            bias_kind = "vector"
        else:
            if version < 3:
                fail(instr, f"bias must be a ({partitions}, 1) vector on NeuronCore-v2 (scalar bias needs "
                     "NeuronCore-v3 or newer); put the value in a tile")
            bias_kind = "scalar"
        if fn.name == "reciprocal" and version < 3:
            fail(instr, "activation(op=nl.reciprocal) does not support a bias on NeuronCore-v2")
        x = x + _vector_operand(instr, "bias", bias, partitions, se, reads)
    _check_range(run, instr, fn, x)
    y = np.asarray(fn.fn(x), dtype=np.float32)
    reduce_name = None
    if reduce_op is not None:
        reduce_name = nki_op_name(reduce_op)
        if reduce_name not in reduce_ops:
            fail(instr, f"reduce_op {reduce_name} is not supported here; ScalarE reduces with "
                 f"{', '.join(reduce_ops)} on NeuronCore-v{version}")
    elif cmd in (_RCmd.reduce, _RCmd.reset_reduce):
        fail(instr, f"reduce_cmd={cmd.name} accumulates the activation: pass reduce_op=nl.add")
    res = _reduce_res_tile(instr, reduce_res, partitions, se)
    writes = [dst]
    _store(dst, y)
    state = _core_state(run)
    _act_reduce(run, instr, state, _lanes(data), cmd, reduce_name, y, res, writes, partitions)
    attrs: dict[str, Any] = {}
    if requested is not None:
        attrs["engine_requested"] = requested
    return _record(run, instr, se, reads, writes, name=name, op=fn.name, reduce_op=reduce_name,
                   reduce_cmd=cmd.name, reduce_res=res is not None, bias=bias_kind,
                   scale="vector" if isinstance(scale, NkiTensor) else "scalar", **attrs)


def activation(dst: NkiTensor, op: Any, data: NkiTensor, bias: Any = None, scale: Any = 1.0, reduce_op: Any = None,
               reduce_res: NkiTensor | None = None, reduce_cmd: reduce_cmd = reduce_cmd.idle,
               name: str | None = None) -> NkiInstruction:
    """``dst = op(data * scale + bias)`` on ScalarE, with an optional add-reduction into its registers (facts 4.2)."""
    return _activation("activation", dst, op, data, bias, scale, reduce_op, reduce_res, reduce_cmd, name, ("add",))


def _activation_legacy(op: Any, data: NkiTensor, *, bias: Any = None, scale: Any = 1.0, reduce_op: Any = None,
                       reduce_res: Any = None, reduce_cmd: Any = _RCmd.idle, mask: Any = None, dtype: Any = None,
                       name: str | None = None) -> NkiTensor:
    data = _tensor("activation", "data", data)
    out = _new_tile(data.shape, _legacy_dtype(dtype, data), Buffer.sbuf, "activation")
    cut = _masked("activation", mask, out, data, bias, scale, reduce_res)
    if cut is not None:
        dst, (d, b, s, r) = cut
        activation(dst, op, d, bias=b, scale=s, reduce_op=reduce_op, reduce_res=r, reduce_cmd=reduce_cmd, name=name)
    return out


activation = _dual(("dst", "data"), _activation_legacy)(activation)


def activation_reduce(dst: NkiTensor, op: Any, data: NkiTensor, reduce_op: Any, reduce_res: NkiTensor | None,
                      bias: Any = None, scale: Any = 1.0, name: str | None = None) -> NkiInstruction:
    """``activation`` with ``reduce_cmd=reset_reduce`` (legacy-compatible form, facts 4.2)."""
    _run, version = _ctx()
    ops = ("add",) if version < 3 else ("add", "maximum", "minimum")
    return _activation("activation_reduce", dst, op, data, bias, scale, reduce_op, reduce_res, _RCmd.reset_reduce,
                       name, ops)


def _activation_reduce_legacy(op: Any, data: NkiTensor, *, reduce_op: Any, reduce_res: Any, bias: Any = None,
                              scale: Any = 1.0, mask: Any = None, dtype: Any = None,
                              name: str | None = None) -> NkiTensor:
    data = _tensor("activation_reduce", "data", data)
    out = _new_tile(data.shape, _legacy_dtype(dtype, data), Buffer.sbuf, "activation")
    cut = _masked("activation_reduce", mask, out, data, bias, scale, reduce_res)
    if cut is not None:
        dst, (d, b, s, r) = cut
        activation_reduce(dst, op, d, reduce_op, r, bias=b, scale=s, name=name)
    return out


activation_reduce = _dual(("dst", "data"), _activation_reduce_legacy)(activation_reduce)

_ACTIVATE2_PAIRS = {("multiply", "add"), ("multiply", "subtract"), ("multiply", "bypass"), ("add", "bypass"),
                    ("subtract", "bypass"), ("bypass", "bypass")}


def activate2(dst: NkiTensor, op: Any, data: NkiTensor, imm0: Any, imm1: Any, op0: Any, op1: Any,
              relu_param: Any = 0.0, reverse0: bool = False, reverse1: bool = False, reduce_op: Any = None,
              reduce_res: NkiTensor | None = None, reduce_cmd: reduce_cmd = reduce_cmd.idle,
              name: str | None = None) -> NkiInstruction:
    """``op((data op0 imm0) op1 imm1)`` on ScalarE with an optional register reduction (v4 only, facts 4.2)."""
    instr = "activate2"
    run, version = _ctx()
    if version < 4:
        fail(instr, f"activate2 is available only on NeuronCore-v4 (trn3); target {run.target.name} is "
             f"NeuronCore-v{version}: use nisa.activation (scale/bias) instead")
    se = Engine.SCALAR
    fn = _activation_function(instr, op)
    data = _operand(instr, "data", data, se)
    dst = _operand(instr, "dst", dst, se)
    _same_layout(instr, "data", data, "dst", dst)
    name0 = "bypass" if op0 is None else _op(instr, "op0", op0).name
    name1 = "bypass" if op1 is None else _op(instr, "op1", op1).name
    if (name0, name1) not in _ACTIVATE2_PAIRS:
        fail(instr, f"(op0, op1) = ({name0}, {name1}) is not supported; activate2 allows "
             f"{', '.join(f'({a}, {b})' for a, b in sorted(_ACTIVATE2_PAIRS))}")
    cmd = _enum(instr, "reduce_cmd", reduce_cmd, _RCmd)
    partitions = data.shape[0]
    reads = [data]
    x = _f32(data, instr)
    for op_name, imm, rev, role in ((name0, imm0, reverse0, "imm0"), (name1, imm1, reverse1, "imm1")):
        if op_name == "bypass":
            continue
        value = _vector_operand(instr, role, imm, partitions, se, reads)
        x = ALU_OPS[op_name].fn(value, x) if rev else ALU_OPS[op_name].fn(x, value)
    x = np.asarray(x, dtype=np.float32)
    _check_range(run, instr, fn, x)
    if fn.name == "prelu":
        slope = _vector_operand(instr, "relu_param", relu_param, partitions, se, reads)
        y = np.where(x > 0, x, x * slope).astype(np.float32)
    else:
        y = np.asarray(fn.fn(x), dtype=np.float32)
    reduce_name = None
    if reduce_op is not None:
        reduce_name = nki_op_name(reduce_op)
        if reduce_name not in ("add", "maximum", "minimum", "abs_max", "abs_min"):
            fail(instr, f"reduce_op {reduce_name} is not supported; activate2 reduces with add, max, min, abs_max "
                 "or abs_min")
    elif cmd in (_RCmd.reduce, _RCmd.reset_reduce):
        fail(instr, f"reduce_cmd={cmd.name} needs a reduce_op")
    if cmd is _RCmd.load_reduce:
        fail(instr, "reduce_cmd.load_reduce is not a ScalarE command")
    res = _reduce_res_tile(instr, reduce_res, partitions, se)
    writes = [dst]
    _store(dst, y)
    _act_reduce(run, instr, _core_state(run), _lanes(data), cmd, reduce_name, y, res, writes, partitions)
    return _record(run, instr, se, reads, writes, name=name, op=fn.name, op0=name0, op1=name1,
                   reduce_op=reduce_name, reduce_cmd=cmd.name, reduce_res=res is not None)


# ============================================================================ VectorE / GpSimd element-wise
def _choose(instr: str, requested: engine, allowed: tuple[engine, ...]) -> None:
    if requested not in allowed:
        names = ", ".join(_TITLE[_ENGINE_NAME[e]] for e in allowed)
        fail(instr, f"{instr} runs on {names}, not {requested.name} (engine=nisa.engine.{requested.name})")


def _need_integers(instr: str, op_name: str, *tensors: tuple[str, NkiTensor]) -> None:
    for role, t in tensors:
        if not t.dtype.is_integer:
            fail(instr, f"bit-vector op {op_name} acts on integer bit patterns: {role} {t.name!r} is {t.dtype.name}; "
                 "use integer tiles (or .view() them as an integer dtype)")


def _int_binary(spec: AluOp, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Exact 32-bit integer arithmetic on GpSimd (decision 9)."""
    a = a.astype(np.int64)
    b = b.astype(np.int64)
    with np.errstate(all="ignore"):
        if spec.name == "divide":
            safe = np.where(b == 0, 1, b)
            return np.where(b == 0, 0, np.sign(a) * np.sign(safe) * (np.abs(a) // np.abs(safe)))
        if spec.name in ("mod", "fmod"):
            safe = np.where(b == 0, 1, b)
            return np.where(b == 0, 0, np.fmod(a, safe))
        if spec.name == "power":
            return np.rint(np.power(a.astype(np.float64), b.astype(np.float64)))
        return spec.fn(a, b)


def _apply(spec: AluOp, x: np.ndarray, value: Any, reverse: bool) -> np.ndarray:
    if spec.arity == 1:
        return spec.fn(x)
    return spec.fn(value, x) if reverse else spec.fn(x, value)


def tensor_tensor(dst: NkiTensor, data1: NkiTensor, data2: NkiTensor, op: Any, engine: engine = engine.unknown,
                  name: str | None = None) -> NkiInstruction:
    """Element-wise ``dst = data1 op data2`` on VectorE or GpSimd (facts 4.3)."""
    instr = "tensor_tensor"
    run, version = _ctx()
    spec = _op(instr, "op", op)
    if spec.arity != 2 or spec.name == "bypass":
        fail(instr, f"op {spec.name} is unary; tensor_tensor takes a binary operator (use tensor_scalar for unary ops)")
    if spec.trn3_only and version < 4:
        fail(instr, f"op {spec.name} needs NeuronCore-v4 (trn3); target {run.target.name} is NeuronCore-v{version}")
    tiles = (_tensor(instr, "dst", dst), _tensor(instr, "data1", data1), _tensor(instr, "data2", data2))
    requested = _enum(instr, "engine", engine, _Eng)
    in_psum = any(t._alloc.buffer is Buffer.psum for t in tiles)
    all_int32 = all(t.dtype.name in _INT32 for t in tiles)
    chosen = requested
    if chosen is _Eng.unknown:
        gpsimd = spec.name == "power" or (all_int32 and not spec.bitvec and not in_psum)
        chosen = _Eng.gpsimd if gpsimd else _Eng.vector
    _choose(instr, chosen, (_Eng.vector, _Eng.gpsimd))
    if spec.name == "power" and chosen is _Eng.vector:
        fail(instr, "op power runs on GpSimd, not VectorE (engine=nisa.engine.gpsimd, with no PSUM operand)")
    if spec.bitvec and chosen is _Eng.gpsimd:
        fail(instr, f"bit-vector op {spec.name} runs on VectorE only")
    eng = _ENGINE_NAME[chosen]
    data1 = _operand(instr, "data1", data1, eng)
    data2 = _operand(instr, "data2", data2, eng)
    dst = _operand(instr, "dst", dst, eng)
    _same_layout(instr, "data1", data1, "data2", data2)
    _same_layout(instr, "data1", data1, "dst", dst)
    if data1._alloc.buffer is Buffer.psum and data2._alloc.buffer is Buffer.psum:
        fail(instr, "data1 and data2 are both in PSUM; at most one tensor_tensor input may be in PSUM: copy one "
             "of them to SBUF with nisa.tensor_copy")
    if spec.bitvec:
        _need_integers(instr, spec.name, ("data1", data1), ("data2", data2), ("dst", dst))
        result = spec.fn(_raw2d(data1, instr), _raw2d(data2, instr))
    elif chosen is _Eng.gpsimd and all_int32:
        result = _int_binary(spec, _raw2d(data1, instr), _raw2d(data2, instr))
    else:
        result = spec.fn(_f32(data1, instr), _f32(data2, instr))
    _store(dst, result)
    return _record(run, instr, eng, [data1, data2], [dst], name=name, op=spec.name, engine_requested=requested.name)


def _tensor_tensor_legacy(data1: NkiTensor, data2: NkiTensor, op: Any, *, dtype: Any = None, mask: Any = None,
                          engine: Any = None, name: str | None = None) -> NkiTensor:
    data1 = _tensor("tensor_tensor", "data1", data1)
    data2 = _tensor("tensor_tensor", "data2", data2)
    out = _new_tile(data1.shape, _legacy_dtype(dtype, data1, data2), Buffer.sbuf, "tensor_tensor")
    cut = _masked("tensor_tensor", mask, out, data1, data2)
    if cut is not None:
        dst, (a, b) = cut
        tensor_tensor(dst, a, b, op, engine=_Eng.unknown if engine is None else engine, name=name)
    return out


tensor_tensor = _dual(("dst", "data1", "data2"), _tensor_tensor_legacy)(tensor_tensor)

_SCALAR_PAIRS = {("multiply", "add"), ("multiply", None), ("add", None)}


def tensor_scalar(dst: NkiTensor, data: NkiTensor, op0: Any, operand0: Any, reverse0: bool = False, op1: Any = None,
                  operand1: Any = None, reverse1: bool = False, engine: engine = engine.unknown,
                  name: str | None = None) -> NkiInstruction:
    """``(data op0 operand0) op1 operand1`` with scalar or (P, 1) operands (facts 4.3)."""
    instr = "tensor_scalar"
    run, version = _ctx()
    spec0 = _op(instr, "op0", op0)
    spec1 = None if op1 is None else _op(instr, "op1", op1)
    if spec1 is not None and spec1.name == "bypass":
        spec1 = None
    if spec1 is None and operand1 is not None and op1 is None:
        fail(instr, "operand1 is given but op1 is None; unused op1 and operand1 must both be None")
    for spec, operand, role in ((spec0, operand0, "operand0"), (spec1, operand1, "operand1")):
        if spec is None:
            continue
        if spec.trn3_only and version < 4:
            fail(instr, f"op {spec.name} needs NeuronCore-v4 (trn3); target is NeuronCore-v{version}")
        if spec.arity == 1 and operand is not None and not (not isinstance(operand, NkiTensor) and operand == 0):
            fail(instr, f"{spec.name} is a unary op: {role} must be None or 0")
        if spec.arity == 2 and operand is None:
            raise TypeError(f"{instr}: {role} is required for the binary op {spec.name}")
    bitvec = spec0.bitvec
    if spec1 is not None and spec1.bitvec != bitvec:
        fail(instr, f"op0 {spec0.name} and op1 {spec1.name} mix bit-vector and arithmetic operators; both must be "
             "of the same kind")
    names = {spec0.name} | ({spec1.name} if spec1 else set())
    data_t = _tensor(instr, "data", data)
    dst_t = _tensor(instr, "dst", dst)
    requested = _enum(instr, "engine", engine, _Eng)
    in_psum = any(isinstance(t, NkiTensor) and t._alloc.buffer is Buffer.psum
                  for t in (data_t, dst_t, operand0, operand1))
    chosen = requested
    if chosen is _Eng.unknown:
        chosen = _Eng.gpsimd if ("rsqrt" in names and not in_psum and not bitvec) else _Eng.vector
    _choose(instr, chosen, (_Eng.vector, _Eng.scalar, _Eng.gpsimd))
    if bitvec and chosen is not _Eng.vector:
        fail(instr, f"bit-vector ops ({', '.join(sorted(names))}) run on VectorE only")
    if chosen is _Eng.gpsimd and "rsqrt" not in names:
        fail(instr, f"GpSimd runs tensor_scalar only for rsqrt (got {', '.join(sorted(names))}); use VectorE or "
             "ScalarE")
    pair = (spec0.name, spec1.name if spec1 else None)
    if chosen is _Eng.scalar and version < 4 and pair not in _SCALAR_PAIRS:
        fail(instr, f"ScalarE on NeuronCore-v{version} supports only the op pairs (multiply, add), (multiply, None) "
             f"and (add, None), got ({pair[0]}, {pair[1]}); run it on VectorE")
    eng = _ENGINE_NAME[chosen]
    data = _operand(instr, "data", data_t, eng)
    dst = _operand(instr, "dst", dst_t, eng)
    _same_layout(instr, "data", data, "dst", dst)
    partitions = data.shape[0]
    reads = [data]
    if bitvec:
        _need_integers(instr, spec0.name, ("data", data), ("dst", dst))
        x = _raw2d(data, instr)
    else:
        x = _f32(data, instr)
    v0 = None if spec0.arity == 1 else _vector_operand(instr, "operand0", operand0, partitions, eng, reads, bitvec)
    y = _apply(spec0, x, v0, reverse0)
    if spec1 is not None:
        v1 = None if spec1.arity == 1 else _vector_operand(instr, "operand1", operand1, partitions, eng, reads,
                                                           bitvec)
        y = _apply(spec1, y, v1, reverse1)
    _store(dst, y)
    return _record(run, instr, eng, reads, [dst], name=name, op0=spec0.name, op1=spec1.name if spec1 else None,
                   reverse0=bool(reverse0), reverse1=bool(reverse1), engine_requested=requested.name)


def _tensor_scalar_legacy(data: NkiTensor, op0: Any, operand0: Any, reverse0: bool = False, op1: Any = None,
                          operand1: Any = None, reverse1: bool = False, *, dtype: Any = None, mask: Any = None,
                          engine: Any = None, name: str | None = None) -> NkiTensor:
    data = _tensor("tensor_scalar", "data", data)
    out = _new_tile(data.shape, _legacy_dtype(dtype, data), Buffer.sbuf, "tensor_scalar")
    cut = _masked("tensor_scalar", mask, out, data, operand0, operand1)
    if cut is not None:
        dst, (d, o0, o1) = cut
        tensor_scalar(dst, d, op0, o0, reverse0, op1, o1, reverse1, engine=_Eng.unknown if engine is None else engine,
                      name=name)
    return out


tensor_scalar = _dual(("dst", "data"), _tensor_scalar_legacy)(tensor_scalar)


def _axes(instr: str, axis: Any, ndim: int) -> tuple[int, ...]:
    """Rule 10: reduction axes are free axes, trailing and contiguous (facts 4.3)."""
    if isinstance(axis, (int, np.integer)) and not isinstance(axis, bool):
        axes = [int(axis)]
    elif isinstance(axis, (list, tuple)) and axis and all(isinstance(a, (int, np.integer)) for a in axis):
        axes = [int(a) for a in axis]
    else:
        raise TypeError(f"{instr}: axis must be an int or a list/tuple of ints, got {axis!r}")
    axes = sorted({a + ndim if a < 0 else a for a in axes})
    if axes[0] <= 0 or axes[-1] >= ndim:
        if 0 in axes:
            fail(instr, f"axis {list(axis) if isinstance(axis, (list, tuple)) else axis} includes axis 0, the "
                 "partition axis; reductions run along free axes only (to reduce across partitions use "
                 "nc_transpose, a matmul against ones, or nisa.tensor_partition_reduce)")
        fail(instr, f"axis {axes} is out of range for a {ndim}-D tile")
    if axes != list(range(axes[0], ndim)):
        fail(instr, f"axis {axes} must be the trailing contiguous free axes ending at the last dim (e.g. "
             f"{list(range(ndim - 1, ndim))} or {list(range(1, ndim))} for a {ndim}-D tile)")
    return tuple(axes)


def tensor_reduce(dst: NkiTensor, op: Any, data: NkiTensor, axis: Any, negate: bool = False, keepdims: bool = False,
                  name: str | None = None) -> NkiInstruction:
    """Reduce the trailing free axes of ``data`` on VectorE (facts 4.3, rule 10)."""
    instr = "tensor_reduce"
    run, _version = _ctx()
    spec = _op(instr, "op", op)
    if not spec.reducible:
        legal = ", ".join(sorted(o.name for o in ALU_OPS.values() if o.reducible))
        fail(instr, f"{spec.name} is not a legal reduction op; use one of {legal}")
    ve = Engine.VECTOR
    data = _operand(instr, "data", data, ve)
    dst = _operand(instr, "dst", dst, ve)
    _same_partitions(instr, "data", data, "dst", dst)
    axes = _axes(instr, axis, data.ndim)
    kept = math.prod(data.shape[1:axes[0]])
    if dst.free_size != kept:
        fail(instr, f"dst has {dst.free_size} elements per partition (shape {list(dst.shape)}) but reducing axes "
             f"{list(axes)} of {list(data.shape)} leaves {kept}")
    if negate and spec.bitvec:
        fail(instr, f"negate=True applies to arithmetic reductions only, not bit-vector op {spec.name}")
    if spec.bitvec:
        _need_integers(instr, spec.name, ("data", data), ("dst", dst))
        values = _read(data, instr)
        result = spec.reduce(values, axes, keepdims=False)
    else:
        values = _read(data, instr).astype(np.float32)
        if data.dtype.name == "tfloat32":
            values = round_tf32(values)
        result = np.asarray(spec.reduce(values, axes, keepdims=False), dtype=np.float32)
        if negate:
            result = -result
    _store(dst, result.reshape(dst.shape[0], -1))
    return _record(run, instr, ve, [data], [dst], name=name, op=spec.name, axis=list(axes), negate=bool(negate))


def _tensor_reduce_legacy(op: Any, data: NkiTensor, axis: Any, *, mask: Any = None, dtype: Any = None,
                          negate: bool = False, keepdims: bool = False, name: str | None = None) -> NkiTensor:
    instr = "tensor_reduce"
    data = _tensor(instr, "data", data)
    axes = _axes(instr, axis, data.ndim)
    if keepdims:
        shape = [1 if i in axes else d for i, d in enumerate(data.shape)]
    else:
        shape = [d for i, d in enumerate(data.shape) if i not in axes]
    out = _new_tile(shape, _legacy_dtype(dtype, data), Buffer.sbuf, "reduce")
    counts = _mask_counts(instr, mask, tuple(data.shape))
    dst, src = out, data
    if counts is not None:
        if 0 in counts:
            return out
        if any(c != d for c, d in zip(counts[1:], data.shape[1:])):
            fail(instr, "a legacy mask on tensor_reduce is simulated for partition bounds only")
        dst, src = out[0:counts[0]], data[0:counts[0]]
    tensor_reduce(dst, op, src, axis, negate=negate, keepdims=keepdims, name=name)
    return out


tensor_reduce = _dual(("dst", "data"), _tensor_reduce_legacy)(tensor_reduce)

_PARTITION_REDUCE = ("add", "average", "maximum", "bitwise_or", "bitwise_and")


def tensor_partition_reduce(dst: NkiTensor, op: Any, data: NkiTensor, name: str | None = None) -> NkiInstruction:
    """Reduce across partitions on GpSimd into a one-partition ``dst`` (facts 4.3; decision 15)."""
    instr = "tensor_partition_reduce"
    run, _version = _ctx()
    op_name = nki_op_name(op)
    op_name = {"mean": "average", "max": "maximum"}.get(op_name, op_name)
    if op_name not in _PARTITION_REDUCE:
        fail(instr, f"op {op_name} is not supported; tensor_partition_reduce reduces with "
             f"{', '.join(_PARTITION_REDUCE)}")
    gp = Engine.GPSIMD
    data = _operand(instr, "data", data, gp)
    dst = _operand(instr, "dst", dst, gp)
    if dst.shape[0] != 1 or dst.free_size != data.free_size:
        fail(instr, f"dst must be one partition with data's {data.free_size} elements per partition, got shape "
             f"{list(dst.shape)}")
    if op_name.startswith("bitwise"):
        _need_integers(instr, op_name, ("data", data), ("dst", dst))
        values = _raw2d(data, instr)
        result = (np.bitwise_or if op_name == "bitwise_or" else np.bitwise_and).reduce(values, axis=0)
    else:
        values = _f32(data, instr)
        if op_name == "maximum":
            result = values.max(axis=0)
        else:
            result = values.sum(axis=0, dtype=np.float32)
            if op_name == "average":
                result = result / np.float32(values.shape[0])
    _store(dst, result.reshape(1, -1))
    return _record(run, instr, gp, [data], [dst], name=name, op=op_name)


def _tensor_partition_reduce_legacy(op: Any, data: NkiTensor, *, mask: Any = None, dtype: Any = None,
                                    name: str | None = None) -> NkiTensor:
    data = _tensor("tensor_partition_reduce", "data", data)
    out = _new_tile((1,) + tuple(data.shape[1:]), _legacy_dtype(dtype, data), Buffer.sbuf, "partition_reduce")
    if mask is not None:
        fail("tensor_partition_reduce", "a legacy mask on tensor_partition_reduce is not simulated; slice the input")
    tensor_partition_reduce(out, op, data, name=name)
    return out


tensor_partition_reduce = _dual(("dst", "data"), _tensor_partition_reduce_legacy)(tensor_partition_reduce)


def tensor_copy(dst: NkiTensor, src: NkiTensor, engine: engine = engine.unknown,
                name: str | None = None) -> NkiInstruction:
    """Copy between SBUF/PSUM tiles (facts 4.3): bit-exact for equal dtypes, else a cast through fp32."""
    instr = "tensor_copy"
    run, version = _ctx()
    requested = _enum(instr, "engine", engine, _Eng)
    chosen = _Eng.vector if requested is _Eng.unknown else requested
    _choose(instr, chosen, (_Eng.vector, _Eng.scalar, _Eng.gpsimd))
    if chosen is _Eng.scalar and version < 3:
        fail(instr, "tensor_copy is not supported on ScalarE on NeuronCore-v2: use nisa.activation(op=nl.copy) or "
             "VectorE")
    eng = _ENGINE_NAME[chosen]
    src = _operand(instr, "src", src, eng)
    dst = _operand(instr, "dst", dst, eng)
    _same_layout(instr, "src", src, "dst", dst)
    same = src.dtype.name == dst.dtype.name
    _store(dst, _raw2d(src, instr) if same else _f32(src, instr))
    return _record(run, instr, eng, [src], [dst], name=name, engine_requested=requested.name, cast=not same)


def _tensor_copy_legacy(src: NkiTensor, *, mask: Any = None, dtype: Any = None, engine: Any = None,
                        name: str | None = None) -> NkiTensor:
    src = _tensor("tensor_copy", "src", src)
    out = _new_tile(src.shape, _legacy_dtype(dtype, src), Buffer.sbuf, "copy")
    cut = _masked("tensor_copy", mask, out, src)
    if cut is not None:
        dst, (s,) = cut
        tensor_copy(dst, s, engine=_Eng.unknown if engine is None else engine, name=name)
    return out


tensor_copy = _dual(("dst", "src"), _tensor_copy_legacy)(tensor_copy)


def tensor_copy_predicated(dst: NkiTensor, src: Any, predicate: NkiTensor, reverse_pred: bool = False,
                           name: str | None = None) -> NkiInstruction:
    """Copy ``src`` (tile or scalar) into ``dst`` where ``predicate`` is non-zero, on VectorE (facts 4.3)."""
    instr = "tensor_copy_predicated"
    run, _version = _ctx()
    ve = Engine.VECTOR
    dst = _operand(instr, "dst", dst, ve)
    predicate = _operand(instr, "predicate", predicate, ve)
    _same_layout(instr, "dst", dst, "predicate", predicate)
    if predicate.dtype.name not in ("uint8", "uint16", "uint32", "bool_"):
        fail(instr, f"predicate dtype is {predicate.dtype.name}; it must be uint8, uint16 or uint32 (or bool_, "
             "stored as uint8)")
    keep = _raw2d(predicate, instr) != 0
    if reverse_pred:
        keep = ~keep
    reads = [predicate]
    if isinstance(src, NkiTensor):
        src = _operand(instr, "src", src, ve)
        _same_layout(instr, "dst", dst, "src", src)
        if src.dtype.name != dst.dtype.name:
            fail(instr, f"src dtype {src.dtype.name} differs from dst dtype {dst.dtype.name}; they must match")
        if src._alloc.buffer is Buffer.psum and predicate._alloc.buffer is Buffer.psum:
            fail(instr, "src and predicate are both in PSUM; at most one of them may be in PSUM")
        values = _raw2d(src, instr)
        reads.insert(0, src)
    else:
        values = np.asarray(_scalar_value(instr, "src", src))
    _store(dst, values, where=keep)
    return _record(run, instr, ve, reads, [dst], name=name, reverse_pred=bool(reverse_pred))


def _tensor_copy_predicated_legacy(*, src: Any, dst: NkiTensor, predicate: NkiTensor, reverse_pred: bool = False,
                                   mask: Any = None, dtype: Any = None, name: str | None = None) -> NkiTensor:
    cut = _masked("tensor_copy_predicated", mask, dst, src, predicate)
    if cut is not None:
        d, (s, p) = cut
        tensor_copy_predicated(d, s, p, reverse_pred=reverse_pred, name=name)
    return dst


tensor_copy_predicated = _dual(("dst", "predicate"), _tensor_copy_predicated_legacy)(tensor_copy_predicated)


def memset(dst: NkiTensor, value: Any, engine: engine = engine.unknown, name: str | None = None) -> NkiInstruction:
    """Fill ``dst`` with a constant on VectorE or GpSimd; the value type must match dst's dtype (facts 4.3)."""
    instr = "memset"
    run, _version = _ctx()
    requested = _enum(instr, "engine", engine, _Eng)
    chosen = _Eng.vector if requested is _Eng.unknown else requested
    _choose(instr, chosen, (_Eng.vector, _Eng.gpsimd))
    eng = _ENGINE_NAME[chosen]
    dst = _operand(instr, "dst", dst, eng)
    is_int = isinstance(value, (bool, np.bool_, int, np.integer))
    if not is_int and not isinstance(value, (float, np.floating)):
        raise TypeError(f"{instr}: value must be a compile-time number, got {type(value).__name__}")
    if dst.dtype.is_integer:
        if not is_int:
            example = int(value) if math.isfinite(value) else 0
            fail(instr, f"value {value!r} is a float but dst {dst.name!r} is {dst.dtype.name}; since NKI 0.3.0 the "
                 f"value type must match the dst dtype: pass an int (e.g. value={example})")
        info = np.iinfo(dst.dtype.storage)
        if not info.min <= int(value) <= info.max:
            fail(instr, f"value {int(value)} does not fit dst dtype {dst.dtype.name} [{info.min}, {info.max}]")
    _store(dst, np.asarray(int(value) if is_int else float(value)))
    return _record(run, instr, eng, [], [dst], name=name, value=float(value), engine_requested=requested.name)


def _memset_legacy(shape: Sequence[int], value: Any, dtype: Any, *, mask: Any = None, engine: Any = None,
                   buffer: Any = None, name: str | None = None) -> NkiTensor:
    nki_dtype = resolve(dtype)
    out = _new_tile(shape, nki_dtype, _buffer_of(buffer), "memset")
    if nki_dtype.is_integer and isinstance(value, (float, np.floating)) and math.isfinite(value):
        value = int(value)  # legacy memset cast the value silently
    cut = _masked("memset", mask, out)
    if cut is not None:
        memset(cut[0], value, engine=_Eng.unknown if engine is None else engine, name=name)
    return out


memset = _dual(("dst",), _memset_legacy)(memset)


def reciprocal(dst: NkiTensor, data: NkiTensor, name: str | None = None) -> NkiInstruction:
    """``1 / data`` in fp32 on VectorE (facts 4.3)."""
    instr = "reciprocal"
    run, _version = _ctx()
    ve = Engine.VECTOR
    data = _operand(instr, "data", data, ve)
    dst = _operand(instr, "dst", dst, ve)
    _same_layout(instr, "data", data, "dst", dst)
    with np.errstate(divide="ignore", invalid="ignore"):
        _store(dst, np.float32(1.0) / _f32(data, instr))
    return _record(run, instr, ve, [data], [dst], name=name, op="reciprocal")


def _reciprocal_legacy(data: NkiTensor, *, dtype: Any = None, mask: Any = None, name: str | None = None) -> NkiTensor:
    data = _tensor("reciprocal", "data", data)
    out = _new_tile(data.shape, _legacy_dtype(dtype, data), Buffer.sbuf, "reciprocal")
    cut = _masked("reciprocal", mask, out, data)
    if cut is not None:
        reciprocal(cut[0], cut[1][0], name=name)
    return out


reciprocal = _dual(("dst", "data"), _reciprocal_legacy)(reciprocal)


# ============================================================================ VectorE: fused, scans, statistics
def _dve_readout(run: context.KernelRun, instr: str, state: _CoreState, lanes: slice, reduce_res: NkiTensor | None,
                 writes: list[NkiTensor], partitions: int, negate: bool = False) -> None:
    if reduce_res is None:
        return
    _registers_read(run, instr, state.dve_valid, lanes, "VectorE")
    values = state.dve_acc[lanes].reshape(partitions, 1)
    _store(reduce_res, -values if negate else values)
    writes.append(reduce_res)


def _dve_reduce(state: _CoreState, lanes: slice, cmd: reduce_cmd, op_name: str, values: np.ndarray,
                init: Any = None) -> None:
    """VectorE accumulators (shared by exponential, range_select, select_reduce, tensor_scalar_reduce...)."""
    if cmd is _RCmd.idle:
        return
    if cmd in (_RCmd.reset, _RCmd.reset_reduce):
        state.dve_acc[lanes] = _REDUCE_IDENTITY[op_name]
        state.dve_valid[lanes] = True
    elif cmd is _RCmd.load_reduce:
        state.dve_acc[lanes] = np.broadcast_to(np.asarray(init, dtype=np.float32).reshape(-1),
                                               (lanes.stop - lanes.start,))
        state.dve_valid[lanes] = True
    if cmd is not _RCmd.reset:
        state.dve_acc[lanes] = _combine(op_name, state.dve_acc[lanes], _reduce_rows(op_name, values))


def _cmd(instr: str, value: Any, allowed: tuple[reduce_cmd, ...]) -> reduce_cmd:
    cmd = _enum(instr, "reduce_cmd", value, _RCmd)
    if cmd not in allowed:
        fail(instr, f"reduce_cmd={cmd.name} is not supported; use one of {', '.join(c.name for c in allowed)}")
    return cmd


def exponential(dst: NkiTensor, src: NkiTensor, max_value: Any = 0.0, reduce_res: NkiTensor | None = None,
                reduce_cmd: reduce_cmd = reduce_cmd.idle, reduce_init: Any = 0.0,
                name: str | None = None) -> NkiInstruction:
    """``dst = exp(src - max_value)`` on VectorE with an optional running sum (v4 only, facts 4.3)."""
    instr = "exponential"
    run, version = _ctx()
    if version < 4:
        fail(instr, f"exponential is available only on NeuronCore-v4 (trn3); target {run.target.name} is "
             f"NeuronCore-v{version}: use nisa.activation(op=nl.exp, bias=-max) on ScalarE")
    ve = Engine.VECTOR
    src = _operand(instr, "src", src, ve)
    dst = _operand(instr, "dst", dst, ve)
    _same_layout(instr, "src", src, "dst", dst)
    cmd = _cmd(instr, reduce_cmd, (_RCmd.idle, _RCmd.reset_reduce, _RCmd.reduce, _RCmd.load_reduce))
    partitions = src.shape[0]
    reads = [src]
    shift = _vector_operand(instr, "max_value", max_value, partitions, ve, reads)
    init = None
    if cmd is _RCmd.load_reduce:
        init = _vector_operand(instr, "reduce_init", reduce_init, partitions, ve, reads)
    elif isinstance(reduce_init, NkiTensor) or float(reduce_init) != 0.0:
        fail(instr, "reduce_init must be unset (0.0) unless reduce_cmd is load_reduce")
    res = _reduce_res_tile(instr, reduce_res, partitions, ve)
    with np.errstate(over="ignore", invalid="ignore"):
        y = np.exp(_f32(src, instr) - shift).astype(np.float32)
    _store(dst, y)
    state = _core_state(run)
    lanes = _lanes(src)
    _dve_reduce(state, lanes, cmd, "add", y, init)
    writes = [dst]
    _dve_readout(run, instr, state, lanes, res, writes, partitions)
    return _record(run, instr, ve, reads, writes, name=name, op="exp", reduce_cmd=cmd.name,
                   reduce_res=res is not None)


def scalar_tensor_tensor(dst: NkiTensor, data: NkiTensor, op0: Any, operand0: Any, op1: Any, operand1: NkiTensor,
                         reverse0: bool = False, reverse1: bool = False, name: str | None = None) -> NkiInstruction:
    """``(data op0 operand0) op1 operand1`` on VectorE: scalar/(P,1) then full-tile operand (facts 4.3)."""
    instr = "scalar_tensor_tensor"
    run, version = _ctx()
    spec0 = _op(instr, "op0", op0)
    spec1 = _op(instr, "op1", op1)
    for spec in (spec0, spec1):
        if spec.bitvec:
            fail(instr, f"bit-vector op {spec.name} is not supported; scalar_tensor_tensor takes arithmetic ops")
        if spec.trn3_only and version < 4:
            fail(instr, f"op {spec.name} needs NeuronCore-v4 (trn3)")
    ve = Engine.VECTOR
    data = _operand(instr, "data", data, ve)
    operand1 = _operand(instr, "operand1", operand1, ve)
    dst = _operand(instr, "dst", dst, ve)
    _same_layout(instr, "data", data, "operand1", operand1)
    _same_layout(instr, "data", data, "dst", dst)
    if data._alloc.buffer is Buffer.psum and operand1._alloc.buffer is Buffer.psum:
        fail(instr, "data and operand1 are both in PSUM; at most one of them may be in PSUM")
    reads = [data, operand1]
    v0 = None if spec0.arity == 1 else _vector_operand(instr, "operand0", operand0, data.shape[0], ve, reads)
    y = _apply(spec0, _f32(data, instr), v0, reverse0)
    y = _apply(spec1, y, _f32(operand1, instr), reverse1)
    _store(dst, y)
    return _record(run, instr, ve, reads, [dst], name=name, op0=spec0.name, op1=spec1.name,
                   reverse0=bool(reverse0), reverse1=bool(reverse1))


def _scalar_tensor_tensor_legacy(*, data: NkiTensor, op0: Any, operand0: Any, op1: Any, operand1: NkiTensor,
                                 reverse0: bool = False, reverse1: bool = False, dtype: Any = None, mask: Any = None,
                                 name: str | None = None) -> NkiTensor:
    data = _tensor("scalar_tensor_tensor", "data", data)
    out = _new_tile(data.shape, _legacy_dtype(dtype, data, operand1), Buffer.sbuf, "scalar_tensor_tensor")
    cut = _masked("scalar_tensor_tensor", mask, out, data, operand0, operand1)
    if cut is not None:
        dst, (d, o0, o1) = cut
        scalar_tensor_tensor(dst, d, op0, o0, op1, o1, reverse0=reverse0, reverse1=reverse1, name=name)
    return out


scalar_tensor_tensor = _dual(("dst", "data", "operand1"), _scalar_tensor_tensor_legacy)(scalar_tensor_tensor)

_TSR_OPS = ("add", "multiply", "maximum", "minimum")


def tensor_scalar_reduce(dst: NkiTensor, data: NkiTensor, op0: Any, operand0: Any, reduce_op: Any,
                         reduce_res: NkiTensor | None = None, reverse0: bool = False,
                         reduce_cmd: reduce_cmd = reduce_cmd.reset_reduce, reduce_init: Any = None,
                         reduce_res_negate: bool = False, name: str | None = None) -> NkiInstruction:
    """``data op0 operand0`` plus a free-dim reduction into the VectorE accumulators (facts 4.3)."""
    instr = "tensor_scalar_reduce"
    run, version = _ctx()
    spec0 = _op(instr, "op0", op0)
    if spec0.bitvec:
        fail(instr, f"bit-vector op {spec0.name} is not supported; op0 must be arithmetic")
    if reverse0:
        fail(instr, "reverse0=True is not supported by tensor_scalar_reduce yet (AWS docs); swap the operands with a "
             "separate instruction")
    reduce_name = nki_op_name(reduce_op)
    if reduce_name not in _TSR_OPS:
        fail(instr, f"reduce_op {reduce_name} is not supported; use one of add, multiply, max or min")
    cmd = _cmd(instr, reduce_cmd, (_RCmd.reset_reduce, _RCmd.reduce, _RCmd.load_reduce))
    if cmd is _RCmd.load_reduce and reduce_init is None:
        fail(instr, "reduce_cmd=load_reduce needs reduce_init (the accumulator's starting value)")
    if cmd is not _RCmd.load_reduce and reduce_init is not None:
        fail(instr, "reduce_init may be set only with reduce_cmd=load_reduce")
    ve = Engine.VECTOR
    data = _operand(instr, "data", data, ve)
    dst = _operand(instr, "dst", dst, ve)
    _same_layout(instr, "data", data, "dst", dst)
    partitions = data.shape[0]
    reads = [data]
    if spec0.arity == 1:
        v0 = None
    else:
        v0 = _vector_operand(instr, "operand0", operand0, partitions, ve, reads)
    y = np.asarray(_apply(spec0, _f32(data, instr), v0, False), dtype=np.float32)
    init = None if reduce_init is None else _vector_operand(instr, "reduce_init", reduce_init, partitions, ve, reads)
    res = _reduce_res_tile(instr, reduce_res, partitions, ve)
    _store(dst, y)
    state = _core_state(run)
    lanes = _lanes(data)
    _dve_reduce(state, lanes, cmd, reduce_name, y, init)
    writes = [dst]
    _dve_readout(run, instr, state, lanes, res, writes, partitions, negate=bool(reduce_res_negate))
    return _record(run, instr, ve, reads, writes, name=name, op0=spec0.name, reduce_op=reduce_name,
                   reduce_cmd=cmd.name, reduce_res=res is not None)


def _tensor_scalar_reduce_legacy(*, data: NkiTensor, op0: Any, operand0: Any, reduce_op: Any, reduce_res: Any,
                                 reverse0: bool = False, dtype: Any = None, mask: Any = None,
                                 name: str | None = None) -> NkiTensor:
    data = _tensor("tensor_scalar_reduce", "data", data)
    out = _new_tile(data.shape, _legacy_dtype(dtype, data), Buffer.sbuf, "tensor_scalar_reduce")
    cut = _masked("tensor_scalar_reduce", mask, out, data, operand0, reduce_res)
    if cut is not None:
        dst, (d, o0, r) = cut
        tensor_scalar_reduce(dst, d, op0, o0, reduce_op, reduce_res=r, reverse0=reverse0, name=name)
    return out


tensor_scalar_reduce = _dual(("dst", "data"), _tensor_scalar_reduce_legacy)(tensor_scalar_reduce)

_CUMULATIVE_OPS = ("add", "subtract", "multiply", "maximum", "minimum")
_ACCUMULATE = {"add": np.add, "multiply": np.multiply, "maximum": np.maximum, "minimum": np.minimum}


def tensor_scalar_cumulative(dst: NkiTensor, src: NkiTensor, op0: Any, op1: Any, imm0: Any, imm1: Any = None,
                             reduce_cmd: reduce_cmd = reduce_cmd.reset_reduce,
                             name: str | None = None) -> NkiInstruction:
    """Running ``reg = op1(op0(x, imm0), reg)`` along the free dim, on VectorE (facts 4.3, decision 11)."""
    instr = "tensor_scalar_cumulative"
    run, _version = _ctx()
    spec0 = _op(instr, "op0", op0)
    if spec0.bitvec:
        fail(instr, f"op0 must be an arithmetic op, got bit-vector op {spec0.name}")
    op1_name = _op(instr, "op1", op1).name
    if op1_name not in _CUMULATIVE_OPS:
        fail(instr, f"op1 {op1_name} is not supported; the cumulative op is one of {', '.join(_CUMULATIVE_OPS)}")
    cmd = _cmd(instr, reduce_cmd, (_RCmd.reset_reduce, _RCmd.reduce, _RCmd.load_reduce))
    ve = Engine.VECTOR
    src = _operand(instr, "src", src, ve)
    dst = _operand(instr, "dst", dst, ve)
    _same_layout(instr, "src", src, "dst", dst)
    for role, t in (("src", src), ("dst", dst)):
        if t.dtype.name in _INT32:
            fail(instr, f"{role} dtype {t.dtype.name} is not supported (int32/uint32 are excluded by the ISA); use "
                 "bf16, fp16, fp32, fp8, (u)int8 or (u)int16")
    partitions = src.shape[0]
    reads = [src]
    v0 = None if spec0.arity == 1 else _vector_operand(instr, "imm0", imm0, partitions, ve, reads)
    y = np.asarray(_apply(spec0, _f32(src, instr), v0, False), dtype=np.float32)
    state = _core_state(run)
    lanes = _lanes(src)
    if cmd is _RCmd.reset_reduce:
        start = np.full((partitions, 1), _REDUCE_IDENTITY.get(op1_name, 0.0), dtype=np.float32)
    elif cmd is _RCmd.load_reduce:
        if imm1 is None:
            fail(instr, "reduce_cmd=load_reduce needs imm1 (the accumulator's starting value)")
        start = np.broadcast_to(_vector_operand(instr, "imm1", imm1, partitions, ve, reads),
                                (partitions, 1)).astype(np.float32)
    else:
        _registers_read(run, instr, state.dve_valid, lanes, "VectorE")
        start = state.dve_acc[lanes].reshape(partitions, 1).copy()
    with np.errstate(all="ignore"):
        if op1_name == "subtract":
            # r_i = y_i - r_(i-1)  =>  r_i = s_i * cumsum(s * y)_i + (-1)^(i+1) r_0, s_k = (-1)^k
            signs = np.where(np.arange(y.shape[1]) % 2 == 0, 1.0, -1.0).astype(np.float32)
            result = signs * np.cumsum(signs * y, axis=1, dtype=np.float32) - signs * start
        else:
            result = _ACCUMULATE[op1_name].accumulate(np.concatenate([start, y], axis=1), axis=1)[:, 1:]
    result = np.asarray(result, dtype=np.float32)
    state.dve_acc[lanes] = result[:, -1]
    state.dve_valid[lanes] = True
    _store(dst, result)
    return _record(run, instr, ve, reads, [dst], name=name, op0=spec0.name, op1=op1_name, reduce_cmd=cmd.name)


def tensor_tensor_scan(dst: NkiTensor, data0: NkiTensor, data1: NkiTensor, initial: Any, op0: Any, op1: Any,
                       reverse0: bool = False, reverse1: bool = False, name: str | None = None) -> NkiInstruction:
    """``r[:, i] = op1(op0(data0[:, i], r[:, i-1]), data1[:, i])`` on VectorE (facts 4.3, decision 11)."""
    instr = "tensor_tensor_scan"
    run, _version = _ctx()
    spec0 = _op(instr, "op0", op0)
    spec1 = _op(instr, "op1", op1)
    for spec in (spec0, spec1):
        if spec.bitvec or spec.arity != 2:
            fail(instr, f"op {spec.name} is not a binary arithmetic operator")
    ve = Engine.VECTOR
    data0 = _operand(instr, "data0", data0, ve)
    data1 = _operand(instr, "data1", data1, ve)
    dst = _operand(instr, "dst", dst, ve)
    _same_layout(instr, "data0", data0, "data1", data1)
    _same_layout(instr, "data0", data0, "dst", dst)
    if data0._alloc.buffer is Buffer.psum and data1._alloc.buffer is Buffer.psum:
        fail(instr, "data0 and data1 are both in PSUM; at most one of them may be in PSUM")
    partitions = data0.shape[0]
    reads = [data0, data1]
    state = np.broadcast_to(_vector_operand(instr, "initial", initial, partitions, ve, reads),
                            (partitions, 1)).astype(np.float32).reshape(partitions)
    a = _f32(data0, instr)
    b = _f32(data1, instr)
    out = np.empty_like(a)
    f0, f1 = spec0.fn, spec1.fn
    with np.errstate(all="ignore"):
        for i in range(a.shape[1]):
            t = f0(state, a[:, i]) if reverse0 else f0(a[:, i], state)
            state = np.asarray(f1(b[:, i], t) if reverse1 else f1(t, b[:, i]), dtype=np.float32)
            out[:, i] = state
    _store(dst, out)
    return _record(run, instr, ve, reads, [dst], name=name, op0=spec0.name, op1=spec1.name)


def _tensor_tensor_scan_legacy(data0: NkiTensor, data1: NkiTensor, initial: Any, op0: Any, op1: Any,
                               reverse0: bool = False, reverse1: bool = False, *, dtype: Any = None, mask: Any = None,
                               name: str | None = None) -> NkiTensor:
    data0 = _tensor("tensor_tensor_scan", "data0", data0)
    out = _new_tile(data0.shape, _legacy_dtype(dtype, data0, data1), Buffer.sbuf, "scan")
    cut = _masked("tensor_tensor_scan", mask, out, data0, data1, initial)
    if cut is not None:
        dst, (d0, d1, init) = cut
        tensor_tensor_scan(dst, d0, d1, init, op0, op1, reverse0=reverse0, reverse1=reverse1, name=name)
    return out


tensor_tensor_scan = _dual(("dst", "data0", "data1"), _tensor_tensor_scan_legacy)(tensor_tensor_scan)


def bn_stats(dst: NkiTensor, data: NkiTensor, name: str | None = None) -> NkiInstruction:
    """Per-partition (count, mean, var*count) of the even and odd elements, on VectorE (facts 4.3)."""
    instr = "bn_stats"
    run, _version = _ctx()
    ve = Engine.VECTOR
    data = _operand(instr, "data", data, ve)
    dst = _operand(instr, "dst", dst, ve)
    _same_partitions(instr, "data", data, "dst", dst)
    if data.free_size > 512:
        fail(instr, f"data has {data.free_size} elements per partition, above bn_stats' limit of 512 "
             "(nl.tile_size.bn_stats_fmax): run bn_stats per 512-element chunk and combine them with one bn_aggr")
    if dst.free_size != 6:
        fail(instr, f"dst must hold 6 elements per partition (count, mean, var*count for even and odd elements), "
             f"has {dst.free_size}")
    x = _f32(data, instr)
    parts = []
    for half in (x[:, 0::2], x[:, 1::2]):
        count = half.shape[1]
        if count:
            mean = half.mean(axis=1, dtype=np.float32)
            m2 = ((half - mean[:, None]) ** 2).sum(axis=1, dtype=np.float32)
        else:
            mean = m2 = np.zeros(half.shape[0], dtype=np.float32)
        parts += [np.full(half.shape[0], count, dtype=np.float32), mean, m2]
    _store(dst, np.stack(parts, axis=1))
    return _record(run, instr, ve, [data], [dst], name=name)


def bn_aggr(dst: NkiTensor, data: NkiTensor, name: str | None = None) -> NkiInstruction:
    """Combine bn_stats tuples into (mean, variance) per partition, on VectorE (facts 4.3)."""
    instr = "bn_aggr"
    run, _version = _ctx()
    ve = Engine.VECTOR
    data = _operand(instr, "data", data, ve)
    dst = _operand(instr, "dst", dst, ve)
    _same_partitions(instr, "data", data, "dst", dst)
    if data.free_size % 3:
        fail(instr, f"data has {data.free_size} elements per partition; bn_aggr reads (count, mean, var*count) "
             "triples, so it must be a multiple of 3")
    if dst.free_size != 2:
        fail(instr, f"dst must hold 2 elements per partition (mean, variance), has {dst.free_size}")
    x = _f32(data, instr).reshape(data.shape[0], -1, 3)
    count, mean, m2 = x[..., 0], x[..., 1], x[..., 2]
    with np.errstate(all="ignore"):
        total = count.sum(axis=1)
        mu = (count * mean).sum(axis=1) / total
        var = (m2.sum(axis=1) + (count * (mean - mu[:, None]) ** 2).sum(axis=1)) / total
    _store(dst, np.stack([mu, var], axis=1).astype(np.float32))
    return _record(run, instr, ve, [data], [dst], name=name)


def _bn_legacy(fn: Callable[..., Any], width: int, label: str) -> Callable[..., NkiTensor]:
    def legacy(data: NkiTensor, *, mask: Any = None, dtype: Any = None, name: str | None = None) -> NkiTensor:
        data = _tensor(label, "data", data)
        out = _new_tile((data.shape[0], width), _legacy_dtype(dtype, data), Buffer.sbuf, label)
        counts = _mask_counts(label, mask, tuple(data.shape))
        src, dst = data, out
        if counts is not None:
            if 0 in counts:
                return out
            if data.ndim != 2:
                fail(label, f"a legacy mask on {label} is simulated for 2-D data only")
            src, dst = data[0:counts[0], 0:counts[1]], out[0:counts[0]]
        fn(dst, src, name=name)
        return out

    legacy.__name__ = f"_{label}_legacy"
    return legacy


bn_stats = _dual(("dst", "data"), _bn_legacy(bn_stats, 6, "bn_stats"))(bn_stats)
bn_aggr = _dual(("dst", "data"), _bn_legacy(bn_aggr, 2, "bn_aggr"))(bn_aggr)


# ============================================================================ VectorE: selection, top-8, random
def select_reduce(dst: NkiTensor, predicate: NkiTensor, on_true: NkiTensor, on_false: Any,
                  reduce_res: NkiTensor | None = None, reduce_cmd: reduce_cmd = reduce_cmd.idle,
                  reduce_op: Any = "maximum", reverse_pred: bool = False, name: str | None = None) -> NkiInstruction:
    """``where(predicate, on_true, on_false)`` with an optional max into the VectorE accumulators (facts 4.3)."""
    instr = "select_reduce"
    run, _version = _ctx()
    reduce_name = "maximum" if reduce_op is None else nki_op_name(reduce_op)
    reduce_name = "maximum" if reduce_name == "max" else reduce_name
    if reduce_name != "maximum":
        fail(instr, f"reduce_op {reduce_name} is not supported; select_reduce reduces with max only")
    cmd = _cmd(instr, reduce_cmd, (_RCmd.idle, _RCmd.reset_reduce, _RCmd.reduce))
    ve = Engine.VECTOR
    predicate = _operand(instr, "predicate", predicate, ve)
    on_true = _operand(instr, "on_true", on_true, ve)
    dst = _operand(instr, "dst", dst, ve)
    _same_layout(instr, "on_true", on_true, "predicate", predicate)
    _same_layout(instr, "on_true", on_true, "dst", dst)
    if not predicate.dtype.is_integer or predicate.dtype.itemsize > 2:
        fail(instr, f"predicate dtype is {predicate.dtype.name}; it must be int8, uint8, int16 or uint16")
    if on_true.dtype.name in ("tfloat32",) + _INT32:
        fail(instr, f"on_true dtype {on_true.dtype.name} is not supported (tfloat32, int32 and uint32 are excluded)")
    if on_true._alloc.buffer is Buffer.psum and predicate._alloc.buffer is Buffer.psum:
        fail(instr, "on_true and predicate are both in PSUM; at most one of them may be in PSUM")
    partitions = on_true.shape[0]
    reads = [predicate, on_true]
    fill = _vector_operand(instr, "on_false", on_false, partitions, ve, reads)
    res = _reduce_res_tile(instr, reduce_res, partitions, ve)
    if res is not None and not res.dtype.is_float:
        fail(instr, f"reduce_res dtype must be a float type, got {res.dtype.name}")
    keep = _raw2d(predicate, instr) != 0
    if reverse_pred:
        keep = ~keep
    result = np.where(keep, _f32(on_true, instr), fill).astype(np.float32)
    _store(dst, result)
    state = _core_state(run)
    lanes = _lanes(on_true)
    _dve_reduce(state, lanes, cmd, "maximum", result)
    writes = [dst]
    _dve_readout(run, instr, state, lanes, res, writes, partitions)
    return _record(run, instr, ve, reads, writes, name=name, reduce_op=reduce_name, reduce_cmd=cmd.name,
                   reduce_res=res is not None, reverse_pred=bool(reverse_pred))


def _select_reduce_legacy(*, dst: NkiTensor, predicate: NkiTensor, on_true: NkiTensor, on_false: Any,
                          reduce_res: Any = None, reduce_cmd: Any = _RCmd.idle, reduce_op: Any = None,
                          reverse_pred: bool = False, mask: Any = None, dtype: Any = None,
                          name: str | None = None) -> NkiTensor:
    cut = _masked("select_reduce", mask, dst, predicate, on_true, on_false, reduce_res)
    if cut is not None:
        d, (p, t, f, r) = cut
        select_reduce(d, p, t, f, reduce_res=r, reduce_cmd=reduce_cmd, reduce_op=reduce_op,
                      reverse_pred=reverse_pred, name=name)
    return dst


select_reduce = _dual(("dst", "predicate", "on_true"), _select_reduce_legacy)(select_reduce)

_COMPARISONS = ("equal", "less", "less_equal", "greater", "greater_equal")


def range_select(dst: NkiTensor, on_true_tile: NkiTensor, comp_op0: Any, comp_op1: Any, bound0: NkiTensor,
                 bound1: NkiTensor, reduce_cmd: reduce_cmd = reduce_cmd.reset_reduce,
                 reduce_res: NkiTensor | None = None, reduce_op: Any = "maximum", range_start: int = 0,
                 on_false_value: float = FP32_MIN, name: str | None = None) -> NkiInstruction:
    """Keep elements whose free index lies in a per-partition range, max-reducing them (v3+, facts 4.3)."""
    instr = "range_select"
    run, version = _ctx()
    if version < 3:
        fail(instr, f"range_select needs NeuronCore-v3 or newer (trn2/trn3); target {run.target.name} is "
             "NeuronCore-v2")
    comps = []
    for role, op in (("comp_op0", comp_op0), ("comp_op1", comp_op1)):
        op_name = _op(instr, role, op).name
        if op_name not in _COMPARISONS:
            fail(instr, f"{role} {op_name} is not a comparison; use one of {', '.join(_COMPARISONS)}")
        comps.append(ALU_OPS[op_name].fn)
    reduce_name = "maximum" if reduce_op is None else nki_op_name(reduce_op)
    if reduce_name != "maximum":
        fail(instr, f"reduce_op {reduce_name} is not supported; range_select reduces with max only")
    if float(on_false_value) != FP32_MIN:
        fail(instr, f"on_false_value must be FP32_MIN ({FP32_MIN!r}, nl.fp32.min) on hardware, got {on_false_value!r}")
    cmd = _cmd(instr, reduce_cmd, (_RCmd.idle, _RCmd.reset_reduce, _RCmd.reduce))
    ve = Engine.VECTOR
    on_true = _operand(instr, "on_true_tile", on_true_tile, ve)
    dst = _operand(instr, "dst", dst, ve)
    _same_layout(instr, "on_true_tile", on_true, "dst", dst)
    if not on_true.dtype.is_float:
        fail(instr, f"on_true_tile must be a float tile, got {on_true.dtype.name}")
    partitions = on_true.shape[0]
    reads = [on_true]
    bounds = []
    for role, bound in (("bound0", bound0), ("bound1", bound1)):
        bound_t = _tensor(instr, role, bound)
        if bound_t.dtype.name != "float32":
            fail(instr, f"{role} must be a float32 ({partitions}, 1) tile, got {bound_t.dtype.name}")
        bounds.append(_vector_operand(instr, role, bound_t, partitions, ve, reads))
    res = _reduce_res_tile(instr, reduce_res, partitions, ve)
    index = (np.float32(range_start) + np.arange(on_true.free_size, dtype=np.float32))[None, :]
    keep = (comps[0](index, bounds[0]) != 0) & (comps[1](index, bounds[1]) != 0)
    result = np.where(keep, _f32(on_true, instr), np.float32(FP32_MIN)).astype(np.float32)
    _store(dst, result)
    state = _core_state(run)
    lanes = _lanes(on_true)
    _dve_reduce(state, lanes, cmd, "maximum", result)
    writes = [dst]
    _dve_readout(run, instr, state, lanes, res, writes, partitions)
    return _record(run, instr, ve, reads, writes, name=name, reduce_op=reduce_name, reduce_cmd=cmd.name,
                   reduce_res=res is not None, range_start=int(range_start))


def _range_select_legacy(*, on_true_tile: NkiTensor, comp_op0: Any, comp_op1: Any, bound0: NkiTensor,
                         bound1: NkiTensor, reduce_cmd: Any = _RCmd.idle, reduce_res: Any = None, reduce_op: Any = None,
                         range_start: int = 0, on_false_value: float = FP32_MIN, mask: Any = None, dtype: Any = None,
                         name: str | None = None) -> NkiTensor:
    on_true_tile = _tensor("range_select", "on_true_tile", on_true_tile)
    out = _new_tile(on_true_tile.shape, _legacy_dtype(dtype, on_true_tile), Buffer.sbuf, "range_select")
    cut = _masked("range_select", mask, out, on_true_tile, bound0, bound1, reduce_res)
    if cut is not None:
        dst, (t, b0, b1, r) = cut
        range_select(dst, t, comp_op0, comp_op1, b0, b1, reduce_cmd=reduce_cmd, reduce_res=r, reduce_op=reduce_op,
                     range_start=range_start, on_false_value=on_false_value, name=name)
    return out


range_select = _dual(("dst", "on_true_tile"), _range_select_legacy)(range_select)


def _top8_input(instr: str, role: str, t: NkiTensor) -> None:
    if not 8 <= t.free_size <= 16384:
        fail(instr, f"{role} has {t.free_size} elements per partition; {instr} reads 8 to 16384")


def max8(dst: NkiTensor, src: NkiTensor, name: str | None = None) -> NkiInstruction:
    """The 8 largest values of each partition, descending, on VectorE (facts 4.3)."""
    instr = "max8"
    run, _version = _ctx()
    ve = Engine.VECTOR
    src = _operand(instr, "src", src, ve)
    dst = _operand(instr, "dst", dst, ve)
    _same_partitions(instr, "src", src, "dst", dst)
    _top8_input(instr, "src", src)
    if dst.free_size != 8:
        fail(instr, f"dst must hold 8 elements per partition, has {dst.free_size}")
    x = _f32(src, instr)
    top = np.partition(x, x.shape[1] - 8, axis=1)[:, -8:]
    _store(dst, -np.sort(-top, axis=1))
    return _record(run, instr, ve, [src], [dst], name=name)


def _max8_legacy(*, src: NkiTensor, mask: Any = None, dtype: Any = None, name: str | None = None) -> NkiTensor:
    src = _tensor("max8", "src", src)
    out = _new_tile((src.shape[0], 8), _legacy_dtype(dtype, src), Buffer.sbuf, "max8")
    counts = _mask_counts("max8", mask, tuple(src.shape))
    s, d = src, out
    if counts is not None:
        if 0 in counts:
            return out
        s, d = src[tuple(slice(0, c) for c in counts)], out[0:counts[0]]
    max8(d, s, name=name)
    return out


max8 = _dual(("dst", "src"), _max8_legacy)(max8)


def _sentinel(dtype: NkiDType) -> int:
    return int(np.iinfo(dtype.storage).max) if dtype.kind in ("uint", "bool") else -1


def nc_find_index8(dst: NkiTensor, data: NkiTensor, vals: NkiTensor, name: str | None = None) -> NkiInstruction:
    """Index of each of 8 values per partition (duplicates take successive occurrences), VectorE (facts 4.3)."""
    instr = "nc_find_index8"
    run, _version = _ctx()
    ve = Engine.VECTOR
    data = _operand(instr, "data", data, ve)
    vals = _operand(instr, "vals", vals, ve)
    dst = _operand(instr, "dst", dst, ve)
    _same_partitions(instr, "data", data, "vals", vals)
    _same_partitions(instr, "data", data, "dst", dst)
    _top8_input(instr, "data", data)
    if vals.free_size != 8 or dst.free_size != 8:
        fail(instr, f"vals and dst must hold 8 elements per partition, have {vals.free_size} and {dst.free_size}")
    if dst.dtype.name not in ("uint16", "uint32"):
        fail(instr, f"dst dtype must be uint16 or uint32, got {dst.dtype.name}")
    x = _f32(data, instr)
    v = _f32(vals, instr)
    rank = np.tril(v[:, :, None] == v[:, None, :], -1).sum(axis=2)  # earlier equal vals
    sentinel = _sentinel(dst.dtype)
    out = np.empty(v.shape, dtype=np.int64)
    for j in range(8):
        equal = x == v[:, j:j + 1]
        hit = equal & (np.cumsum(equal, axis=1) == rank[:, j:j + 1] + 1)
        out[:, j] = np.where(hit.any(axis=1), hit.argmax(axis=1), sentinel)
    _store(dst, out)
    return _record(run, instr, ve, [data, vals], [dst], name=name)


def _nc_find_index8_legacy(*, data: NkiTensor, vals: NkiTensor, mask: Any = None, dtype: Any = None,
                           name: str | None = None) -> NkiTensor:
    data = _tensor("nc_find_index8", "data", data)
    out = _new_tile((data.shape[0], 8), resolve(dtype) if dtype is not None else resolve("uint32"), Buffer.sbuf,
                    "find_index8")
    counts = _mask_counts("nc_find_index8", mask, tuple(data.shape))
    d, v, o = data, vals, out
    if counts is not None:
        if 0 in counts:
            return out
        d, v, o = data[tuple(slice(0, c) for c in counts)], vals[0:counts[0]], out[0:counts[0]]
    nc_find_index8(o, d, v, name=name)
    return out


nc_find_index8 = _dual(("dst", "data", "vals"), _nc_find_index8_legacy)(nc_find_index8)


def nc_match_replace8(dst: NkiTensor, data: NkiTensor, vals: NkiTensor, imm: float, dst_idx: NkiTensor | None = None,
                      name: str | None = None) -> NkiInstruction:
    """Replace the first occurrence of each of 8 values with ``imm`` (vals processed 7..0), VectorE (facts 4.3)."""
    instr = "nc_match_replace8"
    run, _version = _ctx()
    ve = Engine.VECTOR
    data = _operand(instr, "data", data, ve)
    vals = _operand(instr, "vals", vals, ve)
    dst = _operand(instr, "dst", dst, ve)
    _same_layout(instr, "data", data, "dst", dst)
    _same_partitions(instr, "data", data, "vals", vals)
    _top8_input(instr, "data", data)
    if vals.free_size != 8:
        fail(instr, f"vals must hold 8 elements per partition, has {vals.free_size}")
    imm_value = np.float32(_scalar_value(instr, "imm", imm))
    x = _f32(data, instr)
    v = _f32(vals, instr)
    partitions = x.shape[0]
    rows = np.arange(partitions)
    replaced = np.zeros(x.shape, dtype=bool)
    index = np.empty((partitions, 8), dtype=np.int64)
    for j in range(7, -1, -1):
        candidates = (x == v[:, j:j + 1]) & ~replaced
        found = candidates.any(axis=1)
        position = candidates.argmax(axis=1)
        replaced[rows[found], position[found]] = True
        index[:, j] = np.where(found, position, -1)
    writes = [dst]
    if dst_idx is not None:
        idx_t = _operand(instr, "dst_idx", dst_idx, ve)
        _same_partitions(instr, "data", data, "dst_idx", idx_t)
        if idx_t.free_size != 8 or not idx_t.dtype.is_integer:
            fail(instr, f"dst_idx must be an integer tile with 8 elements per partition, got {idx_t.dtype.name} "
                 f"shape {list(idx_t.shape)}")
        _store(idx_t, np.where(index < 0, _sentinel(idx_t.dtype), index))
        writes.append(idx_t)
    _store(dst, np.where(replaced, imm_value, x))
    return _record(run, instr, ve, [data, vals], writes, name=name)


def _nc_match_replace8_legacy(*, data: NkiTensor, vals: NkiTensor, imm: float, dst_idx: Any = None, mask: Any = None,
                              dtype: Any = None, name: str | None = None) -> NkiTensor:
    data = _tensor("nc_match_replace8", "data", data)
    out = _new_tile(data.shape, _legacy_dtype(dtype, data), Buffer.sbuf, "match_replace8")
    counts = _mask_counts("nc_match_replace8", mask, tuple(data.shape))
    d, v, o, i = data, vals, out, dst_idx
    if counts is not None:
        if 0 in counts:
            return out
        key = tuple(slice(0, c) for c in counts)
        d, o, v = data[key], out[key], vals[0:counts[0]]
        i = None if dst_idx is None else dst_idx[0:counts[0]]
    nc_match_replace8(o, d, v, imm, dst_idx=i, name=name)
    return out


nc_match_replace8 = _dual(("dst", "data", "vals"), _nc_match_replace8_legacy)(nc_match_replace8)


def nc_stream_shuffle(dst: NkiTensor, src: NkiTensor, shuffle_mask: Sequence[int],
                      name: str | None = None) -> NkiInstruction:
    """Cross-partition moves within 32-partition quadrants on VectorE (facts 4.3); mask value 255 = keep dst."""
    instr = "nc_stream_shuffle"
    run, _version = _ctx()
    ve = Engine.VECTOR
    src = _operand(instr, "src", src, ve)
    dst = _operand(instr, "dst", dst, ve)
    if dst.dtype.name != src.dtype.name:
        fail(instr, f"dst dtype {dst.dtype.name} differs from src dtype {src.dtype.name}; they must match")
    if dst.free_size != src.free_size:
        fail(instr, f"dst has {dst.free_size} elements per partition and src {src.free_size}; they must match")
    mask = [int(m) for m in shuffle_mask]
    if len(mask) != 32 or any(not (0 <= m < 32 or m == 255) for m in mask):
        fail(instr, f"shuffle_mask must list 32 source lanes in 0..31 (or 255 to keep dst), got {mask}")
    raw = _raw2d(src, instr)
    rows = np.arange(dst.shape[0])
    lane_source = np.array(mask)[rows % 32]
    move = lane_source != 255
    source_rows = (rows // 32) * 32 + np.where(move, lane_source, 0)
    if move.any() and source_rows[move].max() >= src.shape[0]:
        fail(instr, f"shuffle_mask reads src partition {int(source_rows[move].max())}, beyond src's "
             f"{src.shape[0]} partitions")
    values = raw[np.where(move, source_rows, 0)]
    _store(dst, values, where=np.broadcast_to(move[:, None], values.shape))
    return _record(run, instr, ve, [src], [dst], name=name)


def dropout(dst: NkiTensor, data: NkiTensor, prob: Any, name: str | None = None) -> NkiInstruction:
    """Zero each element with probability ``prob`` (scalar or (P, 1)), on VectorE (facts 4.3, decision 12)."""
    instr = "dropout"
    run, _version = _ctx()
    ve = Engine.VECTOR
    data = _operand(instr, "data", data, ve)
    dst = _operand(instr, "dst", dst, ve)
    _same_layout(instr, "data", data, "dst", dst)
    if dst.dtype.name != data.dtype.name:
        fail(instr, f"dst dtype {dst.dtype.name} must match data dtype {data.dtype.name}")
    partitions = data.shape[0]
    reads = [data]
    if isinstance(prob, NkiTensor) and data.dtype.is_integer and prob.dtype.name != "float32":
        fail(instr, f"prob must be float32 for integer data, got {prob.dtype.name}")
    p = _vector_operand(instr, "prob", prob, partitions, ve, reads)
    raw = _raw2d(data, instr)
    draw = _core_state(run).rng[Engine.VECTOR].random(raw.shape, dtype=np.float32)
    _store(dst, np.where(draw >= p, raw, np.zeros((), dtype=raw.dtype)))
    return _record(run, instr, ve, reads, [dst], name=name)


def _dropout_legacy(data: NkiTensor, prob: Any, *, mask: Any = None, dtype: Any = None,
                    name: str | None = None) -> NkiTensor:
    data = _tensor("dropout", "data", data)
    out = _new_tile(data.shape, data.dtype, Buffer.sbuf, "dropout")
    cut = _masked("dropout", mask, out, data, prob)
    if cut is not None:
        dst, (d, p) = cut
        dropout(dst, d, p, name=name)
    if dtype is not None and resolve(dtype).name != data.dtype.name:
        cast = _new_tile(data.shape, resolve(dtype), Buffer.sbuf, "dropout_cast")
        tensor_copy(cast, out)
        return cast
    return out


dropout = _dual(("dst", "data"), _dropout_legacy)(dropout)

_RNG_DTYPES = ("int8", "int16", "int32", "uint8", "uint16", "uint32")


def rng(dst: NkiTensor, engine: engine = engine.vector, name: str | None = None) -> NkiInstruction:
    """32 random bits per element, truncated to dst's integer dtype (facts 4.3, decision 12)."""
    instr = "rng"
    run, version = _ctx()
    requested = _enum(instr, "engine", engine, _Eng)
    chosen = _Eng.vector if requested is _Eng.unknown else requested
    _choose(instr, chosen, (_Eng.vector, _Eng.gpsimd))
    if chosen is _Eng.gpsimd and version < 3:
        fail(instr, "rng on GpSimd needs NeuronCore-v3 or newer; NeuronCore-v2 generates on VectorE")
    eng = _ENGINE_NAME[chosen]
    dst = _operand(instr, "dst", dst, eng)
    if dst.dtype.name not in _RNG_DTYPES:
        fail(instr, f"dst must be an integer tile ({', '.join(_RNG_DTYPES)}), got {dst.dtype.name}")
    bits = _core_state(run).rng[eng].integers(0, 1 << 32, size=dst._data.shape, dtype=np.uint32)
    _store(dst, bits.astype(dst.dtype.storage))
    return _record(run, instr, eng, [], [dst], name=name, engine_requested=requested.name)


def rand2(dst: NkiTensor, min: Any, max: Any, name: str | None = None) -> NkiInstruction:  # noqa: A002
    """Uniform random values in [min, max) on VectorE (v4 only, facts 4.3)."""
    instr = "rand2"
    run, version = _ctx()
    if version < 4:
        fail(instr, f"rand2 is available only on NeuronCore-v4 (trn3); target {run.target.name} is "
             f"NeuronCore-v{version}: use nisa.rng and scale the bits")
    ve = Engine.VECTOR
    dst = _operand(instr, "dst", dst, ve)
    partitions = dst.shape[0]
    reads: list[NkiTensor] = []
    low = _vector_operand(instr, "min", min, partitions, ve, reads)
    high = _vector_operand(instr, "max", max, partitions, ve, reads)
    if np.any(np.asarray(low) >= np.asarray(high)):
        fail(instr, "min must be below max for every partition")
    draw = _core_state(run).rng[Engine.VECTOR].random((partitions, dst.free_size), dtype=np.float32)
    _store(dst, low + draw * (high - low))
    return _record(run, instr, ve, reads, [dst], name=name)


def set_rng_seed(src_seeds: NkiTensor, name: str | None = None) -> NkiInstruction:
    """Seed VectorE's generator from a [1, 1] 32-bit tile: the same seed gives the same sequence (facts 4.3)."""
    instr = "set_rng_seed"
    run, _version = _ctx()
    ve = Engine.VECTOR
    src_seeds = _operand(instr, "src_seeds", src_seeds, ve)
    if src_seeds.size != 1 or src_seeds.dtype.itemsize != 4:
        fail(instr, f"src_seeds must be a [1, 1] tile of a 32-bit dtype, got {src_seeds.dtype.name} shape "
             f"{list(src_seeds.shape)}")
    seed = int(np.ascontiguousarray(_read(src_seeds, instr)).reshape(-1).view(np.uint32)[0])
    _core_state(run).rng[Engine.VECTOR] = np.random.default_rng(seed)
    return _record(run, instr, ve, [src_seeds], [], name=name, seed=seed)


def rand_set_state(src_seeds: NkiTensor, engine: engine = engine.gpsimd, name: str | None = None) -> NkiInstruction:
    """Not simulated: the XORWOW state layout is unpublished (decision 16)."""
    fail("rand_set_state", "is not simulated (the engine's XORWOW state layout is unpublished); use "
         "nisa.set_rng_seed")
    raise AssertionError  # unreachable


def rand_get_state(dst: NkiTensor, engine: engine = engine.gpsimd, name: str | None = None) -> NkiInstruction:
    """Not simulated: the XORWOW state layout is unpublished (decision 16)."""
    fail("rand_get_state", "is not simulated (the engine's XORWOW state layout is unpublished)")
    raise AssertionError  # unreachable


def quantize_mx(dst: NkiTensor, src: NkiTensor, dst_scale: NkiTensor, name: str | None = None) -> NkiInstruction:
    """Not simulated: the packed x4 MX dtypes are not NKI dtypes in this simulator (decision 16)."""
    fail("quantize_mx", "is not simulated: the packed MX dtypes (float8_e4m3fn_x4, float8_e5m2_x4) are not "
         "supported by torchneuron.nki")
    raise AssertionError  # unreachable


def nc_matmul_mx(dst: NkiTensor, stationary: NkiTensor, moving: NkiTensor, stationary_scale: NkiTensor,
                 moving_scale: NkiTensor, tile_position: Any = None, tile_size: Any = None, accumulate: Any = None,
                 name: str | None = None) -> NkiInstruction:
    """Not simulated: the packed x4 MX dtypes are not NKI dtypes in this simulator (decision 16)."""
    fail("nc_matmul_mx", "is not simulated: the packed MX dtypes (float8_e4m3fn_x4, float8_e5m2_x4, "
         "float4_e2m1fn_x4) are not supported by torchneuron.nki; use nc_matmul with fp8 inputs")
    raise AssertionError  # unreachable


# ============================================================================ GpSimd
def _pattern(instr: str, pattern: Any, free_size: int) -> list[tuple[int, int]]:
    try:
        pairs = [(int(step), int(num)) for step, num in pattern]
    except (TypeError, ValueError):
        raise TypeError(f"{instr}: pattern must be a list of [step, num] pairs, got {pattern!r}") from None
    if not 1 <= len(pairs) <= 4:
        fail(instr, f"pattern has {len(pairs)} levels; it describes up to 4 free dimensions as [step, num] pairs")
    total = math.prod(num for _, num in pairs)
    if total != free_size:
        fail(instr, f"pattern {[list(p) for p in pairs]} generates {total} values per partition but dst holds "
             f"{free_size}; the product of the nums must equal dst's elements per partition")
    return pairs


def _affine_values(partitions: int, pairs: Sequence[tuple[int, int]], offset: int,
                   channel_multiplier: int) -> np.ndarray:
    """``offset + c * channel_multiplier + sum(step_k * i_k)`` as an int64 (P, F) array."""
    inner = np.zeros(1, dtype=np.int64)
    for step, num in pairs:
        inner = (inner[:, None] + step * np.arange(num, dtype=np.int64)[None, :]).reshape(-1)
    channels = np.arange(partitions, dtype=np.int64)[:, None] * int(channel_multiplier)
    return int(offset) + channels + inner[None, :]


def iota(dst: NkiTensor, pattern: Any, offset: int = 0, channel_multiplier: int = 0,
         name: str | None = None) -> NkiInstruction:
    """Generate ``offset + c*channel_multiplier + sum(step*i)`` (int32 math) into SBUF on GpSimd (facts 4.4)."""
    instr = "iota"
    run, _version = _ctx()
    gp = Engine.GPSIMD
    dst = _operand(instr, "dst", dst, gp)
    pairs = _pattern(instr, pattern, dst.free_size)
    values = _affine_values(dst.shape[0], pairs, offset, channel_multiplier).astype(np.int32)
    _store(dst, values)
    return _record(run, instr, gp, [], [dst], name=name, pattern=[list(p) for p in pairs], offset=int(offset),
                   channel_multiplier=int(channel_multiplier))


def _affine_terms(instr: str, expr: Any) -> tuple[int, list[AffineIndex]]:
    """A legacy index expression as (constant, [single-variable terms])."""
    if isinstance(expr, AffineIndex):
        return 0, [expr]
    terms = getattr(expr, "terms", None)
    if terms is not None and all(isinstance(t, AffineIndex) for t in terms):
        return int(getattr(expr, "offset", 0)), list(terms)
    raise TypeError(f"{instr}: expected an affine expression of nl.arange / nl.mgrid indices, got {expr!r}")


def _legacy_pattern(instr: str, expr: Any) -> tuple[tuple[int, ...], list[tuple[int, int]], int, int]:
    """(tile shape, free pattern, offset, channel_multiplier) equivalent to a legacy affine expression."""
    constant, terms = _affine_terms(instr, expr)
    rank = builtins.max(builtins.max(t.rank for t in terms), 2)
    shape = [1] * rank
    steps = [0] * rank
    offset = constant
    for t in terms:
        if shape[t.position] != 1 or steps[t.position]:
            fail(instr, f"two index variables of the expression lie on dimension {t.position}; each dimension takes "
                 "one nl.arange index")
        shape[t.position] = t.count
        steps[t.position] = t.step
        offset += t.offset
    pattern = [(steps[d], shape[d]) for d in range(1, rank)]
    return tuple(shape), pattern, offset, steps[0]


def _iota_legacy(expr: Any, dtype: Any, *, mask: Any = None, name: str | None = None) -> NkiTensor:
    instr = "iota"
    shape, pattern, offset, multiplier = _legacy_pattern(instr, expr)
    out = _new_tile(shape, resolve(dtype), Buffer.sbuf, "iota")
    counts = _mask_counts(instr, mask, shape)
    dst = out
    if counts is not None:
        if 0 in counts:
            return out
        dst = out[tuple(slice(0, c) for c in counts)]
        pattern = [(step, counts[d + 1]) for d, (step, _num) in enumerate(pattern)]
    iota(dst, pattern, offset=offset, channel_multiplier=multiplier, name=name)
    return out


iota = _dual(("dst",), _iota_legacy)(iota)

_CMP_OPS = {"<": "less", "<=": "less_equal", ">": "greater", ">=": "greater_equal", "==": "equal",
            "!=": "not_equal"}


def affine_select(dst: NkiTensor, pattern: Any, channel_multiplier: int, on_true_tile: NkiTensor,
                  on_false_value: float, cmp_op: Any = "equal", offset: int = 0,
                  name: str | None = None) -> NkiInstruction:
    """``where(cmp_op(affine_value, 0), on_true_tile, on_false_value)`` on GpSimd, SBUF only (facts 4.4)."""
    instr = "affine_select"
    run, _version = _ctx()
    gp = Engine.GPSIMD
    on_true = _operand(instr, "on_true_tile", on_true_tile, gp)
    dst = _operand(instr, "dst", dst, gp)
    _same_layout(instr, "on_true_tile", on_true, "dst", dst)
    compare = _op(instr, "cmp_op", cmp_op)
    if compare.name not in _CMP_OPS.values():
        fail(instr, f"cmp_op {compare.name} is not a comparison; use nl.equal, nl.less, nl.greater_equal, ...")
    fill = _scalar_value(instr, "on_false_value", on_false_value)
    pairs = _pattern(instr, pattern, dst.free_size)
    values = _affine_values(dst.shape[0], pairs, offset, channel_multiplier).astype(np.int32)
    keep = compare.fn(values, np.int32(0)) != 0
    if on_true.dtype.name == dst.dtype.name:  # selected elements are copied bit-exactly
        _store(dst, _raw2d(on_true, instr), where=keep)
        _store(dst, np.asarray(np.float32(fill)), where=~keep)
    else:  # different dtypes: selected elements go through fp32 (facts 4.4)
        _store(dst, np.where(keep, _f32(on_true, instr), np.float32(fill)))
    return _record(run, instr, gp, [on_true], [dst], name=name, cmp_op=compare.name, pattern=[list(p) for p in pairs],
                   offset=int(offset), channel_multiplier=int(channel_multiplier))


def _affine_select_legacy(pred: Any, on_true_tile: NkiTensor, on_false_value: float, *, mask: Any = None,
                          dtype: Any = None, name: str | None = None) -> NkiTensor:
    instr = "affine_select"
    on_true_tile = _tensor(instr, "on_true_tile", on_true_tile)
    if isinstance(pred, MaskExpr):
        if len(pred.terms) != 1:
            fail(instr, "pred combines several comparisons; affine_select takes one affine comparison (use nl.where "
                 "for compound predicates)")
        expr, op, bound = pred.terms[0]
        value_expr = expr - bound
    elif hasattr(pred, "expr") and hasattr(pred, "op"):
        value_expr, op = pred.expr, pred.op
    else:
        raise TypeError(f"{instr}: pred must be a comparison of legacy index expressions (e.g. iy < ix), got {pred!r}")
    if op not in _CMP_OPS:
        raise TypeError(f"{instr}: unsupported comparison {op!r} in pred")
    shape, pattern, offset, multiplier = _legacy_pattern(instr, value_expr)
    if math.prod(shape[1:]) == 1 and on_true_tile.free_size > 1 or shape[0] not in (1, on_true_tile.shape[0]):
        fail(instr, f"pred spans {list(shape)} but on_true_tile has shape {list(on_true_tile.shape)}")
    free = on_true_tile.free_size
    if math.prod(num for _, num in pattern) != free:
        fail(instr, f"pred spans {list(shape)} but on_true_tile has shape {list(on_true_tile.shape)}; they must match")
    out = _new_tile(on_true_tile.shape, _legacy_dtype(dtype, on_true_tile), Buffer.sbuf, "affine_select")
    cut = _masked(instr, mask, out, on_true_tile)
    if cut is not None:
        if cut[0].shape != out.shape:
            fail(instr, "a legacy mask on affine_select is not simulated; slice the input instead")
        affine_select(out, pattern, multiplier, on_true_tile, on_false_value, cmp_op=_CMP_OPS[op], offset=offset,
                      name=name)
    return out


affine_select = _dual(("dst", "on_true_tile"), _affine_select_legacy)(affine_select)


def local_gather(dst: NkiTensor, src_buffer: NkiTensor, index: NkiTensor, num_elem_per_idx: int = 1,
                 num_valid_indices: int | None = None, name: str | None = None) -> NkiInstruction:
    """Gather within each 16-partition GpSimd core's slice of SBUF (facts 4.4, decision 13)."""
    instr = "local_gather"
    run, _version = _ctx()
    gp = Engine.GPSIMD
    src = _operand(instr, "src_buffer", src_buffer, gp)
    index = _operand(instr, "index", index, gp)
    dst = _operand(instr, "dst", dst, gp)
    if index.dtype.name != "uint16":
        fail(instr, f"index dtype must be uint16, got {index.dtype.name}")
    partitions = src.shape[0]
    if index.shape[0] != partitions or partitions % 16:
        fail(instr, f"src_buffer ({partitions} partitions) and index ({index.shape[0]}) must span the same partitions, "
             "a multiple of 16 (one 16-partition slice per GpSimd core)")
    per_elem = int(num_elem_per_idx)
    if per_elem not in (1, 2, 4, 8, 16, 32):
        fail(instr, f"num_elem_per_idx must be 1, 2, 4, 8, 16 or 32, got {num_elem_per_idx}")
    per_core = index.free_size * 16
    if per_core > 4096:
        fail(instr, f"{per_core} indices per GpSimd core, above the limit of 4096")
    valid = per_core if num_valid_indices is None else int(num_valid_indices)
    if not 0 < valid <= per_core:
        fail(instr, f"num_valid_indices {valid} must be in 1..{per_core} (the indices of one 16-partition slice)")
    if dst.shape[0] != partitions or dst.free_size != valid * per_elem:
        fail(instr, f"dst must be [{partitions}, {valid * per_elem}] elements (valid indices x num_elem_per_idx), "
             f"got shape {list(dst.shape)}")
    if dst.dtype.name != src.dtype.name:
        fail(instr, f"dst dtype {dst.dtype.name} differs from src_buffer dtype {src.dtype.name}; local_gather does "
             "not cast")
    raw = _raw2d(src, instr)
    idx = _raw2d(index, instr).astype(np.int64)
    out = np.empty((partitions, valid * per_elem), dtype=raw.dtype)
    offsets = np.arange(per_elem, dtype=np.int64)
    for core in range(partitions // 16):
        rows = slice(16 * core, 16 * core + 16)
        flat = idx[rows].reshape(-1, order="F")[:valid]
        cols = (flat[:, None] + offsets[None, :]).reshape(-1)
        if cols.max() >= raw.shape[1]:
            fail(instr, f"index {int(flat.max())} (+{per_elem} elements) on GpSimd core {core} reads past the "
                 f"{raw.shape[1]} elements per partition of src_buffer (undefined on hardware)")
        out[rows] = raw[rows][:, cols]
    _store(dst, out)
    return _record(run, instr, gp, [src, index], [dst], name=name, num_elem_per_idx=per_elem,
                   num_valid_indices=valid)


def _local_gather_legacy(src_buffer: NkiTensor, index: NkiTensor, num_elem_per_idx: int = 1,
                         num_valid_indices: int | None = None, *, mask: Any = None,
                         name: str | None = None) -> NkiTensor:
    src_buffer = _tensor("local_gather", "src_buffer", src_buffer)
    index = _tensor("local_gather", "index", index)
    valid = index.free_size * 16 if num_valid_indices is None else int(num_valid_indices)
    out = _new_tile((src_buffer.shape[0], valid, int(num_elem_per_idx)), src_buffer.dtype, Buffer.sbuf, "gather")
    if mask is not None:
        fail("local_gather", "a legacy mask on local_gather is not simulated")
    local_gather(out, src_buffer, index, num_elem_per_idx, num_valid_indices, name=name)
    return out


local_gather = _dual(("dst", "src_buffer", "index"), _local_gather_legacy)(local_gather)


def nc_n_gather(dst: NkiTensor, data: NkiTensor, indices: NkiTensor, name: str | None = None) -> NkiInstruction:
    """Per-partition gather over the flattened free dims, on GpSimd, SBUF only (facts 4.4)."""
    instr = "nc_n_gather"
    run, _version = _ctx()
    gp = Engine.GPSIMD
    data = _operand(instr, "data", data, gp)
    indices = _operand(instr, "indices", indices, gp)
    dst = _operand(instr, "dst", dst, gp)
    _same_partitions(instr, "data", data, "indices", indices)
    _same_layout(instr, "indices", indices, "dst", dst)
    if indices.dtype.name != "uint32":
        fail(instr, f"indices dtype must be uint32, got {indices.dtype.name}")
    if dst.dtype.name != data.dtype.name:
        fail(instr, f"dst dtype {dst.dtype.name} must equal data dtype {data.dtype.name}")
    raw = _raw2d(data, instr)
    idx = _raw2d(indices, instr).astype(np.int64)
    if idx.size and idx.max() >= raw.shape[1]:
        fail(instr, f"index {int(idx.max())} is out of range for {raw.shape[1]} elements per partition of data")
    _store(dst, np.take_along_axis(raw, idx, axis=1))
    return _record(run, instr, gp, [data, indices], [dst], name=name)



def sequence_bounds(dst: NkiTensor, segment_ids: NkiTensor, name: str | None = None) -> NkiInstruction:
    """[start, end) of the segment each element belongs to (0 = padding: [n, -1]), on GpSimd (facts 4.4)."""
    instr = "sequence_bounds"
    run, _version = _ctx()
    gp = Engine.GPSIMD
    ids = _operand(instr, "segment_ids", segment_ids, gp)
    dst = _operand(instr, "dst", dst, gp)
    for role, t in (("segment_ids", ids), ("dst", dst)):
        if t.dtype.name not in ("float32", "int32"):
            fail(instr, f"{role} dtype must be float32 or int32, got {t.dtype.name}")
        if t.shape[0] != 1:
            fail(instr, f"{role} must have a partition dimension of 1, got shape {list(t.shape)}")
    n = ids.free_size
    if dst.free_size != 2 * n:
        fail(instr, f"dst must hold 2 x {n} elements (start and end of each element's segment), has "
             f"{dst.free_size}")
    seq = _f32(ids, instr)[0]
    index = np.arange(n)
    starts = np.ones(n, dtype=bool)
    starts[1:] = seq[1:] != seq[:-1]
    ends = np.ones(n, dtype=bool)
    ends[:-1] = seq[:-1] != seq[1:]
    first = np.maximum.accumulate(np.where(starts, index, 0))
    last = np.minimum.accumulate(np.where(ends, index + 1, n)[::-1])[::-1]
    padding = seq == 0
    bounds = np.stack([np.where(padding, n, first), np.where(padding, -1, last)]).astype(np.float32)
    _store(dst, bounds.reshape(1, -1))
    return _record(run, instr, gp, [ids], [dst], name=name)


def nonzero_with_count(dst: NkiTensor, src: NkiTensor, index_offset: int = 0, padding_val: int = -1,
                       name: str | None = None) -> NkiInstruction:
    """Indices of non-zero elements, padding and their count, on partitions 0, 16, ..., 112 (v3+, facts 4.4)."""
    instr = "nonzero_with_count"
    run, version = _ctx()
    if version < 3:
        fail(instr, f"nonzero_with_count needs NeuronCore-v3 or newer (trn2/trn3); target {run.target.name} is "
             "NeuronCore-v2")
    gp = Engine.GPSIMD
    src = _operand(instr, "src", src, gp)
    dst = _operand(instr, "dst", dst, gp)
    _same_partitions(instr, "src", src, "dst", dst)
    if src.dtype.name not in ("float32", "int32") or dst.dtype.name != "int32":
        fail(instr, f"src must be float32 or int32 and dst int32, got {src.dtype.name} and {dst.dtype.name}")
    width = src.free_size
    if dst.free_size != width + 1:
        fail(instr, f"dst must have one more element per partition than src ({width + 1}), has {dst.free_size}")
    rows = np.flatnonzero((src.start_partition + np.arange(src.shape[0])) % 16 == 0)
    values = _raw2d(src, instr)[rows]
    nonzero = values != 0
    count = nonzero.sum(axis=1)
    order = np.argsort(~nonzero, axis=1, kind="stable")  # non-zero positions first, in order
    slots = np.arange(width)[None, :] < count[:, None]
    out = np.where(slots, order + int(index_offset), int(padding_val))
    where = np.zeros((dst.shape[0], width + 1), dtype=bool)
    where[rows] = True
    full = np.zeros((dst.shape[0], width + 1), dtype=np.int64)
    full[rows] = np.concatenate([out, count[:, None]], axis=1)
    _store(dst, full, where=where)
    return _record(run, instr, gp, [src], [dst], name=name, index_offset=int(index_offset))


def topk(val_dst: NkiTensor, idx_dst: NkiTensor, src: NkiTensor, n: int, name: str | None = None) -> NkiInstruction:
    """Not simulated: the documented 16-partition snake semantics are ambiguous (decision 16)."""
    fail("topk", "is not simulated: its 16-partition snake layout is not specified precisely enough; use nisa.max8 "
         "and nisa.nc_find_index8 (top 8) or nisa.nc_match_replace8 in a loop")
    raise AssertionError  # unreachable


# ============================================================================ DMA
def _dma_buffers(instr: str, dst: NkiTensor, src: NkiTensor) -> None:
    if src._alloc.buffer is Buffer.psum:
        fail(instr, f"src {src.name!r} is in PSUM; since NKI 0.3.0 DMA cannot read PSUM: copy it to SBUF with "
             "nisa.tensor_copy first")
    if dst._alloc.buffer is Buffer.psum:
        fail(instr, f"dst {dst.name!r} is in PSUM; DMA moves data HBM<->SBUF, HBM->HBM or SBUF->SBUF: write PSUM "
             "with a compute engine (nisa.tensor_copy)")


def _priority(instr: str, priority: Any, version: int, mode: dge_mode) -> int | None:
    if priority is None:
        return None
    if version < 4:
        fail(instr, f"priority needs NeuronCore-v4 (trn3); target is NeuronCore-v{version}")
    if isinstance(priority, bool) or not isinstance(priority, (int, np.integer)) or not 0 <= int(priority) <= 3:
        fail(instr, f"priority must be an int 0-3 (lower is higher priority), got {priority!r}")
    if mode is _Dge.none:
        fail(instr, "priority is not supported with dge_mode=none")
    return int(priority)


def dma_copy(dst: NkiTensor, src: NkiTensor, priority: int | None = None, oob_mode: oob_mode = oob_mode.error,
             dge_mode: dge_mode = dge_mode.unknown, engine: engine = engine.unknown,
             name: str | None = None) -> NkiInstruction:
    """Copy ``src`` to ``dst`` with the DMA engines; a dtype change casts through fp32 (facts 4.5, decision 8)."""
    instr = "dma_copy"
    run, version = _ctx()
    dst = _tensor(instr, "dst", dst)
    src = _tensor(instr, "src", src)
    mode = _enum(instr, "dge_mode", dge_mode, _Dge)
    oob = _enum(instr, "oob_mode", oob_mode, _Oob)
    trigger = _enum(instr, "engine", engine, _Eng)
    _dma_buffers(instr, dst, src)
    if mode is _Dge.hwdge and version < 3:
        fail(instr, f"dge_mode=hwdge needs NeuronCore-v3 or newer; target {run.target.name} is NeuronCore-v2")
    if trigger not in (_Eng.unknown, _Eng.sync, _Eng.scalar):
        fail(instr, f"engine={trigger.name} is not a DMA trigger; hwdge DMAs are triggered by nisa.engine.sync or "
             "nisa.engine.scalar")
    if trigger is not _Eng.unknown and mode is not _Dge.hwdge:
        fail(instr, f"engine={trigger.name} is valid only with dge_mode=nisa.dge_mode.hwdge")
    same = src.dtype.name == dst.dtype.name
    if mode is _Dge.hwdge and not same:
        fail(instr, f"with dge_mode=hwdge the DMA moves raw bytes: src dtype {src.dtype.name} and dst dtype "
             f"{dst.dtype.name} must match; reinterpret with .view() or cast with dge_mode=swdge/none")
    prio = _priority(instr, priority, version, mode)
    target = dst
    if src.is_partial or dst.is_partial:
        if tuple(src.shape) != tuple(dst.shape):
            fail(instr, f"src {list(src.shape)} and dst {list(dst.shape)} must have the same shape when one of them "
                 "is a masked (clipped) view")
        box = tuple(slice(0, builtins.min(a, b)) for a, b in zip(src.valid_shape, dst.valid_shape))
        values = src.read(instr)[box]
        target = dst[box] if dst.is_partial or tuple(dst.valid_shape) != tuple(values.shape) else dst
    else:
        if src.size != dst.size:
            fail(instr, f"src has {src.size} elements (shape {list(src.shape)}) and dst {dst.size} (shape "
                 f"{list(dst.shape)}); DMA element counts must match")
        values = src.read(instr)
    if not run.compute_values:  # shape-only run: mark written, move no bytes
        target._mask[...] = np.iinfo(target._mask.dtype).max
    else:
        if not same:
            values = values.astype(np.float32)
        shape = target._data.shape
        if values.shape != shape:
            values = values.reshape(shape)
        target.write(values)
    return _record(run, instr, Engine.DMA, [src], [target], name=name, dge_mode=mode.name, oob_mode=oob.name,
                   engine_requested=trigger.name, priority=prio, cast=not same)


def _dma_copy_legacy(*, dst: NkiTensor, src: NkiTensor, mask: Any = None, dst_rmw_op: Any = None,
                     oob_mode: Any = _Oob.error, dge_mode: Any = _Dge.unknown, unique_indices: Any = None,
                     dtype: Any = None, name: str | None = None) -> NkiTensor:
    if dst_rmw_op is not None or unique_indices is not None:
        raise TypeError("nisa.dma_copy: dst_rmw_op and unique_indices were removed in NKI 0.3.0; use "
                        "nisa.dma_compute(dst, [src, dst], reduce_op=nl.add) for read-modify-write")
    cut = _masked("dma_copy", mask, dst, src)
    if cut is not None:
        d, (s,) = cut
        dma_copy(d, s, oob_mode=oob_mode, dge_mode=dge_mode, name=name)
    return dst


dma_copy = _dual(("dst", "src"), _dma_copy_legacy, ("mask", "dtype", "dst_rmw_op", "unique_indices"))(dma_copy)

_TRANSPOSE_AXES = {2: (1, 0), 3: (2, 1, 0), 4: (3, 1, 2, 0)}


def dma_transpose(dst: NkiTensor, src: NkiTensor, axes: Sequence[int] | None = None, priority: int | None = None,
                  dge_mode: dge_mode = dge_mode.unknown, oob_mode: oob_mode = oob_mode.error,
                  name: str | None = None) -> NkiInstruction:
    """Transpose on the DMA engines into SBUF: (1,0), (2,1,0) or (3,1,2,0) (facts 4.5)."""
    instr = "dma_transpose"
    run, version = _ctx()
    dst = _tensor(instr, "dst", dst)
    src = _tensor(instr, "src", src)
    mode = _enum(instr, "dge_mode", dge_mode, _Dge)
    oob = _enum(instr, "oob_mode", oob_mode, _Oob)
    if mode not in (_Dge.unknown, _Dge.hwdge):
        fail(instr, f"dge_mode={mode.name} is not valid for a direct DMA transpose; use unknown or hwdge")
    _buffer_rule(instr, "dst", dst, Buffer.sbuf, "dma_transpose writes SBUF")
    _dma_buffers(instr, dst, src)
    if dst.dtype.name != src.dtype.name:
        fail(instr, f"src dtype {src.dtype.name} and dst dtype {dst.dtype.name} must match")
    if src.ndim not in _TRANSPOSE_AXES:
        fail(instr, f"src is {src.ndim}-D; dma_transpose takes 2-D, 3-D or 4-D tensors")
    perm = _TRANSPOSE_AXES[src.ndim] if axes is None else tuple(int(a) for a in axes)
    if perm != _TRANSPOSE_AXES[src.ndim]:
        fail(instr, f"axes {list(perm)} is not supported for a {src.ndim}-D src; the permutation is "
             f"{list(_TRANSPOSE_AXES[src.ndim])}")
    expected = tuple(src.shape[a] for a in perm)
    if tuple(dst.shape) != expected:
        fail(instr, f"dst shape {list(dst.shape)} must equal the transposed src shape {list(expected)} exactly "
             "(including rank, since NKI 0.4.0)")
    if mode is _Dge.hwdge:
        if version < 3:
            fail(instr, "dge_mode=hwdge needs NeuronCore-v3 or newer")
        if src.dtype.itemsize != 2:
            fail(instr, f"a hwdge transpose needs a 2-byte dtype, got {src.dtype.name}")
        if src.shape[-1] > 128:
            fail(instr, f"a hwdge transpose needs src.shape[-1] <= 128, got {src.shape[-1]}")
        if src.ndim == 2 and src.shape[0] != 16:
            fail(instr, f"a 2-D hwdge transpose needs src.shape[0] == 16, got {src.shape[0]}")
        if src.ndim > 2 and (src.shape[0] not in (1, 2, 4, 8, 16) or (src.shape[0] * src.shape[-2]) % 16):
            fail(instr, f"a {src.ndim}-D hwdge transpose needs src.shape[0] in (1, 2, 4, 8, 16) and "
                 f"src.shape[0] * src.shape[-2] a multiple of 16, got shape {list(src.shape)}")
    prio = _priority(instr, priority, version, mode)
    _store(dst, np.transpose(src.read(instr), perm))
    return _record(run, instr, Engine.DMA, [src], [dst], name=name, transpose=True, axes=list(perm),
                   dge_mode=mode.name, oob_mode=oob.name, priority=prio)


def _dma_transpose_legacy(src: NkiTensor, *, axes: Any = None, mask: Any = None, dtype: Any = None,
                          name: str | None = None) -> NkiTensor:
    src = _tensor("dma_transpose", "src", src)
    perm = _TRANSPOSE_AXES.get(src.ndim, tuple(range(src.ndim))[::-1]) if axes is None else tuple(axes)
    out = _new_tile(tuple(src.shape[a] for a in perm), src.dtype, Buffer.sbuf, "dma_transpose")
    if mask is not None:
        fail("dma_transpose", "a legacy mask on dma_transpose is not simulated")
    dma_transpose(out, src, axes=perm, name=name)
    if dtype is not None and resolve(dtype).name != src.dtype.name:
        cast = _new_tile(out.shape, resolve(dtype), Buffer.sbuf, "dma_transpose_cast")
        tensor_copy(cast, out)
        return cast
    return out


dma_transpose = _dual(("dst", "src"), _dma_transpose_legacy)(dma_transpose)


def dma_compute(dst: NkiTensor, srcs: Sequence[NkiTensor], reduce_op: Any, scales: Sequence[float] | None = None,
                unique_indices: bool = True, oob_mode: oob_mode = oob_mode.error,
                name: str | None = None) -> NkiInstruction:
    """``dst = sum(srcs[i] * scales[i])`` computed in fp32 inside the DMA engines (facts 4.5)."""
    instr = "dma_compute"
    run, _version = _ctx()
    if isinstance(reduce_op, (list, tuple)):
        raise TypeError("nisa.dma_compute: NKI 0.3.0 reordered the parameters to (dst, srcs, reduce_op, "
                        "scales=None, ...); pass reduce_op=nl.add and scales= by keyword")
    dst = _tensor(instr, "dst", dst)
    if isinstance(srcs, NkiTensor) or not isinstance(srcs, (list, tuple)) or not srcs:
        raise TypeError(f"{instr}: srcs must be a non-empty list of tensors")
    tensors = [_tensor(instr, f"srcs[{i}]", s) for i, s in enumerate(srcs)]
    if len(tensors) > 16:
        fail(instr, f"{len(tensors)} source tensors; dma_compute takes at most 16")
    op_name = nki_op_name(reduce_op)
    if op_name != "add":
        fail(instr, f"reduce_op {op_name} is not supported; dma_compute reduces with nl.add only")
    if scales is not None:
        scales = [float(s) for s in scales]
        if len(scales) != len(tensors) or any(s != 1.0 for s in scales):
            fail(instr, f"scales must be None or one 1.0 per source (other scales are not supported), got {scales}")
    _enum(instr, "oob_mode", oob_mode, _Oob)
    total = None
    for i, t in enumerate(tensors):
        _dma_buffers(instr, dst, t)
        if t.size != dst.size:
            fail(instr, f"srcs[{i}] has {t.size} elements and dst {dst.size}; element counts must match")
        values = t.read(instr).astype(np.float32).reshape(-1)
        total = values if total is None else total + values
    _store(dst, total.reshape(dst._data.shape))
    return _record(run, instr, Engine.DMA, tensors, [dst], name=name, op="add", sources=len(tensors))


# ============================================================================ versions, registers, multi-core
def get_nc_version() -> nc_version:
    """The NeuronCore generation of the run's target (gen2 = trn1, gen3 = trn2, gen4 = trn3)."""
    _run, version = _ctx()
    return nc_version(version)


def get_nc_sub_version() -> int:
    """Silicon revision within the generation; the simulator models the first (0)."""
    _ctx()
    return 0


class VirtualRegister:
    """An engine-sequencer register (``nisa.register_alloc``); its value exists only on the device."""

    __slots__ = ("value",)

    def __init__(self, value: int = 0) -> None:
        self.value = int(value)

    def _no_python(self) -> None:
        raise TypeError("a register's value is known only on the device: it cannot drive Python control flow "
                        "(if/while/int()/range()); use nl.fori_loop / nl.while_loop")

    def __bool__(self) -> bool:
        self._no_python()
        return False

    def __int__(self) -> int:
        self._no_python()
        return 0

    __index__ = __int__

    def __repr__(self) -> str:
        return f"VirtualRegister({self.value})"


def register_alloc(x: int | None = None) -> VirtualRegister:
    """A new register, initialised to ``x`` (0 by default)."""
    if x is not None and (isinstance(x, bool) or not isinstance(x, (int, np.integer))):
        raise TypeError(f"register_alloc takes an int initial value, got {x!r}")
    return VirtualRegister(0 if x is None else int(x))


def register_move(dst: VirtualRegister, src: VirtualRegister) -> None:
    """Copy register ``src`` into ``dst`` (``src`` must be a register since NKI 0.3.0)."""
    if not isinstance(dst, VirtualRegister) or not isinstance(src, VirtualRegister):
        raise TypeError("register_move(dst, src) takes two registers (an immediate needs register_alloc(value))")
    dst.value = src.value


def register_load(dst: VirtualRegister, src: NkiTensor) -> NkiInstruction:
    """Load a 1x1 on-chip tile's integer value into a register."""
    instr = "register_load"
    run, _version = _ctx()
    if not isinstance(dst, VirtualRegister):
        raise TypeError(f"{instr}: dst must be a register from nisa.register_alloc()")
    src = _tensor(instr, "src", src)
    if src.size != 1 or not src.on_chip:
        fail(instr, f"src must be a 1x1 SBUF/PSUM tile, got {src.buffer.value} shape {list(src.shape)}")
    dst.value = int(np.asarray(src.read(instr)).reshape(-1)[0])
    return _record(run, instr, Engine.SYNC, [src], [])


def register_store(dst: NkiTensor, src: VirtualRegister) -> NkiInstruction:
    """Store a register's value into a 1x1 on-chip tile."""
    instr = "register_store"
    run, _version = _ctx()
    if not isinstance(src, VirtualRegister):
        raise TypeError(f"{instr}: src must be a register from nisa.register_alloc()")
    dst = _tensor(instr, "dst", dst)
    if dst.size != 1 or not dst.on_chip:
        fail(instr, f"dst must be a 1x1 SBUF/PSUM tile, got {dst.buffer.value} shape {list(dst.shape)}")
    _store(dst, np.asarray(src.value))
    return _record(run, instr, Engine.SYNC, [], [dst])


def _multicore(instr: str) -> None:
    run, version = _ctx()
    if version < 3:
        fail(instr, f"{instr} needs NeuronCore-v3 or newer (trn2/trn3)")
    if run.lnc < 2:
        fail(instr, f"{instr} synchronises the two cores of an LNC2 launch; launch the kernel as kernel[2](...)")
    fail(instr, "is not simulated: the simulator runs the programs of an LNC2 launch one after another, so a "
         "cross-core barrier or exchange cannot be honoured")


def core_barrier(data: NkiTensor, cores: Sequence[int], engine: engine = engine.gpsimd,
                 name: str | None = None) -> NkiInstruction:
    """Cross-core barrier of an LNC2 launch (not simulated, decision 16)."""
    _multicore("core_barrier")
    raise AssertionError  # unreachable


def sendrecv(src: NkiTensor, dst: NkiTensor, send_to_rank: int, recv_from_rank: int, pipe_id: int,
             dma_engine: dma_engine = dma_engine.dma, name: str | None = None) -> NkiInstruction:
    """Exchange tiles between the cores of an LNC2 launch (not simulated, decision 16)."""
    _multicore("sendrecv")
    raise AssertionError  # unreachable
