"""The neuron generator in PyTorch's RNG-replay operators, so compiled checkpointed regions
replay their random ops exactly.

Why: when ``torch.compile`` partitions a graph whose random ops are recomputed in the
backward (activation checkpointing of any kind: full, selective per layer or per op), AOTAutograd
wraps each one in ``run_and_save_rng_state`` (forward: save the generator's state, run) and
``run_with_rng_state`` (backward: run again from that state). Those higher-order operators
(``torch/_prims/rng_prims.py``, torch 2.13.0) know the cuda, cpu, hpu and xpu generators only
and raised ``AssertionError: Backend not supported for neuron``. Here they get neuron's, as
they have CUDA's: the state of the device the op's tensors are on, through
``torch.neuron.get_rng_state`` / ``set_rng_state``.

Private torch API (the operators' ``py_kernels`` and ``python_key_table``, the HOP fake-function registry; no public
way to add a device exists), checked on torch 2.13.0; installed once, leaving every other
device to torch's own implementations.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

_installed = False


def _device_of(args: tuple, kwargs: dict) -> torch.device | None:
    """The op's device as the operators find it: a ``device=`` keyword, else the first tensor."""
    device = kwargs.get("device")
    if device is not None:
        return torch.device(device)
    for arg in args:
        if isinstance(arg, torch.Tensor):
            return arg.device
    return None


def _is_neuron(args: tuple, kwargs: dict) -> bool:
    device = _device_of(args, kwargs)
    return device is not None and device.type == "neuron"


def _index(args: tuple, kwargs: dict) -> int:
    device = _device_of(args, kwargs)
    return device.index if device is not None and device.index is not None else torch.neuron.current_device()


def save_and_run(op: Callable, *args: Any, **kwargs: Any) -> tuple[torch.Tensor, Any]:
    """``run_and_save_rng_state`` on neuron: the generator's state before ``op``, and its result."""
    return torch.neuron.get_rng_state(_index(args, kwargs)), op(*args, **kwargs)


def run_from_state(rng_state: torch.Tensor, op: Callable, *args: Any, **kwargs: Any) -> Any:
    """``run_with_rng_state`` on neuron: ``op`` drawn from ``rng_state``; the generator's own
    state is back afterwards, as on CUDA."""
    index = _index(args, kwargs)
    current = torch.neuron.get_rng_state(index)
    torch.neuron.set_rng_state(rng_state.cpu(), index)
    try:
        return op(*args, **kwargs)
    finally:
        torch.neuron.set_rng_state(current, index)


def install() -> None:
    """Adds neuron to both operators (once)."""
    global _installed
    if _installed:
        return
    from torch._C import DispatchKey
    from torch._higher_order_ops.utils import registered_hop_fake_fns
    from torch._prims import rng_prims
    from torch.fx.experimental.proxy_tensor import ProxyTorchDispatchMode, track_tensor_tree
    from torch.utils import _pytree as pytree

    save, replay = rng_prims.run_and_save_rng_state, rng_prims.run_with_rng_state
    _installed = True

    def neuron_first(original: Callable, neuron: Callable, state_args: int) -> Callable:
        def select(*all_args: Any, **kwargs: Any) -> Any:
            if _is_neuron(all_args[state_args + 1:], kwargs):
                return neuron(*all_args, **kwargs)
            return original(*all_args, **kwargs)
        return select

    save.py_kernels[DispatchKey.PrivateUse1] = save_and_run
    replay.py_kernels[DispatchKey.PrivateUse1] = run_from_state
    save_select = neuron_first(save.py_kernels[DispatchKey.BackendSelect], save_and_run, 0)
    save.py_kernels[DispatchKey.BackendSelect] = save_select
    replay.py_kernels[DispatchKey.BackendSelect] = neuron_first(
        replay.py_kernels[DispatchKey.BackendSelect], run_from_state, 1)
    # FakeTensor and tracing run the save through the device choice too (their own closure
    # over torch's table, which has no neuron): the same choice, neuron first.
    registered_hop_fake_fns[save] = neuron_first(registered_hop_fake_fns[save], save_and_run, 0)
    original_proxy = save.python_key_table[ProxyTorchDispatchMode]

    def proxy(mode: ProxyTorchDispatchMode, op: Callable, *args: Any, **kwargs: Any) -> Any:
        if not _is_neuron(args, kwargs):
            return original_proxy(mode, op, *args, **kwargs)
        out = save_and_run(op, *args, **kwargs)
        proxy_args = pytree.tree_map(mode.tracer.unwrap_proxy, (op, *args))
        proxy_kwargs = pytree.tree_map(mode.tracer.unwrap_proxy, kwargs)
        out_proxy = mode.tracer.create_proxy("call_function", save, proxy_args, proxy_kwargs)
        return track_tensor_tree(out, out_proxy, constant=None, tracer=mode.tracer)

    save.python_key_table[ProxyTorchDispatchMode] = proxy
    for hop in (save, replay):
        hop._dispatch_cache.clear()
