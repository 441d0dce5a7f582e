"""The per-call path of a neuron collective does each piece of bookkeeping once, cheaply.

The hot collectives (all_reduce, all_gather_into_tensor, reduce_scatter_tensor: what DDP
and FSDP2 call) go to the gloo transport's own methods, not back through ``torch.ops.c10d``
from Python; a repeated collective reuses its modelled cost; every held host view shares
one C++ list. What is kept: results, one accounting record per collective, one
flight-recorder entry, the mismatch/failure explanations (their own tests).
"""

from __future__ import annotations

import weakref

import torch
import torch.distributed as dist
from dist_support import run_ranks

CALLS = 5


def hot_collectives_without_torch_ops(rank: int, world: int) -> dict:
    from torchneuron.device import accounting
    from torchneuron.distributed import charging, flight_recorder, kernels

    nested = []
    original_op, original_model = kernels._op, charging.modelled_cost
    modelled = []
    kernels._op = lambda name: nested.append(name) or original_op(name)
    charging.modelled_cost = lambda *a, **k: modelled.append(a[:2]) or original_model(*a, **k)
    try:
        flight_recorder.clear()
        before = {w.name: w.calls for w in accounting.work_totals(accounting.WorkKind.COLLECTIVE)}
        x = torch.full((8,), float(rank + 1), device="neuron")
        gathered = torch.empty(8 * world, device="neuron")
        scattered = torch.empty(8, device="neuron")
        for _ in range(CALLS):
            dist.all_reduce(x)
            dist.all_gather_into_tensor(gathered, x)
            dist.reduce_scatter_tensor(scattered, gathered, op=dist.ReduceOp.MAX)
        dist.all_reduce(x, op=dist.ReduceOp.MIN, async_op=True).wait()
        after = {w.name: w.calls for w in accounting.work_totals(accounting.WorkKind.COLLECTIVE)}
        return {"x": x.cpu(), "gathered": gathered.cpu(), "scattered": scattered.cpu(), "nested": nested,
                "modelled": modelled, "entries": len(flight_recorder.entries()),
                "recorded": {k.partition(" ")[0]: after[k] - before.get(k, 0) for k in after}}
    finally:
        kernels._op, charging.modelled_cost = original_op, original_model


def test_hot_collectives_call_gloo_directly_and_model_each_shape_once(tmp_path):
    results = run_ranks(hot_collectives_without_torch_ops, 2, tmp_path)
    # The oracle: 1 + 2 = 3 at the first all_reduce, doubled at each later one; the gather and
    # the MAX reduce-scatter then hold that value everywhere; the final MIN changes nothing.
    value = 3.0 * 2 ** (CALLS - 1)
    gathered = torch.full((16,), value)
    for rank, out in enumerate(results):
        assert out["nested"] == [], f"rank {rank}: went back through torch.ops.c10d for {out['nested']}"
        # modelled once per (kind, size): all_reduce of 32 bytes, all_gather, reduce_scatter
        assert sorted(kind for kind, _ in out["modelled"]) == ["all_gather", "all_reduce", "reduce_scatter"]
        assert out["recorded"] == {"all_reduce": CALLS + 1, "all_gather": CALLS, "reduce_scatter": CALLS}
        assert out["entries"] == 3 * CALLS + 1
        torch.testing.assert_close(out["x"], torch.full((8,), value), rtol=0, atol=0)
        torch.testing.assert_close(out["gathered"], gathered, rtol=0, atol=0)
        torch.testing.assert_close(out["scattered"], torch.full((8,), value), rtol=0, atol=0)


def test_held_views_share_one_cxx_list(monkeypatch):
    from torchneuron.distributed import host_views

    made = []
    original = host_views._cxx_list
    monkeypatch.setattr(host_views, "_cxx_list", lambda first: made.append(1) or original(first))
    monkeypatch.setattr(host_views, "_references", None)
    monkeypatch.setattr(host_views, "_held", [])
    views = [torch.zeros(4) for _ in range(3)]
    alive = [weakref.ref(v) for v in views]
    host_views.hold(views[0])
    host_views.hold(*views[1:])
    assert len(made) == 1  # one list for the process; later views are appended (~0.3 us)
    other_owner = torch._C.ScriptList([views[1]])  # a C++ owner, as gloo's Work is
    del views
    assert host_views.release_finished() == 1  # the one still owned elsewhere stays held
    assert [a() is None for a in alive] == [True, False, True]
    del other_owner
    assert host_views.release_finished() == 0
    assert alive[1]() is None
