"""What the simulator records about each executed instruction, for the cost model.

The simulator (``isa``/``language``) appends one :class:`Instruction` per
device instruction it executes; :mod:`torchneuron.nki.cost` schedules them on
engines. This record is the whole contract between the two: the cost model
never looks at tensor values.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from torchneuron.hardware.engines import Engine as _HwEngine
from torchneuron.nki.errors import SourceLocation

__all__ = ["Engine", "Operand", "Instruction", "ENGINES"]


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


@dataclass(frozen=True)
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


@dataclass
class Instruction:
    """One executed device instruction.

    ``opcode`` is the ISA name (``nc_matmul``, ``tensor_tensor``, ``activation``,
    ``dma_copy``...); ``nl`` helpers record the ISA instructions they lower to.
    ``attrs`` carries what the cost formulas need beyond operand shapes, e.g.
    ``op`` (ALU / activation name), ``moving_free``, ``stationary_free``,
    ``perf_mode``, ``is_transpose``, ``dge_mode``, ``transpose`` (DMA transpose).
    ``program`` is the SPMD program / logical-core index that issued it.
    """

    index: int
    opcode: str
    engine: str
    reads: tuple[Operand, ...]
    writes: tuple[Operand, ...]
    attrs: dict[str, Any] = field(default_factory=dict)
    location: SourceLocation | None = None
    program: int = 0
    flops: int = 0  # useful floating-point operations (2*M*N*K for a matmul)
