"""FlexAttention in Inductor on neuron, with any backend: the device's fused op, not a template.

Why: Inductor (torch 2.13.0) lowers ``flex_attention`` and ``flex_attention_backward`` with its
Triton templates on every device but CPU and MPS, so plain ``torch.compile(model)`` (the
default backend, torchtitan's choice) of neuron code calling FlexAttention stopped with
"0 active drivers". On neuron the lowering now emits an extern call of
``torchneuron::flex_attention`` (``..._backward``, ``device/flex_attention.py``): the compiled
step computes what eager computes, bit for bit, and is charged alike. Other devices keep
Inductor's lowering.

The op finds the graph's ``score_mod``/``mask_mod`` subgraphs in the device's registry under a
key made from their code. A cache hit (Inductor's FX graph cache, AOTAutograd's cache) skips
lowering, so the generated module carries the subgraphs itself: the neuron wrapper
(``inductor_device``) writes :func:`header_lines` into the module's header, which registers
them whenever the module loads, compiled now or read from a cache.

Private torch API: ``torch._inductor.lowering`` (``lowerings``, ``register_lowering``,
``fallback_handler``), ``ir.Subgraph``, ``V.graph.current_node``; checked on torch 2.13.0.
"""

from __future__ import annotations

import hashlib
from typing import Any, Callable, Sequence

import torch
import torch.fx as fx

from torchneuron.device import flex_attention as device_flex

_PREFIX = "flex_attention:compiled:"
_REGISTER = "_neuron_flex_register"
_installed = False


def call_key(modules: Sequence[object], rest: object) -> str:
    """The registry key of a compiled call: its subgraphs' code and its other constants."""
    digest = hashlib.sha256()
    for module in modules:
        digest.update((module.code if isinstance(module, fx.GraphModule) else repr(module)).encode())
    digest.update(repr(rest).encode())
    return _PREFIX + digest.hexdigest()[:32]


def _on_neuron(query: Any) -> bool:
    device = query.get_device()
    return device is not None and device.type == "neuron"


def _split_block_mask(block_mask: tuple) -> tuple[tuple, list[Any], list[fx.GraphModule]]:
    """The block mask with its tensors taken out (op arguments) and its mask_mod subgraph as the
    module; the tensors; the subgraph modules (for the key)."""
    from torch._inductor import ir

    template = tuple(x.graph_module if isinstance(x, ir.Subgraph)
                     else device_flex.TENSOR if isinstance(x, ir.IRNode) else x for x in block_mask)
    tensors = [x for x in block_mask if isinstance(x, ir.IRNode) and not isinstance(x, ir.Subgraph)]
    mask_mods = [x.graph_module for x in block_mask if isinstance(x, ir.Subgraph)]
    return template, tensors, mask_mods


def _register(subgraphs: list[fx.GraphModule], joint: fx.GraphModule | None, template: tuple,
              kernel_options: dict[str, Any]) -> str:
    key = call_key(subgraphs, (template[:-1], sorted(kernel_options.items())))
    device_flex.register_compiled(key, subgraphs[0], joint, template, kernel_options)
    return key


def _extern(op: Any, *args: Any) -> Any:
    from torch._inductor.lowering import fallback_handler

    return fallback_handler(op, add_to_fallback_set=False)(*args)


def _forward(original: Callable) -> Callable:
    def lower(query, key, value, subgraph, block_mask, scale, kernel_options, score_mod_other_buffers,
              mask_mod_other_buffers):
        if not _on_neuron(query):
            return original(query, key, value, subgraph, block_mask, scale, kernel_options,
                            score_mod_other_buffers, mask_mod_other_buffers)
        template, tensors, mask_mods = _split_block_mask(block_mask)
        call = _register([subgraph.graph_module, *mask_mods], None, template, kernel_options)
        out, lse, max_scores = _extern(torch.ops.torchneuron.flex_attention.default, query, key, value,
                                       tensors, list(score_mod_other_buffers), list(mask_mod_other_buffers),
                                       call, float(scale))
        return out, lse, max_scores

    return lower


def _backward(original: Callable) -> Callable:
    def lower(*args):
        (query, key, value, out, logsumexp, grad_out, grad_logsumexp, fw_graph, joint_graph, block_mask,
         scale, kernel_options, score_mod_other_buffers, mask_mod_other_buffers) = args
        if not _on_neuron(query):
            return original(*args)
        from torch._inductor.virtualized import V

        template, tensors, mask_mods = _split_block_mask(block_mask)
        call = _register([fw_graph.graph_module, joint_graph.graph_module, *mask_mods],
                         joint_graph.graph_module, template, kernel_options)
        grads = _extern(torch.ops.torchneuron.flex_attention_backward.default, grad_out, query, key, value,
                        out, logsumexp, grad_logsumexp, tensors, list(score_mod_other_buffers),
                        list(mask_mod_other_buffers), call, float(scale))
        # the op gives zeros for a captured buffer without gradient; the operator gives None
        expected = V.graph.current_node.meta["val"][3]
        captured = tuple(g if e is not None else None for g, e in zip(grads[3:], expected))
        return grads[0], grads[1], grads[2], captured

    return lower


def header_lines(node: Any) -> list[str]:
    """Lines for a generated module's header that register the subgraphs ``node`` (an extern
    call of the device's op) calls with; empty for any other node."""
    if getattr(node, "op_overload", None) not in (torch.ops.torchneuron.flex_attention.default,
                                                  torch.ops.torchneuron.flex_attention_backward.default):
        return []
    keys = [a for a in node.constant_args if isinstance(a, str) and a.startswith(_PREFIX)]
    return [f"{_REGISTER}({key!r}, {device_flex.serialized(key)!r})" for key in keys]


HEADER_IMPORT = f"from torchneuron.device.flex_attention import register_serialized as {_REGISTER}"


def install() -> None:
    """Wraps Inductor's FlexAttention lowerings so that neuron inputs get the device's op (once)."""
    global _installed
    if _installed:
        return
    from torch._higher_order_ops.flex_attention import flex_attention, flex_attention_backward
    from torch._inductor.lowering import lowerings, register_lowering

    for hop, wrap in ((flex_attention, _forward), (flex_attention_backward, _backward)):
        register_lowering(hop, type_promotion_kind=None)(wrap(lowerings[hop]))
    _installed = True
