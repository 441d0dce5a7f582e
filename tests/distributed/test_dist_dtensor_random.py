"""DTensor random ops on neuron (torchneuron.distributed.dtensor_rng): DTensor's own Philox
tracker cannot read the neuron generator's Mersenne Twister state, so torchneuron's tracker
runs each op on a generator seeded from the shared state and the rank's shard."""

from __future__ import annotations

import torch
import torch.nn as nn
from dist_support import run_ranks

from torchneuron.distributed.dtensor_rng import shard_seed, split_state


def random_ops(rank: int, world: int) -> dict:
    # DTensor imported after the group exists, as in many scripts (the tracker follows the import)
    import torch.distributed._functional_collectives as funcol
    import torch.distributed.tensor as dt
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    def plain(t: torch.Tensor) -> torch.Tensor:
        return t.trigger_wait() if isinstance(t, funcol.AsyncCollectiveTensor) else t

    mesh = init_device_mesh("neuron", (world,))
    torch.manual_seed(0)
    sharded = dt.randn(4, 4, device_mesh=mesh, placements=[Shard(0)])
    replicated = dt.rand(4, 4, device_mesh=mesh, placements=[Replicate()])
    ones = torch.ones(4, 6, device="neuron")
    dropped_shards = nn.functional.dropout(distribute_tensor(ones, mesh, [Shard(1)]), 0.5)
    dropped_replicas = nn.functional.dropout(distribute_tensor(ones, mesh, [Replicate()]), 0.5)
    after = torch.randn(3, device="neuron")  # the ranks' generators moved on in step

    # FSDP2's meta-device initialisation, as in PyTorch's FSDP2 example
    with torch.device("meta"):
        model = nn.Linear(8, 8)
    fully_shard(model, mesh=mesh)
    model.to_empty(device="neuron")
    model.reset_parameters()
    return {"sharded": sharded.to_local().cpu(), "replicated": replicated.to_local().cpu(),
            "dropped_shards": plain(dropped_shards.to_local()).cpu(),
            "dropped_replicas": plain(dropped_replicas.to_local()).cpu(), "after": after.cpu(),
            "weight": model.weight.to_local().detach().cpu(),
            "local_device": str(sharded.to_local().device)}


def test_dtensor_random_ops_on_neuron(tmp_path):
    ranks = run_ranks(random_ops, 2, tmp_path)

    # the exact rule, on CPU's generator (the neuron generator's stream is CPU's)
    torch.manual_seed(0)
    key, state = split_state(torch.get_rng_state())
    expected_shards = [torch.randn(2, 4, generator=torch.Generator().manual_seed(shard_seed(key, (r,))))
                       for r in range(2)]
    key, _ = split_state(state)
    expected_replica = torch.rand(4, 4, generator=torch.Generator().manual_seed(shard_seed(key, (0,))))

    for rank, result in enumerate(ranks):
        assert result["local_device"] == f"neuron:{rank}"
        torch.testing.assert_close(result["sharded"], expected_shards[rank], rtol=0, atol=0)
        torch.testing.assert_close(result["replicated"], expected_replica, rtol=0, atol=0)
    first, second = ranks
    # replicas draw the same values, shards different ones
    assert torch.equal(first["dropped_replicas"], second["dropped_replicas"])
    assert not torch.equal(first["dropped_shards"], second["dropped_shards"])
    assert not torch.equal(first["weight"], second["weight"])
    for r in ranks:
        assert set(r["dropped_shards"].unique().tolist()) == {0.0, 2.0}
        bound = 1 / 8 ** 0.5  # nn.Linear's kaiming_uniform_ bound for fan_in 8
        assert r["weight"].abs().max() <= bound and r["weight"].std() > 0
    assert torch.equal(first["after"], second["after"])


def test_install_keeps_a_tracker_the_program_set(monkeypatch):
    import torch.distributed.tensor._random as dtensor_random

    from torchneuron.distributed import dtensor_rng

    own = object()
    monkeypatch.setattr(dtensor_random, "_rng_tracker", own)
    assert dtensor_rng.install() is False and dtensor_random._rng_tracker is own
    monkeypatch.setattr(dtensor_random, "_rng_tracker", None)
    assert dtensor_rng.install() is True
    assert isinstance(dtensor_random._rng_tracker, dtensor_rng.tracker_class())
