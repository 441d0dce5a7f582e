"""Kernel memory: buffers, allocations, on-chip capacity and uninitialised memory.

Every allocation owns a numpy array in its storage dtype and a parallel
*written mask* (same shape, an unsigned type of the same size, so bit-level
``.view(dtype)`` reinterpretations keep working). Fresh on-chip and HBM
allocations are filled as AWS's simulator fills them - NaN for floats, 4 for
integers (nki-api-facts.md: 8) - and the mask lets an instruction that reads
never-written memory be reported.

Capacity is checked per target, which AWS's simulator does not do
(nki-api-facts.md: 6 rule 9): SBUF bytes per partition and PSUM banks
(8 x 2 KiB per partition). A tile is live from the first to the last
instruction that touches it, as the compiler's liveness-based allocator sees
it, so the check runs over the instruction log when the kernel has finished.
"""

from __future__ import annotations

import enum
import itertools
import math
from dataclasses import dataclass, field, replace

import numpy as np

from torchneuron.nki.dtypes import NkiDType, host_storage, uint_of_size
from torchneuron.nki.errors import NkiValidationError, fail

__all__ = ["Buffer", "Allocation", "OnChipMemory", "PSUM_BANK_BYTES", "fill_uninitialized"]

PSUM_BANK_BYTES = 2048  # nki-api-facts.md: 3.9 psum_bank_fmax_bytes


class Buffer(enum.Enum):
    """NKI memory regions (``nl.sbuf``, ``nl.psum``, ``nl.private_hbm``/``nl.hbm``, ``nl.shared_hbm``)."""

    sbuf = "sbuf"
    psum = "psum"
    private_hbm = "private_hbm"
    shared_hbm = "shared_hbm"

    @property
    def on_chip(self) -> bool:
        return self in (Buffer.sbuf, Buffer.psum)

    @property
    def is_hbm(self) -> bool:
        return not self.on_chip

    def __repr__(self) -> str:
        return f"nl.{self.value}"


_ids = itertools.count(1)
_NO_VALUES = np.empty(0)  # storage of the placement records OnChipMemory keeps


def fill_uninitialized(shape: tuple[int, ...], dtype: NkiDType, storage: np.dtype | None = None) -> np.ndarray:
    """A fresh array as AWS's simulator hands out: NaN for floats, 4 for integers."""
    storage = dtype.storage if storage is None else storage
    if dtype.is_float and dtype.name != "float8_e8m0fnu":
        return np.full(shape, np.nan, dtype=storage)
    if dtype.name == "float8_e8m0fnu":
        return np.full(shape, 4.0, dtype=storage)
    return np.full(shape, 4, dtype=storage)


@dataclass(eq=False)
class Allocation:
    """One allocation: its storage, written-mask and placement."""

    buffer: Buffer
    shape: tuple[int, ...]
    dtype: NkiDType
    name: str
    data: np.ndarray
    written: np.ndarray
    start_partition: int = 0
    free_offset: int = 0  # bytes, within each partition (on-chip)
    banks: tuple[int, ...] = ()  # PSUM banks it occupies
    address: tuple[int, int] | None = None  # (partition, byte offset) given with address=, else None
    id: int = field(default_factory=lambda: next(_ids))

    @property
    def partitions(self) -> int:
        return self.shape[0] if self.shape else 1

    @property
    def bytes_per_partition(self) -> int:
        return math.prod(self.shape[1:]) * self.dtype.itemsize

    @classmethod
    def create(cls, buffer: Buffer, shape: tuple[int, ...], dtype: NkiDType, name: str,
               initial: np.ndarray | None = None, fill: bool = True, precise: bool = True) -> "Allocation":
        """A new allocation holding ``initial`` (written), or fresh memory (NaN/4-filled unless
        ``fill`` is False: shape-only runs never look at values). ``precise=False`` holds a
        low-precision float tile in float32 (``NKI_PRECISE_FP=0``; its device size is unchanged)."""
        if initial is None:
            storage = host_storage(dtype, precise)
            data = fill_uninitialized(shape, dtype, storage) if fill else np.empty(shape, dtype=storage)
            written = np.zeros(shape, dtype=uint_of_size(dtype.storage.itemsize))
        else:
            data = initial
            written = np.full(shape, np.iinfo(uint_of_size(dtype.storage.itemsize)).max,
                              dtype=uint_of_size(dtype.storage.itemsize))
        return cls(buffer, shape, dtype, name, data, written)


class OnChipMemory:
    """SBUF and PSUM of one NeuronCore for one kernel run, checked over live ranges.

    A tile occupies on-chip memory from the first instruction that touches it
    to the last one, as the compiler's liveness-based allocator places it
    (a tile rebound in a loop reuses its space; a tile never used takes none).
    :meth:`check` sweeps the instruction log once the kernel has run: at every
    instruction the live tiles must fit SBUF's bytes per partition, and PSUM's
    ``banks`` banks of 2 KiB per partition - a tile up to one bank lives inside
    one bank (small tiles share a bank), a larger one takes whole contiguous
    banks. ``address=(partition, offset)`` counts the offset in bytes, as AWS's
    allocators do; tiles given one must not overlap another live one, PSUM
    addresses must start on a bank boundary, and automatically placed PSUM tiles
    move out of the banks a later ``address=`` names. Per-tile limits are checked at
    allocation, at the line that allocates.
    """

    def __init__(self, sbuf_bytes_per_partition: int, psum_banks: int, partitions: int = 128,
                 target_name: str = "") -> None:
        self.sbuf_capacity = sbuf_bytes_per_partition
        self.psum_banks = psum_banks
        self.partitions = partitions
        self.target_name = target_name
        self.tiles: dict[int, Allocation] = {}
        self.manual: set[int] = set()
        self._legacy = False  # set by check()
        self.sbuf_peak = 0  # bytes per partition, after check()
        self.psum_peak_banks = 0

    def place(self, alloc: Allocation, address: tuple[int, int] | None, owner: object = None) -> None:
        """Register an on-chip tile; raises at once if the tile alone can never fit."""
        if not alloc.buffer.on_chip:
            return
        start = address[0] if address else 0
        self._check_partitions(alloc, start)
        alloc.start_partition = start
        size = alloc.bytes_per_partition
        offset = address[1] if address else 0  # bytes within each partition (module docstring)
        if offset < 0:
            fail("allocation", f"address=({start}, {offset}) of {alloc.name!r} has a negative free offset; the "
                 "offset counts bytes from the start of each partition")
        if alloc.buffer is Buffer.sbuf:
            if offset + size > self.sbuf_capacity:
                fail("allocation", f"SBUF tile {alloc.name!r} needs {size} B per partition"
                     + (f" at free offset {offset} B" if address else "")
                     + f", more than SBUF's {self.sbuf_capacity} B per partition on {self.target_name}; "
                     "tile the data into smaller pieces")
            alloc.free_offset = offset
        else:
            nbanks = -(-size // PSUM_BANK_BYTES)
            if nbanks > self.psum_banks:
                fail("allocation", f"PSUM tile {alloc.name!r} needs {size} B per partition but PSUM has "
                     f"{self.psum_banks} banks x {PSUM_BANK_BYTES} B per partition on {self.target_name}")
            if offset % PSUM_BANK_BYTES:
                fail("allocation", f"PSUM allocation {alloc.name!r} must start at a bank boundary "
                     f"(multiple of {PSUM_BANK_BYTES} B, bank k at k * {PSUM_BANK_BYTES}); got free offset "
                     f"{offset} B, {offset % PSUM_BANK_BYTES} B into bank {offset // PSUM_BANK_BYTES}")
            first = offset // PSUM_BANK_BYTES
            if first + nbanks > self.psum_banks:
                fail("allocation", f"PSUM banks {first}..{first + nbanks - 1} for {alloc.name!r} are out of "
                     f"range (PSUM has {self.psum_banks} banks)")
            alloc.free_offset = offset
            alloc.banks = tuple(range(first, first + nbanks))
        # Keep the placement only: holding the Allocation would keep every tile's storage alive until
        # the run ends (gigabytes for big kernels); the check needs no values.
        self.tiles[alloc.id] = replace(alloc, data=_NO_VALUES, written=_NO_VALUES)
        if address is not None:
            self.manual.add(alloc.id)
            alloc.address = (start, offset)

    def _check_partitions(self, alloc: Allocation, start: int) -> None:
        if alloc.partitions > self.partitions:
            fail("allocation", f"size of partition dimension {alloc.partitions} exceeds architecture "
                 f"limitation of {self.partitions} (tensor {alloc.name!r}, shape {list(alloc.shape)}); "
                 "split the tile into pieces of at most 128 partitions")
        if start < 0 or start + alloc.partitions > self.partitions:
            fail("allocation", f"partitions {start}..{start + alloc.partitions - 1} of {alloc.name!r} "
                 f"lie outside the {self.partitions} partitions")

    def check(self, instructions: list, lifetimes: dict[int, list[int]], legacy: bool = False) -> None:
        """Sweep the run: raise at the first instruction where live tiles overflow SBUF or PSUM.

        ``legacy``: the kernel is legacy NKI, whose compiler mapped a block tensor's logical
        tiles onto fewer physical ones and could reorder ``affine_range`` loops; the overflow
        message then says that this is not simulated (the program-order count stands).
        """
        self._legacy = legacy
        starts: dict[int, list[Allocation]] = {}
        ends: dict[int, list[Allocation]] = {}
        for alloc_id, alloc in self.tiles.items():
            span = lifetimes.get(alloc_id)
            if span is None:
                continue  # never used: the compiler would not allocate it
            starts.setdefault(span[0], []).append(alloc)
            ends.setdefault(span[1], []).append(alloc)
        sbuf = np.zeros(self.partitions, dtype=np.int64)
        banks = [0] * self.psum_banks
        live: dict[int, Allocation] = {}
        for index in sorted(set(starts) | set(ends)):
            for alloc in starts.get(index, ()):
                live[alloc.id] = alloc
                if alloc.buffer is Buffer.sbuf:
                    self._take_sbuf(alloc, sbuf, live, instructions[index])
                else:
                    self._take_psum(alloc, banks, live, instructions[index])
            self.sbuf_peak = max(self.sbuf_peak, int(sbuf.max()))
            self.psum_peak_banks = max(self.psum_peak_banks, sum(1 for used in banks if used))
            for alloc in ends.get(index, ()):
                live.pop(alloc.id, None)
                if alloc.buffer is Buffer.sbuf:
                    sbuf[alloc.start_partition:alloc.start_partition + alloc.partitions] -= \
                        alloc.bytes_per_partition
                else:
                    share = alloc.bytes_per_partition if len(alloc.banks) == 1 else PSUM_BANK_BYTES
                    for bank in alloc.banks:
                        banks[bank] -= share

    def _overflow(self, instruction: object, message: str, live: dict[int, Allocation],
                  buffer: Buffer) -> None:
        largest = sorted((a for a in live.values() if a.buffer is buffer),
                         key=lambda a: -a.bytes_per_partition)[:5]
        held = ", ".join(f"{a.name!r} {a.bytes_per_partition} B" for a in largest)
        blocks = sum(1 for a in live.values() if a.buffer is buffer and a.name.endswith("]"))
        if self._legacy and blocks:
            held += (f". {blocks} of the live tiles are logical blocks of legacy block tensors (nl.par_dim): "
                     "legacy NKI's compiler mapped such blocks onto fewer physical tiles and could reorder "
                     "affine_range loops to fit them (how is not published), which torchneuron does not "
                     "simulate: in program order they do not fit, so restructure the loops so fewer blocks "
                     "are live at once")
        raise NkiValidationError(getattr(instruction, "opcode", "allocation"),
                                 f"{message}; largest live tiles: {held}",
                                 getattr(instruction, "location", None))

    def _take_sbuf(self, alloc: Allocation, sbuf: np.ndarray, live: dict[int, Allocation],
                   instruction: object) -> None:
        rows = slice(alloc.start_partition, alloc.start_partition + alloc.partitions)
        size = alloc.bytes_per_partition
        if alloc.id in self.manual:
            for other_id, other in live.items():
                if other_id != alloc.id and other_id in self.manual and other.buffer is Buffer.sbuf \
                        and _overlaps(alloc, other):
                    raise NkiValidationError(
                        getattr(instruction, "opcode", "allocation"),
                        f"SBUF tensor {alloc.name!r} at free offset {alloc.free_offset} B overlaps live "
                        f"tensor {other.name!r} (both placed with address=); choose a free address or let "
                        "the compiler place them", getattr(instruction, "location", None))
        if int((sbuf[rows] + size).max()) > self.sbuf_capacity:
            in_use = int(sbuf[rows].max())
            self._overflow(instruction, f"SBUF capacity exceeded on {self.target_name}: {alloc.name!r} needs "
                           f"{size} B per partition while live tiles hold {in_use} B of "
                           f"{self.sbuf_capacity} B per partition; tile the data into smaller pieces or end "
                           "tiles' lifetimes sooner", live, Buffer.sbuf)
        sbuf[rows] += size

    def _take_psum(self, alloc: Allocation, banks: list[int], live: dict[int, Allocation],
                   instruction: object) -> None:
        size = alloc.bytes_per_partition
        nbanks = -(-size // PSUM_BANK_BYTES)
        share = size if nbanks == 1 else PSUM_BANK_BYTES
        if alloc.id in self.manual:
            chosen = alloc.banks
            clash = [o for o in live.values() if o.id != alloc.id and o.id in self.manual
                     and o.buffer is Buffer.psum and set(o.banks) & set(chosen)]
            if clash:
                raise NkiValidationError(
                    getattr(instruction, "opcode", "allocation"),
                    f"PSUM tensor {alloc.name!r} at address= bank(s) {list(chosen)} overlaps live tensor "
                    f"{clash[0].name!r}, placed with address= in bank(s) {list(clash[0].banks)} (a PSUM "
                    "allocation starts at its bank's first byte, so two live tensors placed in one bank share "
                    "memory, which the simulator does not model); give each live PSUM tensor its own bank",
                    getattr(instruction, "location", None))
            if any(banks[b] + share > PSUM_BANK_BYTES for b in chosen):
                self._move_automatic(chosen, banks, live, instruction, alloc)
        elif nbanks == 1:
            chosen = next(((b,) for b in range(self.psum_banks) if banks[b] + size <= PSUM_BANK_BYTES), ())
        else:
            chosen = next((tuple(range(b, b + nbanks)) for b in range(self.psum_banks - nbanks + 1)
                           if not any(banks[b:b + nbanks])), ())
        if not chosen:
            held = sum(1 for used in banks if used)
            self._overflow(instruction, f"PSUM capacity exceeded on {self.target_name}: {alloc.name!r} needs "
                           f"{size} B per partition and {held} of {self.psum_banks} banks ({PSUM_BANK_BYTES} B "
                           "each per partition) are held by live PSUM tiles; copy results out of PSUM sooner "
                           "or use fewer accumulators at once", live, Buffer.psum)
        for bank in chosen:
            banks[bank] += share
        if alloc.id not in self.manual:
            alloc.banks = tuple(chosen)

    def _move_automatic(self, wanted: tuple[int, ...], banks: list[int], live: dict[int, Allocation],
                        instruction: object, alloc: Allocation) -> None:
        """Free ``wanted`` banks for a manually placed tile by moving the automatically placed live
        tiles in them to other banks, as the compiler, which sees every address= before it places
        the rest, would have put them there in the first place; fails when they fit nowhere else."""
        movers = [o for o in live.values() if o.buffer is Buffer.psum and o.id not in self.manual
                  and o.id != alloc.id and set(o.banks) & set(wanted)]
        for other in movers:
            share = other.bytes_per_partition if len(other.banks) == 1 else PSUM_BANK_BYTES
            for bank in other.banks:
                banks[bank] -= share
        blocked = set(wanted)
        for other in sorted(movers, key=lambda o: -o.bytes_per_partition):
            n = len(other.banks)
            size = other.bytes_per_partition
            if n == 1:
                spot = next(((b,) for b in range(self.psum_banks)
                             if b not in blocked and banks[b] + size <= PSUM_BANK_BYTES), ())
            else:
                spot = next((tuple(range(b, b + n)) for b in range(self.psum_banks - n + 1)
                             if not blocked & set(range(b, b + n)) and not any(banks[b:b + n])), ())
            if not spot:
                self._overflow(instruction, f"PSUM capacity exceeded on {self.target_name}: {alloc.name!r} "
                               f"needs bank(s) {list(wanted)} (address=) and the other live PSUM tiles fit "
                               f"in none of the remaining banks of {self.psum_banks}", live, Buffer.psum)
            share = size if n == 1 else PSUM_BANK_BYTES
            for bank in spot:
                banks[bank] += share
            other.banks = spot


def _overlaps(a: Allocation, b: Allocation) -> bool:
    rows = a.start_partition < b.start_partition + b.partitions and \
        b.start_partition < a.start_partition + a.partitions
    cols = a.free_offset < b.free_offset + b.bytes_per_partition and \
        b.free_offset < a.free_offset + a.bytes_per_partition
    return rows and cols


# Re-exported so callers catching allocation failures need one import.
AllocationError = NkiValidationError
