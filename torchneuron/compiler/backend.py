"""``torch.compile(backend="neuron")``.

Pipeline: Dynamo captures a graph; AOTAutograd splits it into forward and
backward ATen graphs, decomposed to the core ATen set; the Neuron passes
(:mod:`torchneuron.compiler.passes`) check each node against the hardware
model and apply the numerics switches; Inductor's C++ code generator turns
the rest into fused kernels over the device's host memory, each charged its
modelled Trainium time (:mod:`torchneuron.compiler.inductor_device`); the
result is stored in the persistent compile cache (:mod:`.cache`).

As TorchNeuron: shapes are static (``dynamic=True`` is refused; a new input
shape compiles again, counted with its reason); ``mode`` other than
``"default"`` warns and uses the default; a compile failure raises unless
``TORCH_NEURONX_DISABLE_FALLBACK_EXECUTION=0``, which runs the graph eagerly
with a warning.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import re
import threading
import time
import warnings
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch._dynamo
from torch._dynamo.utils import counters
import torch._guards
from torch._functorch import config as functorch_config
from torch._inductor import lowering
from torch._inductor.compile_fx import compile_fx, compile_fx_inner

from torchneuron.compiler import cache, inductor_device, passes
from torchneuron import config
from torchneuron.compiler.diagnostics import NeuronCompileWarning, warn_once
from torchneuron.device import accounting, numerics


_state = threading.local()


def _in_backend() -> bool:
    return getattr(_state, "depth", 0) > 0


@contextlib.contextmanager
def _backend_call() -> Any:
    _state.depth = getattr(_state, "depth", 0) + 1
    try:
        yield
    finally:
        _state.depth -= 1


# --- what Dynamo saw before calling us ----------------------------------------
# Dynamo's own records, private in torch 2.13.0 (nothing public carries them):
# ``torch._dynamo.utils.graph_break_reasons`` holds one GraphCompileReason per graph
# break (every kind: unsupported calls and data-dependent control flow alike, whereas
# ``counters["graph_break"]`` misses the latter), with the user's stack;
# ``torch._dynamo.utils.guard_failures`` maps each compiled code object to the guard
# failures that made Dynamo compile it again. Both are cleared by torch._dynamo.reset().

_seen_lock = threading.Lock()
_seen_graph_breaks = 0  # entries of graph_break_reasons already recorded
_seen_guard_failures: dict[Any, int] = {}

# What Dynamo's terse internal reasons mean, in the user's terms.
_BREAK_REASON_TEXT = {
    "generic_jump": "Data-dependent branching: Python control flow (if/while/assert) on a tensor's "
                    "value; use torch.where or torch.cond, or compute the condition outside the "
                    "compiled function",
}


_RESUME_FUNCTION = re.compile(r"torch_dynamo_resume_in_(.+)_at_\d+$")  # Dynamo's, torch 2.13.0


def _frame_site(filename: str, line: int, function: str) -> str:
    """A call site as the reports spell it (the fallback call sites' "file:line in function");
    the function Dynamo resumes after a graph break is named as the user's function."""
    resumed = _RESUME_FUNCTION.match(function)
    return f"{filename}:{line} in {resumed.group(1) if resumed else function}"


def _break_reason(reason: str) -> str:
    for prefix, text in _BREAK_REASON_TEXT.items():
        if reason.startswith(prefix):
            return text
    return reason


def record_graph_breaks() -> None:
    """Records the graph breaks Dynamo noted since the last call, each with its reason and the
    user's file:line and function (the compiled frame's line where the graph broke)."""
    global _seen_graph_breaks
    breaks = torch._dynamo.utils.graph_break_reasons
    with _seen_lock:
        if len(breaks) < _seen_graph_breaks:  # torch._dynamo.reset() cleared Dynamo's list
            _seen_graph_breaks = 0
        new = list(breaks[_seen_graph_breaks:])
        _seen_graph_breaks = len(breaks)
    if not new:
        return
    reasons: Counter = Counter()
    sites: Counter = Counter()
    for b in new:
        reason = _break_reason(str(b.reason))
        frame = b.user_stack[-1] if b.user_stack else None
        site = _frame_site(frame.filename, frame.lineno, frame.name) if frame else "<unknown>"
        reasons[reason] += 1
        sites[(site, reason)] += 1
    accounting.record_compile(graph_breaks=len(new), graph_break_reasons=reasons,
                              graph_break_sites=sites)


def _code_site(code: Any) -> str:
    return _frame_site(code.co_filename, code.co_firstlineno, code.co_name)


def _record_dynamo_events() -> list[tuple[str, str]]:
    """Records graph breaks Dynamo logged since the last call; returns the new guard
    failures (why the current frame is being compiled again) as (compiled frame's site, reason)."""
    record_graph_breaks()
    failures = []
    with _seen_lock:
        for code, reasons in list(torch._dynamo.utils.guard_failures.items()):
            seen = _seen_guard_failures.get(code, 0)
            failures.extend((_code_site(code), str(r)) for r in reasons[seen:])
            _seen_guard_failures[code] = len(reasons)
    return failures


def _current_frame_site() -> str:
    """The site of the frame Dynamo is compiling (where the graph ends), or "<unknown>"."""
    context = torch._guards.TracingContext.try_get()  # torch 2.13.0
    loc = getattr(context, "loc_in_frame", None) if context is not None else None
    return _frame_site(*loc) if loc else "<unknown>"


def _record_recompile(site: str, reason: str) -> None:
    accounting.record_compile(recompiles=1, recompile_reasons=[reason],
                              recompile_sites=Counter({(site, reason): 1}))


def _is_recompile() -> bool:
    compile_id = torch._guards.CompileContext.current_compile_id()
    return compile_id is not None and (compile_id.frame_compile_id or 0) > 0


# --- checks on the request ----------------------------------------------------

def _has_symbolic_shapes(example_inputs: Sequence[Any]) -> bool:
    for value in example_inputs:
        if isinstance(value, torch.SymInt):
            return True
        if isinstance(value, torch.Tensor) and any(isinstance(s, torch.SymInt) for s in value.shape):
            return True
    return False


def _check_request(mode: str | None, options: dict | None) -> None:
    if not torch._dynamo.config.assume_static_by_default:
        raise RuntimeError(
            "torch.compile(backend='neuron', dynamic=True) is not supported: Trainium runs "
            "static shapes, and each new input shape compiles again. Remove dynamic=True "
            "(or pass dynamic=False); pad inputs to a few fixed sizes to limit recompiles.")
    if mode not in (None, "default"):
        warnings.warn(f"torch.compile(backend='neuron', mode={mode!r}): only mode='default' is "
                      "supported; using the default.", NeuronCompileWarning, stacklevel=3)
    if options:
        warnings.warn(f"torch.compile(backend='neuron', options=...): options {sorted(options)} "
                      "are ignored.", NeuronCompileWarning, stacklevel=3)


# --- the inner compile: Neuron passes, then Inductor code generation ----------

@contextlib.contextmanager
def _lowered_as_fallbacks(targets: set[Any]) -> Any:
    """Inductor emits these ops as calls into the device (counted CPU fallbacks there)
    instead of generating code for them. Global lowering table: restored on exit."""
    saved = {t: lowering.lowerings.get(t) for t in targets}
    try:
        for t in targets:
            lowering.lowerings[t] = lowering.fallback_handler(t, add_to_fallback_set=False)
        yield
    finally:
        for t, previous in saved.items():
            if previous is None:
                lowering.lowerings.pop(t, None)
            else:
                lowering.lowerings[t] = previous


def _neuron_inner_compile(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], **kwargs: Any) -> Any:
    """AOTAutograd's forward/backward compiler: Neuron passes, then Inductor."""
    illegal = passes.check_legality(gm)
    passes.apply_numerics(gm, host_nodes={n.node for n in illegal})
    if illegal:
        accounting.record_compile(partitioned_ops=Counter(f"{n.op} ({', '.join(n.dtypes)})" for n in illegal))
    _write_debug_artifact(gm, illegal, kwargs.get("is_backward", False))
    with contextlib.ExitStack() as stack:
        if not _in_backend():
            # A backward graph compiled lazily, at the first backward: outside the backend
            # call, so it enters the neuron cache directory and counts itself here.
            stack.enter_context(cache.using_cache_dir())
            stack.enter_context(_counted_compile())
        stack.enter_context(_lowered_as_fallbacks({n.node.target for n in illegal}))
        return compile_fx_inner(gm, example_inputs, **kwargs)


_debug_counter = itertools.count()


def _write_debug_artifact(gm: torch.fx.GraphModule, illegal: list, is_backward: bool) -> None:
    """With TORCH_NEURONX_DEBUG_DIR set: the graph after the Neuron passes, and its CPU ops."""
    directory = config.get("TORCH_NEURONX_DEBUG_DIR")
    if not directory:
        return
    name = f"graph_{next(_debug_counter):04d}_{'backward' if is_backward else 'forward'}.txt"
    lines = [f"# {n.op} ({', '.join(n.dtypes)}): {n.reason}; at {n.source_line}" for n in illegal]
    try:
        os.makedirs(directory, exist_ok=True)
        with open(os.path.join(directory, name), "w") as f:
            f.write("\n".join(["# ops left to the CPU fallback:", *lines, "",
                                gm.print_readable(print_output=False)]))
    except OSError as error:  # an artifact is not worth failing the compile for
        warn_once(("debug-dir", directory),
                  f"TORCH_NEURONX_DEBUG_DIR={directory!r}: cannot write the compile debug artifacts "
                  f"there ({error.strerror or error}); compiling without them. Set TORCH_NEURONX_DEBUG_DIR "
                  "to a directory you can create and write, or unset it.")


_CACHE_COUNTERS = (("aot_autograd", "autograd_cache_hit"), ("aot_autograd", "autograd_cache_miss"),
                   ("inductor", "fxgraph_cache_hit"), ("inductor", "fxgraph_cache_miss"))


@contextlib.contextmanager
def _counted_compile() -> Any:
    """Records one compile, its wall time, and whether the persistent cache served it."""
    before = [counters[group][name] for group, name in _CACHE_COUNTERS]
    started = time.perf_counter()
    try:
        yield
    finally:
        aot_hit, _, fx_hit, fx_miss = (counters[g][n] - b for (g, n), b in zip(_CACHE_COUNTERS, before))
        # Served from the cache: AOTAutograd's entry, or Inductor's compiled graphs with no
        # code generated (AOTAutograd may still miss, e.g. before its entry is saved).
        hit = aot_hit > 0 or (fx_hit > 0 and fx_miss == 0)
        accounting.record_compile(compiles=1, cache_hits=int(hit), cache_misses=int(not hit),
                             compile_seconds=time.perf_counter() - started)


def _compile(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Callable:
    inductor_device.register()
    # AOTAutograd's own cache is off: on a hit it would skip the Neuron passes, whose
    # legality report and debug artifacts must come with every compile. Inductor's
    # cache still serves the generated code and compiled kernels (the slow part).
    with cache.using_cache_dir(), functorch_config.patch(enable_autograd_cache=False):
        # compile_fx applies the patches to the inner compiles too, including a backward
        # graph compiled lazily after this call returns. The key is made inside the cache
        # directory (its ISA part runs Inductor's ISA probes there). No remote FX graph
        # cache: its entries are unpickled unverified. Precompiled headers (outside the cache
        # directory) only from a directory nobody else can write.
        patches = {"post_grad_custom_post_pass": cache.NeuronCacheKey(), "fx_graph_cache": True,
                   "fx_graph_remote_cache": False,
                   "cpp_cache_precompile_headers": cache.precompiled_headers_private(),
                   **inductor_device.CPU_LOWERING_CHOICES}
        settings = numerics.current()
        if settings.auto_cast != "none" or settings.stochastic_rounding:
            # The numerics pass writes its roundings as casts (FP32 -> BF16 -> FP32);
            # Inductor drops such a pair inside a fused kernel unless told to emulate
            # them, and the compiled code would then not round where eager does.
            patches["emulate_precision_casts"] = True
        # Decompositions: Inductor's table, which is the core ATen set plus Inductor's own
        # choices (passing a table of our own would make the graph uncacheable).
        return compile_fx(gm, example_inputs, inner_compile=_neuron_inner_compile, config_patches=patches)


# --- static shapes under automatic dynamic ------------------------------------

def _signature(args: Sequence[Any]) -> tuple:
    return tuple((tuple(a.shape), a.dtype) if isinstance(a, torch.Tensor) else a for a in args)


def _describe_change(old: tuple, new: tuple) -> str:
    changes = [f"input {i}: {_fmt(o)} -> {_fmt(n)}" for i, (o, n) in enumerate(zip(old, new)) if o != n]
    return "new static shapes (" + "; ".join(changes) + ")"


def _fmt(entry: Any) -> str:
    if isinstance(entry, tuple) and len(entry) == 2 and isinstance(entry[1], torch.dtype):
        return f"{list(entry[0])} {str(entry[1]).removeprefix('torch.')}"
    return repr(entry)


class StaticShapeGraph:
    """A graph Dynamo captured with symbolic sizes (automatic dynamic shapes, after a
    shape changed) compiled once per concrete signature, as Trainium needs."""

    def __init__(self, gm: torch.fx.GraphModule, site: str = "<unknown>") -> None:
        self.gm = gm
        self.site = site  # the compiled frame's, for recompile reports
        self.compiled: dict[tuple, Callable] = {}
        self._lock = threading.Lock()

    def __call__(self, *args: Any) -> Any:
        signature = _signature(args)
        fn = self.compiled.get(signature)
        if fn is None:
            fn = self._compile(signature, args)
        return fn(*args)

    def _compile(self, signature: tuple, args: Sequence[Any]) -> Callable:
        with self._lock:
            if signature in self.compiled:
                return self.compiled[signature]
            if self.compiled:
                previous = next(reversed(self.compiled))
                _record_recompile(self.site, _describe_change(previous, signature))
            with _backend_call(), _counted_compile():
                fn = _compile_or_fallback(_copy(self.gm), _static_fakes(args))
            self.compiled[signature] = fn
            return fn


def _static_fakes(args: Sequence[Any]) -> list[Any]:
    """Fake inputs with static shapes, in a fake mode with a shape environment (which
    Inductor's cache needs to key a graph)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    mode = FakeTensorMode(shape_env=ShapeEnv())
    return [mode.from_tensor(a, static_shapes=True) if isinstance(a, torch.Tensor) else a for a in args]


def _copy(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    return torch.fx.GraphModule(gm, gm.graph.__deepcopy__())


# --- the backend ----------------------------------------------------------------

def _compile_or_fallback(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Callable:
    eager = gm.forward
    try:
        return _compile(gm, example_inputs)
    except Exception as error:
        if config.get_flag("TORCH_NEURONX_DISABLE_FALLBACK_EXECUTION") or _is_strict_refusal(error):
            raise
        warnings.warn(f"torch.compile(backend='neuron') failed ({type(error).__name__}: {error}); "
                      "running this graph eagerly (TORCH_NEURONX_DISABLE_FALLBACK_EXECUTION=0).",
                      NeuronCompileWarning, stacklevel=2)
        accounting.record_compile(eager_fallbacks=1)
        return eager


def _is_strict_refusal(error: BaseException | None) -> bool:
    """Strict mode's refusal, however deep Inductor wrapped it: never run eagerly instead."""
    while error is not None:
        if isinstance(error, passes.NeuronStrictFallbackError):
            return True
        error = error.__cause__ or error.__context__
    return False


def neuron_backend(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], *,
                   mode: str | None = None, options: dict | None = None) -> Callable:
    """The ``"neuron"`` Dynamo backend (registered through the ``torch_dynamo_backends``
    entry point, so ``torch.compile(model, backend="neuron")`` needs no import)."""
    _check_request(mode, options)
    failures = _record_dynamo_events()
    site = failures[-1][0] if failures else _current_frame_site()
    if _is_recompile():
        _record_recompile(site, failures[-1][1] if failures else "guard failure")
    if _has_symbolic_shapes(example_inputs):
        return StaticShapeGraph(gm, site)
    with _backend_call(), _counted_compile():
        return _compile_or_fallback(gm, example_inputs)
