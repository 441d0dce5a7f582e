"""Where the run's float64 and complex tensors came from: their allocation sites.

An FP64 buffer read every step shows in the report as the host fallbacks of the ops that
read it (``.float()`` copies, arithmetic), each at the op's line; the fix is at the line
that made the tensor. At the end of the script, the live float64/complex tensors on the
device that modules hold (parameters and buffers) or the script's globals name are matched,
by storage, with the allocator's blocks, whose Python stacks ``torchneuron check`` records
(``torch.neuron.memory._record_memory_history``).
"""

from __future__ import annotations

import gc
from typing import Any

import torch

# Dtypes Trainium has no type for (trainium-facts.md: Data types): a tensor of one is the
# origin of host fallbacks (int64 runs on the device as int32, so it is not listed here).
NO_TRAINIUM_TYPE = (torch.float64, torch.complex64, torch.complex128)
MAX_ORIGINS = 20


def _named_tensors(script_globals: dict[str, Any]) -> list[tuple[str, str, torch.Tensor]]:
    """(kind, name, tensor) of module parameters and buffers and of the script's global tensors."""
    found = []
    for obj in gc.get_objects():
        if issubclass(type(obj), torch.nn.Module):  # type(): some objects warn when asked __class__
            owner = type(obj).__name__
            for kind, table in (("parameter", obj._parameters), ("buffer", obj._buffers)):
                found.extend((kind, f"{owner}.{name}", t) for name, t in table.items() if t is not None)
    found.extend(("tensor", name, t) for name, t in script_globals.items()
                 if isinstance(t, torch.Tensor) and not name.startswith("_"))
    return found


def _block_sites() -> dict[tuple[int, int], str]:
    """{(device, block address): the user's allocation site} of live blocks."""
    from torchneuron.device import oom

    return {(segment["device"], block["address"]): oom.block_site(block, segment)
            for block, segment in oom.live_blocks()}


def wide_dtype_origins(script_globals: dict[str, Any]) -> list[dict[str, Any]]:
    """The live neuron tensors of a dtype Trainium lacks, with their allocation sites, one row
    per storage: ``{"kind", "name", "dtype", "bytes", "site"}`` (largest first). Empty unless
    memory history records stacks."""
    from torchneuron.device import memory_history

    if not memory_history.is_recording():
        return []
    sites = _block_sites()
    rows: dict[tuple[int, int], dict[str, Any]] = {}
    for kind, name, t in _named_tensors(script_globals):
        if t.dtype not in NO_TRAINIUM_TYPE or t.device.type != "neuron":
            continue
        key = (t.device.index or 0, t.untyped_storage().data_ptr())
        site = sites.get(key)
        if site is None or key in rows:
            continue
        rows[key] = {"kind": kind, "name": name, "dtype": str(t.dtype).removeprefix("torch."),
                     "bytes": t.untyped_storage().nbytes(), "site": site}
    return sorted(rows.values(), key=lambda r: -r["bytes"])[:MAX_ORIGINS]
