"""Registers the ``neuron`` c10d backend and creates its per-group transport.

PyTorch (checked on 2.13.0) gives out-of-tree backends two routes: a C++
``c10d::Backend`` subclass, or a Python ``ProcessGroup`` subclass that replaces the
whole process group. gloo's headers are not shipped with torch, and the Python
``Backend`` binding has no constructor, so neither can subclass gloo. Instead the
backend *is* a ``ProcessGroupGloo`` (public, ``torch.distributed.ProcessGroupGloo``)
registered for the ``neuron`` device, and neuron tensors reach it through c10d's
own dispatcher: :mod:`torchneuron.distributed.kernels` gives the c10d collective ops
a PrivateUse1 kernel that hands gloo CPU views of the tensors.
"""

from __future__ import annotations

import torch.distributed as dist

BACKEND_NAME = "neuron"

_registered = False


def register() -> None:
    """``Backend.register_backend("neuron", ..., devices=["neuron"])``, once per process.

    After it, ``init_process_group()`` on a neuron machine, ``init_process_group("neuron")``
    and ``"cpu:gloo,neuron:neuron"`` all create a neuron backend for neuron tensors.
    """
    global _registered
    if _registered or not dist.is_available():
        return
    dist.Backend.register_backend(BACKEND_NAME, _create_backend, devices=["neuron"], extended_api=True)
    _registered = True


def simulated_world() -> bool:
    """Whether this process is one rank of a simulated job (``torchneuron plan``)."""
    from torchneuron import config

    return config.get_flag("TORCHNEURON_SIMULATED_WORLD")


def _simulated_backend(options: object) -> object:
    """A group of a simulated job: PyTorch's fake backend, which talks to no peer (its
    collectives complete at once). The c10d kernels hand it meta views of the neuron tensors,
    so no byte is read or written (:mod:`kernels`); the modelled time is charged as usual."""
    from torch._C._distributed_c10d import FakeProcessGroup  # public in torch.testing only (2.13.0)

    from torchneuron.distributed.charging import forget_costs
    from torchneuron.distributed.dtensor_rng import install_for_neuron_groups
    from torchneuron.distributed.dtensor_sdpa import install_after_dtensor

    install_for_neuron_groups()
    install_after_dtensor()
    forget_costs()
    _install_meta_coalesced_collectives()
    return FakeProcessGroup._create_internal(options.group_rank, options.group_size)


_meta_library = None


def _install_meta_coalesced_collectives() -> None:
    """Meta kernels for the c10d ops torch 2.13.0 leaves without one (the coalesced ones): a
    simulated job's collectives see meta views, and these only need a finished work back."""
    global _meta_library
    if _meta_library is not None:
        return
    import torch
    from torch._C._distributed_c10d import FakeWork

    library = torch.library.Library("c10d", "IMPL")

    def finished(*args: object) -> object:
        return FakeWork().boxed()

    for name in ("allgather_coalesced_", "allgather_into_tensor_coalesced_", "allreduce_coalesced_",
                 "reduce_scatter_tensor_coalesced_"):
        if not torch._C._dispatch_has_kernel_for_dispatch_key(f"c10d::{name}", "Meta"):
            library.impl(name, finished, "Meta")
    _meta_library = library


def _create_backend(options: object, backend_options: object = None) -> dist.ProcessGroup:
    """c10d's creator for one group's neuron backend: a gloo backend over a prefixed store.

    ``options`` is c10d's ``_DistributedBackendOptions`` (``register_backend(extended_api=True)``):
    store, group rank and size, timeout, and the group's name and global ranks, which the
    progress record (:mod:`progress`) needs.
    """
    from torchneuron.distributed.charging import forget_costs
    from torchneuron.distributed.dtensor_rng import install_for_neuron_groups
    from torchneuron.distributed.context_parallel import install_after_import as install_context_parallel
    from torchneuron.distributed.dtensor_sdpa import install_after_dtensor
    from torchneuron.distributed.kernels import install
    from torchneuron.distributed.local_device import select_local_device
    from torchneuron.distributed.progress import track
    from torchneuron.distributed.timeouts import install as install_timeouts

    install()
    install_timeouts()  # _set_pg_timeout reaches neuron groups
    if not dist.is_initialized():  # the default group: pick this rank's device first
        select_local_device()
    if simulated_world():
        return _simulated_backend(options)
    install_for_neuron_groups()  # DTensor random ops on the neuron generator (dtensor_rng)
    install_after_dtensor()  # DTensor attention on the fused kernel neuron runs (dtensor_sdpa)
    install_context_parallel()  # context_parallel's ring attention over that kernel
    store, rank, size, timeout = options.store, options.group_rank, options.group_size, options.timeout
    forget_costs()  # a group name may come back with other ranks after destroy_process_group
    track(options.group_id, store, rank, list(options.global_ranks_in_group or range(size)), timeout)
    return dist.ProcessGroupGloo(store, rank, size, timeout)
