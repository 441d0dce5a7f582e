"""The `torchneuron` command: info and the README's demo run and succeed."""

import subprocess
import sys


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


def test_demo_trains_on_neuron_and_matches_cpu():
    result = run_cli("demo")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "OK: neuron matches CPU" in result.stdout
    assert "torch.bfloat16" in result.stdout  # the autocast forward ran
