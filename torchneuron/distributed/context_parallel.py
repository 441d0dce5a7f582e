"""Context parallelism on neuron: ring attention over the fused attention op, as PyTorch's
``context_parallel`` does for CUDA's attention kernels.

Why: ``torch.distributed.tensor.experimental.context_parallel`` (torch 2.13.0) shards the
sequence of q/k/v and hands DTensor's SDPA ops to its ring-attention handlers, but only for
CUDA's flash, efficient and cuDNN kernels. On neuron, SDPA runs
``aten._scaled_dot_product_fused_attention_overrideable``, which no handler knew: the
sequence-sharded inputs were gathered and the result had the whole sequence where the caller
expected its shard (torchtitan ``context_parallel_degree=2`` ended in a shape error). Here the
fused op and its backward get handlers that run PyTorch's own ring templates
(``_templated_ring_attention`` and its backward: K/V passed round the ring, log-sum-exp merging,
the causal load balancing) over the neuron kernel, and return sequence-sharded results.

What the fused kernel cannot do in a ring is refused with a clear error, never computed wrong:
an attention mask (``attn_bias``), dropout (its log-sum-exp is not computed) and q/k/v that are
not all sharded over a 1-D mesh. As in CUDA's handler, the ring runs over dimension 2 of the
local tensors whatever shard the DTensors name, and the results are placed as the inputs.

Private torch API (the CP module's handler table and ring templates, DTensor's op info),
checked on torch 2.13.0; installed right after the CP module is imported.
"""

from __future__ import annotations

from typing import Any

import torch

_CP_MODULE = "torch.distributed.tensor.experimental._context_parallel._attention"
_SEQ_DIM = 2
_installed = False

aten = torch.ops.aten


def _cp_mesh(tensors: list[Any], what: str) -> Any:
    """The 1-D mesh q/k/v are sharded over. As CUDA's handler does, the ring runs over the local
    tensors' sequence dimension whatever shard the DTensors name (torchtitan labels its
    sequence-sharded q/k/v as it transposes them: Shard(1)); replicated inputs are refused."""
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.placement_types import Shard

    mesh = None
    for t in tensors:
        if (not isinstance(t, DTensor) or t.device_mesh.ndim != 1
                or not all(isinstance(p, Shard) for p in t.placements)):
            placements = t.placements if isinstance(t, DTensor) else "a plain tensor"
            raise NotImplementedError(
                f"{what} under context_parallel on neuron needs query, key and value sharded (on the "
                f"sequence, dimension {_SEQ_DIM} of their local tensors) over a 1-D mesh; got {placements}. "
                "Give context_parallel the sequence dimension of the attention inputs.")
        mesh = t.device_mesh
    return mesh


def _wrap(local: torch.Tensor, like: Any, global_shape: list[int]) -> Any:
    """A DTensor over ``local`` placed as ``like`` (the input it corresponds to)."""
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor._dtensor_spec import DTensorSpec, TensorMeta

    if any(p.dim >= local.dim() for p in like.placements):
        raise NotImplementedError(f"context_parallel on neuron: {like.placements} does not place a "
                                  f"{local.dim()}-d attention result")
    shape = torch.Size(global_shape)
    spec = DTensorSpec(like.device_mesh, like.placements,
                       tensor_meta=TensorMeta(shape, _global_stride(local, shape), local.dtype))
    return DTensor(local, spec, requires_grad=False)


def _global_stride(local: torch.Tensor, global_shape: torch.Size) -> tuple[int, ...]:
    """The dense strides of the global tensor in the local shard's dimension order."""
    order = sorted(range(local.dim()), key=lambda d: local.stride(d), reverse=True)
    stride, running = [0] * local.dim(), 1
    for d in reversed(order):
        stride[d] = running
        running *= global_shape[d]
    return tuple(stride)


def _forward(op_call, args, kwargs) -> Any:
    from torch.distributed.tensor.experimental._context_parallel._attention import _templated_ring_attention

    names = ("query", "key", "value", "attn_bias", "dropout_p", "is_causal", "return_debug_mask")
    given = dict(zip(names, args), **kwargs)
    what = "scaled_dot_product_attention"
    if given.get("attn_bias") is not None:
        raise NotImplementedError(f"{what} under context_parallel on neuron does not take an attention "
                                  "mask (as on CUDA); use is_causal=True.")
    if given.get("dropout_p", 0.0) or given.get("return_debug_mask", False):
        raise NotImplementedError(f"{what} under context_parallel on neuron runs without dropout; "
                                  "set dropout_p=0.")
    q, k, v = given["query"], given["key"], given["value"]
    mesh = _cp_mesh([q, k, v], what)
    out, lse, *rest = _templated_ring_attention(
        mesh.get_group(), _SEQ_DIM, aten._scaled_dot_product_fused_attention_overrideable.default,
        query=q.to_local(), key=k.to_local(), value=v.to_local(), is_causal=bool(given.get("is_causal", False)),
        attn_bias=None, dropout_p=0.0, return_debug_mask=False, scale=given.get("scale"))
    return (_wrap(out, q, [*q.shape[:-1], v.shape[-1]]), _wrap(lse, q, list(q.shape[:3])), *rest)


def _backward(op_call, args, kwargs) -> Any:
    from torch.distributed.tensor.experimental._context_parallel._attention import (
        _templated_ring_attention_backward,
    )

    names = ("grad_out", "query", "key", "value", "attn_bias", "grad_input_mask", "out", "logsumexp",
             "cum_seq_q", "cum_seq_k", "max_q", "max_k", "dropout_p", "is_causal", "philox_seed",
             "philox_offset")
    given = dict(zip(names, args), **kwargs)
    tensors = [given[n] for n in ("grad_out", "query", "key", "value", "out", "logsumexp")]
    mesh = _cp_mesh(tensors[1:4], "the backward of scaled_dot_product_attention")
    local = [t.to_local() if hasattr(t, "to_local") else t for t in tensors]
    grad_q, grad_k, grad_v, *_ = _templated_ring_attention_backward(
        mesh.get_group(), _SEQ_DIM, aten._scaled_dot_product_fused_attention_overrideable_backward.default,
        grad_out=local[0], grad_out_name="grad_out", query=local[1], key=local[2], value=local[3],
        out=local[4], logsumexp=local[5], is_causal=bool(given["is_causal"]),
        attn_bias=None, grad_input_mask=given["grad_input_mask"], cum_seq_q=None, cum_seq_k=None,
        max_q=local[1].size(_SEQ_DIM), max_k=local[2].size(_SEQ_DIM), dropout_p=0.0,
        philox_seed=given["philox_seed"], philox_offset=given["philox_offset"], scale=given.get("scale"))
    q, k, v = tensors[1:4]
    return (_wrap(grad_q, q, list(q.shape)), _wrap(grad_k, k, list(k.shape)),
            _wrap(grad_v, v, list(v.shape)), None)


def install() -> None:
    """Adds the neuron fused attention to context_parallel's handlers (once)."""
    global _installed
    if _installed:
        return
    import sys

    cp = sys.modules[_CP_MODULE]
    _installed = True
    cp.custom_ops[aten._scaled_dot_product_fused_attention_overrideable.default] = _forward
    cp.custom_ops[aten._scaled_dot_product_fused_attention_overrideable_backward.default] = _backward


def install_after_import() -> None:
    from torchneuron.distributed.import_hooks import after_import

    after_import(_CP_MODULE, install, "give context_parallel ring attention over neuron's fused attention")
