"""A collective's tensors are freed when the program frees them, as on a device whose
collectives are stream-ordered: the host views gloo gets do not keep device memory alive
(they used to keep it allocated until the next collective call, above the real peak)."""

from __future__ import annotations

import torch
import torch.distributed as dist
from dist_support import run_ranks


def _freed_after_del(rank: int, world: int) -> dict:
    base = torch.neuron.memory_allocated()
    x = torch.ones(1 << 18, device="neuron")
    dist.all_reduce(x)
    out = torch.empty(world << 18, device="neuron")
    dist.all_gather_into_tensor(out, x)
    handle = dist.all_reduce(y := torch.ones(1 << 18, device="neuron"), async_op=True)
    handle.wait()
    result = handle.result()  # NCCL's results are the device tensors
    same = len(result) == 1 and result[0].device.type == "neuron" and result[0].data_ptr() == y.data_ptr()
    future_value = dist.all_reduce(z := torch.ones(8, device="neuron"), async_op=True).get_future().wait()
    del x, out, y, result, handle
    left = torch.neuron.memory_allocated() - base
    return {"left": left, "z": z.numel() * z.element_size(), "result_is_device_tensor": same,
            "future_is_device_tensor": future_value[0].device.type == "neuron",
            "future_value": future_value[0].cpu()}


def test_collective_memory_is_freed_when_the_program_frees_it(tmp_path):
    for rank, out in enumerate(run_ranks(_freed_after_del, 2, tmp_path)):
        assert out["left"] <= 256 + out["z"], f"rank {rank}: {out['left']} bytes still allocated"
        assert out["result_is_device_tensor"] and out["future_is_device_tensor"]
        torch.testing.assert_close(out["future_value"], torch.full((8,), 2.0), rtol=0, atol=0)
