"""``torchneuron check --migrate``: run CUDA code on neuron without editing it, and write the
rewrite as a unified diff.

The user's own files (the script, and every module imported from under its directory, or
under the working directory for ``-m`` and pytest node ids; never site-packages) are
compiled from their migrated source (:func:`torchneuron.check.cuda_code.migrate`): in
memory only, with the file's own name and unchanged line numbers, so reports and
tracebacks name the user's lines. Nothing is written next to them (no bytecode cache:
a later plain run must not load migrated code). :func:`unified_diff` turns the
migrations into one patch the user can read and apply; check writes it to a new file,
never over a user's file.
"""

from __future__ import annotations

import builtins
import difflib
import importlib.abc
import importlib.machinery
import os
import sys
import tokenize
import types
from typing import Any

from torchneuron.check import cuda_code

__all__ = ["DIFF_MARKER", "Session", "UserFiles", "unified_diff"]

DIFF_MARKER = "# generator: torchneuron-check-migrate"  # check may replace its own diffs only
_MAX_FILE_BYTES = 4 * 2**20
_MAX_FILES = 2000


class UserFiles:
    """Which files are the user's: under ``root``, not an installed package, not ours."""

    def __init__(self, root: str) -> None:
        import torch

        import torchneuron

        self.root = os.path.realpath(root)
        self.excluded = tuple(os.path.realpath(os.path.dirname(m.__file__)) + os.sep
                              for m in (torch, torchneuron, os))

    def __contains__(self, path: str | None) -> bool:
        if not isinstance(path, str) or not path.endswith(".py") or not os.path.isfile(path):
            return False  # torch.ops has __file__ "_ops.py": not a file
        real = os.path.realpath(path)
        parts = real.split(os.sep)
        return (real.startswith(self.root + os.sep) and not real.startswith(self.excluded)
                and "site-packages" not in parts and "dist-packages" not in parts)


def _read_source(path: str) -> str:
    with tokenize.open(path) as f:  # honours the file's coding cookie, as import does
        return f.read()


class _Migrations:
    """Each user file's migration, made once (the import hook and the report share them)."""

    def __init__(self) -> None:
        self.by_path: dict[str, cuda_code.Migration] = {}
        self.unreadable: dict[str, str] = {}

    def get(self, path: str) -> cuda_code.Migration | None:
        real = os.path.realpath(path)
        if real not in self.by_path and real not in self.unreadable:
            try:
                if os.path.getsize(real) > _MAX_FILE_BYTES:
                    raise ValueError(f"larger than {_MAX_FILE_BYTES // 2**20} MiB")
                self.by_path[real] = cuda_code.migrate(_read_source(real), path)
            except (OSError, SyntaxError, UnicodeDecodeError, ValueError) as e:
                self.unreadable[real] = f"{type(e).__name__}: {e}"
        return self.by_path.get(real)


class _MigratingLoader(importlib.machinery.SourceFileLoader):
    """Compiles a user module from its migrated source; reads and writes no bytecode cache."""

    def __init__(self, fullname: str, path: str, migrations: _Migrations) -> None:
        super().__init__(fullname, path)
        self._migrations = migrations

    def get_code(self, fullname: str) -> types.CodeType:
        path = self.get_filename(fullname)
        migration = self._migrations.get(path)
        source = migration.new if migration is not None else self.get_data(path)
        return compile(source, path, "exec", dont_inherit=True)


class _MigratingFinder(importlib.abc.MetaPathFinder):
    def __init__(self, files: UserFiles, migrations: _Migrations) -> None:
        self.files = files
        self.migrations = migrations

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if (spec is None or type(spec.loader) is not importlib.machinery.SourceFileLoader
                or spec.origin not in self.files):
            return None
        spec.loader = _MigratingLoader(fullname, spec.origin, self.migrations)
        return spec


class Session:
    """The migration state of one check run: install the hook, run, then list and diff."""

    def __init__(self, root: str, migrate: bool) -> None:
        self.files = UserFiles(root)
        self.migrations = _Migrations()
        self.migrate = migrate
        self._finder: _MigratingFinder | None = None

    def __enter__(self) -> "Session":
        if self.migrate:
            self._finder = _MigratingFinder(self.files, self.migrations)
            sys.meta_path.insert(0, self._finder)
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._finder is not None and self._finder in sys.meta_path:
            sys.meta_path.remove(self._finder)

    def run_path(self, path: str) -> dict[str, Any]:
        """Runs the script at ``path`` as ``__main__`` (as :func:`runpy.run_path` does),
        compiled from its migrated source; returns a copy of its globals."""
        migration = self.migrations.get(path)
        source = migration.new if migration is not None else _read_source(path)  # a syntax error: raised below
        code = compile(source, path, "exec", dont_inherit=True)
        module = types.ModuleType("__main__")
        module.__dict__.update(__file__=path, __builtins__=builtins, __spec__=None, __loader__=None,
                               __package__=None, __cached__=None)
        saved = sys.modules.get("__main__")
        sys.modules["__main__"] = module
        try:
            exec(code, module.__dict__)
        finally:
            if saved is not None:
                sys.modules["__main__"] = saved
        return dict(module.__dict__)

    def user_files(self, first: list[str]) -> list[str]:
        """``first`` (the script, module or test file), then every user module loaded so far
        (including any run from its rewrite, e.g. ``-m``'s, which left ``sys.modules``)."""
        paths = [os.path.realpath(p) for p in first if p in self.files]
        loaded = [getattr(module, "__file__", None) for module in list(sys.modules.values())]
        for path in [*loaded, *self.migrations.by_path]:
            if path in self.files and os.path.realpath(path) not in paths:
                paths.append(os.path.realpath(path))
        return paths[:_MAX_FILES]

    def report(self, first: list[str], cwd: str) -> dict[str, Any]:
        """The JSON section: every CUDA-only use in the user's files, and the diff's text."""
        files = self.user_files(first)
        migrations = [m for m in (self.migrations.get(p) for p in files) if m is not None]
        findings = []
        for m in migrations:
            for f in m.findings:
                findings.append({**f.as_dict(), "file": _shown(m.path, cwd),
                                 "rewritten": f.rewritten and self.migrate})
        return {"files_scanned": [_shown(p, cwd) for p in files], "findings": findings,
                "migrated": self.migrate,
                "unparsed": {_shown(p, cwd): why for p, why in self.migrations.unreadable.items()},
                "not_rewritten": {_shown(m.path, cwd): m.error for m in migrations if m.error},
                "diff": unified_diff(migrations, cwd) if self.migrate else ""}


def _shown(path: str, cwd: str) -> str:
    relative = os.path.relpath(os.path.realpath(path), os.path.realpath(cwd))
    return path if relative.startswith("..") else relative


def unified_diff(migrations: list[cuda_code.Migration], cwd: str) -> str:
    """One patch (``a/``, ``b/`` paths relative to ``cwd``) of every changed file, behind a
    header saying how to apply it; empty if nothing changed."""
    parts = []
    for m in migrations:
        if not m.changed:
            continue
        name = _shown(m.path, cwd)
        lines = difflib.unified_diff(m.old.splitlines(keepends=True), m.new.splitlines(keepends=True),
                                     f"a/{name}", f"b/{name}")
        for line in lines:
            parts.append(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n")
    if not parts:
        return ""
    header = (f"{DIFF_MARKER}\n# CUDA-only calls rewritten to their device-generic spelling "
              f"(torch.accelerator, torch.amp, torch.get_device_module()).\n"
              f"# Review, then apply from {os.path.realpath(cwd)}: git apply THIS.diff  (or: patch -p1 < THIS.diff)\n")
    return header + "".join(parts)
