"""FSDP2, DTensor tensor parallelism, device meshes and functional collectives on neuron
equal the same programs on CPU tensors over gloo."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
from dist_support import run_ranks

from torchneuron.testing import is_on_neuron


def plain(t: torch.Tensor) -> torch.Tensor:
    """A collective's result as a plain tensor (funcol may hand back an unwaited AsyncCollectiveTensor)."""
    import torch.distributed._functional_collectives as funcol

    return t.trigger_wait() if isinstance(t, funcol.AsyncCollectiveTensor) else t


def mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 8))


def data(world: int, steps: int = 3) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(2)
    return [torch.randn(world, 4, 8, generator=g) for _ in range(steps)]


def fsdp2_train(rank: int, world: int, device_type: str, mixed: bool) -> dict:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    device = torch.device(device_type, rank) if device_type == "neuron" else torch.device("cpu")
    model = mlp().to(device)
    # fully_shard's default mesh is on the accelerator (neuron); the CPU reference needs its own.
    kwargs = {"mesh": init_device_mesh(device_type, (world,))}
    if mixed:
        kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, **kwargs)
    fully_shard(model, **kwargs)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    losses = []
    for x in data(world):
        loss = model(x[rank].to(device)).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.detach().float().cpu())
    local = [p.to_local() for p in model.parameters()]
    full = [plain(p.full_tensor()).cpu() for p in model.parameters()]
    on_device = all(is_on_neuron(t, rank) for t in local) if device_type == "neuron" else True
    return {"losses": losses, "full": full, "on_device": on_device}


@pytest.mark.parametrize("mixed", [False, True], ids=["fp32", "bf16_params"])
def test_fsdp2_fully_shard_equals_gloo_on_cpu(tmp_path, mixed):
    neuron = run_ranks(fsdp2_train, 2, tmp_path, "neuron", mixed)
    cpu = run_ranks(fsdp2_train, 2, tmp_path, "cpu", mixed, backend="gloo")
    for n, c in zip(neuron, cpu):
        assert n["on_device"]
        for got, want in zip(n["losses"] + n["full"], c["losses"] + c["full"]):
            torch.testing.assert_close(got, want, rtol=0, atol=0)


def fsdp2_single_process_2_ranks() -> list[torch.Tensor]:
    """FSDP2's average of the two ranks' gradients in one CPU process (g0 / 2 + g1 / 2)."""
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    for x in data(2):
        grads = []
        for r in range(2):
            model.zero_grad(set_to_none=True)
            model(x[r]).square().mean().backward()
            grads.append([p.grad.clone() for p in model.parameters()])
        for p, g0, g1 in zip(model.parameters(), *grads):
            p.grad = g0 / 2 + g1 / 2
        opt.step()
    return [p.detach() for p in model.parameters()]


def test_fsdp2_equals_single_process_cpu_training(tmp_path):
    results = run_ranks(fsdp2_train, 2, tmp_path, "neuron", False)
    for got, want in zip(results[0]["full"], fsdp2_single_process_2_ranks()):
        torch.testing.assert_close(got, want, rtol=0, atol=0)


def tensor_parallel(rank: int, world: int, device_type: str) -> dict:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    mesh = init_device_mesh(device_type, (world,))
    model = mlp().to(mesh.device_type)
    parallelize_module(model, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
    x = data(world, 1)[0][0].to(mesh.device_type)  # every rank the same input, as TP needs
    out = model(x)
    out.square().mean().backward()
    grads = [plain(p.grad.full_tensor()).cpu() for p in model.parameters()]
    on_device = all(is_on_neuron(p.to_local(), rank) for p in model.parameters()) \
        if device_type == "neuron" else True
    return {"out": plain(out).detach().cpu(), "grads": grads, "on_device": on_device,
            "mesh": str(mesh.device_type)}


def test_dtensor_colwise_rowwise_equal_gloo_on_cpu(tmp_path):
    neuron = run_ranks(tensor_parallel, 2, tmp_path, "neuron")
    cpu = run_ranks(tensor_parallel, 2, tmp_path, "cpu", backend="gloo")
    for n, c in zip(neuron, cpu):
        assert n["on_device"] and n["mesh"] == "neuron"
        for got, want in zip([n["out"]] + n["grads"], [c["out"]] + c["grads"]):
            torch.testing.assert_close(got, want, rtol=0, atol=0)


def functional(rank: int, world: int, device_type: str, compiled: bool) -> dict:
    import torch.distributed._functional_collectives as funcol
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh(device_type, (world,), mesh_dim_names=("dp",))
    x = (torch.arange(4, dtype=torch.float32) + rank).to(device_type)
    out = {
        "all_reduce": funcol.all_reduce(x, "sum", mesh).wait(),
        "all_gather": funcol.all_gather_tensor(x, 0, mesh).wait(),
        "reduce_scatter": funcol.reduce_scatter_tensor(x, "sum", 0, mesh).wait(),
        "all_to_all": funcol.all_to_all_single(x, None, None, mesh).wait(),
    }

    def step(t):
        return funcol.all_reduce(t * 2, "sum", mesh).wait() + 1

    out["eager"] = step(x)
    if compiled:
        out["compiled"] = torch.compile(step, backend="neuron" if device_type == "neuron" else "inductor",
                                        fullgraph=True)(x)
    return {k: plain(v).cpu() for k, v in out.items()}


@pytest.mark.parametrize("compiled", [False, pytest.param(True, marks=pytest.mark.slow)],
                         ids=["eager", "compiled"])
def test_functional_collectives_equal_gloo(tmp_path, compiled):
    neuron = run_ranks(functional, 2, tmp_path, "neuron", compiled)
    cpu = run_ranks(functional, 2, tmp_path, "cpu", compiled, backend="gloo")
    for n, c in zip(neuron, cpu):
        if compiled:  # torch.compile(backend="neuron") with a collective in the graph equals eager
            torch.testing.assert_close(n["compiled"], n["eager"], rtol=0, atol=0)
        for name in c:
            torch.testing.assert_close(n[name], c[name], rtol=0, atol=0, msg=name)


class NormMLP(nn.Module):
    """A transformer block's MLP half: LayerNorm (sequence parallel), then the TP MLP."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(8)
        self.up = nn.Linear(8, 16)
        self.down = nn.Linear(16, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.relu(self.up(self.norm(x))))


def sequence_parallel(rank: int, world: int, device_type: str) -> dict:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel, RowwiseParallel, SequenceParallel, parallelize_module)

    mesh = init_device_mesh(device_type, (world,))
    torch.manual_seed(0)
    model = NormMLP().to(mesh.device_type)
    parallelize_module(model, mesh, {
        "norm": SequenceParallel(),                          # activations sharded on the sequence dim
        "up": ColwiseParallel(input_layouts=Shard(1)),      # all-gather the sequence
        "down": RowwiseParallel(output_layouts=Shard(1)),   # reduce-scatter back to sequence shards
    })
    g = torch.Generator().manual_seed(2)
    x = torch.randn(2, 6, 8, generator=g).chunk(world, dim=1)[rank].to(device_type)
    out = model(x)
    out.square().mean().backward()
    local_out = plain(out.to_local() if hasattr(out, "to_local") else out)
    return {"out": local_out.detach().cpu(), "sharded_output": local_out.shape[1] == 6 // world,
            "grads": [plain(p.grad.full_tensor()).cpu() for p in model.parameters()],
            "on_device": device_type != "neuron" or all(is_on_neuron(p.to_local(), rank)
                                                        for p in model.parameters())}


def test_dtensor_sequence_parallel_equals_gloo_on_cpu(tmp_path):
    neuron = run_ranks(sequence_parallel, 2, tmp_path, "neuron")
    cpu = run_ranks(sequence_parallel, 2, tmp_path, "cpu", backend="gloo")
    for n, c in zip(neuron, cpu):
        assert n["on_device"] and n["sharded_output"]
        for got, want in zip([n["out"]] + n["grads"], [c["out"]] + c["grads"]):
            torch.testing.assert_close(got, want, rtol=0, atol=0)
