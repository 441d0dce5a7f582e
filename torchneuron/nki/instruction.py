"""What the simulator records about each executed instruction, for the cost model.

The simulator (``isa``/``language``) appends one :class:`Instruction` per
device instruction it executes; :mod:`torchneuron.nki.cost` schedules them on
engines. This record is the whole contract between the two: the cost model
never looks at tensor values.

A long kernel issues millions of records, and ``kernel.last_run`` keeps them after
it returns, so a record is small (issue 31): fixed fields in ``__slots__``, and the
parts that repeat from one instruction to the next (operands, their shapes, attrs,
source locations) shared between records through the run's :class:`RecordTable`.
Shared parts are immutable: :class:`Attrs` is a read-only dict, changed only by
:meth:`RecordTable.update_attrs`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, NoReturn

from torchneuron.hardware.engines import Engine as _HwEngine
from torchneuron.nki.errors import SourceLocation

__all__ = ["Engine", "Operand", "Instruction", "Attrs", "RecordTable", "ENGINES"]


class Engine:
    """Engine names in instruction records: the chip's engines
    (:class:`torchneuron.hardware.engines.Engine`) by their short names, as plain
    strings so records print and serialise plainly. :meth:`hardware` and :meth:`title`
    map them back; no other name list exists."""

    TENSOR = _HwEngine.TENSOR.short
    VECTOR = _HwEngine.VECTOR.short
    SCALAR = _HwEngine.SCALAR.short
    GPSIMD = _HwEngine.GPSIMD.short
    DMA = _HwEngine.DMA.short
    SYNC = _HwEngine.SYNC.short

    @staticmethod
    def hardware(short: str) -> _HwEngine:
        """The chip's engine a record names ("tensor" -> Engine.TENSOR)."""
        return _HwEngine.from_short(short)

    @staticmethod
    def title(short: str) -> str:
        """The name traces and messages show ("tensor" -> "TensorE")."""
        return _HwEngine.from_short(short).value


ENGINES = (Engine.TENSOR, Engine.VECTOR, Engine.SCALAR, Engine.GPSIMD, Engine.DMA)


@dataclass(frozen=True, slots=True)
class Operand:
    """One tensor an instruction reads or writes.

    ``extent`` is the byte interval ``[lo, hi)`` the access touches inside its
    allocation's storage (a bounding box): two instructions depend on each other
    when they touch the same allocation with overlapping extents and at least
    one writes.
    """

    buffer: str  # "sbuf", "psum", "private_hbm", "shared_hbm"
    allocation: int  # id of the allocation (unique within a kernel run)
    dtype: str  # NKI dtype name
    shape: tuple[int, ...]
    start_partition: int  # on-chip only; 0 for HBM
    partitions: int  # dim 0 of an on-chip operand; for HBM the outermost dim
    free_elements: int  # elements per partition (product of dims 1..)
    itemsize: int
    inner_stride_bytes: int  # stride of the innermost free dim, in bytes
    extent: tuple[int, int]
    # Bytes between consecutive dim-0 indices of the allocation's storage (the
    # partition pitch on chip, the row pitch in HBM); 0 = unknown. With it the
    # cost model tracks dependencies on (rows x bytes-within-row) boxes instead
    # of one byte interval, so column slices of one tile do not falsely overlap.
    row_bytes: int = 0

    @property
    def bytes(self) -> int:
        return self.partitions * self.free_elements * self.itemsize

    @property
    def bytes_per_partition(self) -> int:
        return self.free_elements * self.itemsize

    @property
    def on_chip(self) -> bool:
        return self.buffer in ("sbuf", "psum")


class Attrs(dict):
    """The ``attrs`` of a recorded instruction: a dict that refuses changes.

    Identical attrs are one object shared by every record that has them (a loop issuing
    the same ``memset`` a million times holds one), so changing one record's attrs in
    place would change them all: :meth:`RecordTable.update_attrs` gives the record new ones.
    """

    __slots__ = ()

    def _read_only(self, *args: object, **kwargs: object) -> NoReturn:
        raise TypeError("a recorded instruction's attrs are shared with the identical records and cannot be "
                        "changed in place: use run.records.update_attrs(instruction, key=value) (KernelRun.records)")

    __setitem__ = __delitem__ = __ior__ = setdefault = update = pop = popitem = clear = _read_only

    def __reduce__(self) -> tuple:
        return (Attrs, (dict(self),))


@dataclass(slots=True)
class Instruction:
    """One executed device instruction.

    ``opcode`` is the ISA name (``nc_matmul``, ``tensor_tensor``, ``activation``,
    ``dma_copy``...); ``nl`` helpers record the ISA instructions they lower to.
    ``attrs`` carries what the cost formulas need beyond operand shapes, e.g.
    ``op`` (ALU / activation name), ``moving_free``, ``stationary_free``,
    ``perf_mode``, ``is_transpose``, ``dge_mode``, ``transpose`` (DMA transpose).
    ``program`` is the SPMD program / logical-core index that issued it. Records the
    simulator makes share their operands, attrs (an :class:`Attrs`) and location with
    identical records (:class:`RecordTable`).
    """

    index: int
    opcode: str
    engine: str
    reads: tuple[Operand, ...]
    writes: tuple[Operand, ...]
    attrs: Mapping[str, Any] = field(default_factory=dict)
    location: SourceLocation | None = None
    program: int = 0
    flops: int = 0  # useful floating-point operations (2*M*N*K for a matmul)


# Operand fields worth sharing between distinct operands (tuples, and ints past CPython's small-int cache).
_SHARED_FIELDS = ("shape", "extent", "free_elements", "row_bytes", "partitions", "allocation")


class RecordTable:
    """One run's tables of record parts, so identical parts are stored once.

    :meth:`KernelRun.record <torchneuron.nki.context.KernelRun.record>` passes each new
    record's operands, attrs and location through it. The tables live while the run
    does and go at ``KernelRun.release``; the records keep the shared objects.
    """

    __slots__ = ("_operands", "_operand_tuples", "_values", "_attrs", "_locations")

    def __init__(self) -> None:
        self._operands: dict[Operand, Operand] = {}
        self._operand_tuples: dict[tuple[Operand, ...], tuple[Operand, ...]] = {}
        self._values: dict[Any, Any] = {}  # ints and int tuples inside operands
        self._attrs: dict[tuple, Attrs] = {}
        self._locations: dict[SourceLocation, SourceLocation] = {}

    def operands(self, operands: tuple[Operand, ...]) -> tuple[Operand, ...]:
        """``operands`` as a shared tuple of shared operands."""
        shared = self._operand_tuples.get(operands)
        if shared is None:
            shared = tuple(map(self.operand, operands))
            self._operand_tuples[shared] = shared
        return shared

    def operand(self, operand: Operand) -> Operand:
        shared = self._operands.get(operand)
        if shared is None:
            values = self._values
            for name in _SHARED_FIELDS:
                value = getattr(operand, name)
                kind = type(value)
                if kind is tuple or (kind is int and not -5 <= value <= 256):
                    object.__setattr__(operand, name, values.setdefault(value, value))  # equal, not yet shared
            shared = self._operands[operand] = operand
        return shared

    def attrs(self, attrs: Mapping[str, Any]) -> Attrs:
        """``attrs`` as a shared read-only :class:`Attrs` (a private one when a value is unhashable)."""
        if not attrs:
            key: tuple = ()
        else:
            key = tuple((k, type(v), v) for k, v in attrs.items())  # type: 0, 0.0 and False are equal
        try:
            shared = self._attrs.get(key)
        except TypeError:  # a list (depends_on, a pattern): this record's own
            return attrs if type(attrs) is Attrs else Attrs(attrs)
        if shared is None:
            shared = self._attrs[key] = attrs if type(attrs) is Attrs else Attrs(attrs)
        return shared

    def location(self, location: SourceLocation | None) -> SourceLocation | None:
        if location is None:
            return None
        return self._locations.setdefault(location, location)

    def update_attrs(self, instruction: Instruction, **changes: Any) -> None:
        """Give ``instruction`` its attrs with ``changes`` applied (its old attrs may be shared)."""
        self.set_attrs(instruction, {**instruction.attrs, **changes})

    def set_attrs(self, instruction: Instruction, attrs: Mapping[str, Any]) -> None:
        instruction.attrs = self.attrs(attrs)
