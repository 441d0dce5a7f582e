"""torch.distributed.checkpoint on neuron: DDP and FSDP2 model and optimizer state saved by
2 ranks loads into 1 rank (and, slow, 4 ranks) with every value equal."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
from dist_support import run_ranks

from torchneuron.testing import is_on_neuron


def mlp(seed: int) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 8))


def flat(state: dict, prefix: str = "") -> dict[str, object]:
    """A (model, optimizer) state dict as {dotted key: full CPU tensor or plain value}."""
    import torch.distributed._functional_collectives as funcol
    from torch.distributed.tensor import DTensor

    out: dict[str, object] = {}
    items = state.items() if isinstance(state, dict) else enumerate(state)
    for key, value in items:
        name = f"{prefix}{key}"
        if isinstance(value, (dict, list)):
            out.update(flat(value, name + "."))
        elif isinstance(value, DTensor):
            full = value.full_tensor()
            full = full.trigger_wait() if isinstance(full, funcol.AsyncCollectiveTensor) else full
            out[name] = full.cpu()
        elif isinstance(value, torch.Tensor):
            out[name] = value.cpu()
        else:
            out[name] = value
    return out


def ddp_model(rank: int, seed: int) -> tuple[nn.Module, torch.optim.Optimizer]:
    from torch.nn.parallel import DistributedDataParallel as DDP

    model = DDP(mlp(seed).to(torch.device("neuron", rank)))
    return model, torch.optim.Adam(model.parameters(), lr=0.1)


def fsdp2_model(world: int, seed: int) -> tuple[nn.Module, torch.optim.Optimizer]:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("neuron", (world,))
    model = mlp(seed).to("neuron")
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model, torch.optim.Adam(model.parameters(), lr=0.1)


def models(rank: int, world: int, seed: int) -> dict[str, tuple[nn.Module, torch.optim.Optimizer]]:
    return {"ddp": ddp_model(rank, seed), "fsdp2": fsdp2_model(world, seed)}


def train_and_save(rank: int, world: int, root: str) -> dict:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    saved = {}
    for name, (model, opt) in models(rank, world, seed=0).items():
        g = torch.Generator().manual_seed(1)
        for _ in range(2):
            x = torch.randn(world, 4, 8, generator=g)[rank].to("neuron")
            model(x).square().mean().backward()
            opt.step()
            opt.zero_grad()
        model_state, optim_state = get_state_dict(model, opt)
        state = {"model": model_state, "optim": optim_state}
        dcp.save(state, checkpoint_id=f"{root}/{name}")
        saved[name] = flat(state)
    return saved


def load(rank: int, world: int, root: str) -> dict:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    loaded = {}
    for name, (model, opt) in models(rank, world, seed=5).items():
        model_state, optim_state = get_state_dict(model, opt)  # initialises Adam's state
        state = {"model": model_state, "optim": optim_state}
        dcp.load(state, checkpoint_id=f"{root}/{name}")
        set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
        local = [p.to_local() if hasattr(p, "to_local") else p for p in model.parameters()]
        loaded[name] = {"state": flat(dict(zip(("model", "optim"), get_state_dict(model, opt)))),
                        "on_device": all(is_on_neuron(t, rank) for t in local)}
    return loaded


@pytest.mark.parametrize("load_world", [1, pytest.param(4, marks=pytest.mark.slow)])
def test_checkpoint_saved_by_2_ranks_loads_into_other_world_sizes(tmp_path, load_world):
    root = str(tmp_path / "checkpoints")
    saved = run_ranks(train_and_save, 2, tmp_path, root)[0]
    for rank_result in run_ranks(load, load_world, tmp_path, root):
        for name, expected in saved.items():
            got = rank_result[name]
            assert got["on_device"], name
            assert sorted(got["state"]) == sorted(expected), name
            assert any(k.startswith("optim.state.") and k.endswith("exp_avg_sq") for k in expected)
            for key, want in expected.items():
                if isinstance(want, torch.Tensor):
                    torch.testing.assert_close(got["state"][key], want, rtol=0, atol=0, msg=f"{name} {key}")
                else:
                    assert got["state"][key] == want, (name, key)
