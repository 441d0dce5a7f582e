"""TorchNeuron's ``nki_op`` / ``wrap_nki``: NKI kernels inside a torch custom op.

In TorchNeuron, ``@nki_op("ns::name", mutates_args=...)`` turns a Python
function that calls NKI kernels (through ``wrap_nki(kernel)``) into a
``torch.library`` custom op, and the same function, run on fake tensors, is its
shape function for ``torch.compile``. Here kernels run on torchneuron's NKI
simulator (:mod:`torchneuron.nki`); ``wrap_nki`` lets the function run on fake
tensors by inferring the kernel's outputs from a traced run on zeros, as
``torchneuron.nki.torch_op`` does. Kernels must be ``torchneuron.nki.jit`` kernels
(optionally launched, ``kernel[2]``); NKI's compiled kernels from
``neuronxcc``/``nki`` packages are not supported.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable

import numpy as np
import torch

from torchneuron.nki.kernel import Kernel, Launch, to_hbm

__all__ = ["nki_op", "wrap_nki"]


def _is_fake(value: Any) -> bool:
    from torch._subclasses.fake_tensor import FakeTensor  # public class, no public alias (torch 2.13.0)

    return isinstance(value, FakeTensor) or (isinstance(value, torch.Tensor) and value.device.type == "meta")


class _WrappedKernel:
    """A kernel callable on real tensors (runs it) and on fake tensors (infers its outputs)."""

    def __init__(self, kernel: Kernel | Launch) -> None:
        if not isinstance(kernel, (Kernel, Launch)):
            raise TypeError(f"wrap_nki() expects a torchneuron.nki.jit kernel, got {type(kernel).__name__}")
        self.launch = kernel if isinstance(kernel, Launch) else Launch(kernel)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if any(_is_fake(v) for v in list(args) + list(kwargs.values())):
            return self._fake_outputs(args, kwargs)
        return self.launch(*args, **kwargs)

    def _fake_outputs(self, args: tuple, kwargs: dict) -> Any:
        """Empty tensors shaped as the kernel's results, on the inputs' (fake) device."""
        from torchneuron.nki.bridge import torch_dtype
        from torchneuron.nki.dtypes import resolve
        from torchneuron.nki.tensor import NkiTensor

        tensors = [v for v in list(args) + list(kwargs.values()) if isinstance(v, torch.Tensor)]
        device = tensors[0].device

        def zeros(value: Any, name: str) -> Any:
            if not isinstance(value, torch.Tensor):
                return value
            return to_hbm(np.zeros(tuple(value.shape), dtype=resolve(value.dtype).storage), name)

        run = self.launch.new_run()
        run.compute_values = False
        run.uninitialized = "ignore"
        result = self.launch.run_tensors(run, [zeros(a, f"arg{i}") for i, a in enumerate(args)],
                                         {k: zeros(v, k) for k, v in kwargs.items()})

        def convert(value: Any) -> Any:
            if isinstance(value, (tuple, list)):
                return type(value)(convert(v) for v in value)
            if isinstance(value, NkiTensor):
                return torch.empty(tuple(value.shape), dtype=torch_dtype(value.dtype), device=device)
            return value

        return convert(result)


def wrap_nki(kernel: Kernel | Launch) -> Callable[..., Any]:
    """Make ``kernel`` callable inside an :func:`nki_op` function, eager and under ``torch.compile``."""
    return _WrappedKernel(kernel)


def nki_op(name: str, fn: Callable[..., Any] | None = None,
           mutates_args: str | Iterable[str] = ()) -> Any:
    """Register ``fn`` (type-annotated, calling kernels through :func:`wrap_nki`) as the custom op ``name``.

    ``name`` is ``"namespace::op"``; ``mutates_args`` names the arguments ``fn``
    writes in place (or ``"unknown"``). Use as ``@nki_op("mylib::add")`` or
    ``nki_op("mylib::add", fn)``. Returns the ``torch.library`` custom op, so
    ``register_autograd`` adds a backward.
    """

    def register(function: Callable[..., Any]) -> Any:
        op = torch.library.custom_op(name, function, mutates_args=mutates_args)
        op.register_fake(function)  # wrap_nki makes the function run on fake tensors
        return op

    return register if fn is None else register(fn)
