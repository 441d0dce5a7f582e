"""The persistent compile cache of ``backend="neuron"``.

Compiled graphs are stored by Inductor's content-addressed FX graph cache
(key: the graph, its input metadata, Inductor's configuration and the torch
version), kept in a directory of our own (``NEURON_COMPILE_CACHE_URL``,
default ``<user cache dir>/torchneuron/compile``). :class:`NeuronCacheKey`
adds what changes a neuron compile to that key: the modelled target and LNC,
the numerics and fallback switches, and the torchneuron version. Entries made
for another target, other flags or another version therefore never match;
and every file of the cache (graph entries, generated code, compiled kernels)
is checked against a checksum stored beside it before Inductor may load it:
corrupt files, and files no neuron compile wrote, are deleted and rebuilt
(:func:`verify_entries`), never loaded.

Uses ``torch._inductor`` cache internals; checked against torch 2.13.0.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import time
from collections.abc import Iterator
from pathlib import Path

import torch
from torch._inductor.custom_graph_pass import CustomGraphPass
from torch._inductor.runtime import cache_dir_utils

import torchneuron
from torchneuron import config
from torchneuron.device import _core, fake_conv

_CHECKSUM_SUFFIX = ".neuron-sha256"


def cache_dir() -> Path:
    """The cache directory: ``NEURON_COMPILE_CACHE_URL``, else under the user cache dir."""
    explicit = config.get("NEURON_COMPILE_CACHE_URL")
    if explicit:
        if "://" in explicit and not explicit.startswith("file://"):
            raise ValueError(f"NEURON_COMPILE_CACHE_URL={explicit!r}: only local directories are "
                             "supported by torchneuron (use a path or a file:// URL)")
        return Path(explicit.removeprefix("file://")).expanduser().resolve()
    base = config.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "torchneuron" / "compile"


def key_material() -> tuple:
    """Everything outside the graph that changes what a neuron compile produces."""
    topology = _core.topology()
    flags = tuple(config.get(name) for name in (
        "NEURON_CC_FLAGS", "NEURON_RT_STOCHASTIC_ROUNDING_EN", "TORCHNEURON_INT64_AS_INT32",
        "TORCHNEURON_NATIVE_INT64", "TORCHNEURON_CPU_FALLBACK", "TORCHNEURON_COST_MODEL"))
    return ("torchneuron", torchneuron.__version__, torch.__version__, topology.chip.name,
            topology.lnc, flags, _package_fingerprint())


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


# Files verified in this process: (path, size, mtime_ns), so each is hashed once.
_verified: set[tuple[str, int, int]] = set()
# A file without a checksum this old was not written by a neuron compile in progress.
_FOREIGN_AFTER_SECONDS = 120.0


def _cache_files(directory: Path) -> Iterator[Path]:
    for path in directory.rglob("*"):
        if path.is_file() and not path.name.endswith((_CHECKSUM_SUFFIX, ".lock")) and "locks" not in path.parts:
            yield path


def _stamp(path: Path) -> Path:
    return path.with_name(path.name + _CHECKSUM_SUFFIX)


def _checksum(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def seal_entries(directory: Path) -> None:
    """Records a checksum beside each cache file that has none (after a compile)."""
    for path in _cache_files(directory):
        stamp = _stamp(path)
        if not stamp.exists():
            stamp.write_text(_checksum(path))


def verify_entries(directory: Path) -> list[Path]:
    """Deletes cache files whose bytes no longer match their checksum (corrupt), or that
    have none and are not fresh (foreign: not written by a neuron compile); returns them.
    Inductor then compiles those graphs and kernels again instead of loading them."""
    removed = []
    now = time.time()
    for path in _cache_files(directory):
        try:
            stat = path.stat()
            identity = (str(path), stat.st_size, stat.st_mtime_ns)
            if identity in _verified:
                continue
            stamp = _stamp(path)
            if stamp.exists():
                intact = stamp.read_text().strip() == _checksum(path)
            else:
                intact = now - stat.st_mtime < _FOREIGN_AFTER_SECONDS
                if intact:
                    continue  # being written by a compile in progress; sealed when it ends
        except OSError:
            intact = False
            identity = None
        if intact:
            _verified.add(identity)
            continue
        for victim in (path, _stamp(path)):
            with contextlib.suppress(OSError):
                victim.unlink()
        removed.append(path)
    return removed


@contextlib.contextmanager
def using_cache_dir() -> Iterator[Path]:
    """Points Inductor's caches at the neuron cache directory for one compile."""
    directory = cache_dir()
    directory.mkdir(parents=True, exist_ok=True)
    verify_entries(directory)
    if os.environ.get("TORCHINDUCTOR_CACHE_DIR") == str(directory):
        yield directory
    else:
        with cache_dir_utils.temporary_cache_dir(str(directory)):
            yield directory
    seal_entries(directory)
