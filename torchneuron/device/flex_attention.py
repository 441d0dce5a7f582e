"""FlexAttention on neuron, forward and backward, as one fused-attention op with CPU's values.

Why: ``torch.nn.attention.flex_attention`` (torch 2.13.0) refuses any device but cuda, cpu,
xpu, hpu and mps, and torchtitan's newest language models offer only FlexAttention. Its
eager path is PyTorch's dense implementation, which on neuron would be two dozen ops with the
L x S scores in device memory; Trainium runs attention as one fused kernel.

How: the FlexAttention operators (``flex_attention`` and ``flex_attention_backward``, higher-order
operators with the user's ``score_mod``/``mask_mod`` as Python callables) get a PrivateUse1
implementation that calls one op, ``torchneuron::flex_attention`` (``..._backward``), whose CPU
kernel is PyTorch's own dense implementation. The neuron op path runs that kernel on the device
memory (as it runs every CPU kernel), so the result is what the dense implementation gives on
CPU, the call is one record, and the cost model charges it as fused attention
(``hardware/flops.attention_work`` over all L x S pairs: block sparsity is not read, so a
masked-out block is charged as computed, an upper bound). The callables cannot be op
arguments: they wait in a registry under a key for the duration of the call.

Private torch API (the operators' ``py_kernels`` and dense implementations, and the device
check ``torch.nn.attention.flex_attention._validate_device``), checked on torch 2.13.0.
"""

from __future__ import annotations

import base64
import itertools
import pickle
import threading
from typing import Any, Callable

import torch
import torch.utils._pytree as pytree

from torchneuron.device import _core

_installed = False
_lock = threading.Lock()
_next_key = itertools.count()
# key -> (score_mod or fw_graph, joint_graph, block mask with TENSOR slots, kernel_options)
_calls: dict[str, tuple[Callable | None, Callable | None, tuple, dict[str, Any]]] = {}


class _TensorSlot:
    """Where a block-mask tensor goes in a call's block mask (passed to the op instead)."""

    def __repr__(self) -> str:  # stable: compiled graphs' registry keys include it
        return "<tensor>"

    def __reduce__(self) -> str:  # unpickles as the one TENSOR (``_join_block_mask`` tests identity)
        return "TENSOR"


TENSOR = _TensorSlot()


def _split_block_mask(block_mask: tuple) -> tuple[tuple, list[torch.Tensor]]:
    """The block mask's tensors (passed to the op, so the op path moves them) and the rest."""
    template = tuple(TENSOR if isinstance(x, torch.Tensor) else x for x in block_mask)
    return template, [x for x in block_mask if isinstance(x, torch.Tensor)]


def _join_block_mask(template: tuple, tensors: list[torch.Tensor]) -> tuple:
    it = iter(tensors)
    return tuple(next(it) if t is TENSOR else t for t in template)


class _Registered:
    """The callables of one eager call, findable by the op's kernel while the call lasts."""

    def __init__(self, mod: Callable | None, joint: Callable | None, block_mask: tuple,
                 kernel_options: dict[str, Any]):
        template, self.tensors = _split_block_mask(block_mask)
        self.key = f"flex_attention:{next(_next_key)}"
        self.entry = (mod, joint, template, kernel_options)

    def __enter__(self) -> "_Registered":
        with _lock:
            _calls[self.key] = self.entry
        return self

    def __exit__(self, *exc: object) -> None:
        with _lock:
            _calls.pop(self.key, None)


def register_compiled(key: str, mod: Callable | None, joint: Callable | None, template: tuple,
                      kernel_options: dict[str, Any]) -> None:
    """A compiled graph's subgraphs, under a key made from their code; kept for the process
    (compiled code calls the op with the key at every step)."""
    with _lock:
        _calls[key] = (mod, joint, template, kernel_options)


def serialized(key: str) -> str:
    """A registered call as text (pickled, base64): compiled code carries it and registers it
    with :func:`register_serialized` when it loads, from Inductor's caches too."""
    entry = _entry(key)
    return base64.b64encode(pickle.dumps(entry)).decode("ascii")


def register_serialized(key: str, payload: str) -> None:
    """Registers a compiled graph's call from :func:`serialized` text, unless already there."""
    with _lock:
        if key in _calls:
            return
    # Unpickling a GraphModule retraces its code, and torch 2.13.0's tracer reads this module
    # without importing it (a process that only loads cached code may not have it yet)
    import torch._higher_order_ops.triton_kernel_wrap  # noqa: F401

    register_compiled(key, *pickle.loads(base64.b64decode(payload)))


def _entry(key: str):
    with _lock:
        entry = _calls.get(key)
    if entry is None:
        raise RuntimeError(
            f"torchneuron::flex_attention: no call is registered under {key!r}; the op is called "
            "by torch.nn.attention.flex_attention on neuron tensors (eager or compiled), not directly.")
    return entry


_FUNCTORCH_KEYS = ("FuncTorchBatched", "FuncTorchVmapMode", "FuncTorchDynamicLayerBackMode",
                   "FuncTorchDynamicLayerFrontMode", "FuncTorchGradWrapper", "BatchedNestedTensor")


def _with_vmap() -> Any:
    """The dense implementation vmaps score_mod/mask_mod; compiled code runs with functorch
    disabled (AOTAutograd's runtime wrapper), which would stop it: let functorch in again."""
    exclude = torch._C._dispatch_tls_local_exclude_set()
    for name in _FUNCTORCH_KEYS:
        if hasattr(torch._C.DispatchKey, name):
            exclude = exclude.remove(getattr(torch._C.DispatchKey, name))
    return torch._C._ForceDispatchKeyGuard(torch._C._dispatch_tls_local_include_set(), exclude)


def _host_alias(x: object) -> object:
    if (type(x) is torch.Tensor and x.device.type == "neuron"
            and not torch._C._functorch.is_functorch_wrapped_tensor(x)):
        return _core.cpu_alias(x)
    return x


class _OnTheHost(torch.overrides.TorchFunctionMode):
    """The kernel computes on the host aliases of the device tensors: a tensor the user's
    score_mod/mask_mod makes on neuron (traced as a constant device, e.g. ``new_ones``) is made
    beside them, and a neuron tensor a compiled subgraph holds is read through its host alias (a
    subgraph read back from a compile cache is retraced by unpickling, which turns a factory
    call such as ``b.new_ones(())`` into a constant on neuron)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        device = kwargs.get("device")
        if device is not None and torch.device(device).type == "neuron":
            kwargs = {**kwargs, "device": torch.device("cpu")}
        args, kwargs = pytree.tree_map(_host_alias, (args, kwargs))
        return func(*args, **kwargs)


def _define_ops() -> None:
    from torch._higher_order_ops.flex_attention import _permute_strides, sdpa_dense, sdpa_dense_backward

    @torch.library.custom_op("torchneuron::flex_attention", mutates_args=(), device_types="cpu")
    def flex_attention_op(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                          block_mask_tensors: list[torch.Tensor], score_buffers: list[torch.Tensor],
                          mask_buffers: list[torch.Tensor], call: str, scale: float
                          ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        score_mod, _, template, kernel_options = _entry(call)
        mask = _join_block_mask(template, block_mask_tensors)
        with torch.no_grad(), _with_vmap(), _OnTheHost():
            out, lse, max_scores = sdpa_dense(query, key, value, score_mod, mask, scale, kernel_options,
                                              tuple(score_buffers), tuple(mask_buffers))
        return out, lse, max_scores

    @torch.library.custom_op("torchneuron::flex_attention_backward", mutates_args=(), device_types="cpu")
    def flex_attention_backward_op(grad_out: torch.Tensor, query: torch.Tensor, key: torch.Tensor,
                                   value: torch.Tensor, out: torch.Tensor, logsumexp: torch.Tensor,
                                   grad_logsumexp: torch.Tensor | None,
                                   block_mask_tensors: list[torch.Tensor],
                                   score_buffers: list[torch.Tensor], mask_buffers: list[torch.Tensor],
                                   call: str, scale: float) -> list[torch.Tensor]:
        fw_graph, joint_graph, template, kernel_options = _entry(call)
        mask = _join_block_mask(template, block_mask_tensors)
        with _with_vmap(), _OnTheHost():
            grad_q, grad_k, grad_v, captured = sdpa_dense_backward(
                query, key, value, out, logsumexp, grad_out, grad_logsumexp, fw_graph, joint_graph, mask,
                scale, kernel_options, tuple(score_buffers), tuple(mask_buffers))
        # None (a captured buffer without grad) cannot be a list element: zeros stand in
        return [grad_q, grad_k, grad_v,
                *(g if g is not None else torch.zeros_like(b) for g, b in zip(captured, score_buffers))]

    @flex_attention_op.register_fake
    def _(query, key, value, block_mask_tensors, score_buffers, mask_buffers, call, scale):
        batch, heads, seq_q, _ = query.shape
        out = _permute_strides(query.new_empty(batch, heads, seq_q, value.size(-1)), query.stride())
        stats = query.new_empty(batch, heads, seq_q, dtype=torch.float32)
        return out, stats, torch.empty_like(stats)

    @flex_attention_backward_op.register_fake
    def _(grad_out, query, key, value, out, logsumexp, grad_logsumexp, block_mask_tensors, score_buffers,
          mask_buffers, call, scale):
        batch = query.size(0)
        grads = [_permute_strides(t.new_empty(batch, *t.shape[1:]), t.stride()) for t in (query, key, value)]
        return [*grads, *(torch.empty_like(b) for b in score_buffers)]



def _neuron_forward(query, key, value, score_mod, block_mask, scale, kernel_options,
                    score_mod_other_buffers=(), mask_mod_other_buffers=()):
    with _Registered(score_mod, None, block_mask, kernel_options) as call:
        return torch.ops.torchneuron.flex_attention(
            query, key, value, call.tensors, list(score_mod_other_buffers), list(mask_mod_other_buffers),
            call.key, float(scale))


def _neuron_backward(query, key, value, out, logsumexp, grad_out, grad_logsumexp, fw_graph, joint_graph,
                     block_mask, scale, kernel_options, score_mod_other_buffers=(), mask_mod_other_buffers=()):
    with _Registered(fw_graph, joint_graph, block_mask, kernel_options) as call:
        grads = torch.ops.torchneuron.flex_attention_backward(
            grad_out, query, key, value, out, logsumexp, grad_logsumexp, call.tensors,
            list(score_mod_other_buffers), list(mask_mod_other_buffers), call.key, float(scale))
    captured = tuple(g if isinstance(b, torch.Tensor) and b.requires_grad else None
                     for g, b in zip(grads[3:], score_mod_other_buffers))
    return grads[0], grads[1], grads[2], captured


def _allow_neuron_in_the_device_check() -> None:
    import torch.nn.attention.flex_attention as public

    check = public._validate_device

    def validate_device(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> None:
        if query.device.type != "neuron":  # neuron runs the backward too: torch's CPU refusal is not ours
            check(query, key, value)

    validate_device.__wrapped__ = check  # type: ignore[attr-defined]
    public._validate_device = validate_device


def install() -> None:
    """Gives FlexAttention its neuron implementation (once)."""
    global _installed
    if _installed:
        return
    from torch._C import DispatchKey
    from torch._higher_order_ops.flex_attention import flex_attention, flex_attention_backward

    _installed = True
    _define_ops()
    flex_attention.py_kernels[DispatchKey.PrivateUse1] = _neuron_forward
    flex_attention_backward.py_kernels[DispatchKey.PrivateUse1] = _neuron_backward
    for hop in (flex_attention, flex_attention_backward):
        hop._dispatch_cache.clear()
    _allow_neuron_in_the_device_check()
