"""``nki.jit`` kernels, launch grids and ``nki.simulate``.

A kernel here always runs on the simulator: NumPy arguments run "baremetal",
torch tensors (``neuron`` or CPU) go through :mod:`torchneuron.nki.bridge`.
Launches follow current NKI (``kernel[lnc]``, LNC 1 or 2; nki-api-facts.md: 1)
and still accept the legacy SPMD grid (``kernel[4, 2]``, programs run one
after another on one core; nki-api-facts.md: 10) with a deprecation warning.
"""

from __future__ import annotations

import functools
import os
import warnings
from typing import Any, Callable

import numpy as np

from torchneuron.hardware.specs import ChipSpec, get_chip
from torchneuron.nki import context, dialect
from torchneuron.nki.context import KernelRun
from torchneuron.nki.dtypes import resolve
from torchneuron.nki.errors import NkiUninitializedReadError, SourceLocation, fail, in_simulator
from torchneuron.nki.memory import Allocation, Buffer
from torchneuron.nki.tensor import NkiTensor

__all__ = ["Kernel", "jit", "simulate", "cpu_simulate", "simulate_kernel", "Launch", "baremetal", "trace"]

_DEPRECATED_JIT_OPTIONS = ("mode",)
# Legacy ``nki.baremetal`` options: about the NEFF the AWS compiler would write; nothing to do here.
_BAREMETAL_OPTIONS = frozenset(("save_neff_name", "save_trace_name", "additional_compile_opt", "artifacts_dir",
                                "debug_kernel", "show_compiler_tb"))


class Launch:
    """A kernel with its launch configuration (``kernel[2]``, ``kernel[4, 2]``) and run options."""

    def __init__(self, kernel: "Kernel", grid: tuple[int, ...] = (1,), lnc: int = 1,
                 target: str | ChipSpec | None = None, uninitialized: str | None = None,
                 max_instructions: int | None = None) -> None:
        self.kernel = kernel
        self.grid = grid
        self.lnc = lnc
        self.target = target
        self.uninitialized = uninitialized
        self.max_instructions = max_instructions

    def __getitem__(self, grid: Any) -> "Launch":
        """``nki.simulate(kernel)[lnc]`` / ``nki.cpu_simulate(kernel)[lnc]``: this launch's options with a grid."""
        if self.grid != (1,):
            raise TypeError(f"kernel {self.kernel.name!r} already has the launch grid {list(self.grid)}; give the "
                            "grid once, as nki.simulate(kernel)[2](...) or nki.simulate(kernel[2])(...)")
        launch = launch_for(self.kernel, grid)
        return Launch(launch.kernel, launch.grid, launch.lnc, self.target, self.uninitialized, self.max_instructions)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if context.in_program():
            return _inline(self, args, kwargs, stacklevel=3)
        if _has_torch_tensor(args, kwargs):
            from torchneuron.nki import bridge

            return bridge.call(self, args, kwargs)
        return self.run_numpy(args, kwargs)[0]

    def new_run(self) -> KernelRun:
        target = self.target
        chip = get_chip(target) if isinstance(target, str) else (target or context.default_target())
        return KernelRun(kernel_name=self.kernel.name, target=chip, grid=self.grid, lnc=self.lnc,
                         uninitialized=context.resolve_uninitialized_policy(self.uninitialized),
                         max_instructions=context.resolve_max_instructions(self.max_instructions),
                         precise_fp=context.precise_fp(), legacy=dialect.is_legacy_kernel(self.kernel.fn))

    def run_numpy(self, args: tuple, kwargs: dict) -> tuple[Any, KernelRun]:
        """Run on NumPy arguments (updated in place where the kernel writes them); NumPy results."""
        run = self.new_run()
        hbm_args = [to_hbm(a, f"arg{i}") if isinstance(a, np.ndarray) else a for i, a in enumerate(args)]
        hbm_kwargs = {k: to_hbm(v, k) if isinstance(v, np.ndarray) else v for k, v in kwargs.items()}
        outputs = self.run_tensors(run, hbm_args, hbm_kwargs)
        return to_numpy(outputs), run

    def run_tensors(self, run: KernelRun, args: list, kwargs: dict) -> Any:
        """Run every program of the launch over ``NkiTensor`` arguments; the last program's outputs.

        However the kernel ends, the run then releases what it held (``KernelRun.release``):
        ``kernel.last_run`` keeps the instruction log, never the run's HBM tensors.
        """
        outputs = None
        self.kernel.last_run = run
        try:
            with context.running(run):
                for index in np.ndindex(*self.grid):
                    with context.as_program(run, tuple(int(i) for i in index)):
                        outputs = self.kernel.fn(*args, **kwargs)
                run.check_memory()
                _check_outputs(self.kernel, outputs, run)
        except Exception as exc:
            _note_kernel_line(exc)
            raise
        finally:
            run.release()
        return outputs


class Kernel:
    """A function decorated with ``@nki.jit``; call it, or launch it with ``kernel[lnc](...)``."""

    def __init__(self, fn: Callable[..., Any], **options: Any) -> None:
        if "platform_target" in options:
            raise ValueError("nki.jit(platform_target=...) was removed in NKI 0.3.0: set the "
                             "NEURON_PLATFORM_TARGET_OVERRIDE environment variable (trn1, trn2 or trn3)")
        unknown = sorted(set(options) - set(_DEPRECATED_JIT_OPTIONS) - _BAREMETAL_OPTIONS)
        if unknown:
            raise TypeError(f"nki.jit() got unexpected keyword argument(s) {', '.join(unknown)}; it accepts the "
                            f"deprecated mode= and AWS's compiler-artifact options "
                            f"{', '.join(sorted(_BAREMETAL_OPTIONS))}, none of which changes what the kernel "
                            "computes (launch options go in kernel[lnc] and nki.simulate(...))")
        self.fn = fn
        self.options = {k: v for k, v in options.items() if k not in _DEPRECATED_JIT_OPTIONS}
        self.name = getattr(fn, "__name__", "kernel")
        self.last_run: KernelRun | None = None
        functools.update_wrapper(self, fn)

    def __getitem__(self, grid: Any) -> Launch:
        return launch_for(self, grid)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if context.in_program():
            return _inline(Launch(self), args, kwargs, stacklevel=3)
        return Launch(self)(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<nki kernel {self.name}>"


def _inline(launch: Launch, args: tuple, kwargs: dict, stacklevel: int) -> Any:
    """Run a ``@nki.jit`` kernel called from inside another kernel as part of the caller's trace.

    Legacy NKI inlined decorated helpers into the calling kernel; current NKI says not
    to decorate sub-kernels (nki-api-facts.md: 1). Either way the helper is no launch of
    its own: its instructions join the caller's run (one program id, grid, capacity
    check, dependency graph and cost), so it is called as a plain function, with a
    warning that the decorator should go.
    """
    if launch.grid != (1,) or launch.target is not None or launch.max_instructions is not None:
        raise TypeError(f"kernel {launch.kernel.name!r} is launched (grid {list(launch.grid)}) from inside another "
                        "NKI kernel; a kernel called from a kernel is inlined into its caller's launch: call it "
                        f"without a launch grid or options, as {launch.kernel.name}(...)")
    warnings.warn(f"NKI kernel {launch.kernel.name!r} is decorated with @nki.jit but called from inside another "
                  "kernel: it is inlined into the caller (its program id, grid and cost are the caller's), as "
                  "legacy NKI did; current NKI wants helpers without @nki.jit - remove the decorator",
                  UserWarning, stacklevel=stacklevel)
    return launch.kernel.fn(*args, **kwargs)


def launch_for(kernel: Kernel, grid: Any, **options: Any) -> Launch:
    """Parse ``kernel[...]``: one number 1 or 2 is an LNC launch; anything else a legacy SPMD grid."""
    dims = grid if isinstance(grid, tuple) else (grid,)
    dims = tuple(getattr(d, "lnc_degree", d) for d in dims)
    if not all(isinstance(d, (int, np.integer)) and not isinstance(d, bool) and d >= 1 for d in dims):
        raise TypeError(f"a kernel launch takes positive ints, e.g. kernel[2](...); got kernel[{grid!r}]")
    dims = tuple(int(d) for d in dims)
    if len(dims) == 1 and dims[0] in (1, 2):
        return Launch(kernel, dims, lnc=dims[0], **options)
    warnings.warn(f"kernel[{', '.join(map(str, dims))}]: SPMD launch grids are legacy NKI, deprecated "
                  "since NKI 0.5.0 (a grid other than the LNC degree is to become a compile error); current NKI "
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


def baremetal(kernel: Any = None, **options: Any) -> Any:
    """Legacy ``nki.baremetal``: run a kernel on NumPy arrays (here: on the simulator).

    Both forms work: ``@nki.baremetal`` / ``@nki.baremetal(additional_compile_opt=...)``
    and ``nki.baremetal(kernel)(*arrays)``. The compile options name files and flags
    of AWS's compiler and are accepted and ignored; any other option is an error.
    """
    unknown = set(options) - _BAREMETAL_OPTIONS
    if unknown:
        raise TypeError(f"nki.baremetal() got unexpected keyword argument(s) {', '.join(sorted(unknown))}; it "
                        f"accepts {', '.join(sorted(_BAREMETAL_OPTIONS))}")
    if kernel is None:
        return lambda fn: baremetal(fn)
    if isinstance(kernel, (Kernel, Launch)):
        return kernel
    return Kernel(kernel)


def trace(kernel: Any = None, **options: Any) -> Any:
    """Legacy ``nki.trace``: mark a function as a kernel (the same as ``nki.jit`` here)."""
    return jit(kernel, **options)


def simulate(kernel: Any, *, target: str | None = None, uninitialized: str | None = None,
             max_instructions: int | None = None) -> Launch:
    """``nki.simulate(kernel)(*args)``: run ``kernel`` (or ``kernel[2]``) on the simulator.

    ``target`` picks the chip (default: ``NEURON_PLATFORM_TARGET_OVERRIDE``, else
    the neuron device's chip); ``uninitialized`` is what a read of never-written
    memory does: ``"warn"`` (default), ``"error"`` or ``"ignore"``;
    ``max_instructions`` is the launch's instruction budget (default
    ``TORCHNEURON_NKI_MAX_INSTRUCTIONS``, 1,000,000): a kernel still issuing
    instructions past it is stopped with an error naming its loop.
    """
    if isinstance(kernel, Launch):
        return Launch(kernel.kernel, kernel.grid, kernel.lnc, target or kernel.target,
                      uninitialized or kernel.uninitialized,
                      kernel.max_instructions if max_instructions is None else max_instructions)
    if not isinstance(kernel, Kernel):
        kernel = Kernel(kernel)
    return Launch(kernel, target=target, uninitialized=uninitialized, max_instructions=max_instructions)


def cpu_simulate(kernel: Any) -> Launch:
    """``nki.cpu_simulate(kernel)[lnc](*args, **kwargs)``: the name AWS's kernel-library test harness calls
    (its NKI CPU simulator); the same as :func:`simulate`."""
    return simulate(kernel)


def simulate_kernel(kernel: Any, *args: Any, **kwargs: Any) -> Any:
    """Legacy ``nki.simulate_kernel(kernel[grid], *numpy_args)``."""
    return simulate(kernel)(*args, **kwargs)


def to_hbm(array: np.ndarray, name: str, buffer: Buffer = Buffer.shared_hbm, dtype: Any = None) -> NkiTensor:
    """An HBM tensor aliasing ``array`` (kernel writes land in it, as in AWS's simulator)."""
    nki_dtype = resolve(dtype if dtype is not None else array.dtype)
    if array.dtype == np.bool_ and nki_dtype.name == "bool_":
        # NKI's bool_ is "stored as a byte" (legacy nl.bool_ = np.bool_): the same bytes, 0 or 1, seen as
        # uint8, so the kernel's writes still land in the caller's array
        array = array.view(np.uint8)
    if array.dtype != nki_dtype.storage:
        raise TypeError(f"argument {name!r} is stored as {array.dtype}, expected {nki_dtype.storage}")
    alloc = Allocation.create(buffer, tuple(array.shape), nki_dtype, name, initial=array)
    return NkiTensor(alloc)


def _check_outputs(kernel: "Kernel", outputs: Any, run: KernelRun) -> None:
    """Outputs must be shared HBM; an output the kernel never fully wrote is reported like an
    uninitialised read (warning, ``NkiUninitializedReadError`` under ``"error"``, or nothing)."""
    name = kernel.name
    for out in outputs if isinstance(outputs, (tuple, list)) else (outputs,):
        if not isinstance(out, NkiTensor):
            continue
        if out.buffer is not Buffer.shared_hbm:
            fail("return", f"kernel {name!r} returns {out.name!r} in {out.buffer.value}; every returned "
                 "output must be allocated with buffer=nl.shared_hbm (since NKI 0.3.0 an output in nl.hbm fails "
                 "to compile)")
        mask = out._mask
        if run.uninitialized != "ignore" and mask.size and not mask.all():
            missing = int(mask.size - np.count_nonzero(mask))
            message = (f"kernel {name!r} returns {out.name!r} with {missing} of {mask.size} elements never "
                       "written (they hold the simulator's NaN / 4 fill)")
            location = _definition(kernel)
            if run.uninitialized == "error":
                raise NkiUninitializedReadError("return", message + "; write every element of an output "
                                                "before returning it", location)
            context.warn_uninitialized("return", message, location)


def _note_kernel_line(exc: BaseException) -> None:
    """Add the kernel line an exception came from as a note, unless its message already names it.

    ``NkiValidationError`` and errors built with ``errors.located`` carry the line in their
    message; any other error raised while the kernel ran (a ``TypeError`` from a bad argument,
    an ``IndexError`` of the kernel's own code) gets it as a note under its traceback.
    """
    import linecache
    import sysconfig

    frames = []
    tb = exc.__traceback__
    while tb is not None:
        frames.append((tb.tb_frame.f_code, tb.tb_lineno))
        tb = tb.tb_next
    # The kernel's frames: the first run of frames outside the simulator (the kernel and the
    # helpers it called), up to the NKI call that raised; libraries they call are not the kernel.
    user = []
    for code, lineno in frames:
        if not in_simulator(code.co_filename):
            user.append((code, lineno))
        elif user:
            break
    if not user:
        return
    libraries = tuple(os.path.abspath(sysconfig.get_paths()[key]) + os.sep for key in ("stdlib", "purelib", "platlib"))
    own = [f for f in user if not os.path.abspath(f[0].co_filename).startswith(libraries)]
    code, lineno = (own or user)[-1]
    where = SourceLocation(code.co_filename, lineno, code.co_name, linecache.getline(code.co_filename, lineno).strip())
    if str(where) not in str(exc):
        exc.add_note(f"raised by NKI kernel line {where}: {where.line}")


def _definition(kernel: "Kernel") -> SourceLocation | None:
    """Where the kernel function is defined (its ``def`` line), for errors about the kernel as a whole."""
    code = getattr(kernel.fn, "__code__", None)
    if code is None:
        return None
    import linecache

    lineno = code.co_firstlineno  # the first decorator's line when decorated: find the def below it
    for candidate in range(code.co_firstlineno, code.co_firstlineno + 20):
        if linecache.getline(code.co_filename, candidate).lstrip().startswith(("def ", "async def ")):
            lineno = candidate
            break
    return SourceLocation(code.co_filename, lineno, code.co_name, linecache.getline(code.co_filename, lineno).strip())


def to_numpy(outputs: Any) -> Any:
    if isinstance(outputs, NkiTensor):
        return outputs.values()
    if isinstance(outputs, (tuple, list)):
        return type(outputs)(to_numpy(o) for o in outputs)
    return outputs


def _has_torch_tensor(args: tuple, kwargs: dict) -> bool:
    values = list(args) + list(kwargs.values())
    return any(type(v).__module__.startswith("torch") and hasattr(v, "data_ptr") for v in values)
