"""Ranks that call different collectives, or one collective with different shapes or dtypes, as
the same sequence number: the error names both sides (op, shapes, dtype, rank).

By default gloo finds out late (a timeout, or a closed connection) and the error then reads the
ranks' published records; with ``TORCH_DISTRIBUTED_DEBUG=DETAIL`` torch's check finds it before
any data moves, and the same explained ``DistBackendError`` is raised at once."""

from __future__ import annotations

import datetime

import pytest
import torch
import torch.distributed as dist
from dist_support import run_ranks

TIMEOUT = datetime.timedelta(seconds=3)


def outcome(call) -> dict:
    try:
        call()
        return {"error": None}
    except Exception as e:  # noqa: BLE001 - the test inspects what was raised
        return {"type": type(e).__name__, "message": str(e),
                "is_dist_backend_error": isinstance(e, dist.DistBackendError)}


def mismatched_calls(rank: int, world: int) -> dict:
    device = torch.device("neuron", rank)
    dist.set_debug_level(dist.DebugLevel.DETAIL)  # groups made now get torch's fingerprint check
    try:
        checked = dist.new_group(backend="neuron")
    finally:
        dist.set_debug_level(dist.DebugLevel.OFF)
    dtype = torch.float32 if rank == 0 else torch.int32
    found = {"dtype": outcome(lambda: dist.all_reduce(torch.ones(4, device=device, dtype=dtype), group=checked))}
    if rank == 0:
        found["op"] = outcome(lambda: dist.all_reduce(torch.ones(4, device=device), group=checked))
    else:
        found["op"] = outcome(lambda: dist.all_gather_into_tensor(
            torch.empty(4, device=device), torch.ones(2, device=device), group=checked))
    t = torch.ones(4, device=device)
    found["after"] = outcome(lambda: dist.all_reduce(t, group=checked))  # nothing moved: still in step
    found["after_value"] = t.cpu()
    # The default group has no check: gloo times out, then the records name both sides.
    t = torch.ones(4, device=device)
    found["unchecked"] = outcome(lambda: dist.all_reduce(t) if rank == 0 else dist.broadcast(t, 1))
    return found


def test_mismatched_collectives_name_both_sides(tmp_path):
    first, second = run_ranks(mismatched_calls, 2, tmp_path, timeout=TIMEOUT)
    for found in (first, second):
        for case in ("dtype", "op", "unchecked"):
            assert found[case].get("is_dist_backend_error"), found[case]
        assert found["after"] == {"error": None}
        assert torch.equal(found["after_value"], torch.full((4,), 2.0))
    dtype_0, dtype_1 = first["dtype"]["message"], second["dtype"]["message"]
    assert "all_reduce (collective #1 on process group" in dtype_0, dtype_0
    assert "rank 0, [4] float32) was called differently on the ranks" in dtype_0, dtype_0
    assert "ranks whose all_reduce #1 carries other shapes or dtypes: rank 1 ([4] int32)" in dtype_0, dtype_0
    assert "rank 1, [4] int32)" in dtype_1 and "rank 0 ([4] float32)" in dtype_1, dtype_1
    op_0, op_1 = first["op"]["message"], second["op"]["message"]
    assert "rank 1 called all_gather_into_tensor ([2] -> [4] float32)" in op_0, op_0
    assert "all_gather_into_tensor (collective #2" in op_1 and "rank 0 called all_reduce ([4] float32)" in op_1, op_1
    unchecked_0, unchecked_1 = first["unchecked"]["message"], second["unchecked"]["message"]
    assert "timeout of 3 s" in unchecked_0, unchecked_0
    assert "rank 1 called broadcast ([4] float32)" in unchecked_0, unchecked_0
    assert "rank 0 called all_reduce ([4] float32)" in unchecked_1, unchecked_1


def differing_calls(rank: int, world: int, medium: str) -> dict:
    """Without TORCH_DISTRIBUTED_DEBUG=DETAIL, each case on a fresh group: other byte counts (gloo
    kills the rank receiving too many bytes unless they are caught first), swapped order, equal
    bytes with other shapes. Every rank must raise naming both sides, and stay alive. Then a
    rank that stops early is named by the other's timeout from its published record.

    ``medium``: where the ranks agree and publish their records: the file ranks on one host
    share ("file"), or the group's store ("store", as ranks on several hosts do)."""
    import time

    from torchneuron.distributed import progress

    if medium == "store":  # as if the ranks were on different hosts
        progress.local_table = lambda *args: None
    device = torch.device("neuron", rank)
    cases = {
        "all_reduce_bytes": lambda g: dist.all_reduce(torch.ones(4 if rank == 0 else 8, device=device), group=g),
        "all_gather_bytes": lambda g: dist.all_gather_into_tensor(
            torch.empty(8 * (rank + 1), device=device), torch.ones(4 * (rank + 1), device=device), group=g),
        "swapped_order": lambda g: [dist.all_reduce(torch.ones(n, device=device), group=g)
                                    for n in ((4, 1000) if rank == 0 else (1000, 4))],
        "equal_bytes_other_shapes": lambda g: dist.all_reduce(
            torch.ones(2, 4, device=device) if rank == 0 else torch.ones(8, device=device), group=g),
    }
    if medium == "store":  # the store's path of the check and of the records, once each
        cases = {name: cases[name] for name in ("all_reduce_bytes",)}
    found = {}
    for name, call in cases.items():
        group = dist.new_group(backend="neuron", timeout=TIMEOUT)
        found["shared_file"] = progress.progress_of(group).slots is not None
        start = time.monotonic()
        found[name] = outcome(lambda: call(group))
        found[name]["seconds"] = time.monotonic() - start
    group = dist.new_group(backend="neuron", timeout=TIMEOUT)
    found["stopped_early"] = outcome(lambda: [dist.all_reduce(torch.ones(4, device=device), group=group)
                                              for _ in range(2 if rank == 0 else 1)])
    return found


@pytest.mark.parametrize("medium", ["file", "store"])
def test_differing_collectives_raise_on_every_rank_naming_both_sides(tmp_path, medium):
    """docs/distributed.md, "Collectives called differently on the ranks": no rank is killed by
    gloo (the test's ranks finish and report), each raises within the group's timeout."""
    first, second = run_ranks(differing_calls, 2, tmp_path, medium, timeout=TIMEOUT)
    assert first["shared_file"] == second["shared_file"] == (medium == "file")
    sides = {
        "all_reduce_bytes": ("[4] float32", "[8] float32"),
        "all_gather_bytes": ("[4] -> [8] float32", "[8] -> [16] float32"),
        "swapped_order": ("[4] float32", "[1000] float32"),
        "equal_bytes_other_shapes": ("[2, 4] float32", "[8] float32"),
    }
    ran = sides if medium == "file" else ["all_reduce_bytes"]
    for case in ran:
        shape_0, shape_1 = sides[case]
        for rank, (found, mine, theirs) in enumerate(((first, shape_0, shape_1), (second, shape_1, shape_0))):
            got = found[case]
            assert got.get("is_dist_backend_error"), (case, rank, got)
            message = got["message"]
            assert "collective #1 on process group" in message and f"rank {rank}, {mine})" in message, message
            assert f"rank {1 - rank}" in message and theirs in message, message
            assert "every rank must call the same collectives in the same order" in message, message
            assert got["seconds"] < TIMEOUT.total_seconds() + 30, (case, rank, got["seconds"])
    stopped = first["stopped_early"]["message"]
    assert "all_reduce (collective #2 on process group" in stopped, stopped
    assert "ranks that never reached it: rank 1 (last at #1 all_reduce)" in stopped, stopped
    assert second["stopped_early"] == {"error": None}
