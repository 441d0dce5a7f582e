"""The `torchneuron` command: info and the README's demo run and succeed."""

import subprocess
import sys

import pytest
import torch

import torchneuron
from torchneuron import config


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "torchneuron", *args],
        capture_output=True, text=True, timeout=300,
    )


def test_info_lists_the_modelled_devices():
    result = run_cli("info")
    assert result.returncode == 0, result.stderr
    assert "Trainium2" in result.stdout
    assert "NEURON_LOGICAL_NC_CONFIG" in result.stdout
    # the versions and every setting in effect
    assert torch.__version__ in result.stdout and torchneuron.__version__ in result.stdout
    assert [name for name in config.ENV_VARS if name not in result.stdout] == []


def test_demo_trains_on_neuron_and_matches_cpu():
    result = run_cli("demo")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "OK: neuron matches CPU" in result.stdout
    assert "torch.bfloat16" in result.stdout  # the autocast forward ran


# ---------------------------------------------------------------- interleaved timing
class _FakeClock:
    """perf_counter_ns that only moves when a fake run 'takes' time."""

    def __init__(self):
        self.now = 0

    def perf_counter_ns(self):
        return self.now


def test_time_interleaved_alternates_devices_and_takes_medians(monkeypatch):
    from torchneuron.profiler import interleaved

    clock, calls = _FakeClock(), []
    monkeypatch.setattr(interleaved, "time", clock)

    def run(name, us, slow_call):
        def call():
            slow = calls.count(name) == slow_call  # one noisy moment: 50x slower
            calls.append(name)
            clock.now += 1000 * us * (50 if slow else 1)
        return call

    # 2 timed warm-up calls each (the first one slow: it must not shrink the samples), then
    # 6 samples of 2 calls each (65 us / 30 us for the slower)
    med = interleaved.time_interleaved({"cpu": run("cpu", 10, slow_call=0), "neuron": run("neuron", 30, 6)},
                                       rounds=6, sample_ns=65_000, warmup=2)
    assert med == {"cpu": 10.0, "neuron": 30.0}  # medians: the slow sample does not count
    assert calls[:4] == ["cpu", "cpu", "neuron", "neuron"]
    pairs = [["cpu"] * 2 + ["neuron"] * 2, ["neuron"] * 2 + ["cpu"] * 2]
    assert calls[4:] == (pairs[0] + pairs[1]) * 3  # alternating, order reversed each round
    with pytest.raises(ValueError, match="at least one run and one round"):
        interleaved.time_interleaved({}, rounds=3)


def test_demo_times_steps_interleaved(monkeypatch):
    from rich.console import Console

    from torchneuron import cli

    seen = {}

    def fake_time_interleaved(runs, rounds, sample_ns):
        seen.update(devices=set(runs), rounds=rounds)
        for run in runs.values():  # training steps of (copies of) the models: return the loss
            assert run().dim() == 0
        return {"neuron": 1234.0, "cpu": 1000.0}  # microseconds per step

    monkeypatch.setattr(cli, "time_interleaved", fake_time_interleaved)
    console = Console(record=True, width=200)
    assert cli.demo(console, steps=3) == 0
    out = console.export_text()
    assert seen["devices"] == {"neuron", "cpu"} and seen["rounds"] > 1
    assert "1.234 ms" in out and "1.000 ms" in out  # the row shows the interleaved medians
    assert "OK: neuron matches CPU" in out
