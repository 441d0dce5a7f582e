"""Tensor-parallel training of a small transformer block (DTensor), on neuron or (for comparison) CPU.

    torchrun --nproc-per-node 2 examples/distributed/tp_train.py                        # neuron
    torchrun --nproc-per-node 2 examples/distributed/tp_train.py --sequence-parallel    # + sequence parallelism
    torchrun --nproc-per-node 2 examples/distributed/tp_train.py --device cpu           # CPU, gloo

The attention's query/key/value projections and the MLP's first layer are split by columns
(``ColwiseParallel``: each rank holds its share of the heads and hidden units), the output
projections by rows (``RowwiseParallel``: their partial results are all-reduced), as Megatron
does. ``--sequence-parallel`` also shards the layer norms' activations on the sequence dimension
(``SequenceParallel``), so the all-reduces become all-gathers and reduce-scatters. Every rank
sees the same batch; rank 0 prints the loss at every step, and the CPU command prints the same.
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput, RowwiseParallel,
                                               SequenceParallel, parallelize_module)

VOCAB, SEQ, WIDTH, HEADS = 64, 16, 32, 4


class Block(nn.Module):
    """Pre-norm attention and MLP; the heads each rank holds follow from its projections' shape."""

    def __init__(self) -> None:
        super().__init__()
        self.attn_norm = nn.LayerNorm(WIDTH)
        self.q, self.k, self.v = (nn.Linear(WIDTH, WIDTH, bias=False) for _ in range(3))
        self.o = nn.Linear(WIDTH, WIDTH, bias=False)
        self.mlp_norm = nn.LayerNorm(WIDTH)
        self.up = nn.Linear(WIDTH, 4 * WIDTH)
        self.down = nn.Linear(4 * WIDTH, WIDTH)

    def attention(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.q(x), self.k(x), self.v(x)  # (batch, seq, local width)
        heads = q.shape[-1] // (WIDTH // HEADS)  # this rank's heads
        q, k, v = (t.unflatten(-1, (heads, WIDTH // HEADS)).transpose(1, 2) for t in (q, k, v))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o(out.transpose(1, 2).flatten(2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.attn_norm(x))
        return x + self.down(F.gelu(self.up(self.mlp_norm(x))))


class TinyLM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.block = Block()
        self.head = nn.Linear(WIDTH, VOCAB)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.block(self.embed(tokens)))


def parallelize(model: TinyLM, mesh: DeviceMesh, sequence_parallel: bool) -> TinyLM:
    """Megatron-style TP on ``mesh`` (1-D); with ``sequence_parallel``, norms on sequence shards."""
    plan = {
        "block.q": ColwiseParallel(), "block.k": ColwiseParallel(), "block.v": ColwiseParallel(),
        "block.o": RowwiseParallel(),
        "block.up": ColwiseParallel(), "block.down": RowwiseParallel(),
    }
    if sequence_parallel:
        plan.update({
            "block.attn_norm": SequenceParallel(), "block.mlp_norm": SequenceParallel(),
            # the projections gather the sequence their norm left sharded ...
            "block.q": ColwiseParallel(input_layouts=Shard(1)), "block.k": ColwiseParallel(input_layouts=Shard(1)),
            "block.v": ColwiseParallel(input_layouts=Shard(1)), "block.up": ColwiseParallel(input_layouts=Shard(1)),
            # ... and the output projections reduce-scatter back to sequence shards
            "block.o": RowwiseParallel(output_layouts=Shard(1)), "block.down": RowwiseParallel(output_layouts=Shard(1)),
            # the residual stream enters sharded and leaves whole, for the replicated head
            "block": PrepareModuleInput(input_layouts=Replicate(), desired_input_layouts=Shard(1),
                                        use_local_output=True),
            "head": PrepareModuleInput(input_layouts=Shard(1), desired_input_layouts=Replicate(),
                                       use_local_output=True),
        })
    return parallelize_module(model, mesh, plan)


def batch(step: int, batch_size: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    """Token sequences whose next token is (token + 1) mod VOCAB; the same on every rank."""
    g = torch.Generator().manual_seed(step)
    tokens = torch.randint(0, VOCAB, (batch_size, SEQ), generator=g)
    return tokens, (tokens + 1) % VOCAB


def train(device: torch.device, steps: int = 8, sequence_parallel: bool = False) -> list[float]:
    """Trains on ``device`` over every rank of the initialised default group; returns the losses."""
    torch.manual_seed(0)  # every rank builds the same model, then keeps its shard of it
    model = parallelize(TinyLM().to(device), init_device_mesh(device.type, (dist.get_world_size(),)),
                        sequence_parallel)
    # The embedding, norms (without --sequence-parallel) and head stay plain tensors, the rest are
    # DTensors: a foreach optimizer (the default on neuron, as on CUDA) cannot step both in one call.
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, foreach=False)
    losses = []
    for step in range(steps):
        tokens, targets = (t.to(device) for t in batch(step))
        loss = F.cross_entropy(model(tokens).flatten(0, 1), targets.flatten())
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=["neuron", "cpu"], default="neuron")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--sequence-parallel", action="store_true")
    parser.add_argument("--losses", help="write rank 0's losses to this JSON file")
    args = parser.parse_args()

    if args.device == "neuron":
        dist.init_process_group()  # no backend: "neuron", the neuron device's default; neuron:LOCAL_RANK
        device = torch.device("neuron", torch.accelerator.current_device_index())
    else:
        dist.init_process_group("gloo")
        device = torch.device("cpu")
    losses = train(device, args.steps, args.sequence_parallel)
    if dist.get_rank() == 0:
        for step, loss in enumerate(losses):
            print(f"step {step} loss {loss:.6f}")
        if args.losses:
            with open(args.losses, "w") as f:
                json.dump(losses, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
