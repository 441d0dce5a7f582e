"""The collective forms PyTorch documents and NCCL runs, which gloo lacks, run on neuron.

``all_gather_into_tensor`` into the stacked output ``[world, *input.shape]``,
``reduce_scatter_tensor`` from a stacked input, their coalesced and async variants and
the functional collectives' out= form, ``all_gather`` into uneven outputs and ``all_to_all``
of uneven tensors. The oracle: each rank's input is a known function of its rank, so every
rank computes the expected result itself with CPU ops (``torch.stack``, sums). Each form is
recorded once, as the same collective in gloo's form is (kind, bytes), and adds no device op.
What cannot run is refused as the neuron backend's, naming the shapes (never gloo's words).
"""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.distributed as dist
from dist_support import run_ranks

WORLD = 2


def x_of(r: int, shape=(2, 3)) -> torch.Tensor:
    """Rank ``r``'s input."""
    return (torch.arange(6, dtype=torch.float32).reshape(2, 3) + 10 * r + 1).reshape(shape)


def recorded(fn) -> tuple[object, dict, int]:
    """``fn()``'s result, the collectives it recorded ({name: (calls, bytes)}) and the device ops it charged."""
    from torchneuron.device import accounting

    with accounting.pinned_cost_cache():
        before = accounting.snapshot()
        result = fn()
        torch.neuron.synchronize()
        added = accounting.snapshot().since(before)
    work = {w.name: (w.calls, w.bytes) for (kind, _), w in added.work.items() if kind == "collective"}
    return result, work, sum(calls for _, calls, _ in added.cost_entries.values())


def forms(rank: int, world: int) -> dict:
    import torch.distributed._functional_collectives as funcol

    warnings.simplefilter("ignore")
    d = "neuron"
    x = x_of(rank).to(d)
    out: dict = {}

    def keep(name, make, run):
        tensors = make()  # allocated before the record is read
        result, work, ops = recorded(lambda: run(*tensors))
        out[name] = {"value": [t.cpu() for t in (result if isinstance(result, list) else [result])],
                     "work": work, "ops": ops}

    def gather(o, i, **kw):
        w = dist.all_gather_into_tensor(o, i, **kw)
        if w is not None:
            w.wait()
        return o

    keep("ag_concat", lambda: (torch.empty(world * 2, 3, device=d),), lambda o: gather(o, x))
    keep("ag_stacked", lambda: (torch.empty(world, 2, 3, device=d),), lambda o: gather(o, x))
    keep("ag_stacked_async", lambda: (torch.empty(world, 2, 3, device=d),), lambda o: gather(o, x, async_op=True))
    keep("ag_flat", lambda: (torch.empty(world * 6, device=d),), lambda o: gather(o, x))
    keep("ag_scalar", lambda: (torch.empty(world, device=d), x[0, 0].clone()), lambda o, s: gather(o, s))

    def scatter(o, i, **kw):
        w = dist.reduce_scatter_tensor(o, i, **kw)
        if w is not None:
            w.wait()
        return o

    # every rank's input: rank r passes world copies of x_of(r) scaled by 1..world
    def stacked_input():
        return torch.stack([x * (j + 1) for j in range(world)])

    keep("rs_concat", lambda: (torch.empty(2, 3, device=d), stacked_input().reshape(world * 2, 3)),
         lambda o, i: scatter(o, i))
    keep("rs_stacked", lambda: (torch.empty(2, 3, device=d), stacked_input()), lambda o, i: scatter(o, i))
    keep("rs_stacked_async", lambda: (torch.empty(2, 3, device=d), stacked_input()),
         lambda o, i: scatter(o, i, async_op=True))
    keep("rs_stacked_max", lambda: (torch.empty(2, 3, device=d), stacked_input()),
         lambda o, i: scatter(o, i, op=dist.ReduceOp.MAX))

    def coalesced_gather(a, b):
        with dist._coalescing_manager(async_ops=True) as cm:
            dist.all_gather_into_tensor(a, x)
            dist.all_gather_into_tensor(b, x.reshape(-1))
        cm.wait()
        return [a, b]

    keep("ag_coalesced_stacked", lambda: (torch.empty(world, 2, 3, device=d), torch.empty(world, 6, device=d)),
         coalesced_gather)

    def coalesced_scatter(a, b, i, j):
        with dist._coalescing_manager(async_ops=True) as cm:
            dist.reduce_scatter_tensor(a, i)
            dist.reduce_scatter_tensor(b, j)
        cm.wait()
        return [a, b]

    keep("rs_coalesced_stacked", lambda: (torch.empty(2, 3, device=d), torch.empty(6, device=d), stacked_input(),
                                          stacked_input().reshape(world, 6)), coalesced_scatter)

    group_name = dist.group.WORLD.group_name

    def funcol_out(o):
        torch.ops._c10d_functional.wait_tensor(
            torch.ops._c10d_functional.all_gather_into_tensor_out(x, world, group_name, out=o))
        return o

    keep("funcol_ag_out_stacked", lambda: (torch.empty(world, 2, 3, device=d),), funcol_out)
    keep("funcol_rs_stacked", lambda: (stacked_input(),),
         lambda i: funcol.wait_tensor(funcol.reduce_scatter_tensor(i, "sum", 0, dist.group.WORLD)))

    # uneven all_gather: rank r passes r + 1 elements of value (r + 1) ** 2
    def uneven_gather(mine, *outs):
        dist.all_gather(list(outs), mine)
        return list(outs)

    keep("ag_uneven", lambda: (torch.full((rank + 1,), float((rank + 1) ** 2), device=d),
                               *(torch.empty(r + 1, device=d) for r in range(world))), uneven_gather)

    # uneven all_to_all: rank s sends s + j + 1 elements of value 10 * s + j to rank j
    def uneven_all_to_all(*tensors):
        outs, sends = list(tensors[:world]), list(tensors[world:])
        dist.all_to_all(outs, sends)
        return outs

    keep("a2a_uneven", lambda: (*(torch.empty(s + rank + 1, device=d) for s in range(world)),
                                *(torch.full((rank + j + 1,), float(10 * rank + j), device=d) for j in range(world))),
         uneven_all_to_all)
    return out


def _expected(world: int, rank: int) -> dict:
    xs = [x_of(r) for r in range(world)]
    stacked = torch.stack(xs)
    scattered = sum(xs[r] * (rank + 1) for r in range(world))  # rank's slot j = rank, scaled by rank + 1
    return {
        "ag_concat": [stacked.reshape(world * 2, 3)],
        "ag_stacked": [stacked],
        "ag_stacked_async": [stacked],
        "ag_flat": [stacked.reshape(-1)],
        "ag_scalar": [stacked[:, 0, 0]],
        "rs_concat": [scattered],
        "rs_stacked": [scattered],
        "rs_stacked_async": [scattered],
        "rs_stacked_max": [torch.stack([x * (rank + 1) for x in xs]).amax(0)],
        "ag_coalesced_stacked": [stacked, stacked.reshape(world, 6)],
        "rs_coalesced_stacked": [scattered, scattered.reshape(-1)],
        "funcol_ag_out_stacked": [stacked],
        "funcol_rs_stacked": [scattered[None]],
        "ag_uneven": [torch.full((r + 1,), float((r + 1) ** 2)) for r in range(world)],
        "a2a_uneven": [torch.full((s + rank + 1,), float(10 * s + rank)) for s in range(world)],
    }


def test_documented_forms_run_once_each_with_the_oracles_results(tmp_path):
    results = run_ranks(forms, WORLD, tmp_path)
    for rank, got in enumerate(results):
        for name, want in _expected(WORLD, rank).items():
            for g, w in zip(got[name]["value"], want, strict=True):
                torch.testing.assert_close(g, w, rtol=0, atol=0, msg=f"rank {rank} {name}")
        for name, entry in got.items():
            assert entry["ops"] == 0, f"rank {rank} {name}: charged {entry['ops']} device ops"
            # one record per call (a coalesced block is one call to the backend)
            assert sum(calls for calls, _ in entry["work"].values()) == 1, f"rank {rank} {name}: {entry['work']}"
        # a stacked form is recorded as its concatenated form is: the same kind and bytes
        assert got["ag_stacked"]["work"] == got["ag_concat"]["work"] == got["ag_stacked_async"]["work"]
        assert got["rs_stacked"]["work"] == got["rs_concat"]["work"] == got["rs_stacked_async"]["work"]
        [name] = got["ag_uneven"]["work"]
        assert name.startswith("all_gather ") and got["ag_uneven"]["work"][name][1] == 3 * 4  # 1 + 2 floats
        [name] = got["a2a_uneven"]["work"]
        assert name.startswith("all_to_all ")


def refusals(rank: int, world: int) -> dict:
    import torch.distributed._functional_collectives as funcol

    warnings.simplefilter("ignore")
    d = "neuron"
    x = torch.ones(2, 3, device=d)
    cases = {
        "ag_numel": lambda: dist.all_gather_into_tensor(torch.empty(world, 5, device=d), x),
        "ag_dtype": lambda: dist.all_gather_into_tensor(torch.empty(world, 2, 3, dtype=torch.float64, device=d), x),
        "ag_strided": lambda: dist.all_gather_into_tensor(torch.empty(2, 3, world, device=d).transpose(0, 2), x.t()),
        "rs_numel": lambda: dist.reduce_scatter_tensor(torch.empty(2, 3, device=d), torch.ones(world, 7, device=d)),
        "ag_list_length": lambda: dist.all_gather([torch.empty(1, device=d)] * (world + 1), torch.ones(1, device=d)),
        "ag_uneven_own": lambda: dist.all_gather([torch.empty(2 + r, device=d) for r in range(world)],
                                                 torch.ones(9, device=d)),
        "funcol_mixed_dtypes": lambda: funcol.all_reduce_coalesced(
            [torch.ones(2, device=d), torch.ones(2, dtype=torch.float64, device=d)], "sum", dist.group.WORLD),
    }
    out = {}
    for name, fn in cases.items():
        try:
            fn()
            out[name] = None
        except Exception as e:  # noqa: BLE001 - the test inspects what was raised
            out[name] = (type(e).__name__, str(e))
    t = torch.full((2,), float(rank + 1), device=d)
    dist.all_reduce(t)  # the group still works
    out["after"] = t.cpu()
    return out


def test_forms_it_cannot_run_are_refused_as_the_neuron_backends(tmp_path):
    results = run_ranks(refusals, WORLD, tmp_path)
    expected = {
        "ag_numel": ("ValueError", ["[2, 5]", "[2, 3]", "[4, 3]", "[2, 2, 3]"]),
        "ag_dtype": ("TypeError", ["torch.float64", "torch.float32"]),
        "ag_strided": ("ValueError", ["contiguous", "[2, 3, 2]", "[3, 2]"]),
        "rs_numel": ("ValueError", ["[2, 7]", "[2, 3]", "[4, 3]"]),
        "ag_list_length": ("ValueError", ["one output tensor per rank (2), got 3"]),
        "ag_uneven_own": ("ValueError", ["[9]"]),
        "funcol_mixed_dtypes": ("TypeError", ["torch.float32", "torch.float64"]),
    }
    for rank, got in enumerate(results):
        for name, (kind, words) in expected.items():
            assert got[name] is not None, f"rank {rank} {name}: ran"
            error_type, message = got[name]
            assert error_type == kind, (name, got[name])
            assert "neuron backend" in message and "Gloo" not in message, (name, message)
            for word in words:
                assert word in message, (name, word, message)
        torch.testing.assert_close(got["after"], torch.full((2,), 3.0))


@pytest.mark.parametrize("world", [3])
def test_uneven_and_stacked_forms_on_three_ranks(tmp_path, world):
    results = run_ranks(forms, world, tmp_path)
    for rank, got in enumerate(results):
        for name, want in _expected(world, rank).items():
            for g, w in zip(got[name]["value"], want, strict=True):
                torch.testing.assert_close(g, w, rtol=0, atol=0, msg=f"rank {rank} {name}")
