"""PyTorch's ModuleInfo database (``common_modules.module_db``) on ``neuron`` vs CPU.

For every ModuleInfo, every ModuleInput its ``module_inputs_func`` gives, in training
mode (and in eval mode too where the ModuleInfo says ``train_and_eval_differ``), as in
PyTorch's own ``TestModule.test_cpu_gpu_parity``:

1. the module is built on CPU under a fixed seed (lazy modules see one no-grad forward
   to materialize), then ``copy.deepcopy(...).to("neuron")``;
2. the forward inputs are copied to neuron as fresh leaves that keep ``requires_grad``;
3. both forwards run under the same seed (dropout and other random ops draw the same
   numbers: a neuron generator seeded with ``s`` gives CPU's stream for ``s``);
4. outputs and buffers (running stats ...) are compared; then one backward with the
   same grad_outputs for every differentiable output, and input and parameter grads are
   compared;
5. every output and grad must be a neuron tensor, so the test proves the neuron path ran.

dtypes: float32 for every module; float64 too (not a Trainium dtype, but neuron runs
CPU kernels so it must work), for every module in the full run.

Tolerance: the device runs CPU's kernels on the same bytes, so results are expected to
be bitwise equal (atol = rtol = 0). ``TOLERANCES`` lists the modules where a
documented difference of algorithm makes them only close; those use assert_close's
per-dtype defaults (float rounding; much tighter than the atol = rtol = 1e-3 of
PyTorch's ``test_compare_cpu``). Any other difference, however small, is a failure and
goes to ``EXPECTED_FAILURES``; no tolerance is loosened to make a test pass.

Each test runs with one intra-op thread on both devices (``conformance_support.one_thread``).

Runs: the ``SLICE`` families run by default (unmarked, float32, ~15 s); the whole
database -- every ModuleInfo, every ModuleInput, no sampling, about 1 minute on 2 cores --
is marked ``conformance``: ``python -m pytest -q -m conformance tests/conformance/``.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch.testing._internal.common_modules import module_db

from conformance_support import one_thread  # noqa: F401  (autouse: one intra-op thread per test)
from conformance_support import (assert_on_device, assert_same, expected_failure, param,
                                 tensor_leaves, to_device, unique, variant_keys)
from expected_failures import CATEGORIES, MODULE_TOLERANCES, MODULES

# Expected failures and documented tolerances: tests/conformance/expected_failures.py.
EXPECTED_FAILURES = MODULES
TOLERANCES = MODULE_TOLERANCES
EXACT = dict(atol=0.0, rtol=0.0)
# assert_close's per-dtype defaults (float32: atol 1e-5, rtol 1.3e-6; float64: 1e-7, 1e-7):
# float rounding, well inside PyTorch's test_compare_cpu tolerance (atol = rtol = 1e-3).
CLOSE = dict(atol=None, rtol=None)

# The representative slice that runs by default.
SLICE = {
    "nn.Linear", "nn.Conv2d", "nn.BatchNorm2d", "nn.LayerNorm", "nn.MultiheadAttention",
    "nn.LSTM", "nn.Embedding", "nn.TransformerEncoderLayer", "nn.CrossEntropyLoss",
    "nn.GELU", "nn.MaxPool2d",
}
SLICE_DTYPES = (torch.float32,)
FULL_DTYPES = (torch.float32, torch.float64)

SEED = 1234



def _modes(module_info):
    return ("train", "eval") if module_info.train_and_eval_differ else ("train",)


def _cases(names=None, dtypes=FULL_DTYPES, marks=()):
    cases = []
    for info in module_db:
        if names is not None and info.name not in names:
            continue
        for mode in _modes(info):
            for dtype in dtypes:
                if dtype not in info.dtypes:
                    continue
                dname = str(dtype).removeprefix("torch.")
                reason = expected_failure(EXPECTED_FAILURES, *variant_keys(info.name, mode, dname))
                cases.append(param((info, mode == "train", dtype),
                                   test_id=f"{info.name}-{mode}-{dname}", reason=reason, marks=marks))
    return cases


def _differentiable(t: torch.Tensor) -> bool:
    return isinstance(t, torch.Tensor) and t.requires_grad and (t.is_floating_point() or t.is_complex())


def _grads(tensors):
    return [t.grad for t in tensors]


def check_module(module_info, training: bool, dtype: torch.dtype) -> int:
    """Runs every ModuleInput of ``module_info`` on CPU and neuron and compares. Returns the count."""
    tol = CLOSE if module_info.name in TOLERANCES else EXACT
    module_inputs = module_info.module_inputs_func(
        module_info, device="cpu", dtype=dtype, requires_grad=True, training=training)
    assert module_inputs, f"{module_info.name}: no module inputs"
    for i, module_input in enumerate(module_inputs):
        where = f"{module_info.name} input {i} ({module_input.desc or 'no desc'})"
        if module_input.forward_input is None:
            continue
        c_args = module_input.constructor_input.args
        c_kwargs = module_input.constructor_input.kwargs
        cpu_args = module_input.forward_input.args
        cpu_kwargs = module_input.forward_input.kwargs
        # Copy before the CPU forward runs, in case a module writes its input in place.
        dev_args, dev_kwargs = to_device((cpu_args, cpu_kwargs))
        cpu_inputs = unique([t for t in tensor_leaves((cpu_args, cpu_kwargs)) if _differentiable(t)])
        dev_inputs = unique([t for t in tensor_leaves((dev_args, dev_kwargs)) if _differentiable(t)])
        assert len(cpu_inputs) == len(dev_inputs)
        for t in cpu_inputs:
            if not t.is_leaf:
                t.retain_grad()

        torch.manual_seed(SEED)
        cpu_module = module_info.module_cls(*c_args, **c_kwargs).to(dtype)
        cpu_module.train(training)
        if isinstance(cpu_module, torch.nn.modules.lazy.LazyModuleMixin):
            with torch.no_grad():
                cpu_module(*copy.deepcopy(cpu_args), **copy.deepcopy(cpu_kwargs))
        dev_module = copy.deepcopy(cpu_module).to("neuron")
        assert_on_device(list(dev_module.parameters()) + list(dev_module.buffers()),
                         f"{where}: module state")

        # === forward ===
        torch.manual_seed(SEED)  # also seeds every neuron generator: same stream as CPU
        cpu_out = cpu_module(*cpu_args, **cpu_kwargs)
        torch.manual_seed(SEED)
        dev_out = dev_module(*dev_args, **dev_kwargs)

        cpu_outs, dev_outs = tensor_leaves(cpu_out), tensor_leaves(dev_out)
        assert len(cpu_outs) == len(dev_outs), f"{where}: output structure differs"
        assert dev_outs, f"{where}: no tensor output"
        assert_on_device(dev_outs, f"{where}: output")
        for k, (d, c) in enumerate(zip(dev_outs, cpu_outs)):
            assert_same(d, c, **tol, what=f"{where}: output {k}")
        for (name, d), (_, c) in zip(dev_module.named_buffers(), cpu_module.named_buffers()):
            assert_same(d, c, **tol, what=f"{where}: buffer {name} after forward")

        # === backward ===
        pairs = [(c, d) for c, d in zip(cpu_outs, dev_outs) if _differentiable(c)]
        if not pairs:
            continue
        g = torch.Generator().manual_seed(SEED)
        grad_outs = [torch.randn(c.shape, generator=g, dtype=torch.float64).to(c.dtype)
                     if not c.is_complex() else torch.randn(c.shape, generator=g, dtype=c.dtype)
                     for c, _ in pairs]
        torch.autograd.backward([c for c, _ in pairs], grad_outs)
        torch.autograd.backward([d for _, d in pairs], [x.to("neuron") for x in grad_outs])

        for k, (d, c) in enumerate(zip(_grads(dev_inputs), _grads(cpu_inputs))):
            assert (d is None) == (c is None), f"{where}: input grad {k}: {d} vs {c}"
            if d is not None:
                assert_on_device([d], f"{where}: input grad {k}")
                assert_same(d, c, **tol, what=f"{where}: input grad {k}")
        for (name, dp), (_, cp) in zip(dev_module.named_parameters(), cpu_module.named_parameters()):
            assert (dp.grad is None) == (cp.grad is None), f"{where}: grad of {name}: {dp.grad} vs {cp.grad}"
            if dp.grad is not None:
                assert_on_device([dp.grad], f"{where}: grad of {name}")
                assert_same(dp.grad, cp.grad, **tol, what=f"{where}: grad of {name}")
    return len(module_inputs)


@pytest.mark.parametrize("module_info,training,dtype", _cases(SLICE, SLICE_DTYPES))
def test_module_slice_matches_cpu(module_info, training, dtype):
    check_module(module_info, training, dtype)


@pytest.mark.parametrize("module_info,training,dtype",
                         _cases(marks=(pytest.mark.conformance,)))
def test_module_matches_cpu(module_info, training, dtype):
    check_module(module_info, training, dtype)


def test_expected_failures_and_tolerances_name_real_modules():
    """Every EXPECTED_FAILURES / TOLERANCES key names a ModuleInfo (and a real mode/dtype)."""
    names = {info.name for info in module_db}
    for key in list(EXPECTED_FAILURES) + list(TOLERANCES):
        name, *parts = key.split("/")
        assert name in names, f"{key}: no ModuleInfo named {name}"
        assert set(parts) <= {"train", "eval", "float32", "float64"}, f"{key}: unknown variant"
    for key, reason in EXPECTED_FAILURES.items():
        assert reason.split(":")[0] in CATEGORIES, f"{key}: uncategorised reason"
