"""DTensor sharding strategies for CPU's flash attention, which neuron runs.

Why: ``F.scaled_dot_product_attention`` on neuron runs CPU's kernel
``aten._scaled_dot_product_flash_attention_for_cpu`` (a neuron tensor computes with the CPU
kernels), and DTensor (torch 2.13.0) has sharding strategies for the CUDA attention kernels
only, so attention on DTensors (PyTorch's ``tensor_parallelism/fsdp_tp_example.py``) failed
with ``NotImplementedError: Operator aten._scaled_dot_product_flash_attention_for_cpu.default
does not have a sharding strategy registered`` (as on a CPU mesh). The strategies here are
DTensor's own for CUDA's flash attention (``torch/distributed/tensor/_ops/_matrix_ops.py``)
for the CPU kernel's fewer outputs: everything replicated, or query/key/value/output/logsumexp
sharded on the heads (tensor parallelism) or on the batch. An ``attn_mask`` is not covered.

Registered with DTensor's ``register_op_strategy`` and ``expand_to_full_mesh_op_strategy``
(private; DTensor has no public way to add an op; checked on torch 2.13.0), once DTensor's
strategies are imported, and only if torch has none of its own for the op.
"""

from __future__ import annotations

import torch

_DTENSOR = "torch.distributed.tensor"  # its __init__ imports the strategies (_ops)
_installed = False


def install() -> None:
    """Registers the strategies (once; never over torch's own)."""
    global _installed
    if _installed:
        return
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor._op_schema import OpSchema, OpStrategy, RuntimeSchemaInfo
    from torch.distributed.tensor._ops._matrix_ops import _scaled_dot_product_flash_attention_backward_base_strategies
    from torch.distributed.tensor._ops.utils import expand_to_full_mesh_op_strategy, register_op_strategy
    from torch.distributed.tensor.placement_types import Replicate, Shard

    aten = torch.ops.aten
    forward = aten._scaled_dot_product_flash_attention_for_cpu.default
    backward = aten._scaled_dot_product_flash_attention_for_cpu_backward.default
    known = DTensor._op_dispatcher.sharding_propagator.op_strategy_funcs
    _installed = True
    if forward in known or backward in known:
        return

    @register_op_strategy(forward, schema_info=RuntimeSchemaInfo(3))
    def forward_strategy(op_schema: OpSchema) -> OpStrategy:
        # placements of [output, logsumexp, query, key, value]; (batch, heads, seq, ...) layouts
        strategies = [[Replicate()] * 5, [Shard(1)] * 5, [Shard(0)] * 5]
        return expand_to_full_mesh_op_strategy(op_schema.get_mesh_from_args(), op_schema, strategies,
                                               input_index=2)

    @register_op_strategy(backward, schema_info=RuntimeSchemaInfo(6))
    def backward_strategy(op_schema: OpSchema) -> OpStrategy:
        # [grad q, k, v, grad_out, q, k, v, out, logsumexp]: the CUDA kernel's order, without its extras
        strategies = _scaled_dot_product_flash_attention_backward_base_strategies(op_schema)
        return expand_to_full_mesh_op_strategy(op_schema.get_mesh_from_args(validate=False), op_schema,
                                               strategies, input_index=3)


def install_after_dtensor() -> None:
    """Runs :func:`install` now if DTensor is imported, else right after it is."""
    from torchneuron.distributed.import_hooks import after_import

    after_import(_DTENSOR, install, "add DTensor sharding strategies for CPU's flash attention")
