"""The flight recorder (each rank's last collectives, dumped on failure) and the watchdog
(a collective stuck beyond its limit is reported; the process keeps running)."""

from __future__ import annotations

import dataclasses
import datetime
import json
import pathlib
import time
import warnings

import pytest
import torch
import torch.distributed as dist
from dist_support import run_ranks

from torchneuron.distributed import flight_recorder, watchdog


def recorded(rank: int, world: int, flag: str) -> dict:
    t = torch.ones(4, device="neuron")
    dist.all_reduce(t)  # #1
    dist.broadcast(t, src=0)  # #2
    out = torch.empty(world * 4, device="neuron", dtype=torch.bfloat16)
    dist.all_gather_into_tensor(out, t.to(torch.bfloat16), async_op=True).wait()  # #3
    dist.all_reduce(t)  # #4
    before_failure = [dataclasses.asdict(e) for e in flight_recorder.entries()]
    if rank == 1:  # never calls #5
        deadline = time.monotonic() + 120
        while not pathlib.Path(flag).exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        return {"entries": before_failure}
    try:
        dist.all_reduce(t, async_op=True).wait()
        message = None
    except dist.DistBackendError as e:
        message = str(e)
    pathlib.Path(flag).touch()
    dumped = flight_recorder.load(pathlib.Path(flag).parent / "trace" / "torchneuron_trace_rank0.json")
    return {"entries": before_failure, "message": message, "dump_rank": dumped[0],
            "dump": [dataclasses.asdict(e) for e in dumped[1]]}


def test_flight_recorder_keeps_the_last_collectives_and_dumps_on_failure(tmp_path):
    flag = tmp_path / "rank0-failed"
    env = {"TORCHNEURON_COLLECTIVE_TRACE_SIZE": "3", "TORCHNEURON_COLLECTIVE_TRACE_DIR": str(tmp_path / "trace")}
    first, second = run_ranks(recorded, 2, tmp_path, str(flag), env=env,
                              timeout=datetime.timedelta(seconds=4))
    for result in (first, second):
        entries = result["entries"]
        assert [(e["seq"], e["op"], e["state"]) for e in entries] == [
            (2, "broadcast", "completed"), (3, "all_gather_into_tensor", "completed"),
            (4, "all_reduce", "completed")]
        gather = entries[1]
        assert gather["input_shapes"] == [[4]] and gather["output_shapes"] == [[8]]
        assert gather["dtypes"] == ["bfloat16"] and gather["async_op"] is True
        assert gather["nbytes"] == 16 and gather["modeled_seconds"] > 0
        assert entries[2]["finished_at"] >= entries[2]["issued_at"]
    assert "this rank's flight recorder:" in first["message"], first["message"]
    assert first["dump_rank"] == 0
    assert [(e["seq"], e["op"], e["state"]) for e in first["dump"]] == [
        (3, "all_gather_into_tensor", "completed"), (4, "all_reduce", "completed"),
        (5, "all_reduce", "failed")]
    assert "ranks that never reached it: rank 1" in first["dump"][-1]["error"]


def late_rank(rank: int, world: int) -> dict:
    t = torch.ones(4, device="neuron")
    dist.all_reduce(t)  # #1
    if rank == 1:
        time.sleep(4)  # late for #2, well within the group's timeout
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dist.all_reduce(t)  # #2: completes once rank 1 comes
    return {"reports": watchdog.reports(), "tensor": t.cpu(),
            "warned": [str(w.message) for w in caught if w.category is RuntimeWarning]}


def test_watchdog_reports_a_stuck_collective_and_the_process_goes_on(tmp_path):
    env = {"TORCHNEURON_COLLECTIVE_WATCHDOG_SECONDS": "1"}
    first, second = run_ranks(late_rank, 2, tmp_path, env=env, timeout=datetime.timedelta(seconds=60))
    assert torch.equal(first["tensor"], torch.full((4,), 4.0))  # the collective completed
    [report] = first["reports"]
    assert report.startswith("watchdog: all_reduce (collective #2 on process group"), report
    assert "beyond the watchdog's 1 s; the process keeps running" in report, report
    assert "ranks that have not reached it: rank 1 (last at #1 all_reduce)" in report, report
    assert first["warned"] == [report]  # a RuntimeWarning, from the watchdog's thread
    assert second["reports"] == []


def test_load_refuses_a_file_that_is_not_a_dump(tmp_path):
    bad = tmp_path / "x.json"
    bad.write_text(json.dumps({"rank": 0}))
    with pytest.raises(ValueError, match="is not a torchneuron flight-recorder dump"):
        flight_recorder.load(bad)


def test_dump_and_load_round_trip(tmp_path):
    entry = flight_recorder.Entry(id=1, group="0", seq=7, op="all_reduce", peer=None, input_shapes=[[2]],
                                  output_shapes=[[2]], dtypes=["float32"], nbytes=8, async_op=False)
    flight_recorder._entries.append(entry)
    try:
        rank, entries = flight_recorder.load(flight_recorder.dump(tmp_path / "d.json"))
    finally:
        flight_recorder.clear()
    assert entries[-1] == entry
