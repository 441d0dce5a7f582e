"""Each rank's progress through a neuron group's collectives, so failures name the missing ranks.

Why: a rank that never joins a collective leaves the others in gloo until the group's
timeout, and gloo's error (``Timed out waiting ... for recv``, ``Connection closed by
peer``) names neither the collective nor the rank. Here every collective of a neuron
group writes the rank's sequence number and op to the group's store (one store write,
microseconds next to the collective itself); when a synchronous collective fails, the
rank reads every rank's record and raises a ``DistBackendError`` naming the collective,
its sequence number, the ranks that never reached it and what they did last, and ranks
that reached it with a different collective.

Point-to-point ops (send/recv) are not numbered: ranks make different numbers of them.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass

import torch.distributed as dist

_KEY = "torchneuron/progress/"


@dataclass
class GroupProgress:
    """One rank's collectives on one group, and the store every rank of the group shares."""

    name: str
    store: dist.Store
    rank: int  # in the group
    global_ranks: list[int]
    timeout: datetime.timedelta
    seq: int = 0

    def arrive(self, op: str) -> int:
        """Numbers this rank's next collective and publishes it to the group; returns its number."""
        self.seq += 1
        self.store.set(f"{_KEY}{self.rank}", f"{self.seq} {op}")
        return self.seq

    def records(self) -> list[tuple[int, str] | None]:
        """Every group rank's last published (number, op), None for a rank with none."""
        found: list[tuple[int, str] | None] = []
        for r in range(len(self.global_ranks)):
            key = f"{_KEY}{r}"
            if not self.store.check([key]):
                found.append(None)
                continue
            seq, _, op = self.store.get(key).decode().partition(" ")
            found.append((int(seq), op))
        return found

    def failure(self, op: str, seq: int, error: BaseException) -> dist.DistBackendError:
        """The error for collective ``op`` number ``seq`` failing with ``error``."""
        try:
            records = self.records()
        except Exception as store_error:  # the store itself is gone (its host rank died)
            return dist.DistBackendError(
                f"{op} (collective #{seq} on process group {self.name!r}) failed, and the group's "
                f"store could not be read to find the missing ranks ({store_error}); gloo: {error}")
        missing, mismatched = [], []
        for r, record in enumerate(records):
            who = f"rank {self.global_ranks[r]}"
            if record is None:
                missing.append(f"{who} (no collective yet)")
            elif record[0] < seq:
                missing.append(f"{who} (last at #{record[0]} {record[1]})")
            elif record[0] == seq and record[1] != op:
                mismatched.append(f"{who} called {record[1]}")
        parts = [f"{op} (collective #{seq} on process group {self.name!r}, rank "
                 f"{self.global_ranks[self.rank]}) failed within the group's timeout of "
                 f"{self.timeout.total_seconds():g} s"]
        if missing:
            parts.append(f"ranks that never reached it: {', '.join(missing)}")
        if mismatched:
            parts.append(f"ranks that called a different collective as #{seq}: {', '.join(mismatched)}")
        if not missing and not mismatched:
            parts.append("every rank reached it")
        parts.append(f"gloo: {str(error).strip()}")
        return dist.DistBackendError("; ".join(parts))


_groups: dict[str, GroupProgress] = {}


def track(name: str, store: dist.Store, rank: int, global_ranks: list[int],
          timeout: datetime.timedelta) -> None:
    """Starts numbering the collectives of the group named ``name`` (when its backend is made)."""
    _groups[name] = GroupProgress(name, store, rank, list(global_ranks), timeout)


def progress_of(group: dist.ProcessGroup) -> GroupProgress | None:
    """The progress record of ``group`` (None for a group made before tracking started)."""
    return _groups.get(group.group_name)
