"""A rank exits cleanly while what is chained to its last collective's future still runs.

The future of an asynchronous neuron collective is completed on gloo's thread, which runs
every callback chained to it there (DDP's reducer, a program's ``then``); the waiting
thread wakes before those return. A rank that exits then used to abort at finalization
("terminate called without an active exception", SIGABRT) when gloo's thread took the GIL
back; DDP's ranks did so now and then. Exit now waits for those callbacks.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist
from dist_support import run_ranks

CALLBACK_SECONDS = 0.5  # long enough that the rank reaches exit while the callback runs

_kept: list = []  # holds the group past destroy_process_group, as a live DDP module does


def exits_while_a_chained_callback_runs(rank: int, world: int) -> dict:
    from torchneuron.distributed import work as work_handles

    _kept.append(dist.group.WORLD)  # so gloo's threads outlive destroy_process_group
    x = torch.full((8,), float(rank + 1), device="neuron")
    future = dist.all_reduce(x, async_op=True).get_future()
    chained = future.then(lambda done: time.sleep(CALLBACK_SECONDS) or done.value())
    future.wait()
    running_after_wait = work_handles.callbacks_running()
    return {"result": x.cpu(), "running_after_wait": running_after_wait,
            "chained_done_before_exit": chained.done()}


def test_rank_exits_cleanly_while_a_chained_callback_runs(tmp_path):
    # run_ranks fails the test if a rank dies by a signal at exit, after its result is saved.
    for rank, out in enumerate(run_ranks(exits_while_a_chained_callback_runs, 2, tmp_path)):
        torch.testing.assert_close(out["result"], torch.full((8,), 3.0), rtol=0, atol=0)
        # The rank did reach exit with the callback still running on gloo's thread: the race.
        assert out["running_after_wait"] == 1 and not out["chained_done_before_exit"], (rank, out)


def test_wait_for_callbacks_returns_when_none_runs_or_at_its_timeout(monkeypatch):
    from torchneuron.distributed import work as work_handles

    assert work_handles.wait_for_callbacks(0.0)
    monkeypatch.setattr(work_handles, "_callbacks_running", 1)  # one that never ends
    started = time.monotonic()
    assert not work_handles.wait_for_callbacks(0.05)
    assert time.monotonic() - started < 5  # bounded: exit never hangs on a stuck callback
