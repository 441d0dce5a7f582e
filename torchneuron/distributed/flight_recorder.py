"""Each rank's flight recorder: its last collectives, dumpable when one fails or sticks.

Why: when a job hangs or fails, the first question is what every rank was doing. As
PyTorch's NCCL flight recorder (``TORCH_NCCL_TRACE_BUFFER_SIZE``) does, every neuron
collective and send/receive appends one :class:`Entry` (group, sequence number, op,
shapes, dtypes, state, wall-clock and modelled times) to a ring of the last
``TORCHNEURON_COLLECTIVE_TRACE_SIZE`` entries. :func:`entries` reads it in-process;
:func:`dump` writes it as JSON (never pickle: a dump from another rank or host is read
with :func:`load`, which only parses JSON), and a failed collective or the watchdog
(:mod:`watchdog`) writes it to ``TORCHNEURON_COLLECTIVE_TRACE_DIR`` when that is set.
"""

from __future__ import annotations

import collections
import json
import os
import pathlib
import threading
import time
from dataclasses import asdict, dataclass, field

from torchneuron import config

__all__ = ["Entry", "entries", "dump", "dump_on_failure", "load", "clear"]

# States an entry goes through: started -> completed | failed.
STARTED, COMPLETED, FAILED = "started", "completed", "failed"


@dataclass
class Entry:
    """One collective or point-to-point op as this rank issued it."""

    id: int  # this rank's running count of recorded ops (never reused)
    group: str  # the process group's name
    seq: int  # collectives: the group's sequence number; send/recv: the pair's (0: not numbered)
    op: str  # "all_reduce", "send", ...
    peer: int | None  # send/recv: the other side's global rank
    input_shapes: list[list[int]]
    output_shapes: list[list[int]]
    dtypes: list[str]
    nbytes: int
    async_op: bool
    state: str = STARTED
    issued_at: float = field(default_factory=time.time)  # wall clock (s since the epoch)
    finished_at: float | None = None
    modeled_start: float | None = None  # on the device's collective stream (s)
    modeled_seconds: float | None = None
    error: str | None = None

    @property
    def running_seconds(self) -> float:
        """Wall-clock seconds since it was issued (until it finished, if it did)."""
        return (self.finished_at or time.time()) - self.issued_at


_lock = threading.Lock()
_entries: collections.deque[Entry] = collections.deque(maxlen=256)
_count = 0
_rank: int | None = None


def record(entry_fields: dict, rank: int) -> Entry:
    """Appends an entry (fields of :class:`Entry` but ``id``) for global rank ``rank``."""
    global _count, _rank, _entries
    size = _trace_size()
    with _lock:
        if _entries.maxlen != size:
            _entries = collections.deque(_entries, maxlen=size)
        _count += 1
        _rank = rank
        entry = Entry(id=_count, **entry_fields)
        _entries.append(entry)
    return entry


def _trace_size() -> int:
    """TORCHNEURON_COLLECTIVE_TRACE_SIZE (every collective reads it; config keeps it parsed)."""
    return config.value("TORCHNEURON_COLLECTIVE_TRACE_SIZE")


def finish(entry: Entry, error: BaseException | None = None) -> None:
    """Marks ``entry`` completed (or failed with ``error``); the first call wins."""
    with _lock:
        if entry.state != STARTED:
            return
        entry.state = FAILED if error is not None else COMPLETED
        entry.finished_at = time.time()
        if error is not None:
            entry.error = str(error)


def entries() -> list[Entry]:
    """This rank's recorded ops, oldest first (copies: later changes do not show)."""
    with _lock:
        return [Entry(**asdict(e)) for e in _entries]


def clear() -> None:
    """Forgets every entry (the running count goes on)."""
    with _lock:
        _entries.clear()


def dump(path: str | os.PathLike[str]) -> pathlib.Path:
    """Writes this rank's entries to ``path`` as JSON and returns the path.

    The file is ``{"rank": R, "entries": [...]}``, each entry the fields of :class:`Entry`.
    """
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    document = {"rank": _rank, "entries": [asdict(e) for e in entries()]}
    path.write_text(json.dumps(document, indent=1))
    return path


def dump_on_failure() -> pathlib.Path | None:
    """Writes the entries to ``TORCHNEURON_COLLECTIVE_TRACE_DIR`` if set; returns the file.

    Never raises: a dump that cannot be written must not hide the failure being reported.
    """
    directory = config.get("TORCHNEURON_COLLECTIVE_TRACE_DIR")
    if directory is None:
        return None
    try:
        target = pathlib.Path(directory)
        target.mkdir(parents=True, exist_ok=True)
        return dump(target / f"torchneuron_trace_rank{_rank if _rank is not None else 'unknown'}.json")
    except OSError:
        return None


def load(path: str | os.PathLike[str]) -> tuple[int | None, list[Entry]]:
    """(rank, entries) of a dump written by :func:`dump` (any rank's; JSON only).

    Raises:
        ValueError: if the file is not such a dump, naming the file.
    """
    try:
        document = json.loads(pathlib.Path(path).read_text())
        return document["rank"], [Entry(**fields) for fields in document["entries"]]
    except (ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{os.fspath(path)!r} is not a torchneuron flight-recorder dump "
                         f"(written by torchneuron.distributed.flight_recorder.dump): {e}") from None
