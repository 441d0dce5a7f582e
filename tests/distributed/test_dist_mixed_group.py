"""A group made with ``"cpu:gloo,neuron:neuron"`` has the neuron backend as its default (as
``"cpu:gloo,cuda:nccl"`` defaults to NCCL), so c10d finds it and tears it down silently."""

import torch
import torch.distributed as dist

from dist_support import run_ranks


def _mixed(rank: int, world: int):
    on_neuron = torch.full((4,), float(rank + 1), device=torch.device("neuron", rank))
    on_cpu = torch.full((4,), float(rank + 1))
    dist.all_reduce(on_neuron)
    dist.all_reduce(on_cpu)
    return on_neuron.cpu(), on_cpu, dist.group.WORLD._get_backend_name()


def test_mixed_group_defaults_to_neuron_and_is_destroyed_without_warnings(tmp_path, capfd):
    results = run_ranks(_mixed, 2, tmp_path, backend="cpu:gloo,neuron:neuron")
    for on_neuron, on_cpu, default in results:
        assert torch.equal(on_neuron, torch.full((4,), 3.0))
        assert torch.equal(on_cpu, on_neuron)
        assert default == "custom"  # the neuron backend (c10d calls plugins "custom"); was "undefined"
    # The ranks' stderr: c10d warned "No backend of type 0 found" at destroy_process_group.
    assert "No backend of type" not in capfd.readouterr().err
