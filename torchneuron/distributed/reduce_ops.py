"""The reduce ops of neuron collectives: the eight gloo runs, and PREMUL_SUM, which it cannot.

Why: ``ReduceOp.PREMUL_SUM`` (``dist._make_nccl_premul_sum(f)``, ``ReduceOp.PREMUL_SUM(f)``)
multiplies each rank's input by ``f``, then sums, as NCCL does; FSDP2 reduce-scatters its
gradients with it whenever ``set_gradient_divide_factor`` is not the group's size
(torchtitan sets 1.0). gloo refuses it ("Cannot use ReduceOp.PREMUL_SUM with Gloo"), so
the kernels scale the inputs (in place where the collective overwrites them, a copy
where it only reads them) and run SUM on gloo.

The factor: c10d's ops hand a kernel the ReduceOp as a TorchScript object whose only
method is ``op()`` (torch 2.13.0); Python's ``ReduceOp.factor`` is on the pybind11 object
the kernels never see. ``torchneuron.device._core.premul_sum_factor`` reads it from the op's
supplement (``c10d::PreMulSumSupplement``, a public struct of c10d/Types.hpp), as NCCL does.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from torchneuron.device._core import cpu_view_borrowed

PREMUL_SUM = int(dist.ReduceOp.PREMUL_SUM)

# ReduceOp by its RedOpType number: what gloo reduces with.
_GLOO_OPS = {int(op): dist.ReduceOp(op) for op in (
    dist.ReduceOp.SUM, dist.ReduceOp.AVG, dist.ReduceOp.PRODUCT, dist.ReduceOp.MIN, dist.ReduceOp.MAX,
    dist.ReduceOp.BAND, dist.ReduceOp.BOR, dist.ReduceOp.BXOR)}

Factor = float | torch.Tensor


def resolve(op: str, boxed: Any) -> tuple[dist.ReduceOp, Factor | None]:
    """The ReduceOp gloo runs for c10d's boxed ``boxed`` and, for PREMUL_SUM, the factor the
    inputs are multiplied by first (SUM is then what gloo runs).

    Raises:
        ValueError: at once, for a reduce op the neuron backend cannot run, naming it.
    """
    code = boxed.op()
    found = _GLOO_OPS.get(code)
    if found is not None:
        return found, None
    if code == PREMUL_SUM:
        from torchneuron.device import _core

        return dist.ReduceOp.SUM, _core.premul_sum_factor(boxed)
    members = {int(v): k for k, v in dist.ReduceOp.RedOpType.__members__.items()}
    raise ValueError(f"{op}: the neuron backend cannot reduce with ReduceOp {members.get(code, code)}; "
                     f"use one of {', '.join(sorted(dist.ReduceOp.RedOpType.__members__))}")


def _host_factor(factor: Factor) -> Factor:
    """A tensor factor on neuron as a CPU view of its memory (the kernels work on host views)."""
    if isinstance(factor, torch.Tensor) and factor.device.type == "neuron":
        return cpu_view_borrowed(factor)
    return factor


def scale_(view: torch.Tensor, factor: Factor) -> None:
    """Multiplies a tensor the collective overwrites by ``factor``, in place."""
    view.mul_(_host_factor(factor))


def scaled(view: torch.Tensor, factor: Factor) -> torch.Tensor:
    """``view * factor`` in ``view``'s dtype, for a tensor the collective only reads."""
    return torch.mul(view, _host_factor(factor)).to(view.dtype)
