"""Roofline cost of one fused kernel (a compiled graph's pointwise/reduction group).

A fused kernel reads its inputs from HBM once and writes its outputs once: the
intermediates of the ops fused into it never touch HBM, which is how fusion
shows up in the model. Its compute is one engine pass per op over the kernel's
elements (transcendentals on ScalarE, the rest on VectorE), charged as
:func:`torchneuron.hardware.cost.roofline` charges eager ops, plus one launch.
"""

from __future__ import annotations

from dataclasses import dataclass

from torchneuron.hardware import cost as hw_cost
from torchneuron.hardware import flops as F

__all__ = ["KernelWork", "fused_kernel_cost"]


@dataclass(frozen=True)
class KernelWork:
    """What a fused kernel does, in the terms the roofline needs."""

    elements: int  # the largest loop's element count
    vector_ops: int  # VectorE passes over ``elements``
    scalar_ops: int  # ScalarE passes over ``elements``
    reductions: int  # reduction passes (VectorE)
    bytes_read: int
    bytes_written: int
    dtypes: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for name in ("elements", "vector_ops", "scalar_ops", "reductions", "bytes_read", "bytes_written"):
            if getattr(self, name) < 0:
                raise ValueError(f"KernelWork.{name} must be >= 0, got {getattr(self, name)}")


def fused_kernel_cost(work: KernelWork, target: hw_cost.CostTarget) -> hw_cost.OpCost:
    """Roofline seconds of one fused kernel: one launch, compulsory HBM traffic, engine passes."""
    vector = work.vector_ops + work.reductions
    return hw_cost.roofline(
        F.pointwise_work(
            formula="fused kernel: inputs read once, outputs written once; one engine pass per op",
            bytes_read=work.bytes_read, bytes_written=work.bytes_written, pass_elements=work.elements,
            flops_per_element=max(1, vector + work.scalar_ops),
            vector_passes=max(1, vector) if vector or not work.scalar_ops else 0,
            scalar_passes=work.scalar_ops, vector_dtypes=work.dtypes),
        target,
        op="fused kernel",
    )
