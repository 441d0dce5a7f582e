"""What one fused kernel Inductor generated for neuron does, for the cost model.

:func:`work_of` reads an Inductor scheduler node (fused or not) into a
:class:`~torchneuron.hardware.fused.KernelWork`: element count, VectorE and
ScalarE passes (one per op in the loop body), reductions, and the bytes the
kernel reads and writes (Inductor's estimate of its compulsory traffic, which
excludes the intermediates fusion keeps out of memory).

With dynamic shapes a kernel's element count is an expression of the graph's
size symbols: :func:`work_of` then returns it beside the work at the sizes
Inductor compiled for (its size hints), and the generated code charges each
run at its actual element count (:func:`torchneuron.device.kernel_costs.register_dynamic`).

Extern kernels (matmuls, convolutions, fallbacks) are not costed here: they
run through the device's op path, which charges them itself.
"""

from __future__ import annotations

from typing import Any

import sympy
from torch._inductor.virtualized import V

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


def work_of(node: Any) -> tuple[KernelWork, sympy.Expr | None]:
    """The work of an Inductor scheduler node at its compiled sizes, and its element count
    as an expression of size symbols when the shapes are dynamic (else None); reads
    ``LoopBody.op_counts``, ``_sizes`` and the scheduler's byte estimates, which use the
    size hints (checked against torch 2.13.0's Inductor)."""
    vector = scalar = reductions = 0
    elements: sympy.Expr = sympy.Integer(1)
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
        elements = sympy.Max(elements, sympy.Mul(*(s for part in sizes for s in part)))
        buffer = getattr(snode, "node", None)
        if buffer is not None and hasattr(buffer, "get_dtype"):
            dtypes.add(str(buffer.get_dtype()).removeprefix("torch."))
    symbolic = None if elements.is_number else elements
    hint = int(elements) if symbolic is None else V.graph.sizevars.optimization_hint(elements, fallback=1)
    work = KernelWork(elements=hint, vector_ops=vector, scalar_ops=scalar, reductions=reductions,
                      bytes_read=int(node.get_read_buffer_sizes()),
                      bytes_written=int(node.get_write_buffer_sizes()), dtypes=tuple(sorted(dtypes)))
    return work, symbolic
