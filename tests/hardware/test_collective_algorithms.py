"""Ring, Mesh, Single-step Mesh, RDH and KangaRing as AWS's Neuron runtime deep dives
describe them (intranode-collective-comm / internode-collective-comm), and the runtime's
documented choice by size and group shape. Expected values are the pages' formulas worked
by hand: C = nbytes / N; Ring (N-1) steps of C, RDH log2 N steps, KangaRing N/2 steps,
Mesh one step, Single-step Mesh one step of (N-1) N C."""

import pytest

from torchneuron.hardware.collectives import (ALGORITHMS, MESH_LINKS_PER_BYTE_ACROSS_CHIPS, GroupPlacement,
                                              Link, choose_algorithm, collective_cost, steps_and_bytes)

LINK = Link("test", bytes_per_second=100e9, step_seconds=1e-6)
MiB = 1 << 20


def chips(n_chips: int, per_chip: int, instance: int = 0) -> list[tuple[int, int]]:
    return [(instance, c) for c in range(n_chips) for _ in range(per_chip)]


ONE_PER_CHIP_16 = GroupPlacement.of(chips(16, 1))  # one instance's 16 chips, one rank each
FOUR_CHIPS_OF_4 = GroupPlacement.of(chips(4, 4))  # TP groups: every rank of 4 chips
ONE_CHIP_OF_4 = GroupPlacement.of(chips(1, 4))
FOUR_INSTANCES = GroupPlacement.of([(i, 0) for i in range(4)])  # EFA, one rank per instance


def test_ring_and_rdh_steps_and_bytes():
    assert steps_and_bytes("all_gather", 8 * MiB, 8, "ring") == (7, 7 * MiB)
    assert steps_and_bytes("reduce_scatter", 8 * MiB, 8, "ring") == (7, 7 * MiB)
    assert steps_and_bytes("all_reduce", 8 * MiB, 8, "ring") == (14, 14 * MiB)
    assert steps_and_bytes("all_gather", 8 * MiB, 8, "rdh") == (3, 7 * MiB)  # (1+2+4) C
    assert steps_and_bytes("all_reduce", 8 * MiB, 8, "rdh") == (6, 14 * MiB)


def test_kangaring_halves_the_ring_hops_with_the_ring_bytes():
    placement = GroupPlacement.of(chips(2, 4))  # 8 ranks: 4 primaries in the cycle
    assert steps_and_bytes("all_gather", 8 * MiB, 8, "kangaring", placement) == (4, 7 * MiB)
    assert steps_and_bytes("all_reduce", 8 * MiB, 8, "kangaring", placement) == (8, 14 * MiB)
    ring = collective_cost("all_reduce", 8 * MiB, 8, LINK, "ring", placement)
    kanga = collective_cost("all_reduce", 8 * MiB, 8, LINK, "kangaring", placement)
    assert kanga.seconds == pytest.approx(8e-6 + 14 * MiB / 100e9)
    assert ring.seconds - kanga.seconds == pytest.approx(6e-6)  # 14 hops - 8 hops


def test_mesh_steps_and_bytes_by_group_shape():
    # between instances (inter-node page): one step of (N-1) C; all-reduce two
    assert steps_and_bytes("all_gather", 4 * MiB, 4, "mesh", FOUR_INSTANCES) == (1, 3 * MiB)
    assert steps_and_bytes("all_reduce", 4 * MiB, 4, "mesh", FOUR_INSTANCES) == (2, 6 * MiB)
    # on one chip: nothing routed over the torus
    assert steps_and_bytes("reduce_scatter", 4 * MiB, 4, "mesh", ONE_CHIP_OF_4) == (1, 3 * MiB)
    # across the torus, one rank per chip: one routed step; 15/16 of the buffer x 32/15 links
    assert MESH_LINKS_PER_BYTE_ACROSS_CHIPS == pytest.approx(32 / 15)
    steps, sent = steps_and_bytes("all_gather", 16 * MiB, 16, "mesh", ONE_PER_CHIP_16)
    assert steps == 1 and sent == pytest.approx(32 * MiB)
    # ranks sharing chips (intra-node page): a routed step, then an on-chip step
    steps, sent = steps_and_bytes("all_gather", 16 * MiB, 16, "mesh", FOUR_CHIPS_OF_4)
    assert steps == 2 and sent == pytest.approx(32 * MiB)
    assert steps_and_bytes("all_reduce", 16 * MiB, 16, "mesh", FOUR_CHIPS_OF_4)[0] == 4


def test_single_step_mesh_sends_the_whole_buffer_to_every_peer():
    assert steps_and_bytes("all_reduce", 4 * MiB, 4, "single_step_mesh", FOUR_INSTANCES) == (1, 12 * MiB)
    cost = collective_cost("all_reduce", 4 * MiB, 4, LINK, "single_step_mesh", FOUR_INSTANCES)
    assert cost.seconds == pytest.approx(1e-6 + 12 * MiB / 100e9)


@pytest.mark.parametrize("kind", ["all_reduce", "all_gather", "reduce_scatter"])
def test_sizes_choose_mesh_rdh_then_kangaring_or_ring(kind):
    """Intra-node page: Mesh < 1MB, RDH 1-56MB, KangaRing > 56MB; Ring is the fallback, and
    runs instead of KangaRing on a one-rank-per-chip group."""
    def pick(nbytes, placement):
        return collective_cost(kind, nbytes, placement.ranks, LINK, placement=placement).algorithm
    assert pick(MiB - 1, ONE_PER_CHIP_16) in ("mesh", "single_step_mesh")
    assert pick(MiB, ONE_PER_CHIP_16) == "rdh"
    assert pick(56 * MiB, ONE_PER_CHIP_16) == "rdh"
    assert pick(56 * MiB + 1, ONE_PER_CHIP_16) == "ring"
    assert pick(56 * MiB + 1, FOUR_CHIPS_OF_4) == "kangaring"
    assert pick(56 * MiB + 1, ONE_CHIP_OF_4) == "kangaring"  # every rank of its one chip
    twelve = GroupPlacement.of(chips(3, 4))  # not a power of two: no RDH
    assert pick(4 * MiB, twelve) == "kangaring"
    assert pick(4 * MiB, GroupPlacement.of(chips(12, 1))) == "ring"
    two_hosts = GroupPlacement.of([(0, 0), (1, 0)])  # KangaRing is intra-node only
    assert pick(64 * MiB, two_hosts) == "ring"


def test_single_step_mesh_wins_while_its_extra_bytes_cost_less_than_a_hop():
    """Inter-node page: Single-step Mesh beats Mesh when its extra transfer is shorter than
    the hop it saves. Here 4 ranks: Mesh = 2 hops + 1.5 B / bw, Single-step = 1 hop + 3 B / bw:
    Single-step wins while 1.5 B / (100 GB/s) < 1 us, B < 66,666 bytes."""
    assert choose_algorithm("all_reduce", 64 << 10, 4, LINK, FOUR_INSTANCES) == "single_step_mesh"
    assert choose_algorithm("all_reduce", 128 << 10, 4, LINK, FOUR_INSTANCES) == "mesh"
    assert choose_algorithm("all_gather", 64 << 10, 4, LINK, FOUR_INSTANCES) == "mesh"
    assert collective_cost("barrier", 0, 4, LINK, placement=FOUR_INSTANCES).algorithm == "single_step_mesh"


def test_algorithm_override_and_its_errors():
    assert set(ALGORITHMS) == {"ring", "mesh", "single_step_mesh", "rdh", "kangaring", "hierarchical"}
    forced = collective_cost("all_gather", 256 * MiB, 16, LINK, "mesh", ONE_PER_CHIP_16)
    assert forced.algorithm == "mesh"
    ring = collective_cost("all_gather", 256 * MiB, 16, LINK, "ring", ONE_PER_CHIP_16)
    assert forced.seconds > ring.seconds  # routed over the torus: Mesh loses at large sizes
    with pytest.raises(ValueError, match="'kangaring' does not apply to all_gather on 16 ranks"):
        collective_cost("all_gather", MiB, 16, LINK, "kangaring", ONE_PER_CHIP_16)
    with pytest.raises(ValueError, match="'kangaring' does not apply"):
        collective_cost("all_gather", MiB, 16, LINK, "kangaring")  # shape unknown
    with pytest.raises(ValueError, match="'single_step_mesh' is an all_reduce algorithm"):
        collective_cost("all_gather", MiB, 4, LINK, "single_step_mesh")
    with pytest.raises(ValueError, match="unknown collective algorithm 'tree'; use one of ring, mesh"):
        collective_cost("all_reduce", MiB, 4, LINK, "tree")
