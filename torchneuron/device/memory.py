"""Memory statistics and control of neuron devices, shaped like torch.cuda.memory.

:func:`memory_stats` is the one source of truth; every other statistic reads
one of its keys (CUDA's key names).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import torch

from torchneuron import _C
from torchneuron.device._core import Device, device_index, topology
from torchneuron.device.memory_history import (  # noqa: F401 (torch.cuda.memory's private names)
    _dump_snapshot,
    _record_memory_history,
    _snapshot,
    memory_snapshot,
)

__all__ = [
    "empty_cache",
    "get_per_process_memory_fraction",
    "max_memory_allocated",
    "max_memory_cached",
    "max_memory_reserved",
    "mem_get_info",
    "memory_allocated",
    "memory_cached",
    "memory_snapshot",
    "memory_reserved",
    "memory_stats",
    "memory_stats_as_nested_dict",
    "memory_summary",
    "reset_accumulated_memory_stats",
    "reset_max_memory_allocated",
    "reset_max_memory_cached",
    "reset_peak_memory_stats",
    "set_per_process_memory_fraction",
]


def memory_stats(device: Device = None) -> OrderedDict[str, Any]:
    r"""Return the caching allocator's statistics for a device, with CUDA's keys.

    Args:
        device (torch.device or int, optional): selected device. The current
            device if ``None`` (default).
    """
    return torch.accelerator.memory_stats(device_index(device))


def memory_stats_as_nested_dict(device: Device = None) -> dict[str, Any]:
    r"""Return :func:`memory_stats` as a nested dictionary (``a.b.c`` -> ``[a][b][c]``)."""
    nested: dict[str, Any] = {}
    for key, value in memory_stats(device).items():
        node = nested
        *parents, leaf = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return nested


def _stat(key: str, device: Device) -> int:
    return memory_stats(device).get(key, 0)


def memory_allocated(device: Device = None) -> int:
    r"""Bytes currently occupied by tensors on the device."""
    return _stat("allocated_bytes.all.current", device)


def max_memory_allocated(device: Device = None) -> int:
    r"""Peak bytes occupied by tensors since start or :func:`reset_peak_memory_stats`."""
    return _stat("allocated_bytes.all.peak", device)


def memory_reserved(device: Device = None) -> int:
    r"""Bytes held by the caching allocator (allocated plus cached)."""
    return _stat("reserved_bytes.all.current", device)


def max_memory_reserved(device: Device = None) -> int:
    r"""Peak bytes held by the caching allocator."""
    return _stat("reserved_bytes.all.peak", device)


def memory_cached(device: Device = None) -> int:
    r"""Deprecated alias of :func:`memory_reserved`, as in torch.cuda."""
    return memory_reserved(device)


def max_memory_cached(device: Device = None) -> int:
    r"""Deprecated alias of :func:`max_memory_reserved`, as in torch.cuda."""
    return max_memory_reserved(device)


def reset_peak_memory_stats(device: Device = None) -> None:
    r"""Reset the peak ("max") statistics of a device."""
    torch.accelerator.reset_peak_memory_stats(device_index(device))


def reset_max_memory_allocated(device: Device = None) -> None:
    r"""Reset peak statistics (torch.cuda's older name)."""
    reset_peak_memory_stats(device)


def reset_max_memory_cached(device: Device = None) -> None:
    r"""Reset peak statistics (torch.cuda's older name)."""
    reset_peak_memory_stats(device)


def reset_accumulated_memory_stats(device: Device = None) -> None:
    r"""Reset the accumulated ("allocated"/"freed") counters of a device."""
    torch.accelerator.reset_accumulated_memory_stats(device_index(device))


def empty_cache() -> None:
    r"""Release cached, unoccupied memory of every device.

    Live tensors are untouched; only :func:`memory_reserved` drops.
    """
    torch.accelerator.empty_cache()


def mem_get_info(device: Device = None) -> tuple[int, int]:
    r"""Return ``(free, total)`` bytes of a device.

    ``total`` is the device's capacity (its HBM, or less after
    :func:`set_per_process_memory_fraction`); ``free`` is what the allocator
    has not reserved.
    """
    return torch.accelerator.get_memory_info(device_index(device))


def set_per_process_memory_fraction(fraction: float, device: Device = None) -> None:
    r"""Limit this process to ``fraction`` of a device's HBM.

    Going over the limit raises :class:`torch.OutOfMemoryError`, as on CUDA.

    Args:
        fraction (float): in ``[0, 1]``.
        device (torch.device or int, optional): the current device if ``None``.
    """
    index = device_index(device)
    if not isinstance(fraction, (int, float)) or not 0 <= fraction <= 1:
        raise ValueError(f"Invalid fraction value: {fraction}. Allowed range: 0~1")
    total = topology().devices[index].hbm_bytes
    _C._set_capacity(index, int(total * fraction))


def get_per_process_memory_fraction(device: Device = None) -> float:
    r"""Return the fraction of the device's HBM this process may use."""
    index = device_index(device)
    return _C._capacity(index) / topology().devices[index].hbm_bytes


def _format_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def memory_summary(device: Device = None, abbreviated: bool = False) -> str:
    r"""Return a printable table of the allocator's statistics for a device.

    Args:
        device (torch.device or int, optional): the current device if ``None``.
        abbreviated (bool, optional): only the ``all`` pool if ``True``.
    """
    index = device_index(device)
    stats = memory_stats(index)
    rows = [
        ("Allocated memory", "allocated_bytes", True),
        ("Active memory", "active_bytes", True),
        ("Requested memory", "requested_bytes", True),
        ("Device reserved memory", "reserved_bytes", True),
        ("Allocations", "allocation", False),
        ("Active allocs", "active", False),
        ("Device reserved segments", "segment", False),
    ]
    pools = ("all",) if abbreviated else ("all", "large_pool", "small_pool")
    fmt = _format_bytes
    width = 75
    lines = [
        "=" * width,
        f" PyTorch neuron memory summary, device ID {index}".ljust(width),
        f" capacity {fmt(_C._capacity(index))}, OOMs: {stats.get('num_ooms', 0)}, "
        f"cache flushes: {stats.get('num_alloc_retries', 0)}",
        "-" * width,
        f"{'Metric':<28}{'Cur Usage':>12}{'Peak Usage':>12}{'Tot Alloc':>12}{'Tot Freed':>12}",
        "-" * width,
    ]
    for title, key, is_bytes in rows:
        for pool in pools:
            label = title if pool == "all" else f"  from {pool.replace('_pool', '')} pool"
            vals = [stats.get(f"{key}.{pool}.{k}", 0) for k in ("current", "peak", "allocated", "freed")]
            cells = [fmt(v) if is_bytes else str(v) for v in vals]
            lines.append(f"{label:<28}" + "".join(f"{c:>12}" for c in cells))
    lines.append("=" * width)
    return "\n".join(lines) + "\n"
