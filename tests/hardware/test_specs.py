"""Chip and instance tables against trainium-facts.md."""

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest

from torchneuron.hardware import CHIPS, INSTANCES, ChipSpec, InstanceSpec, get_chip, get_instance

GiB = 2**30
KiB = 2**10
MiB = 2**20


def test_registry_keys_match_chip_names():
    assert list(CHIPS) == ["trn1", "trn2", "trn3"]
    for key, chip in CHIPS.items():
        assert chip.name == key


def test_generations_and_marketing_names():
    got = {name: (c.marketing_name, c.neuroncore_version) for name, c in CHIPS.items()}
    assert got == {
        "trn1": ("Trainium", "v2"),
        "trn2": ("Trainium2", "v3"),
        "trn3": ("Trainium3", "v4"),
    }


def test_hbm_matches_facts_sheet():
    # trainium-facts.md: Chips table; Trn2 is "4 x 24 GiB".
    assert CHIPS["trn1"].hbm_bytes_per_chip == 32 * GiB
    assert CHIPS["trn2"].hbm_bytes_per_chip == 4 * 24 * GiB
    assert CHIPS["trn3"].hbm_bytes_per_chip == 144 * GiB
    # Main figures where "one guide says" otherwise.
    assert CHIPS["trn2"].hbm_bytes_per_second == pytest.approx(2.9e12)
    assert CHIPS["trn3"].hbm_bytes_per_second == pytest.approx(4.9e12)


def test_sbuf_is_partitions_times_partition_size():
    for name in ("trn1", "trn2"):
        chip = CHIPS[name]
        assert chip.sbuf_partitions * chip.sbuf_bytes_per_partition == chip.sbuf_bytes_per_core
    assert CHIPS["trn1"].sbuf_bytes_per_core == 24 * MiB
    assert CHIPS["trn2"].sbuf_bytes_per_partition == 224 * KiB
    assert CHIPS["trn3"].sbuf_bytes_per_core == 32 * MiB


def test_unpublished_figures_are_none_not_zero():
    trn3 = CHIPS["trn3"]
    assert trn3.sbuf_partitions is None
    assert trn3.sbuf_bytes_per_partition is None
    assert CHIPS["trn2"].psum_banks is None
    assert CHIPS["trn1"].tensor_fp8_flops_per_second is None
    assert CHIPS["trn2"].tensor_mx_flops_per_second is None


def test_trn1_psum_banks_hold_512_fp32_per_partition():
    chip = CHIPS["trn1"]
    per_partition = chip.psum_bytes_per_core // chip.sbuf_partitions
    assert per_partition == 16 * KiB
    assert per_partition // chip.psum_banks == 512 * 4


def test_per_core_tensor_peak_matches_systolic_array_arithmetic():
    # trainium-facts.md note: 128x128 PEs x 2 FLOP x 2.4 GHz = 78.6 TFLOPS ~ 79.
    for name in ("trn2", "trn3"):
        chip = CHIPS[name]
        derived = 128 * 128 * 2 * chip.tensor_clock_hz
        assert chip.tensor_bf16_flops_per_second == pytest.approx(derived, rel=0.01)


def test_chip_figure_is_published_not_derived_from_cores():
    # The sheet's own discrepancy: 8 x 79 = 632 < 667. Both figures are kept as quoted.
    trn2 = CHIPS["trn2"]
    from_cores = trn2.physical_cores_per_chip * trn2.tensor_bf16_flops_per_second
    assert from_cores == pytest.approx(632e12)
    assert trn2.chip_bf16_flops_per_second == pytest.approx(667e12)
    assert CHIPS["trn3"].chip_mx_flops_per_second == pytest.approx(2517e12)


def test_dma_per_core_is_engines_times_engine_rate():
    # trainium-facts.md: Chips table, "16 x 23 B/ns = 368 GB/s", "16 x 33 B/ns = 528 GB/s".
    assert CHIPS["trn2"].dma_bytes_per_second_per_core == pytest.approx(368e9)
    assert CHIPS["trn3"].dma_bytes_per_second_per_core == pytest.approx(528e9)


def test_no_fp64_anywhere():
    for chip in CHIPS.values():
        assert chip.has_fp64 is False
        assert "float64" not in chip.native_dtypes


def test_dtype_lists_follow_generations():
    assert "cfp8" in CHIPS["trn1"].native_dtypes
    assert "float8_e4m3" in CHIPS["trn2"].native_dtypes
    assert {"mxfp8", "mxfp4"} <= set(CHIPS["trn3"].native_dtypes)
    assert "mxfp8" not in CHIPS["trn2"].native_dtypes
    assert CHIPS["trn1"].flag_gated_dtypes == ()
    assert CHIPS["trn2"].flag_gated_dtypes == ("int64", "uint64")


def test_tensor_flops_per_dtype():
    trn2 = CHIPS["trn2"]
    assert trn2.tensor_flops_per_second("float16") == trn2.tensor_bf16_flops_per_second
    assert trn2.tensor_flops_per_second("float8_e4m3") == trn2.tensor_fp8_flops_per_second
    assert trn2.tensor_flops_per_second("mxfp8") is None
    assert trn2.tensor_flops_per_second("float64") is None
    assert CHIPS["trn3"].tensor_flops_per_second("mxfp4") == pytest.approx(315e12)


def test_lnc_support():
    assert CHIPS["trn1"].supported_lnc == (1,)
    for name in ("trn2", "trn3"):
        assert CHIPS[name].supported_lnc == (1, 2)
        assert CHIPS[name].default_lnc == 2
    for chip in CHIPS.values():
        assert chip.default_lnc in chip.supported_lnc


@pytest.mark.parametrize(
    "alias, expected",
    [
        ("trn1", "trn1"),
        ("inf2", "trn1"),
        ("GEN2", "trn1"),
        ("trn2", "trn2"),
        ("Gen3", "trn2"),
        ("TRN3", "trn3"),
        ("gen4", "trn3"),
    ],
)
def test_get_chip_accepts_target_override_spellings(alias, expected):
    assert get_chip(alias).name == expected


@pytest.mark.parametrize("bad", ["trn4", "", "trainium2", "gen 3"])
def test_get_chip_rejects_unknown_and_lists_valid(bad):
    with pytest.raises(ValueError, match="NEURON_PLATFORM_TARGET_OVERRIDE") as info:
        get_chip(bad)
    assert "trn2|gen3" in str(info.value)


def test_instances_are_only_those_named_in_facts():
    # trainium-facts.md: Instances (Trn1 "for comparisons": 1 chip, 16 chips, 16 chips with 2x EFA);
    # Topology: Trn3 UltraServers Gen1 (64 chips) and Gen2 (144 chips), planned as one unit each
    # under names of ours since the sheet gives no Trn3 instance type.
    assert set(INSTANCES) == {"trn2.3xlarge", "trn2.48xlarge", "trn2u.48xlarge",
                              "trn1.2xlarge", "trn1.32xlarge", "trn1n.32xlarge",
                              "trn3-ultraserver-gen1", "trn3-ultraserver-gen2"}
    assert (INSTANCES["trn3-ultraserver-gen1"].num_chips,
            INSTANCES["trn3-ultraserver-gen2"].num_chips) == (64, 144)
    assert (INSTANCES["trn3-ultraserver-gen1"].efa_gbps,
            INSTANCES["trn3-ultraserver-gen2"].efa_gbps) == (12800, 28800)
    assert INSTANCES["trn2.3xlarge"].num_chips == INSTANCES["trn1.2xlarge"].num_chips == 1
    assert {n: i.chip for n, i in INSTANCES.items() if n.startswith("trn1")} == dict.fromkeys(
        ("trn1.2xlarge", "trn1.32xlarge", "trn1n.32xlarge"), "trn1")
    assert (INSTANCES["trn1.32xlarge"].efa_gbps, INSTANCES["trn1n.32xlarge"].efa_gbps,
            INSTANCES["trn2.48xlarge"].efa_gbps) == (800, 1600, 3200)


def test_trn2_48xlarge_hbm_is_1_5_tib():
    # trainium-facts.md: Instances, "16 chips, ... 1.5 TiB HBM".
    inst = get_instance("TRN2.48XLARGE")
    assert inst.num_chips * CHIPS[inst.chip].hbm_bytes_per_chip == 1.5 * 2**40


def test_get_instance_rejects_unknown():
    with pytest.raises(ValueError, match="TORCHNEURON_INSTANCE"):
        get_instance("trn3.48xlarge")  # no Trn3 instance type is on the sheet


def test_specs_are_frozen_and_keyword_only():
    chip = CHIPS["trn2"]
    with pytest.raises(dataclasses.FrozenInstanceError):
        chip.hbm_bytes_per_chip = 0
    with pytest.raises(dataclasses.FrozenInstanceError):
        INSTANCES["trn2.3xlarge"].num_chips = 2
    with pytest.raises(TypeError):
        InstanceSpec("trn2.3xlarge", "trn2", 1)
    assert dataclasses.replace(chip, name="x").name == "x"
    assert isinstance(chip, ChipSpec)


def test_hardware_does_not_import_torch():
    # Stub the parent package so only torchneuron.hardware's own imports are measured,
    # whatever torchneuron/__init__.py grows to import.
    root = Path(__file__).resolve().parents[2]
    code = (
        "import sys, types\n"
        "pkg = types.ModuleType('torchneuron')\n"
        f"pkg.__path__ = [{str(root / 'torchneuron')!r}]\n"
        "sys.modules['torchneuron'] = pkg\n"
        "import torchneuron.hardware\n"
        "sys.exit('torch' in sys.modules)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
