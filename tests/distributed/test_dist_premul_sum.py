"""``ReduceOp.PREMUL_SUM`` runs on neuron as on NCCL: each rank's input times the factor, summed.

gloo refuses it, and FSDP2 reduce-scatters with it whenever ``set_gradient_divide_factor``
is not the group's size (torchtitan sets 1.0). Oracles: each rank's input is a known
function of its rank, so every rank computes ``sum_r factor * x_r`` itself with CPU ops;
FSDP2's gradients equal the same training on CPU/gloo summed (``set_force_sum_reduction_for_comms``)
with the factor applied by hand. A collective the backend cannot run fails at once, named
as the neuron backend's refusal, not as a timeout.
"""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.distributed as dist
from dist_support import run_ranks
from torch import nn

WORLD = 2
FACTOR = 0.3


def x_of(r: int) -> torch.Tensor:
    return torch.arange(6, dtype=torch.float32).reshape(2, 3) * (r + 1) - 2.5


def premul_collectives(rank: int, world: int) -> dict:
    from torchneuron.device import accounting

    warnings.simplefilter("ignore")
    d = "neuron"
    out: dict = {}

    def keep(name, make, run, inputs=()):
        tensors = make()
        originals = [tensors[i].cpu() for i in inputs]  # the collective must leave these as they were
        before = accounting.snapshot()
        result = run(*tensors)
        torch.neuron.synchronize()
        added = accounting.snapshot().since(before)
        out[name] = {"value": [t.cpu() for t in (result if isinstance(result, list) else [result])],
                     "calls": sum(w.calls for (kind, _), w in added.work.items() if kind == "collective"),
                     "inputs_kept": all(torch.equal(tensors[i].cpu(), o) for i, o in zip(inputs, originals))}

    def op():
        return dist._make_nccl_premul_sum(FACTOR)

    def waited(w):
        if w is not None:
            w.wait()

    x = lambda: x_of(rank).to(d)
    keep("all_reduce", lambda: (x(),), lambda t: (dist.all_reduce(t, op=op()), t)[1])
    keep("all_reduce_tensor_factor", lambda: (x(), torch.tensor(FACTOR, device=d)),
         lambda t, f: (dist.all_reduce(t, op=dist._make_nccl_premul_sum(f)), t)[1])
    keep("all_reduce_fsdp_spelling", lambda: (x(),),
         lambda t: (dist.all_reduce(t, op=dist.ReduceOp.PREMUL_SUM(FACTOR)), t)[1])
    keep("all_reduce_async", lambda: (x(),), lambda t: (waited(dist.all_reduce(t, op=op(), async_op=True)), t)[1])

    def coalesced_all_reduce(a, b):
        with dist._coalescing_manager(async_ops=True) as cm:
            dist.all_reduce(a, op=op())
            dist.all_reduce(b, op=op())
        cm.wait()
        return [a, b]

    keep("all_reduce_coalesced", lambda: (x(), x() * 2), coalesced_all_reduce)
    keep("reduce", lambda: (x(),), lambda t: (dist.reduce(t, dst=0, op=op()), t)[1])
    stacked = lambda: torch.stack([x() * (j + 1) for j in range(world)])
    keep("reduce_scatter_tensor", lambda: (torch.empty(2, 3, device=d), stacked().reshape(world * 2, 3)),
         lambda o, i: (dist.reduce_scatter_tensor(o, i, op=op()), o)[1], inputs=(1,))
    keep("reduce_scatter_tensor_stacked", lambda: (torch.empty(2, 3, device=d), stacked()),
         lambda o, i: (dist.reduce_scatter_tensor(o, i, op=op()), o)[1], inputs=(1,))
    keep("reduce_scatter_tensor_async", lambda: (torch.empty(2, 3, device=d), stacked()),
         lambda o, i: (waited(dist.reduce_scatter_tensor(o, i, op=op(), async_op=True)), o)[1], inputs=(1,))
    keep("reduce_scatter", lambda: (torch.empty(2, 3, device=d), *stacked().unbind(0)),
         lambda o, *i: (dist.reduce_scatter(o, list(i), op=op()), o)[1], inputs=(1, 2))

    def coalesced_reduce_scatter(a, b, i, j):
        with dist._coalescing_manager(async_ops=True) as cm:
            dist.reduce_scatter_tensor(a, i, op=op())
            dist.reduce_scatter_tensor(b, j, op=op())
        cm.wait()
        return [a, b]

    keep("reduce_scatter_coalesced", lambda: (torch.empty(2, 3, device=d), torch.empty(6, device=d), stacked(),
                                              stacked().reshape(-1)), coalesced_reduce_scatter, inputs=(2, 3))
    return out


def test_premul_sum_in_every_reducing_collective_equals_the_oracle(tmp_path):
    results = run_ranks(premul_collectives, WORLD, tmp_path)
    xs = [x_of(r) for r in range(WORLD)]
    summed = sum(x * FACTOR for x in xs)
    for rank, got in enumerate(results):
        scattered = sum(x * (rank + 1) * FACTOR for x in xs)
        expected = {
            "all_reduce": [summed], "all_reduce_tensor_factor": [summed], "all_reduce_fsdp_spelling": [summed],
            "all_reduce_async": [summed], "all_reduce_coalesced": [summed, sum(x * 2 * FACTOR for x in xs)],
            "reduce": [summed if rank == 0 else xs[rank]],  # NCCL leaves the other ranks' tensors alone
            "reduce_scatter_tensor": [scattered], "reduce_scatter_tensor_stacked": [scattered],
            "reduce_scatter_tensor_async": [scattered], "reduce_scatter": [scattered],
            "reduce_scatter_coalesced": [scattered, scattered.reshape(-1)],
        }
        assert set(got) == set(expected)
        for name, want in expected.items():
            for g, w in zip(got[name]["value"], want, strict=True):
                torch.testing.assert_close(g, w, rtol=0, atol=0, msg=f"rank {rank} {name}")
            assert got[name]["calls"] == 1, (rank, name, got[name]["calls"])  # recorded once
            assert got[name]["inputs_kept"], (rank, name)


def refused_at_once(rank: int, world: int) -> dict:
    t = torch.ones(2, device="neuron")
    try:
        dist.all_reduce(t, op=dist.ReduceOp.BAND)  # gloo reduces no float tensor bitwise
        error = None
    except Exception as e:  # noqa: BLE001 - the test inspects what was raised
        error = (type(e).__name__, str(e))
    u = torch.full((2,), float(rank + 1), device="neuron")
    dist.all_reduce(u)  # the group still works
    return {"error": error, "after": u.cpu()}


def test_a_collective_the_backend_cannot_run_fails_at_once_naming_it(tmp_path):
    import datetime

    # A group timeout beyond run_ranks' deadline: a refusal reported only at the timeout fails the test.
    for got in run_ranks(refused_at_once, WORLD, tmp_path, timeout=datetime.timedelta(seconds=600)):
        assert got["error"] is not None
        kind, message = got["error"]
        assert kind == "DistBackendError", got["error"]
        assert message.startswith("all_reduce (collective #") and "[2] float32" in message, message
        assert "the neuron backend cannot run it" in message and "BAND" in message, message
        assert "timeout" not in message and "Gloo" not in message, message
        torch.testing.assert_close(got["after"], torch.full((2,), 3.0))


def mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 8))


def fsdp2_grads(rank: int, world: int, device_type: str, factor: float) -> dict:
    """One FSDP2 step; neuron divides by ``factor`` as torchtitan asks (PREMUL_SUM); the CPU/gloo
    reference sums (``set_force_sum_reduction_for_comms``) and the factor is applied here, by hand."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FSDPModule, fully_shard

    device = torch.device(device_type, rank) if device_type == "neuron" else torch.device("cpu")
    mesh = init_device_mesh(device_type, (world,))
    model = mlp().to(device)
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    for module in model.modules():  # each fully_shard'ed module has its own setting, as torchtitan sets them
        if isinstance(module, FSDPModule):
            if device_type == "neuron":
                module.set_gradient_divide_factor(factor)
            else:
                module.set_force_sum_reduction_for_comms(True)
                module.set_gradient_divide_factor(1.0)  # a plain sum, which gloo runs
    g = torch.Generator().manual_seed(2)
    x = torch.randn(world, 4, 8, generator=g)[rank].to(device)
    model(x).square().mean().backward()
    grads = [p.grad.full_tensor().cpu() for p in model.parameters()]
    if device_type != "neuron":
        grads = [grad / factor for grad in grads]
    return {"grads": grads}


@pytest.mark.parametrize("factor", [1.0, 4.0])
def test_fsdp2_gradient_divide_factor_equals_gloo_with_the_factor_applied_by_hand(tmp_path, factor):
    neuron = run_ranks(fsdp2_grads, WORLD, tmp_path, "neuron", factor)
    cpu = run_ranks(fsdp2_grads, WORLD, tmp_path, "cpu", factor, backend="gloo")
    for n, c in zip(neuron, cpu):
        for got, want in zip(n["grads"], c["grads"], strict=True):
            torch.testing.assert_close(got, want, rtol=0, atol=0)
