"""What fills a neuron device, by category, and the explanation an out-of-memory error carries.

The allocator knows blocks, not what they are for; PyTorch's objects do. A block
belongs to a *parameter* if an ``nn.Parameter`` (or a tensor an optimizer
updates) lives in its storage, to a *gradient* if such a tensor's ``.grad`` does,
to *optimizer state* if an ``Optimizer.state`` tensor does, to *buffers* if a
module's buffer does; every other live tensor (saved activations, inputs,
outputs, temporaries) is *activations and other tensors*. Size-class rounding
(allocated - requested) and cached blocks (reserved - allocated) are the
allocator's own overhead, so the categories add up to the reserved bytes, and
all but the cache to the allocated bytes.

Out of memory, :func:`install`'s hook appends this breakdown to the
``torch.OutOfMemoryError`` raised by the allocator (C++), with what the same
program would get at the other LNC setting and on the other chip (figures from
:mod:`torchneuron.hardware`, i.e. trainium-facts.md). Hook: torch.OutOfMemoryError
has no public way to extend its message, so its ``__init__`` (torch 2.13.0,
CPython 3.11) is wrapped. The exception is built when Python first handles it,
while the traceback still holds the failing frames' tensors, so the figures are
those of the failure except what only C++ held (a failing op's temporaries,
gradients in flight in backward): the text says how much that was. Messages
that are not the neuron allocator's pass through untouched; the explanation
only reads Python objects and allocator statistics (no device work, no record).
"""

from __future__ import annotations

import gc
import re
from dataclasses import asdict, dataclass
from typing import Any, Iterator

import torch

from torchneuron import _C
from torchneuron.device._core import Device, device_index, topology
from torchneuron.hardware import CHIPS

__all__ = ["CategoryBytes", "Fit", "MemoryBreakdown", "OomExplanation", "SiteBytes", "LiveBlock", "explain_oom",
           "install", "largest_blocks", "memory_breakdown", "memory_by_site", "what_would_fit"]

PARAMETERS = "parameters"
GRADIENTS = "gradients"
OPTIMIZER_STATE = "optimizer state"
BUFFERS = "buffers"
ACTIVATIONS = "activations and other tensors"
ROUNDING = "size-class rounding"
CACHED = "cached, unallocated"
CATEGORIES = (PARAMETERS, GRADIENTS, OPTIMIZER_STATE, BUFFERS, ACTIVATIONS, ROUNDING, CACHED)

_HINTS = {
    PARAMETERS: "shard the parameters (FSDP2's fully_shard) or keep them in bfloat16",
    GRADIENTS: "shard the gradients (FSDP2) or accumulate them in bfloat16",
    OPTIMIZER_STATE: "shard the optimizer state (FSDP2, ZeroRedundancyOptimizer) or use an "
                     "optimizer with less state (SGD, Adafactor)",
    BUFFERS: "keep large module buffers off the device or in a smaller dtype",
    ACTIVATIONS: "use a smaller batch or sequence, or recompute activations in backward "
                 "(torch.utils.checkpoint)",
    ROUNDING: "allocate fewer, larger tensors (requests under 16 MiB are rounded up to size classes)",
    CACHED: "call torch.neuron.empty_cache() (the allocator already does before failing)",
}

_SITES_LISTED = 8  # (site, category) lines in an OOM message
_NO_SITES_HINT = ("By allocation site: not recorded; call torch.neuron.memory._record_memory_history() "
                  "before the run (or run it under `torchneuron check`) to list live memory by the line "
                  "that allocated it")
_PREFIX = "Neuron out of memory."  # the C++ allocator's message (csrc/runtime/allocator.cpp)
_MARKER = "\nWhat fills neuron:"
_UNITS = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}


@dataclass(frozen=True)
class CategoryBytes:
    """One category of a device's memory: its bytes and how many storages hold them."""

    name: str
    bytes: int
    storages: int


@dataclass(frozen=True)
class SiteBytes:
    """Live bytes one allocation site (the user's ``file:line in function``) holds in one category."""

    site: str
    category: str
    bytes: int
    blocks: int


@dataclass(frozen=True)
class LiveBlock:
    """One live allocator block: its size, what holds it and (while memory history records
    stacks) where it was allocated."""

    bytes: int
    category: str
    site: str  # "" unless torch.neuron.memory._record_memory_history() recorded its stack


@dataclass(frozen=True)
class Fit:
    """Whether ``need_bytes`` fits one device of ``chip`` at ``lnc``, within this process's limit."""

    chip: str
    lnc: int
    device_hbm_bytes: int  # one logical core's HBM (trainium-facts.md: Chips table)
    limit_bytes: int  # that times this process's memory fraction
    need_bytes: int
    fits: bool
    current: bool  # the configuration this process models


@dataclass(frozen=True)
class MemoryBreakdown:
    """A device's memory by category; the categories sum to ``reserved``."""

    device: int
    capacity: int
    allocated: int
    reserved: int
    categories: tuple[CategoryBytes, ...]

    def bytes_of(self, name: str) -> int:
        """Bytes of the category ``name`` (one of :data:`CATEGORIES`)."""
        return next(c.bytes for c in self.categories if c.name == name)

    @property
    def largest(self) -> CategoryBytes:
        """The category holding the most bytes."""
        return max(self.categories, key=lambda c: c.bytes)

    def as_dict(self) -> dict[str, Any]:
        """Plain data (for JSON reports)."""
        return {**asdict(self), "categories": [asdict(c) for c in self.categories],
                "largest": self.largest.name, "hint": _HINTS[self.largest.name]}

    def table(self) -> str:
        """One line per non-empty category, largest first, with its share of the allocated bytes."""
        lines = []
        for c in sorted(self.categories, key=lambda c: -c.bytes):
            if c.bytes == 0:
                continue
            share = f"{c.bytes / self.allocated:6.1%} of allocated" if c.name != CACHED and self.allocated else ""
            held = f"{c.storages} storage{'s' * (c.storages != 1)}" if c.storages else ""
            lines.append(f"  {c.name:<31}{format_bytes(c.bytes):>12}  {held:<14}{share}")
        return "\n".join(lines)


def format_bytes(n: int) -> str:
    """Bytes in the allocator message's style (``30.00 MiB``)."""
    value, unit = float(n), "B"
    for unit in _UNITS:
        if abs(value) < 1024 or unit == "TiB":
            break
        value /= 1024
    return f"{value:.0f} B" if unit == "B" else f"{value:.2f} {unit}"


def _tensors_in(value: Any) -> Iterator[torch.Tensor]:
    """Tensors in an optimizer state entry (a tensor, or dicts/lists/tuples of them)."""
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from _tensors_in(v)
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _tensors_in(v)


def _owned_tensors() -> dict[str, list[torch.Tensor]]:
    """Parameters, gradients, optimizer state and buffers of every live module and optimizer."""
    params: dict[int, torch.Tensor] = {}
    state: list[torch.Tensor] = []
    buffers: list[torch.Tensor] = []
    for obj in gc.get_objects():
        kind = type(obj)  # type(), not isinstance(): some objects warn when asked for __class__
        if issubclass(kind, torch.nn.Parameter):
            params[id(obj)] = obj
        elif issubclass(kind, torch.optim.Optimizer):
            for group in obj.param_groups:
                for p in group.get("params", ()):
                    if isinstance(p, torch.Tensor):
                        params[id(p)] = p
            for entry in obj.state.values():
                state.extend(_tensors_in(entry))
        elif issubclass(kind, torch.nn.Module):
            buffers.extend(b for b in obj._buffers.values() if b is not None)
    grads = [p.grad for p in params.values() if p.grad is not None]
    return {PARAMETERS: list(params.values()), GRADIENTS: grads, OPTIMIZER_STATE: state,
            BUFFERS: buffers}


def _local(t: torch.Tensor) -> torch.Tensor:
    """The tensor holding ``t``'s bytes on this rank: a DTensor's (FSDP2's, tensor parallel's)
    local shard, which a Parameter may wrap; any other tensor itself."""
    local = getattr(t, "_local_tensor", None)  # DTensor's attribute (torch 2.13.0)
    return local if isinstance(local, torch.Tensor) else t


def _storage_on(t: torch.Tensor, index: int) -> tuple[int, int] | None:
    """(data pointer, bytes) of ``t``'s storage (a DTensor's local shard's) if it is on
    ``neuron:index``, else None."""
    t = _local(t)
    try:
        if t.device.type != "neuron" or t.device.index != index:
            return None
        storage = t.untyped_storage()
        return (storage.data_ptr(), storage.nbytes()) if storage.nbytes() else None
    except (RuntimeError, NotImplementedError, TypeError):  # tensor subclasses without one storage
        return None


def _owned_storages(index: int) -> dict[str, dict[int, int]]:
    """{category: {storage data pointer: bytes}} of the owned categories on ``neuron:index``;
    a storage shared by several categories is in the first of parameters, gradients,
    optimizer state, buffers."""
    seen: set[int] = set()
    owned: dict[str, dict[int, int]] = {}
    for name, tensors in _owned_tensors().items():
        storages = owned.setdefault(name, {})
        for t in tensors:
            storage = _storage_on(t, index)
            if storage is None or storage[0] in seen:
                continue
            seen.add(storage[0])
            storages[storage[0]] = storage[1]
    return owned


def memory_breakdown(device: Device = None) -> MemoryBreakdown:
    r"""Return what fills a neuron device now, by category (see the module docstring).

    A storage shared by several categories counts once, in the first of parameters,
    gradients, optimizer state, buffers. Call ``gc.collect()`` first to leave out
    tensors only unreachable cycles hold.

    Args:
        device (torch.device or int, optional): the current device if ``None``.
    """
    index = device_index(device)
    stats = torch.neuron.memory_stats(index)
    allocated = stats.get("allocated_bytes.all.current", 0)
    reserved = stats.get("reserved_bytes.all.current", 0)
    requested = stats.get("requested_bytes.all.current", 0)
    owned = [CategoryBytes(name, sum(storages.values()), len(storages))
             for name, storages in _owned_storages(index).items()]
    rest = max(0, requested - sum(c.bytes for c in owned))
    categories = (*owned, CategoryBytes(ACTIVATIONS, rest, 0),
                  CategoryBytes(ROUNDING, max(0, allocated - max(requested, sum(c.bytes for c in owned))), 0),
                  CategoryBytes(CACHED, max(0, reserved - allocated), 0))
    return MemoryBreakdown(index, _C._capacity(index), allocated, reserved, categories)


def live_blocks(index: int | None = None) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(block, segment) of each live block in the allocator's snapshot, of device ``index``
    (every device if None): what the site and size views below read."""
    return [(block, segment) for segment in _C._memory_snapshot(False)["segments"]
            if index is None or segment["device"] == index
            for block in segment["blocks"] if block["state"] == "active_allocated"]


def block_site(block: dict[str, Any], segment: dict[str, Any]) -> str:
    """The user's line that allocated a live block (from the stacks memory history records)."""
    from torchneuron.device import memory_history

    return memory_history.user_call_site(block.get("frames") or segment.get("frames") or [])


def memory_by_site(device: Device = None) -> list[SiteBytes]:
    r"""Return the live memory of a neuron device by (allocation site, category), most bytes
    first; empty unless :func:`torch.neuron.memory._record_memory_history` records stacks.

    A block's site is the innermost frame of the user's code when it was allocated (blocks
    allocated before recording started share one site); its category is that of the
    storage living in it (:func:`memory_breakdown`'s), activations and other tensors if none.
    Bytes are the allocator's block sizes, so they add up to the allocated bytes.

    Args:
        device (torch.device or int, optional): the current device if ``None``.
    """
    from torchneuron.device import memory_history

    index = device_index(device)
    if not memory_history.is_recording():
        return []
    category_of = {ptr: name for name, storages in _owned_storages(index).items() for ptr in storages}
    totals: dict[tuple[str, str], list[int]] = {}
    for block, segment in live_blocks(index):
        total = totals.setdefault((block_site(block, segment), category_of.get(block["address"], ACTIVATIONS)),
                                  [0, 0])
        total[0] += block["size"]
        total[1] += 1
    sites = [SiteBytes(site, category, n, blocks) for (site, category), (n, blocks) in totals.items()]
    return sorted(sites, key=lambda s: -s.bytes)


_BLOCKS_LISTED = 5  # largest live blocks in an OOM message


def largest_blocks(device: Device = None, n: int = _BLOCKS_LISTED) -> list[LiveBlock]:
    r"""Return the ``n`` largest live blocks of a neuron device, largest first, each with its
    category (:func:`memory_breakdown`'s) and, while memory history records stacks, its
    allocation site: one tensor that is most of the memory shows here by itself.

    Args:
        device (torch.device or int, optional): the current device if ``None``.
        n (int): how many blocks.
    """
    from torchneuron.device import memory_history

    index = device_index(device)
    blocks = sorted(live_blocks(index), key=lambda bs: -bs[0]["size"])[:max(0, n)]
    if not blocks:
        return []
    category_of = {ptr: name for name, storages in _owned_storages(index).items() for ptr in storages}
    recording = memory_history.is_recording()
    return [LiveBlock(block["size"], category_of.get(block["address"], ACTIVATIONS),
                      block_site(block, segment) if recording else "")
            for block, segment in blocks]


def what_would_fit(need_bytes: int, device: Device = None) -> list[Fit]:
    r"""Whether ``need_bytes`` fits one device at each chip's each LNC setting.

    Each device's limit is its HBM (a chip's HBM over its logical cores,
    trainium-facts.md) times the memory fraction this process has on ``device``
    (:func:`torch.neuron.set_per_process_memory_fraction`), as the same program
    would set it there. Trainium2 and Trainium3 only (the chips TorchNeuron supports).
    """
    index = device_index(device)
    topo = topology()
    fraction = _C._capacity(index) / topo.devices[index].hbm_bytes
    fits = []
    for chip in (CHIPS["trn2"], CHIPS["trn3"]):
        for lnc in sorted(chip.supported_lnc, reverse=True):
            hbm = chip.hbm_bytes_per_chip // (chip.physical_cores_per_chip // lnc)
            limit = int(hbm * fraction)
            fits.append(Fit(chip.name, lnc, hbm, limit, need_bytes, need_bytes <= limit,
                            chip.name == topo.chip.name and lnc == topo.lnc))
    return fits


def _parse_bytes(text: str) -> int:
    number, unit = text.split()
    return int(float(number) * _UNITS[unit])


@dataclass(frozen=True)
class OomExplanation:
    """What an out-of-memory error adds: the breakdown, the failed request, what would fit."""

    breakdown: MemoryBreakdown  # when the error reached Python
    request_bytes: int  # the allocation that failed (3 significant digits, from the message)
    allocated_at_failure: int  # at least breakdown.allocated
    fits: tuple[Fit, ...]  # one device at each chip's each LNC setting
    sites: tuple[SiteBytes, ...] = ()  # by allocation site and category, with _record_memory_history
    # The largest live blocks, largest first, with their categories: for reports (JSON,
    # torchneuron check); the message has their sizes from the allocator's own line.
    largest_blocks: tuple[LiveBlock, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        """Plain data (for JSON reports)."""
        return {"breakdown": self.breakdown.as_dict(), "request_bytes": self.request_bytes,
                "allocated_at_failure": self.allocated_at_failure,
                "need_bytes": self.allocated_at_failure + self.request_bytes,
                "fits": [asdict(f) for f in self.fits], "sites": [asdict(s) for s in self.sites],
                "largest_blocks": [asdict(b) for b in self.largest_blocks]}

    def text(self) -> str:
        """The lines appended to the allocator's message."""
        b = self.breakdown
        largest = b.largest
        lines = [f"{_MARKER[1:]}{b.device} when the error reached Python (allocated "
                 f"{format_bytes(b.allocated)}, reserved {format_bytes(b.reserved)}, "
                 f"capacity {format_bytes(b.capacity)}):",
                 b.table()]
        unwound = self.allocated_at_failure - b.allocated
        if unwound > 0:
            lines.append(f"  (about {format_bytes(unwound)} more, held inside the failing op or "
                         f"backward pass, was freed as the error unwound)")
        if self.sites:
            lines.append(f"By allocation site and category (most bytes first, {_SITES_LISTED} at most):")
            for site in self.sites[:_SITES_LISTED]:
                held = f"{site.blocks} block{'s' * (site.blocks != 1)}"
                lines.append(f"  {format_bytes(site.bytes):>12} in {held:<10} {site.category:<31}at {site.site}")
        else:
            lines.append(_NO_SITES_HINT)
        lines.append(f"Largest: {largest.name}, {format_bytes(largest.bytes)}: {_HINTS[largest.name]}.")
        scaled = any(f.limit_bytes != f.device_hbm_bytes for f in self.fits)
        lines.append(f"The same program needs about {format_bytes(self.allocated_at_failure + self.request_bytes)}"
                     f" on one device (allocated at the failure plus this request); one device of"
                     + (" (its HBM x this process's memory fraction):" if scaled else ":"))
        for f in self.fits:
            limit = format_bytes(f.limit_bytes) + (f" of {format_bytes(f.device_hbm_bytes)}" if scaled else "")
            verdict = "fits" if f.fits else "does not fit"
            lines.append(f"  {f.chip} LNC={f.lnc}: {limit}: {verdict}{' (this run)' if f.current else ''}")
        return "\n".join(lines)


def _allocated_at_failure(message: str, device: int) -> int | None:
    """Allocated bytes when the allocator failed: the message gives them to 3 significant
    digits; the peak statistic is the exact figure when it agrees (the usual case: memory
    grows until it runs out)."""
    match = re.search(r"Of the reserved memory ([0-9.]+ (?:B|KiB|MiB|GiB|TiB)) is allocated", message)
    if match is None:
        return None
    stated = _parse_bytes(match.group(1))
    unit = _UNITS[match.group(1).split()[1]]
    peak = torch.neuron.memory_stats(device).get("allocated_bytes.all.peak", 0)
    return peak if abs(peak - stated) <= unit // 200 else stated


def explain_oom(message: str) -> OomExplanation | None:
    """The explanation of a neuron allocator's OOM ``message``, or None if it is not one
    (or already carries one)."""
    if not message.startswith(_PREFIX) or _MARKER in message:
        return None
    device = re.search(r"neuron:(\d+)", message)
    request = re.search(r"Tried to allocate ([0-9.]+ (?:B|KiB|MiB|GiB|TiB))", message)
    if device is None or request is None:
        return None
    index = int(device.group(1))
    breakdown = memory_breakdown(index)
    request_bytes = _parse_bytes(request.group(1))
    at_failure = max(breakdown.allocated, _allocated_at_failure(message, index) or 0)
    fits = tuple(what_would_fit(at_failure + request_bytes, index))
    return OomExplanation(breakdown, request_bytes, at_failure, fits, tuple(memory_by_site(index)),
                          tuple(largest_blocks(index)))


_original_init = None


def _init_with_explanation(self: torch.OutOfMemoryError, *args: Any) -> None:
    _original_init(self, *args)
    if len(args) != 1 or not isinstance(args[0], str):
        return
    try:
        explanation = explain_oom(args[0])
    except Exception as error:  # noqa: BLE001 (never replace the OOM with our own failure)
        self.args = (f"{args[0]}\n(torchneuron could not break the memory down: "
                     f"{type(error).__name__}: {error})",)
        return
    if explanation is not None:
        self.args = (args[0] + "\n" + explanation.text(),)
        self.memory_explanation = explanation  # for torchneuron check and programs


def install() -> None:
    """Makes neuron OOM errors explain themselves (idempotent)."""
    global _original_init
    if _original_init is None:
        _original_init = torch.OutOfMemoryError.__init__
        torch.OutOfMemoryError.__init__ = _init_with_explanation
