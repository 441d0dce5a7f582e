"""``nki.typing`` (``nt``): tensor type annotations and legacy benchmark placeholders.

Current NKI annotates kernel parameters with shapes, ``X: nt.tensor[128, 512]``
(nki-api-facts.md: 1). Legacy NKI also passed placeholders such as
``nt.tensor[[8192, 4096], nl.bfloat16]`` to ``nki.benchmark`` instead of data
(nki-api-facts.md: 10). Both spellings give a :class:`TensorType`, which knows
its shape and dtype and can make a host array for a simulated run.

Decisions (facts silent): a dtype may follow the dims (``nt.tensor[128, 512,
nl.float32]``); without one the dtype is unspecified (``None``). Annotations are
documentation: the simulator does not check arguments against them, but
:meth:`TensorType.check` is there for callers that want to.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from torchneuron.nki import dtypes as _dtypes
from torchneuron.nki.dtypes import NkiDType

__all__ = ["tensor", "mutable_tensor", "TensorType"]


class TensorType:
    """A tensor's static type: ``shape`` (ints), ``dtype`` (an NkiDType, or None if unspecified) and
    whether the kernel may write it (``nt.mutable_tensor[...]``)."""

    __slots__ = ("shape", "dtype", "mutable")

    def __init__(self, shape: tuple[int, ...], dtype: NkiDType | None = None, mutable: bool = False) -> None:
        self.shape = tuple(shape)
        self.dtype = dtype
        self.mutable = mutable

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    def numpy(self, fill: str = "zeros", seed: int = 0) -> np.ndarray:
        """A host array of this type (storage dtype; float32 when unspecified) for a simulated run.

        ``fill``: ``"zeros"`` or ``"random"`` (uniform [0, 1), reproducible with ``seed``).
        """
        dtype = self.dtype or _dtypes.DTYPES["float32"]
        if fill == "zeros":
            values = np.zeros(self.shape, dtype=np.float32)
        elif fill == "random":
            values = np.random.default_rng(seed).random(self.shape, dtype=np.float32)
        else:
            raise ValueError(f"fill must be 'zeros' or 'random', got {fill!r}")
        return _dtypes.to_storage(values, dtype)

    def check(self, value: Any, name: str = "argument") -> None:
        """Raise ``TypeError`` when ``value`` (anything with ``.shape``/``.dtype``) does not match."""
        shape = tuple(getattr(value, "shape", ()))
        if shape != self.shape:
            raise TypeError(f"{name} has shape {list(shape)}, annotated as {self!r}")
        if self.dtype is not None and _dtypes.resolve(getattr(value, "dtype")) is not self.dtype:
            raise TypeError(f"{name} has dtype {getattr(value, 'dtype')}, annotated as {self!r}")

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, TensorType):
            return NotImplemented
        return self.shape == other.shape and self.dtype is other.dtype and self.mutable == other.mutable

    def __hash__(self) -> int:
        return hash((self.shape, self.dtype, self.mutable))

    def __repr__(self) -> str:
        dims = ", ".join(map(str, self.shape))
        kind = "mutable_tensor" if self.mutable else "tensor"
        return f"nt.{kind}[{dims}{', ' + repr(self.dtype) if self.dtype is not None else ''}]"


def _is_dim(value: Any) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


class _TensorMeta(type):
    def __instancecheck__(cls, obj: Any) -> bool:
        from torchneuron.nki.tensor import NkiTensor

        return isinstance(obj, (NkiTensor, TensorType))


class tensor(metaclass=_TensorMeta):
    """``nt.tensor[128, 512]`` / ``nt.tensor[[8192, 4096], nl.bfloat16]``: a :class:`TensorType`.

    Bare ``nt.tensor`` is also a valid (shape-less) annotation.
    """

    _mutable = False

    def __class_getitem__(cls, key: Any) -> TensorType:
        return _tensor_type(key, cls._mutable)

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        raise TypeError(f"nt.{cls.__name__} is an annotation: write nt.{cls.__name__}[128, 512] (or a legacy "
                        f"placeholder nt.{cls.__name__}[[8192, 4096], nl.bfloat16])")


class mutable_tensor(tensor):
    """``x: nt.mutable_tensor`` (or ``nt.mutable_tensor[128, 512]``): a kernel parameter the kernel writes.

    Legacy NKI refused writes to parameters not annotated so; here every HBM argument may be
    written (the annotation is documentation, as ``nt.tensor``'s shapes are).
    """

    _mutable = True


def _tensor_type(key: Any, mutable: bool) -> TensorType:
    items = list(key) if isinstance(key, tuple) else [key]
    dims: list[int] = []
    dtype: NkiDType | None = None
    for i, item in enumerate(items):
        if isinstance(item, (list, tuple)) and not dims and i == 0:
            dims.extend(item)
        elif _is_dim(item) and dtype is None:
            dims.append(item)
        elif dtype is None and not _is_dim(item) and dims:
            try:
                dtype = _dtypes.resolve(item)
            except ValueError as exc:
                raise TypeError(f"nt.{'mutable_tensor' if mutable else 'tensor'}[...]: {exc}") from None
        else:
            raise TypeError(f"nt.tensor[...] takes dims then an optional dtype, got {key!r}")
    if not dims or not all(_is_dim(d) and int(d) > 0 for d in dims):
        raise TypeError(f"nt.tensor[...] needs positive int dims, e.g. nt.tensor[128, 512]; got {key!r}")
    return TensorType(tuple(int(d) for d in dims), dtype, mutable)
