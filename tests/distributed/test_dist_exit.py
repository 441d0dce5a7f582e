"""A rank exits cleanly while what is chained to its last collective's future still runs.

The future of an asynchronous neuron collective is completed on gloo's thread, which runs
every callback chained to it there (DDP's reducer, a program's ``then``); the waiting
thread wakes before those return. A rank that exited then aborted at finalization
("terminate called without an active exception", SIGABRT) when gloo's thread took the GIL
back; DDP's ranks did so now and then. Exit now waits for those callbacks.

The ranks here are spawned interpreters that end as a program does, without
``destroy_process_group`` (which joins gloo's threads first) and with finalization.
"""

from __future__ import annotations

import datetime
import os
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from dist_support import join_within

CALLBACK_SECONDS = 0.5  # long enough that the rank reaches exit while the callback runs


def exit_while_a_chained_callback_runs(rank: int, world: int, tmp: str) -> None:
    from torchneuron.distributed import work as work_handles

    os.environ.update(LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world))
    dist.init_process_group("neuron", init_method=f"file://{tmp}/store", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=60))
    store = dist.distributed_c10d._get_default_store()
    x = torch.full((8,), float(rank + 1), device="neuron")
    if rank == 1:  # joins only once rank 0's chain is attached: rank 0's completes on gloo's thread
        store.wait(["attached"])
    future = dist.all_reduce(x, async_op=True).get_future()
    chained = future.then(lambda done: time.sleep(CALLBACK_SECONDS) or done.value())
    if rank == 0:
        store.set("attached", "1")
    future.wait()
    torch.save({"result": x.cpu(), "running_after_wait": work_handles.callbacks_running(),
                "chained_done_before_exit": chained.done()}, os.path.join(tmp, f"rank{rank}.pt"))
    # Returns without destroy_process_group: the interpreter exits and finalizes now.


def test_rank_exits_cleanly_while_a_chained_callback_runs(tmp_path, capfd):
    context = mp.start_processes(exit_while_a_chained_callback_runs, args=(2, str(tmp_path)), nprocs=2,
                                 join=False, start_method="spawn")
    join_within(context, "the ranks", seconds=120)  # raises if a rank died by a signal (SIGABRT at exit)
    # Nothing of torchneuron's complained while the ranks finalized (e.g. a __del__ that
    # needed a module finalization had already cleared).
    assert "Exception ignored" not in capfd.readouterr().err
    outs = [torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in range(2)]
    for out in outs:
        torch.testing.assert_close(out["result"], torch.full((8,), 3.0), rtol=0, atol=0)
    # Rank 0 reached exit with the callback still running on gloo's thread: the race.
    # (Rank 1's collective may complete as it is issued, running its chain on its own thread.)
    assert outs[0]["running_after_wait"] == 1 and not outs[0]["chained_done_before_exit"], outs[0]


def test_wait_for_callbacks_returns_when_none_runs_or_at_its_timeout(monkeypatch):
    from torchneuron.distributed import work as work_handles

    assert work_handles.wait_for_callbacks(0.0)
    monkeypatch.setattr(work_handles, "_callbacks_running", 1)  # one that never ends
    started = time.monotonic()
    assert not work_handles.wait_for_callbacks(0.05)
    assert time.monotonic() - started < 5  # bounded: exit never hangs on a stuck callback
