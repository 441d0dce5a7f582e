"""DTensor sharding strategies for the attention kernels neuron runs.

Why: ``F.scaled_dot_product_attention`` on neuron runs the fused kernel PyTorch leaves to
PrivateUse1 backends, ``aten._scaled_dot_product_fused_attention_overrideable`` (and its
backward; csrc/aten/attention.cpp); direct callers may also run CPU's
``aten._scaled_dot_product_flash_attention_for_cpu``. DTensor (torch 2.13.0) has sharding
strategies for the CUDA attention kernels only, so attention on DTensors (PyTorch's
``tensor_parallelism/fsdp_tp_example.py``) failed with ``NotImplementedError: Operator ...
does not have a sharding strategy registered``. The strategies here are DTensor's own for
CUDA's flash attention (``torch/distributed/tensor/_ops/_matrix_ops.py``) for these kernels'
outputs: everything replicated, or query/key/value/output/logsumexp sharded on the heads
(tensor parallelism) or on the batch. An attention mask of the fused kernel follows the
sharded dimension where it has that dimension in full and is replicated where it broadcasts.
Sequence-sharded inputs (context parallelism) match no strategy and are redistributed.

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

    aten = torch.ops.aten
    forward = aten._scaled_dot_product_flash_attention_for_cpu.default
    backward = aten._scaled_dot_product_flash_attention_for_cpu_backward.default
    fused = aten._scaled_dot_product_fused_attention_overrideable.default
    fused_backward = aten._scaled_dot_product_fused_attention_overrideable_backward.default
    known = DTensor._op_dispatcher.sharding_propagator.op_strategy_funcs
    _installed = True
    if forward not in known and backward not in known:
        _register_cpu_flash(forward, backward)
    if fused not in known and fused_backward not in known:
        _register_fused(fused, fused_backward)



def _register_cpu_flash(forward, backward) -> None:
    from torch.distributed.tensor._op_schema import OpSchema, OpStrategy, RuntimeSchemaInfo
    from torch.distributed.tensor._ops._matrix_ops import _scaled_dot_product_flash_attention_backward_base_strategies
    from torch.distributed.tensor._ops.utils import expand_to_full_mesh_op_strategy, register_op_strategy
    from torch.distributed.tensor.placement_types import Replicate, Shard

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


def _mask_placement(mask_strategy, dim: int):
    """The mask follows a sharded (batch or heads) dimension it has in full; else it broadcasts."""
    from torch.distributed.tensor.placement_types import Replicate, Shard

    shape = mask_strategy.shape
    axis = len(shape) - 4 + dim  # masks broadcast from the right: [L, S], [B, 1, L, S], ...
    return Shard(axis) if axis >= 0 and shape[axis] > 1 else Replicate()


def _register_fused(forward, backward) -> None:
    from torch.distributed.tensor._op_schema import OpSchema, OpStrategy, RuntimeSchemaInfo
    from torch.distributed.tensor._ops.utils import expand_to_full_mesh_op_strategy, register_op_strategy
    from torch.distributed.tensor.placement_types import Replicate, Shard

    def placements(op_schema: OpSchema, first_tensor: int, outputs, tensors):
        """One strategy per layout: outputs, then each tensor argument from ``first_tensor``."""
        args = op_schema.args_schema
        strategies = []
        for dim in (None, 1, 0):  # everything replicated, heads sharded, batch sharded
            data = Replicate() if dim is None else Shard(dim)
            row = list(outputs(data))
            for index in range(first_tensor, len(args)):
                if not isinstance(args[index], OpStrategy):
                    continue
                kind = tensors.get(index, "replicated")
                if kind == "data":
                    row.append(data)
                elif kind == "mask":
                    row.append(Replicate() if dim is None else _mask_placement(args[index], dim))
                else:
                    row.append(Replicate())
            strategies.append(row)
        return strategies

    @register_op_strategy(forward, schema_info=RuntimeSchemaInfo(4))
    def forward_strategy(op_schema: OpSchema) -> OpStrategy:
        # outputs: output, logsumexp, cum_seq_q, cum_seq_k, max_q, max_k, philox_seed,
        # philox_offset, debug_attn_mask; tensors: query, key, value[, attn_bias]
        def outputs(data):
            return [data, data, None, None, None, None, Replicate(), Replicate(), Replicate()]
        strategies = placements(op_schema, 0, outputs, {0: "data", 1: "data", 2: "data", 3: "mask"})
        return expand_to_full_mesh_op_strategy(op_schema.get_mesh_from_args(), op_schema, strategies,
                                               input_index=9)

    @register_op_strategy(backward, schema_info=RuntimeSchemaInfo(5))
    def backward_strategy(op_schema: OpSchema) -> OpStrategy:
        # outputs: grad q, k, v, grad attn_bias (never computed: a mask needing grad takes math);
        # tensors: grad_out, query, key, value[, attn_bias], out, logsumexp, philox seed/offset
        def outputs(data):
            return [data, data, data, None]
        roles = {0: "data", 1: "data", 2: "data", 3: "data", 4: "mask", 6: "data", 7: "data"}
        strategies = placements(op_schema, 0, outputs, roles)
        return expand_to_full_mesh_op_strategy(op_schema.get_mesh_from_args(validate=False), op_schema,
                                               strategies, input_index=4)


def install_after_dtensor() -> None:
    """Runs :func:`install` now if DTensor is imported, else right after it is."""
    from torchneuron.distributed.import_hooks import after_import

    after_import(_DTENSOR, install, "add DTensor sharding strategies for CPU's flash attention")
