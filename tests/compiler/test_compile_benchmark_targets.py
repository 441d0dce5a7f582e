"""benchmarks/compile.py judges its timings by the README's targets: compiled neuron within
1.1x of CPU Inductor, and gaining at least 0.9x of Inductor's own speed-up over eager CPU
(not the old fixed ">= 1.5x" over eager neuron, which Inductor itself misses on this host)."""

import importlib.util
import sys
from pathlib import Path

import pytest
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("compile_benchmark", ROOT / "benchmarks" / "compile.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop(spec.name, None)


def _medians(eager_neuron, compiled_neuron, eager_cpu, cpu_inductor):
    return {"eager neuron": eager_neuron, "compiled neuron": compiled_neuron,
            "eager CPU": eager_cpu, "CPU Inductor": cpu_inductor}


# Medians (ms): eager neuron, compiled neuron, eager CPU, CPU Inductor.
CASES = [
    _medians(18.5, 12.6, 18.3, 11.9),  # README's 2nd train run: 1.47x, the old target's MISS
    _medians(20.0, 20.0, 20.0, 10.0),  # no gain where Inductor doubles: both miss
    _medians(20.0, 11.5, 20.0, 10.0),  # 1.15x of Inductor's time
    _medians(30.0, 17.0, 20.0, 16.0),  # a slow eager neuron: a large share
]


@pytest.mark.parametrize("med", CASES)
def test_targets_are_the_readmes(bench, med):
    vs_inductor = med["compiled neuron"] / med["CPU Inductor"]
    share = (med["eager neuron"] / med["compiled neuron"]) / (med["eager CPU"] / med["CPU Inductor"])
    assert bench._targets(med) == (vs_inductor <= 1.1, share >= 0.9)
    assert bench._ratios_pass(med) == (vs_inductor <= 1.1 and share >= 0.9)


def test_a_run_the_old_target_missed_passes(bench):
    assert bench._ratios_pass(CASES[0]) and not bench._ratios_pass(CASES[1])


def test_printed_targets(bench):
    console = Console(record=True, width=200)
    prepared = {c.name: bench.Prepared(first_call_s=1.0) for c in bench.CONFIGS}
    bench._report(console, Table, "train", prepared, _medians(18.5, 12.6, 18.3, 11.9), {}, [])
    text = console.export_text()
    assert "<= 1.1x" in text and ">= 0.9x" in text
    assert "1.5x" not in text and "MISS" not in text
    assert text.count("PASS") >= 2
