"""The compile cache as an attacker and an unlucky operator meet it: planted and foreign
entries are never loaded, foreign files never deleted, unusable paths reported by name.

Attacks are planted in every layout a cache directory may have (torchneuron's sealed
``torchneuron-compile-v1/entries`` and Inductor's plain layout with ``.neuron-sha256``
stamps, which earlier versions read), so each would run if any layout were trusted.
Planted code creates a marker file if it ever runs; every test checks it does not exist.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import shutil
import subprocess
import sys
import textwrap
import time
import warnings
from pathlib import Path

import pytest
import torch
from compile_support import _fresh_compile_state, run_child  # noqa: F401

from torchneuron import testing
from torchneuron.compiler import NeuronCompileWarning, UnsafeCacheError, cache, cache_secret, cache_store
from torchneuron import config

X = torch.linspace(-2, 2, 64)


def graph_a(x):
    return torch.sin(2 * x + 1)


def graph_b(x):
    return torch.cos(3 * x - 1)


def graph_c(x):
    return torch.tanh(x) * 5


def assert_computes(fn, out):
    """``out`` is ``fn``'s result (Inductor's vectorized sin/cos/tanh differ from ATen's by a
    few ulp; another graph's result would differ by O(1))."""
    torch.testing.assert_close(out.cpu(), fn(X), rtol=1e-5, atol=1e-6)


def inner(error: BaseException) -> BaseException:
    """The backend's own exception inside Dynamo's ``BackendCompilerFailed``."""
    return getattr(error, "inner_exception", None) or error


def compile_once(fn, root: Path, key: Path, **settings):
    """Compiles and runs ``fn`` in this process against the cache at ``root``, as a fresh
    process would (Dynamo reset; Inductor's in-memory caches are cleared per compile)."""
    torch._dynamo.reset()
    torch.neuron.reset_compile_metrics()
    with config.override(NEURON_COMPILE_CACHE_URL=str(root), TORCHNEURON_COMPILE_CACHE_KEY_FILE=str(key),
                         **settings):
        out = torch.compile(fn, backend="neuron")(X.to("neuron"))
    return out, torch.neuron.compile_metrics()


class Template:
    """A cache holding graphs A and B, compiled once per module; tests work on copies."""

    def __init__(self, root: Path, key: Path, keys: dict[str, str]) -> None:
        self.root, self.key, self.keys = root, key, keys

    def copy(self, destination: Path) -> Path:
        shutil.copytree(self.root, destination, symlinks=True)
        return destination


def fx_key_dirs(root: Path) -> set[str]:
    return {p.name for p in root.rglob("fxgraph/*/*") if p.is_dir()}


@pytest.fixture(scope="module")
def template(tmp_path_factory):
    base = tmp_path_factory.mktemp("template")
    root, key = base / "cache", base / "key"
    keys = {}
    for name, fn in (("a", graph_a), ("b", graph_b)):
        before = fx_key_dirs(root) if root.exists() else set()
        out, metrics = compile_once(fn, root, key)
        assert_computes(fn, out)
        (keys[name],) = fx_key_dirs(root) - before  # one inference graph each
    torch._dynamo.reset()
    return Template(root, key, keys)


# --- what gets planted ---------------------------------------------------------------

def payload_pickle(marker: Path) -> bytes:
    class Payload:
        def __reduce__(self):
            return (exec, (f"open({str(marker)!r}, 'w').close()",))

    return pickle.dumps(Payload())


def payload_module(marker: Path) -> bytes:
    return f"open({str(marker)!r}, 'w').close()\n".encode()


def payload_library(marker: Path, work: Path) -> bytes | None:
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        return None
    source = work / "payload.c"
    source.write_text('#include <stdio.h>\n__attribute__((constructor)) static void run(void) '
                      f'{{ FILE *f = fopen("{marker}", "w"); if (f) fclose(f); }}\n')
    subprocess.run([compiler, "-shared", "-fPIC", "-o", str(work / "payload.so"), str(source)], check=True)
    return (work / "payload.so").read_bytes()


def entry_files(root: Path, fx_key: str) -> list[Path]:
    """Graph entries of ``fx_key`` in every layout under ``root`` (not their stamps)."""
    return [p for d in root.rglob(f"fxgraph/*/{fx_key}") for p in d.iterdir()
            if p.is_file() and not p.name.endswith(".neuron-sha256")]


def stamp_of(path: Path) -> Path:
    return path.with_name(path.name + ".neuron-sha256")


def plant(path: Path, data: bytes, stamp: str, mtime: float | None = None) -> None:
    """Writes ``data`` at ``path``; ``stamp``: "none" removes the stamp beside it, "unkeyed"
    rewrites it to the SHA-256 of the new bytes (what anyone can compute)."""
    if path.is_symlink():
        path.unlink()
    path.write_bytes(data)
    if stamp == "unkeyed":
        stamp_of(path).write_text(hashlib.sha256(data).hexdigest())
    elif stamp_of(path).exists() or stamp_of(path).is_symlink():
        stamp_of(path).unlink()
    if mtime is not None:
        os.utime(path, (mtime, mtime))


def forged_seals(directory: Path, data: bytes, relpath: str) -> None:
    """Entries in torchneuron's format whose seal anyone could make: an unkeyed SHA-256
    where the MAC goes, and a MAC under another key."""
    magic = f"torchneuron-cache-{cache_store.FORMAT}\n".encode()
    (directory / "0unkeyed").write_bytes(magic + hashlib.sha256(data).digest() + data)
    (directory / "0otherkey").write_bytes(cache_store.seal(b"k" * 32, relpath, data))


VARIANTS = ["no_stamp_future_mtime", "stamp_removed_fresh", "stamp_rewritten", "forged_seals",
            "symlinked_entry", "symlinked_stamp", "module_replaced", "library_replaced"]


@pytest.mark.parametrize("variant", VARIANTS)
def test_planted_code_never_runs(template, tmp_path, variant):
    """Graph A's cache entry (pickle), its generated module or its kernel library replaced:
    nothing planted runs, nothing is written through a symbolic link, and A is compiled
    again (a miss) and computes A."""
    root = template.copy(tmp_path / "cache")
    marker, outside = tmp_path / "PLANTED-CODE-RAN", tmp_path / "outside"
    outside.mkdir()
    entries = entry_files(root, template.keys["a"])
    assert entries
    for index, entry in enumerate(entries):
        relpath = str(entry.relative_to(root / cache_store.SUBDIR / cache_store.ENTRIES)) \
            if cache_store.SUBDIR in entry.parts else None
        if variant == "no_stamp_future_mtime":
            plant(entry, payload_pickle(marker), "none", mtime=time.time() + 86400)
        elif variant == "stamp_removed_fresh":
            plant(entry, payload_pickle(marker), "none")
        elif variant == "stamp_rewritten":
            plant(entry, payload_pickle(marker), "unkeyed")
        elif variant == "forged_seals":
            entry.unlink()
            forged_seals(entry.parent, payload_pickle(marker), relpath or entry.name)
        elif variant == "symlinked_entry":
            target = outside / f"payload-{len(list(outside.iterdir()))}"
            target.write_bytes(payload_pickle(marker))
            entry.unlink()
            entry.symlink_to(target)
            stamp_of(entry).write_text(hashlib.sha256(target.read_bytes()).hexdigest())
        elif variant == "symlinked_stamp":
            # A dangling link at the entry: a compile writing it through the link would
            # create a file outside the cache.
            entry.unlink()
            entry.symlink_to(outside / f"entry-{index}")
    if variant == "symlinked_stamp":
        # ... and at the stamp of every file (made fresh): sealing through them would too.
        files = [p for p in root.rglob("*") if p.is_file() and not p.is_symlink()
                 and not p.name.endswith(".neuron-sha256") and p.name != cache_store.MARKER]
        for index, path in enumerate(files):
            stamp_of(path).unlink(missing_ok=True)
            stamp_of(path).symlink_to(outside / f"stamp-{index}")
            os.utime(path)
    if variant == "module_replaced":
        modules = [p for p in root.rglob("*.py")]
        assert modules
        for module in modules:
            plant(module, payload_module(marker), "unkeyed")
    if variant == "library_replaced":
        library = payload_library(marker, outside)
        if library is None:
            pytest.skip("no C compiler to build the planted library")
        kernels = [p for p in root.rglob("*.so") if "chk_kernel" not in
                   (p.with_suffix(".cpp").read_text(errors="replace") if p.with_suffix(".cpp").exists() else "")]
        assert kernels
        for kernel in kernels:
            plant(kernel, library, "unkeyed")

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NeuronCompileWarning)  # "entries failed verification"
        out, metrics = compile_once(graph_a, root, template.key)
    assert not marker.exists(), f"planted code ran ({variant})"
    assert list(outside.glob("entry-*")) == [] and list(outside.glob("stamp-*")) == []
    assert_computes(graph_a, out)
    if variant not in ("module_replaced", "library_replaced"):  # there the graph entry is intact
        assert metrics["cache_misses"] == 1 and metrics["cache_hits"] == 0


@pytest.mark.parametrize("how", ["copied_over", "merged"])
def test_foreign_entry_is_a_miss(template, tmp_path, how):
    """Graph B's entry (with its valid stamp or seal) copied over graph A's, or merged into
    A's key directory: A still computes A, counted as a miss."""
    root = template.copy(tmp_path / "cache")
    for a_entry in entry_files(root, template.keys["a"]):
        layout = a_entry.parents[3]  # .../<layout>/fxgraph/xx/<key>/<entry>
        (b_entry,) = [e for e in entry_files(root, template.keys["b"]) if e.parents[3] == layout]
        if how == "copied_over":
            shutil.copyfile(b_entry, a_entry)
            if stamp_of(b_entry).exists():
                shutil.copyfile(stamp_of(b_entry), stamp_of(a_entry))
        else:
            shutil.copyfile(b_entry, a_entry.parent / b_entry.name)
            if stamp_of(b_entry).exists():
                shutil.copyfile(stamp_of(b_entry), stamp_of(a_entry.parent / b_entry.name))
            for path in (a_entry, stamp_of(a_entry)):
                path.unlink(missing_ok=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NeuronCompileWarning)
        out, metrics = compile_once(graph_a, root, template.key)
    assert_computes(graph_a, out)
    assert metrics["cache_misses"] == 1 and metrics["cache_hits"] == 0


def test_foreign_files_are_never_deleted(template, tmp_path):
    """A cache directory shared with other tools (e.g. the Neuron compiler's own cache under
    the same variable): every file torchneuron did not write is left as it was, however
    old, wherever it is, including unverifiable files inside torchneuron's own directory."""
    root = template.copy(tmp_path / "cache")
    foreign = {
        "fxgraph/zz/foreign-entry": b"an entry of another tool",
        "neuronxcc-2.16/MODULE_1234/model.neff": b"NEFF",
        "locks/other.lock": b"",
        "notes.txt": b"keep me",
        f"{cache_store.SUBDIR}/{cache_store.ENTRIES}/zz/unsealed": b"not sealed by torchneuron",
        f"{cache_store.SUBDIR}/README": b"user's file",
    }
    long_ago = 1_000_000_000
    for name, data in foreign.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        os.utime(path, (long_ago, long_ago))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NeuronCompileWarning)
        out, _ = compile_once(graph_c, root, template.key)  # a new graph: writes entries
    assert_computes(graph_c, out)
    for name, data in foreign.items():
        path = root / name
        assert path.read_bytes() == data and path.stat().st_mtime == long_ago, name


def test_shared_or_foreign_directory_is_refused(template, tmp_path):
    """A cache directory others can write to, or that another user owns, is refused with an
    error naming NEURON_COMPILE_CACHE_URL; allowed explicitly, it is used, and a planted
    entry in it still never runs."""
    root = template.copy(tmp_path / "cache")
    marker = tmp_path / "PLANTED-CODE-RAN"
    for entry in entry_files(root, template.keys["a"]):
        plant(entry, payload_pickle(marker), "unkeyed")
    root.chmod(0o777)
    with pytest.raises(Exception, match="NEURON_COMPILE_CACHE_URL") as raised:
        compile_once(graph_a, root, template.key)
    assert isinstance(inner(raised.value), UnsafeCacheError)
    assert "can be written by group and others" in str(raised.value)
    assert not marker.exists()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NeuronCompileWarning)
        out, metrics = compile_once(graph_a, root, template.key, TORCHNEURON_COMPILE_CACHE_ALLOW_SHARED="1")
    assert_computes(graph_a, out)
    assert not marker.exists() and metrics["cache_misses"] == 1

    root.chmod(0o700)
    owned = root / cache_store.SUBDIR
    if os.geteuid() != 0:
        pytest.skip("changing the owner of a directory needs root")
    os.chown(owned, 65534, 65534)
    try:
        with pytest.raises(Exception, match="NEURON_COMPILE_CACHE_URL") as raised:
            compile_once(graph_a, root, template.key)
        assert isinstance(inner(raised.value), UnsafeCacheError) and "not to you" in str(raised.value)
    finally:
        os.chown(owned, 0, 0)
    assert not marker.exists()


READ_ONLY_CHILD = """
    import json, warnings, torch
    from torchneuron.compiler import NeuronCompileWarning
    from torchneuron import config
    x = torch.linspace(-2, 2, 64)
    results = {}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for root, name, fn in ((INTACT, "a", lambda x: torch.sin(2 * x + 1)),
                               (INTACT, "c", lambda x: torch.tanh(x) * 5),
                               (PLANTED, "a_planted", lambda x: torch.sin(2 * x + 1))):
            torch._dynamo.reset(); torch.neuron.reset_compile_metrics()
            with config.override(NEURON_COMPILE_CACHE_URL=root):
                out = torch.compile(fn, backend="neuron")(x.to("neuron"))
            torch.testing.assert_close(out.cpu(), fn(x), rtol=1e-5, atol=1e-6)
            results[name] = torch.neuron.compile_metrics()
    results["warnings"] = [str(w.message) for w in caught if issubclass(w.category, NeuronCompileWarning)]
    print(json.dumps(results))
"""


def read_only_prefix() -> list[str]:
    """How to run a child to which read-only files are read-only: root ignores permission
    bits unless its DAC capabilities are dropped."""
    if os.geteuid() != 0:
        return []
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("running as root without setpriv: permission bits cannot be enforced")
    return [setpriv, "--bounding-set=-dac_override,-dac_read_search"]


def test_read_only_cache(template, tmp_path):
    """A cache the user can read but not write: its intact entries are served, new graphs
    compile (not saved) with exactly one warning naming NEURON_COMPILE_CACHE_URL, and a
    planted entry in a read-only cache (which cannot be removed) is never loaded."""
    prefix = read_only_prefix()
    intact = template.copy(tmp_path / "intact")
    planted = template.copy(tmp_path / "planted")
    marker = tmp_path / "PLANTED-CODE-RAN"
    for entry in entry_files(planted, template.keys["a"]):
        plant(entry, payload_pickle(marker), "unkeyed")
    roots = (intact, planted)
    try:
        for root in roots:
            for path in [root, *root.rglob("*")]:
                if not path.is_symlink():
                    path.chmod(0o555 if path.is_dir() else 0o444)
        code = READ_ONLY_CHILD.replace("INTACT", repr(str(intact))).replace("PLANTED", repr(str(planted)))
        env = {k: v for k, v in os.environ.items() if k not in testing._DEVICE_ENV}  # as run_python
        env["TORCHNEURON_COMPILE_CACHE_KEY_FILE"] = str(template.key)
        done = subprocess.run([*prefix, sys.executable, "-c", textwrap.dedent(code)], env=env,
                              capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
        results = json.loads(done.stdout.strip().splitlines()[-1])
    finally:
        for root in roots:
            for path in [root, *root.rglob("*")]:
                if not path.is_symlink():
                    path.chmod(0o700 if path.is_dir() else 0o600)
    assert not marker.exists()
    assert results["a"]["cache_hits"] == 1 and results["c"]["cache_misses"] == 1
    assert results["a_planted"]["cache_misses"] == 1
    about_intact = [w for w in results["warnings"] if str(intact) in w]
    assert len(about_intact) == 1, results["warnings"]
    assert "NEURON_COMPILE_CACHE_URL" in about_intact[0] and "not writable" in about_intact[0]


ISA_CHILD = """
    import json, torch
    x = torch.linspace(-2, 2, 64)
    fn = lambda x: torch.sin(2 * x + 1)
    out = torch.compile(fn, backend="neuron")(x.to("neuron"))
    torch.testing.assert_close(out.cpu(), fn(x), rtol=1e-5, atol=1e-6)
    print(json.dumps(torch.neuron.compile_metrics()))
"""


def test_key_covers_the_vector_isa(monkeypatch):
    """Kernels compiled for one vector ISA are never served to a process using another
    (another CPU, or ATEN_CPU_CAPABILITY): the key differs (across processes: the next test)."""
    with cache.using_cache_dir():  # Inductor's ISA probes run in the private directory
        base = cache.NeuronCacheKey().uuid()
        with config.override(ATEN_CPU_CAPABILITY="default"):
            assert cache.NeuronCacheKey().uuid() != base
        monkeypatch.setattr(cache, "_picked_vec_isa", lambda: "VecAVX2:avx2:256")
        assert cache.NeuronCacheKey().uuid() != base


@pytest.mark.slow  # a compiling process; the key's coverage is tested in-process above
def test_another_vector_isa_misses_across_processes(template, tmp_path):
    """A process using another vector ISA misses the entries of this host's and compiles its own."""
    root = template.copy(tmp_path / "cache")  # graph A compiled for this host's ISA
    metrics = run_child(ISA_CHILD, {"NEURON_COMPILE_CACHE_URL": str(root),
                                    "TORCHNEURON_COMPILE_CACHE_KEY_FILE": str(template.key),
                                    "ATEN_CPU_CAPABILITY": "default"})
    assert metrics["cache_misses"] == 1 and metrics["cache_hits"] == 0


# --- unusable paths --------------------------------------------------------------------

@pytest.fixture
def regular_file(tmp_path):
    path = tmp_path / "a-file"
    path.write_text("not a directory")
    return path


@pytest.mark.parametrize("setting", ["cache_below_file", "cache_is_file", "default_below_file", "key_below_file"])
def test_unusable_cache_path_warns_and_compiles(tmp_path, regular_file, setting):
    """An unusable cache or key path (below a regular file, as an unwritable home is):
    one warning naming the variable, and the graph compiles without the persistent cache."""
    settings = {"cache_below_file": dict(NEURON_COMPILE_CACHE_URL=str(regular_file / "cache")),
                "cache_is_file": dict(NEURON_COMPILE_CACHE_URL=str(regular_file)),
                "default_below_file": dict(NEURON_COMPILE_CACHE_URL=None, XDG_CACHE_HOME=str(regular_file / "c")),
                "key_below_file": dict(NEURON_COMPILE_CACHE_URL=str(tmp_path / "cache"),
                                       TORCHNEURON_COMPILE_CACHE_KEY_FILE=str(regular_file / "key"))}[setting]
    names = {"cache_below_file": ["NEURON_COMPILE_CACHE_URL"], "cache_is_file": ["NEURON_COMPILE_CACHE_URL"],
             "default_below_file": ["NEURON_COMPILE_CACHE_URL", "XDG_CACHE_HOME"],
             "key_below_file": ["TORCHNEURON_COMPILE_CACHE_KEY_FILE"]}[setting]
    torch._dynamo.reset()
    with config.override(**settings), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = torch.compile(graph_c, backend="neuron")(X.to("neuron"))
    assert_computes(graph_c, out)
    ours = [str(w.message) for w in caught if issubclass(w.category, NeuronCompileWarning)]
    assert len(ours) == 1, ours
    assert all(name in ours[0] for name in names), ours[0]
    assert "without the persistent compile cache" in ours[0]
    assert regular_file.read_text() == "not a directory"


@pytest.mark.parametrize("problem", ["readable_by_others", "symlink", "wrong_size"])
def test_unsafe_key_file_is_refused(tmp_path, problem):
    key = tmp_path / "key"
    if problem == "readable_by_others":
        key.write_bytes(os.urandom(32))
        key.chmod(0o644)
    elif problem == "symlink":
        (tmp_path / "real").write_bytes(os.urandom(32))
        (tmp_path / "real").chmod(0o600)
        key.symlink_to(tmp_path / "real")
    else:
        key.write_bytes(b"short")
        key.chmod(0o600)
    torch._dynamo.reset()
    with config.override(TORCHNEURON_COMPILE_CACHE_KEY_FILE=str(key), NEURON_COMPILE_CACHE_URL=str(tmp_path / "c")):
        with pytest.raises(Exception, match="TORCHNEURON_COMPILE_CACHE_KEY_FILE") as raised:
            torch.compile(graph_c, backend="neuron")(X.to("neuron"))
    assert isinstance(inner(raised.value), UnsafeCacheError)


def test_key_file_is_created_private(tmp_path):
    key = tmp_path / "private" / "dir" / "key"
    with config.override(TORCHNEURON_COMPILE_CACHE_KEY_FILE=str(key)):
        first = cache_secret.load_or_create(cache.key_file())
        assert cache_secret.load_or_create(cache.key_file()) == first and len(first) == 32
    assert key.stat().st_mode & 0o777 == 0o600 and key.parent.stat().st_mode & 0o777 == 0o700


def test_unusable_debug_dir_warns_and_compiles(regular_file):
    torch._dynamo.reset()
    with config.override(TORCH_NEURONX_DEBUG_DIR=str(regular_file / "debug")), \
            pytest.warns(NeuronCompileWarning, match="TORCH_NEURONX_DEBUG_DIR"):
        out = torch.compile(graph_a, backend="neuron")(X.to("neuron"))
    assert_computes(graph_a, out)
    assert regular_file.read_text() == "not a directory"


def test_precompiled_headers_only_from_a_private_directory(tmp_path, monkeypatch):
    """Every C++ kernel compile includes Inductor's precompiled headers, which live outside
    the cache directory: used only from a directory nobody else can write."""
    from torch._inductor import codecache

    headers = tmp_path / "torchinductor_user" / "precompiled_headers"
    monkeypatch.setattr(codecache, "_HEADER_DIR", str(headers))
    assert cache.precompiled_headers_private()  # absent: Inductor creates it, as the user
    headers.mkdir(parents=True, mode=0o700)
    headers.parent.chmod(0o700)
    assert cache.precompiled_headers_private()
    headers.parent.chmod(0o777)
    with pytest.warns(NeuronCompileWarning, match="precompiled-header directory"):
        assert not cache.precompiled_headers_private()
