"""The simulator's instruction budget stops a runaway kernel with an error naming its loop.

Without it a kernel that never stops issuing instructions grows its instruction log
until the host runs out of memory. The budget is ``TORCHNEURON_NKI_MAX_INSTRUCTIONS``
(default 1,000,000) or ``nki.simulate(kernel, max_instructions=...)``.
"""

from __future__ import annotations

import inspect

import numpy as np
import pytest
import torch

import torchneuron.nki as nki
import torchneuron.nki.language as nl
from torchneuron import config
from torchneuron.nki.errors import NkiInstructionLimitError, NkiValidationError


def _line(fn, marker: str) -> int:
    lines, first = inspect.getsourcelines(fn)
    return first + next(i for i, line in enumerate(lines) if marker in line)


@nki.jit
def runaway(a):
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    while True:  # LOOP
        nl.store(out, value=nl.load(a))  # ISSUE
    return out


def _copy_rows(a, out, rows):
    for r in range(rows):  # INNER
        nl.store(out[r:r + 1, :], value=nl.load(a[r:r + 1, :]))  # HELPER


@nki.jit
def runaway_through_helper(a):
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    step = 0
    while step >= 0:  # OUTER
        _copy_rows(a, out, 2)
        step += 1
    return out


@nki.jit
def copies(a, n):
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    for _ in range(n):
        nl.store(out, value=nl.load(a))
    return out


def test_a_runaway_kernel_is_stopped_with_an_error_naming_its_loop():
    a = np.ones((128, 64), np.float32)
    with pytest.raises(NkiInstructionLimitError) as info:
        nki.simulate(runaway, max_instructions=500)(a)
    text = str(info.value)
    assert isinstance(info.value, NkiValidationError)
    assert f"test_nki_budget.py:{_line(runaway.fn, '# ISSUE')} in runaway: " in text
    assert f"test_nki_budget.py:{_line(runaway.fn, '# LOOP')} (while True:)" in text
    assert "issued 500 instructions, the simulator's instruction budget" in text
    assert "TORCHNEURON_NKI_MAX_INSTRUCTIONS" in text and "max_instructions=" in text
    assert len(runaway.last_run.instructions) == 500  # the log stopped growing at the budget


def test_the_loops_of_the_kernel_and_of_its_helpers_are_named_outermost_first():
    with pytest.raises(NkiInstructionLimitError) as info:
        nki.simulate(runaway_through_helper, max_instructions=100)(np.ones((4, 8), np.float32))
    text = str(info.value)
    outer = _line(runaway_through_helper.fn, "# OUTER")
    inner = _line(_copy_rows, "# INNER")
    assert (f"inside the loops at test_nki_budget.py:{outer} (while step >= 0:) > "
            f"test_nki_budget.py:{inner} (for r in range(rows):)") in text
    assert f"test_nki_budget.py:{_line(_copy_rows, '# HELPER')} in _copy_rows" in text


def test_a_kernel_up_to_the_budget_runs_and_one_instruction_more_is_stopped():
    a = np.arange(128 * 64, dtype=np.float32).reshape(128, 64)
    np.testing.assert_array_equal(nki.simulate(copies, max_instructions=20)(a, 10), a)  # 20 DMAs
    with pytest.raises(NkiInstructionLimitError, match="issued 20 instructions"):
        nki.simulate(copies, max_instructions=20)(a, 11)


def test_the_budget_comes_from_the_environment_for_every_kind_of_call():
    a = np.ones((128, 64), np.float32)
    assert int(config.ENV_VARS["TORCHNEURON_NKI_MAX_INSTRUCTIONS"].default) == 1_000_000
    with config.override(TORCHNEURON_NKI_MAX_INSTRUCTIONS="30"):
        with pytest.raises(NkiInstructionLimitError, match="issued 30 instructions"):
            nki.simulate(copies)(a, 16)
        with pytest.raises(NkiInstructionLimitError, match="issued 30 instructions"):
            copies(torch.ones(128, 64, device="neuron"), 16)  # the torch bridge
        np.testing.assert_array_equal(nki.simulate(copies)(a, 15), a)
        # an explicit budget wins over the environment
        np.testing.assert_array_equal(nki.simulate(copies, max_instructions=40)(a, 16), a)


@pytest.mark.parametrize("value", ["0", "-5", "banana", "1e6", "2.5"])
def test_a_bad_budget_setting_is_a_clear_error(value):
    with config.override(TORCHNEURON_NKI_MAX_INSTRUCTIONS=value):
        with pytest.raises(ValueError, match=f"TORCHNEURON_NKI_MAX_INSTRUCTIONS={value!r} is not valid: use a "
                                             "positive integer"):
            nki.simulate(copies)(np.ones((128, 64), np.float32), 1)


@pytest.mark.parametrize("value", [0, -1, 2.5, True, "100"])
def test_a_bad_max_instructions_argument_is_a_clear_error(value):
    with pytest.raises(ValueError, match="max_instructions=.* must be a positive int"):
        nki.simulate(copies, max_instructions=value)(np.ones((128, 64), np.float32), 1)
