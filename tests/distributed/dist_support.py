"""Runs a function on N local ranks (torch.multiprocessing spawn) and collects results.

Each rank calls ``fn(rank, world, *args)`` inside an initialised process group and
returns tensors / plain containers; they come back through ``torch.save`` files in
the test's tmp_path, loaded with ``weights_only=True`` (only what the ranks wrote).
The group is created with a bounded timeout, so a stuck collective fails the test
instead of hanging it.

Ranks start from a fork server that imported torch and torchneuron once (multiprocessing's
``forkserver`` with those modules preloaded): a spawned rank spent about 3 s importing them,
the larger part of most tests here. The server only imports (it runs no torch op, so no
thread pool exists when it forks), and each rank gets the test's environment as of the
call, as a spawned one would. A forked rank ends with ``os._exit``, without interpreter
finalization, where crashes at exit happen; ``run_ranks(..., finalize=True)`` spawns fresh
interpreters that finalize, for the tests of exit and of the paths that crashed there
(DDP's futures, gloo's threads freeing tensors).
"""

from __future__ import annotations

import datetime
import faulthandler
import multiprocessing
import os
import pathlib
import sys
import time
import warnings
from collections.abc import Callable
from typing import Any

import torch
import torch.multiprocessing as mp

TIMEOUT = datetime.timedelta(seconds=60)  # the group's: a stuck collective raises
DEADLINE_SECONDS = 300  # the whole run's, in case a rank hangs outside a collective


# What the fork server imports before it forks any rank.
PRELOADED = ["torch", "torch.distributed", "torchneuron"]


def _worker(rank: int, fn: Callable[..., Any], world: int, backend: str | None, tmp: str,
            env: dict[str, str], args: tuple, timeout: datetime.timedelta) -> None:
    import torch.distributed as dist

    warnings.simplefilter("ignore", FutureWarning)  # deprecation notes of the old collective names
    faulthandler.dump_traceback_later(DEADLINE_SECONDS - 30, exit=True)  # a hung rank shows where
    os.environ.clear()  # the fork server's environment is from when it started: the caller's now
    os.environ.update(env)  # the caller's environment and this child's own settings
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank),
                      LOCAL_WORLD_SIZE=str(world), DIST_SUPPORT_DIR=tmp)
    kwargs = {} if backend is None else {"backend": backend}
    dist.init_process_group(init_method=f"file://{tmp}/store", rank=rank, world_size=world,
                            timeout=timeout, **kwargs)
    try:
        result = fn(rank, world, *args)
        torch.save(result, os.path.join(tmp, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()
    if backend == "gloo":
        _exit_without_finalizing()


def _exit_without_finalizing() -> None:
    """Ends a plain-gloo reference rank without running interpreter finalization.

    Why: in torch 2.13.0 gloo's worker thread can drop the last C++ reference of a
    finished ``Work`` whose tensors have Python objects; freeing them takes the GIL, and
    if the interpreter is finalizing then, Python ends the thread inside a ``noexcept``
    destructor: "terminate called without an active exception" (SIGABRT; seen once in
    CI on the CPU baseline of the DTensor test). torchneuron's own ranks avoid it
    (``torchneuron/distributed/host_views.py``, tested in test_dist_host_views.py) and,
    under ``run_ranks(..., finalize=True)``, finalize normally, so a crash at exit on
    ``neuron`` fails its test.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def save_result_and_exit(rank: int, result: Any) -> None:
    """Ends this rank at once, as a crash would (no group teardown), leaving ``result``."""
    torch.save(result, os.path.join(os.environ["DIST_SUPPORT_DIR"], f"rank{rank}.pt"))
    os._exit(0)


def run_ranks(fn: Callable[..., Any], world: int, tmp_path: pathlib.Path, *args: Any,
              backend: str | None = "neuron", env: dict[str, str] | None = None,
              timeout: datetime.timedelta = TIMEOUT, finalize: bool = False) -> list[Any]:
    """``fn``'s result on each rank of a fresh ``world``-rank group (``backend=None``: the default).

    ``finalize``: each rank is a spawned interpreter that exits normally (finalization runs,
    so a crash at exit fails the test); otherwise ranks fork from the preloaded server."""
    tmp = tmp_path / f"{backend}-{world}-{len(list(tmp_path.iterdir()))}"
    tmp.mkdir()
    multiprocessing.set_forkserver_preload(PRELOADED)
    environment = {**os.environ, **(env or {})}
    context = mp.start_processes(_worker, args=(fn, world, backend, str(tmp), environment, args, timeout),
                                 nprocs=world, join=False, start_method="spawn" if finalize else "forkserver")
    join_within(context, f"{fn.__name__} on {world} ranks")
    return [torch.load(tmp / f"rank{r}.pt", weights_only=True) for r in range(world)]


def join_within(context: mp.ProcessContext, what: str, seconds: float = DEADLINE_SECONDS) -> None:
    """Waits for every process of ``context``; raises if one died (a signal, a nonzero exit)
    and kills them all if they are not done in ``seconds``: a test run never hangs."""
    deadline = time.monotonic() + seconds
    while not context.join(timeout=1):
        if time.monotonic() > deadline:
            for process in context.processes:
                process.kill()
            raise TimeoutError(f"{what} did not finish in {seconds} s")
