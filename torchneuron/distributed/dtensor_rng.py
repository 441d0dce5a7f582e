"""DTensor random ops on ``neuron``: an RNG tracker for Mersenne Twister generators.

Why: DTensor (torch 2.13.0, ``torch/distributed/tensor/_random.py``) treats a device as
supporting its random ops when its module has ``set_rng_state`` (``is_rng_supported_mesh``),
then makes an ``OffsetBasedRNGTracker``, which reads the generator state as CUDA's Philox
``(seed, offset)`` pair of 16 bytes and moves the offset to each shard's place in the
stream. The neuron generator is CPU's Mersenne Twister (so ``torch.neuron.manual_seed(s)``
gives CPU's stream; its state is CPU's 5056 bytes), which has no offset to move: DTensor's
random ops (``distribute_tensor`` of ``torch.distributed.tensor.randn``, ``nn.init`` on
sharded parameters, dropout under TP) failed with a bare ``AssertionError``.

:class:`NeuronRNGTracker` gives DTensor's random ops the same guarantees with a
Mersenne Twister: before the op every rank holds the same generator state; the op runs
on a generator seeded from that state and the rank's *shard* (its coordinates on the
mesh dimensions that shard the tensor), so replicas draw the same values and different
shards draw different ones; afterwards every rank's generator is advanced the same way,
so ranks stay in step. Results are deterministic for a given seed and mesh; as on CUDA,
a sharded random tensor depends on the sharding (it is not the slice of the same op on
one device).

DTensor has no public way to choose its tracker: it uses the module global
``torch.distributed.tensor._random._rng_tracker`` (private, checked on torch 2.13.0), which
:func:`install` sets when it is unset, or holds DTensor's Philox tracker for a neuron device
(which cannot work). Nothing else in torch is changed.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Callable, Iterator

import torch

_DTENSOR_RANDOM = "torch.distributed.tensor._random"


def shard_seed(key: int, shard: tuple[int, ...]) -> int:
    """The seed a shard's random op runs with: a hash of the step's key and the shard's coordinates."""
    digest = hashlib.blake2b(repr((key, shard)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1  # a non-negative int64


def split_state(state: torch.Tensor) -> tuple[int, torch.Tensor]:
    """From a Mersenne Twister state: the step's key (one draw) and the state after that draw.

    Every rank holds the same ``state``, so every rank gets the same key and next state.
    """
    generator = torch.Generator()
    generator.set_state(state)
    key = int(torch.empty((), dtype=torch.int64).random_(generator=generator))
    return key, generator.get_state()


def shard_coordinates(spec: object) -> tuple[int, ...]:
    """The rank's coordinate on each mesh dimension that shards the tensor (0 where it replicates)."""
    coordinate = spec.mesh.get_coordinate()
    if coordinate is None:
        raise RuntimeError("DTensor random op on a rank outside the tensor's device mesh")
    return tuple(c if placement.is_shard() else 0 for c, placement in zip(coordinate, spec.placements))


def _default_generator(device_type: str
                       ) -> tuple[Callable[[], torch.Tensor], Callable[[torch.Tensor], None], Callable[[int], None]]:
    """(get state, set state, seed) of the generator a DTensor random op on ``device_type`` uses."""
    if device_type == "neuron":
        index = torch.neuron.current_device()
        return (lambda: torch.neuron.get_rng_state(index),
                lambda state: torch.neuron.set_rng_state(state, index),
                torch.neuron.manual_seed)  # the current device's generator
    if device_type == "cpu":
        return torch.get_rng_state, torch.set_rng_state, torch.default_generator.manual_seed
    raise RuntimeError(
        f"torchneuron's DTensor RNG tracker handles neuron and cpu meshes, got a {device_type} mesh; "
        f"set torch.distributed.tensor._random._rng_tracker = None to use DTensor's own tracker")


def _tracker_base() -> type:
    from torch.distributed.tensor._random import _RNGStateTracker  # private, torch 2.13.0

    return _RNGStateTracker


@contextlib.contextmanager
def _random_region(spec: object, generator: torch.Generator | None) -> Iterator[None]:
    """Runs one DTensor random op for :class:`NeuronRNGTracker` (see the module docstring).

    ``generator``: the op's own generator (DTensor hands it here and runs the op without it).
    """
    get_default, set_default, seed_default = _default_generator(spec.mesh.device_type)
    get_source, set_source = (generator.get_state, generator.set_state) if generator is not None \
        else (get_default, set_default)
    key, after = split_state(get_source())
    saved = get_default()
    seed_default(shard_seed(key, shard_coordinates(spec)))
    try:
        yield
    finally:
        set_default(saved)
        set_source(after)  # every rank's generator moves on the same way


def _make_tracker_class() -> type:
    base = _tracker_base()

    class NeuronRNGTracker(base):  # type: ignore[misc, valid-type]
        """DTensor's RNG tracker for Mersenne Twister generators (neuron's, CPU's)."""

        def _distribute_region(self, spec, generator: torch.Generator | None = None):  # noqa: ANN001
            if not self.distribute_region_enabled:
                return contextlib.nullcontext()
            return _random_region(spec, generator)

        def _manual_seed(self, parallel_seed: int) -> None:
            torch.manual_seed(parallel_seed)

    return NeuronRNGTracker


_tracker_class: type | None = None


def tracker_class() -> type:
    """``NeuronRNGTracker`` (made on first use: its base class lives in DTensor, imported late)."""
    global _tracker_class
    if _tracker_class is None:
        _tracker_class = _make_tracker_class()
    return _tracker_class


def install() -> bool:
    """Makes DTensor use :class:`NeuronRNGTracker`; True if it is DTensor's tracker now.

    Leaves a tracker the program set itself alone, unless it is DTensor's Philox tracker on
    a neuron device (which fails on the first random op).
    """
    import torch.distributed.tensor._random as dtensor_random  # private, torch 2.13.0

    current = dtensor_random._rng_tracker
    cls = tracker_class()
    if isinstance(current, cls):
        return True
    philox_on_neuron = (isinstance(current, dtensor_random.OffsetBasedRNGTracker)
                        and current._device.type == "neuron")
    if current is not None and not philox_on_neuron:
        return False
    dtensor_random._rng_tracker = cls(torch.device("neuron", torch.neuron.current_device()))
    return True


def install_for_neuron_groups() -> None:
    """Called when a neuron process group is made: :func:`install` now if DTensor is imported,
    else as soon as it is (programs that never import DTensor pay no import)."""
    from torchneuron.distributed.import_hooks import after_import

    after_import(_DTENSOR_RANDOM, install, "give DTensor its RNG tracker for neuron; DTensor random "
                                          "ops on neuron meshes will fail")
