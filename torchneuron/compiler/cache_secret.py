"""The per-user secret that seals compile cache entries.

A cache entry is code (pickles, generated Python, shared libraries). Only a MAC made
with a secret nobody else can read proves that this user's own compile wrote it: a
plain checksum beside the file is rewritten by whoever rewrites the file. The key is
32 random bytes in a file of mode 0600, owned by the user, created on first use in a
private (0700) directory; it never lives in the cache directory, so copying or
restoring a cache (a CI cache, ``cp -r``) does not carry the means to forge entries.
"""

from __future__ import annotations

import errno
import os
import secrets
import stat
from pathlib import Path

from torchneuron.compiler.cache_store import make_private_dirs
from torchneuron.compiler.diagnostics import CacheUnavailable, UnsafeCacheError

KEY_BYTES = 32
SETTING = "TORCHNEURON_COMPILE_CACHE_KEY_FILE"
_FIX = f"set {SETTING} to a file path of your own (created with mode 0600 on first use)"


def load_or_create(path: Path) -> bytes:
    """The key in ``path``, created if missing. Raises :class:`UnsafeCacheError` when the
    file could be known or replaced by others, :class:`CacheUnavailable` when it cannot
    be read or created."""
    try:
        make_private_dirs(path.parent)
    except OSError as error:
        raise CacheUnavailable(
            f"{SETTING}: cannot create the directory of the compile cache key {str(path)!r} "
            f"({error.strerror}); compiling without the persistent compile cache. To keep it, {_FIX}.") from None
    for _ in range(3):
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except FileNotFoundError:
            _create(path)
            continue
        except OSError as error:
            if error.errno == errno.ELOOP:
                raise UnsafeCacheError(f"{SETTING}: the compile cache key {str(path)!r} is a symbolic "
                                       f"link; it must be a regular file of your own. Remove it, or {_FIX}.") from None
            raise CacheUnavailable(f"{SETTING}: cannot read the compile cache key {str(path)!r} "
                                   f"({error.strerror}); compiling without the persistent compile cache. "
                                   f"To keep it, {_FIX}.") from None
        with os.fdopen(fd, "rb") as f:
            _check(path, os.fstat(f.fileno()))
            data = f.read(KEY_BYTES + 1)
        if len(data) != KEY_BYTES:
            raise UnsafeCacheError(f"{SETTING}: {str(path)!r} is not a torchneuron compile cache key "
                                   f"({len(data)} bytes, expected {KEY_BYTES}). Remove it (a new key is "
                                   f"made; existing cache entries are then compiled again), or {_FIX}.")
        return data
    raise CacheUnavailable(f"{SETTING}: the compile cache key {str(path)!r} keeps disappearing; "
                           "compiling without the persistent compile cache.")


def _check(path: Path, st: os.stat_result) -> None:
    if not stat.S_ISREG(st.st_mode):
        raise UnsafeCacheError(f"{SETTING}: {str(path)!r} is not a regular file. Remove it, or {_FIX}.")
    if st.st_uid != os.geteuid():
        raise UnsafeCacheError(f"{SETTING}: the compile cache key {str(path)!r} belongs to uid {st.st_uid}, "
                               f"not to you (uid {os.geteuid()}); a key others control lets them forge cache "
                               f"entries. Remove it, or {_FIX}.")
    if st.st_mode & 0o077:
        raise UnsafeCacheError(f"{SETTING}: the compile cache key {str(path)!r} has mode "
                               f"{stat.S_IMODE(st.st_mode):04o}; others could read it and forge cache entries. "
                               f"Run `chmod 600 {path}`, or {_FIX}.")


def _create(path: Path) -> None:
    """Writes a new key in a temporary file, then links it into place: other processes see
    no key or a whole key, and the first one linked wins."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(secrets.token_bytes(KEY_BYTES))
            f.flush()
            os.fsync(f.fileno())
        try:
            os.link(temporary, path, follow_symlinks=False)
        except FileExistsError:
            pass  # another process made it first: use theirs
    except OSError as error:
        raise CacheUnavailable(f"{SETTING}: cannot create the compile cache key {str(path)!r} "
                               f"({error.strerror}); compiling without the persistent compile cache. "
                               f"To keep it, {_FIX}.") from None
    finally:
        try:
            os.unlink(temporary)
        except OSError:
            pass
