"""Compiled activation checkpointing on neuron replays its random ops exactly: AOTAutograd's
RNG-replay operators (run_and_save_rng_state / run_with_rng_state) run on the neuron
generator (torchneuron/device/rng_replay.py). CPU eager with the same seed is the oracle;
``fallback_random`` makes compiled random ops draw as eager ones do, so values can match."""

import copy
import functools

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

from torchneuron.profiler import metrics


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.up, self.down = nn.Linear(16, 32), nn.Linear(32, 16)

    def forward(self, x):
        return x + self.down(F.dropout(F.gelu(self.up(x)), 0.3, self.training))


def _recompute_all_but_matmuls(ctx, op, *args, **kwargs):
    return CheckpointPolicy.MUST_SAVE if op is torch.ops.aten.mm.default else CheckpointPolicy.PREFER_RECOMPUTE


AC = {
    "full": lambda block, x: checkpoint(block, x, use_reentrant=False),
    "selective-per-op": lambda block, x: checkpoint(
        block, x, use_reentrant=False,
        context_fn=functools.partial(create_selective_checkpoint_contexts, _recompute_all_but_matmuls)),
}


class Model(nn.Module):
    def __init__(self, ac):
        super().__init__()
        self.blocks, self.ac = nn.ModuleList(Block() for _ in range(2)), ac

    def forward(self, x):
        for block in self.blocks:
            x = AC[self.ac](block, x)
        return x.square().mean()


@pytest.fixture
def eager_random():
    import torch._inductor.config as inductor_config

    # config.patch, not monkeypatch: undoing a setattr on a config module deletes the setting
    with inductor_config.patch(fallback_random=True):
        torch._dynamo.reset()
        yield
    torch._dynamo.reset()


@pytest.mark.parametrize("ac", list(AC))
def test_compiled_checkpointed_dropout_equals_cpu_eager(ac, eager_random):
    torch.manual_seed(0)
    cpu = Model(ac)
    dev = copy.deepcopy(cpu).to("neuron")
    x = torch.randn(8, 16)
    torch.manual_seed(1)
    cpu_loss = cpu(x)
    cpu_loss.backward()
    torch.neuron.manual_seed(1)
    metrics.reset()
    loss = torch.compile(dev, backend="neuron")(x.to("neuron"))
    loss.backward()
    assert metrics.ops(), "nothing ran on neuron"
    scale = cpu_loss.abs().item()
    torch.testing.assert_close(loss.cpu(), cpu_loss, rtol=1e-5, atol=1e-6 * scale)
    for (name, p), q in zip(cpu.named_parameters(), dev.parameters()):
        torch.testing.assert_close(q.grad.cpu(), p.grad, rtol=1e-5, atol=1e-5 * p.grad.abs().max().item(),
                                   msg=lambda m, name=name: f"{name}: {m}")
    # the backward's replay put the generator back where the forward left it, as CPU's is
    torch.testing.assert_close(torch.rand(8, device="neuron").cpu(), torch.rand(8), rtol=0, atol=0)


def test_replay_restores_the_generator_and_uses_the_saved_state():
    from torch._prims.rng_prims import run_and_save_rng_state, run_with_rng_state

    x = torch.empty(64, device="neuron")
    torch.neuron.manual_seed(3)
    state, first = run_and_save_rng_state(torch.ops.aten.bernoulli.p, x, 0.5)
    after = torch.neuron.get_rng_state()
    again = run_with_rng_state(state, torch.ops.aten.bernoulli.p, x, 0.5)
    assert torch.equal(first.cpu(), again.cpu())  # the same draws from the saved state
    assert torch.equal(torch.neuron.get_rng_state(), after)  # and the generator is where it was
    torch.neuron.manual_seed(3)
    assert torch.equal(torch.ops.aten.bernoulli.p(x, 0.5).cpu(), first.cpu())  # drawn from neuron's generator
