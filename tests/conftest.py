"""Session-wide isolation for the whole suite.

Tests compile with torch.compile(backend="neuron") in many directories; the
compile cache and its key file default to the user's ~/.cache and ~/.config.
A test run must not write there, so unless the caller chose locations, the
session points both settings at a temporary directory (inherited by the
interpreters tests start) and removes it at the end.
"""

import os
import shutil
import tempfile

_ISOLATED = ("NEURON_COMPILE_CACHE_URL", "TORCHNEURON_COMPILE_CACHE_KEY_FILE")
_made: list[str] = []


def pytest_configure(config):
    if all(os.environ.get(name) for name in _ISOLATED):
        return
    root = tempfile.mkdtemp(prefix="torchneuron-tests-")
    _made.append(root)
    os.environ.setdefault("NEURON_COMPILE_CACHE_URL", os.path.join(root, "compile-cache"))
    os.environ.setdefault("TORCHNEURON_COMPILE_CACHE_KEY_FILE", os.path.join(root, "compile-cache.key"))


def pytest_unconfigure(config):
    while _made:
        shutil.rmtree(_made.pop(), ignore_errors=True)
