"""torch.autocast("neuron") and torch.amp.GradScaler("neuron") against CPU."""

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from conftest import on_device


def rand(*shape, seed=0, dtype=torch.float32):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def test_autocast_enabled_flags_and_default_dtype():
    assert not torch.is_autocast_enabled("neuron")
    with torch.autocast("neuron"):
        assert torch.is_autocast_enabled("neuron")
        assert torch.get_autocast_dtype("neuron") == torch.bfloat16
    with torch.autocast("neuron", dtype=torch.float16):
        assert torch.get_autocast_dtype("neuron") == torch.float16
    assert not torch.is_autocast_enabled("neuron")
    assert torch.amp.is_autocast_available("neuron")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_autocast_mm_and_linear_run_in_lower_precision(dtype):
    a_c, b_c = rand(8, 16), rand(16, 4, seed=1)
    w_c, bias_c = rand(4, 16, seed=2), rand(4, seed=3)
    a, b, w, bias = (t.to("neuron") for t in (a_c, b_c, w_c, bias_c))
    with torch.autocast("neuron", dtype=dtype):
        mm = a @ b
        lin = F.linear(a, w, bias)
        addmm = torch.addmm(bias, a, w.t())
    for out in (mm, lin, addmm):
        assert out.dtype == dtype
        assert on_device(out)
    assert torch.equal(mm.cpu(), a_c.to(dtype) @ b_c.to(dtype))
    assert torch.equal(lin.cpu(), F.linear(a_c.to(dtype), w_c.to(dtype), bias_c.to(dtype)))
    # outside autocast: fp32 again
    assert (a @ b).dtype == torch.float32


def test_autocast_fp32_ops_upcast():
    x_c = rand(4, 8, dtype=torch.bfloat16)
    t_c = rand(4, 8, seed=1, dtype=torch.bfloat16)
    x, t = x_c.to("neuron"), t_c.to("neuron")
    with torch.autocast("neuron", dtype=torch.bfloat16):
        sm = torch.softmax(x, -1)
        mse = F.mse_loss(x, t)
        lsm = F.log_softmax(x, -1)
    for out, ref in ((sm, torch.softmax(x_c.float(), -1)),
                     (mse, F.mse_loss(x_c.float(), t_c.float())),
                     (lsm, F.log_softmax(x_c.float(), -1))):
        assert out.dtype == torch.float32
        assert out.device.type == "neuron"
        assert torch.equal(out.cpu(), ref)


def test_autocast_layer_norm_upcasts_to_fp32():
    x_c = rand(4, 8, dtype=torch.bfloat16)
    x = x_c.to("neuron")
    with torch.autocast("neuron", dtype=torch.bfloat16):
        ln = F.layer_norm(x, (8,))
    assert ln.dtype == torch.float32 and ln.device.type == "neuron"
    assert torch.equal(ln.cpu(), F.layer_norm(x_c.float(), (8,)))


def test_autocast_promote_ops_widest_type():
    a = rand(4, dtype=torch.bfloat16).to("neuron")
    b = rand(4, seed=1).to("neuron")
    with torch.autocast("neuron", dtype=torch.bfloat16):
        out = torch.stack([a, b])
    assert out.dtype == torch.float32


def test_autocast_binary_cross_entropy_raises_like_cuda():
    p = torch.rand(4, device="neuron")
    y = torch.rand(4, device="neuron")
    with torch.autocast("neuron", dtype=torch.bfloat16):
        with pytest.raises(RuntimeError, match="unsafe to autocast"):
            F.binary_cross_entropy(p, y)
        with pytest.raises(RuntimeError, match="unsafe to autocast"):
            nn.BCELoss()(p, y)
        safe = F.binary_cross_entropy_with_logits(p, y)
    assert safe.dtype == torch.float32
    # outside autocast BCE works and equals CPU
    assert torch.equal(F.binary_cross_entropy(p, y).cpu(), F.binary_cross_entropy(p.cpu(), y.cpu()))


def test_autocast_backward_grads_fp32_params():
    torch.manual_seed(0)
    m_c = nn.Linear(8, 4)
    m_n = nn.Linear(8, 4).to("neuron")
    m_n.load_state_dict(m_c.state_dict())
    x = rand(3, 8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss_c = m_c(x).float().pow(2).sum()
    with torch.autocast("neuron", dtype=torch.bfloat16):
        loss_n = m_n(x.to("neuron")).float().pow(2).sum()
    loss_c.backward()
    loss_n.backward()
    assert m_n.weight.grad.dtype == torch.float32
    assert torch.equal(loss_n.cpu(), loss_c)
    assert torch.equal(m_n.weight.grad.cpu(), m_c.weight.grad)


def test_autocast_cpu_context_does_not_affect_neuron():
    a = rand(4, 4).to("neuron")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert (a @ a).dtype == torch.float32


def _scaler_run(device, inject_inf_at):
    torch.manual_seed(0)
    model = nn.Linear(6, 3).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler(device, init_scale=2.0**8, growth_interval=2)
    history = []
    for step in range(5):
        x = rand(4, 6, seed=step).to(device)
        opt.zero_grad()
        loss = model(x).pow(2).mean()
        scaler.scale(loss).backward()
        if step == inject_inf_at:
            model.weight.grad[0, 0] = float("inf")
        scaler.unscale_(opt)
        grad = model.weight.grad.detach().cpu().clone()
        scaler.step(opt)
        scaler.update()
        history.append((scaler.get_scale(), grad, [p.detach().cpu().clone() for p in model.parameters()]))
    return history, scaler, model


def test_grad_scaler_matches_cpu_including_inf_skip():
    hist_c, _, _ = _scaler_run("cpu", inject_inf_at=2)
    hist_n, scaler_n, model_n = _scaler_run("neuron", inject_inf_at=2)
    assert all(p.device.type == "neuron" for p in model_n.parameters())
    assert scaler_n._scale.device.type == "neuron"
    for (sc, gc, pc), (sn, gn, pn) in zip(hist_c, hist_n):
        assert sn == sc
        assert torch.equal(gn, gc)
        for a, b in zip(pn, pc):
            assert torch.equal(a, b)
    # the inf step was skipped (params unchanged) and halved the scale
    assert hist_n[2][0] < hist_n[1][0]
    for a, b in zip(hist_n[2][2], hist_n[1][2]):
        assert torch.equal(a, b)


def test_grad_scaler_scale_value():
    scaler = torch.amp.GradScaler("neuron", init_scale=4.0)
    loss = torch.tensor(1.5, device="neuron")
    scaled = scaler.scale(loss)
    assert scaled.device.type == "neuron"
    assert scaled.item() == torch.amp.GradScaler("cpu", init_scale=4.0).scale(torch.tensor(1.5)).item()
