"""Asynchronous collectives and send/recv that fail: ``wait()`` raises DistBackendError naming
the collective (or the peer), its number and the missing ranks, within the group's timeout."""

from __future__ import annotations

import datetime
import pathlib
import time

import torch
import torch.distributed as dist
from dist_support import run_ranks, save_result_and_exit

TIMEOUT = datetime.timedelta(seconds=4)


def _error(fn) -> dict | None:
    try:
        fn()
    except Exception as e:  # noqa: BLE001 - the test inspects what was raised
        return {"type": type(e).__name__, "message": str(e),
                "is_dist_backend_error": isinstance(e, dist.DistBackendError)}
    return None


def _wait_for(flag: pathlib.Path) -> None:
    deadline = time.monotonic() + 120
    while not flag.exists() and time.monotonic() < deadline:
        time.sleep(0.1)


def rank_1_skips_async_all_reduce(rank: int, world: int, flag: str) -> dict:
    t = torch.ones(4, device="neuron")
    dist.all_reduce(t)  # collective #1: every rank
    if rank == 1:  # never calls #2; leaves once rank 0 has its error
        _wait_for(pathlib.Path(flag))
        return {}
    work = dist.all_reduce(t, async_op=True)
    first = _error(work.wait)
    again = _error(work.wait)  # the same error again, as NCCL's work does
    pathlib.Path(flag).touch()
    return {"first": first, "again": again, "completed": work.is_completed(), "tensor": t.cpu()}


def test_async_wait_names_the_missing_rank(tmp_path):
    flag = str(tmp_path / "rank0-failed")
    result, _ = run_ranks(rank_1_skips_async_all_reduce, 2, tmp_path, flag, timeout=TIMEOUT)
    first = result["first"]
    assert first is not None and first["is_dist_backend_error"], first
    message = first["message"]
    assert "all_reduce (collective #2 on process group" in message, message
    assert "ranks that never reached it: rank 1 (last at #1 all_reduce)" in message, message
    assert "timeout of 4 s" in message, message
    assert result["again"] == first
    assert result["completed"] is True
    assert torch.equal(result["tensor"], torch.full((4,), 2.0))  # #1's result, intact


def rank_1_dies(rank: int, world: int) -> dict:
    t = torch.ones(4, device="neuron")
    dist.all_reduce(t)  # collective #1
    if rank == 1:
        save_result_and_exit(rank, {})  # dies: no teardown, its sockets close
    time.sleep(0.5)  # rank 1 is gone before rank 0 starts #2
    out = [torch.empty(4, device="neuron") for _ in range(world)]
    work = dist.all_gather(out, t, async_op=True)
    return {"error": _error(work.wait)}


def test_async_wait_names_a_dead_rank(tmp_path):
    result, _ = run_ranks(rank_1_dies, 2, tmp_path, timeout=TIMEOUT)
    error = result["error"]
    assert error is not None and error["is_dist_backend_error"], error
    assert "all_gather (collective #2 on process group" in error["message"], error
    assert "rank 1 (last at #1 all_reduce)" in error["message"], error


def mismatched_recv(rank: int, world: int) -> dict:
    if rank == 0:
        dist.send(torch.arange(6.0, device="neuron").reshape(2, 3), 1)  # same bytes as rank 1's (6,)
        dist.send(torch.ones(4, device="neuron"), 1)  # send #2 ...
        return {}
    first = _error(lambda: dist.recv(torch.empty(6, device="neuron"), 0))
    second = torch.empty(4, device="neuron")
    dist.recv(second, 0)  # ... matches recv #2: the pair is still usable
    third = _error(lambda: dist.irecv(torch.empty(4, device="neuron"), 0).wait())  # never sent
    return {"first": first, "second": second.cpu(), "third": third}


def test_send_recv_are_numbered_per_pair(tmp_path):
    _, result = run_ranks(mismatched_recv, 2, tmp_path, timeout=TIMEOUT)
    first = result["first"]
    assert first is not None and first["is_dist_backend_error"], first
    assert first["message"].startswith("recv #1 from rank 0 (tag 0, [6] float32;"), first
    assert "rank 0's send #1, which carries [2, 3] float32" in first["message"], first
    assert torch.equal(result["second"], torch.ones(4))
    third = result["third"]
    assert third is not None and third["is_dist_backend_error"], third
    assert third["message"].startswith("recv #3 from rank 0 (tag 0, [4] float32;"), third
    assert "timeout of 4 s" in third["message"], third
    assert "rank 0 has posted only 2 sends to this rank with tag 0 (last: send #2, [4] float32)" \
        in third["message"], third


def handles_let_go(rank: int, world: int) -> dict:
    from torchneuron.distributed import work as work_handles

    group_name = dist.group.WORLD.group_name
    t = torch.full((4,), float(rank + 1), device="neuron")
    out = torch.ops._c10d_functional.all_reduce(t, "sum", group_name)  # its work: held by C++ only
    dist.all_reduce(torch.ones(1, device="neuron"), async_op=True)  # dropped, never waited
    for _ in range(3):  # later calls let go of the finished handles' gloo work ...
        dist.all_reduce(torch.ones(1, device="neuron"))
    torch.ops._c10d_functional.wait_tensor(out)  # ... and C++ can still wait on them
    return {"out": out.cpu(), "kept": work_handles.live_count()}


def test_unwaited_handles_still_answer_cpp_waits(tmp_path):
    for result in run_ranks(handles_let_go, 2, tmp_path):
        assert torch.equal(result["out"], torch.full((4,), 3.0))
        assert result["kept"] <= 2  # parked, without their gloo work


def recv_after_the_peer_left(rank: int, world: int) -> dict:
    if rank == 0:
        dist.send(torch.ones(4, device="neuron"), 1)
        save_result_and_exit(rank, {})  # its sockets close
    dist.recv(torch.empty(4, device="neuron"), 0)
    time.sleep(1.0)  # gloo sees the closed connection: the next receive fails as it is posted
    return {"sync": _error(lambda: dist.recv(torch.empty(4, device="neuron"), 0)),
            "async": _error(lambda: dist.irecv(torch.empty(4, device="neuron"), 0).wait())}


def test_a_receive_posted_after_the_peer_left_is_explained(tmp_path):
    """gloo raises at once (not at wait) for a pair whose peer has gone: the same explained error."""
    _, result = run_ranks(recv_after_the_peer_left, 2, tmp_path, timeout=TIMEOUT)
    for case, number in (("sync", 2), ("async", 3)):
        error = result[case]
        assert error is not None and error["is_dist_backend_error"], error
        assert error["message"].startswith(f"recv #{number} from rank 0 (tag 0, [4] float32;"), error
        assert "rank 0 has posted only 1 sends to this rank" in error["message"], error


def future_of_a_collective_a_dead_rank_misses(rank: int, world: int) -> dict:
    t = torch.ones(4, device="neuron")
    dist.all_reduce(t)  # collective #1
    if rank == 1:
        save_result_and_exit(rank, {})
    time.sleep(0.5)
    work = dist.all_reduce(t, async_op=True)
    chained = work.get_future().then(lambda fut: fut.value())  # as DDP's comm hooks chain it
    return {"future": _error(work.get_future().wait), "wait": _error(work.wait),
            "chained": _error(chained.wait)}


def test_a_failing_future_raises_the_explained_error(tmp_path):
    result, _ = run_ranks(future_of_a_collective_a_dead_rank_misses, 2, tmp_path, timeout=TIMEOUT)
    future, wait = result["future"], result["wait"]
    assert future is not None and future["is_dist_backend_error"], future
    assert "all_reduce (collective #2 on process group" in future["message"], future
    assert "rank 1 (last at #1 all_reduce)" in future["message"], future
    assert wait == future  # one explanation, whichever asked first
    assert "rank 1 (last at #1 all_reduce)" in result["chained"]["message"], result["chained"]
