"""Logical device topology: defaults, LNC, instances and NEURON_RT_VISIBLE_CORES."""

import dataclasses
import re
from pathlib import Path

import pytest

from torchneuron.hardware import CHIPS, INSTANCES, resolve_topology, topology_from_env

GiB = 2**30


def test_default_is_one_trn2_chip_at_lnc2():
    topo = resolve_topology()
    assert topo.chip is CHIPS["trn2"]
    assert topo.instance is INSTANCES["trn2.3xlarge"]
    assert (topo.lnc, topo.num_chips, topo.device_count) == (2, 1, 4)
    assert [d.hbm_bytes for d in topo.devices] == [24 * GiB] * 4
    assert topo.total_hbm_bytes == topo.chip.hbm_bytes_per_chip
    assert [d.name for d in topo.devices] == ["Trainium2"] * 4


def test_trn2_lnc1_gives_eight_12gib_devices():
    topo = resolve_topology(lnc=1)
    assert topo.device_count == 8
    assert all(d.hbm_bytes == 12 * GiB for d in topo.devices)
    assert [d.physical_cores for d in topo.devices] == [(i,) for i in range(8)]


@pytest.mark.parametrize("lnc, count, gib", [(None, 4, 36), (2, 4, 36), (1, 8, 18), ("1", 8, 18)])
def test_trn3(lnc, count, gib):
    topo = resolve_topology(target="trn3", lnc=lnc)
    assert topo.chip.name == "trn3"
    assert topo.instance is None
    assert topo.device_count == count
    assert all(d.hbm_bytes == gib * GiB for d in topo.devices)
    assert [d.name for d in topo.devices] == ["Trainium3"] * count


def test_trn1_has_two_16gib_devices():
    topo = resolve_topology(target="inf2")
    assert topo.chip.name == "trn1"
    assert (topo.lnc, topo.device_count) == (1, 2)
    assert all(d.hbm_bytes == 16 * GiB for d in topo.devices)


@pytest.mark.parametrize("lnc", [2, "2"])
def test_trn1_rejects_lnc2(lnc):
    with pytest.raises(ValueError, match="NEURON_LOGICAL_NC_CONFIG.*trn1"):
        resolve_topology(target="trn1", lnc=lnc)


@pytest.mark.parametrize("target", ["trn1", "trn2", "trn3"])
def test_logical_hbm_times_logical_cores_is_chip_hbm(target):
    for lnc in CHIPS[target].supported_lnc:
        topo = resolve_topology(target=target, lnc=lnc)
        chip_hbm = topo.devices[0].hbm_bytes * topo.logical_cores_per_chip
        assert chip_hbm == topo.chip.hbm_bytes_per_chip
        assert topo.logical_cores_per_chip * lnc == topo.chip.physical_cores_per_chip


def test_lnc2_doubles_per_core_throughput_and_sbuf():
    chip = CHIPS["trn2"]
    device = resolve_topology(lnc=2).devices[1]
    assert device.physical_cores == (2, 3)
    assert device.sbuf_bytes == 2 * chip.sbuf_bytes_per_core
    assert device.tensor_bf16_flops_per_second == 2 * chip.tensor_bf16_flops_per_second
    assert device.tensor_fp8_flops_per_second == 2 * chip.tensor_fp8_flops_per_second
    assert device.tensor_fp32_flops_per_second == 2 * chip.tensor_fp32_flops_per_second
    assert device.tensor_mx_flops_per_second is None
    assert device.dma_bytes_per_second == pytest.approx(2 * 368e9)


def test_trn3_logical_core_has_mx_but_no_plain_fp8_figure():
    device = resolve_topology(target="gen4", lnc=1).devices[0]
    assert device.tensor_mx_flops_per_second == CHIPS["trn3"].tensor_mx_flops_per_second
    assert device.tensor_fp8_flops_per_second is None


@pytest.mark.parametrize("name", ["trn2.48xlarge", "trn2u.48xlarge"])
def test_48xlarge_has_64_logical_devices(name):
    topo = resolve_topology(instance=name)
    assert (topo.num_chips, topo.device_count) == (16, 64)
    assert topo.total_hbm_bytes == 16 * topo.chip.hbm_bytes_per_chip
    last = topo.devices[-1]
    assert (last.core_id, last.chip_index, last.physical_cores) == (63, 15, (6, 7))


def test_instance_with_lnc1_and_agreeing_target():
    topo = resolve_topology(target="GEN3", instance="trn2.48xlarge", lnc=1)
    assert topo.device_count == 128
    assert topo.devices[8].chip_index == 1
    assert topo.devices[8].physical_cores == (0,)


def test_target_instance_conflict():
    with pytest.raises(ValueError, match="NEURON_PLATFORM_TARGET_OVERRIDE.*TORCHNEURON_INSTANCE"):
        resolve_topology(target="trn3", instance="trn2.48xlarge")


def test_unknown_instance_lists_known_ones():
    with pytest.raises(ValueError, match="TORCHNEURON_INSTANCE") as info:
        resolve_topology(instance="trn3.48xlarge")
    assert "trn2.3xlarge" in str(info.value)
    assert "trn2.48xlarge" in str(info.value)


@pytest.mark.parametrize("target", ["trn4", "gpu", ""])
def test_unknown_target(target):
    with pytest.raises(ValueError, match="NEURON_PLATFORM_TARGET_OVERRIDE"):
        resolve_topology(target=target)


@pytest.mark.parametrize("lnc", [0, 3, "4", "two", "", True, 2.0, "1.0"])
def test_bad_lnc(lnc):
    with pytest.raises(ValueError, match="NEURON_LOGICAL_NC_CONFIG"):
        resolve_topology(lnc=lnc)


@pytest.mark.parametrize(
    "spec, core_ids",
    [
        ("2", [2]),
        ("0-1", [0, 1]),
        ("0,2", [0, 2]),
        (" 1 - 3 ", [1, 2, 3]),
        ("3, 0", [0, 3]),
    ],
)
def test_visible_cores_syntax(spec, core_ids):
    topo = resolve_topology(visible_cores=spec)
    assert [d.core_id for d in topo.devices] == core_ids
    assert [d.index for d in topo.devices] == list(range(len(core_ids)))


def test_visible_cores_span_chips_and_are_renumbered():
    topo = resolve_topology(instance="trn2.48xlarge", visible_cores="0-3,6")
    assert [d.index for d in topo.devices] == [0, 1, 2, 3, 4]
    assert [d.core_id for d in topo.devices] == [0, 1, 2, 3, 6]
    assert [d.chip_index for d in topo.devices] == [0, 0, 0, 0, 1]
    assert topo.devices[4].physical_cores == (4, 5)
    assert topo.total_hbm_bytes == 5 * 24 * GiB


def test_visible_core_ids_depend_on_lnc():
    # Core 7 exists only when each logical core is one physical core.
    assert resolve_topology(lnc=1, visible_cores="7").devices[0].physical_cores == (7,)
    with pytest.raises(ValueError, match="NEURON_RT_VISIBLE_CORES"):
        resolve_topology(lnc=2, visible_cores="7")


@pytest.mark.parametrize(
    "spec, reason",
    [
        ("", "empty"),
        ("   ", "empty"),
        ("0,0", "twice"),
        ("0-2,1", "twice"),
        ("3-1", "descending"),
        ("4", "out of range"),
        ("0-9", "out of range"),
        ("a", "parse"),
        ("-1", "parse"),
        ("1-", "parse"),
        ("0;1", "parse"),
        ("0,,1", "empty"),
        ("0,", "empty"),
    ],
)
def test_bad_visible_cores(spec, reason):
    with pytest.raises(ValueError, match="NEURON_RT_VISIBLE_CORES") as info:
        resolve_topology(visible_cores=spec)
    message = str(info.value)
    assert repr(spec) in message
    assert reason in message
    assert "0-3" in message  # the valid range for one Trn2 chip at LNC=2


def test_from_env_reads_all_four_variables():
    environ = {
        "NEURON_PLATFORM_TARGET_OVERRIDE": "trn2",
        "NEURON_LOGICAL_NC_CONFIG": "1",
        "NEURON_RT_VISIBLE_CORES": "8-9",
        "TORCHNEURON_INSTANCE": "trn2.48xlarge",
    }
    topo = topology_from_env(environ)
    assert (topo.lnc, topo.num_chips, topo.device_count) == (1, 16, 2)
    assert [(d.chip_index, d.physical_cores) for d in topo.devices] == [(1, (0,)), (1, (1,))]


def test_from_env_empty_values_count_as_unset():
    environ = {name: "" for name in (
        "NEURON_PLATFORM_TARGET_OVERRIDE",
        "NEURON_LOGICAL_NC_CONFIG",
        "NEURON_RT_VISIBLE_CORES",
        "TORCHNEURON_INSTANCE",
    )}
    assert topology_from_env(environ) == resolve_topology()
    assert topology_from_env({}) == resolve_topology()


def test_from_env_ignores_unrelated_variables_and_reports_bad_ones():
    assert topology_from_env({"NEURON_CC_FLAGS": "--auto-cast=none"}).device_count == 4
    with pytest.raises(ValueError, match="NEURON_LOGICAL_NC_CONFIG"):
        topology_from_env({"NEURON_LOGICAL_NC_CONFIG": "3"})


def test_topology_and_devices_are_frozen():
    topo = resolve_topology()
    with pytest.raises(dataclasses.FrozenInstanceError):
        topo.lnc = 1
    with pytest.raises(dataclasses.FrozenInstanceError):
        topo.devices[0].hbm_bytes = 0
    assert isinstance(topo.devices, tuple)
    assert hash(topo) == hash(resolve_topology())


def test_docs_example_runs():
    # Keeps docs/hardware-model.md honest: its example block must execute as written.
    doc = Path(__file__).resolve().parents[2] / "docs" / "hardware-model.md"
    match = re.search(r"## Example\n\n```python\n(.*?)```", doc.read_text(), re.S)
    assert match is not None
    exec(compile(match.group(1), str(doc), "exec"), {"__name__": "docs_example"})


# TorchNeuron's families (trainium-facts.md: TorchNeuron names): the set torchtitan's
# peak-FLOPS lookup knows, and what each configuration reports.
TORCHTITAN_FAMILIES = {"trn1", "trn1n", "inf2", "trn2", "trn2n", "trn2u", "trn3", "trn3u"}


@pytest.mark.parametrize("kwargs, family", [
    ({}, "trn2"),
    ({"instance": "trn2.3xlarge"}, "trn2"),
    ({"instance": "trn2.48xlarge"}, "trn2"),
    ({"instance": "trn2u.48xlarge"}, "trn2u"),
    ({"instance": "trn1.2xlarge"}, "trn1"),
    ({"instance": "trn1.32xlarge"}, "trn1"),
    ({"instance": "trn1n.32xlarge"}, "trn1n"),
    # A Trn3 UltraServer as one unit: an UltraServer family, as trn2u (assumption: the
    # sheet names no Trn3 instance type).
    ({"instance": "trn3-ultraserver-gen1", "visible_cores": "0-3"}, "trn3u"),
    ({"instance": "trn3-ultraserver-gen2", "visible_cores": "0-3"}, "trn3u"),
    ({"target": "trn1"}, "trn1"),
    ({"target": "inf2"}, "inf2"),
    ({"target": "gen2"}, "trn1"),
    ({"target": "trn2"}, "trn2"),
    ({"target": "gen3"}, "trn2"),
    ({"target": "TRN3"}, "trn3"),
    ({"target": "gen4"}, "trn3"),
])
def test_family_is_torchneurons_name_for_the_configuration(kwargs, family):
    topo = resolve_topology(**kwargs)
    assert topo.family == family
    assert topo.family in TORCHTITAN_FAMILIES
    # the family agrees with the chip: NeuronCore-v2 for trn1/inf2, v3 trn2, v4 trn3
    assert topo.chip.name == {"inf2": "trn1"}.get(family, family.rstrip("nu"))


def test_every_instance_has_a_torchtitan_family():
    assert {spec.family for spec in INSTANCES.values()} <= TORCHTITAN_FAMILIES
