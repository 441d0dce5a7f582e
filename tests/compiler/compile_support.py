"""Helpers shared by the compiler tests."""

from __future__ import annotations

import json

import pytest
import torch

from torchneuron.testing import accumulation_tolerance, matmul_tolerance, unit_roundoff
from torchneuron.testing import is_on_neuron as on_neuron, run_python  # noqa: F401 (test modules import on_neuron)
from torchneuron import config


def generated_code(fn, *args) -> str:
    """Inductor's generated wrapper and kernel source for ``fn(*args)``."""
    from torch._inductor.utils import run_and_get_code

    _, sources = run_and_get_code(fn, *args)
    return "\n".join(sources)


# ------------------------------------------------------------------ compiled vs eager bounds
# Inductor's fused C++ kernels sum (and contract multiply-adds) in their own order, which
# also depends on the CPU's vector ISA; eager runs ATen's kernels. So a compiled result is
# checked against eager with first-order bounds that scale with the operands: the orders'
# bounds of each matmul and reduction (torchneuron.testing), a few roundings per pointwise op,
# carried through each op's slope.
U32 = unit_roundoff(torch.float32)


def linear_tolerance(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None,
                     x_error: torch.Tensor | float = 0.0) -> torch.Tensor:
    """Bound on the error of ``x @ w (+ bias)`` between two kernels: both matmul orders, the bias
    add (fused or not: 2 roundings), and an error ``x_error`` already in ``x``."""
    x64, w64 = x.detach().double().cpu(), w.detach().double().cpu()
    magnitude = x64.abs() @ w64.abs() + (0 if bias is None else bias.detach().double().cpu().abs())
    carried = torch.as_tensor(x_error, dtype=torch.float64) @ w64.abs() if torch.is_tensor(x_error) else 0.0
    return matmul_tolerance(x, w) + 2 * U32 * magnitude + carried


def softmax_tolerance(logits: torch.Tensor, logit_error: torch.Tensor) -> torch.Tensor:
    """Bound on the error of ``softmax(logits, -1)`` given an error bound on the logits: its
    relative sensitivity is at most twice the largest logit error of the row; the sum of n
    positive terms adds gamma_n per order, the exps and the division a few ulp."""
    p = logits.detach().double().cpu().softmax(-1)
    n = logits.shape[-1]
    relative = 2 * logit_error.amax(-1, keepdim=True) + accumulation_tolerance(1.0, n, torch.float32) + 16 * U32
    return p * relative


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
    into this session's own cache directory (sealed with this session's own key), and
    leaves the device switches as found."""
    cache = tmp_path_factory.getbasetemp() / "neuron-compile-cache"
    key = tmp_path_factory.getbasetemp() / "neuron-compile-cache.key"  # never the user's own key
    torch._dynamo.reset()
    torch.neuron.reset_compile_metrics()
    with config.override(NEURON_COMPILE_CACHE_URL=str(cache), TORCHNEURON_COMPILE_CACHE_KEY_FILE=str(key)):
        yield
    torch._dynamo.reset()
