"""gloo's worker threads never free the host views of neuron tensors.

A view freed on a gloo thread takes the GIL there; if the rank's interpreter is
finalizing at that moment, Python ends the thread inside a ``noexcept`` destructor and
the rank aborts ("terminate called without an active exception"). The views must be
freed by a thread that runs Python (the next collective call), never by gloo.
"""

from __future__ import annotations

import threading
import weakref

import torch
import torch.distributed as dist
from dist_support import run_ranks

MAX_ROUNDS = 1000  # collectives to wait for the views to be freed (each round is one all_reduce)


def views_freed_off_gloo(rank: int, world: int) -> dict:
    """Rank 0 drops the Work of an all_reduce before it can finish, so gloo holds it last."""
    from torchneuron.distributed import kernels

    main = threading.get_ident()
    freed_on: list[int] = []
    made: list[weakref.ref] = []
    original = kernels.cpu_view_borrowed

    def tracked(tensor: torch.Tensor) -> torch.Tensor:
        view = original(tensor)
        weakref.finalize(view, lambda: freed_on.append(threading.get_ident()))
        made.append(weakref.ref(view))
        return view

    kernels.cpu_view_borrowed = tracked
    try:
        store = dist.distributed_c10d._get_default_store()
        x = torch.full((1024,), float(rank + 1), device="neuron")
        if rank == 0:
            work = dist.all_reduce(x, async_op=True)
            del work  # only gloo's thread holds the Work now: rank 1 has not started
            store.set("dropped", "1")
        else:
            store.wait(["dropped"])
            dist.all_reduce(x)
        first = list(made)
        rounds = 0
        for rounds in range(1, MAX_ROUNDS + 1):  # both ranks stop together: the flag is reduced
            pending = torch.tensor([float(any(ref() is not None for ref in first))], device="neuron")
            dist.all_reduce(pending)
            if pending.item() == 0:
                break
        return {"result": x.cpu(), "freed": len(first) - sum(ref() is not None for ref in first),
                "made": len(first), "off_main": sum(ident != main for ident in freed_on),
                "rounds": rounds}
    finally:
        kernels.cpu_view_borrowed = original


def test_host_views_are_freed_by_the_calling_thread_not_gloo(tmp_path):
    for rank, out in enumerate(run_ranks(views_freed_off_gloo, 2, tmp_path, finalize=True)):
        torch.testing.assert_close(out["result"], torch.full((1024,), 3.0), rtol=0, atol=0)
        assert out["made"] >= 1 and out["freed"] == out["made"], (rank, out)
        assert out["off_main"] == 0, f"rank {rank}: {out['off_main']} host views freed on a gloo thread"


def test_release_finished_keeps_views_another_owner_holds():
    from torchneuron.distributed import host_views

    view = torch.zeros(4)
    host_views.hold(view)  # before the view is handed on, as the kernels do
    other_owner = torch._C.ScriptList([view])  # a C++ owner, as gloo's Work is
    alive = weakref.ref(view)
    del view
    host_views.release_finished()
    assert alive() is not None  # still owned elsewhere: kept, so that owner never frees it
    del other_owner
    host_views.release_finished()
    assert alive() is None  # only host_views held it: freed here, on this thread
