"""Helpers shared by the compiler tests."""

from __future__ import annotations

import json

import pytest
import torch

from torchneuron.testing import is_on_neuron as on_neuron, run_python  # noqa: F401 (test modules import on_neuron)
from torchneuron.device import config, fallback, numerics


def generated_code(fn, *args) -> str:
    """Inductor's generated wrapper and kernel source for ``fn(*args)``."""
    from torch._inductor.utils import run_and_get_code

    _, sources = run_and_get_code(fn, *args)
    return "\n".join(sources)


def run_child(code: str, env: dict[str, str], timeout: float = 600) -> dict:
    """Runs ``code`` in a fresh interpreter that prints one JSON line last; returns it."""
    done = run_python(code, env, timeout)
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
