"""DistributedDataParallel on neuron trains exactly as one process does on the CPU."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
from dist_support import run_ranks
from torch.nn.parallel import DistributedDataParallel as DDP

from torchneuron.testing import is_on_neuron

STEPS = 3
BATCH = 4  # per rank, two micro-batches of 2 (the first under no_sync)


class TinyTransformer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(32, 16)
        self.block = nn.TransformerEncoderLayer(16, 2, dim_feedforward=32, dropout=0.0, batch_first=True)
        self.head = nn.Linear(16, 32)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.block(self.embed(tokens)))


def make_model() -> nn.Module:
    torch.manual_seed(0)
    return TinyTransformer()


def batches(world: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    return [(torch.randint(0, 32, (world, BATCH, 6), generator=g),
             torch.randint(0, 32, (world, BATCH, 6), generator=g)) for _ in range(STEPS)]


def loss_of(model: nn.Module, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(model(tokens).flatten(0, 1), targets.flatten())


def ddp_train(rank: int, world: int, device_type: str, options: dict, no_sync: bool) -> dict:
    device = torch.device(device_type, rank) if device_type == "neuron" else torch.device("cpu")
    model = make_model().to(device)
    ddp = DDP(model, **options)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.5)
    losses = []
    for tokens, targets in batches(world):
        x, y = tokens[rank].to(device), targets[rank].to(device)
        opt.zero_grad()
        if no_sync:
            with ddp.no_sync():
                loss_of(ddp, x[:2], y[:2]).backward()
            loss = loss_of(ddp, x[2:], y[2:])
        else:
            loss = loss_of(ddp, x, y)
        loss.backward()
        opt.step()
        losses.append(loss.detach().cpu())
    on_device = all(is_on_neuron(p, rank) and is_on_neuron(p.grad, rank) for p in model.parameters()) \
        if device_type == "neuron" else True
    return {"params": [p.detach().cpu() for p in model.parameters()], "losses": losses, "on_device": on_device}


def single_process(world: int, no_sync: bool) -> list[torch.Tensor]:
    """The same training in one CPU process: each rank's gradient accumulated, then averaged
    as DDP does (divided by the world size, then summed)."""
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    for tokens, targets in batches(world):
        per_rank = []
        for r in range(world):
            model.zero_grad(set_to_none=True)
            if no_sync:
                loss_of(model, tokens[r][:2], targets[r][:2]).backward()
                loss_of(model, tokens[r][2:], targets[r][2:]).backward()
            else:
                loss_of(model, tokens[r], targets[r]).backward()
            per_rank.append([p.grad.clone() for p in model.parameters()])
        for i, p in enumerate(model.parameters()):
            p.grad = per_rank[0][i] / world + per_rank[1][i] / world
        opt.step()
    return [p.detach() for p in model.parameters()]


@pytest.mark.parametrize("options,no_sync", [
    ({}, True),
    ({"bucket_cap_mb": 0.001, "gradient_as_bucket_view": True}, True),  # many buckets
    ({"static_graph": True}, False),  # static_graph with no_sync fails on CPU/gloo too (torch 2.13)
], ids=["no_sync", "small_buckets", "static_graph"])
def test_ddp_equals_single_process_cpu_training(tmp_path, options, no_sync):
    results = run_ranks(ddp_train, 2, tmp_path, "neuron", options, no_sync, finalize=True)
    expected = single_process(2, no_sync)
    for rank, result in enumerate(results):
        assert result["on_device"]
        for got, want in zip(result["params"], expected):
            torch.testing.assert_close(got, want, rtol=0, atol=0)  # 2 ranks: sums are exact pairs


def test_ddp_with_the_default_backend(tmp_path):
    """init_process_group() with no backend name, as PyTorch's examples call it."""
    results = run_ranks(ddp_train, 2, tmp_path, "neuron", {}, False, backend=None)
    for got, want in zip(results[0]["params"], single_process(2, False)):
        torch.testing.assert_close(got, want, rtol=0, atol=0)


@pytest.mark.slow
def test_ddp_four_ranks_equals_gloo_on_cpu(tmp_path):
    neuron = run_ranks(ddp_train, 4, tmp_path, "neuron", {}, True)
    cpu = run_ranks(ddp_train, 4, tmp_path, "cpu", {}, True, backend="gloo")
    for n, c in zip(neuron, cpu):
        for got, want in zip(n["params"] + n["losses"], c["params"] + c["losses"]):
            torch.testing.assert_close(got, want, rtol=0, atol=0)
