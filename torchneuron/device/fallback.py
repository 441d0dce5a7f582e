"""Which ops real Trainium would run on the CPU, as the C++ op fallback asks.

The C++ fallback asks :func:`decide` once per (op, dtypes) pair and caches the
answer; every later call costs a lookup. The answer comes from the hardware
model (:func:`torchneuron.hardware.placement`) for the modelled chip. Ops that
would fall back still run here (results stay CPU's), but are counted (see
:mod:`torchneuron.profiler.metrics`) and warned about once per op with the
user's call site; with ``TORCHNEURON_CPU_FALLBACK=0`` they raise
``NotImplementedError`` instead, as a strict CI setting.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import warnings
from collections.abc import Iterator

from torchneuron import _C, config
from torchneuron.device import _core, accounting, sync_debug
from torchneuron.hardware import placement
from torchneuron.hardware.support import Category, op_category


class NeuronCPUFallbackWarning(UserWarning):
    """An op ran that real Trainium runs on the host CPU (slow: transfers each way)."""


_lock = threading.Lock()
_warned_ops: set[str] = set()
# (op, dtypes) -> "file:line in function" of the first call, for reports.
call_sites: dict[tuple[str, tuple[str, ...]], str] = {}
# Distinct call sites kept per (op, dtypes); calls from further sites count under OTHER_SITES.
MAX_CALL_SITES = 10
OTHER_SITES = "(other call sites)"
# (op, dtypes) -> {call site: calls}, in first-call order.
_site_calls: dict[tuple[str, tuple[str, ...]], dict[str, int]] = {}

# Distinct Python stacks kept per call site (while stacks are kept: accounting.keeps_stacks());
# calls from further stacks count in the site's calls only.
MAX_STACKS_PER_SITE = 10
# (op, dtypes) -> {call site: {user Python stack, innermost first: calls}}, in first-call order.
_site_stacks: dict[tuple[str, tuple[str, ...]], dict[str, dict[tuple[str, ...], int]]] = {}

# Dtypes Trainium does not compute natively (trainium-facts.md: Data types; the check report's
# FP64/complex/INT64 rows); while ``torchneuron check`` runs, decide() notes the
# user's call site of the first call of each (op, dtypes) pair with one, on device or not
# (decide runs once per pair: the op path stays free).
WIDE_DTYPES = frozenset(("float64", "complex64", "complex128", "int64", "uint64"))
# (op, dtypes) -> "file:line in function" of its first call, while noting_wide_dtype_sites() is on.
wide_dtype_sites: dict[tuple[str, tuple[str, ...]], str] = {}
_noting_wide_dtype_sites = False

# filename -> whether its frames are library code (accounting.library_prefixes()).
_library_files: dict[str, bool] = {}


def _is_library(filename: str) -> bool:
    known = _library_files.get(filename)
    if known is None:
        known = _library_files[filename] = filename.startswith(accounting.library_prefixes())
    return known


def _user_call_site(frame=None) -> str:
    """The innermost stack frame outside torch, torchneuron and the standard library, from
    ``frame`` (default: the caller's) outwards."""
    frame = frame if frame is not None else sys._getframe(1)
    while frame is not None:
        code = frame.f_code
        if not _is_library(code.co_filename):
            return f"{code.co_filename}:{frame.f_lineno} in {code.co_name}"
        frame = frame.f_back
    return "<unknown>"


def _user_stacklevel(caller) -> int:
    """``warnings.warn``'s stacklevel, from :func:`observe`, that names the user's line: the
    innermost frame outside library code from ``caller`` (the op's Python caller) outwards,
    not a torch wrapper such as torch.utils._device's default-device mode."""
    level, frame = 2, caller
    while frame is not None and _is_library(frame.f_code.co_filename):
        frame, level = frame.f_back, level + 1
    return level if frame is not None else 2


def call_site_counts(op: str, dtypes: tuple[str, ...]) -> list[tuple[str, int]]:
    """Each distinct user call site of a CPU-fallback (op, dtypes) with its calls, most first
    (at most :data:`MAX_CALL_SITES`, then :data:`OTHER_SITES` for the rest), since the last
    :func:`configure` or record reset (``torchneuron.metrics.reset()``)."""
    with _lock:
        counts = dict(_site_calls.get((op, tuple(dtypes)), {}))
    return sorted(counts.items(), key=lambda kv: (kv[0] == OTHER_SITES, -kv[1]))


def call_site_stacks(op: str, dtypes: tuple[str, ...]) -> dict[str, list[tuple[tuple[str, ...], int]]]:
    """The whole user Python stacks (innermost frame, the call site, first) each call site of a
    CPU-fallback (op, dtypes) was reached by, with their calls, most first: ``{site: [(stack,
    calls)]}``. Kept only while TORCH_NEURONX_ENABLE_STACK_TRACE is on (``torchneuron check``
    turns it on), at most :data:`MAX_STACKS_PER_SITE` per site."""
    with _lock:
        sites = {site: dict(stacks) for site, stacks in _site_stacks.get((op, tuple(dtypes)), {}).items()}
    return {site: sorted(stacks.items(), key=lambda kv: -kv[1]) for site, stacks in sites.items()}


@contextlib.contextmanager
def noting_wide_dtype_sites() -> Iterator[None]:
    """Notes :data:`wide_dtype_sites` while the block runs (from a fresh start: the oracle is
    re-installed, so every (op, dtypes) pair is decided, and noted, at its first call again)."""
    global _noting_wide_dtype_sites
    with _lock:
        wide_dtype_sites.clear()
    _noting_wide_dtype_sites = True
    configure()
    try:
        yield
    finally:
        _noting_wide_dtype_sites = False


def reset_site_counts() -> None:
    """Zeroes the calls per call site (with the record's counters; the first call site of
    each op, :data:`call_sites`, is kept as the record keeps its placement decisions)."""
    with _lock:
        _site_calls.clear()
        _site_stacks.clear()


def decide(op: str, dtypes: tuple[str, ...]) -> tuple[bool, str, int]:
    """(runs on CPU on real Trainium, why, the numerics rules that apply to it, as
    :func:`~torchneuron.device.numerics.record_rules`): called by C++ once per (op, dtypes)."""
    from torchneuron.device import numerics

    if _noting_wide_dtype_sites and WIDE_DTYPES.intersection(dtypes):
        # Called by C++ from the op's call: the caller's frame is the Python that called the op.
        with _lock:
            wide_dtype_sites.setdefault((op, tuple(dtypes)), _user_call_site(sys._getframe(1)))
    where = placement(op, dtypes, target=_core.topology().chip.name,
                      native_int64=config.get_flag("TORCHNEURON_NATIVE_INT64"))
    return not where.on_device, where.reason, numerics.record_rules(op, where.on_device)


# PyTorch internals that compute on the host on purpose, as (file under torch/,
# function) -> why. Their CPU fallbacks are not the program's: they are counted
# apart (OpCount.internal_calls), never warned about and never refused by strict
# mode. Checked on torch 2.13.0.
PYTORCH_HOST_INTERNALS: dict[tuple[str, str], str] = {
    ("amp/grad_scaler.py", "unscale_"):
        "GradScaler computes 1/scale in float64 on every device but MPS",
    ("_tensor_str.py", "*"):
        "printing formats the values on the host",
}


def _internal_reason(frame) -> str | None:
    """Why the op called from ``frame`` is a PyTorch internal's host computation, or None."""
    import torch

    torch_dir = os.path.dirname(torch.__file__) + os.sep
    filename = frame.f_code.co_filename
    if not filename.startswith(torch_dir):
        return None
    relative = filename[len(torch_dir):].replace(os.sep, "/")
    return (PYTORCH_HOST_INTERNALS.get((relative, frame.f_code.co_name))
            or PYTORCH_HOST_INTERNALS.get((relative, "*")))


def observe(op: str, dtypes: tuple[str, ...], reason: str) -> bool:
    """Called by C++ on each call of an op real Trainium runs on the host. Notes the
    first call site and warns once per op; returns True (and does neither) if the
    caller is one of :data:`PYTORCH_HOST_INTERNALS`."""
    caller = sys._getframe(1)  # the Python frame that called the op (C++ adds none)
    if _internal_reason(caller) is not None:
        return True
    if sync_debug.watching() and op_category(op, dtypes) is Category.DATA_DEPENDENT_SHAPE:
        sync_debug.on_data_dependent_op(op, _C._current_device())  # may raise: nothing ran yet
    key = (op, dtypes)
    stack = accounting.user_stack(caller) if accounting.keeps_stacks() else ()
    site = stack[0] if stack else _user_call_site(caller)
    with _lock:
        call_sites.setdefault(key, site)
        calls = _site_calls.setdefault(key, {})
        if site not in calls and len(calls) - (OTHER_SITES in calls) >= MAX_CALL_SITES:
            site_key = OTHER_SITES
        else:
            site_key = site
        calls[site_key] = calls.get(site_key, 0) + 1
        if stack and site_key != OTHER_SITES:
            stacks = _site_stacks.setdefault(key, {}).setdefault(site, {})
            if stack in stacks or len(stacks) < MAX_STACKS_PER_SITE:
                stacks[stack] = stacks.get(stack, 0) + 1
        first = op not in _warned_ops
        _warned_ops.add(op)
    if first and config.get_flag("TORCHNEURON_CPU_FALLBACK"):
        warnings.warn(f"{reason}. Called from {site}. On real Trainium this op runs on "
                      "the host CPU, with transfers each way; torchneuron.metrics.report() lists "
                      "all such ops (warned once per op).", NeuronCPUFallbackWarning,
                      stacklevel=_user_stacklevel(caller))
    return False


# The variables configure() and decide() read: a change re-applies them (config.on_change).
SETTINGS = ("TORCHNEURON_CPU_FALLBACK", "TORCHNEURON_NATIVE_INT64")


def configure() -> None:
    """Installs the oracle and the strict switch from the environment (re-run to apply changes)."""
    _C._set_strict_fallback(not config.get_flag("TORCHNEURON_CPU_FALLBACK"))
    with _lock:
        _warned_ops.clear()
        call_sites.clear()
        _site_calls.clear()
        _site_stacks.clear()
    _C._set_placement_oracle(decide)
    _C._set_fallback_observer(observe)
