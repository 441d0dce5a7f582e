"""Collectives on their own modelled stream: an async collective overlaps the compute issued
after it until it is waited; a synchronous one adds to the issuing stream's time."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from dist_support import run_ranks


def timeline(rank: int, world: int) -> dict:
    from torchneuron.device import accounting

    def clock() -> float:
        return accounting.stream_clock(rank)

    x = torch.randn(512, 512, device="neuron")
    t = torch.ones(1 << 20, device="neuron")
    start = clock()
    x @ x
    compute = clock() - start
    with accounting.recording() as events:
        dist.all_reduce(t)
    [collective] = [e for e in events if e.kind == "collective"]

    start = clock()
    dist.all_reduce(t)
    x @ x
    serial = clock() - start

    start = clock()
    work = dist.all_reduce(t, async_op=True)
    x @ x
    before_wait = clock() - start
    work.wait()
    overlapped = clock() - start

    start = clock()
    future = dist.all_reduce(t, async_op=True).get_future()
    future.wait()
    after_future = clock() - start
    dist.barrier()  # the thread's next collective joins the one whose future was taken
    after_next_call = clock() - start
    return {"compute": compute, "collective": collective.seconds, "stream": collective.stream,
            "default_stream": torch.neuron.current_stream(rank).stream_id, "serial": serial,
            "before_wait": before_wait, "overlapped": overlapped, "after_future": after_future,
            "after_next_call": after_next_call}


def test_async_collective_overlaps_compute_until_waited(tmp_path):
    for r in run_ranks(timeline, 2, tmp_path):
        assert r["compute"] > 0 and r["collective"] > 0
        assert r["stream"] != r["default_stream"]  # the collective stream
        assert r["serial"] == pytest.approx(r["compute"] + r["collective"])
        assert r["before_wait"] == pytest.approx(r["compute"])  # not waited yet: compute only
        assert r["overlapped"] == pytest.approx(max(r["compute"], r["collective"]))
        assert r["after_future"] == 0.0  # a taken future joins later ...
        assert r["after_next_call"] >= r["collective"]  # ... at the thread's next collective
