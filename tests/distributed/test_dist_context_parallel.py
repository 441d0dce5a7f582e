"""Context parallelism on neuron: PyTorch's context_parallel runs ring attention over neuron's
fused attention (torchneuron/distributed/context_parallel.py), so each rank gets its own shard
of the sequence, and the gathered result and gradients equal whole-sequence attention on CPU."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from dist_support import run_ranks


def cp_attention(rank: int, world: int, load_balance: bool) -> dict:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.experimental import context_parallel
    from torch.distributed.tensor.experimental._context_parallel import _attention as cp

    cp._cp_options.enable_load_balance = load_balance
    mesh = init_device_mesh("neuron", (world,))
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 4, 16, 8, generator=g) for _ in range(3))
    grad = torch.randn(2, 4, 16, 8, generator=g)
    leaves = [t.to("neuron").requires_grad_() for t in (q, k, v)]
    shards = [t.detach().clone() for t in leaves]
    grad_shard = grad.to("neuron")
    with context_parallel(mesh, buffers=[*shards, grad_shard], buffer_seq_dims=[2, 2, 2, 2]):
        local = [t.detach().requires_grad_() for t in shards]  # the buffers stay restorable
        out = F.scaled_dot_product_attention(*local, is_causal=True)
        local_shape = tuple(out.shape)
        out.backward(grad_shard)
    return {"local_shape": local_shape, "out": out.detach().cpu(), "grads": [t.grad.cpu() for t in local],
            "inputs": (q, k, v, grad)}


@pytest.mark.parametrize("load_balance", [False, True], ids=["ring", "load-balanced"])
def test_context_parallel_attention_shards_the_sequence_and_equals_cpu(tmp_path, load_balance):
    results = run_ranks(cp_attention, 2, tmp_path, load_balance)
    q, k, v, grad = (t.clone().requires_grad_() if i < 3 else t for i, t in enumerate(results[0]["inputs"]))
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    ref.backward(grad)
    assert all(r["local_shape"] == (2, 4, 8, 8) for r in results)  # each rank its half of the sequence
    # context_parallel shards the sequence in chunks (load balanced: rank r holds chunks r and 3 - r)
    chunks = 4 if load_balance else 2
    order = [0, 3, 1, 2] if load_balance else [0, 1]
    def gather(key, index=None):
        pieces = [(r[key] if index is None else r[key][index]).chunk(chunks // 2, dim=2) for r in results]
        flat = [c for p in pieces for c in p]
        placed = [None] * chunks
        for position, chunk in zip(order, flat):
            placed[position] = chunk
        return torch.cat(placed, dim=2)
    scale = ref.abs().max().item()
    torch.testing.assert_close(gather("out"), ref.detach(), rtol=1e-5, atol=1e-6 * scale)
    for i, leaf in enumerate((q, k, v)):
        torch.testing.assert_close(gather("grads", i), leaf.grad, rtol=1e-4, atol=1e-5 * leaf.grad.abs().max().item())


def cp_torchtitan_layout(rank: int, world: int) -> dict:
    """q/k/v as torchtitan hands them: local (batch, seq shard, heads, dim) wrapped as Shard(2),
    then transposed, so the DTensors name Shard(1) while the sequence is what is split."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard
    from torch.distributed.tensor.experimental._context_parallel import _attention as cp

    cp._cp_options.enable_load_balance = False
    mesh = init_device_mesh("neuron", (world,))
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 16, 4, 8, generator=g) for _ in range(3))  # (batch, seq, heads, dim)
    local = [t.chunk(world, dim=1)[rank].to("neuron") for t in (q, k, v)]
    cp._enable_context_parallel_dispatcher()
    try:
        dq, dk, dv = (DTensor.from_local(t, mesh, [Shard(2)], run_check=False).transpose(1, 2) for t in local)
        out = F.scaled_dot_product_attention(dq, dk, dv, is_causal=True)
    finally:
        cp._disable_context_parallel_dispatcher()
    return {"placement": str(out.placements[0]), "out": out.to_local().transpose(1, 2).cpu(), "qkv": (q, k, v)}


def test_context_parallel_takes_torchtitans_labelling_as_cuda_does(tmp_path):
    results = run_ranks(cp_torchtitan_layout, 2, tmp_path)
    q, k, v = (t.transpose(1, 2) for t in results[0]["qkv"])
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2)
    got = torch.cat([r["out"] for r in results], dim=1)  # rank r holds sequence chunk r
    assert all(r["placement"] == "S(1)" for r in results)  # placed as the inputs were
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-6 * ref.abs().max().item())
