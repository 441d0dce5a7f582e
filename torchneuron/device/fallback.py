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

import os
import threading
import traceback
import warnings

import torchneuron
from torchneuron import _C
from torchneuron.device import _core, config
from torchneuron.hardware import placement, runs_on_tensor_engine


class NeuronCPUFallbackWarning(UserWarning):
    """An op ran that real Trainium runs on the host CPU (slow: transfers each way)."""


_lock = threading.Lock()
_warned_ops: set[str] = set()
# (op, dtypes) -> "file:line in function" of the first call, for reports.
call_sites: dict[tuple[str, tuple[str, ...]], str] = {}

_PACKAGE_DIRS = (os.path.dirname(torchneuron.__file__), os.path.dirname(os.__file__))


def _user_call_site() -> str:
    """The innermost stack frame outside torch, torchneuron and the standard library."""
    import torch

    skip = (*_PACKAGE_DIRS, os.path.dirname(torch.__file__))
    for frame in reversed(traceback.extract_stack()[:-2]):
        if not frame.filename.startswith(skip) and not frame.filename.startswith("<frozen"):
            return f"{frame.filename}:{frame.lineno} in {frame.name}"
    return "<unknown>"


def decide(op: str, dtypes: tuple[str, ...]) -> tuple[bool, str, bool]:
    """(runs on CPU on real Trainium, why, runs on TensorE): called by C++ once
    per (op, dtypes)."""
    where = placement(op, dtypes, target=_core.topology().chip.name,
                      native_int64=config.get_flag("TORCHNEURON_NATIVE_INT64"))
    if where.on_device:
        return False, "", runs_on_tensor_engine(op)
    site = _user_call_site()
    with _lock:
        call_sites.setdefault((op, dtypes), site)
        first = op not in _warned_ops
        _warned_ops.add(op)
    if first and config.get_flag("TORCHNEURON_CPU_FALLBACK"):
        warnings.warn(f"{where.reason}. Called from {site}. On real Trainium this op runs on "
                      "the host CPU, with transfers each way; torchneuron.metrics.report() lists "
                      "all such ops (warned once per op).", NeuronCPUFallbackWarning, stacklevel=2)
    return True, where.reason, runs_on_tensor_engine(op)


def configure() -> None:
    """Installs the oracle and the strict switch from the environment (re-run to apply changes)."""
    _C._set_strict_fallback(not config.get_flag("TORCHNEURON_CPU_FALLBACK"))
    with _lock:
        _warned_ops.clear()
        call_sites.clear()
    _C._set_placement_oracle(decide)
