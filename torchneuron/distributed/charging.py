"""Charges a collective's modelled Trainium time to the rank's device stream.

:func:`charge_collective` is the one place distributed code adds modelled time
(the accounting layer will route it); the formulas live in
:mod:`torchneuron.hardware.collectives` (no torch).

Placement of ranks, which the formulas need, follows torchrun: global rank ``g``
is on instance ``g // LOCAL_WORLD_SIZE`` and logical core ``g % LOCAL_WORLD_SIZE``
of it, so consecutive ranks share a chip (TP within a chip, as AWS recommends).
Without ``LOCAL_WORLD_SIZE`` every rank is on one instance.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import torch
import torch.distributed as dist

from torchneuron import _C, config
from torchneuron.hardware.collectives import CollectiveCost, GroupPlacement, collective_cost, link_for


@dataclass(frozen=True)
class CollectiveRecord:
    """One charged collective: what it moved, how, and its modelled cost."""

    device: int
    cost: CollectiveCost


_lock = threading.Lock()
_records: list[CollectiveRecord] = []
_MAX_RECORDS = 4096  # bounded, like the other host-side caches


def charge_collective(kind: str, nbytes: int, group: dist.ProcessGroup, device: torch.device,
                      peer: int | None = None) -> CollectiveCost:
    """Adds the modelled seconds of collective ``kind`` on ``group`` to ``device``'s current stream.

    ``nbytes`` is nccom-test's size (see :mod:`torchneuron.hardware.collectives`);
    ``peer`` is the other side's group rank of a send or receive.
    """
    from torchneuron.distributed.host_group import host_group

    ranks = host_group(group).ranks
    if peer is not None and 0 <= peer < len(ranks):
        members = [ranks[group.rank()], ranks[peer]]
    else:
        members = ranks
    topology = config.device_topology()
    per_instance = config.value("LOCAL_WORLD_SIZE") or max(ranks) + 1
    cores_per_chip = topology.logical_cores_per_chip
    placement = GroupPlacement.of(
        [(g // per_instance, (g % per_instance) // cores_per_chip) for g in members])
    index = device.index if device.index is not None else torch.neuron.current_device()
    link = link_for(topology.chip, placement, topology.devices[0].dma_bytes_per_second)
    cost = collective_cost(kind, nbytes, len(members), link)
    _C._advance_stream(index, cost.seconds)
    with _lock:
        if len(_records) >= _MAX_RECORDS:
            del _records[: _MAX_RECORDS // 2]
        _records.append(CollectiveRecord(index, cost))
    return cost


def collective_records() -> list[CollectiveRecord]:
    """The collectives charged in this process since the last reset (most recent last, bounded)."""
    with _lock:
        return list(_records)


def reset_collective_records() -> None:
    with _lock:
        _records.clear()
