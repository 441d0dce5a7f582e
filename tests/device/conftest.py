"""Shared helpers for the neuron device tests."""

import pytest
import torch

from torchneuron.testing import is_on_neuron as on_device, run_python  # noqa: F401 (test modules import them from here)


@pytest.fixture(autouse=True)
def _restore_neuron_state():
    """Every test leaves the current device, default device and memory limits as it found them."""
    prev_device = torch.neuron.current_device()
    fractions = [torch.neuron.get_per_process_memory_fraction(i)
                 for i in range(torch.neuron.device_count())]
    try:
        yield
    finally:
        torch.neuron.set_device(prev_device)
        torch.set_default_device(None)
        for i, f in enumerate(fractions):
            torch.neuron.set_per_process_memory_fraction(f, i)


@pytest.fixture
def restore_rng():
    """Restores the CPU and every neuron generator's state after the test."""
    cpu_state = torch.get_rng_state()
    states = torch.neuron.get_rng_state_all()
    try:
        yield
    finally:
        torch.set_rng_state(cpu_state)
        torch.neuron.set_rng_state_all(states)


@pytest.fixture
def fresh_accounting():
    """The test starts with no placement decisions, no warnings given and zeroed counters."""
    import torchneuron
    from torchneuron.device import fallback

    fallback.configure()
    torchneuron.metrics.reset()
    yield
    fallback.configure()
