"""Groups spanning instances with several ranks on each run the Hierarchical algorithm.

AWS's inter-node deep dive (neuron-runtime/explore/internode-collective-comm.rst,
"Communication Groups - Multiple Ranks per Node"): X instances of Y ranks run pure
intra-node and pure inter-node stages, each with its own best algorithm.
"""

import pytest

from torchneuron.hardware import get_chip
from torchneuron.hardware.collectives import (GroupPlacement, collective_cost, instance_placement, link_for,
                                              parse_work_name, work_name)

TRN2 = get_chip("trn2")
DMA = 736e9
# Two trn2.48xlarge instances, 64 ranks each (LNC=2: 4 logical cores per chip, 16 chips).
TWO_INSTANCES = GroupPlacement.of([(i, r // 4) for i in range(2) for r in range(64)])


def links(placement: GroupPlacement):
    return link_for(TRN2, placement, DMA), link_for(TRN2, instance_placement(placement), DMA)


def test_all_reduce_is_intra_reduce_scatter_inter_all_reduce_intra_all_gather():
    efa, local = links(TWO_INSTANCES)
    assert efa.name == "EFA" and local.name == "NeuronLink-v3"
    size = 64 << 20
    cost = collective_cost("all_reduce", size, 128, efa, placement=TWO_INSTANCES, local_link=local)
    one_instance = instance_placement(TWO_INSTANCES)
    assert (one_instance.ranks, one_instance.instances, one_instance.chips) == (64, 1, 16)
    across = GroupPlacement.of([(0, 0), (1, 0)])
    stages = [collective_cost("reduce_scatter", size, 64, local, placement=one_instance),
              collective_cost("all_reduce", size // 64, 2, efa, placement=across),
              collective_cost("all_gather", size, 64, local, placement=one_instance)]
    assert cost.seconds == pytest.approx(sum(s.seconds for s in stages))
    assert cost.algorithm == f"hierarchical({stages[0].algorithm}+{stages[1].algorithm})"
    assert cost.algorithm == "hierarchical(kangaring+rdh)"  # the page's "large groups + sizes" example
    assert cost.link == "NeuronLink-v3 + EFA"
    # O(X) + O(Y) steps instead of a flat ring's O(X * Y): faster than the flat group on EFA
    flat = collective_cost("all_reduce", size, 128, efa, placement=TWO_INSTANCES)
    assert flat.algorithm in ("ring", "rdh") and cost.seconds < flat.seconds


def test_all_gather_goes_inter_node_first_and_reduce_scatter_last():
    efa, local = links(TWO_INSTANCES)
    size = 8 << 20
    one_instance, across = instance_placement(TWO_INSTANCES), GroupPlacement.of([(0, 0), (1, 0)])
    gather = collective_cost("all_gather", size, 128, efa, placement=TWO_INSTANCES, local_link=local)
    assert gather.seconds == pytest.approx(
        collective_cost("all_gather", size // 64, 2, efa, placement=across).seconds
        + collective_cost("all_gather", size, 64, local, placement=one_instance).seconds)
    scatter = collective_cost("reduce_scatter", size, 128, efa, placement=TWO_INSTANCES, local_link=local)
    assert scatter.seconds == pytest.approx(gather.seconds)  # the same stages, in the other order
    assert scatter.algorithm.startswith("hierarchical(")
    assert parse_work_name(work_name(scatter)) == ("reduce_scatter", scatter.algorithm, 128)


def test_where_the_hierarchical_algorithm_does_not_apply():
    one_per_instance = GroupPlacement.of([(i, 0) for i in range(4)])
    efa, local = link_for(TRN2, one_per_instance, DMA), link_for(TRN2, GroupPlacement.of([(0, 0)]), DMA)
    # one rank per node: the flat inter-node algorithms (RDH for 4 MiB on 4 ranks)
    assert collective_cost("all_reduce", 4 << 20, 4, efa, placement=one_per_instance,
                           local_link=local).algorithm == "rdh"
    uneven = GroupPlacement.of([(0, 0), (0, 0), (1, 0)])  # groups are symmetric on the runtime
    assert not collective_cost("all_reduce", 4 << 20, 3, efa, placement=uneven,
                               local_link=local).algorithm.startswith("hierarchical")
    efa2, local2 = links(TWO_INSTANCES)
    assert not collective_cost("all_to_all", 4 << 20, 128, efa2, placement=TWO_INSTANCES,
                               local_link=local2).algorithm.startswith("hierarchical")
    with pytest.raises(ValueError, match="'hierarchical' does not apply to all_reduce on 4 ranks"):
        collective_cost("all_reduce", 1, 4, efa, algorithm="hierarchical", placement=one_per_instance,
                        local_link=local)


def test_charging_a_group_across_instances_models_it_hierarchically():
    from torchneuron import config
    from torchneuron.distributed import charging

    with config.override(TORCHNEURON_INSTANCE="trn2.48xlarge", NEURON_LOGICAL_NC_CONFIG="2"):
        topology = config.device_topology()
        link, placement, local = charging._link(tuple(range(128)), 64, topology)
        assert (placement.instances, placement.ranks) == (2, 128) and local.name == "NeuronLink-v3"
        cost = collective_cost("all_reduce", 64 << 20, 128, link, placement=placement, local_link=local)
        assert cost.algorithm == "hierarchical(kangaring+rdh)"
        # within one instance there is no local stage: the flat algorithms
        assert charging._link(tuple(range(64)), 64, topology)[2] is None


@pytest.mark.parametrize("instance,gbps", [("trn1.32xlarge", 800), ("trn1n.32xlarge", 1600),
                                           ("trn2.48xlarge", 3200)])
def test_each_instance_type_shares_its_own_efa(instance, gbps):
    """trainium-facts.md (Instances): EFA 800 / 1,600 Gbps on trn1 / trn1n.32xlarge, 3,200 on trn2.48xlarge."""
    from torchneuron import config
    from torchneuron.distributed import charging

    with config.override(TORCHNEURON_INSTANCE=instance, NEURON_LOGICAL_NC_CONFIG=None):
        topology = config.device_topology()
        per_instance = topology.device_count
        link, placement, _ = charging._link(tuple(range(2 * per_instance)), per_instance, topology)
    assert placement.instances == 2 and link.name == "EFA"
    assert link.bytes_per_second == pytest.approx(gbps * 1e9 / 8 / per_instance)
