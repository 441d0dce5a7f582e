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


def settings_reads_and_changes(rank: int, world: int) -> dict:
    """How often a collective reads a setting through ``os.environ``'s mapping methods, and the
    modelled time of the same all_reduce as the settings change between calls."""
    import os
    from unittest import mock

    from torchneuron import config
    from torchneuron.distributed import flight_recorder

    environ_type = type(os.environ)
    original = environ_type.__getitem__
    declared = []

    def counting(self, key):
        if key in config.ENV_VARS:
            declared.append(key)
        return original(self, key)

    x = torch.ones(256, device="neuron")
    dist.all_reduce(x)  # first-use paths
    environ_type.__getitem__ = counting
    try:
        for _ in range(CALLS):
            dist.all_reduce(x)
    finally:
        environ_type.__getitem__ = original

    def modelled() -> float:
        dist.all_reduce(x)
        return flight_recorder.entries()[-1].modeled_seconds

    with mock.patch.dict(os.environ):  # restored on the way out
        one_chip = modelled()  # LOCAL_WORLD_SIZE=world: both ranks on one chip of a trn2.3xlarge
        os.environ.update(TORCHNEURON_INSTANCE="trn2.48xlarge", LOCAL_WORLD_SIZE="1")
        across_instances = modelled()  # one rank per instance: EFA
        with config.override(LOCAL_WORLD_SIZE=str(world)):
            overridden = modelled()  # both on one chip again, of a trn2.48xlarge
        after_override = modelled()
    return {"declared_reads": declared, "one_chip": one_chip, "across_instances": across_instances,
            "overridden": overridden, "after_override": after_override, "restored": modelled()}


def test_collectives_read_settings_cheaply_and_see_every_change(tmp_path):
    """Settings are read per call without ``os.environ.get`` (an unset name raised and caught a
    KeyError inside ``Mapping.get``, six times per collective), and a change to ``os.environ``
    or a ``config.override`` made between calls still reaches the next call's modelled time."""
    for rank, out in enumerate(run_ranks(settings_reads_and_changes, 2, tmp_path)):
        assert out["declared_reads"] == [], f"rank {rank}: read through os.environ's mapping methods"
        assert out["across_instances"] > out["one_chip"] * 5, out  # EFA's ~15 us hops vs on-chip DMA
        assert out["overridden"] == out["one_chip"], out
        assert out["after_override"] == out["across_instances"], out
        assert out["restored"] == out["one_chip"], out
