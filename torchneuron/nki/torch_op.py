"""Registering an NKI kernel as a torch custom op, so it composes with autograd and ``torch.compile``.

``torch_op("mylib::rms_norm", kernel)`` defines the op from the kernel's own
signature (parameters without defaults are tensors, the others keep their
default's type), runs the kernel on ``neuron`` (or CPU) tensors, and infers
output shapes for ``torch.compile`` by tracing the kernel on zero inputs of the
fake tensors' shapes (cached per input signature), so a compiled graph calls
the kernel without a graph break. ``backward=`` adds an autograd formula,
typically another NKI kernel, so a kernel pair trains.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable, Sequence

import numpy as np
import torch

from torchneuron.nki.dtypes import resolve
from torchneuron.nki.kernel import Kernel, Launch, to_hbm
from torchneuron.nki.tensor import NkiTensor

__all__ = ["torch_op"]

_SCALAR_TYPES = (bool, int, float, str)


def _schema_signature(fn: Callable[..., Any], outputs: int) -> inspect.Signature:
    params = []
    for param in inspect.signature(fn).parameters.values():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise TypeError(f"torch_op: kernel parameter {param.name!r} is variadic; torch ops need a fixed "
                            "signature")
        if param.default is param.empty:
            annotation: Any = torch.Tensor
        elif isinstance(param.default, _SCALAR_TYPES):
            annotation = type(param.default)
        elif param.default is None:
            annotation = torch.Tensor | None
        else:
            raise TypeError(f"torch_op: default of kernel parameter {param.name!r} is a "
                            f"{type(param.default).__name__}; torch ops take tensors, bools, ints, floats, "
                            "strs")
        params.append(param.replace(annotation=annotation, kind=param.POSITIONAL_OR_KEYWORD))
    returns: Any = torch.Tensor if outputs == 1 else tuple[(torch.Tensor,) * outputs]  # type: ignore[misc]
    return inspect.Signature(params, return_annotation=returns)


class _ShapeInference:
    """Output shapes and dtypes of a kernel for given input shapes, from a traced run on zeros."""

    def __init__(self, launch: Launch, outputs: int) -> None:
        self.launch = launch
        self.outputs = outputs
        self._cache: dict[tuple, list[tuple[tuple[int, ...], Any]]] = {}

    def __call__(self, args: Sequence[Any]) -> list[tuple[tuple[int, ...], Any]]:
        key = tuple((tuple(a.shape), a.dtype) if isinstance(a, torch.Tensor) else ("scalar", a) for a in args)
        if key not in self._cache:
            self._cache[key] = self._trace(args)
        return self._cache[key]

    def _trace(self, args: Sequence[Any]) -> list[tuple[tuple[int, ...], Any]]:
        run = self.launch.new_run()
        run.compute_values = False
        run.uninitialized = "ignore"
        hbm = [to_hbm(np.zeros(tuple(a.shape), dtype=resolve(a.dtype).storage), f"arg{i}")
               if isinstance(a, torch.Tensor) else a for i, a in enumerate(args)]
        result = self.launch.run_tensors(run, hbm, {})
        results = result if isinstance(result, (tuple, list)) else (result,)
        if len(results) != self.outputs or not all(isinstance(r, NkiTensor) for r in results):
            raise RuntimeError(f"kernel {self.launch.kernel.name!r} returned {len(results)} value(s); "
                               f"torch_op was declared with outputs={self.outputs} tensors")
        from torchneuron.nki.bridge import torch_dtype

        return [(tuple(r.shape), torch_dtype(r.dtype)) for r in results]


def torch_op(name: str, kernel: Kernel | Launch, *, outputs: int = 1, mutates_args: Sequence[str] = (),
             backward: Callable[..., Any] | None = None,
             setup_context: Callable[..., Any] | None = None) -> Any:
    """Register ``kernel`` (or ``kernel[2]``) as the torch op ``name`` (``"namespace::op"``).

    Args:
        name: the op's qualified name; call it as ``torch.ops.namespace.op`` or through the returned object.
        kernel: an ``@nki.jit`` kernel, optionally launched (``kernel[2]`` for LNC2).
        outputs: how many tensors the kernel returns.
        mutates_args: names of tensor parameters the kernel writes in place.
        backward, setup_context: as in ``torch.library.register_autograd``; ``backward`` may call
            other NKI kernels (on the same device).

    Returns:
        The ``torch.library`` custom op (callable, with ``register_fake``/``register_autograd``).
    """
    launch = kernel if isinstance(kernel, Launch) else Launch(kernel)
    infer = _ShapeInference(launch, outputs)

    def run(*args: Any) -> Any:
        return launch(*args)

    signature = _schema_signature(launch.kernel.fn, outputs)
    run.__signature__ = signature  # type: ignore[attr-defined]
    run.__name__ = launch.kernel.name
    op = torch.library.custom_op(name, run, mutates_args=tuple(mutates_args))

    def fake(*args: Any) -> Any:
        device = next(a.device for a in args if isinstance(a, torch.Tensor))
        shapes = infer(args)
        made = [torch.empty(shape, dtype=dtype, device=device) for shape, dtype in shapes]
        return made[0] if outputs == 1 else tuple(made)

    fake.__signature__ = signature  # type: ignore[attr-defined]
    op.register_fake(fake)
    if backward is not None:
        op.register_autograd(backward, setup_context=setup_context)
    return op
