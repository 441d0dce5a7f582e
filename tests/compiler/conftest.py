"""Fixtures for the torch.compile(backend="neuron") tests."""

import pytest
import torch

from torchneuron.device import config, fallback, numerics


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
