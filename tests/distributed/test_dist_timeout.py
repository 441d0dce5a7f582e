"""A rank that never joins a collective: the others raise, within the group's timeout, an
error naming the collective, its sequence number and the missing rank (no hang)."""

from __future__ import annotations

import datetime
import pathlib
import time

import torch
import torch.distributed as dist
from dist_support import run_ranks

TIMEOUT = datetime.timedelta(seconds=4)


def rank_1_skips_all_reduce(rank: int, world: int, flag: str) -> dict:
    t = torch.ones(4, device="neuron")
    dist.all_reduce(t)  # collective #1: every rank
    done = pathlib.Path(flag)
    if rank == 1:  # never calls collective #2; waits until rank 0 has its error, then leaves
        deadline = time.monotonic() + 120
        while not done.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        return {"error": None}
    try:
        dist.all_reduce(t)
        error = None
    except Exception as e:  # noqa: BLE001 - the test inspects what was raised
        error = {"type": type(e).__name__, "message": str(e),
                 "is_dist_backend_error": isinstance(e, dist.DistBackendError)}
    done.touch()
    return {"error": error, "tensor": t.cpu()}


def test_missing_rank_is_named_within_the_timeout(tmp_path):
    flag = str(tmp_path / "rank0-failed")
    first, _ = run_ranks(rank_1_skips_all_reduce, 2, tmp_path, flag, timeout=TIMEOUT)
    error = first["error"]
    assert error is not None and error["is_dist_backend_error"], error
    message = error["message"]
    assert "all_reduce (collective #2 on process group" in message, message
    assert "timeout of 4 s" in message, message
    assert "ranks that never reached it: rank 1 (last at #1 all_reduce)" in message, message
    assert torch.equal(first["tensor"], torch.full((4,), 2.0))  # collective #1's result, intact
