"""The modelled collective time: alpha-beta formulas, links and nccom-test's busbw."""

import pytest

from torchneuron.hardware import get_chip
from torchneuron.hardware.collectives import (EFA_BYTES_PER_SECOND_PER_INSTANCE, GroupPlacement, Link,
                                              bus_factor, collective_cost, link_for)

LINK = Link("test", bytes_per_second=100e9, step_seconds=1e-6)


def test_ring_all_reduce_is_two_phases_of_n_minus_1_steps():
    cost = collective_cost("all_reduce", 8 << 20, 4, LINK, algorithm="ring")
    assert cost.seconds == pytest.approx(6 * 1e-6 + 2 * 3 / 4 * (8 << 20) / 100e9)
    assert cost.busbw == pytest.approx(cost.algbw * 2 * 3 / 4)  # nccom-test's convention


def test_rdh_takes_mid_sizes_ring_is_the_fallback():
    mid = collective_cost("all_reduce", 4 << 20, 16, LINK)
    assert mid.algorithm == "rdh"  # 8 steps instead of 30
    assert collective_cost("all_reduce", 4 << 20, 6, LINK).algorithm == "ring"  # not a power of two


def test_bus_factors_follow_nccl_tests():
    assert bus_factor("all_gather", 8) == pytest.approx(7 / 8)
    assert bus_factor("reduce_scatter", 8) == pytest.approx(7 / 8)
    assert bus_factor("broadcast", 8) == 1.0


def test_links_by_placement():
    trn2 = get_chip("trn2")
    on_chip = link_for(trn2, GroupPlacement.of([(0, 0)] * 4), 736e9)
    assert on_chip.bytes_per_second == 736e9
    across = link_for(trn2, GroupPlacement.of([(0, c) for c in range(16)]), 736e9)
    assert across.name == "NeuronLink-v3" and across.bytes_per_second == 1024e9
    hosts = link_for(trn2, GroupPlacement.of([(i, c) for i in range(2) for c in range(16)]), 736e9)
    assert hosts.name == "EFA" and hosts.bytes_per_second == EFA_BYTES_PER_SECOND_PER_INSTANCE / 16


def test_instances_of_one_ultraserver_exchange_over_neuronlink():
    """trainium-facts.md: a Trn2 UltraServer is 4 trn2u.48xlarge; 256 GB/s per chip between them."""
    trn2 = get_chip("trn2")
    one_per_chip = [(i, c) for i in range(4) for c in range(16)]
    ultra = link_for(trn2, GroupPlacement.of(one_per_chip, instances_per_ultraserver=4), 736e9)
    assert ultra.name == "NeuronLink-v3 (UltraServer)" and ultra.bytes_per_second == 256e9
    two_per_chip = [(i, c) for i in range(4) for c in range(16) for _ in range(2)]
    shared = link_for(trn2, GroupPlacement.of(two_per_chip, instances_per_ultraserver=4), 736e9)
    assert shared.bytes_per_second == 128e9  # the chip's link, shared by its two ranks
    two_servers = [(i, c) for i in range(8) for c in range(16)]
    efa = link_for(trn2, GroupPlacement.of(two_servers, instances_per_ultraserver=4), 736e9)
    assert efa.name == "EFA"
    not_ultra = link_for(trn2, GroupPlacement.of(one_per_chip), 736e9)  # trn2.48xlarge instances
    assert not_ultra.name == "EFA"
    trn3 = link_for(get_chip("trn3"), GroupPlacement.of(one_per_chip, instances_per_ultraserver=4), 736e9)
    assert trn3.name == "EFA"  # no per-chip UltraServer figure for Trn3 in the facts: not modelled


def test_charging_places_trn2u_ranks_in_ultraservers_of_four():
    from torchneuron import config
    from torchneuron.distributed.charging import placement_of

    with config.override(TORCHNEURON_INSTANCE="trn2u.48xlarge"):
        topology = config.device_topology()
        assert placement_of(list(range(256)), 64, topology).ultraservers == 1  # 4 instances
        assert placement_of(list(range(512)), 64, topology).ultraservers == 2
    with config.override(TORCHNEURON_INSTANCE="trn2.48xlarge"):
        assert placement_of(list(range(256)), 64, config.device_topology()).ultraservers == 0


def test_one_rank_costs_nothing_and_bad_input_is_named():
    assert collective_cost("all_gather", 100, 1, LINK).seconds == 0.0
    with pytest.raises(ValueError, match="unknown collective 'allreduce'"):
        collective_cost("allreduce", 1, 2, LINK)
    with pytest.raises(ValueError, match="power-of-two"):
        collective_cost("all_reduce", 1, 6, LINK, algorithm="rdh")
