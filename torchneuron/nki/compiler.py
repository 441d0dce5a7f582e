"""Legacy ``nki.compiler`` as an importable module (``import neuronxcc.nki.compiler as ncc``).

Its names are those of ``nl.compiler`` (:class:`torchneuron.nki.language.legacy._LegacyCompiler`):
hint decorators are no-ops, ``sbuf``/``psum.auto_alloc()`` are the buffers, and the
manual allocators (removed in NKI 0.2.0) and anything else raise naming the replacement.
"""

from __future__ import annotations

from typing import Any

from torchneuron.nki.language import compiler as _compiler

sbuf = _compiler.sbuf
psum = _compiler.psum
skip_middle_end_transformations = _compiler.skip_middle_end_transformations
enable_stack_allocator = _compiler.enable_stack_allocator
force_auto_alloc = _compiler.force_auto_alloc
no_reorder = _compiler.no_reorder


def __getattr__(name: str) -> Any:
    return getattr(_compiler, name)  # raises AttributeError naming the replacement
