"""Shared helpers for the neuron device tests."""

import os
import subprocess
import sys
import textwrap

import pytest
import torch

import torchneuron


def on_device(t: torch.Tensor, index: int | None = None) -> bool:
    """True if ``t`` is a neuron tensor whose bytes live in its device's memory."""
    if t.device.type != "neuron":
        return False
    if index is not None and t.device.index != index:
        return False
    return t.numel() == 0 or torchneuron._C._is_device_memory(t)


def run_python(code: str, env: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    """Runs ``code`` in a fresh interpreter; ``env`` entries are added (None removes)."""
    full_env = dict(os.environ)
    for key in ("NEURON_PLATFORM_TARGET_OVERRIDE", "NEURON_LOGICAL_NC_CONFIG",
                "NEURON_RT_VISIBLE_CORES", "TORCHNEURON_INSTANCE",
                "TORCH_DEVICE_BACKEND_AUTOLOAD"):
        full_env.pop(key, None)
    for key, value in (env or {}).items():
        if value is None:
            full_env.pop(key, None)
        else:
            full_env[key] = value
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=full_env, capture_output=True, text=True, timeout=timeout,
    )


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
