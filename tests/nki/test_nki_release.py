"""A finished NKI kernel run releases everything it held on the device.

``kernel.last_run`` keeps the instruction log (reports, the cost model, tests read it),
never the run's HBM tensors: once the caller drops the kernel's outputs, the device
memory the run allocated (outputs, ``nl.hbm`` scratch) is free again, whether the
kernel returned or raised.
"""

from __future__ import annotations

import gc

import numpy as np
import pytest
import torch

import torchneuron.nki as nki
import torchneuron.nki.language as nl
from torchneuron.nki import NkiValidationError
from torchneuron.nki.bridge import host_view

MiB = 1 << 20


@pytest.fixture
def device_limit():
    """Caps neuron:0 at its current use plus ``extra`` bytes; restores the limit after the test."""
    before = torch.neuron.get_per_process_memory_fraction(0)

    def limit(extra: int) -> None:
        gc.collect()
        torch.neuron.empty_cache()
        total = torch.neuron.get_device_properties(0).total_memory
        torch.neuron.set_per_process_memory_fraction((torch.neuron.memory_reserved(0) + extra) / total, 0)

    yield limit
    torch.neuron.set_per_process_memory_fraction(before, 0)


@nki.jit
def through_scratch(a, copies=4):
    """``a + 1`` computed through ``copies`` stacked HBM scratch copies of ``a``."""
    rows = a.shape[0]
    scratch = nl.ndarray((copies * rows, a.shape[1]), dtype=a.dtype, buffer=nl.hbm)
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    for c in range(copies):
        for i in range(rows // 128):
            tile = nl.load(a[i * 128:(i + 1) * 128, :])
            nl.store(scratch[c * rows + i * 128:c * rows + (i + 1) * 128, :], value=tile)
    for i in range(rows // 128):
        tile = nl.load(scratch[(copies - 1) * rows + i * 128:(copies - 1) * rows + (i + 1) * 128, :])
        nl.store(out[i * 128:(i + 1) * 128, :], value=nl.add(tile, 1.0))
    last = nl.load(scratch[0:128, :])  # the run's newest nl result reads the scratch tensor
    return out


@nki.jit
def fails_after_scratch(a):
    scratch = nl.ndarray((4 * a.shape[0], a.shape[1]), dtype=a.dtype, buffer=nl.hbm)
    nl.store(scratch[0:128, :], value=nl.load(a[0:128, :]))
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    nl.store(out[:, a.shape[1]:2 * a.shape[1]], value=nl.load(scratch[0:128, :]))  # out of bounds
    return out


def _allocated() -> int:
    gc.collect()
    return torch.neuron.memory_allocated(0)


def test_dropping_the_output_frees_every_byte_the_run_allocated():
    a_cpu = torch.randn(1024, 1024)
    a = a_cpu.to("neuron")
    base = _allocated()
    out = through_scratch(a)
    assert torch.equal(out.cpu(), a_cpu + 1)
    assert _allocated() - base == 4 * MiB  # the output; the 16 MiB scratch is already free
    del out
    assert _allocated() == base
    assert through_scratch.last_run is not None
    assert len(through_scratch.last_run.instructions) > 0  # the log stays readable


def test_a_nearly_full_device_can_allocate_again_after_the_output_is_dropped(device_limit):
    kernel = nki.jit(through_scratch.fn)  # a kernel object no earlier test ran
    nki.simulate(kernel)(np.ones((128, 8), np.float32))  # the thread's newest run holds no device memory
    a = torch.randn(1024, 1024, device="neuron")  # 4 MiB
    device_limit(24 * MiB)  # room for the run: 16 MiB of scratch and a 4 MiB output
    out = kernel(a)
    del out
    big = torch.empty(20 * MiB, dtype=torch.uint8, device="neuron")  # what a finished run must leave
    big.fill_(3)
    assert int(big[-1]) == 3


def test_a_kernel_that_raises_frees_its_device_memory_too():
    a = torch.randn(128, 256, device="neuron")
    base = _allocated()
    with pytest.raises(NkiValidationError, match="out of bounds"):
        fails_after_scratch(a)
    assert _allocated() == base


def test_host_views_keep_their_tensor_alive():
    t = torch.arange(1024 * 256, dtype=torch.float32, device="neuron")
    expected = np.arange(1024 * 256, dtype=np.float32)
    base = _allocated()
    view = host_view(t)
    del t
    assert _allocated() == base  # the view holds the memory: it can never read freed memory
    np.testing.assert_array_equal(view, expected)
    del view
    assert _allocated() == base - 1024 * 1024
