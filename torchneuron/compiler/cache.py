"""The persistent compile cache of ``backend="neuron"``.

Compiled graphs are stored by Inductor's content-addressed FX graph cache (key: the
graph, its input metadata, Inductor's configuration and the torch version).
:class:`NeuronCacheKey` adds what changes a neuron compile to that key: the modelled
target and LNC, the numerics and fallback switches, the host's vector ISA and
``ATEN_CPU_CAPABILITY``, and the torchneuron version and compiler sources.

Trust model (docs/compile.md, "Compile cache"): every file Inductor reads from its cache
directory is code or decides which code runs (pickled graphs, generated Python modules,
compiled shared libraries), so Inductor never reads the persistent cache itself. Each
process compiles in a private working directory (``mkdtemp``, mode 0700, removed at
exit). At the start of each compile, the entries of the persistent cache
(:mod:`.cache_store`) that this process has not yet seen are verified against their MAC
under the user's key (:mod:`.cache_secret`) and the verified bytes are copied in; after
each successful compile, the files Inductor wrote are sealed and published to the cache.
Files that fail verification are never copied, so they are never loaded, whether or not
they could be removed; nothing is deleted.

Uses ``torch._inductor`` cache internals (``cache_dir_utils.temporary_cache_dir``,
``cpu_vec_isa.pick_vec_isa``); checked against torch 2.13.0.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import hashlib
import os
import shutil
import stat
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import torch
from torch._inductor.custom_graph_pass import CustomGraphPass
from torch._inductor.runtime import cache_dir_utils

import torchneuron
from torchneuron import config
from torchneuron.compiler import cache_secret
from torchneuron.compiler.cache_store import Identity, SealedStore, check_relpath
from torchneuron.compiler.diagnostics import CacheUnavailable, warn_once
from torchneuron.device import _core, fake_conv

STORE_SETTING = "NEURON_COMPILE_CACHE_URL"
ALLOW_SHARED_SETTING = "TORCHNEURON_COMPILE_CACHE_ALLOW_SHARED"


def cache_dir() -> Path:
    """The cache directory: ``NEURON_COMPILE_CACHE_URL``, else under the user cache dir.
    torchneuron keeps its entries in a subdirectory it owns (``torchneuron-compile-v1``)."""
    explicit = config.get(STORE_SETTING)
    if explicit:
        if "://" in explicit and not explicit.startswith("file://"):
            raise ValueError(f"{STORE_SETTING}={explicit!r}: only local directories are "
                             "supported by torchneuron (use a path or a file:// URL)")
        return Path(explicit.removeprefix("file://")).expanduser().resolve()
    base = config.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "torchneuron" / "compile"


def key_file() -> Path:
    """This user's cache key: ``TORCHNEURON_COMPILE_CACHE_KEY_FILE``, else under the user
    config dir (never in the cache directory, which may be copied or shared)."""
    explicit = config.get(cache_secret.SETTING)
    if explicit:
        return Path(explicit).expanduser().absolute()
    base = config.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(base) / "torchneuron" / "compile-cache.key"


# --- the key --------------------------------------------------------------------------

@functools.cache
def _picked_vec_isa() -> str:
    """The vector ISA Inductor compiles C++ kernels for on this host (it honours
    ``ATEN_CPU_CAPABILITY``). The first call compiles Inductor's ISA probes into the
    current cache directory: call it inside :func:`using_cache_dir`."""
    from torch._inductor.cpu_vec_isa import pick_vec_isa

    isa = pick_vec_isa()
    return f"{type(isa).__name__}:{isa}:{isa.bit_width()}"


def host_isa() -> tuple[str, str, str | None]:
    """The ISA compiled code is built for: Inductor's pick, the ISA ATen dispatches to, and
    ``ATEN_CPU_CAPABILITY``. Inductor's FX graph key (torch 2.13.0) has none of them, so a
    cache moved to another CPU (a restored CI cache) or an override would otherwise serve
    kernels generated for another ISA."""
    return (_picked_vec_isa(), torch.backends.cpu.get_cpu_capability(), config.get("ATEN_CPU_CAPABILITY"))


def key_material() -> tuple:
    """Everything outside the graph that changes what a neuron compile produces."""
    topology = _core.topology()
    # Parsed values: "1" and "true" are one setting, and must give one key.
    flags = tuple(config.value(name) for name in (
        "NEURON_CC_FLAGS", "NEURON_RT_STOCHASTIC_ROUNDING_EN", "TORCHNEURON_INT64_AS_INT32",
        "TORCHNEURON_NATIVE_INT64", "TORCHNEURON_CPU_FALLBACK", "TORCHNEURON_COST_MODEL"))
    return ("torchneuron", torchneuron.__version__, torch.__version__, topology.chip.name,
            topology.lnc, flags, host_isa(), _package_fingerprint())


def fingerprinted_sources() -> list[Path]:
    """The sources generated code depends on beyond the graph: the compiler's own, and the
    FakeTensor rule compiled graphs take convolution strides from (Inductor's key does not
    cover the strides it plans, so an entry planned under another rule would be reused)."""
    return [*sorted(Path(__file__).parent.glob("*.py")), Path(fake_conv.__file__)]


@functools.cache
def _package_fingerprint() -> str:
    """Hash of :func:`fingerprinted_sources`: a changed pass must not reuse old entries."""
    digest = hashlib.sha256()
    for path in fingerprinted_sources():
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


class NeuronCacheKey(CustomGraphPass):
    """A no-op post-grad pass whose ``uuid`` puts :func:`key_material` in Inductor's key."""

    def __init__(self) -> None:
        self._uuid = hashlib.sha256(repr(key_material()).encode()).hexdigest()

    def __call__(self, graph: torch.fx.Graph) -> None:
        return None

    def uuid(self) -> str:
        return self._uuid


# --- one process's use of one cache directory ------------------------------------------

class _Session:
    """A private working directory for Inductor, filled from the verified entries of one
    persistent cache (or from nothing, when that cache cannot be used)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.store = _open_store(root)
        self.work = Path(tempfile.mkdtemp(prefix="torchneuron-compile-"))
        atexit.register(shutil.rmtree, self.work, True)
        self.staged: dict[str, tuple[int, int]] = {}  # work-dir file -> (size, mtime_ns) already in the store
        self.seen: dict[str, Identity] = {}  # store entry -> identity last read
        if self.store is not None and not self.store.writable:
            warn_once(("read-only", root),
                      f"{describe(root)}: the compile cache is not writable "
                      f"({self.store.write_error}); its entries are used, but graphs compiled by this "
                      f"process are not saved. Make it writable or set {STORE_SETTING} to a writable "
                      "directory to keep them.")

    def pull(self) -> None:
        """Copies the store's new verified entries into the working directory."""
        if self.store is None:
            return
        try:
            self.store.check_private()
        except CacheUnavailable as unavailable:  # removed meanwhile, and cannot be made again
            warn_once(("unavailable", self.root), str(unavailable))
            self.store = None
            return
        rejected = 0
        for relpath, identity, payload in self.store.scan(self.seen):
            self.seen[relpath] = identity
            if payload is None:
                rejected += 1
                continue
            path = self.work / relpath
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            temporary = path.with_name(f".{path.name}.pull")
            with open(temporary, "wb") as f:
                f.write(payload)
            os.chmod(temporary, 0o700)  # shared libraries and modules: read and mapped by this user only
            os.replace(temporary, path)
            st = path.stat()
            self.staged[relpath] = (st.st_size, st.st_mtime_ns)
        if rejected:
            warn_once(("rejected", self.root),
                      f"{describe(self.root)}: {rejected} compile cache entries failed "
                      "verification (damaged, changed, moved, or sealed with another key than "
                      f"{cache_secret.SETTING}'s) and were not loaded; those graphs are compiled again "
                      "and their entries replaced.")

    def push(self) -> None:
        """Seals and stores the files Inductor wrote in the working directory."""
        for relpath, signature in self._new_files():
            self.staged[relpath] = signature
            if self.store is None or not self.store.writable:
                continue
            try:
                payload = (self.work / relpath).read_bytes()
                self.seen[relpath] = self.store.write(relpath, payload)
            except OSError as error:
                if SealedStore.store_wide(error):
                    self.store.write_error = error.strerror
                warn_once(("unsaved", self.root),
                          f"{describe(self.root)}: could not save a compiled graph to the "
                          f"compile cache ({error.strerror}: {relpath}); it is compiled again by later "
                          "processes.")

    def forget_new_files(self) -> None:
        """After a failed compile: what it left (possibly partial) is never published."""
        for relpath, signature in self._new_files():
            self.staged[relpath] = signature

    def _new_files(self) -> Iterator[tuple[str, tuple[int, int]]]:
        for dirpath, dirnames, filenames in os.walk(self.work):
            rel_dir = os.path.relpath(dirpath, self.work)
            if rel_dir == ".":
                dirnames[:] = [d for d in dirnames if d != "locks" and not d.startswith(".")]
            else:
                dirnames[:] = [d for d in dirnames if not d.startswith(".")]
            for name in filenames:
                relpath = name if rel_dir == "." else f"{rel_dir}/{name}"
                try:
                    check_relpath(relpath)
                    st = os.lstat(os.path.join(dirpath, name))
                except (OSError, ValueError):
                    continue
                signature = (st.st_size, st.st_mtime_ns)
                if stat.S_ISREG(st.st_mode) and self.staged.get(relpath) != signature:
                    yield relpath, signature


def describe(root: Path) -> str:
    """Where the cache directory ``root`` comes from, for messages."""
    if config.get(STORE_SETTING):
        return f"{STORE_SETTING}={str(root)!r}"
    return (f"the default compile cache directory {str(root)!r} ({STORE_SETTING} is unset; the "
            "default is under XDG_CACHE_HOME or ~/.cache)")


def _open_store(root: Path) -> SealedStore | None:
    """The persistent cache at ``root``, or None (after one warning) if it cannot be used.
    A cache others could write to raises :class:`UnsafeCacheError`."""
    allow_shared = config.get_flag(ALLOW_SHARED_SETTING)
    try:
        key = cache_secret.load_or_create(key_file())
        return SealedStore(root, key, describe=describe(root), setting=STORE_SETTING,
                           allow_shared=allow_shared)
    except CacheUnavailable as unavailable:
        warn_once(("unavailable", root), str(unavailable))
        return None


def precompiled_headers_private() -> bool:
    """Whether Inductor's precompiled-header directory (torch 2.13.0: ``codecache._HEADER_DIR``,
    under its default cache dir in the shared temp dir whatever ``TORCHINDUCTOR_CACHE_DIR``
    says) and its parent are absent or private to this user. Every C++ kernel compile
    includes the headers there; when someone else could have put them there, neuron
    compiles do without them (slower cold compiles, nothing loaded from there)."""
    from torch._inductor import codecache

    header_dir = Path(codecache._HEADER_DIR)
    for directory in (header_dir.parent, header_dir):
        try:
            st = os.lstat(directory)
        except FileNotFoundError:
            continue
        except OSError:
            return False
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
            warn_once(("headers", str(directory)),
                      f"Inductor's precompiled-header directory {str(directory)!r} is not private to you "
                      "(another owner, writable by others, or not a directory); neuron compiles do not "
                      "use precompiled headers.")
            return False
    return True


_sessions: dict[tuple[Path, Path, bool], _Session] = {}  # by cache dir, key file, allow-shared
# Held for a whole compile: Inductor's cache directory is process-wide (an environment
# variable), so compiles into different working directories must not interleave.
_lock = threading.RLock()
_active = threading.local()


@contextlib.contextmanager
def using_cache_dir() -> Iterator[Path]:
    """Points Inductor's caches at this process's private working directory for one
    compile, filled with the persistent cache's verified entries; saves what it wrote."""
    with _lock:
        current = getattr(_active, "work", None)
        if current is not None:  # a compile inside a compile (a lazily compiled backward)
            yield current
            return
        root = cache_dir()
        settings = (root, key_file(), config.get_flag(ALLOW_SHARED_SETTING))
        session = _sessions.get(settings)
        if session is None:
            session = _sessions[settings] = _Session(root)
        session.pull()
        _active.work = session.work
        try:
            with cache_dir_utils.temporary_cache_dir(str(session.work)):
                host_isa()  # Inductor's ISA probes compile here, on first use
                yield session.work
        except BaseException:
            session.forget_new_files()
            raise
        else:
            session.push()
        finally:
            _active.work = None
