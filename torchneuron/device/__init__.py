r"""``torch.neuron``: the neuron device module, shaped like ``torch.cuda``.

Each concern lives in its own module (memory, random, streams, properties);
this file assembles the public surface with an explicit ``__all__``.
"""

from __future__ import annotations

from typing import Any

import torch

from torchneuron import _C
from torchneuron.device import _core, memory, properties, random, storage, streams
from torchneuron.device._core import Device, _is_in_bad_fork, is_initialized
from torchneuron.device._core import lazy_init as _lazy_init
from torchneuron.device.accounting import compile_metrics, reset_compile_metrics
from torchneuron.device.memory import *  # noqa: F403
from torchneuron.device.op_tracking import (clear_op_tracking, get_dynamo_metrics,
                                            get_executed_ops, get_fallback_ops,
                                            reset_dynamo_metrics)
from torchneuron.device.sync_debug import get_sync_debug_mode, set_sync_debug_mode
from torchneuron.device.properties import *  # noqa: F403
from torchneuron.device.random import *  # noqa: F403
from torchneuron.device.storage import *  # noqa: F403
from torchneuron.device.streams import *  # noqa: F403

# Raised when a device's memory runs out: torch.OutOfMemoryError, as torch.cuda's is.
OutOfMemoryError = torch.OutOfMemoryError

__all__ = [
    "OutOfMemoryError",
    "current_device",
    "device",
    "device_count",
    "device_of",
    "get_amp_supported_dtype",
    "init",
    "is_available",
    "is_bf16_supported",
    "is_initialized",
    "set_device",
    "compile_metrics",
    "reset_compile_metrics",
    "get_sync_debug_mode",
    "set_sync_debug_mode",
    "get_fallback_ops",
    "get_executed_ops",
    "clear_op_tracking",
    "get_dynamo_metrics",
    "reset_dynamo_metrics",
    *memory.__all__,
    *properties.__all__,
    *random.__all__,
    *storage.__all__,
    *streams.__all__,
]


def is_available() -> bool:
    r"""Return whether a neuron device is available (at least one is visible)."""
    return _C._device_count() > 0


def device_count() -> int:
    r"""Return the number of visible neuron devices (logical NeuronCores)."""
    return _C._device_count()


def init() -> None:
    r"""Initialize the neuron device state (done automatically on first use)."""
    _lazy_init()


def current_device() -> int:
    r"""Return the index of the current neuron device of this thread."""
    return _C._current_device()


def set_device(device: Device) -> None:
    r"""Set the current neuron device of this thread.

    Args:
        device (torch.device or int or str): the device. A negative index is a no-op.
    """
    if isinstance(device, int) and device < 0:
        return
    _C._set_device(_core.device_index(device))


class device:
    r"""Context manager that changes the current neuron device and restores it.

    Args:
        device (torch.device or int or str): the device. ``None`` or a negative
            index makes this a no-op.
    """

    def __init__(self, device: Any) -> None:
        no_op = device is None or (isinstance(device, int) and device < 0)
        self.idx = -1 if no_op else _core.device_index(device)
        self.prev_idx = -1

    def __enter__(self) -> None:
        if self.idx == -1:
            return
        self.prev_idx = _C._current_device()
        if self.prev_idx != self.idx:
            _C._set_device(self.idx)

    def __exit__(self, *exc: object) -> None:
        if self.idx != -1 and self.prev_idx != self.idx:
            _C._set_device(self.prev_idx)


class device_of(device):
    r"""Context manager that makes the device of ``obj`` current (no-op for CPU tensors)."""

    def __init__(self, obj: torch.Tensor) -> None:
        super().__init__(obj.get_device() if obj.device.type == "neuron" else -1)


def is_bf16_supported(including_emulation: bool = True) -> bool:
    r"""Return ``True``: every Trainium generation computes in BF16 natively."""
    return True


def get_amp_supported_dtype() -> list[torch.dtype]:
    r"""Return the dtypes ``torch.autocast("neuron")`` accepts."""
    return [torch.bfloat16, torch.float16]


# Attributes other layers provide on first use, e.g. Inductor's code generators
# for the device (``Scheduling``, ``PythonWrapperCodegen``, ``CppWrapperCodegen``),
# which Inductor looks up on ``torch.neuron``. Filled by ``torchneuron/__init__``
# so this module need not import the compiler (and Inductor) on ``import torch``.
lazy_attributes: dict[str, Any] = {}


def __getattr__(name: str) -> Any:
    if name == "default_generators":
        return random.default_generators()
    if name == "_initialized":
        # torch.utils.checkpoint (and fork_rng) test `device_module._initialized`, as
        # torch.cuda has it, before stashing the device's RNG state for recomputation.
        return is_initialized()
    if name in lazy_attributes:
        return lazy_attributes[name]()
    raise AttributeError(f"module 'torch.neuron' has no attribute '{name}'")
