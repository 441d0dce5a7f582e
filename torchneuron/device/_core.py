"""Device state shared by the torch.neuron modules: topology, lazy init, fork.

Kept apart from the package ``__init__`` (as torch.cuda does not) so that
memory.py, random.py and streams.py import it without circular-import order.
"""

from __future__ import annotations

import threading

import torch

from torchneuron import _C
from torchneuron import config
from torchneuron.hardware import Topology

# The core's entry points used outside the device layer, named here so that only this layer
# imports torchneuron._C: the allocator Inductor's generated code calls, and the check
# behind torchneuron.testing.is_on_neuron.
empty_strided_neuron = _C._empty_strided_neuron
is_device_memory = _C._is_device_memory
meta_alias = _C._meta_alias  # a meta tensor with a neuron tensor's metadata (a simulated job's collectives)

_topology: Topology | None = None
_initialized = False
_init_lock = threading.Lock()
# Why the device could not be set up at import (a bad setting), raised on first use.
_unavailable: ValueError | None = None

Device = torch.device | str | int | None


def mark_unavailable(reason: ValueError) -> None:
    """Leaves the process without neuron devices: ``import torch`` goes on, and every
    use of the device raises ``reason`` (as CUDA does with a broken driver)."""
    global _unavailable
    _unavailable = reason


def configure_devices() -> Topology:
    """Reads the target from the settings and sizes the devices (once)."""
    global _topology
    if _unavailable is not None:
        raise RuntimeError(
            f"The neuron device is unavailable because of a bad setting: {_unavailable}. Fix it "
            "and restart the process (`python -m torchneuron info` lists every setting)."
        ) from _unavailable
    if _topology is None:
        topology = config.device_topology()
        _C._init_devices([d.hbm_bytes for d in topology.devices])
        _topology = topology
    return _topology


def topology() -> Topology:
    return configure_devices()


def device_count() -> int:
    return topology().device_count


def is_initialized() -> bool:
    return _initialized and not _C._is_in_bad_fork()


def _is_in_bad_fork() -> bool:
    return _C._is_in_bad_fork()


def lazy_init() -> None:
    """Initializes the device once per process (called by PyTorch on first use).

    Raises RuntimeError in a child forked after the parent used the device,
    as CUDA does.
    """
    global _initialized
    if is_initialized():
        return
    with _init_lock:
        if is_initialized():
            return
        if _C._is_in_bad_fork():
            raise RuntimeError(
                "Cannot re-initialize Neuron in forked subprocess. To use Neuron with "
                "multiprocessing, you must use the 'spawn' start method"
            )
        configure_devices()
        _C._register_fork_handler()
        _initialized = True


def device_index(device: Device = None, *, optional: bool = True) -> int:
    """Normalizes a device argument to a neuron device index.

    ``None`` (with ``optional``) and ``"neuron"`` mean the current device.
    """
    if device is None:
        if not optional:
            raise ValueError("Expected a neuron device, but got: None")
        return _C._current_device()
    if isinstance(device, int):
        index = device
    else:
        if isinstance(device, str):
            device = torch.device(device)
        if not isinstance(device, torch.device):
            raise TypeError(
                f"Expected a torch.device, str or int for a neuron device, got {type(device).__name__}"
            )
        if device.type != "neuron":
            raise ValueError(f"Expected a neuron device, but got: {device}")
        index = _C._current_device() if device.index is None else device.index
    _C._check_device_index(index)  # the one wording of this error, shared with C++
    return index



def cpu_view_borrowed(tensor: "torch.Tensor") -> "torch.Tensor":
    """A CPU tensor over a neuron tensor's memory that does not keep it alive: the caller
    keeps ``tensor`` alive for as long as the view is read or written (a collective's c10d
    kernel, until gloo finished), so the device memory is freed when the program frees it."""
    return _C._cpu_view_borrowed(tensor)


def premul_sum_factor(boxed_op: object) -> "float | torch.Tensor":
    """The factor of a ``ReduceOp.PREMUL_SUM`` as c10d hands it to a backend's kernel (a
    TorchScript ReduceOp whose factor Python cannot read): a float, or the factor tensor."""
    return _C._premul_sum_factor(boxed_op)


def cpu_alias(tensor: "torch.Tensor") -> "torch.Tensor":
    """A CPU tensor over the same memory as a neuron tensor (no copy): what a host-side
    transport (gloo) reads and writes in place of the device tensor."""
    return _C._cpu_alias(tensor)
