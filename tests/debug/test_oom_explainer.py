"""Out-of-memory errors on neuron say what fills the device by category, with byte counts that
match sums over the model's parameters, gradients and optimizer state, and what would fit at
the other LNC setting and on the other chip; tensors and the record are intact afterwards."""

import json
import os
import pathlib
import subprocess
import sys

import pytest
import torch

from torchneuron.device import oom

GiB = 2**30
MiB = 2**20
SCENARIO = pathlib.Path(__file__).with_name("oom_scenario.py")


@pytest.fixture(scope="module")
def scenario():
    """Runs oom_scenario.py in a fresh interpreter (only its tensors on the device)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NEURON_", "TORCHNEURON_"))}
    out = subprocess.run([sys.executable, str(SCENARIO)], capture_output=True, text=True,
                         timeout=300, env=env)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_message_names_the_largest_category_with_exact_bytes(scenario):
    breakdown = scenario["explanation"]["breakdown"]
    got = {c["name"]: c["bytes"] for c in breakdown["categories"]}
    for name, expected in scenario["expected"].items():  # sums over the model's own tensors
        assert got[name] == expected, name
    assert breakdown["largest"] == "optimizer state"  # Adam: two moments per parameter
    assert sum(got.values()) == breakdown["reserved"]
    assert sum(v for k, v in got.items() if k != oom.CACHED) == breakdown["allocated"]
    message = scenario["message"]
    assert message.startswith("Neuron out of memory. Tried to allocate 40.00 MiB.")
    assert "What fills neuron:0" in message
    assert "Largest: optimizer state, 16.02 MiB: shard the optimizer state" in message
    assert scenario["again"] == message  # rebuilt from its args, not explained twice


def test_the_largest_live_blocks_have_their_categories(scenario):
    # Linear(1024, 1024) weights, their gradients and Adam's two moments: 4 MiB blocks each;
    # the biases and the 1 MiB input are smaller.
    blocks = scenario["explanation"]["largest_blocks"]
    assert [b["bytes"] for b in blocks] == [4 * MiB] * 5
    assert {b["category"] for b in blocks} <= {"parameters", "gradients", "optimizer state"}
    assert "largest: 4.00 MiB, 4.00 MiB, 4.00 MiB, 4.00 MiB, 4.00 MiB" in scenario["message"]  # the allocator's line


def test_message_says_what_would_fit_at_the_other_lnc_and_chip(scenario):
    explanation = scenario["explanation"]
    assert explanation["request_bytes"] == 40 * MiB
    assert explanation["need_bytes"] == explanation["breakdown"]["allocated"] + 40 * MiB
    fits = {(f["chip"], f["lnc"]): f for f in explanation["fits"]}
    # trainium-facts.md: a logical core has 1/4 (LNC=2) or 1/8 (LNC=1) of 96 GiB (Trn2), 144 GiB (Trn3).
    hbm = {("trn2", 2): 24 * GiB, ("trn2", 1): 12 * GiB, ("trn3", 2): 36 * GiB, ("trn3", 1): 18 * GiB}
    assert {k: f["device_hbm_bytes"] for k, f in fits.items()} == hbm
    fraction = 64 * MiB / (24 * GiB)  # the scenario's set_per_process_memory_fraction
    for key, f in fits.items():
        assert f["limit_bytes"] == int(hbm[key] * fraction)
        assert f["fits"] == (explanation["need_bytes"] <= f["limit_bytes"])
    assert [k for k, f in fits.items() if f["fits"]] == [("trn3", 2)]
    assert [k for k, f in fits.items() if f["current"]] == [("trn2", 2)]
    assert "trn3 LNC=2: 96.00 MiB of 36.00 GiB: fits" in scenario["message"]
    assert "trn2 LNC=1: 32.00 MiB of 12.00 GiB: does not fit" in scenario["message"]


def test_tensors_memory_and_record_intact_after_the_error(scenario):
    assert scenario["allocated_after"] == scenario["allocated_before"]
    assert scenario["counters_same_after_error"]
    assert scenario["counters_same_after_breakdown"]
    assert scenario["changed_by_the_error"] == []  # parameters, gradients, Adam state: bitwise
    # One more Adam step from that state, as CPU's. Within float32 rounding, not bitwise: in 2 of
    # ~450 runs under heavy host load, neuron and CPU steps differed in the last bits (before the
    # OOM too, both times by the same amounts; cause open: README "Known limits"). A corrupted
    # tensor would differ by far more.
    assert scenario["step_after_oom_not_close_to_cpu"] == "", (scenario["step_after_oom_not_close_to_cpu"],
                                                               scenario["mismatches"])


def test_other_out_of_memory_errors_are_left_alone():
    e = torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
    assert str(e) == "CUDA out of memory. Tried to allocate 2.00 GiB"
    assert not hasattr(e, "memory_explanation")
    assert torch.neuron.OutOfMemoryError is torch.OutOfMemoryError  # as torch.cuda's


def test_a_failing_explainer_keeps_the_oom(monkeypatch):
    def broken(device=None):
        raise RuntimeError("boom")

    monkeypatch.setattr(oom, "memory_breakdown", broken)
    index = torch.neuron.device_count() - 1
    fraction = torch.neuron.get_per_process_memory_fraction(index)
    torch.neuron.set_per_process_memory_fraction(0.0, index)
    try:
        with pytest.raises(torch.OutOfMemoryError) as e:
            torch.empty(4 * MiB, dtype=torch.uint8, device=f"neuron:{index}")
    finally:
        torch.neuron.set_per_process_memory_fraction(fraction, index)
    assert str(e.value).startswith("Neuron out of memory. Tried to allocate 4.00 MiB")
    assert "torchneuron could not break the memory down: RuntimeError: boom" in str(e.value)


def test_breakdown_counts_a_shared_storage_once():
    index = torch.neuron.device_count() - 1
    before = oom.memory_breakdown(index)
    weight = torch.nn.Parameter(torch.zeros(64, 64, device=f"neuron:{index}"))
    view = torch.nn.Parameter(weight.data[:8])  # same storage
    weight.grad = torch.ones_like(weight)
    after = oom.memory_breakdown(index)
    assert after.bytes_of(oom.PARAMETERS) - before.bytes_of(oom.PARAMETERS) == 64 * 64 * 4
    assert after.bytes_of(oom.GRADIENTS) - before.bytes_of(oom.GRADIENTS) == 64 * 64 * 4
    assert sum(c.bytes for c in after.categories) == after.reserved
    del view
