"""Which NKI a kernel is written in: legacy ``neuronxcc.nki`` (NKI Beta 1) or current ``nki``.

The two dialects share one implementation, but a few rules differ: the legacy
toolchain (neuronx-cc's NKI front end) legalised some programs that current NKI
refuses, inserting the copies itself (a PSUM tile fed to TensorE or GpSimd, an
integer tile broadcast across partitions; issue 17). torchneuron keeps current
NKI's strict checks for every kernel and applies the legacy legalisation only to
kernels whose source file imports the legacy namespace (``import neuronxcc.nki``,
``from neuronxcc import nki``...), the one unambiguous mark of a Beta 1 kernel: both
namespaces resolve to the same modules here (``torchneuron.nki.aliases``).
"""

from __future__ import annotations

import functools
import linecache
import re
from typing import Any, Callable

__all__ = ["file_imports_legacy", "is_legacy_kernel"]

_LEGACY_IMPORT = re.compile(r"^\s*(?:import\s+neuronxcc\b|from\s+neuronxcc\b)", re.MULTILINE)


@functools.lru_cache(maxsize=256)
def file_imports_legacy(filename: str) -> bool:
    """True when the Python file ``filename`` imports the legacy ``neuronxcc`` namespace."""
    return bool(_LEGACY_IMPORT.search("".join(linecache.getlines(filename))))


def is_legacy_kernel(fn: Callable[..., Any]) -> bool:
    """True when ``fn`` is defined in a file that imports ``neuronxcc`` (a legacy NKI kernel)."""
    code = getattr(getattr(fn, "__wrapped__", fn), "__code__", None)
    if code is None:
        return False
    return file_imports_legacy(code.co_filename)
