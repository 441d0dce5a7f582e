"""No file holds placeholders: saves of values a dataless run never computed write nothing.

A dataless run (:mod:`torchneuron.device.dataless`) is the real program with no values,
often pointed at the real job's paths. Its checkpoints would be placeholders (zeros)
that look like weights: written over the user's real checkpoint, they are lost work no
error reports, and loaded by a later normal run they are wrong numbers. So while
dataless execution is on:

- ``torch.save`` to a path or an open file of an object holding dataless tensors writes
  nothing; the bytes it would have written are measured (it serializes into a counting
  sink) and the save is listed (:func:`skipped_writes`) and warned about once per call
  site. Saves of objects with values only (a config, CPU tensors) and saves into
  in-memory buffers (``io.BytesIO``) are written as usual.
- Distributed checkpoints (``torch.distributed.checkpoint``'s file-system writer, which
  ``dcp.save`` and ``dcp.async_save`` use for a path) create no directory and write no
  file; the metadata a save would write is kept in this process, so a later ``dcp.load``
  of the same path plans against it. ``dcp.load`` reads a checkpoint's metadata (an
  existing one on disk, or one this run saved), so the load plan is checked as the real
  run's is (a missing key or a shape mismatch fails the same way), and reads no tensor
  data: the dataless tensors stay without values, as every tensor of the run is.

Private torch API used (checked on torch 2.13.0):
``torch.distributed.checkpoint.filesystem._FileSystemWriter`` (the base class
``FileSystemWriter`` and its subclasses share; its ``fs`` attribute is the file system the
writer goes through).
"""

from __future__ import annotations

import contextlib
import functools
import io
import os
import sys
import threading
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

from torchneuron import _C
from torchneuron.device import accounting

__all__ = ["SkippedWrite", "skipped_writes", "reset", "install"]


@dataclass(frozen=True)
class SkippedWrite:
    """A save a dataless run did not write, at one call site."""

    what: str  # "torch.save" or "dcp.save"
    path: str
    site: str
    bytes: int  # what the save would have written (the last call's)
    calls: int


_lock = threading.Lock()
_skipped: dict[tuple[str, str, str], tuple[int, int]] = {}  # (what, path, site) -> (bytes, calls)
_warned: set[tuple[str, str]] = set()
_installed = False
# The metadata files dataless distributed saves "wrote": path -> the pickled bytes this
# process produced (the data files are not kept: a dataless load reads none).
_planned_files: dict[str, bytes] = {}


def _note(what: str, path: str, nbytes: int, frame: Any) -> None:
    stack = accounting.user_stack(frame, limit=1)
    site = stack[0] if stack else "<unknown>"
    key = (what, path, site)
    with _lock:
        calls = _skipped.get(key, (0, 0))[1] + 1
        _skipped[key] = (nbytes, calls)
        first = (what, site) not in _warned
        _warned.add((what, site))
    if first:
        warnings.warn(
            f"{what}({path!r}) in a dataless run wrote nothing: the tensors hold no values, so the "
            f"file would hold placeholders ({nbytes:,} bytes). Run without TORCHNEURON_DATALESS to "
            "write real values (torchneuron.device.dataless_files.skipped_writes() lists each save)",
            UserWarning, stacklevel=3)


def skipped_writes() -> list[SkippedWrite]:
    """Every save a dataless run did not write, with its call site and size."""
    with _lock:
        return [SkippedWrite(what, path, site, nbytes, calls)
                for (what, path, site), (nbytes, calls) in _skipped.items()]


def reset() -> None:
    """Forgets the skipped saves (with :func:`torchneuron.device.dataless.reset`). The metadata
    of distributed saves stays: a later load of that path still plans against it."""
    with _lock:
        _skipped.clear()
        _warned.clear()


class _CountingSink(io.RawIOBase):
    """A write-only stream that keeps nothing but how many bytes it was given; given a
    ``path`` (a distributed checkpoint's small metadata file) it also keeps the bytes, in
    this process, as that file's content for a later load."""

    def __init__(self, path: str | None = None) -> None:
        super().__init__()
        self.path, self.size, self._kept = path, 0, bytearray() if path is not None else None

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.size

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        if (whence, offset) not in ((io.SEEK_END, 0), (io.SEEK_CUR, 0), (io.SEEK_SET, self.size)):
            raise io.UnsupportedOperation("a counting sink only reports its end")
        return self.size

    def write(self, b: Any) -> int:
        n = memoryview(b).nbytes
        self.size += n
        if self._kept is not None:
            self._kept += bytes(b)
        return n

    def close(self) -> None:
        if not self.closed and self._kept is not None:
            with _lock:
                _planned_files[self.path] = bytes(self._kept)
        super().close()


# ---- torch.save ---------------------------------------------------------------------------

_thread = threading.local()


@contextlib.contextmanager
def _measuring_copies() -> Iterator[None]:
    """Counts, in this thread, the copies to the host of storages without values (the read
    observer asks :func:`counts_placeholder_copy`): they belong to the save being measured."""
    _thread.counting, _thread.active = 0, True
    try:
        yield
    finally:
        _thread.active = False


def _holds_placeholders(obj: Any, sink: _CountingSink, save: Any, args: tuple, kwargs: dict) -> bool:
    """Serializes ``obj`` into ``sink``; True if any storage it copied to the host held no values."""
    with _measuring_copies():
        save(obj, sink, *args, **kwargs)
    return _thread.counting > 0


def counts_placeholder_copy() -> bool:
    """The read observer's question: is this copy to the host part of a save being measured
    (then it is the save's, listed as a skipped write, not as a data read)?"""
    if getattr(_thread, "active", False):
        _thread.counting += 1
        return True
    return False


def _target_path(f: Any) -> str | None:
    """The file ``f`` names or is (None for an in-memory buffer)."""
    if isinstance(f, (str, os.PathLike)):
        return os.fspath(f)
    try:
        f.fileno()
    except (AttributeError, OSError, io.UnsupportedOperation):
        return None
    return str(getattr(f, "name", "<open file>"))


def _guard_save(save: Any) -> Any:
    @functools.wraps(save)
    def guarded_save(obj: Any, f: Any, *args: Any, **kwargs: Any) -> None:
        from torchneuron.device import dataless

        path = _target_path(f) if dataless.is_active() else None
        if path is None or getattr(_thread, "active", False):
            return save(obj, f, *args, **kwargs)
        sink = _CountingSink()
        if not _holds_placeholders(obj, sink, save, args, kwargs):
            return save(obj, f, *args, **kwargs)
        _note("torch.save", path, sink.size, sys._getframe(1))
        return None

    guarded_save.__torchneuron_guard__ = True
    return guarded_save


# ---- torch.distributed.checkpoint ---------------------------------------------------------


class _DatalessFileSystem:
    """A DCP file system that writes nothing: streams opened for writing count their bytes,
    directories are not made, nothing on disk is renamed or removed; reads of files a
    dataless save "wrote" come from memory, others from disk (the real checkpoint)."""

    def __init__(self, fs: Any) -> None:
        self.real = fs

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)

    def create_stream(self, path: Any, mode: str) -> Any:
        key = os.fspath(path)
        if "w" in mode or "a" in mode:
            # The metadata file (".metadata", "__<rank>.metadata", their ".tmp") is kept: a
            # later load of this path plans against it. Data files are only counted.
            return _CountingSink(key if ".metadata" in os.path.basename(key) else None)
        with _lock:
            kept = _planned_files.get(key)
        if kept is not None:
            return io.BytesIO(kept)  # io streams close when a ``with`` block ends
        return self.real.create_stream(path, mode)

    def mkdir(self, path: Any) -> None:
        return None

    def exists(self, path: Any) -> bool:
        with _lock:
            if os.fspath(path) in _planned_files:
                return True
        return self.real.exists(path)

    def rename(self, path: Any, new_path: Any) -> None:
        with _lock:
            if os.fspath(path) in _planned_files:
                _planned_files[os.fspath(new_path)] = _planned_files.pop(os.fspath(path))

    def rm_file(self, path: Any) -> None:
        with _lock:
            _planned_files.pop(os.fspath(path), None)


def _dataless_fs(owner: Any) -> Any:
    """``owner.fs`` wrapped while dataless execution is on (the writer or reader keeps it),
    unwrapped after; a writer does not fsync the counting sinks meanwhile (an fsync of a
    stream with no file descriptor falls back to syncing every file system)."""
    from torchneuron.device import dataless

    fs = owner.fs
    if dataless.is_active() and not isinstance(fs, _DatalessFileSystem):
        owner.fs = _DatalessFileSystem(fs)
        if hasattr(owner, "sync_files"):
            owner._torchneuron_sync_files, owner.sync_files = owner.sync_files, False
    elif not dataless.is_active() and isinstance(fs, _DatalessFileSystem):
        owner.fs = fs.real
        if hasattr(owner, "_torchneuron_sync_files"):
            owner.sync_files = owner.__dict__.pop("_torchneuron_sync_files")
    return owner.fs


def _wrap_method(cls: type, name: str, when_dataless: Any = None) -> None:
    """``cls.name`` going through the dataless file system while dataless execution is on,
    and running ``when_dataless(self, original, *args)`` instead, if given, then."""
    from torchneuron.device import dataless

    original = getattr(cls, name)

    @functools.wraps(original)
    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        _dataless_fs(self)
        if when_dataless is None or not dataless.is_active():
            return original(self, *args, **kwargs)
        return when_dataless(self, original, *args, **kwargs)

    setattr(cls, name, method)


def _measured_write(writer: Any, original: Any, plan: Any, planner: Any) -> Any:
    """The writer's ``write_data`` into counting sinks, noted as a save not written."""
    with _measuring_copies():  # its copies to the host are the save's
        future = original(writer, plan, planner)
    total = sum(r.size_in_bytes for r in future.value())
    _note("dcp.save", os.fspath(writer.path), total, sys._getframe(1))
    return future


def _no_read(reader: Any, original: Any, plan: Any, planner: Any) -> Any:
    """The reader's ``read_data`` reading no bytes: the run's tensors hold no values."""
    from torch.futures import Future

    done: Future = Future()
    done.set_result(None)
    return done


def _install_dcp() -> None:
    from torch.distributed.checkpoint import filesystem

    writer, reader = filesystem._FileSystemWriter, filesystem.FileSystemReader
    for name in ("prepare_local_plan", "finish"):
        _wrap_method(writer, name)
    _wrap_method(writer, "write_data", _measured_write)
    _wrap_method(reader, "read_metadata")
    _wrap_method(reader, "read_data", _no_read)


def install() -> None:
    """Guards ``torch.save`` and DCP's file-system storage (once, at the first dataless run)."""
    global _installed
    with _lock:
        if _installed:
            return
        _installed = True
    if not getattr(torch.save, "__torchneuron_guard__", False):
        torch.save = _guard_save(torch.save)
    _after_import(_DCP_MODULE, _install_dcp)


_DCP_MODULE = "torch.distributed.checkpoint.filesystem"


def _after_import(module: str, patch: Any) -> None:
    """Runs ``patch`` once ``module`` is imported: now if it is, else right after its import.
    Importing DCP here would change the run (it registers state-dict hooks with FSDP)."""
    if module in sys.modules:
        patch()
        return
    import importlib.abc
    import importlib.util

    class PatchAfterImport(importlib.abc.MetaPathFinder):
        def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
            if fullname != module:
                return None
            sys.meta_path.remove(self)
            spec = importlib.util.find_spec(fullname)
            if spec is None or spec.loader is None:
                return spec
            execute = spec.loader.exec_module

            def exec_module(mod: Any) -> None:
                execute(mod)
                patch()

            spec.loader.exec_module = exec_module
            return spec

    sys.meta_path.insert(0, PatchAfterImport())
