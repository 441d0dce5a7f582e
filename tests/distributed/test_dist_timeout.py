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


def timeout_changed_after_init(rank: int, world: int, flag: str) -> dict:
    import warnings

    sub = dist.new_group(list(range(world)))  # a second neuron group, as torchtitan's mesh groups are
    assert sub is not dist.group.WORLD
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for group in (None, sub):  # torchtitan's set_pg_timeouts: every mesh group and the default one
            dist.distributed_c10d._set_pg_timeout(datetime.timedelta(seconds=3), group)
    backends = [g._get_backend(torch.device("neuron")) for g in (dist.group.WORLD, sub)]
    out = {"warnings": [str(w.message) for w in caught],
           "timeouts": [b.options._timeout.total_seconds() for b in backends]}
    result = rank_1_skips_all_reduce(rank, world, flag)  # rank 0 waits in gloo for a rank that never comes
    out.update(result)
    return out


def test_set_pg_timeout_after_init_applies_to_neuron_groups(tmp_path):
    # Made with 600 s, beyond run_ranks' deadline: rank 0's wait ends only if the new 3 s is in effect.
    flag = str(tmp_path / "rank0-failed")
    first, second = run_ranks(timeout_changed_after_init, 2, tmp_path, flag,
                              timeout=datetime.timedelta(seconds=600))
    for rank in (first, second):
        assert not any("only supported" in w for w in rank["warnings"]), rank["warnings"]
        assert rank["timeouts"] == [3.0, 3.0]
    error = first["error"]
    assert error is not None and error["is_dist_backend_error"], error
    assert "all_reduce (collective #2 on process group" in error["message"], error["message"]
    assert "timeout of 3 s" in error["message"], error["message"]
