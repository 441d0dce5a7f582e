"""The compile cache on disk: sealed entries in a subdirectory torchneuron owns.

``<NEURON_COMPILE_CACHE_URL>/torchneuron-compile-v1/`` is created by torchneuron (mode
0700) and marked by a ``CACHEDIR.TAG`` naming the format; everything torchneuron writes
is inside it, and nothing outside it is ever read, changed or deleted. Each entry is
``entries/<path>``, where ``<path>`` is the file's path in Inductor's cache directory,
stored as a header, an HMAC-SHA256 of (format, path, bytes) under the user's key
(:mod:`.cache_secret`), and the bytes. An entry whose MAC does not match (planted,
rewritten, moved to another path or key, made with another key) is never returned.

Every path is opened relative to a directory descriptor with ``O_NOFOLLOW``: symbolic
links are neither read through nor written through. Nothing here deletes a file it did
not create: entries are replaced by an atomic rename of a new file.
"""

from __future__ import annotations

import errno
import hashlib
import hmac
import os
import secrets
import stat
from collections.abc import Iterator
from pathlib import Path

from torchneuron.compiler.diagnostics import CacheUnavailable, UnsafeCacheError

FORMAT = 1
SUBDIR = f"torchneuron-compile-v{FORMAT}"
MARKER = "CACHEDIR.TAG"
MARKER_TEXT = (
    "Signature: 8a477f597d28d172789f06886806bc55\n"
    f"# torchneuron compile cache, format {FORMAT}. Written only by torchneuron's compiles;\n"
    "# each entry is sealed with its user's key (see torchneuron docs/compile.md).\n"
).encode()
ENTRIES = "entries"
_MAGIC = f"torchneuron-cache-{FORMAT}\n".encode()
_MAC_BYTES = 32
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC  # NONBLOCK: a planted FIFO
_NEW_FILE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
# errno of a store that cannot take new entries at all (not just this one).
_STORE_WIDE_ERRORS = {errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOSPC, errno.EDQUOT}

Identity = tuple[int, int, int, int]  # inode, size, mtime_ns, ctime_ns


def mac(key: bytes, relpath: str, payload: bytes) -> bytes:
    """HMAC-SHA256 binding ``payload`` to its path: an entry is valid only where it was written."""
    digest = hmac.new(key, digestmod=hashlib.sha256)
    digest.update(b"torchneuron compile cache entry\0%d\0%s\0" % (FORMAT, relpath.encode()))
    digest.update(payload)
    return digest.digest()


def seal(key: bytes, relpath: str, payload: bytes) -> bytes:
    return _MAGIC + mac(key, relpath, payload) + payload


def unseal(key: bytes, relpath: str, blob: bytes) -> bytes | None:
    """The payload of a sealed entry, or None if it was not sealed for ``relpath`` with ``key``."""
    header = len(_MAGIC) + _MAC_BYTES
    if len(blob) < header or not blob.startswith(_MAGIC):
        return None
    payload = blob[header:]
    return payload if hmac.compare_digest(blob[len(_MAGIC):header], mac(key, relpath, payload)) else None


def check_relpath(relpath: str) -> list[str]:
    """The components of an entry path; only plain names (no '', '.', '..', dot files)."""
    parts = relpath.split("/")
    if any(not p or p.startswith(".") or "\0" in p for p in parts):
        raise ValueError(f"not a compile cache entry path: {relpath!r}")
    return parts


class SealedStore:
    """The owned subdirectory of one cache directory, opened once per process.

    ``describe`` says where the directory came from and ``setting`` names the variable
    that changes it (for messages); with ``allow_shared``, directories others can write
    to or that another user owns are used (entries are verified all the same) instead
    of refused.
    """

    def __init__(self, root: Path, key: bytes, *, describe: str, setting: str, allow_shared: bool) -> None:
        self.root = root
        self._key = key
        self._setting = setting
        self._allow_shared = allow_shared
        self._describe = describe
        root_fd = self._open_root()
        try:
            self._check_private(root_fd, root)
            owned_fd = self._open_owned(root_fd)
        finally:
            os.close(root_fd)
        try:
            self._check_private(owned_fd, root / SUBDIR)
            self._check_marker(owned_fd)
            self._entries_fd = self._open_or_make_dir(owned_fd, ENTRIES)
        except BaseException:
            os.close(owned_fd)
            raise
        self._owned_fd = owned_fd
        self.write_error: str | None = self._probe_writable()

    def check_private(self) -> None:
        """Checks again (at each compile) that the directory and the owned subdirectory are
        still private: one made shared while a process runs is refused from then on."""
        root_fd = self._open_root()
        try:
            self._check_private(root_fd, self.root)
        finally:
            os.close(root_fd)
        self._check_private(self._owned_fd, self.root / SUBDIR)

    @property
    def writable(self) -> bool:
        return self.write_error is None

    # --- opening ---------------------------------------------------------------------

    def _open_root(self) -> int:
        try:
            if not self.root.exists():
                make_private_dirs(self.root)
            return os.open(self.root, _DIR_FLAGS)
        except OSError as error:
            if error.errno == errno.ELOOP:
                reason = "it is a symbolic link"
            elif error.errno == errno.ENOTDIR or isinstance(error, FileExistsError):
                reason = "it or one of its parents is not a directory"
            else:
                reason = error.strerror
            raise CacheUnavailable(
                f"{self._describe}: the compile cache directory cannot be used ({reason}); compiling "
                f"without the persistent compile cache. Set {self._setting} to a directory you can "
                "create and write.") from None

    def _open_owned(self, root_fd: int) -> int:
        """Opens the owned subdirectory, creating it (with its marker) if missing: made
        under a temporary name and renamed, so it never exists without its marker."""
        try:
            return os.open(SUBDIR, _DIR_FLAGS, dir_fd=root_fd)
        except FileNotFoundError:
            pass
        except OSError as error:
            raise CacheUnavailable(
                f"{self._describe}: {SUBDIR} in it cannot be opened as a directory ({error.strerror}); "
                "torchneuron does not touch it. Move it away or choose another directory; compiling "
                "without the persistent compile cache.") from None
        temporary = f".{SUBDIR}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
        try:
            os.mkdir(temporary, 0o700, dir_fd=root_fd)
        except OSError as error:
            raise CacheUnavailable(
                f"{self._describe}: cannot create the compile cache in it ({error.strerror}); compiling "
                f"without the persistent compile cache. Set {self._setting} to a directory you can write, "
                "or create the cache there once as a user who can.") from None
        temporary_fd = os.open(temporary, _DIR_FLAGS, dir_fd=root_fd)
        try:
            _write_new(temporary_fd, MARKER, MARKER_TEXT)
            os.mkdir(ENTRIES, 0o700, dir_fd=temporary_fd)
            try:
                os.rename(temporary, SUBDIR, src_dir_fd=root_fd, dst_dir_fd=root_fd)
                temporary = None
            except OSError as error:
                if error.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                    raise
        finally:
            if temporary is not None:  # another process created it first: remove only what we made
                for name, is_dir in ((ENTRIES, True), (MARKER, False)):
                    try:
                        (os.rmdir if is_dir else os.unlink)(name, dir_fd=temporary_fd)
                    except OSError:
                        pass
                try:
                    os.rmdir(temporary, dir_fd=root_fd)
                except OSError:
                    pass
            os.close(temporary_fd)
        return os.open(SUBDIR, _DIR_FLAGS, dir_fd=root_fd)

    def _check_private(self, fd: int, path: Path) -> None:
        """Refuses a directory that others own or can write to: anyone who can write there
        can replace what this process loads as code."""
        if self._allow_shared:
            return
        st = os.fstat(fd)
        problem = None
        if st.st_uid != os.geteuid():
            problem = f"{path} belongs to uid {st.st_uid}, not to you (uid {os.geteuid()})"
        elif st.st_mode & 0o022:
            problem = (f"{path} can be written by {'group and others' if st.st_mode & 0o002 else 'its group'} "
                       f"(mode {stat.S_IMODE(st.st_mode):04o}); run `chmod go-w {path}`")
        if problem:
            raise UnsafeCacheError(
                f"{self._describe} is not private: {problem}. Compiled graphs are loaded from the cache as "
                f"code, so torchneuron uses only a cache directory that you own and only you can write. "
                f"Set {self._setting} to such a directory, or set TORCHNEURON_COMPILE_CACHE_ALLOW_SHARED=1 "
                "to use this one anyway (entries are still verified with your key).")

    def _check_marker(self, owned_fd: int) -> None:
        try:
            marker = _read_regular(owned_fd, MARKER, limit=len(MARKER_TEXT) + 1)
        except OSError:
            marker = None
        if marker != MARKER_TEXT:
            raise CacheUnavailable(
                f"{self._describe}: {self.root / SUBDIR} exists but is not a torchneuron compile cache of "
                f"format {FORMAT} (no valid {MARKER}); torchneuron does not touch it. Move it away or choose "
                "another directory; compiling without the persistent compile cache.")

    def _open_or_make_dir(self, parent_fd: int, name: str) -> int:
        try:
            os.mkdir(name, 0o700, dir_fd=parent_fd)
        except FileExistsError:
            pass
        except OSError as error:
            if error.errno not in (errno.EACCES, errno.EROFS, errno.EPERM):
                raise
        return os.open(name, _DIR_FLAGS, dir_fd=parent_fd)

    def _probe_writable(self) -> str | None:
        """None if new entries can be written, else why not (checked once, so that a
        read-only cache is reported once, up front)."""
        name = f".probe.{os.getpid()}.{secrets.token_hex(4)}"
        try:
            os.close(os.open(name, _NEW_FILE_FLAGS, 0o600, dir_fd=self._entries_fd))
            os.unlink(name, dir_fd=self._entries_fd)
            return None
        except OSError as error:
            return error.strerror or str(error)

    # --- entries -----------------------------------------------------------------------

    def scan(self, known: dict[str, Identity]) -> Iterator[tuple[str, Identity, bytes | None]]:
        """Every entry whose identity is not in ``known``: its path, identity, and verified
        payload (None when it fails verification). Symbolic links and anything but
        regular files are skipped."""
        for dirpath, dirnames, filenames, dir_fd in os.fwalk(".", dir_fd=self._entries_fd,
                                                              follow_symlinks=False):
            dirnames[:] = [d for d in dirnames if not d.startswith(".")]
            prefix = "" if dirpath == "." else dirpath.removeprefix("./") + "/"
            for name in filenames:
                if name.startswith("."):
                    continue  # our own files being written
                relpath = prefix + name
                try:
                    st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
                    if not stat.S_ISREG(st.st_mode):
                        continue
                    identity = (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
                    if known.get(relpath) == identity:
                        continue
                    blob = _read_regular(dir_fd, name)
                except OSError:
                    continue
                yield relpath, identity, unseal(self._key, relpath, blob)

    def write(self, relpath: str, payload: bytes) -> Identity:
        """Stores ``payload`` as the entry ``relpath`` (a new file renamed into place);
        returns its identity."""
        *dirs, name = check_relpath(relpath)
        fds = [self._entries_fd]
        try:
            for part in dirs:
                fds.append(self._open_or_make_dir(fds[-1], part))
            return _write_new(fds[-1], name, seal(self._key, relpath, payload), replace=True)
        finally:
            for fd in fds[1:]:
                os.close(fd)

    @staticmethod
    def store_wide(error: OSError) -> bool:
        """Whether ``error`` means no entry can be written (read-only, no space, no permission)."""
        return error.errno in _STORE_WIDE_ERRORS

    def close(self) -> None:
        os.close(self._entries_fd)
        os.close(self._owned_fd)


def _read_regular(dir_fd: int, name: str, limit: int = -1) -> bytes:
    fd = os.open(name, _READ_FLAGS, dir_fd=dir_fd)
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file", name)
        return f.read(limit)


def _write_new(dir_fd: int, name: str, data: bytes, replace: bool = False) -> Identity:
    """Writes ``data`` to a new file and, with ``replace``, renames it over ``name``
    (the rename replaces a symbolic link rather than writing through it)."""
    target = f".{name}.{os.getpid()}.{secrets.token_hex(4)}.tmp" if replace else name
    fd = os.open(target, _NEW_FILE_FLAGS, 0o600, dir_fd=dir_fd)
    try:
        with os.fdopen(fd, "wb", closefd=False) as f:
            f.write(data)
        if replace:
            os.rename(target, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        st = os.fstat(fd)  # after the rename, which changes its ctime
    except BaseException:
        if replace:
            try:
                os.unlink(target, dir_fd=dir_fd)
            except OSError:
                pass
        raise
    finally:
        os.close(fd)
    return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def make_private_dirs(directory: Path) -> None:
    """Creates ``directory`` and its missing parents with mode 0700."""
    missing = []
    while not directory.exists() and directory.parent != directory:
        missing.append(directory)
        directory = directory.parent
    for each in reversed(missing):
        try:
            os.mkdir(each, 0o700)
        except FileExistsError:
            pass
