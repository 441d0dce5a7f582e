"""AWS's NKI module names (``nki``, ``neuronxcc.nki``...) served by ``torchneuron.nki``.

AWS kernels begin with ``import neuronxcc.nki.language as nl`` (legacy) or
``import nki.language as nl`` (current). :func:`install` adds an import hook
(a ``sys.meta_path`` finder) that answers those names with torchneuron's own
modules - the same module objects, so ``nki.language is torchneuron.nki.language``
and tiles, dtypes and errors are one set of classes whichever name a file used.

A real installation always wins: the hook answers a top-level name (``nki``,
``neuronxcc``) only when no other finder on ``sys.meta_path`` can import it, and a
submodule only under a top-level module it answered itself, so an installed
Neuron SDK (or a ``neuronxcc`` without the ``nki`` namespace, Neuron 2.34+) is
never shadowed. Names with no torchneuron counterpart (compiler internals such as
``neuronxcc.starfish``) fail with a ``ModuleNotFoundError`` saying so.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import threading
import types
from typing import Any, Sequence

__all__ = ["ALIASES", "NkiAliasFinder", "install", "uninstall", "installed"]

# AWS module name -> torchneuron module answering it (None: an empty namespace package).
ALIASES: dict[str, str | None] = {
    "nki": "torchneuron.nki",
    "nki.language": "torchneuron.nki.language",
    "nki.language.constants": "torchneuron.nki.language.constants",
    "nki.isa": "torchneuron.nki.isa",
    "nki.isa.constants": "torchneuron.nki.isa.constants",
    "nki.typing": "torchneuron.nki.typing",
    "nki.dtype": "torchneuron.nki.dtype",
    "nki.compiler": "torchneuron.nki.compiler",
    "neuronxcc": None,
    "neuronxcc.nki": "torchneuron.nki",
    "neuronxcc.nki.language": "torchneuron.nki.language",
    "neuronxcc.nki.language.constants": "torchneuron.nki.language.constants",
    "neuronxcc.nki.isa": "torchneuron.nki.isa",
    "neuronxcc.nki.isa.constants": "torchneuron.nki.isa.constants",
    "neuronxcc.nki.typing": "torchneuron.nki.typing",
    "neuronxcc.nki.compiler": "torchneuron.nki.compiler",
}
_TOP_LEVEL = ("nki", "neuronxcc")
_MARK = "__torchneuron_alias__"  # set on every module object this hook answered a name with


class _AliasLoader(importlib.abc.Loader):
    """Hands out the torchneuron module itself (no second copy of any module)."""

    def __init__(self, target: str | None) -> None:
        self.target = target

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        if self.target is None:
            module = types.ModuleType(spec.name, "AWS's neuronxcc namespace, answered by torchneuron.nki.aliases")
            module.__path__ = []  # a package: its submodules come from this hook
            setattr(module, _MARK, True)
            return module
        module = importlib.import_module(self.target)
        _answered.add(spec.name)
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        """Nothing to run: the target module is already imported."""


_answered: set[str] = set()  # alias names this hook has answered (their modules are torchneuron's)


class NkiAliasFinder(importlib.abc.MetaPathFinder):
    """Answers :data:`ALIASES` names unless a real package of that name exists."""

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: types.ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        top = fullname.partition(".")[0]
        if top not in _TOP_LEVEL:
            return None
        if fullname == top:
            if _found_elsewhere(self, fullname):
                return None  # a real nki / neuronxcc is installed: it wins
        elif not _is_alias(sys.modules.get(top), top):
            return None  # a submodule of a real package: not ours to answer
        if fullname not in ALIASES:
            raise ModuleNotFoundError(
                f"No module named {fullname!r}: torchneuron answers AWS's NKI modules "
                f"({', '.join(n for n in ALIASES if ALIASES[n])}) with torchneuron.nki, and "
                f"{fullname!r} is not one of them (compiler internals have no counterpart)", name=fullname)
        return importlib.machinery.ModuleSpec(fullname, _AliasLoader(ALIASES[fullname]),
                                              is_package=ALIASES[fullname] is None or
                                              any(n.startswith(fullname + ".") for n in ALIASES))


def _is_alias(module: Any, name: str) -> bool:
    return module is not None and (getattr(module, _MARK, False) or name in _answered)


_probing = threading.local()


def _found_elsewhere(me: NkiAliasFinder, name: str) -> bool:
    """True when another finder on ``sys.meta_path`` can import ``name`` (a real installation)."""
    if getattr(_probing, "active", False):
        return False
    _probing.active = True
    try:
        for finder in list(sys.meta_path):
            if finder is me or not hasattr(finder, "find_spec"):
                continue
            try:
                spec = finder.find_spec(name, None)
            except (ImportError, ValueError):
                continue
            # A bare directory of that name on sys.path (a namespace package: a
            # user's folder of kernels called ``nki``, or pytest's test dir) is
            # not an installation.
            if spec is not None and spec.origin is not None:
                return True
        return False
    finally:
        _probing.active = False


_finder = NkiAliasFinder()


def install() -> None:
    """Make ``import nki`` / ``import neuronxcc.nki...`` find torchneuron.nki (idempotent).

    The hook goes first on ``sys.meta_path`` so it sees a submodule name (``nki.isa``)
    before the path finder could load a second copy of a torchneuron file under it.
    """
    if _finder not in sys.meta_path:
        sys.meta_path.insert(0, _finder)


def uninstall() -> None:
    """Remove the hook and forget the alias modules it answered (for tests)."""
    if _finder in sys.meta_path:
        sys.meta_path.remove(_finder)
    for name in list(sys.modules):
        if name.partition(".")[0] in _TOP_LEVEL and _is_alias(sys.modules[name], name):
            del sys.modules[name]
    _answered.clear()


def installed() -> bool:
    return _finder in sys.meta_path
