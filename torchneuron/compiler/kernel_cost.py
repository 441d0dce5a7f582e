"""What one fused kernel Inductor generated for neuron does, for the cost model.

:func:`work_of` reads an Inductor scheduler node (fused or not) into a
:class:`~torchneuron.hardware.fused.KernelWork`: element count, VectorE and
ScalarE passes (one per op in the loop body), reductions, and the bytes the
kernel reads and writes (Inductor's estimate of its compulsory traffic, which
excludes the intermediates fusion keeps out of memory).

Extern kernels (matmuls, convolutions, fallbacks) are not costed here: they
run through the device's op path, which charges them itself.
"""

from __future__ import annotations

import math
from typing import Any

from torchneuron.hardware.fused import KernelWork

# Loop-body entries that are data movement or indexing, not engine work.
_NOT_COMPUTE = frozenset(
    {"load", "store", "store_reduction", "index_expr", "indirect_indexing", "constant", "masked",
     "get_index", "load_seed", "to_dtype", "to_dtype_bitcast", "check_bounds", "output",
     "placeholder", "call_module", "bucketize", "reduction", "scan", "sort"}
)  # fmt: skip
# ScalarE runs transcendental activations (trainium-facts.md: Engines).
_SCALAR_ENGINE = frozenset(
    {"exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "sqrt", "rsqrt", "reciprocal",
     "sigmoid", "tanh", "erf", "erfc", "erfinv", "sin", "cos", "tan", "asin", "acos", "atan",
     "sinh", "cosh", "asinh", "acosh", "atanh", "pow", "atan2", "lgamma", "digamma"}
)  # fmt: skip


def work_of(node: Any) -> KernelWork:
    """The work of an Inductor scheduler node; reads ``LoopBody.op_counts``, ``_sizes``
    and the scheduler's byte estimates (checked against torch 2.13.0's Inductor)."""
    vector = scalar = reductions = 0
    elements = 1
    dtypes: set[str] = set()
    for snode in node.get_nodes():
        body = getattr(snode, "_body", None)
        for name, count in (body.op_counts if body is not None else {}).items():
            if name in _SCALAR_ENGINE:
                scalar += count
            elif name == "reduction":
                reductions += count
            elif name not in _NOT_COMPUTE:
                vector += count
        sizes = getattr(snode, "_sizes", None) or ()
        elements = max(elements, math.prod(int(s) for part in sizes for s in part))
        buffer = getattr(snode, "node", None)
        if buffer is not None and hasattr(buffer, "get_dtype"):
            dtypes.add(str(buffer.get_dtype()).removeprefix("torch."))
    return KernelWork(elements=elements, vector_ops=vector, scalar_ops=scalar, reductions=reductions,
                      bytes_read=int(node.get_read_buffer_sizes()),
                      bytes_written=int(node.get_write_buffer_sizes()), dtypes=tuple(sorted(dtypes)))
