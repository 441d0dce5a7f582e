"""Runs a function right after a module is first imported, without importing it ourselves.

Why: torchneuron adapts parts of torch that a program may never use (DTensor's RNG tracker,
DTensor's sharding strategies); importing them eagerly would cost every program their import
time. :func:`after_import` runs the adaptation at once if the module is already imported,
else as soon as it is (a one-shot ``sys.meta_path`` finder that leaves the module unchanged).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types
import warnings
from collections.abc import Callable


class _AfterImport(importlib.abc.MetaPathFinder):
    """Calls ``callback`` right after module ``name`` has been executed, once."""

    def __init__(self, name: str, callback: Callable[[], object], what: str) -> None:
        self.name, self.callback, self.what = name, callback, what

    def find_spec(self, name: str, path: object, target: object = None) -> importlib.machinery.ModuleSpec | None:
        if name != self.name:
            return None
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module
        callback, what = self.callback, self.what

        def exec_then_call(module: types.ModuleType) -> None:
            exec_module(module)
            try:
                callback()
            except Exception as error:  # noqa: BLE001 - never break importing the module
                warnings.warn(f"torchneuron could not {what} ({error})", RuntimeWarning, stacklevel=2)

        spec.loader.exec_module = exec_then_call  # this module's own loader object
        return spec


_pending: dict[str, _AfterImport] = {}


def after_import(name: str, callback: Callable[[], object], what: str) -> None:
    """Calls ``callback`` now if module ``name`` is imported, else right after its first import.

    ``what`` completes "torchneuron could not ..." in the warning given if ``callback`` fails
    then (importing the module itself never fails because of it). Once per name.
    """
    if name in sys.modules:
        callback()
    elif name not in _pending:
        _pending[name] = finder = _AfterImport(name, callback, what)
        sys.meta_path.insert(0, finder)
