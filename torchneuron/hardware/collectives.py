"""Modelled time of a collective on Trainium: links, algorithms, bus bandwidth.

Pure alpha-beta formulas (no torch): a collective over ``n`` ranks moves its bytes
in steps; each step pays the link's latency (alpha) and the bytes pay the link's
bandwidth (beta). The slowest link the group crosses sets both, as it does for a
ring, which runs at its slowest hop.

Figures come from trainium-facts.md ("Topology and collectives", "Chips",
"Engines"); where the sheet has no figure the constant below says what we assumed.
Bandwidth conventions follow AWS's ``nccom-test`` and nccl-tests (same sheet):
``algbw = size / time``; ``busbw = algbw * 2(n-1)/n`` for all-reduce,
``* (n-1)/n`` for all-gather, reduce-scatter and all-to-all, ``* 1`` otherwise.
``size`` is the bytes of one rank's buffer: the input of all-reduce, broadcast,
reduce, reduce-scatter, all-to-all, scatter and send; the output of all-gather and
gather (so all-gather and reduce-scatter of the same full tensor have one size).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from torchneuron.hardware.cost import DMA_FIXED_SECONDS
from torchneuron.hardware.specs import ChipSpec

__all__ = [
    "KINDS",
    "Link",
    "CollectiveCost",
    "GroupPlacement",
    "ULTRASERVER_INSTANCES",
    "link_for",
    "collective_cost",
    "bus_factor",
]

_GB = 1e9

# Every collective the model prices. Reductions and gathers share formulas.
KINDS = (
    "all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast",
    "reduce", "gather", "scatter", "send_recv", "barrier",
)

# Step latency of a transfer within an instance (within a chip or over NeuronLink):
# every transfer is a DMA, and trainium-facts.md (Engines) gives "about 1.3 us fixed
# cost per transfer"; torchneuron uses that figure for every DMA (hardware/cost.py).
NEURONLINK_STEP_SECONDS = DMA_FIXED_SECONDS

# ASSUMPTION: the facts sheet gives EFA bandwidth but no latency. We charge each step
# between instances 10 us (a DMA to the NIC, the network and a DMA out: several times
# the on-instance 1.3 us). Replace when a published figure exists.
EFA_STEP_SECONDS = 10e-6

# trainium-facts.md (Topology): Trn2 NeuronLink-v3 gives each chip 1,024 GB/s within an
# instance (of its 1.28 TB/s; the other 256 GB/s link UltraServer instances). The sheet
# does not say whether this counts both directions: we take it as what a chip can send
# while it receives as much, the optimistic reading (a ring uses both directions of a link).
_INSTANCE_LINK_BYTES_PER_SECOND = {
    "trn1": 384 * _GB,  # Chips table: NeuronLink-v2 384 GB/s (no intra/inter split given)
    "trn2": 1024 * _GB,  # Topology: 1,024 GB/s within an instance
    # Topology: AWS pages give 2.56 TB/s and 2,048 GiB/s per device; we use 2.56 TB/s
    # (the Chips table's figure) with no split between instances, as for Trn1.
    "trn3": 2560 * _GB,
}

# trainium-facts.md (Topology): a Trn2 UltraServer is 4 trn2u.48xlarge instances; each chip
# has 256 GB/s of NeuronLink-v3 to the other instances (of its 1.28 TB/s), and the chips at
# one torus coordinate form a ring across the 4 instances. So ranks on instances of one
# UltraServer exchange over NeuronLink, not EFA. The sheet gives no such per-chip figure for
# Trn3 UltraServers (NeuronSwitch-v1): they are not modelled (EFA, as between instances).
ULTRASERVER_INSTANCES = {"trn2u.48xlarge": 4}
_ULTRASERVER_LINK_BYTES_PER_SECOND = {"trn2": 256 * _GB}

# trainium-facts.md (Instances, Topology): EFAv3 3,200 Gbps per trn2.48xlarge = 400 GB/s,
# shared by the instance's ranks. Trn1 and Trn3 publish no per-instance EFA figure we can
# use (Trn3's is per UltraServer): ASSUMPTION, they get Trn2's figure.
EFA_BYTES_PER_SECOND_PER_INSTANCE = 3200e9 / 8


@dataclass(frozen=True)
class Link:
    """The link a collective's steps cross: per-rank bandwidth and per-step latency."""

    name: str
    bytes_per_second: float
    step_seconds: float


@dataclass(frozen=True)
class GroupPlacement:
    """Where a group's ranks sit: how many instances and chips it spans, and the most
    group ranks sharing one chip and one instance (they share its links)."""

    ranks: int
    instances: int
    chips: int
    max_ranks_per_chip: int
    max_ranks_per_instance: int
    ultraservers: int = 0  # UltraServers the group spans; 0: its instances are in none

    @staticmethod
    def of(locations: list[tuple[int, int]], instances_per_ultraserver: int | None = None) -> "GroupPlacement":
        """From each rank's (instance, chip) pair; ``instances_per_ultraserver``: when the
        instances form UltraServers (:data:`ULTRASERVER_INSTANCES`), instance ``i`` is in
        UltraServer ``i // instances_per_ultraserver``."""
        per_chip: dict[tuple[int, int], int] = {}
        per_instance: dict[int, int] = {}
        for instance, chip in locations:
            per_chip[(instance, chip)] = per_chip.get((instance, chip), 0) + 1
            per_instance[instance] = per_instance.get(instance, 0) + 1
        ultraservers = len({i // instances_per_ultraserver for i in per_instance}) \
            if instances_per_ultraserver else 0
        return GroupPlacement(
            ranks=len(locations),
            instances=len(per_instance),
            chips=len(per_chip),
            max_ranks_per_chip=max(per_chip.values(), default=1),
            max_ranks_per_instance=max(per_instance.values(), default=1),
            ultraservers=ultraservers,
        )


def link_for(chip: ChipSpec, placement: GroupPlacement, core_dma_bytes_per_second: float) -> Link:
    """The slowest link a group with this placement crosses, as one rank sees it.

    Within one chip the logical cores exchange through HBM by DMA, so a rank gets its
    core's DMA bandwidth (``core_dma_bytes_per_second``, already scaled by LNC; an
    assumption: the sheet gives no on-chip collective figure). Across chips, the ranks
    on one chip share its NeuronLink; across instances, the ranks of an instance share
    its EFA, unless they are all in one UltraServer: then each chip's NeuronLink to the
    other instances (Trn2: 256 GB/s), shared by the group's ranks on that chip.
    """
    if placement.instances > 1 and placement.ultraservers == 1 \
            and chip.name in _ULTRASERVER_LINK_BYTES_PER_SECOND:
        share = _ULTRASERVER_LINK_BYTES_PER_SECOND[chip.name] / placement.max_ranks_per_chip
        return Link(f"{chip.chip_link_name} (UltraServer)", share, NEURONLINK_STEP_SECONDS)
    if placement.instances > 1:
        share = EFA_BYTES_PER_SECOND_PER_INSTANCE / placement.max_ranks_per_instance
        return Link("EFA", share, EFA_STEP_SECONDS)
    if placement.chips > 1:
        share = _INSTANCE_LINK_BYTES_PER_SECOND[chip.name] / placement.max_ranks_per_chip
        return Link(chip.chip_link_name, share, NEURONLINK_STEP_SECONDS)
    return Link("on-chip DMA", core_dma_bytes_per_second, NEURONLINK_STEP_SECONDS)


@dataclass(frozen=True)
class CollectiveCost:
    """Modelled time of one collective, with nccom-test's bandwidth columns."""

    kind: str
    nbytes: int
    ranks: int
    algorithm: str
    link: str
    seconds: float

    @property
    def algbw(self) -> float:
        """Bytes per second of the rank's buffer (``size / time``)."""
        return self.nbytes / self.seconds if self.seconds > 0 else 0.0

    @property
    def busbw(self) -> float:
        """``algbw`` scaled to what each link carried (nccom-test's busbw)."""
        return self.algbw * bus_factor(self.kind, self.ranks)


def bus_factor(kind: str, ranks: int) -> float:
    """nccl-tests/nccom-test busbw factor (trainium-facts.md: Topology and collectives)."""
    _check_kind(kind)
    if ranks <= 1:
        return 0.0 if kind != "send_recv" else 1.0
    if kind == "all_reduce":
        return 2 * (ranks - 1) / ranks
    if kind in ("all_gather", "reduce_scatter", "all_to_all"):
        return (ranks - 1) / ranks
    return 1.0


def collective_cost(kind: str, nbytes: int, ranks: int, link: Link,
                    algorithm: str | None = None) -> CollectiveCost:
    """Modelled seconds of collective ``kind`` over ``ranks`` ranks on ``link``.

    ``algorithm``: ``"ring"`` (step latency O(n)) or ``"rdh"`` (recursive
    doubling-halving, O(log n), power-of-two groups); ``None`` picks the faster for
    this size and group, our model of the runtime choosing "by size and group shape"
    (the sheet lists the algorithms, not the rule: the fastest is an assumption).
    Mesh and KangaRing are not modelled.

    Raises:
        ValueError: for an unknown kind or algorithm, negative bytes or ranks < 1.
    """
    _check_kind(kind)
    if nbytes < 0 or ranks < 1:
        raise ValueError(f"collective_cost({kind!r}): nbytes must be >= 0 and ranks >= 1, "
                         f"got nbytes={nbytes}, ranks={ranks}")
    if ranks == 1:
        return CollectiveCost(kind, nbytes, 1, "local", "none", 0.0)
    if kind == "send_recv":
        seconds = link.step_seconds + nbytes / link.bytes_per_second
        return CollectiveCost(kind, nbytes, ranks, "direct", link.name, seconds)
    choices = ("ring", "rdh") if algorithm is None else (algorithm,)
    costs = [_cost(kind, nbytes, ranks, link, a) for a in choices if _applies(a, ranks)]
    if not costs:
        raise ValueError(f"algorithm {algorithm!r} does not apply to {ranks} ranks: "
                         f"use 'ring' (any group) or 'rdh' (power-of-two groups)")
    return min(costs, key=lambda c: c.seconds)


def _applies(algorithm: str, ranks: int) -> bool:
    if algorithm == "ring":
        return True
    if algorithm == "rdh":
        return ranks & (ranks - 1) == 0
    raise ValueError(f"unknown collective algorithm {algorithm!r}; use 'ring' or 'rdh'")


def _cost(kind: str, nbytes: int, n: int, link: Link, algorithm: str) -> CollectiveCost:
    """Alpha-beta time: steps x step latency + bytes each rank sends / its bandwidth."""
    share = (n - 1) / n
    steps_one_phase = n - 1 if algorithm == "ring" else int(math.log2(n))
    if kind == "all_reduce":  # reduce-scatter then all-gather (ring or Rabenseifner RDH)
        steps, sent = 2 * steps_one_phase, 2 * share * nbytes
    elif kind in ("all_gather", "reduce_scatter", "gather", "scatter"):
        steps, sent = steps_one_phase, share * nbytes
    elif kind == "all_to_all":  # each rank sends (n-1)/n of its buffer; n-1 exchanges
        steps, sent = n - 1 if algorithm == "ring" else steps_one_phase, share * nbytes
        if algorithm == "rdh":  # Bruck-style log steps forward half the buffer each step
            sent = nbytes / 2 * steps_one_phase
    elif kind in ("broadcast", "reduce"):  # pipelined ring / binomial tree
        steps, sent = steps_one_phase, nbytes if algorithm == "ring" else nbytes * steps_one_phase
    else:  # barrier: a zero-byte all-reduce
        steps, sent = 2 * steps_one_phase, 0.0
    seconds = steps * link.step_seconds + sent / link.bytes_per_second
    return CollectiveCost(kind, nbytes, n, algorithm, link.name, seconds)


def _check_kind(kind: str) -> None:
    if kind not in KINDS:
        raise ValueError(f"unknown collective {kind!r}; known: {', '.join(KINDS)}")
