"""FlexAttention in compiled graphs on neuron: the operator becomes the device's fused op.

Why: Inductor (torch 2.13.0) lowers ``flex_attention`` and ``flex_attention_backward`` with its
Triton templates, or its C++ template on CPU only (forward only), so a neuron graph with
FlexAttention stopped with ``No module named 'triton'``. The eager path runs FlexAttention as
one op, ``torchneuron::flex_attention`` (``device/flex_attention.py``); this pass rewrites each
operator call in AOTAutograd's forward and backward graphs into a call of that op, which
Inductor emits as an extern call: the compiled step computes what eager computes, and is
charged alike.

The op finds the graph's ``score_mod``/``mask_mod`` subgraphs in the device's registry under a
key made from their code, registered by this pass each time it runs. The pass runs on every
compile, cache hits included (it runs before Inductor looks in its cache), so a graph served
from the compile cache finds its subgraphs too.
"""

from __future__ import annotations

import hashlib
import operator

import torch
import torch.fx as fx

from torchneuron.device import flex_attention as device_flex


def _module(gm: fx.GraphModule, node: fx.Node | object) -> object:
    if isinstance(node, fx.Node) and node.op == "get_attr":
        return getattr(gm, node.target)
    return node


def _key(gm: fx.GraphModule, subgraphs: list[object], rest: object) -> str:
    digest = hashlib.sha256()
    for sub in subgraphs:
        module = _module(gm, sub)
        digest.update((module.code if isinstance(module, fx.GraphModule) else repr(module)).encode())
    digest.update(repr(rest).encode())
    return "flex_attention:compiled:" + digest.hexdigest()[:32]


def _block_mask_parts(gm: fx.GraphModule, block_mask: tuple) -> tuple[tuple, list[fx.Node], list[fx.Node]]:
    """The block mask with its tensors taken out (they become op arguments) and its mask_mod
    subgraph resolved to the module; the tensors; the subgraph nodes (for the key)."""
    def is_subgraph(x: object) -> bool:
        return isinstance(x, fx.Node) and x.op == "get_attr"

    template = tuple(device_flex.TENSOR if isinstance(x, fx.Node) and not is_subgraph(x) else _module(gm, x)
                     for x in block_mask)
    tensors = [x for x in block_mask if isinstance(x, fx.Node) and not is_subgraph(x)]
    return template, tensors, [x for x in block_mask if is_subgraph(x)]


def rewrite(gm: fx.GraphModule) -> int:
    """Rewrites FlexAttention calls on neuron tensors into the device's op; returns how many."""
    from torch._higher_order_ops.flex_attention import flex_attention, flex_attention_backward

    graph, count = gm.graph, 0
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target not in (flex_attention, flex_attention_backward):
            continue
        value = node.args[0].meta.get("val") if isinstance(node.args[0], fx.Node) else None
        if value is None or value.device.type != "neuron":
            continue
        if node.target is flex_attention:
            q, k, v, score_mod, block_mask, scale, kernel_options, *rest = node.args
            score_buffers, mask_buffers = (list(rest[0]) if rest else []), (list(rest[1]) if len(rest) > 1 else [])
            template, mask_tensors, mask_mods = _block_mask_parts(gm, block_mask)
            key = _key(gm, [score_mod, *mask_mods], (template[:-1], sorted(kernel_options.items())))
            device_flex.register_compiled(key, _module(gm, score_mod), None, template, kernel_options)
            with graph.inserting_before(node):
                new = graph.call_function(torch.ops.torchneuron.flex_attention.default,
                                          (q, k, v, mask_tensors, score_buffers, mask_buffers, key, float(scale)))
            new.meta.update(node.meta)
            node.replace_all_uses_with(new)
        else:
            (q, k, v, out, lse, grad_out, grad_lse, fw_graph, joint_graph, block_mask, scale,
             kernel_options, *rest) = node.args
            score_buffers, mask_buffers = (list(rest[0]) if rest else []), (list(rest[1]) if len(rest) > 1 else [])
            template, mask_tensors, mask_mods = _block_mask_parts(gm, block_mask)
            key = _key(gm, [fw_graph, joint_graph, *mask_mods], (template[:-1], sorted(kernel_options.items())))
            device_flex.register_compiled(key, _module(gm, fw_graph), _module(gm, joint_graph), template, kernel_options)
            with graph.inserting_before(node):
                new = graph.call_function(torch.ops.torchneuron.flex_attention_backward.default,
                                          (grad_out, q, k, v, out, lse, grad_lse, mask_tensors, score_buffers,
                                           mask_buffers, key, float(scale)))
            grads = node.meta["val"]  # a captured buffer's None grad: the op gives zeros like it
            new.meta.update(node.meta)
            new.meta["val"] = [*grads[:3], *(g if g is not None else b.meta["val"]
                                             for g, b in zip(grads[3], score_buffers))]
            # (grad q, grad k, grad v, (captured grads...)) becomes [grad q, grad k, grad v, captured...]
            for user in list(node.users):
                if user.target is operator.getitem and user.args[1] < 3:
                    user.args = (new, user.args[1])
                elif user.target is operator.getitem and user.args[1] == 3:
                    for inner in list(user.users):
                        inner.args = (new, 3 + inner.args[1])
                    graph.erase_node(user)
        graph.erase_node(node)
        count += 1
    if count:
        graph.eliminate_dead_code()
        gm.recompile()
    return count
