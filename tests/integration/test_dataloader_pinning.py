"""``DataLoader(pin_memory=True)`` pins for ``neuron``: the form to use (docs/device.md, "Pinned memory").

PyTorch 2.13 pins DataLoader batches for the current accelerator and ignores
``pin_memory_device`` (it warns that the argument is deprecated). With ``neuron`` as
the accelerator, ``pin_memory=True`` alone gives batches in neuron's pinned host
allocator: ``Tensor.is_pinned()`` asks the accelerator's hooks, i.e. that allocator.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from torchneuron.testing import is_on_neuron


def _dataset() -> TensorDataset:
    return TensorDataset(torch.arange(24.0).view(12, 2), torch.arange(12))


def test_neuron_is_the_accelerator_pinned_memory_belongs_to():
    assert torch.accelerator.current_accelerator() == torch.device("neuron")
    assert torch.randn(4).pin_memory().is_pinned()
    assert not torch.randn(4).is_pinned()


@pytest.mark.parametrize("workers", [0, 1], ids=["main-process", "worker-and-pin-thread"])
def test_pin_memory_true_alone_pins_for_neuron_without_warning(workers):
    data = _dataset()
    loader = DataLoader(data, batch_size=4, pin_memory=True, num_workers=workers)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no deprecation (nor any other) warning
        batches = list(loader)
    assert len(batches) == 3
    for i, (x, y) in enumerate(batches):
        assert x.is_pinned() and y.is_pinned()
        xn = x.to("neuron", non_blocking=True)
        torch.neuron.synchronize()
        assert is_on_neuron(xn)
        assert torch.equal(xn.cpu(), data.tensors[0][4 * i:4 * (i + 1)])


def test_pin_memory_device_is_deprecated_and_ignored():
    loader = DataLoader(_dataset(), batch_size=4, pin_memory=True, pin_memory_device="neuron")
    with pytest.warns(UserWarning, match="pin_memory_device is deprecated"):
        batches = list(loader)
    assert all(x.is_pinned() for x, _ in batches)


def test_without_pin_memory_batches_are_pageable():
    assert not any(x.is_pinned() for x, _ in DataLoader(_dataset(), batch_size=4))
