"""Dataless execution on real ranks: a 2-rank FSDP2 training step records, on each rank,
what the same step records with values (ops, modelled time, collectives, peak memory)."""

from __future__ import annotations

import torch
import torch.nn as nn
from dist_support import run_ranks


def _fsdp_step_records(rank: int, world: int) -> dict:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from torchneuron.profiler.run_record import record_run

    mesh = init_device_mesh("neuron", (world,))

    def step():
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 32), nn.Linear(32, 8))
        for layer in model:
            if isinstance(layer, nn.Linear):
                fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        model.to("neuron")
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        x = torch.randn(4, 32).to("neuron")
        for _ in range(2):
            model(x).pow(2).mean().backward()
            opt.step()
            opt.zero_grad()
        return model

    record_run(step, dataless_run=False)  # warm-up: first-use work (streams, costs) out of the way
    normal = record_run(step, dataless_run=False)
    dataless = record_run(step, dataless_run=True)
    return {"equal": normal == dataless, "normal": repr(normal), "dataless": repr(dataless),
            "collectives": [w[1] for w in normal.work if w[0] == "collective"]}


def test_fsdp2_step_on_two_ranks_records_the_same_dataless(tmp_path):
    for rank, result in enumerate(run_ranks(_fsdp_step_records, 2, tmp_path)):
        assert result["equal"], f"rank {rank}:\n normal:   {result['normal']}\n dataless: {result['dataless']}"
        kinds = " ".join(result["collectives"])
        assert "all_gather" in kinds and "reduce_scatter" in kinds  # FSDP2's collectives ran and were charged
