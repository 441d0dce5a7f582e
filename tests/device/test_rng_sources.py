"""Every random op on neuron draws from the neuron generator, never from CPU's.

Ops without a ``Generator?`` argument (``native_dropout``) and composites that call
them (``F.dropout``, SDPA's dropout, the transformer layers, RNN inter-layer dropout)
must still be controlled by ``torch.neuron.manual_seed``, ``get/set_rng_state`` and
``fork_rng(device_type="neuron")``, and give CPU's numbers for the same seed.
Each case: seed neuron only, burn CPU randomness in between (as a DataLoader
shuffle would), and compare with CPU seeded the same way.
"""

import pytest
import torch
import torch.nn.functional as F

from conftest import on_device


pytestmark = pytest.mark.usefixtures("restore_rng")


def _input(device, dtype=torch.float32):
    return torch.linspace(-3, 3, 4 * 6 * 8).reshape(4, 6, 8).to(device=device, dtype=dtype)


def _encoder_layer(device):
    with torch.random.fork_rng(device_type="neuron"):  # same weights, generators untouched
        torch.manual_seed(3)
        layer = torch.nn.TransformerEncoderLayer(8, 2, dim_feedforward=16, dropout=0.3,
                                                 batch_first=True)
    return layer.to(device).train()


def _lstm(device):
    with torch.random.fork_rng(device_type="neuron"):
        torch.manual_seed(4)
        lstm = torch.nn.LSTM(8, 8, num_layers=3, dropout=0.4, batch_first=True)
    return lstm.to(device).train()


CASES = {
    "dropout": lambda d: F.dropout(_input(d), 0.3, training=True),
    "dropout_p015": lambda d: F.dropout(_input(d), 0.15, training=True),
    "dropout_bf16": lambda d: F.dropout(_input(d, torch.bfloat16), 0.1, training=True),
    "dropout_inplace": lambda d: F.dropout(_input(d), 0.3, training=True, inplace=True),
    "dropout2d": lambda d: F.dropout2d(_input(d), 0.5, training=True),
    "alpha_dropout": lambda d: F.alpha_dropout(_input(d), 0.2, training=True),
    "feature_alpha_dropout": lambda d: F.feature_alpha_dropout(_input(d), 0.2, training=True),
    "native_dropout": lambda d: torch.native_dropout(_input(d), 0.4, True)[0],
    "native_dropout_mask": lambda d: torch.native_dropout(_input(d), 0.4, True)[1],
    "rrelu": lambda d: F.rrelu(_input(d), training=True),
    "sdpa_dropout": lambda d: F.scaled_dot_product_attention(
        _input(d), _input(d), _input(d), dropout_p=0.5),
    "transformer_layer": lambda d: _encoder_layer(d)(_input(d)),
    "dropout_transposed": lambda d: F.dropout(_input(d).transpose(0, 2), 0.4),
    "lstm_interlayer_dropout": lambda d: _lstm(d)(_input(d))[0],
    "multinomial": lambda d: torch.multinomial(torch.ones(4, 10, device=d), 6),
    "randperm": lambda d: torch.randperm(50, device=d),
    "rand_like": lambda d: torch.rand_like(_input(d)),
    "randn_like": lambda d: torch.randn_like(_input(d)),
    "randint_like": lambda d: torch.randint_like(_input(d), 100),
    "bernoulli": lambda d: torch.bernoulli(torch.full((50,), 0.3, device=d)),
    "poisson": lambda d: torch.poisson(torch.full((50,), 3.0, device=d)),
    "normal_tensor": lambda d: torch.normal(torch.zeros(50, device=d), torch.ones(50, device=d)),
}


def _run(name, device, seed):
    """Runs case ``name`` on ``device`` with only that device's generator seeded, then
    CPU randomness consumed (it must not matter)."""
    if device == "cpu":
        torch.manual_seed(seed)
    else:
        torch.neuron.manual_seed(seed)
        torch.randn(1000)  # unrelated CPU randomness
    out = CASES[name](device)
    return out


# Reproducible and independent of CPU randomness on neuron (test below), but not yet
# CPU's numbers: with dropout > 0 the layer's output differs from CPU's although each
# part (SDPA with dropout, F.dropout, the layer at p=0) equals CPU. Open in issue 12.
NOT_YET_CPU_EQUAL: set[str] = set()


@pytest.mark.parametrize("name", [
    pytest.param(n, marks=pytest.mark.xfail(strict=True, reason="draw order differs from CPU"))
    if n in NOT_YET_CPU_EQUAL else n for n in sorted(CASES)])
def test_random_op_uses_the_neuron_generator(name):
    expected = _run(name, "cpu", 77)
    got = _run(name, "neuron", 77)
    assert on_device(got)
    torch.testing.assert_close(got.cpu(), expected, rtol=0, atol=0, equal_nan=True)
    # A different neuron seed changes the draw (the op is random at all).
    other = _run(name, "neuron", 78)
    assert not torch.equal(other.cpu(), got.cpu())


@pytest.mark.parametrize("name", ["dropout", "native_dropout_mask", "sdpa_dropout",
                                  "transformer_layer", "lstm_interlayer_dropout"])
def test_rng_state_and_fork_rng_control_dropout(name):
    torch.neuron.manual_seed(5)
    state = torch.neuron.get_rng_state()
    first = CASES[name]("neuron").cpu()
    torch.neuron.set_rng_state(state)
    torch.rand(100)  # CPU randomness in between
    assert torch.equal(CASES[name]("neuron").cpu(), first)
    torch.neuron.set_rng_state(state)
    with torch.random.fork_rng(device_type="neuron"):
        inside = CASES[name]("neuron").cpu()
    after = CASES[name]("neuron").cpu()
    assert torch.equal(inside, first) and torch.equal(after, first)


def test_dropout_gradient_matches_cpu():
    grads = []
    for device in ("cpu", "neuron"):
        torch.manual_seed(11)
        x = _input(device).requires_grad_()
        F.dropout(x, 0.25, training=True).pow(2).sum().backward()
        grads.append(x.grad.cpu())
    torch.testing.assert_close(grads[1], grads[0], rtol=0, atol=0)


def test_dropout_is_counted_on_the_device():
    import torchneuron

    torchneuron.metrics.reset()
    out = torch.native_dropout(_input("neuron"), 0.5, True)
    assert all(on_device(t) for t in out)
    assert any(c.op == "aten::native_dropout" for c in torchneuron.metrics.ops())
