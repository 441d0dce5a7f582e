"""Attention on DTensors on neuron: the fused attention kernel neuron runs gets DTensor's
sharding strategies (torchneuron/distributed/dtensor_sdpa.py), so head- and batch-sharded
``scaled_dot_product_attention`` (PyTorch's fsdp_tp_example.py) runs, forward and backward,
and equals attention on whole CPU tensors."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from dist_support import run_ranks


def sharded_attention(rank: int, world: int) -> dict:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    mesh = init_device_mesh("neuron", (world,))
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 4, 6, 8, generator=g) for _ in range(3))  # (batch, heads, seq, dim)
    grad = torch.randn(2, 4, 6, 8, generator=g)
    found = {}
    for name, placement in (("heads", Shard(1)), ("batch", Shard(0))):
        leaves = [distribute_tensor(t.to("neuron"), mesh, [placement]).requires_grad_() for t in (q, k, v)]
        out = F.scaled_dot_product_attention(*leaves, is_causal=True)
        out.backward(distribute_tensor(grad.to("neuron"), mesh, [placement]))
        found[name] = {"placement": str(out.placements[0]), "out": out.full_tensor().cpu(),
                       "grads": [t.grad.full_tensor().cpu() for t in leaves]}
    return {"found": found, "inputs": (q, k, v, grad)}


def test_sharded_scaled_dot_product_attention_equals_whole_cpu(tmp_path):
    for result in run_ranks(sharded_attention, 2, tmp_path):
        q, k, v, grad = (t.requires_grad_() for t in result["inputs"])
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        out.backward(grad[...].detach())
        for name, placement in (("heads", "S(1)"), ("batch", "S(0)")):
            got = result["found"][name]
            assert got["placement"] == placement  # computed sharded, not replicated first
            torch.testing.assert_close(got["out"], out.detach())
            for mine, reference in zip(got["grads"], (q.grad, k.grad, v.grad)):
                torch.testing.assert_close(mine, reference)


def sharded_masked_attention(rank: int, world: int) -> dict:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    mesh = init_device_mesh("neuron", (world,))
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, 4, 6, 8, generator=g) for _ in range(3))
    masks = {"broadcast": torch.rand(6, 6, generator=g) > 0.3,  # [L, S]: replicated on every rank
             "per-head": torch.randn(2, 4, 6, 6, generator=g)}  # follows the head sharding
    found = {}
    for name, mask in masks.items():
        leaves = [distribute_tensor(t.to("neuron"), mesh, [Shard(1)]).requires_grad_() for t in (q, k, v)]
        placement = [Shard(1)] if mask.dim() == 4 else [Replicate()]
        out = F.scaled_dot_product_attention(*leaves, attn_mask=distribute_tensor(mask.to("neuron"), mesh, placement))
        out.sum().backward()
        found[name] = {"placement": str(out.placements[0]), "out": out.full_tensor().cpu(),
                       "grads": [t.grad.full_tensor().cpu() for t in leaves]}
    return {"found": found, "inputs": (q, k, v), "masks": masks}


def test_sharded_attention_with_a_mask_equals_whole_cpu(tmp_path):
    """The fused kernel's attention mask is sharded with the heads where it has them."""
    for result in run_ranks(sharded_masked_attention, 2, tmp_path):
        for name, mask in result["masks"].items():
            q, k, v = (t.detach().clone().requires_grad_() for t in result["inputs"])
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
            out.sum().backward()
            got = result["found"][name]
            assert got["placement"] == "S(1)", name
            torch.testing.assert_close(got["out"], out.detach())
            for mine, reference in zip(got["grads"], (q.grad, k.grad, v.grad)):
                torch.testing.assert_close(mine, reference)
