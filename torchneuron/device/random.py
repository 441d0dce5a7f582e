"""Random number generation on neuron devices, shaped like torch.cuda.random.

Each device has a default generator; seeding a device with ``s`` yields the
same random stream as ``torch.manual_seed(s)`` yields on the CPU.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from torchneuron import _C
from torchneuron.device._core import Device, device_count, device_index

__all__ = [
    "get_rng_state",
    "get_rng_state_all",
    "initial_seed",
    "manual_seed",
    "manual_seed_all",
    "seed",
    "seed_all",
    "set_rng_state",
    "set_rng_state_all",
]


def _generator(device: Device = None) -> torch.Generator:
    return _C._default_generator(device_index(device))


def default_generators() -> tuple[torch.Generator, ...]:
    """One torch.Generator per device (``torch.neuron.default_generators``)."""
    return tuple(_C._default_generator(i) for i in range(device_count()))


def get_rng_state(device: Device = "neuron") -> torch.Tensor:
    r"""Return the random number generator state of a device as a ByteTensor.

    Args:
        device (torch.device or int, optional): the device whose state is
            returned. Default: ``'neuron'``, the current device.
    """
    return _generator(device).get_state()


def get_rng_state_all() -> list[torch.Tensor]:
    r"""Return the random number generator states of all devices."""
    return [get_rng_state(i) for i in range(device_count())]


def set_rng_state(new_state: torch.Tensor, device: Device = "neuron") -> None:
    r"""Set the random number generator state of a device.

    Args:
        new_state (torch.ByteTensor): the desired state (a CPU tensor).
        device (torch.device or int, optional): Default: ``'neuron'``, the
            current device.
    """
    _generator(device).set_state(new_state.clone(memory_format=torch.contiguous_format))


def set_rng_state_all(new_states: Iterable[torch.Tensor]) -> None:
    r"""Set the random number generator state of every device."""
    for i, state in enumerate(new_states):
        set_rng_state(state, i)


def manual_seed(seed: int) -> None:
    r"""Seed the current device's generator."""
    _generator().manual_seed(int(seed))


def manual_seed_all(seed: int) -> None:
    r"""Seed the generators of all devices."""
    for i in range(device_count()):
        _generator(i).manual_seed(int(seed))


def seed() -> None:
    r"""Seed the current device's generator with a non-deterministic number."""
    _generator().seed()


def seed_all() -> None:
    r"""Seed every device with one non-deterministic number."""
    value = _generator(0).seed()
    for i in range(1, device_count()):
        _generator(i).manual_seed(value)


def initial_seed() -> int:
    r"""Return the current device's seed."""
    return _generator().initial_seed()
