r"""``torch.neuron.FloatStorage`` and the other legacy typed storages, as ``torch.cuda`` has.

PyTorch finds a device's legacy storage classes by name on its device module
(``TypedStorage._get_legacy_storage_class`` looks up ``torch.<device>.FloatStorage``),
so ``tensor.storage_type()`` and ``tensor.storage().type()`` name them, and
``isinstance(tensor.storage(), torch.neuron.FloatStorage)`` holds. The device of a
class is read from its module's last name part (``torch.storage._get_device_from_module``),
so the classes live in module ``torch.neuron``. The same twelve dtypes as torch.cuda
(torch 2.13.0); like CUDA's, they refuse the CPU-only constructors.
"""

from __future__ import annotations

import torch
from torch._utils import classproperty
from torch.storage import _LegacyStorage, _warn_typed_storage_removal

__all__ = [
    "BFloat16Storage",
    "BoolStorage",
    "ByteStorage",
    "CharStorage",
    "ComplexDoubleStorage",
    "ComplexFloatStorage",
    "DoubleStorage",
    "FloatStorage",
    "HalfStorage",
    "IntStorage",
    "LongStorage",
    "ShortStorage",
]

_MODULE = "torch.neuron"  # the device module's name: its last part is the storage's device


class _NeuronLegacyStorage(_LegacyStorage):
    @classmethod
    def from_buffer(cls, *args, **kwargs):
        _warn_typed_storage_removal()
        raise RuntimeError("from_buffer: Not available for neuron storage (a host buffer: "
                           "build a CPU storage, then move it with .neuron())")

    @classmethod
    def _new_with_weak_ptr(cls, *args, **kwargs):
        raise RuntimeError("_new_with_weak_ptr: Not available for neuron storage")

    @classmethod
    def _new_shared_filename(cls, manager, obj, size, *, device=None, dtype=None):
        raise RuntimeError("_new_shared_filename: Not available for neuron storage")


def _make(name: str, dtype: torch.dtype) -> type:
    def _dtype(cls) -> torch.dtype:
        return dtype

    def public_dtype(cls) -> torch.dtype:
        _warn_typed_storage_removal()
        return dtype

    cls = type(name, (_NeuronLegacyStorage,), {
        "__module__": _MODULE,
        "__qualname__": name,
        "__doc__": f"Legacy typed storage of {dtype} on the neuron device (torch.cuda.{name}'s twin).",
        "dtype": classproperty(public_dtype),
        "_dtype": classproperty(_dtype),
    })
    return cls


ByteStorage = _make("ByteStorage", torch.uint8)
DoubleStorage = _make("DoubleStorage", torch.double)
FloatStorage = _make("FloatStorage", torch.float)
HalfStorage = _make("HalfStorage", torch.half)
LongStorage = _make("LongStorage", torch.long)
IntStorage = _make("IntStorage", torch.int)
ShortStorage = _make("ShortStorage", torch.short)
CharStorage = _make("CharStorage", torch.int8)
BoolStorage = _make("BoolStorage", torch.bool)
BFloat16Storage = _make("BFloat16Storage", torch.bfloat16)
ComplexDoubleStorage = _make("ComplexDoubleStorage", torch.cdouble)
ComplexFloatStorage = _make("ComplexFloatStorage", torch.cfloat)
