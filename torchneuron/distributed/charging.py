"""Records a collective's modelled Trainium time on the rank's collective stream.

:func:`charge_collective` is the one place distributed code adds modelled time: it
records the collective in the accounting record (:mod:`torchneuron.device.accounting`),
which charges the device's collective stream (:mod:`comm_stream`: after the issuing
stream's work, so later compute overlaps it until the work is waited), counts it under
its kind and, while a profiler records, puts it on the device timeline; the formulas
live in :mod:`torchneuron.hardware.collectives` (no torch).

Placement of ranks, which the formulas need, follows torchrun: global rank ``g``
is on instance ``g // LOCAL_WORLD_SIZE`` and logical core ``g % LOCAL_WORLD_SIZE``
of it, so consecutive ranks share a chip (TP within a chip, as AWS recommends).
Without ``LOCAL_WORLD_SIZE`` every rank is on one instance. Instances of an UltraServer
type (``TORCHNEURON_INSTANCE=trn2u.48xlarge``) form UltraServers of four: ranks on
instances of one UltraServer exchange over NeuronLink, not EFA.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import torch
import torch.distributed as dist

from torchneuron import config
from torchneuron.device import accounting
from torchneuron.distributed import comm_stream
from torchneuron.hardware.collectives import (ULTRASERVER_INSTANCES, CollectiveCost, GroupPlacement, Link,
                                              collective_cost, instance_placement, link_for, work_name)
from torchneuron.hardware.topology import Topology


class Charged(NamedTuple):
    """Where a charged collective sits on its device's collective stream (a tuple: made at
    every collective, ~0.2 us against ~1 us for a frozen dataclass)."""

    cost: CollectiveCost
    device: int
    end: torch.Event  # recorded on the collective stream after it
    modeled_start: float  # the collective stream's clock where it started (s)


def charge_collective(kind: str, nbytes: int, group: dist.ProcessGroup, device: torch.device,
                      peer: int | None = None) -> CollectiveCost:
    """Adds the modelled seconds of collective ``kind`` on ``group`` to ``device``'s
    collective stream, and makes the current stream wait for it (a synchronous collective).

    ``nbytes`` is nccom-test's size (see :mod:`torchneuron.hardware.collectives`);
    ``peer`` is the other side's group rank of a send or receive.
    """
    charged = charge_async(kind, nbytes, group, device, peer)
    comm_stream.join(charged.device, charged.end)
    return charged.cost


def charge_async(kind: str, nbytes: int, group: dist.ProcessGroup, device: torch.device,
                 peer: int | None = None) -> Charged:
    """As :func:`charge_collective`, but the current stream does not wait: join ``end``
    when the work is waited (:func:`comm_stream.join`)."""
    index = device.index if device.index is not None else torch.neuron.current_device()
    cost, name, engine = _cached_cost(kind, nbytes, group, peer)
    _, end, start = comm_stream.charge(index, lambda: accounting.record_work(
        accounting.WorkKind.COLLECTIVE, name, index, cost.seconds, nbytes=nbytes, engine=engine))
    return Charged(cost, index, end, start)


# The cost (and the event's engine text) of each (group, kind, size, peer) the rank charged,
# for the topology and LOCAL_WORLD_SIZE it was modelled with: a training loop repeats a few
# collectives, and modelling one again (placement, algorithm choice) cost ~10 us a call.
_costs: dict[tuple[str, str, int, int | None], tuple[Topology, object, CollectiveCost, str, str]] = {}
_COSTS_KEPT = 4096


def forget_costs() -> None:
    """Drops the cached costs: a new group may reuse a destroyed group's name."""
    _costs.clear()


def _cached_cost(kind: str, nbytes: int, group: dist.ProcessGroup,
                 peer: int | None) -> tuple[CollectiveCost, str, str]:
    """The cost, the recorded name (``all_reduce (rdh, 4 ranks)``) and the event's engine text:
    the link and the bus bandwidth, ``NeuronLink-v3, busbw 505.4 GB/s``, which the profiler's
    trace shows on the device's collectives row (one text per distinct cost, kept by the record)."""
    topology = config.device_topology()  # replaced when a topology setting changes
    per_instance = (config.value("LOCAL_WORLD_SIZE"), config.value("TORCHNEURON_COLLECTIVE_LAUNCH_US"))
    key = (group.group_name, kind, nbytes, peer)
    found = _costs.get(key)
    if found is not None and found[0] is topology and found[1] == per_instance:
        return found[2], found[3], found[4]
    cost = modelled_cost(kind, nbytes, group, peer)
    name = work_name(cost)
    engine = f"{cost.link}, busbw {cost.busbw / 1e9:.1f} GB/s" if cost.seconds > 0 else cost.link
    if len(_costs) >= _COSTS_KEPT:
        _costs.clear()
    _costs[key] = (topology, per_instance, cost, name, engine)
    return cost, name, engine


def modelled_cost(kind: str, nbytes: int, group: dist.ProcessGroup,
                  peer: int | None = None) -> CollectiveCost:
    """What collective ``kind`` of ``nbytes`` on ``group`` costs on the configured target
    (link, algorithm, seconds), without charging it."""
    from torchneuron.distributed.host_group import host_group

    ranks = host_group(group).ranks
    if peer is not None and 0 <= peer < len(ranks):
        members = [ranks[group.rank()], ranks[peer]]
    else:
        members = ranks
    topology = config.device_topology()
    link, placement, local_link = _link(tuple(members), config.value("LOCAL_WORLD_SIZE") or max(ranks) + 1,
                                        topology)
    cost = collective_cost(kind, nbytes, len(members), link, placement=placement, local_link=local_link)
    launch = config.value("TORCHNEURON_COLLECTIVE_LAUNCH_US") * 1e-6  # an assumption the user sets
    if launch and cost.ranks > 1:
        cost = dataclasses.replace(cost, seconds=cost.seconds + launch)
    return cost


# The link of each group (or send/receive pair) the rank charged, for the topology it was
# placed on: placing the ranks is the same work at every collective of a group. Keyed by
# the topology object, which config.device_topology() replaces when a setting changes.
_links: dict[tuple[tuple[int, ...], int], tuple[Topology, Link, GroupPlacement, Link | None]] = {}
_LINKS_KEPT = 1024


def _link(members: tuple[int, ...], per_instance: int,
          topology: Topology) -> tuple[Link, GroupPlacement, Link | None]:
    """The group's slowest link, its placement and, when it spans instances, the link of one
    instance's share of it (the intra-node stages of the Hierarchical algorithm)."""
    found = _links.get((members, per_instance))
    if found is not None and found[0] is topology:
        return found[1], found[2], found[3]
    placement = placement_of(list(members), per_instance, topology)
    dma = topology.devices[0].dma_bytes_per_second
    efa_gbps = topology.instance.efa_gbps if topology.instance is not None else None
    efa = efa_gbps * 1e9 / 8 if efa_gbps else None
    link = link_for(topology.chip, placement, dma, efa)
    local_link = link_for(topology.chip, instance_placement(placement), dma, efa) if placement.instances > 1 else None
    if len(_links) >= _LINKS_KEPT:
        _links.clear()
    _links[(members, per_instance)] = (topology, link, placement, local_link)
    return link, placement, local_link


def placement_of(members: list[int], per_instance: int, topology: Topology) -> GroupPlacement:
    """Where global ranks ``members`` sit, as torchrun places ``per_instance`` ranks per instance:
    rank ``g`` on instance ``g // per_instance``, chip ``(g % per_instance) // cores per chip``;
    instances of an UltraServer type (trn2u.48xlarge) grouped into UltraServers of four."""
    cores_per_chip = topology.logical_cores_per_chip
    instance = topology.instance.name if topology.instance is not None else None
    return GroupPlacement.of([(g // per_instance, (g % per_instance) // cores_per_chip) for g in members],
                             ULTRASERVER_INSTANCES.get(instance))
