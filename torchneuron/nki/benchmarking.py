"""Modelled performance of NKI kernels: ``nki.benchmark``, ``nki.profile`` and ``estimate``.

AWS's ``nki.benchmark`` compiles a kernel, runs it ``warmup + iters`` times on a
NeuronCore and reports latency percentiles; ``nki.profile`` captures a hardware
profile (nki-api-facts.md: 10). Here a kernel runs once on the simulator and the
engine-level cost model (:mod:`torchneuron.nki.cost`) times its instruction log.
The model is **deterministic**: every percentile is the same modelled latency,
and ``warmup``/``iters`` are accepted for compatibility but change nothing.

    @nki.benchmark(warmup=5, iters=10, save_trace_name="add.json")
    def add_kernel(a, b): ...

    add_kernel(a, b)
    add_kernel.benchmark_result.nc_latency.get_latency_percentile(99)   # microseconds

    outputs, cost = nki.profile(kernel, target="trn2")(a, b)
    print(cost)                                  # report table
    cost = estimate(kernel, a, b, target="trn1", compute_values=False)  # shapes only

``save_trace_name`` writes a Chrome trace (JSON, whatever the extension; AWS writes
an NTFF profile there). ``save_neff_name`` and ``additional_compile_opt`` are accepted
and ignored: there is no compiler and no NEFF.

Shape-only runs (``compute_values=False``) set ``KernelRun.compute_values = False``:
ISA functions validate and record every instruction but skip the NumPy compute, so
large kernels (e.g. a [4096, 8192] x [8192, 8192] matmul) are costed quickly. Arguments
may then be placeholders with ``.shape`` and ``.dtype`` (no data is read). Output values of
such a run are meaningless.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from torchneuron.hardware.specs import ChipSpec
from torchneuron.nki import cost as _cost
from torchneuron.nki.context import KernelRun
from torchneuron.nki.cost import CostOptions, KernelCost
from torchneuron.nki.kernel import Kernel, Launch, simulate, to_hbm

__all__ = ["benchmark", "profile", "estimate", "run_kernel", "BenchmarkResult", "LatencyResult",
           "LATENCY_PERCENTILES"]

LATENCY_PERCENTILES = (0, 1, 10, 25, 50, 90, 99, 100)  # what legacy nki.benchmark reports


class LatencyResult:
    """``benchmark_result.nc_latency``: latency percentiles in microseconds."""

    def __init__(self, latency_us: float) -> None:
        self.latency_us = latency_us

    def get_latency_percentile(self, percentile: int) -> float:
        """The ``percentile``-th latency in microseconds (all equal: the model is deterministic)."""
        if percentile not in LATENCY_PERCENTILES:
            raise ValueError(f"get_latency_percentile({percentile!r}): nki.benchmark reports percentiles "
                             f"{', '.join(map(str, LATENCY_PERCENTILES))}")
        return self.latency_us

    def __repr__(self) -> str:
        return f"LatencyResult({self.latency_us:.3f} us at every percentile, modelled)"


@dataclass
class BenchmarkResult:
    """``fn.benchmark_result`` after a call of an ``nki.benchmark``-wrapped kernel."""

    nc_latency: LatencyResult
    cost: KernelCost  # the full model result (tables, timeline, trace)
    warmup: int
    iters: int


def _as_launch(kernel: Any, target: str | ChipSpec | None) -> Launch:
    """A Launch of ``kernel`` (function, ``Kernel``, or ``kernel[grid]``) on ``target``."""
    if isinstance(kernel, (_Benchmarked, _Profiled)):
        kernel = kernel._kernel
    if not isinstance(kernel, (Kernel, Launch)) and not callable(kernel):
        raise TypeError(f"expected an NKI kernel (a function, @nki.jit kernel or kernel[grid]), got "
                        f"{type(kernel).__name__}")
    return simulate(kernel, target=target)


def _placeholder(value: Any, name: str) -> Any:
    """NumPy arguments become HBM tensors; ``.shape``/``.dtype`` placeholders get zero-filled storage."""
    if isinstance(value, np.ndarray):
        return to_hbm(value, name)
    if _is_torch(value) or isinstance(value, (str, bytes, int, float, bool)) or value is None:
        return value
    shape, dtype = getattr(value, "shape", None), getattr(value, "dtype", None)
    if shape is not None and dtype is not None:
        from torchneuron.nki.dtypes import resolve

        nki_dtype = resolve(dtype)
        return to_hbm(np.zeros(tuple(int(s) for s in shape), dtype=nki_dtype.storage), name, dtype=nki_dtype)
    return value


def _is_torch(value: Any) -> bool:
    return type(value).__module__.startswith("torch") and hasattr(value, "data_ptr")


def run_kernel(kernel: Any, args: tuple, kwargs: dict, *, target: str | ChipSpec | None = None,
               compute_values: bool = True) -> tuple[Any, KernelRun]:
    """Run ``kernel`` once on the simulator; its outputs (NumPy, or torch for torch inputs) and run."""
    launch = _as_launch(kernel, target)
    if any(_is_torch(v) for v in list(args) + list(kwargs.values())):
        if not compute_values:
            raise ValueError("compute_values=False takes NumPy arrays or shape placeholders, not torch tensors")
        outputs = launch(*args, **kwargs)  # the torch bridge; it keeps the run on the kernel
        return outputs, launch.kernel.last_run
    if compute_values:
        if all(isinstance(v, np.ndarray) or not hasattr(v, "shape") for v in list(args) + list(kwargs.values())):
            return launch.run_numpy(args, kwargs)
    run = launch.new_run()
    run.compute_values = compute_values
    if not compute_values:
        run.uninitialized = "ignore"
    hbm_args = [_placeholder(a, f"arg{i}") for i, a in enumerate(args)]
    hbm_kwargs = {k: _placeholder(v, k) for k, v in kwargs.items()}
    from torchneuron.nki.kernel import to_numpy

    outputs = launch.run_tensors(run, hbm_args, hbm_kwargs)
    return to_numpy(outputs), run


def estimate(kernel: Any, *args: Any, target: str | ChipSpec | None = None, compute_values: bool = True,
             options: CostOptions | None = None, **kwargs: Any) -> KernelCost:
    """The modelled cost of one call ``kernel(*args, **kwargs)`` (or of a finished ``KernelRun``).

    ``target`` is a chip (``"trn1"``, ``"trn2"``, ``"trn3"``; default: the simulator's
    target); ``compute_values=False`` runs shapes only (module docstring).
    """
    if isinstance(kernel, KernelRun):
        if args or kwargs:
            raise TypeError("estimate(run) takes a finished KernelRun and no kernel arguments")
        return _cost.estimate(kernel, target, options=options)
    _, run = run_kernel(kernel, args, kwargs, target=target, compute_values=compute_values)
    return _cost.estimate(run, options=options)


class _Benchmarked:
    """A kernel wrapped by ``nki.benchmark``: calling it runs it and sets ``benchmark_result``."""

    def __init__(self, kernel: Any, warmup: int, iters: int, save_trace_name: str | None,
                 target: str | ChipSpec | None, grid: Any = None, parent: "_Benchmarked | None" = None) -> None:
        self._kernel = kernel
        self._warmup = warmup
        self._iters = iters
        self._save_trace_name = save_trace_name
        self._target = target
        self._grid = grid
        self._parent = parent
        self.benchmark_result: BenchmarkResult | None = None
        if parent is None:
            functools.update_wrapper(self, getattr(kernel, "fn", kernel), updated=())

    def __getitem__(self, grid: Any) -> "_Benchmarked":
        """Legacy ``bench[grid](...)``; the result lands on this object too."""
        return _Benchmarked(self._kernel, self._warmup, self._iters, self._save_trace_name, self._target,
                            grid, parent=self)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        kernel = self._kernel
        if self._grid is not None:
            kernel = (kernel if isinstance(kernel, Kernel) else Kernel(kernel))[self._grid]
        outputs, run = run_kernel(kernel, args, kwargs, target=self._target)
        cost = _cost.estimate(run)
        result = BenchmarkResult(LatencyResult(cost.latency_us), cost, self._warmup, self._iters)
        self.benchmark_result = result
        if self._parent is not None:
            self._parent.benchmark_result = result
        if self._save_trace_name:
            cost.to_chrome_trace(self._save_trace_name)
        return outputs


def benchmark(kernel: Any = None, *, warmup: int = 10, iters: int = 100, save_neff_name: str | None = None,
              save_trace_name: str | None = None, additional_compile_opt: str | None = None,
              target: str | ChipSpec | None = None) -> Any:
    """Legacy ``nki.benchmark``: a decorator whose wrapped kernel records its modelled latency.

    After ``fn(*args)``, ``fn.benchmark_result.nc_latency.get_latency_percentile(p)``
    gives the latency in microseconds for p in {0, 1, 10, 25, 50, 90, 99, 100}. The
    model is deterministic, so all percentiles are equal and ``warmup``/``iters`` only
    get validated. ``save_trace_name`` writes a Chrome trace (JSON); ``save_neff_name``
    and ``additional_compile_opt`` are ignored (no compiler here).
    """
    for label, value, low in (("warmup", warmup, 0), ("iters", iters, 1)):
        if not isinstance(value, int) or isinstance(value, bool) or value < low:
            raise ValueError(f"nki.benchmark: {label} must be an int >= {low}, got {value!r}")
    if additional_compile_opt is not None and not isinstance(additional_compile_opt, str):
        raise TypeError("nki.benchmark: additional_compile_opt must be a string of compiler flags")

    def wrap(fn: Any) -> _Benchmarked:
        return _Benchmarked(fn, warmup, iters, save_trace_name, target)

    return wrap if kernel is None else wrap(kernel)


class _Profiled:
    """``nki.profile(kernel)``: calling it returns ``(outputs, KernelCost)``."""

    def __init__(self, kernel: Any, target: str | ChipSpec | None, options: CostOptions | None,
                 trace_path: str | None, legacy: bool) -> None:
        self._kernel = kernel
        self._target = target
        self._options = options
        self._trace_path = trace_path
        self._legacy = legacy
        self.cost: KernelCost | None = None
        functools.update_wrapper(self, getattr(kernel, "fn", kernel), updated=())

    def __getitem__(self, grid: Any) -> "_Profiled":
        kernel = self._kernel if isinstance(self._kernel, Kernel) else Kernel(self._kernel)
        return _Profiled(kernel[grid], self._target, self._options, self._trace_path, self._legacy)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        outputs, run = run_kernel(self._kernel, args, kwargs, target=self._target)
        self.cost = _cost.estimate(run, options=self._options)
        if self._trace_path:
            self.cost.to_chrome_trace(self._trace_path)
        return outputs if self._legacy else (outputs, self.cost)


def profile(kernel: Any = None, target: str | ChipSpec | None = None, *, options: CostOptions | None = None,
            working_directory: str | None = None, save_trace_name: str | None = None,
            **legacy_options: Any) -> Any:
    """``nki.profile(kernel, target=None)(*args)`` returns ``(outputs, KernelCost)``.

    The legacy decorator form ``@nki.profile(working_directory=..., save_neff_name=...,
    profile_nth=..., overwrite=...)`` is accepted too: the decorated kernel then returns
    its outputs as before, writes a Chrome trace into ``working_directory`` (named
    ``save_trace_name`` or ``<kernel>.json``) and keeps the model result in ``.cost``.
    """
    unknown = set(legacy_options) - {"save_neff_name", "profile_nth", "overwrite", "additional_compile_opt"}
    if unknown:
        raise TypeError(f"nki.profile() got unexpected keyword argument(s) {', '.join(sorted(unknown))}")
    legacy = kernel is None or working_directory is not None

    def wrap(fn: Any) -> _Profiled:
        trace = save_trace_name
        if working_directory is not None:
            name = getattr(fn, "__name__", None) or getattr(getattr(fn, "kernel", None), "name", "kernel")
            trace = os.path.join(working_directory, save_trace_name or f"{name}.json")
        return _Profiled(fn, target, options, trace, legacy)

    return wrap if kernel is None else wrap(kernel)

