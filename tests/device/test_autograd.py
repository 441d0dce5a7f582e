"""Autograd on neuron devices equals CPU autograd."""

import threading

import pytest
import torch
import torch.nn as nn
from torch.utils.checkpoint import checkpoint

from conftest import on_device


def make_mlp(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4))


@pytest.mark.parametrize("dev", [0, 1, 2, 3])
def test_backward_on_every_device_matches_cpu(dev):
    x_c = torch.randn(5, 8, generator=torch.Generator().manual_seed(1))
    m_c = make_mlp()
    m_n = make_mlp().to(f"neuron:{dev}")
    loss_c = m_c(x_c).pow(2).mean()
    loss_n = m_n(x_c.to(f"neuron:{dev}")).pow(2).mean()
    loss_c.backward()
    loss_n.backward()
    assert loss_n.device == torch.device("neuron", dev)
    assert torch.equal(loss_n.cpu(), loss_c)
    for pc, pn in zip(m_c.parameters(), m_n.parameters()):
        assert pn.grad.device == torch.device("neuron", dev)
        assert on_device(pn.grad, dev)
        assert torch.equal(pn.grad.cpu(), pc.grad)


def test_backward_on_non_current_device_keeps_current_device():
    torch.neuron.set_device(0)
    x = torch.randn(4, device="neuron:3", requires_grad=True)
    (x.exp() * x).sum().backward()
    assert torch.neuron.current_device() == 0
    xc = x.detach().cpu().requires_grad_()
    (xc.exp() * xc).sum().backward()
    assert x.grad.device == torch.device("neuron", 3)
    assert torch.equal(x.grad.cpu(), xc.grad)


def _backward_threads(dev: str) -> set[int]:
    """Thread ids on which the backward of a small graph on `dev` ran."""
    seen = set()
    x = torch.randn(4, 3, device=dev, requires_grad=True)
    y = x.sin()
    y.register_hook(lambda g: seen.add(threading.get_ident()))
    x.register_hook(lambda g: seen.add(threading.get_ident()))
    (y * x).sum().backward()
    return seen


def test_backward_runs_on_calling_thread_like_cpu():
    # The device computes on the host: backward stays on the caller's thread
    # (as CPU's does), where its caches are warm and a debugger can stop.
    assert _backward_threads("cpu") == {threading.get_ident()}
    assert _backward_threads("neuron:1") == {threading.get_ident()}
    assert not torch.autograd.is_multithreading_enabled()


def test_backward_on_calling_thread_in_a_new_thread():
    seen, main = {}, threading.get_ident()

    def work():
        seen["threads"], seen["caller"] = _backward_threads("neuron:2"), threading.get_ident()

    t = threading.Thread(target=work)
    t.start()
    t.join()
    assert seen["threads"] == {seen["caller"]} and seen["caller"] != main


def test_first_op_inside_a_multithreading_off_scope_does_not_lose_the_claim():
    # AOTAutograd compiles under set_multithreading_enabled(False) and Inductor may
    # run a thread's first neuron op there: the scope's exit turns multithreading
    # back on, so the thread must still be claimed by its next op.
    seen = {}

    def work():
        with torch.autograd.set_multithreading_enabled(False):
            torch.ones(2, device="neuron").add_(1)
        seen["threads"], seen["caller"] = _backward_threads("neuron:1"), threading.get_ident()
        seen["multithreading"] = torch.autograd.is_multithreading_enabled()

    t = threading.Thread(target=work)
    t.start()
    t.join()
    assert seen["threads"] == {seen["caller"]}
    assert not seen["multithreading"]


def test_autograd_device_threads_can_be_turned_back_on():
    xc = torch.randn(5, requires_grad=True)
    xn = xc.detach().to("neuron:3").requires_grad_()
    (xc.exp() * xc).sum().backward()
    with torch.autograd.set_multithreading_enabled(True):
        threads = _backward_threads("neuron:3")
        (xn.exp() * xn).sum().backward()
    assert threads - {threading.get_ident()}  # PyTorch's device worker ran part of it
    assert torch.equal(xn.grad.cpu(), xc.grad)
    assert not torch.autograd.is_multithreading_enabled()


def test_double_backward_create_graph():
    xc = torch.randn(6, requires_grad=True)
    xn = xc.detach().to("neuron:1").requires_grad_()
    results = []
    for x in (xc, xn):
        y = (x.sin() * x.pow(3)).sum()
        (g,) = torch.autograd.grad(y, x, create_graph=True)
        (gg,) = torch.autograd.grad(g.sum(), x)
        results.append((g, gg))
    (gc, ggc), (gn, ggn) = results
    assert gn.device == torch.device("neuron", 1) and on_device(ggn, 1)
    assert torch.equal(gn.detach().cpu(), gc.detach())
    assert torch.equal(ggn.cpu(), ggc)


def test_tensor_and_module_hooks():
    xc = torch.randn(3, 8)
    seen = {}
    for name, dev in (("cpu", "cpu"), ("neuron", "neuron:2")):
        m = make_mlp().to(dev)
        x = xc.clone().to(dev).requires_grad_()
        x.register_hook(lambda g, name=name: seen.__setitem__(name + ".x", g.clone()))
        handle = m[0].register_full_backward_hook(
            lambda mod, gin, gout, name=name: seen.__setitem__(name + ".mod", gout[0].clone()))
        fwd = m[2].register_forward_hook(lambda mod, inp, out, name=name: out * 2)
        m(x).sum().backward()
        handle.remove()
        fwd.remove()
        seen[name + ".grad"] = m[0].weight.grad
    for k in ("x", "mod", "grad"):
        assert seen[f"neuron.{k}"].device.type == "neuron"
        assert torch.equal(seen[f"neuron.{k}"].cpu(), seen[f"cpu.{k}"])


def test_checkpoint_matches_plain_backward():
    xc = torch.randn(4, 8)
    grads = {}
    for dev, use_ckpt in (("cpu", False), ("neuron", False), ("neuron", True)):
        m = make_mlp().to(dev)
        x = xc.clone().to(dev).requires_grad_()
        y = checkpoint(m, x, use_reentrant=False) if use_ckpt else m(x)
        y.sum().backward()
        grads[(dev, use_ckpt)] = (x.grad.cpu(), m[0].weight.grad.cpu())
        if dev == "neuron":
            assert on_device(x.grad)
    for a, b in zip(grads[("neuron", True)], grads[("cpu", False)]):
        assert torch.equal(a, b)
    for a, b in zip(grads[("neuron", False)], grads[("cpu", False)]):
        assert torch.equal(a, b)


def test_checkpoint_with_dropout_replays_rng():
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(8, 8), nn.Dropout(0.5)).to("neuron")
    x = torch.randn(16, 8, device="neuron", requires_grad=True)
    torch.manual_seed(1)
    out_plain = m(x)
    out_plain.sum().backward()
    g_plain = x.grad.clone()
    x.grad = None
    torch.manual_seed(1)
    out_ckpt = checkpoint(m, x, use_reentrant=False)
    out_ckpt.sum().backward()
    assert torch.equal(out_ckpt.detach().cpu(), out_plain.detach().cpu())
    assert torch.equal(x.grad.cpu(), g_plain.cpu())


def test_grad_of_views_and_inplace():
    for dev in ("cpu", "neuron"):
        x = torch.arange(12.0, device=dev).requires_grad_()
        y = x.clone().view(3, 4)
        y[:, 1].mul_(3)
        y.t()[2].exp_()
        y.sum().backward()
        if dev == "cpu":
            ref = x.grad
        else:
            assert x.grad.device.type == "neuron"
            assert torch.equal(x.grad.cpu(), ref)


def test_no_grad_and_requires_grad_flags():
    x = torch.ones(3, device="neuron", requires_grad=True)
    with torch.no_grad():
        y = x * 2
    assert not y.requires_grad
    z = x * 2
    assert z.requires_grad and z.grad_fn is not None
    assert x.is_leaf and not z.is_leaf


def test_gradcheck_double():
    x = torch.randn(3, 3, dtype=torch.float64, device="neuron", requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: (t @ t).tanh().sum(), (x,))


def test_module_neuron_method_moves_parameters():
    m = make_mlp()
    m.neuron()
    for p in m.parameters():
        assert p.device == torch.device("neuron", 0) and on_device(p)
    m.neuron(2)
    for p in m.parameters():
        assert p.device == torch.device("neuron", 2)
    m.cpu()
    assert all(p.device.type == "cpu" for p in m.parameters())


@pytest.mark.parametrize("make,shape", [
    pytest.param(lambda: nn.LSTM(4, 5, batch_first=True), (2, 3, 4), id="lstm"),
    pytest.param(lambda: nn.GRU(4, 5), (3, 2, 4), id="gru"),
    pytest.param(lambda: nn.RNN(4, 5), (3, 2, 4), id="rnn"),
    pytest.param(lambda: nn.Conv2d(4, 2, 3), (2, 4, 5, 5), id="conv2d"),
    pytest.param(lambda: nn.LayerNorm(4), (3, 4), id="layernorm"),
    pytest.param(lambda: nn.BatchNorm1d(4), (5, 4), id="batchnorm"),
    pytest.param(lambda: nn.MultiheadAttention(4, 2, batch_first=True), (2, 3, 4), id="mha"),
    pytest.param(lambda: nn.Sequential(nn.Linear(4, 6), nn.GELU(), nn.Dropout(0.0), nn.Linear(6, 2)),
                 (3, 4), id="mlp"),
])
def test_module_forward_and_grads_equal_cpu(make, shape):
    # Bitwise, RNNs included: they run CPU's own whole-sequence path (csrc/aten/rnn.cpp).
    torch.manual_seed(0)
    m_c = make()
    torch.manual_seed(0)
    m_n = make().to("neuron")
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(1))
    args_c, args_n = (x,), (x.to("neuron"),)
    if isinstance(m_c, nn.MultiheadAttention):
        args_c, args_n = args_c * 3, args_n * 3
    out_c, out_n = m_c(*args_c), m_n(*args_n)
    if isinstance(out_c, tuple):
        out_c, out_n = out_c[0], out_n[0]
    out_c.sum().backward()
    out_n.sum().backward()
    assert on_device(out_n)
    tol = {"rtol": 0, "atol": 0}
    torch.testing.assert_close(out_n.detach().cpu(), out_c.detach(), **tol)
    for (name, p_n), p_c in zip(m_n.named_parameters(), m_c.parameters()):
        assert p_n.grad.device.type == "neuron", name
        torch.testing.assert_close(p_n.grad.cpu(), p_c.grad, **tol, msg=name)


def test_module_to_keeps_parameter_objects_and_tied_weights():
    # As with CUDA: .to() swaps the Parameter's data in place, so tied weights stay
    # tied and an optimizer built before the move still holds the live parameters.
    torch.manual_seed(0)
    emb, head = nn.Embedding(10, 4), nn.Linear(4, 10, bias=False)
    head.weight = emb.weight
    cpu_model = nn.ModuleDict({"emb": emb, "head": head})
    model = nn.ModuleDict({"emb": nn.Embedding(10, 4), "head": nn.Linear(4, 10, bias=False)})
    model.head.weight = model.emb.weight
    model.load_state_dict(cpu_model.state_dict())
    params = list(model.parameters())
    opt_n = torch.optim.SGD(params, lr=0.1)
    model.to("neuron:1")
    assert [id(p) for p in model.parameters()] == [id(p) for p in params] and len(params) == 1
    assert model.head.weight is model.emb.weight and on_device(model.emb.weight, 1)
    opt_c = torch.optim.SGD(cpu_model.parameters(), lr=0.1)
    tokens = torch.tensor([1, 2, 3, 7])
    for m, opt, dev in ((cpu_model, opt_c, "cpu"), (model, opt_n, "neuron:1")):
        for _ in range(2):
            opt.zero_grad()
            m["head"](m["emb"](tokens.to(dev))).logsumexp(-1).sum().backward()
            opt.step()
    assert torch.equal(model.emb.weight.detach().cpu(), cpu_model.emb.weight.detach())
    model.cpu()
    assert model.emb.weight is params[0] and params[0].device.type == "cpu"
