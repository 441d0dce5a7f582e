"""Kernel errors point at the kernel: partly written outputs follow the uninitialised-memory
policy, and dtype (and other argument) errors carry the kernel's source line."""

from __future__ import annotations

import gc
import inspect
import warnings

import numpy as np
import pytest
import torch

import torchneuron.nki as nki
import torchneuron.nki.language as nl
from torchneuron.nki.context import UNINITIALIZED_ENV, NkiUninitializedReadWarning
from torchneuron.nki.dtypes import resolve
from torchneuron.nki.errors import NkiUninitializedReadError


def _line(fn, marker: str) -> int:
    lines, first = inspect.getsourcelines(fn)
    return first + next(i for i, line in enumerate(lines) if marker in line)


@nki.jit
def half_written(a):  # DEF
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    nl.store(out[:, 0:32], value=nl.load(a[:, 0:32]))
    return out


PARTLY = "returns 'ndarray@test_nki_reporting.py:{line}' with 4096 of 8192 elements never written"


def _partly() -> str:
    return PARTLY.format(line=_line(half_written.fn, "out = nl.ndarray"))


def test_a_partly_written_output_raises_under_the_error_policy():
    a = np.ones((128, 64), np.float32)
    with pytest.raises(NkiUninitializedReadError) as info:
        nki.simulate(half_written, uninitialized="error")(a)
    text = str(info.value)
    assert _partly() in text
    assert f"test_nki_reporting.py:{_line(half_written.fn, '# DEF')} in half_written: return: " in text
    assert "def half_written(a):" in text


def test_the_environment_setting_raises_as_well_on_neuron_tensors(monkeypatch):
    monkeypatch.setenv(UNINITIALIZED_ENV, "error")
    a = torch.ones(128, 64, device="neuron")
    gc.collect()
    base = torch.neuron.memory_allocated()
    with pytest.raises(NkiUninitializedReadError, match=_partly()):
        half_written(a)
    gc.collect()
    assert torch.neuron.memory_allocated() == base  # the rejected output was freed


def test_warn_and_ignore_still_return_the_partly_written_output():
    a = np.ones((128, 64), np.float32)
    with pytest.warns(NkiUninitializedReadWarning, match=_partly()):
        out = nki.simulate(half_written, uninitialized="warn")(a)
    np.testing.assert_array_equal(out[:, :32], a[:, :32])
    assert np.isnan(out[:, 32:]).all()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = nki.simulate(half_written, uninitialized="ignore")(a)
    assert np.isnan(out[:, 32:]).all()


# ------------------------------------------------------------------------------- dtype errors
@nki.jit
def complex_tile(a):
    t = nl.ndarray((128, 64), dtype="complex64", buffer=nl.sbuf)  # BAD
    return a


@nki.jit
def float64_zeros(a):
    t = nl.zeros((128, 64), dtype=np.float64)  # BAD
    return a


@nki.jit
def missing_dtype(a):
    t = nl.ndarray((128, 64), dtype=None)  # BAD
    return a


@pytest.mark.parametrize("kernel, error, needle", [
    pytest.param(complex_tile, ValueError, "unknown NKI dtype 'complex64'; expected one of", id="complex64"),
    pytest.param(float64_zeros, TypeError, "float64 is not an NKI dtype", id="float64"),
    pytest.param(missing_dtype, TypeError, "nl.ndarray: dtype is required", id="none"),
])
def test_dtype_errors_keep_their_type_and_name_the_kernel_line(kernel, error, needle):
    with pytest.raises(error) as info:
        nki.simulate(kernel)(np.ones((128, 64), np.float32))
    text = str(info.value)
    assert f"test_nki_reporting.py:{_line(kernel.fn, '# BAD')} in {kernel.name}: {needle}" in text
    assert "# BAD" in text  # the kernel's code line is quoted under the message


def test_dtype_errors_outside_a_kernel_have_no_kernel_line():
    with pytest.raises(ValueError) as info:
        resolve("complex64")
    assert str(info.value).startswith("unknown NKI dtype 'complex64'")


@nki.jit
def bad_fill(a):
    t = nl.full((128, 64), "one", dtype=nl.float32)  # BAD
    return a


def test_other_errors_raised_in_a_kernel_get_its_line_as_a_note():
    with pytest.raises(TypeError) as info:
        nki.simulate(bad_fill)(np.ones((128, 64), np.float32))
    notes = getattr(info.value, "__notes__", [])
    assert f"raised by NKI kernel line test_nki_reporting.py:{_line(bad_fill.fn, '# BAD')} in bad_fill: " \
           f"t = nl.full((128, 64), \"one\", dtype=nl.float32)  # BAD" in notes
