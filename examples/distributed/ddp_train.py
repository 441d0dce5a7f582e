"""DDP training of a small transformer language model, on neuron or (for comparison) CPU.

    torchrun --nproc-per-node 2 examples/distributed/ddp_train.py                 # neuron, backend "neuron"
    torchrun --nproc-per-node 2 examples/distributed/ddp_train.py --device cpu    # CPU, backend "gloo"

Each rank takes its share of a synthetic token data set (``DistributedSampler``), DDP
averages the gradients over the ranks, and rank 0 prints the loss averaged over ranks at
every step. The two commands print the same losses: a neuron tensor computes with the CPU
kernels, and the neuron backend carries the gradients on gloo as the CPU run does.
``--losses FILE`` also writes them as JSON.
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

VOCAB, SEQ, WIDTH = 64, 16, 32


class TinyLM(nn.Module):
    """Embedding, two transformer encoder layers, a vocabulary head."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        layer = nn.TransformerEncoderLayer(WIDTH, 4, dim_feedforward=64, dropout=0.0, batch_first=True)
        self.blocks = nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False)
        self.head = nn.Linear(WIDTH, VOCAB)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(self.embed(tokens)))


def dataset(samples: int = 256) -> TensorDataset:
    """Token sequences whose next token is (token + 1) mod VOCAB: a task the loss shows learning."""
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, VOCAB, (samples, SEQ), generator=g)
    return TensorDataset(tokens, (tokens + 1) % VOCAB)


def train(device: torch.device, steps: int = 8, batch_size: int = 8) -> list[float]:
    """Trains on ``device`` in the initialised default group; returns the rank-averaged losses."""
    torch.manual_seed(0)  # every rank builds the same model (DDP also broadcasts rank 0's)
    model = DDP(TinyLM().to(device))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sampler = DistributedSampler(dataset(), shuffle=True, seed=0)
    loader = DataLoader(sampler.dataset, batch_size=batch_size, sampler=sampler, drop_last=True)
    losses: list[float] = []
    epoch = 0
    while len(losses) < steps:
        sampler.set_epoch(epoch)
        for tokens, targets in loader:
            tokens, targets = tokens.to(device), targets.to(device)
            loss = nn.functional.cross_entropy(model(tokens).flatten(0, 1), targets.flatten())
            loss.backward()
            opt.step()
            opt.zero_grad()
            mean = loss.detach().clone()
            dist.all_reduce(mean, op=dist.ReduceOp.AVG)
            losses.append(mean.item())
            if len(losses) == steps:
                break
        epoch += 1
    return losses


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=["neuron", "cpu"], default="neuron")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--losses", help="write rank 0's losses to this JSON file")
    args = parser.parse_args()

    if args.device == "neuron":
        dist.init_process_group()  # no backend: "neuron", the neuron device's default; neuron:LOCAL_RANK
        device = torch.device("neuron", torch.accelerator.current_device_index())
    else:
        dist.init_process_group("gloo")
        device = torch.device("cpu")
    losses = train(device, args.steps)
    if dist.get_rank() == 0:
        for step, loss in enumerate(losses):
            print(f"step {step} loss {loss:.6f}")
        if args.losses:
            with open(args.losses, "w") as f:
                json.dump(losses, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
