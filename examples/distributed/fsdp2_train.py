"""FSDP2 (``torch.distributed.fsdp.fully_shard``) training, on neuron or (for comparison) CPU.

    torchrun --nproc-per-node 2 examples/distributed/fsdp2_train.py                      # neuron
    torchrun --nproc-per-node 2 examples/distributed/fsdp2_train.py --mixed-precision    # bf16 params
    torchrun --nproc-per-node 2 examples/distributed/fsdp2_train.py --device cpu         # CPU, gloo

Every transformer block and the whole model are sharded over the ranks (``fully_shard``
on a 1-D device mesh): each rank holds half of every parameter and of Adam's state, the
forward and backward all-gather them layer by layer, and the gradients are
reduce-scattered. Rank 0 prints the rank-averaged loss at every step; the neuron and
CPU commands print the same losses. ``--losses FILE`` also writes them as JSON.
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

VOCAB, SEQ, WIDTH, LAYERS = 64, 16, 32, 3


class Block(nn.Module):
    """Pre-norm attention and MLP with residuals."""

    def __init__(self) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(WIDTH), nn.LayerNorm(WIDTH)
        self.attention = nn.MultiheadAttention(WIDTH, 4, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(WIDTH, 4 * WIDTH), nn.GELU(), nn.Linear(4 * WIDTH, WIDTH))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm1(x)
        x = x + self.attention(h, h, h, need_weights=False)[0]
        return x + self.mlp(self.norm2(x))


class TinyLM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.layers = nn.ModuleList(Block() for _ in range(LAYERS))
        self.head = nn.Linear(WIDTH, VOCAB)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for layer in self.layers:
            x = layer(x)
        return self.head(x.flatten(0, 1))  # (batch * seq, vocab); 2-D, so not a view FSDP2 warns about


def batch(step: int, rank: int, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's batch of step ``step``: next token = (token + 1) mod VOCAB."""
    g = torch.Generator().manual_seed(1000 * step + rank)
    tokens = torch.randint(0, VOCAB, (batch_size, SEQ), generator=g)
    return tokens, (tokens + 1) % VOCAB


def train(device: torch.device, steps: int = 6, mixed_precision: bool = False,
          batch_size: int = 8) -> list[float]:
    """Trains on ``device`` in the initialised default group; returns the rank-averaged losses."""
    torch.manual_seed(0)  # the full model, the same on every rank; fully_shard keeps each rank's shard
    model = TinyLM().to(device)
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) \
        if mixed_precision else MixedPrecisionPolicy()
    for layer in model.layers:
        fully_shard(layer, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    losses: list[float] = []
    for step in range(steps):
        tokens, targets = (t.to(device) for t in batch(step, dist.get_rank(), batch_size))
        loss = nn.functional.cross_entropy(model(tokens).float(), targets.flatten())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
        opt.step()
        opt.zero_grad()
        mean = loss.detach().clone()
        dist.all_reduce(mean, op=dist.ReduceOp.AVG)
        losses.append(mean.item())
    return losses


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=["neuron", "cpu"], default="neuron")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--mixed-precision", action="store_true", help="bf16 parameters, fp32 gradient reduction")
    parser.add_argument("--losses", help="write rank 0's losses to this JSON file")
    args = parser.parse_args()

    if args.device == "neuron":
        dist.init_process_group()  # backend "neuron", device neuron:LOCAL_RANK
        device = torch.device("neuron", torch.accelerator.current_device_index())
    else:
        dist.init_process_group("gloo")
        device = torch.device("cpu")
    losses = train(device, args.steps, args.mixed_precision)
    if dist.get_rank() == 0:
        for step, loss in enumerate(losses):
            print(f"step {step} loss {loss:.6f}")
        if args.losses:
            with open(args.losses, "w") as f:
                json.dump(losses, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
