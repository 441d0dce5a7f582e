"""PyTorch's OptimizerInfo database (``common_optimizers.optim_db``) on ``neuron`` vs CPU.

For every OptimizerInfo and every config its ``optim_inputs_func(device="cpu")`` gives
(the kwargs PyTorch's own TestOptim uses), and for every implementation the optimizer
has on CPU:

* ``foreach=False`` and ``foreach=True`` when ``"foreach"`` is in ``supported_impls``
  (passed explicitly: neuron is a foreach-supported device and would default to
  foreach, CPU would not; like is compared with like);
* ``fused=True`` when ``"cpu" in supports_fused_on`` and ``"fused"`` in ``supported_impls``;
* ``default`` (no impl flag) for the optimizers that have neither (LBFGS, Muon, SparseAdam),

identical parameters take ``STEPS`` steps on CPU and on neuron. Each step's gradients
come from the same small loss (a tanh-linear model on per-step data from a seeded CPU
generator) computed on each device; LBFGS steps with that closure. After every step the
parameters, and at the end the whole ``state_dict`` (state and param_groups), must be
**bitwise** equal: both devices run the same optimizer code and the same CPU kernels.
Every parameter, grad and per-parameter state tensor must be a neuron tensor.

Parameter sets: float32 (every optimizer), float64 (full run), and complex64 for the
optimizers whose OptimizerInfo says ``supports_complex`` (not with ``fused``: the fused
kernels take real floating point only, on CPU too). Muon gets only its 2-D weight (it
rejects other shapes); SparseAdam gets an embedding table with sparse gradients (it
rejects dense ones).

Configs that the optimizer itself rejects on CPU are skipped at run time with CPU's
error as the reason (none in torch 2.13: the table below was empty when written); the
neuron run never decides a skip.

Each test runs with one intra-op thread on both devices (``conformance_support.one_thread``).

Runs: SGD, Adam and AdamW (every config, foreach and fused, float32) run by default;
the whole database (no sampling, ~20 s) is marked ``conformance``:
``python -m pytest -q -m conformance tests/conformance/``.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch.testing._internal.common_optimizers import optim_db

from conformance_support import one_thread  # noqa: F401  (autouse: one intra-op thread per test)
from conformance_support import (assert_on_device, assert_same, expected_failure, param,
                                 variant_keys)
from expected_failures import CATEGORIES, OPTIMIZERS

EXPECTED_FAILURES = OPTIMIZERS  # tests/conformance/expected_failures.py

STEPS = 3
EXACT = dict(atol=0.0, rtol=0.0)

SLICE = {"SGD", "Adam", "AdamW"}
SLICE_DTYPES = (torch.float32,)
FULL_DTYPES = (torch.float32, torch.float64, torch.complex64)


def _impls(opt_info):
    impls = []
    if "foreach" in opt_info.supported_impls:
        impls += ["foreach=False", "foreach=True"]
    if "cpu" in opt_info.supports_fused_on and "fused" in opt_info.supported_impls:
        impls.append("fused=True")
    return impls or ["default"]


def _cases(names=None, dtypes=FULL_DTYPES, marks=()):
    cases = []
    for info in optim_db:
        if names is not None and info.name not in names:
            continue
        for config_index, optim_input in enumerate(info.optim_inputs_func(device="cpu")):
            for impl in _impls(info):
                for dtype in dtypes:
                    if dtype.is_complex and (not info.supports_complex or impl == "fused=True"
                                             or info.only_supports_sparse_grads):
                        continue
                    dname = str(dtype).removeprefix("torch.")
                    desc = optim_input.desc
                    reason = expected_failure(EXPECTED_FAILURES,
                                              *variant_keys(info.name, desc, impl, dname))
                    cases.append(param((info, config_index, impl, dtype),
                                       test_id=f"{info.name}-{desc}-{impl}-{dname}",
                                       reason=reason, marks=marks))
    return cases


def _make_params(opt_info, dtype):
    """The CPU parameters, from a fixed seed."""
    g = torch.Generator().manual_seed(0)
    if opt_info.only_supports_sparse_grads:
        return [torch.randn(10, 3, generator=g, dtype=dtype).requires_grad_()]
    weight = torch.randn(4, 5, generator=g, dtype=dtype).requires_grad_()
    if opt_info.name == "Muon":  # Muon only takes 2-D parameters
        return [weight]
    bias = torch.randn(4, generator=g, dtype=dtype).requires_grad_()
    return [weight, bias]


def _batches(opt_info, dtype, steps):
    """Per-step (input, target) on CPU, the same for both devices."""
    g = torch.Generator().manual_seed(1)
    batches = []
    for _ in range(steps):
        if opt_info.only_supports_sparse_grads:
            x = torch.randint(0, 10, (6,), generator=g)
            y = torch.randn(6, 3, generator=g, dtype=dtype)
        else:
            x = torch.randn(6, 5, generator=g, dtype=dtype)
            y = torch.randn(6, 4, generator=g, dtype=dtype)
        batches.append((x, y))
    return batches


def _loss(opt_info, params, x, y):
    if opt_info.only_supports_sparse_grads:
        out = F.embedding(x, params[0], sparse=True)
    else:
        out = x @ params[0].T
        if len(params) > 1:
            out = out + params[1]
    if not out.is_complex():
        out = out.tanh()
    return (out - y).abs().pow(2).sum()


def _run(opt_info, kwargs, dtype, device):
    params = [p.detach().to(device).requires_grad_() for p in _make_params(opt_info, dtype)]
    optimizer = opt_info.optim_cls(params, **copy.deepcopy(kwargs))
    history = []
    for x, y in _batches(opt_info, dtype, STEPS):
        x, y = x.to(device), y.to(device)

        def closure():
            optimizer.zero_grad()
            loss = _loss(opt_info, params, x, y)
            loss.backward()
            return loss

        if opt_info.step_requires_closure:
            loss = optimizer.step(closure)
        else:
            loss = closure()
            optimizer.step()
        history.append(([p.detach().clone() for p in params], [p.grad.clone() for p in params],
                        loss.detach().clone()))
    return params, optimizer, history


def _compare_state(dev, cpu, where):
    """Recursive exact comparison of (part of) a state_dict; neuron tensors must stay on neuron."""
    if isinstance(cpu, torch.Tensor):
        assert isinstance(dev, torch.Tensor), f"{where}: {type(dev).__name__} vs tensor"
        if cpu.dim() > 0:  # per-parameter state; scalar 'step'-like entries may live on CPU
            assert_on_device([dev], where)
        assert_same(dev, cpu, **EXACT, what=where)
    elif isinstance(cpu, dict):
        assert isinstance(dev, dict) and dev.keys() == cpu.keys(), f"{where}: keys {dev} vs {cpu}"
        for k in cpu:
            _compare_state(dev[k], cpu[k], f"{where}.{k}")
    elif isinstance(cpu, (list, tuple)):
        assert type(dev) is type(cpu) and len(dev) == len(cpu), f"{where}: {dev} vs {cpu}"
        for i, (d, c) in enumerate(zip(dev, cpu)):
            _compare_state(d, c, f"{where}[{i}]")
    else:
        assert dev == cpu, f"{where}: {dev!r} vs {cpu!r}"


def check_optimizer(opt_info, config_index: int, impl: str, dtype: torch.dtype) -> None:
    optim_input = opt_info.optim_inputs_func(device="cpu")[config_index]
    kwargs = dict(optim_input.kwargs)
    if impl != "default":
        flag, value = impl.split("=")
        kwargs[flag] = value == "True"
    where = f"{opt_info.name} ({optim_input.desc}, {impl}, {dtype})"

    try:
        cpu_params, cpu_opt, cpu_history = _run(opt_info, kwargs, dtype, "cpu")
    except (RuntimeError, ValueError, TypeError) as e:
        pytest.skip(f"not applicable: the optimizer rejects this config on CPU: {e}")
    dev_params, dev_opt, dev_history = _run(opt_info, kwargs, dtype, "neuron")

    for step, ((dp, dg, dl), (cp, cg, cl)) in enumerate(zip(dev_history, cpu_history)):
        assert_on_device(dp + dg + [dl], f"{where} step {step}: params/grads/loss")
        assert_same(dl, cl, **EXACT, what=f"{where} step {step}: loss")
        for i, (d, c) in enumerate(zip(dg, cg)):
            if c.is_sparse:  # SparseAdam's embedding grads
                d, c = d.to_dense(), c.to_dense()
            assert_same(d, c, **EXACT, what=f"{where} step {step}: grad of param {i}")
        for i, (d, c) in enumerate(zip(dp, cp)):
            assert_same(d, c, **EXACT, what=f"{where} step {step}: param {i}")
    assert_on_device(dev_params, f"{where}: params")
    _compare_state(dev_opt.state_dict(), cpu_opt.state_dict(), f"{where}: state_dict")


@pytest.mark.parametrize("opt_info,config_index,impl,dtype", _cases(SLICE, SLICE_DTYPES))
def test_optimizer_slice_matches_cpu(opt_info, config_index, impl, dtype):
    check_optimizer(opt_info, config_index, impl, dtype)


@pytest.mark.parametrize("opt_info,config_index,impl,dtype",
                         _cases(marks=(pytest.mark.conformance,)))
def test_optimizer_matches_cpu(opt_info, config_index, impl, dtype):
    check_optimizer(opt_info, config_index, impl, dtype)


def test_expected_failures_name_real_optimizers():
    """Every EXPECTED_FAILURES key names an OptimizerInfo and, if given, a real config/impl/dtype."""
    infos = {info.name: info for info in optim_db}
    for key, reason in EXPECTED_FAILURES.items():
        name = key.split("/")[0]
        assert name in infos, f"{key}: no OptimizerInfo named {name}"
        info = infos[name]
        known = {oi.desc for oi in info.optim_inputs_func(device="cpu")}
        known |= set(_impls(info)) | {str(d).removeprefix("torch.") for d in FULL_DTYPES}
        rest = key[len(name):].lstrip("/")
        for part in sorted(known, key=len, reverse=True):  # descs may contain "/"
            rest = rest.replace(part, "")
        assert not rest.strip("/"), f"{key}: unknown variant {rest!r}"
        assert reason.split(":")[0] in CATEGORIES, f"{key}: uncategorised reason"
