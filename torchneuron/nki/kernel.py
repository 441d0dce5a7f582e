"""``nki.jit`` kernels, launch grids and ``nki.simulate``.

A kernel here always runs on the simulator: NumPy arguments run "baremetal",
torch tensors (``neuron`` or CPU) go through :mod:`torchneuron.nki.bridge`.
Launches follow current NKI (``kernel[lnc]``, LNC 1 or 2; nki-api-facts.md: 1)
and still accept the legacy SPMD grid (``kernel[4, 2]``, programs run one
after another on one core; nki-api-facts.md: 10) with a deprecation warning.
"""

from __future__ import annotations

import functools
import warnings
from typing import Any, Callable

import numpy as np

from torchneuron.hardware.specs import ChipSpec, get_chip
from torchneuron.nki import context
from torchneuron.nki.context import KernelRun
from torchneuron.nki.dtypes import resolve
from torchneuron.nki.memory import Allocation, Buffer
from torchneuron.nki.tensor import NkiTensor

__all__ = ["Kernel", "jit", "simulate", "simulate_kernel", "Launch"]

_DEPRECATED_JIT_OPTIONS = ("mode",)


class Launch:
    """A kernel with its launch configuration (``kernel[2]``, ``kernel[4, 2]``) and run options."""

    def __init__(self, kernel: "Kernel", grid: tuple[int, ...] = (1,), lnc: int = 1,
                 target: str | ChipSpec | None = None, uninitialized: str | None = None) -> None:
        self.kernel = kernel
        self.grid = grid
        self.lnc = lnc
        self.target = target
        self.uninitialized = uninitialized

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if _has_torch_tensor(args, kwargs):
            from torchneuron.nki import bridge

            return bridge.call(self, args, kwargs)
        return self.run_numpy(args, kwargs)[0]

    def new_run(self) -> KernelRun:
        target = self.target
        chip = get_chip(target) if isinstance(target, str) else (target or context.default_target())
        return KernelRun(kernel_name=self.kernel.name, target=chip, grid=self.grid, lnc=self.lnc,
                         uninitialized=context.resolve_uninitialized_policy(self.uninitialized))

    def run_numpy(self, args: tuple, kwargs: dict) -> tuple[Any, KernelRun]:
        """Run on NumPy arguments (updated in place where the kernel writes them); NumPy results."""
        run = self.new_run()
        hbm_args = [to_hbm(a, f"arg{i}") if isinstance(a, np.ndarray) else a for i, a in enumerate(args)]
        hbm_kwargs = {k: to_hbm(v, k) if isinstance(v, np.ndarray) else v for k, v in kwargs.items()}
        outputs = self.run_tensors(run, hbm_args, hbm_kwargs)
        return _to_numpy(outputs), run

    def run_tensors(self, run: KernelRun, args: list, kwargs: dict) -> Any:
        """Run every program of the launch over ``NkiTensor`` arguments; the last program's outputs."""
        outputs = None
        self.kernel.last_run = run
        with context.running(run):
            for index in np.ndindex(*self.grid):
                with context.as_program(run, tuple(int(i) for i in index)):
                    outputs = self.kernel.fn(*args, **kwargs)
            run.check_memory()
            _check_outputs(self.kernel.name, outputs)
        return outputs


class Kernel:
    """A function decorated with ``@nki.jit``; call it, or launch it with ``kernel[lnc](...)``."""

    def __init__(self, fn: Callable[..., Any], **options: Any) -> None:
        if "platform_target" in options:
            raise ValueError("nki.jit(platform_target=...) was removed in NKI 0.3.0: set the "
                             "NEURON_PLATFORM_TARGET_OVERRIDE environment variable (trn1, trn2 or trn3)")
        self.fn = fn
        self.options = {k: v for k, v in options.items() if k not in _DEPRECATED_JIT_OPTIONS}
        self.name = getattr(fn, "__name__", "kernel")
        self.last_run: KernelRun | None = None
        functools.update_wrapper(self, fn)

    def __getitem__(self, grid: Any) -> Launch:
        return launch_for(self, grid)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return Launch(self)(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<nki kernel {self.name}>"


def launch_for(kernel: Kernel, grid: Any, **options: Any) -> Launch:
    """Parse ``kernel[...]``: one number 1 or 2 is an LNC launch; anything else a legacy SPMD grid."""
    dims = grid if isinstance(grid, tuple) else (grid,)
    dims = tuple(getattr(d, "lnc_degree", d) for d in dims)
    if not all(isinstance(d, (int, np.integer)) and not isinstance(d, bool) and d >= 1 for d in dims):
        raise TypeError(f"a kernel launch takes positive ints, e.g. kernel[2](...); got kernel[{grid!r}]")
    dims = tuple(int(d) for d in dims)
    if len(dims) == 1 and dims[0] in (1, 2):
        return Launch(kernel, dims, lnc=dims[0], **options)
    warnings.warn(f"kernel[{', '.join(map(str, dims))}]: SPMD launch grids are legacy NKI; current NKI "
                  "accepts only kernel[1] or kernel[2] (the LNC degree). The programs run one after "
                  "another on one NeuronCore, as legacy NKI did.", DeprecationWarning, stacklevel=3)
    return Launch(kernel, dims, lnc=1, **options)


def jit(fn: Callable[..., Any] | None = None, **options: Any) -> Any:
    """Make ``fn`` an NKI kernel (``@nki.jit`` or ``@nki.jit(...)``); ``mode=`` is accepted and ignored."""
    if fn is None:
        return lambda f: Kernel(f, **options)
    if isinstance(fn, Kernel):
        return fn
    return Kernel(fn, **options)


def simulate(kernel: Any, *, target: str | None = None, uninitialized: str | None = None) -> Launch:
    """``nki.simulate(kernel)(*args)``: run ``kernel`` (or ``kernel[2]``) on the simulator.

    ``target`` picks the chip (default: ``NEURON_PLATFORM_TARGET_OVERRIDE``, else
    the neuron device's chip); ``uninitialized`` is what a read of never-written
    memory does: ``"warn"`` (default), ``"error"`` or ``"ignore"``.
    """
    if isinstance(kernel, Launch):
        return Launch(kernel.kernel, kernel.grid, kernel.lnc, target or kernel.target,
                      uninitialized or kernel.uninitialized)
    if not isinstance(kernel, Kernel):
        kernel = Kernel(kernel)
    return Launch(kernel, target=target, uninitialized=uninitialized)


def simulate_kernel(kernel: Any, *args: Any, **kwargs: Any) -> Any:
    """Legacy ``nki.simulate_kernel(kernel[grid], *numpy_args)``."""
    return simulate(kernel)(*args, **kwargs)


def to_hbm(array: np.ndarray, name: str, buffer: Buffer = Buffer.shared_hbm, dtype: Any = None) -> NkiTensor:
    """An HBM tensor aliasing ``array`` (kernel writes land in it, as in AWS's simulator)."""
    nki_dtype = resolve(dtype if dtype is not None else array.dtype)
    if array.dtype != nki_dtype.storage:
        raise TypeError(f"argument {name!r} is stored as {array.dtype}, expected {nki_dtype.storage}")
    alloc = Allocation.create(buffer, tuple(array.shape), nki_dtype, name, initial=array)
    return NkiTensor(alloc)


def _check_outputs(name: str, outputs: Any) -> None:
    """Outputs must be shared HBM; an output the kernel never fully wrote is reported."""
    for out in outputs if isinstance(outputs, (tuple, list)) else (outputs,):
        if not isinstance(out, NkiTensor):
            continue
        if out.buffer is not Buffer.shared_hbm:
            from torchneuron.nki.errors import fail

            fail("return", f"kernel {name!r} returns {out.name!r} in {out.buffer.value}; every returned "
                 "output must be allocated with buffer=nl.shared_hbm")
        mask = out._mask
        if context.uninitialized_policy() != "ignore" and mask.size and not mask.all():
            missing = int(mask.size - np.count_nonzero(mask))
            context.warn_uninitialized(
                "return", f"kernel {name!r} returns {out.name!r} with {missing} of {mask.size} elements "
                "never written (they hold the simulator's NaN / 4 fill)", None)


def _to_numpy(outputs: Any) -> Any:
    if isinstance(outputs, NkiTensor):
        return outputs.values()
    if isinstance(outputs, (tuple, list)):
        return type(outputs)(_to_numpy(o) for o in outputs)
    return outputs


def _has_torch_tensor(args: tuple, kwargs: dict) -> bool:
    values = list(args) + list(kwargs.values())
    return any(type(v).__module__.startswith("torch") and hasattr(v, "data_ptr") for v in values)
