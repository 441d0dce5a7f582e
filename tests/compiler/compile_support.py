"""Helpers shared by the compiler tests."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import torchneuron
from torchneuron.device import config, fallback, numerics


def on_neuron(t: torch.Tensor, index: int | None = None) -> bool:
    """True if ``t`` is a neuron tensor whose bytes live in its device's memory."""
    if t.device.type != "neuron" or (index is not None and t.device.index != index):
        return False
    return t.numel() == 0 or torchneuron._C._is_device_memory(t)


def generated_code(fn, *args) -> str:
    """Inductor's generated wrapper and kernel source for ``fn(*args)``."""
    from torch._inductor.utils import run_and_get_code

    _, sources = run_and_get_code(fn, *args)
    return "\n".join(sources)


def run_child(code: str, env: dict[str, str], timeout: float = 600) -> dict:
    """Runs ``code`` in a fresh interpreter that prints one JSON line last; returns it."""
    full_env = dict(os.environ)
    for key in ("NEURON_PLATFORM_TARGET_OVERRIDE", "NEURON_LOGICAL_NC_CONFIG", "NEURON_RT_VISIBLE_CORES"):
        full_env.pop(key, None)
    full_env.update(env)
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=full_env,
                          capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


# Autouse fixture: each compiler test module imports it (a tests/compiler conftest.py
# would shadow tests/device's, which its tests import as the module `conftest`).
@pytest.fixture(autouse=True)
def _fresh_compile_state(tmp_path_factory):
    """Each test starts with Dynamo's caches and the compile counters empty, compiles
    into this session's own cache directory, and leaves the device switches as found."""
    cache = tmp_path_factory.getbasetemp() / "neuron-compile-cache"
    torch._dynamo.reset()
    torch.neuron.reset_compile_metrics()
    with config.override(NEURON_COMPILE_CACHE_URL=str(cache)):
        yield
    torch._dynamo.reset()
    numerics.configure()
    fallback.configure()
