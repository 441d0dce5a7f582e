"""Every torch.optim optimizer steps identically on neuron and CPU."""

import copy

import pytest
import torch
import torch.nn as nn
from torch.testing import assert_close

from conftest import on_device

OPTIMIZERS = {
    "SGD": (torch.optim.SGD, dict(lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.01)),
    "Adam": (torch.optim.Adam, dict(lr=0.01, weight_decay=0.01, amsgrad=True)),
    "AdamW": (torch.optim.AdamW, dict(lr=0.01)),
    "Adagrad": (torch.optim.Adagrad, dict(lr=0.1, lr_decay=0.01)),
    "Adadelta": (torch.optim.Adadelta, dict(lr=1.0)),
    "Adamax": (torch.optim.Adamax, dict(lr=0.01)),
    "ASGD": (torch.optim.ASGD, dict(lr=0.01, t0=1)),
    "NAdam": (torch.optim.NAdam, dict(lr=0.01)),
    "RAdam": (torch.optim.RAdam, dict(lr=0.01)),
    "RMSprop": (torch.optim.RMSprop, dict(lr=0.01, momentum=0.5, centered=True)),
    "Rprop": (torch.optim.Rprop, dict(lr=0.01)),
}
FUSED = {"Adam", "AdamW", "SGD", "Adagrad"}

CASES = [(name, mode) for name in OPTIMIZERS for mode in ("foreach=False", "foreach=True")]
CASES += [(name, "fused=True") for name in OPTIMIZERS if name in FUSED]


def _train(device, make_opt, steps=4, closure_style=False):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 7), nn.Tanh(), nn.Linear(7, 3)).to(device)
    opt = make_opt(model.parameters())
    g = torch.Generator().manual_seed(1)
    batches = [(torch.randn(6, 5, generator=g), torch.randn(6, 3, generator=g)) for _ in range(steps)]
    for x, y in batches:
        x, y = x.to(device), y.to(device)

        def closure():
            opt.zero_grad()
            loss = nn.functional.mse_loss(model(x), y, reduction="sum")
            loss.backward()
            return loss

        if closure_style:
            opt.step(closure)
        else:
            closure()
            opt.step()
    return model, opt


@pytest.mark.parametrize("name,mode", CASES, ids=[f"{n}-{m}" for n, m in CASES])
def test_optimizer_steps_match_cpu(name, mode):
    cls, kwargs = OPTIMIZERS[name]
    key, value = mode.split("=")
    kwargs = {**kwargs, key: value == "True"}
    model_c, opt_c = _train("cpu", lambda p: cls(p, **kwargs))
    model_n, opt_n = _train("neuron", lambda p: cls(p, **kwargs))
    for p_c, p_n in zip(model_c.parameters(), model_n.parameters()):
        assert p_n.device.type == "neuron" and on_device(p_n)
        assert_close(p_n.detach().cpu(), p_c.detach(), rtol=0, atol=0)
    # optimizer state lives on the device too (except CPU-kept scalars like `step`)
    for p_n in model_n.parameters():
        for k, v in opt_n.state[p_n].items():
            if torch.is_tensor(v) and v.dim() > 0:
                assert v.device.type == "neuron", k
    for p_c, p_n in zip(model_c.parameters(), model_n.parameters()):
        for k, v in opt_c.state[p_c].items():
            if torch.is_tensor(v):
                assert_close(opt_n.state[p_n][k].cpu(), v, rtol=0, atol=0)


def test_lbfgs_matches_cpu():
    make = lambda p: torch.optim.LBFGS(p, lr=0.5, max_iter=5, history_size=3)
    model_c, _ = _train("cpu", make, steps=2, closure_style=True)
    model_n, _ = _train("neuron", make, steps=2, closure_style=True)
    for p_c, p_n in zip(model_c.parameters(), model_n.parameters()):
        assert p_n.device.type == "neuron" and on_device(p_n)
        assert_close(p_n.detach().cpu(), p_c.detach(), rtol=0, atol=0)


def test_optimizer_state_dict_round_trip_to_neuron():
    model_c, opt_c = _train("cpu", lambda p: torch.optim.Adam(p, lr=0.01))
    torch.manual_seed(0)
    model_n = nn.Sequential(nn.Linear(5, 7), nn.Tanh(), nn.Linear(7, 3)).to("neuron")
    model_n.load_state_dict(model_c.state_dict())
    opt_n = torch.optim.Adam(model_n.parameters(), lr=0.01)
    opt_n.load_state_dict(copy.deepcopy(opt_c.state_dict()))  # `step` would be shared
    for state in opt_n.state.values():
        assert state["exp_avg"].device.type == "neuron"
    x = torch.randn(2, 5)
    for model, opt, dev in ((model_c, opt_c, "cpu"), (model_n, opt_n, "neuron")):
        opt.zero_grad()
        model(x.to(dev)).sum().backward()
        opt.step()
    for p_c, p_n in zip(model_c.parameters(), model_n.parameters()):
        assert_close(p_n.detach().cpu(), p_c.detach(), rtol=0, atol=0)


def test_lr_scheduler_with_neuron_params():
    model = nn.Linear(3, 1).to("neuron")
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    model(torch.ones(1, 3, device="neuron")).sum().backward()
    opt.step()
    sched.step()
    assert opt.param_groups[0]["lr"] == 0.5


def test_foreach_op_runs_as_one_op_over_all_tensors_equal_to_cpu():
    """A foreach op (torch.optim's default path on neuron) is one dispatch over its
    lists, not one per tensor, and computes what CPU's foreach computes."""
    from torchneuron.profiler import metrics

    g = torch.Generator().manual_seed(0)
    shapes = [(64, 32), (32,), (10, 64), (10,)]
    cpu = [torch.randn(s, generator=g) for s in shapes]
    cpu_other = [torch.randn(s, generator=g) for s in shapes]
    dev = [t.to("neuron") for t in cpu]
    dev_other = [t.to("neuron") for t in cpu_other]
    metrics.reset()
    torch._foreach_addcmul_(dev, dev_other, dev_other, value=0.5)
    roots = torch._foreach_sqrt(dev_other)
    calls = {c.op: c.calls for c in metrics.ops()}
    assert calls.get("aten::_foreach_addcmul_.Scalar") == 1
    assert calls.get("aten::_foreach_sqrt") == 1
    assert "aten::addcmul_" not in calls and "aten::sqrt" not in calls
    torch._foreach_addcmul_(cpu, cpu_other, cpu_other, value=0.5)
    for got, want in zip(dev, cpu):
        assert on_device(got) and torch.equal(got.cpu(), want)
    for got, want in zip(roots, torch._foreach_sqrt(cpu_other)):  # NaN where negative
        assert on_device(got)
        assert_close(got.cpu(), want, rtol=0, atol=0, equal_nan=True)
