"""Modelled time of a collective on Trainium: links, algorithms, bus bandwidth.

Pure alpha-beta formulas (no torch): a collective over ``n`` ranks moves its bytes
in steps; each step pays the link's latency (alpha) and the bytes pay the link's
bandwidth (beta). The slowest link the group crosses sets both, as it does for a
ring, which runs at its slowest hop.

Algorithms (Ring, Mesh, Single-step Mesh, RDH, KangaRing) and the rule choosing among
them follow AWS's Neuron runtime deep dives on intra- and inter-node collectives (URLs at
:data:`ALGORITHMS`); figures come from trainium-facts.md ("Topology and collectives", "Chips",
"Engines") and the inter-node page's EFA hop latency; where neither has a figure, the
constant below says what we assumed.
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
    "instance_placement",
    "hierarchical_cost",
    "collective_cost",
    "choose_algorithm",
    "steps_and_bytes",
    "ALGORITHMS",
    "bus_factor",
    "work_name",
    "parse_work_name",
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

# Step latency between instances: the inter-node page (URL above ALGORITHMS) gives the
# per-hop latency over EFA as about 15 us. (The facts sheet has no EFA latency; the
# intra-node page's 1-2 us per Ring/KangaRing hop agrees with the 1.3 us above.)
EFA_STEP_SECONDS = 15e-6

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
# shared by the instance's ranks; trn1.32xlarge 800 Gbps and trn1n.32xlarge 1,600 Gbps
# (InstanceSpec.efa_gbps). Instances without a figure (Trn3's is per UltraServer, and
# planning without an instance type): ASSUMPTION, they get trn2.48xlarge's.
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


def link_for(chip: ChipSpec, placement: GroupPlacement, core_dma_bytes_per_second: float,
             efa_bytes_per_second: float | None = None) -> Link:
    """The slowest link a group with this placement crosses, as one rank sees it.

    Within one chip the logical cores exchange through HBM by DMA, so a rank gets its
    core's DMA bandwidth (``core_dma_bytes_per_second``, already scaled by LNC; an
    assumption: the sheet gives no on-chip collective figure). Across chips, the ranks
    on one chip share its NeuronLink; across instances, the ranks of an instance share
    its EFA, unless they are all in one UltraServer: then each chip's NeuronLink to the
    other instances (Trn2: 256 GB/s), shared by the group's ranks on that chip.
    ``efa_bytes_per_second``: the instance's EFA (default :data:`EFA_BYTES_PER_SECOND_PER_INSTANCE`).
    """
    if placement.instances > 1 and placement.ultraservers == 1 \
            and chip.name in _ULTRASERVER_LINK_BYTES_PER_SECOND:
        share = _ULTRASERVER_LINK_BYTES_PER_SECOND[chip.name] / placement.max_ranks_per_chip
        return Link(f"{chip.chip_link_name} (UltraServer)", share, NEURONLINK_STEP_SECONDS)
    if placement.instances > 1:
        efa = EFA_BYTES_PER_SECOND_PER_INSTANCE if efa_bytes_per_second is None else efa_bytes_per_second
        share = efa / placement.max_ranks_per_instance
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


def work_name(cost: CollectiveCost) -> str:
    """The name a charged collective is recorded under: ``all_reduce (rdh, 4 ranks)``.

    Why: ``torchneuron.estimate`` rows, the metrics report and the trace group work by name,
    so the algorithm and group size in the name give each its own row, and with the recorded
    bytes and time the row's bus bandwidth (:func:`parse_work_name` reads it back).
    """
    return f"{cost.kind} ({cost.algorithm}, {cost.ranks} rank{'s' if cost.ranks != 1 else ''})"


def parse_work_name(name: str) -> tuple[str, str, int] | None:
    """``(kind, algorithm, ranks)`` of a :func:`work_name`; None for any other name."""
    kind, _, rest = name.partition(" (")
    algorithm, _, ranks = rest.partition(", ")
    count, _, unit = ranks.partition(" ")
    if kind not in KINDS or unit not in ("rank)", "ranks)") or not count.isdigit():
        return None
    return kind, algorithm, int(count)


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


# The Neuron runtime's collective algorithms, as AWS's runtime deep dives describe them:
# https://awsdocs-neuron.readthedocs-hosted.com/en/latest/neuron-runtime/explore/intranode-collective-comm.html
# https://awsdocs-neuron.readthedocs-hosted.com/en/latest/neuron-runtime/explore/internode-collective-comm.html
# (cited below as "intra-node page" and "inter-node page"; both dated 12/02/2025).
ALGORITHMS = ("ring", "mesh", "single_step_mesh", "rdh", "kangaring", "hierarchical")

# Inter-node page (neuron-runtime/explore/internode-collective-comm.rst in
# github.com/aws-neuron/aws-neuron-sdk), "Communication Groups - Multiple Ranks per Node":
# a group of X instances with Y ranks on each (groups are always symmetric: the same number
# of ranks, at the same local indices, on every node) runs the Hierarchical algorithm, stages
# of pure intra-node and pure inter-node communication, each with its own best algorithm:
#   all-gather     = inter-node all-gather (Y groups of X, in parallel) + intra-node all-gather
#   reduce-scatter = intra-node reduce-scatter + inter-node reduce-scatter (on 1/Y of the buffer)
#   all-reduce     = intra-node reduce-scatter + inter-node all-reduce (1/Y) + intra-node all-gather
# The page's Flat Ring (one cycle through every rank) is "edge cases only", enabled on Trn1 for
# some large messages: not modelled (the Hierarchical algorithm prices those too).
HIERARCHICAL_KINDS = ("all_reduce", "all_gather", "reduce_scatter", "barrier")

# Intra-node page, "Algorithm Summary": the empirical sweet ranges are Mesh < 1MB, RDH
# 1-56MB, KangaRing > 56MB, Ring "fallback only". ASSUMPTIONS: MB read as MiB, and the
# size compared is nccom-test's size (one rank's buffer, this module's ``nbytes``).
MESH_BELOW_BYTES = 1 << 20
RDH_UP_TO_BYTES = 56 << 20

# Mesh writes each chunk straight to its destination chip and the torus routes it through
# the chips in between (intra-node page: "link over-subscription"). The page gives no
# figure; we charge each byte the mean hop count from a chip to the other 15 of the 4x4
# torus (trainium-facts.md, Topology): per axis 0,1,2,1 hops, so 2 * 4 * 4 / 15 = 32/15
# links per byte where a ring's neighbour crosses one. ASSUMPTION: routing spreads evenly;
# applied to any group spanning chips of one instance or UltraServer, on any chip type (for a
# Trn3 UltraServer's NeuronSwitch, whose routing the sheet does not describe, pessimistic).
MESH_LINKS_PER_BYTE_ACROSS_CHIPS = 32 / 15

# Kinds the pages describe (all-gather, reduce-scatter, all-reduce; a barrier is modelled as
# a zero-byte all-reduce). The others have no documented algorithm: ring or RDH, the faster.
_DOCUMENTED_KINDS = ("all_reduce", "all_gather", "reduce_scatter", "barrier")


def collective_cost(kind: str, nbytes: int, ranks: int, link: Link, algorithm: str | None = None,
                    placement: GroupPlacement | None = None, local_link: Link | None = None) -> CollectiveCost:
    """Modelled seconds of collective ``kind`` over ``ranks`` ranks on ``link``.

    ``algorithm`` (one of :data:`ALGORITHMS`) forces one; ``None`` picks as the runtime
    documents (:func:`choose_algorithm`). ``placement`` is the group's shape: it decides
    whether KangaRing applies, how many steps Mesh takes and whether Mesh's writes are
    routed over the torus; ``None`` (shape unknown): Mesh in one unrouted step, no KangaRing.
    ``local_link``: for a group spanning instances over EFA, the link of one instance's share
    of it (:func:`instance_placement`, :func:`link_for`); with it such a group with several
    ranks per instance runs the Hierarchical algorithm (:func:`hierarchical_cost`), priced
    flat on its slowest link without it.

    Raises:
        ValueError: for an unknown kind or algorithm, an algorithm that does not apply to
            this group, negative bytes or ranks < 1.
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
    hierarchical = local_link is not None and _hierarchical(kind, ranks, placement)
    if algorithm == "hierarchical" or (algorithm is None and hierarchical):
        if not hierarchical:
            raise ValueError(f"algorithm 'hierarchical' does not apply to {kind} on {ranks} ranks: it needs "
                             f"an all_reduce, all_gather or reduce_scatter over instances joined by EFA, the "
                             f"same number (>= 2) of the group's ranks on each, and local_link")
        return hierarchical_cost(kind, nbytes, placement, link, local_link)
    if algorithm is not None:
        _check_algorithm(algorithm, kind, ranks, placement)
        return _cost(kind, nbytes, ranks, link, algorithm, placement)
    return _cost(kind, nbytes, ranks, link, choose_algorithm(kind, nbytes, ranks, link, placement),
                 placement)


def instance_placement(placement: GroupPlacement) -> GroupPlacement:
    """One instance's share of a symmetric group spanning instances (the intra-node stage's group)."""
    per_instance = placement.ranks // placement.instances
    return GroupPlacement(ranks=per_instance, instances=1, chips=max(placement.chips // placement.instances, 1),
                          max_ranks_per_chip=placement.max_ranks_per_chip,
                          max_ranks_per_instance=per_instance)


def _hierarchical(kind: str, ranks: int, placement: GroupPlacement | None) -> bool:
    """Whether the Hierarchical algorithm applies: a documented kind over instances joined by
    EFA, with the same number (>= 2) of the group's ranks on every instance."""
    return (placement is not None and kind in HIERARCHICAL_KINDS and _inter_node(placement)
            and placement.ranks == ranks and placement.max_ranks_per_instance >= 2
            and placement.ranks == placement.instances * placement.max_ranks_per_instance)


def hierarchical_cost(kind: str, nbytes: int, placement: GroupPlacement, link: Link,
                      local_link: Link) -> CollectiveCost:
    """The Hierarchical algorithm (inter-node page): X instances of Y ranks, intra-node stages on
    ``local_link`` among each instance's Y ranks, inter-node stages on ``link`` (EFA, shared by an
    instance's Y parallel inter-node groups) among the X ranks of one local index, each stage
    with the algorithm the runtime would choose for its size and group (the page's
    "plug-and-play"). ``nbytes`` is nccom-test's size, as for every kind.
    """
    instances, per_instance = placement.instances, placement.ranks // placement.instances
    local = instance_placement(placement)
    across = GroupPlacement(ranks=instances, instances=instances, chips=instances, max_ranks_per_chip=1,
                            max_ranks_per_instance=1, ultraservers=placement.ultraservers)
    inner = "all_reduce" if kind == "barrier" else kind
    share = nbytes // per_instance  # what each inter-node group carries: 1/Y of the buffer
    if inner == "all_gather":  # inter-node first: the lower-bandwidth stage carries less
        stages = [collective_cost("all_gather", share, instances, link, placement=across),
                  collective_cost("all_gather", nbytes, per_instance, local_link, placement=local)]
    elif inner == "reduce_scatter":
        stages = [collective_cost("reduce_scatter", nbytes, per_instance, local_link, placement=local),
                  collective_cost("reduce_scatter", share, instances, link, placement=across)]
    else:
        stages = [collective_cost("reduce_scatter", nbytes, per_instance, local_link, placement=local),
                  collective_cost("all_reduce", share, instances, link, placement=across),
                  collective_cost("all_gather", nbytes, per_instance, local_link, placement=local)]
    intra = next(stage.algorithm for stage in stages if stage.link == local_link.name)
    inter = next(stage.algorithm for stage in stages if stage.link == link.name)
    return CollectiveCost(kind, nbytes, placement.ranks, f"hierarchical({intra}+{inter})",
                          f"{local_link.name} + {link.name}", sum(stage.seconds for stage in stages))


def choose_algorithm(kind: str, nbytes: int, ranks: int, link: Link,
                     placement: GroupPlacement | None = None) -> str:
    """The algorithm the runtime would run, by size and group shape.

    Documented (intra-node page, Algorithm Summary): Mesh below 1MB, RDH for 1-56MB,
    KangaRing above 56MB where it applies, Ring as the fallback (a one-rank-per-chip group
    runs Ring where KangaRing would be chosen). Inter-node page: Single-step Mesh replaces
    Mesh for all-reduce when its extra transfer costs less than the hop it saves: we compare
    the two modelled times. ASSUMPTIONS: the intra-node size ranges also apply between
    instances (the inter-node page ranks Mesh < RDH < Ring by message size but gives no
    thresholds; KangaRing is intra-node, so Ring takes the large sizes there); RDH on a
    group that is not a power of two falls back to KangaRing, else Ring; kinds the pages do
    not describe take the faster of Ring and RDH.
    """
    if kind not in _DOCUMENTED_KINDS:
        costs = [_cost(kind, nbytes, ranks, link, a, placement) for a in ("ring", "rdh")
                 if _applies(a, kind, ranks, placement)]
        return min(costs, key=lambda c: c.seconds).algorithm
    if nbytes < MESH_BELOW_BYTES:
        if kind in ("all_reduce", "barrier"):
            mesh = _cost(kind, nbytes, ranks, link, "mesh", placement)
            single = _cost(kind, nbytes, ranks, link, "single_step_mesh", placement)
            return "single_step_mesh" if single.seconds < mesh.seconds else "mesh"
        return "mesh"
    if nbytes <= RDH_UP_TO_BYTES and _applies("rdh", kind, ranks, placement):
        return "rdh"
    return "kangaring" if _applies("kangaring", kind, ranks, placement) else "ring"


def _inter_node(placement: GroupPlacement) -> bool:
    """Whether the group exchanges over EFA (instances not joined in one UltraServer)."""
    return placement.instances > 1 and placement.ultraservers != 1


def _routed(placement: GroupPlacement | None) -> bool:
    """Whether Mesh's writes cross the torus (chips of one instance or UltraServer)."""
    return placement is not None and placement.chips > 1 and not _inter_node(placement)


def _applies(algorithm: str, kind: str, ranks: int, placement: GroupPlacement | None) -> bool:
    if algorithm in ("ring", "mesh"):
        return True
    if algorithm == "rdh":  # inter-node page: a group of N = 2^p members
        return ranks & (ranks - 1) == 0
    if algorithm == "single_step_mesh":  # both pages: a variant for all-reduce only
        return kind in ("all_reduce", "barrier")
    if algorithm == "kangaring":
        # Intra-node page: pairs of ranks on one chip (primary and secondary), only for
        # groups holding all the ranks of each chip they use; one rank per chip runs Ring.
        # ASSUMPTION: "all the ranks of a chip" read as the same even count on every chip.
        if placement is None:
            return False
        per_chip = placement.max_ranks_per_chip
        return (not _inter_node(placement) and per_chip >= 2 and per_chip % 2 == 0
                and placement.ranks == placement.chips * per_chip
                and kind in _DOCUMENTED_KINDS)
    if algorithm == "hierarchical":  # decided by collective_cost, which has the local link
        return False
    raise ValueError(f"unknown collective algorithm {algorithm!r}; use one of {', '.join(ALGORITHMS)}")


def _check_algorithm(algorithm: str, kind: str, ranks: int, placement: GroupPlacement | None) -> None:
    if _applies(algorithm, kind, ranks, placement):
        return
    why = {"rdh": "'rdh' needs a power-of-two group",
           "single_step_mesh": "'single_step_mesh' is an all_reduce algorithm",
           "kangaring": "'kangaring' needs, within one instance or UltraServer, the same even "
                        "number (>= 2) of the group's ranks on every chip it uses, and an "
                        "all_reduce, all_gather or reduce_scatter"}[algorithm]
    raise ValueError(f"algorithm {algorithm!r} does not apply to {kind} on {ranks} ranks: {why}; "
                     f"'ring' and 'mesh' apply to any group")


def steps_and_bytes(kind: str, nbytes: int, n: int, algorithm: str,
                    placement: GroupPlacement | None = None) -> tuple[int, float]:
    """(latency steps, bytes each rank sends over the link) of one collective.

    With ``C = nbytes / n`` (a chunk; the pages' notation): Ring ``n-1`` steps and
    ``(n-1) C`` per phase; RDH ``log2 n`` steps, ``(n-1) C``; KangaRing the ring's bytes
    in ``n/2`` steps (only primaries form the cycle); Mesh one step of ``(n-1) C``, two
    within an instance when ranks share chips (a routed write, then an on-chip exchange),
    each byte crossing :data:`MESH_LINKS_PER_BYTE_ACROSS_CHIPS` links when it leaves a
    chip; Single-step Mesh one step of ``(n-1) n C`` (so routed too). All-reduce is
    reduce-scatter then all-gather (two phases), except Single-step Mesh. ``placement``
    ``None``: Mesh unrouted, in one step.
    """
    share = (n - 1) / n
    routed = algorithm in ("mesh", "single_step_mesh") and _routed(placement)
    links = MESH_LINKS_PER_BYTE_ACROSS_CHIPS if routed else 1.0
    if algorithm == "single_step_mesh":
        return 1, (n - 1) * nbytes * links
    if algorithm == "mesh":
        steps = 2 if routed and placement.max_ranks_per_chip > 1 else 1
        if kind in ("all_reduce", "barrier"):
            return 2 * steps, 0.0 if kind == "barrier" else 2 * share * nbytes * links
        if kind in ("broadcast", "reduce"):  # not in the pages: the root exchanges with every peer
            return steps, (n - 1) * nbytes * links
        return steps, share * nbytes * links
    if algorithm == "kangaring":
        phase = n // 2
        if kind in ("all_reduce", "barrier"):
            return 2 * phase, 0.0 if kind == "barrier" else 2 * share * nbytes
        return phase, share * nbytes
    steps_one_phase = n - 1 if algorithm == "ring" else int(math.log2(n))
    if kind == "all_reduce":  # reduce-scatter then all-gather (ring or Rabenseifner RDH)
        return 2 * steps_one_phase, 2 * share * nbytes
    if kind in ("all_gather", "reduce_scatter", "gather", "scatter"):
        return steps_one_phase, share * nbytes
    if kind == "all_to_all":  # ring: n-1 exchanges; RDH: Bruck-style, half the buffer a step
        if algorithm == "ring":
            return n - 1, share * nbytes
        return steps_one_phase, nbytes / 2 * steps_one_phase
    if kind in ("broadcast", "reduce"):  # pipelined ring / binomial tree
        return steps_one_phase, nbytes if algorithm == "ring" else nbytes * steps_one_phase
    return 2 * steps_one_phase, 0.0  # barrier: a zero-byte all-reduce


def _cost(kind: str, nbytes: int, n: int, link: Link, algorithm: str,
          placement: GroupPlacement | None) -> CollectiveCost:
    """Alpha-beta time: steps x step latency + bytes each rank sends / its bandwidth."""
    steps, sent = steps_and_bytes(kind, nbytes, n, algorithm, placement)
    seconds = steps * link.step_seconds + sent / link.bytes_per_second
    return CollectiveCost(kind, nbytes, n, algorithm, link.name, seconds)


def _check_kind(kind: str) -> None:
    if kind not in KINDS:
        raise ValueError(f"unknown collective {kind!r}; known: {', '.join(KINDS)}")
