"""Modelled Trainium time of one fused kernel Inductor generated for neuron.

A fused kernel reads its inputs from HBM once and writes its outputs once:
the intermediates of the ops fused into it never touch HBM, which is how
fusion shows up in the model. Its compute is one engine pass per pointwise op
over the kernel's elements (transcendentals on ScalarE, the rest on VectorE),
as :func:`torchneuron.hardware.cost.roofline` charges eager ops.

Extern kernels (matmuls, convolutions, fallbacks) are not costed here: they
run through the device's op path, which charges them itself.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from torchneuron.hardware import cost as hw_cost
from torchneuron.hardware import flops as F

# Loop-body entries that are data movement or indexing, not engine work.
_NOT_COMPUTE = frozenset(
    {"load", "store", "store_reduction", "index_expr", "indirect_indexing", "constant", "masked",
     "get_index", "load_seed", "to_dtype", "to_dtype_bitcast", "check_bounds", "output",
     "placeholder", "call_module", "bucketize", "reduction", "scan", "sort"}
)  # fmt: skip
_SCALAR_ENGINE = frozenset(
    {"exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "sqrt", "rsqrt", "reciprocal",
     "sigmoid", "tanh", "erf", "erfc", "erfinv", "sin", "cos", "tan", "asin", "acos", "atan",
     "sinh", "cosh", "asinh", "acosh", "atanh", "pow", "atan2", "lgamma", "digamma", "libdevice_exp",
     "libdevice_log", "libdevice_sqrt", "libdevice_abs"}
)  # fmt: skip


@dataclass(frozen=True)
class KernelWork:
    """What a fused kernel does, in the terms the roofline needs."""

    elements: int  # the largest loop's element count
    vector_ops: int  # VectorE passes over ``elements``
    scalar_ops: int  # ScalarE passes over ``elements``
    reductions: int  # reduction passes (VectorE)
    bytes_read: int
    bytes_written: int
    dtypes: tuple[str, ...]


def kernel_cost(work: KernelWork, target: hw_cost.CostTarget) -> hw_cost.OpCost:
    """Roofline seconds of one fused kernel: one launch, compulsory HBM traffic, engine passes."""
    vector = work.vector_ops + work.reductions
    formula = "fused kernel: inputs read once, outputs written once; one engine pass per op"
    return hw_cost.roofline(
        F.pointwise_work(formula=formula, bytes_read=work.bytes_read, bytes_written=work.bytes_written,
                         pass_elements=work.elements, flops_per_element=max(1, vector + work.scalar_ops),
                         vector_passes=max(1, vector) if vector or not work.scalar_ops else 0,
                         scalar_passes=work.scalar_ops, vector_dtypes=work.dtypes),
        target,
        op="inductor fused kernel",
    )


def work_of(node) -> KernelWork:
    """The :class:`KernelWork` of an Inductor scheduler node (fused or not).

    Reads ``LoopBody.op_counts`` and the scheduler's byte estimate; checked
    against torch 2.13.0's Inductor.
    """
    vector = scalar = reductions = 0
    elements = 1
    dtypes: set[str] = set()
    for snode in node.get_nodes():
        body = getattr(snode, "_body", None)
        counts = body.op_counts if body is not None else {}
        for name, count in counts.items():
            if name in _SCALAR_ENGINE:
                scalar += count
            elif name == "reduction":
                reductions += count
            elif name not in _NOT_COMPUTE:
                vector += count
        group = getattr(snode, "_sizes", None) or ()
        size = math.prod(int(s) for part in group for s in part) if group else 0
        elements = max(elements, size)
        buffer = getattr(snode, "node", None)
        if buffer is not None and hasattr(buffer, "get_dtype"):
            dtypes.add(str(buffer.get_dtype()).removeprefix("torch."))
    return KernelWork(
        elements=elements,
        vector_ops=vector,
        scalar_ops=scalar,
        reductions=reductions,
        bytes_read=int(node.get_read_buffer_sizes()),
        bytes_written=int(node.get_write_buffer_sizes()),
        dtypes=tuple(sorted(dtypes)),
    )
