"""The slots ranks on one host agree in (torchneuron/distributed/agreement.py), in-process:
the store's compare_set semantics, per-rank records, long records, and set-up that leaves
no file behind. (Ranks using them: test_dist_mismatch.py, test_dist_timeout.py.)"""

from __future__ import annotations

import datetime
import os
import threading

import pytest
import torch.distributed as dist

from torchneuron.distributed import agreement

TIMEOUT = datetime.timedelta(seconds=10)


@pytest.fixture
def table(tmp_path, monkeypatch):
    """Rank 0's and rank 1's tables of one group, made by two threads as two ranks would."""
    monkeypatch.setattr(agreement, "_directory_root", lambda: str(tmp_path))
    store = dist.HashStore()
    made = {}
    ranks = [threading.Thread(target=lambda r=r: made.__setitem__(r, agreement.local_table(store, r, 2, TIMEOUT)))
             for r in range(2)]
    for thread in ranks:
        thread.start()
    for thread in ranks:
        thread.join()
    assert made[0] is not None and made[1] is not None
    assert list(tmp_path.iterdir()) == []  # unlinked once both had it open
    yield made
    made[0].close()
    made[1].close()


def test_compare_set_has_the_stores_semantics(table):
    first, second = table[0], table[1]
    assert first.compare_set(3, "", "1 0 all_reduce [4] float32") == "1 0 all_reduce [4] float32"  # empty: set
    assert second.compare_set(3, "", "1 1 all_reduce [8] float32") == "1 0 all_reduce [4] float32"  # taken
    assert second.compare_set(3, "1 0 all_reduce [4] float32", "65 1 broadcast [2] int32") == "65 1 broadcast [2] int32"
    assert first.compare_set(3, "", "z") == "65 1 broadcast [2] int32"  # the shorter value reads back whole
    assert first.compare_set(4, "", "x") == "x"  # slots are independent
    store = dist.HashStore()  # the store does the same
    assert store.compare_set("k", "", "a") == b"a" and store.compare_set("k", "", "b") == b"a"


def test_records_are_per_rank_and_keep_the_newest_lines(table):
    assert table[1].record(0) == ""  # nothing published yet
    table[0].publish(0, "1 all_reduce [4] float32\n2 barrier [1] uint8")
    assert table[1].record(0) == "1 all_reduce [4] float32\n2 barrier [1] uint8"
    assert table[0].record(1) == ""
    table[0].publish(0, "3 broadcast [1] int8")  # shorter than the record it replaces
    assert table[1].record(0) == "3 broadcast [1] int8"
    lines = [f"{n} all_gather {'x' * 1500}" for n in range(1, 9)]  # more than a record holds
    table[1].publish(1, "\n".join(lines))
    kept = table[0].record(1).split("\n")
    assert kept == lines[-len(kept):] and len(kept) < len(lines)  # whole lines, the newest


def test_fit_keeps_short_texts_and_tells_long_ones_apart():
    assert agreement.fit("[4] float32") == "[4] float32"
    long_a, long_b = "[1] " * 400 + "float32", "[1] " * 400 + "int32"
    assert len(agreement.fit(long_a).encode()) <= agreement.WHAT_BYTES
    assert agreement.fit(long_a) == agreement.fit(long_a) and agreement.fit(long_a) != agreement.fit(long_b)


def test_a_rank_that_cannot_open_the_file_makes_every_rank_use_the_store(tmp_path, monkeypatch):
    monkeypatch.setattr(agreement, "_directory_root", lambda: str(tmp_path))
    real = agreement._open_if_ours
    monkeypatch.setattr(agreement, "_open_if_ours", lambda path, token: -1 if threading.current_thread().name == "r1"
                        else real(path, token))
    store = dist.HashStore()
    made = {}
    ranks = [threading.Thread(name=f"r{r}", target=lambda r=r: made.__setitem__(r, agreement.local_table(store, r, 2, TIMEOUT)))
             for r in range(2)]
    for thread in ranks:
        thread.start()
    for thread in ranks:
        thread.join()
    assert made == {0: None, 1: None}  # decided alike: both keep the store
    assert list(tmp_path.iterdir()) == []
    assert agreement.local_table(store, 0, 1, TIMEOUT) is None  # one rank: nothing to agree on
    assert os.path.isdir(tmp_path)
