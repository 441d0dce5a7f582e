"""Every collective on the `neuron` backend equals the same program on CPU tensors over gloo."""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist
from dist_support import run_ranks
from torch.testing import assert_close

from torchneuron.testing import is_on_neuron

REDUCE_OPS = ["SUM", "AVG", "MAX", "MIN", "PRODUCT"]
BITWISE_OPS = ["BAND", "BOR", "BXOR"]


def collectives(rank: int, world: int, device: str) -> dict:
    """One of each collective; results to the host. Runs unchanged on cpu/gloo and neuron."""
    out: dict = {}
    on_device = []

    def keep(name, t):
        if device == "neuron":
            on_device.append(is_on_neuron(t, rank))
        out[name] = t.cpu()

    x = (torch.arange(6, dtype=torch.float32) * (rank + 1) - 2).to(device)
    for op in REDUCE_OPS:
        t = x.clone()
        dist.all_reduce(t, op=getattr(dist.ReduceOp, op))
        keep(op, t)
    for op in BITWISE_OPS:
        t = torch.tensor([rank + 1, 3, 12], device=device)
        dist.all_reduce(t, op=getattr(dist.ReduceOp, op))
        keep(op, t)
    t = x.to(torch.bfloat16)
    dist.all_reduce(t)
    keep("bf16", t)
    t = x.clone()
    dist.broadcast(t, src=world - 1)
    keep("broadcast", t)
    t = x.clone()
    dist.reduce(t, dst=0, op=dist.ReduceOp.MAX)
    keep("reduce", t)
    parts = [torch.empty(6, device=device) for _ in range(world)]
    dist.all_gather(parts, x)
    keep("all_gather", torch.stack(parts))
    t = torch.empty(6 * world, device=device)
    dist.all_gather_into_tensor(t, x)
    keep("all_gather_into_tensor", t)
    t = torch.empty(3, device=device)
    dist.reduce_scatter_tensor(t, torch.arange(3 * world, dtype=torch.float32, device=device) * (rank + 1))
    keep("reduce_scatter_tensor", t)
    t = torch.empty(3, device=device)
    dist.reduce_scatter(t, [torch.full((3,), float(rank + i), device=device) for i in range(world)])
    keep("reduce_scatter", t)
    in_splits, out_splits = [r + 1 for r in range(world)], [rank + 1] * world  # uneven
    t = torch.empty(sum(out_splits), device=device)
    dist.all_to_all_single(t, torch.arange(sum(in_splits), dtype=torch.float32, device=device) + 100 * rank,
                           out_splits, in_splits)
    keep("all_to_all_single_uneven", t)
    outs = [torch.empty(2, device=device) for _ in range(world)]
    dist.all_to_all(outs, [torch.full((2,), float(rank * 10 + i), device=device) for i in range(world)])
    keep("all_to_all", torch.stack(outs))
    gathered = [torch.empty(6, device=device) for _ in range(world)] if rank == 0 else None
    dist.gather(x, gathered, dst=0)
    if rank == 0:
        keep("gather", torch.stack(gathered))
    t = torch.empty(2, device=device)
    dist.scatter(t, [torch.full((2,), float(i), device=device) for i in range(world)] if rank == 0 else None, src=0)
    keep("scatter", t)
    if rank < 2:  # send/recv between ranks 0 and 1
        t = torch.empty(6, device=device)
        if rank == 0:
            dist.send(x, 1)
            dist.recv(t, 1)
        else:
            dist.recv(t, 0)
            dist.send(t * 2, 0)
        keep("send_recv", t)
    t = torch.empty(6, device=device)
    ops = [dist.P2POp(dist.isend, x, (rank + 1) % world), dist.P2POp(dist.irecv, t, (rank - 1) % world)]
    for work in dist.batch_isend_irecv(ops):
        work.wait()
    keep("batch_isend_irecv", t)
    work = dist.all_reduce(t := x.clone(), async_op=True)
    out["wait"] = work.wait()
    out["is_completed"] = work.is_completed()
    keep("async", t)
    future = dist.all_reduce(t := x.clone(), async_op=True).get_future()
    out["future"] = future.wait()[0].cpu()  # gloo's future holds CPU views of the device memory
    keep("future_target", t)
    dist.barrier()
    ts = [x.clone(), x[:3].clone()]
    dist.all_reduce_coalesced(ts)
    keep("all_reduce_coalesced0", ts[0])
    keep("all_reduce_coalesced1", ts[1])
    with dist._coalescing_manager(async_ops=True) as manager:
        a, b = x.clone(), x * 2
        dist.all_reduce(a)
        dist.all_reduce(b)
    manager.wait()
    keep("coalescing_manager_a", a)
    keep("coalescing_manager_b", b)
    objects = [None] * world
    dist.all_gather_object(objects, {"rank": rank})
    out["all_gather_object"] = objects
    box = [rank]
    dist.broadcast_object_list(box, src=world - 1)
    out["broadcast_object_list"] = box
    pairs, _ = dist.new_subgroups(group_size=2)
    t = x.clone()
    dist.all_reduce(t, group=pairs)
    keep("new_subgroups", t)
    evens = dist.new_group([r for r in range(world) if r % 2 == 0])
    if rank % 2 == 0:
        t = x.clone()
        dist.all_reduce(t, group=evens)
        keep("new_group", t)
    out["on_device"] = on_device
    return out


@pytest.mark.parametrize("world", [2, pytest.param(4, marks=pytest.mark.slow)])
def test_collectives_equal_gloo_on_cpu(tmp_path, world):
    neuron = run_ranks(collectives, world, tmp_path, "neuron", backend="neuron")
    cpu = run_ranks(collectives, world, tmp_path, "cpu", backend="gloo")
    for rank in range(world):
        assert neuron[rank]["on_device"] and all(neuron[rank]["on_device"])
        del neuron[rank]["on_device"], cpu[rank]["on_device"]
        assert neuron[rank].keys() == cpu[rank].keys()
        for name in cpu[rank]:
            assert_close(neuron[rank][name], cpu[rank][name], rtol=0, atol=0, msg=f"rank {rank} {name}")
        assert neuron[rank]["wait"] is True and neuron[rank]["is_completed"] is True


def backend_and_device(rank: int, world: int) -> dict:
    t = torch.full((2,), float(rank + 1), device="neuron")
    dist.all_reduce(t)
    cpu = torch.full((2,), float(rank + 1))
    cpu_ok = True
    try:
        dist.all_reduce(cpu)
    except (RuntimeError, ValueError) as e:  # a neuron-only group refuses CPU tensors, as NCCL does
        cpu_ok = str(e)
    return {"current": torch.accelerator.current_device_index(), "sum": t.cpu(), "cpu": cpu_ok,
            "device_backend": str(dist.get_default_backend_for_device("neuron"))}


@pytest.mark.parametrize("backend", [None, "neuron", "cpu:gloo,neuron:neuron"])
def test_init_process_group_forms(tmp_path, backend):
    results = run_ranks(backend_and_device, 2, tmp_path, backend=backend)
    for rank, result in enumerate(results):
        assert result["current"] == rank  # LOCAL_RANK chose neuron:<rank>
        assert_close(result["sum"], torch.full((2,), 3.0), rtol=0, atol=0)
        assert result["device_backend"] == "neuron"
        if backend == "cpu:gloo,neuron:neuron":
            assert result["cpu"] is True
        else:
            assert "No backend type associated with device type cpu" in result["cpu"]


def with_device_id(rank: int, world: int) -> dict:
    group = dist.group.WORLD
    t = torch.ones(3, device="neuron")
    dist.all_reduce(t)
    dist.barrier()  # uses the bound device, no warning about guessing it
    return {"bound": str(group.bound_device_id), "sum": t.cpu()}


def test_device_id_binds_the_rank_to_its_core(tmp_path):
    results = run_ranks(_init_with_device_id, 2, tmp_path, backend=None)
    assert [r["bound"] for r in results] == ["neuron:0", "neuron:1"]
    assert all(torch.equal(r["sum"], torch.full((3,), 2.0)) for r in results)


def _init_with_device_id(rank: int, world: int) -> dict:
    """Re-creates the default group with device_id (the launcher made one without it)."""
    store = dist.distributed_c10d._get_default_store()
    dist.barrier()  # every rank has connected before one of them tears the first group down
    dist.destroy_process_group()
    dist.init_process_group("neuron", store=dist.PrefixStore("device_id", store), rank=rank,
                            world_size=world, device_id=torch.device("neuron", rank))
    return with_device_id(rank, world)


def charged(rank: int, world: int) -> dict:
    import json

    import torchneuron
    from torchneuron.device import accounting

    t = torch.ones(1 << 20, device="neuron")  # 4 MiB
    before = accounting.stream_clock(rank)
    with accounting.recording() as events:
        est = torchneuron.estimate(lambda: dist.all_reduce(t), targets=("trn2",))
    after = accounting.stream_clock(rank)
    [event] = [e for e in events if e.kind == "collective"]
    [row] = [o for o in est.targets["trn2"].ops if o.op.startswith("collective: all_reduce")]
    trace = os.path.join(os.environ["DIST_SUPPORT_DIR"], f"trace{rank}.json")
    with torchneuron.profiler.profile() as prof:
        dist.all_reduce(t)
    prof.export_chrome_trace(trace)
    with open(trace) as f:
        traced = [e for e in json.load(f)["traceEvents"] if e.get("args", {}).get("kind") == "collective"]
    return {"advance": after - before, "seconds": event.seconds, "kind": event.name,
            "nbytes": event.bytes, "device": event.device, "link": event.engine,
            "estimated": row.seconds, "row": row.op, "row_bytes": row.nbytes, "row_busbw": row.busbw,
            "table": str(est), "traced": [(e["name"], e["args"].get("bytes"), e["args"].get("engine"))
                                          for e in traced]}


def test_collectives_charge_modelled_time_on_the_rank_stream(tmp_path):
    from torchneuron.hardware.collectives import GroupPlacement, collective_cost, link_for
    from torchneuron.hardware import resolve_topology

    results = run_ranks(charged, 2, tmp_path)
    topology = resolve_topology()  # the default trn2.3xlarge: both ranks on one chip
    placement = GroupPlacement.of([(0, 0), (0, 0)])
    link = link_for(topology.chip, placement, topology.devices[0].dma_bytes_per_second)
    expected = collective_cost("all_reduce", 4 << 20, 2, link, placement=placement)
    assert expected.algorithm == "rdh"  # 1-56 MB (the runtime's intra-node deep dive)
    busbw = (4 << 20) / expected.seconds * 2 * (2 - 1) / 2  # nccom-test's all-reduce busbw
    engine = f"on-chip DMA, busbw {busbw / 1e9:.1f} GB/s"
    for rank, r in enumerate(results):
        # the event and the estimate row name the collective, its algorithm and group size
        assert r["kind"] == "all_reduce (rdh, 2 ranks)" and r["nbytes"] == 4 << 20 and r["device"] == rank
        assert r["link"] == engine  # the link and the bus bandwidth
        assert r["seconds"] == pytest.approx(expected.seconds)
        assert r["advance"] == pytest.approx(expected.seconds)
        assert r["estimated"] == pytest.approx(expected.seconds)  # estimate reads the same record
        assert r["row"] == "collective: all_reduce (rdh, 2 ranks)" and r["row_bytes"] == 4 << 20
        assert r["row_busbw"] == pytest.approx(busbw)
        assert "collectives on trn2" in r["table"] and f"{busbw / 1e9:.1f} GB/s" in r["table"]
        # the profiler's trace: the collectives row, with bytes, algorithm and bus bandwidth
        assert r["traced"] == [("all_reduce (rdh, 2 ranks)", 4 << 20, engine)]


def bad_inputs(rank: int, world: int) -> dict:
    errors = {}
    try:
        dist.all_reduce(torch.ones(2, device="neuron:0") if rank else torch.ones(2, device="neuron:1"))
        dist.all_gather([torch.empty(2), torch.empty(2)], torch.ones(2, device="neuron"))
    except ValueError as e:
        errors["mixed"] = str(e)
    t = torch.ones(3, device="neuron")
    dist.all_reduce(t)  # the group still works after the errors
    errors["after"] = t.cpu()
    return errors


def test_bad_inputs_raise_and_leave_the_group_usable(tmp_path):
    for r in run_ranks(bad_inputs, 2, tmp_path):
        assert "the neuron backend carries neuron tensors, got a tensor on cpu" in r["mixed"]
        assert torch.equal(r["after"], torch.full((3,), 2.0))
