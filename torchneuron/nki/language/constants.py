"""``nki.language.constants``: dtype sizes (``from neuronxcc.nki.language.constants import sizeinbytes``)."""

from __future__ import annotations

from typing import Any

from torchneuron.nki.dtypes import resolve

__all__ = ["sizeinbytes"]


def sizeinbytes(dtype: Any) -> int:
    """Bytes one element of ``dtype`` takes on the device (``nl.bfloat16`` -> 2, ``nl.tfloat32`` -> 4)."""
    return resolve(dtype).itemsize
