"""Helpers shared by the nki.isa tests: tiles placed in a running kernel, kernels from closures."""

from __future__ import annotations

import os
import sys

import ml_dtypes
import numpy as np
import pytest

import torchneuron.nki.isa as nisa
from torchneuron.nki import context
from torchneuron.nki.dtypes import resolve
from torchneuron.nki.errors import NkiValidationError
from torchneuron.nki.kernel import simulate
from torchneuron.nki.memory import Allocation, Buffer
from torchneuron.nki.tensor import NkiTensor

SBUF, PSUM, HBM = Buffer.sbuf, Buffer.psum, Buffer.shared_hbm


def tile(shape, dtype="float32", buffer=SBUF, name="t", address=None) -> NkiTensor:
    """A fresh (uninitialised) tile placed in the running kernel's memory."""
    alloc = Allocation.create(buffer, tuple(shape), resolve(dtype), name)
    tensor = NkiTensor(alloc)
    context.current().memory().place(alloc, address, tensor)
    return tensor


def hbm(values, name="in") -> NkiTensor:
    """An HBM tensor holding a copy of ``values`` in their own dtype."""
    values = np.asarray(values)
    return NkiTensor(Allocation.create(HBM, values.shape, resolve(values.dtype), name, initial=values.copy()))


def put(values, dtype=None, buffer=SBUF, name="t") -> NkiTensor:
    """A tile of ``dtype`` holding ``values``, loaded by a recorded dma_copy (PSUM: plus a tensor_copy)."""
    values = np.asarray(values)
    dtype = resolve(dtype or values.dtype)
    src = tile(values.shape, dtype, HBM, name + "_hbm")
    src.write(values.astype(np.float32) if dtype.is_float else values)
    on_chip = tile(values.shape, dtype, SBUF, name)
    nisa.dma_copy(dst=on_chip, src=src)
    if buffer is PSUM:
        psum = tile(values.shape, dtype, PSUM, name + "_psum")
        nisa.tensor_copy(dst=psum, src=on_chip)
        return psum
    return on_chip


def run(fn, target="trn2", uninitialized="error") -> context.KernelRun:
    """Run ``fn()`` as a kernel; returns the run (instruction log)."""
    def kernel():
        fn()
    return simulate(kernel, target=target, uninitialized=uninitialized).run_numpy((), {})[1]


def fails(fn, *needles, target="trn2", error=NkiValidationError) -> str:
    """``fn`` as a kernel raises ``error`` whose message holds every needle and the caller's file:line."""
    caller = os.path.basename(sys._getframe(1).f_code.co_filename)
    with pytest.raises(error) as info:
        run(fn, target=target)
    text = str(info.value)
    for needle in needles:
        assert needle in text, f"{needle!r} not in {text!r}"
    assert f"{caller}:" in text  # points at the kernel line
    return text


def rounded(values, dtype=ml_dtypes.bfloat16):
    """``values`` rounded through ``dtype`` (default bfloat16) and back to float32 (the reference
    for bf16 inputs)."""
    return np.asarray(values, dtype=np.float32).astype(dtype).astype(np.float32)
