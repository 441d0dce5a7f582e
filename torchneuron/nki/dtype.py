"""``nki.dtype``: NKI's dtypes as a module (``import nki.dtype as nt``; ``x: nki.dtype`` as an annotation).

AWS's kernel library annotates dtype parameters with ``nki.dtype`` and its tests take dtypes from
it (``np.zeros(shape, dtype=nt.float8_e4m3)``). These are the same objects as ``nl.bfloat16`` and
friends: NumPy accepts them wherever it takes a dtype.
"""

from __future__ import annotations

from torchneuron.nki.dtypes import DTYPES, NkiDType

__all__ = sorted(DTYPES) + ["NkiDType"]

globals().update(DTYPES)
bool_ = DTYPES["bool_"]
