"""How ``torchneuron check`` puts a script's tensors on neuron without changing what the
script means, for the run only (the check's child process, which is the script's).

check runs the script (without ``--migrate``) under ``torch.set_default_device("neuron")``.
Four things then differ from the script run as written, each corrected here:

- :func:`generator_follows_device`: a random factory given a CPU generator and no device
  stays on the CPU (``DataLoader(shuffle=True)``'s ``randperm``), as it would without the
  default device; neuron refuses a CPU generator, as CUDA does.
- :func:`pinned_on_device`: a dataset built by factories is already on neuron, so the
  ``pin_memory()`` a ``DataLoader(pin_memory=True)`` asks of its batches (a CPU-only
  operation meant to speed the later copy to the device) returns the device tensor itself.
- :func:`workers_on_the_host`: a ``DataLoader``'s worker processes make their tensors on
  the CPU, as the script run as written does (a forked process cannot use the device).
- :class:`CudaDevicesOnNeuron` (``--migrate`` only): a CUDA device that reaches a tensor
  at run time (``--device cuda`` on the command line, a device string read from a config
  file, ``.cuda()`` in a library) means neuron, as the in-memory source rewrite makes the
  user's literal ``"cuda"`` mean; each such call site is counted for the report.
  :func:`cuda_names_on_neuron` does the same for ``torch.load`` (a checkpoint saved on a
  GPU) and ``torch.autocast`` given the device type ``"cuda"`` at run time.
"""

from __future__ import annotations

import contextlib
import functools
import re
import sys
from collections import Counter
from typing import Any, Callable, Iterator

import torch
from torch.overrides import TorchFunctionMode

__all__ = ["CudaDevicesOnNeuron", "cuda_names_on_neuron", "generator_follows_device", "pinned_on_device",
           "workers_on_the_host"]

_RANDOM_FACTORIES = {torch.randperm, torch.rand, torch.randn, torch.randint}


class _GeneratorFollowsDevice(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        generator = kwargs.get("generator")
        if func in _RANDOM_FACTORIES and generator is not None and kwargs.get("device") is None:
            kwargs = {**kwargs, "device": generator.device}
        return func(*args, **kwargs)


def generator_follows_device() -> TorchFunctionMode:
    """A torch function mode: a random factory given a generator and no device makes its
    tensor on the generator's device. Enter it above the default-device mode (after
    ``torch.set_default_device``), so it is asked first."""
    return _GeneratorFollowsDevice()


@contextlib.contextmanager
def pinned_on_device() -> Iterator[None]:
    """While open, ``Tensor.pin_memory()`` of a neuron tensor returns the tensor (pinning is
    for CPU tensors about to be copied to the device; this one is there already). Other
    tensors pin as before. It replaces ``torch.Tensor.pin_memory`` (a Python attribute of
    the subclass over ``torch._C.TensorBase``, checked on torch 2.13.0) rather than using a
    torch function mode, because ``DataLoader`` pins in its own thread, where modes are not
    active; restored on exit."""
    original = torch.Tensor.__dict__.get("pin_memory")
    base_pin = torch._C.TensorBase.pin_memory

    def pin_memory(self: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        if self.device.type == "neuron":
            return self
        return base_pin(self, *args, **kwargs)

    pin_memory.__doc__ = base_pin.__doc__
    torch.Tensor.pin_memory = pin_memory
    try:
        yield
    finally:
        if original is None:
            del torch.Tensor.pin_memory
        else:
            torch.Tensor.pin_memory = original


class _HostWorkerInit:
    """A DataLoader worker's ``worker_init_fn``: turns check's default device off in the
    worker process, then calls the script's own (a module-level class, so that a ``spawn``
    context can pickle it when the script's function pickles)."""

    def __init__(self, user_init: Callable[[int], None] | None) -> None:
        self.user_init = user_init

    def __call__(self, worker_id: int) -> None:
        torch.set_default_device(None)
        if self.user_init is not None:
            self.user_init(worker_id)


@contextlib.contextmanager
def workers_on_the_host() -> Iterator[None]:
    """While open, each ``DataLoader`` with worker processes runs them without check's default
    device: a forked worker cannot use the device (as CUDA's cannot), and the script, run as
    written, makes its workers' tensors (a random augmentation's ``torch.randint``, a
    collated batch) on the CPU. It wraps the loader's ``worker_init_fn`` (a public
    argument) from a replaced ``DataLoader.__init__``, restored on exit."""
    from torch.utils.data import DataLoader

    original_init = DataLoader.__init__

    @functools.wraps(original_init)
    def __init__(self: DataLoader, *args: Any, **kwargs: Any) -> None:
        original_init(self, *args, **kwargs)
        if self.num_workers > 0:
            self.worker_init_fn = _HostWorkerInit(self.worker_init_fn)

    DataLoader.__init__ = __init__
    try:
        yield
    finally:
        DataLoader.__init__ = original_init


_CUDA_STRING = re.compile(r"cuda(:\d+)?")


def _on_neuron(device: Any) -> Any:
    """``device`` with CUDA replaced by neuron (same index); anything else unchanged."""
    if isinstance(device, torch.device) and device.type == "cuda":
        return torch.device("neuron", device.index)
    if isinstance(device, str) and _CUDA_STRING.fullmatch(device.strip()):
        return device.strip().replace("cuda", "neuron", 1)
    return device


class CudaDevicesOnNeuron(TorchFunctionMode):
    """A torch function mode (``--migrate``): ``device=`` arguments and the devices of
    ``Tensor.to`` and ``Tensor.cuda`` that name CUDA name neuron instead. ``mapped`` counts
    each (what, user call site) mapped, for the report; the mode costs one dict lookup per
    torch function call when nothing names CUDA."""

    def __init__(self, call_site: Callable[[], str]) -> None:
        super().__init__()
        self.mapped: Counter = Counter()
        self._call_site = call_site

    def _note(self, what: str) -> None:
        self.mapped[(what, self._call_site())] += 1

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if "device" in kwargs and _on_neuron(kwargs["device"]) is not kwargs["device"]:
            self._note(f"device={kwargs['device']!r}")
            kwargs["device"] = _on_neuron(kwargs["device"])
        if func is torch.Tensor.cuda:
            device = kwargs.pop("device", args[1] if len(args) > 1 else None)
            if len(args) > 2:
                kwargs["non_blocking"] = args[2]
            if device is None:
                device = torch.device("neuron", torch.accelerator.current_device_index())
            elif isinstance(device, int):
                device = torch.device("neuron", device)
            self._note(".cuda()")
            return args[0].to(_on_neuron(device), **kwargs)
        if func is torch.Tensor.to and len(args) > 1:
            mapped = _on_neuron(args[1])
            if mapped is not args[1]:
                self._note(f".to({args[1]!r})")
                args = (args[0], mapped, *args[2:])
        return func(*args, **kwargs)


def _neuron_location(location: str) -> str:
    """A saved storage's location tag (``"cuda:0"``) on neuron (``"neuron:0"``)."""
    mapped = _on_neuron(location)
    return mapped if isinstance(mapped, str) else location


def _map_location(map_location: Any, note: Callable[[str], None]) -> Any:
    """``torch.load``'s ``map_location`` with every CUDA target, and every CUDA location of a
    storage it leaves where it was saved, on neuron (a checkpoint saved on a GPU)."""
    from torch.serialization import default_restore_location

    if isinstance(map_location, (str, torch.device)):
        mapped = _on_neuron(map_location)
        if mapped is not map_location:
            note(f"torch.load(map_location={map_location!r})")
        return mapped

    def restore(storage: Any, location: str) -> Any:
        result = None
        if isinstance(map_location, dict):
            location = map_location.get(location, location)
        elif callable(map_location):
            result = map_location(storage, location)
        if result is not None:
            return result
        neuron = _neuron_location(location)
        if neuron != location:
            note(f"torch.load of storage saved on {location!r}")
        return default_restore_location(storage, neuron)

    return restore


@contextlib.contextmanager
def cuda_names_on_neuron(mode: "CudaDevicesOnNeuron") -> Iterator[None]:
    """``--migrate``: while open, ``mode`` is entered, ``torch.load`` restores storages saved on (or mapped to) a
    GPU on neuron, and ``torch.autocast``/``torch.amp.autocast`` given the device type
    ``"cuda"`` at run time autocast on neuron (the in-memory rewrite covers the literal
    ``"cuda"`` in the user's files; this covers a type read from a device chosen at run time).
    Both are module attributes replaced for the run (checked on torch 2.13.0): code that
    looks them up when called sees the mapping; ``torch.cuda.amp.autocast`` (which the
    rewrite replaces in the user's files) and torch's own internals do not. Restored on exit."""
    original_load = torch.load
    original_autocast = torch.amp.autocast
    seen_autocast = torch.autocast

    @functools.wraps(original_load)
    def load(f: Any, map_location: Any = None, *args: Any, **kwargs: Any) -> Any:
        return original_load(f, _map_location(map_location, mode._note), *args, **kwargs)

    class autocast(original_autocast):  # noqa: N801 (torch's name)
        __doc__ = original_autocast.__doc__

        def __init__(self, device_type: str, *args: Any, **kwargs: Any) -> None:
            if isinstance(device_type, str) and device_type.strip() == "cuda":
                mode._note("autocast('cuda')")
                device_type = "neuron"
            super().__init__(device_type, *args, **kwargs)

    torch.load, torch.amp.autocast, torch.autocast = load, autocast, autocast
    try:
        with mode:
            yield
    finally:
        torch.load, torch.amp.autocast, torch.autocast = original_load, original_autocast, seen_autocast


def user_call_site() -> str:
    """The innermost frame of the user's code on the current Python stack."""
    from torchneuron.device import accounting

    stack = accounting.user_stack(sys._getframe(1), limit=1)
    return stack[0] if stack else "<unknown>"
