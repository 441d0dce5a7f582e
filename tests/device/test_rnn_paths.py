"""nn.LSTM / nn.GRU / nn.RNN on neuron run CPU's whole-sequence implementation
on device memory (csrc/aten/rnn.cpp): results and gradients equal CPU's bit for bit,
the op is counted once and charged modelled time, and dropout between layers
draws from the neuron generator."""

import copy

import pytest
import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

import torchneuron
from conftest import on_device

SEQ, BATCH, IN, HID = 5, 3, 4, 6


def _pair(kind, **kw):
    """The same module on CPU and on neuron (identical weights)."""
    torch.manual_seed(0)
    cpu = getattr(nn, kind)(IN, HID, **kw)
    return cpu, _copy_to_neuron(cpu)


def _copy_to_neuron(module):
    return copy.deepcopy(module).to("neuron")


def _run(module, x, h, backward=True):
    """Output, final states and (with backward) the gradients of input, h0 and every parameter."""
    x = x.detach().requires_grad_(backward)
    h = tuple(t.detach().requires_grad_(backward) for t in h) if isinstance(h, tuple) else \
        h.detach().requires_grad_(backward)
    out, hn = module(x, h)
    hn = hn if isinstance(hn, tuple) else (hn,)
    results = [out, *hn]
    if backward:
        (out.sum() + sum(t.square().sum() for t in hn)).backward()
        hs = h if isinstance(h, tuple) else (h,)
        results += [x.grad, *(t.grad for t in hs), *(p.grad for p in module.parameters())]
    return results


def _assert_equal(neuron_results, cpu_results):
    assert len(neuron_results) == len(cpu_results)
    for n, c in zip(neuron_results, cpu_results):
        assert on_device(n)
        torch.testing.assert_close(n.cpu(), c, rtol=0, atol=0)


def _inputs(kind, layers, bidirectional, batch_first, proj_size=0):
    g = torch.Generator().manual_seed(1)
    x = torch.randn((BATCH, SEQ, IN) if batch_first else (SEQ, BATCH, IN), generator=g)
    n = layers * (2 if bidirectional else 1)
    h = torch.randn(n, BATCH, proj_size or HID, generator=g)
    if kind == "LSTM":
        return x, (h, torch.randn(n, BATCH, HID, generator=g))
    return x, h


def _to(value, device):
    return tuple(t.to(device) for t in value) if isinstance(value, tuple) else value.to(device)


@pytest.mark.parametrize("kind", ["LSTM", "GRU", "RNN"])
@pytest.mark.parametrize("layers,bidirectional,batch_first",
                         [(1, False, False), (2, False, False), (2, True, True)])
def test_forward_and_backward_equal_cpu_bit_for_bit(kind, layers, bidirectional, batch_first):
    cpu, neuron = _pair(kind, num_layers=layers, bidirectional=bidirectional,
                        batch_first=batch_first)
    x, h = _inputs(kind, layers, bidirectional, batch_first)
    _assert_equal(_run(neuron, _to(x, "neuron"), _to(h, "neuron")), _run(cpu, x, h))


@pytest.mark.parametrize("kind", ["LSTM", "GRU"])
def test_without_initial_state_and_in_inference_mode(kind):
    cpu, neuron = _pair(kind, num_layers=2)
    x, _ = _inputs(kind, 2, False, False)
    want, _ = cpu(x)
    got, _ = neuron(x.to("neuron"))
    _assert_equal([got], [want.detach()])
    with torch.inference_mode():
        got, _ = neuron(x.to("neuron"))
        want, _ = cpu(x)
    _assert_equal([got], [want])


@pytest.mark.parametrize("kind", ["LSTM", "GRU"])
@pytest.mark.parametrize("bidirectional", [False, True])
def test_packed_sequences_equal_cpu(kind, bidirectional):
    cpu, neuron = _pair(kind, num_layers=2, bidirectional=bidirectional)
    x, h = _inputs(kind, 2, bidirectional, False)
    lengths = torch.tensor([5, 3, 2])

    def run(module, x, h):
        x = x.detach().requires_grad_()
        packed = pack_padded_sequence(x, lengths)
        out, hn = module(packed, h)
        padded, _ = pad_packed_sequence(out)
        hn = hn if isinstance(hn, tuple) else (hn,)
        (padded.sum() + sum(t.sum() for t in hn)).backward()
        return [padded, *hn, x.grad, *(p.grad for p in module.parameters())]

    _assert_equal(run(neuron, x.to("neuron"), _to(h, "neuron")), run(cpu, x, h))


def test_lstm_with_projections_equals_cpu():
    cpu, neuron = _pair("LSTM", num_layers=2, proj_size=3, bidirectional=True)
    x, h = _inputs("LSTM", 2, True, False, proj_size=3)
    _assert_equal(_run(neuron, _to(x, "neuron"), _to(h, "neuron")), _run(cpu, x, h))


@pytest.mark.parametrize("kind,mode", [("LSTM", "lstm"), ("GRU", "gru"), ("RNN", "rnn_tanh")])
def test_one_counted_and_charged_op_per_call(kind, mode):
    _, neuron = _pair(kind, num_layers=2)
    x, h = _inputs(kind, 2, False, False)
    x, h = _to(x, "neuron"), _to(h, "neuron")
    torchneuron.metrics.reset()
    out, _ = neuron(x, h)
    out.sum().backward()
    ops = {o.op: o for o in torchneuron.metrics.ops()}
    fwd, bwd = ops[f"aten::{mode}.input"], ops[f"torchneuron::{mode}_backward.input"]
    assert fwd.calls == 1 and bwd.calls == 1
    assert fwd.modeled_seconds > 0 and bwd.modeled_seconds > fwd.modeled_seconds
    # The whole sequence is one op: no per-timestep cells or matmuls ran on the device.
    assert not [op for op in ops if "fused" in op or op in ("aten::mm", "aten::addmm")]


def test_cost_covers_the_matmuls_of_every_step():
    _, neuron = _pair("LSTM", num_layers=2)
    x, h = _inputs("LSTM", 2, False, False)
    x, h = x.to("neuron").requires_grad_(), _to(h, "neuron")
    est = torchneuron.estimate(lambda: neuron(x, h)[0].sum().backward())
    ops = {o.op: o for o in est.targets["trn2"].ops}
    # Input and recurrent projections: 2 x (IN + HID) x 4 HID per row, and HID + HID for layer 2.
    matmul_flops = 2 * SEQ * BATCH * 4 * HID * ((IN + HID) + (HID + HID))
    fwd, bwd = ops["aten::lstm.input"], ops["torchneuron::lstm_backward.input"]
    assert fwd.flops >= matmul_flops
    assert bwd.flops >= 2 * matmul_flops


def test_dropout_between_layers_follows_the_neuron_generator():
    torch.manual_seed(0)
    cpu = nn.LSTM(IN, HID, num_layers=3, dropout=0.5)
    neuron = _copy_to_neuron(cpu)
    x, h = _inputs("LSTM", 3, False, False)
    xn, hn = x.to("neuron"), _to(h, "neuron")

    def neuron_run(seed):
        torch.neuron.manual_seed(seed)
        torch.rand(7)  # CPU randomness in between must not change the masks
        return neuron(xn, hn)[0]

    a, b, c = neuron_run(3), neuron_run(3), neuron_run(4)
    assert torch.equal(a.cpu(), b.cpu()) and not torch.equal(a.cpu(), c.cpu())
    torch.manual_seed(3)  # the neuron generator gives the stream CPU gives for the same seed
    torch.testing.assert_close(a.cpu(), cpu(x, h)[0], rtol=0, atol=0)
    neuron.eval()  # no dropout in eval
    torch.testing.assert_close(neuron(xn, hn)[0].cpu(), cpu.eval()(x, h)[0], rtol=0, atol=0)


@pytest.mark.parametrize("kind", ["LSTM", "GRU"])
def test_in_place_change_of_a_saved_tensor_is_caught_as_on_cpu(kind):
    def raises(module, x, h):
        out, _ = module(x.requires_grad_(), h)
        out.mul_(2)
        try:
            out.sum().backward()
        except RuntimeError as e:
            assert "modified by an inplace operation" in str(e)
            return True
        return False

    cpu, neuron = _pair(kind)
    x, h = _inputs(kind, 1, False, False)
    assert raises(neuron, x.to("neuron"), _to(h, "neuron")) == raises(cpu, x, h)


def test_backward_twice_needs_retain_graph():
    _, neuron = _pair("LSTM")
    x, h = _inputs("LSTM", 1, False, False)
    out, _ = neuron(x.to("neuron"), _to(h, "neuron"))
    out.sum().backward(retain_graph=True)
    first = [p.grad.clone() for p in neuron.parameters()]
    out.sum().backward()
    for p, g in zip(neuron.parameters(), first):
        torch.testing.assert_close(p.grad.cpu(), 2 * g.cpu(), rtol=0, atol=0)
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        out.sum().backward()


def test_autocast_keeps_the_cell_path():
    _, neuron = _pair("LSTM")
    x, h = _inputs("LSTM", 1, False, False)
    with torch.autocast("neuron"):
        out, _ = neuron(x.to("neuron"), _to(h, "neuron"))
    assert out.dtype == torch.bfloat16 and on_device(out)


def test_double_backward_raises_instead_of_a_silent_zero():
    _, neuron = _pair("GRU")
    x, h = _inputs("GRU", 1, False, False)
    x = x.to("neuron").requires_grad_()
    out, _ = neuron(x, h.to("neuron"))
    (gx,) = torch.autograd.grad(out.square().sum(), x, create_graph=True)
    with pytest.raises(RuntimeError, match="not differentiable"):
        gx.sum().backward()
