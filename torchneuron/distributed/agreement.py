"""The slots where a group's ranks on one host agree on each collective, without a round trip.

Why: before gloo sees a collective, every rank compares it with the first rank to reach it
(:meth:`progress.GroupProgress.agree`), because gloo aborts a rank whose peer sends more
bytes than it expects. Through the group's TCPStore that is one round trip per collective
to the process that serves the store; on a busy host, waiting for that process to be
scheduled cost about 0.37 ms per collective (a 1 MiB all_gather of 2 ranks on 2 cores,
measured in one run: 1.36x gloo's time with it, 1.10x without; docs/distributed.md). When
every rank of the group is on this host, the slots live in a file they share instead: each rank takes a
lock, reads the slot and writes it if it is first, in a few system calls of its own. Each
rank's progress record (its last collectives, which a failing rank reads to name the
missing ones) lives there too: the store's process had to wake for each one, and on a
busy host that too delayed the collective.

The file is made by the group's rank 0 in a private directory (mode 0700), opened by every
rank, and unlinked as soon as all have it open, so once the group is made nothing is left
behind, even if a rank is killed later. Ranks decide together: the file is used only if
every rank opened it (the same host), else all keep the store.
"""

from __future__ import annotations

import datetime
import fcntl
import hashlib
import os
import secrets
import shutil
import tempfile
import threading
import weakref

import torch.distributed as dist

SLOTS = 64  # in the file and in the store (progress): a rank this many collectives ahead overwrites one
SLOT_BYTES = 1024
# What a collective carries (its shapes and dtypes) may take this much of a slot; the rest is
# for its number, rank and op. Longer: its start and a digest of the whole, so equal texts
# stay equal and different ones different, whichever rank shortens them.
WHAT_BYTES = SLOT_BYTES - 128
RECORD_BYTES = 8 * 1024  # one rank's progress record (progress._COLLECTIVE_WINDOW lines)
_KEY = "torchneuron/agreement/"
_TOKEN_OFFSET = SLOTS * SLOT_BYTES  # after the slots; the records follow it
_RECORDS_OFFSET = _TOKEN_OFFSET + SLOT_BYTES


def fit(what: str) -> str:
    """``what``, or when it is longer than :data:`WHAT_BYTES` its start and a digest of all of it."""
    data = what.encode()
    if len(data) <= WHAT_BYTES:
        return what
    digest = hashlib.sha256(data).hexdigest()[:16]
    return f"{data[:WHAT_BYTES - 32].decode(errors='ignore')}... sha256:{digest}"


class SlotTable:
    """Fixed-size slots and per-rank records in a file shared by processes, each read and
    written under a lock on its bytes."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._lock = threading.Lock()  # file locks do not exclude threads of one process
        # Closes the descriptor when the table is dropped (a group's record replaced) or at
        # exit, before finalization clears the modules a __del__ would need.
        self._close = weakref.finalize(self, os.close, fd)

    def compare_set(self, slot: int, expected: str, desired: str) -> str:
        """As ``Store.compare_set``: writes ``desired`` if the slot holds ``expected`` (an
        empty slot holds ""); returns what the slot holds afterwards."""
        data = desired.encode()
        if len(data) >= SLOT_BYTES:
            raise ValueError(f"a record of {len(data)} bytes does not fit a slot of {SLOT_BYTES}; "
                             f"shorten what it carries with fit()")

        def swap(offset: int) -> str:
            current = os.pread(self._fd, SLOT_BYTES, offset).split(b"\0", 1)[0].decode()
            if current != expected:
                return current
            os.pwrite(self._fd, data + b"\0", offset)  # readers stop at the first NUL
            return desired

        return self._locked(slot * SLOT_BYTES, SLOT_BYTES, swap)

    def publish(self, rank: int, record: str) -> None:
        """Replaces rank ``rank``'s record (cut to :data:`RECORD_BYTES` at a line's end)."""
        data = record.encode()
        while len(data) >= RECORD_BYTES and b"\n" in data:  # drop the oldest lines first
            data = data.split(b"\n", 1)[1]
        self._locked(_RECORDS_OFFSET + rank * RECORD_BYTES, RECORD_BYTES,
                     lambda offset: os.pwrite(self._fd, data[:RECORD_BYTES - 1] + b"\0", offset))

    def record(self, rank: int) -> str:
        """Rank ``rank``'s record; "" if it has published none."""
        data = self._locked(_RECORDS_OFFSET + rank * RECORD_BYTES, RECORD_BYTES,
                            lambda offset: os.pread(self._fd, RECORD_BYTES, offset))
        return data.split(b"\0", 1)[0].decode(errors="replace")

    def _locked(self, offset: int, length: int, action):  # noqa: ANN001, ANN202 - internal
        with self._lock:
            fcntl.lockf(self._fd, fcntl.LOCK_EX, length, offset)
            try:
                return action(offset)
            finally:
                fcntl.lockf(self._fd, fcntl.LOCK_UN, length, offset)

    def close(self) -> None:
        """Closes the file (once; later calls do nothing)."""
        self._close()


def _directory_root() -> str:
    """Shared memory where there is some (no disk writes), else the temporary directory."""
    return "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else tempfile.gettempdir()


def local_table(store: dist.Store, rank: int, size: int, timeout: datetime.timedelta) -> SlotTable | None:
    """The group's shared slots if all ``size`` ranks are on this host, else None (use the store).

    Called by every rank of a new group (its backend's creator), with the group's store; it
    waits for the others as gloo's own connection does. Rank 0 publishes the file's path and
    a fresh token; each rank reports under that token whether it opened the file; all read
    every report, so all decide alike.
    """
    if size == 1:
        return None
    fd, directory = -1, None
    try:
        if rank == 0:
            directory, token, path = _make_slot_file()
            if directory is not None:
                fd = _open_if_ours(path, token)
            store.set(f"{_KEY}path", f"{token} {path}")
        else:
            store.wait([f"{_KEY}path"], timeout)
            token, _, path = store.get(f"{_KEY}path").decode().partition(" ")
            fd = _open_if_ours(path, token)
        store.set(f"{_KEY}{token}/opened/{rank}", "1" if fd >= 0 else "0")
        reports = [f"{_KEY}{token}/opened/{r}" for r in range(size)]
        store.wait(reports, timeout)
        everyone = fd >= 0 and all(store.get(key) == b"1" for key in reports)
    except BaseException:
        if fd >= 0:
            os.close(fd)
        raise
    finally:
        if rank == 0:  # every rank has read the path: a later group of this name makes its own
            if directory is not None:  # and the open descriptors keep the file
                shutil.rmtree(directory, ignore_errors=True)
            try:
                store.delete_key(f"{_KEY}path")
            except Exception:  # noqa: BLE001 - a store without deletion: the token tells groups apart
                pass
    if not everyone:
        if fd >= 0:
            os.close(fd)
        return None
    return SlotTable(fd)


def _make_slot_file() -> tuple[str | None, str, str]:
    """(private directory, token, path) of a new slot file; (None, "-", "-") if none can be made."""
    token = secrets.token_hex(16)
    try:
        directory = tempfile.mkdtemp(prefix="torchneuron-agree-", dir=_directory_root())
        path = os.path.join(directory, "slots")
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.pwrite(fd, token.encode().ljust(SLOT_BYTES, b"\0"), _TOKEN_OFFSET)
        finally:
            os.close(fd)
    except OSError:
        return None, "-", "-"
    return directory, token, path


def _open_if_ours(path: str, token: str) -> int:
    """A descriptor of rank 0's slot file if this host has it (its token matches), else -1."""
    if token == "-":  # rank 0 could not make one
        return -1
    try:
        fd = os.open(path, os.O_RDWR)
    except OSError:
        return -1
    try:
        found = os.pread(fd, SLOT_BYTES, _TOKEN_OFFSET).split(b"\0", 1)[0].decode()
    except OSError:
        found = ""
    if found != token:
        os.close(fd)
        return -1
    return fd
