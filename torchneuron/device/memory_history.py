"""Memory history and snapshots of neuron devices, as ``torch.cuda.memory``'s.

The caching allocator (``csrc/runtime/allocator.cpp``) records; this module is its
Python surface. :func:`_record_memory_history` takes ``torch.cuda.memory.
_record_memory_history``'s arguments (checked on torch 2.13.0) with their
meaning; :func:`_snapshot` returns PyTorch's snapshot format (``segments`` with
``blocks``, ``device_traces`` of ``alloc``/``free_requested``/``free_completed``/
``segment_alloc``/``segment_free``/``oom``/``snapshot`` events, ``frames``), so
``python -m torch.cuda._memory_viz trace_plot`` and the functions of
``torch.cuda._memory_viz`` read what :func:`_dump_snapshot` writes.

Each block of the neuron allocator is its own segment (blocks are never split),
and the allocator is not stream-ordered, so every ``stream`` is 0.
"""

from __future__ import annotations

import pickle
import sys
import warnings
from inspect import signature
from typing import Any, Literal

import torch

from torchneuron import _C
from torchneuron.device import accounting
from torchneuron.device._core import Device, device_index, lazy_init

__all__ = ["memory_snapshot"]

_ENABLED = ("state", "all")
_CONTEXTS = ("state", "alloc", "all")
_STACKS = ("python", "all")
_recording = False  # whether allocation stacks are being recorded (set with the C++ switch)
_ACTIONS = ("alloc", "free_requested", "free_completed", "segment_alloc", "segment_free",
            "oom", "snapshot")


def _check_choice(name: str, value: object, choices: tuple[str, ...], none_ok: bool) -> None:
    if (value is None and none_ok) or value in choices:
        return
    words = [repr(c) for c in choices] + (["None"] if none_ok else [])
    options = " or ".join(words) if len(words) == 2 else ", ".join(words[:-1]) + ", or " + words[-1]
    raise RuntimeError(f"_record_memory_history(): expected {name} to be {options}, got {value!r}")


def _record_memory_history(
    enabled: Literal["state", "all"] | None = "all", *args: Any, **kwargs: Any
) -> None:
    r"""Record the stack of each allocation, and (``"all"``) a history of alloc/free events.

    Same arguments and meaning as :func:`torch.cuda.memory._record_memory_history`
    (the legacy boolean form included), for every neuron device. Off by default;
    while off, the allocator does one atomic load per allocation and keeps nothing.
    Read what was recorded with :func:`_snapshot` or :func:`_dump_snapshot`; an
    out-of-memory error also names the Python call sites of the live memory.

    Args:
        enabled: ``None`` to stop recording (and drop the events), ``"state"`` to
            keep the stacks of live allocations, ``"all"`` to also keep the events.
        context: ``None``, ``"state"`` (stacks of live allocations), ``"alloc"``
            (also on alloc events), ``"all"`` (also on free events).
        stacks: ``"python"`` (Python and TorchScript frames) or ``"all"`` (also C++).
        max_entries: events kept per device (the newest).
        device: accepted for torch.cuda's signature; recording covers every device.
        clear_history: drop the events recorded so far.
        compile_context, global_record_annotations: not recorded on neuron (warns).
        skip_actions: event kinds not to record (``"alloc"``, ``"free_requested"``, ...).
    """
    if isinstance(enabled, bool):
        return _record_memory_history_legacy(enabled, *args, **kwargs)
    return _record_memory_history_impl(enabled, *args, **kwargs)


def _record_memory_history_impl(
    enabled: str | None = "all",
    context: str | None = "all",
    stacks: str = "all",
    max_entries: int = sys.maxsize,
    device: Device = None,
    clear_history: bool = False,
    compile_context: bool = False,
    global_record_annotations: bool = False,
    skip_actions: list[str] | None = None,
) -> None:
    _check_choice("enabled", enabled, _ENABLED, none_ok=True)
    _check_choice("context", context, _CONTEXTS, none_ok=True)
    _check_choice("stacks", stacks, _STACKS, none_ok=False)
    if isinstance(max_entries, bool) or not isinstance(max_entries, int):
        raise TypeError(f"_record_memory_history(): max_entries must be an int, "
                        f"not {type(max_entries).__name__}")
    if max_entries < 1:
        raise ValueError(f"_record_memory_history(): max_entries must be at least 1, got {max_entries}")
    if device is not None:
        device_index(device)  # a bad device is an error, as everywhere in torch.neuron
    skip = list(skip_actions) if skip_actions is not None else []
    for action in skip:
        if action not in _ACTIONS:
            raise ValueError(f"_record_memory_history(): unknown action {action!r} in skip_actions; "
                             f"valid actions are {', '.join(_ACTIONS)}")
    for name, value in (("compile_context", compile_context),
                        ("global_record_annotations", global_record_annotations)):
        if value:
            warnings.warn(f"torch.neuron.memory._record_memory_history(): {name}=True is not "
                          "recorded on neuron; stacks and events are.", stacklevel=3)
    lazy_init()
    _C._record_memory_history(enabled, context, stacks, max_entries, bool(clear_history), skip,
                              list(accounting.library_prefixes()))
    global _recording
    _recording = enabled is not None and context is not None


def is_recording() -> bool:
    """Whether the allocator keeps the Python stack of each new allocation (so live blocks
    have call sites): :func:`_record_memory_history` with a ``context``."""
    return _recording


def user_call_site(frames: list[dict[str, Any]]) -> str:
    """The innermost Python frame outside torch and torchneuron of a snapshot block's
    ``frames`` (innermost first), as ``file:line in function``; the allocator's OOM
    message names sites the same way (csrc/runtime/allocator.cpp: call_site)."""
    library = accounting.library_prefixes()
    python = [f for f in frames if f.get("filename", "").endswith(".py")]
    if not python:
        return "(allocated before _record_memory_history)" if not frames else "(no Python frame)"
    chosen = next((f for f in python if not f["filename"].startswith(library)), python[0])
    return f"{chosen['filename']}:{chosen['line']} in {chosen['name']}"


def _record_memory_history_legacy(
    enabled: bool,
    record_context: bool = True,
    trace_alloc_max_entries: int = 1,
    trace_alloc_record_context: bool = False,
    device: Device = None,
    record_context_cpp: bool = False,
    clear_history: bool = False,
    compile_context: bool = False,
    global_record_annotations: bool = False,
    skip_actions: list[str] | None = None,
) -> None:
    """torch.cuda's boolean form, mapped to the current arguments as CUDA maps it."""
    if not enabled:
        return _record_memory_history_impl(None)
    context = "alloc" if trace_alloc_record_context else ("state" if record_context else None)
    return _record_memory_history_impl(
        "all" if trace_alloc_max_entries > 1 else "state",
        context,
        "all" if record_context_cpp else "python",
        max(1, trace_alloc_max_entries),
        device,
        clear_history,
        compile_context,
        global_record_annotations,
        skip_actions,
    )


_record_memory_history.__signature__ = signature(_record_memory_history_impl)  # type: ignore[attr-defined]


def _snapshot(device: Device = None, augment_with_fx_traces: bool = False) -> dict[str, Any]:
    r"""Return the allocator's state and recorded events, in PyTorch's snapshot format.

    ``{"segments": [...], "device_traces": [[...] per device]}`` exactly as
    :func:`torch.cuda.memory._snapshot` documents it; ``device`` is accepted for
    its signature (the snapshot covers every device, as on CUDA).

    Args:
        augment_with_fx_traces: add the FX node of frames in FX-generated code,
            with PyTorch's own helper.
    """
    if device is not None:
        device_index(device)
    lazy_init()
    snapshot = _C._memory_snapshot(True)
    if augment_with_fx_traces:
        # Private torch helper (checked on torch 2.13.0), the one torch.cuda uses.
        from torch._utils import _augment_memory_snapshot_stack_traces

        snapshot = _augment_memory_snapshot_stack_traces(snapshot)
    return snapshot


def _dump_snapshot(filename: str = "dump_snapshot.pickle", augment_with_fx_traces: bool = False) -> None:
    r"""Pickle :func:`_snapshot` to ``filename``, for ``python -m torch.cuda._memory_viz``.

    The file holds only plain dicts, lists, strings and numbers.
    """
    snapshot = _snapshot(augment_with_fx_traces=augment_with_fx_traces)
    with open(filename, "wb") as f:
        pickle.dump(snapshot, f)


def memory_snapshot(mempool_id: tuple[int, int] | None = None, include_traces: bool = True) -> list[dict[str, Any]]:
    r"""Return the allocator's segments on every neuron device, as :func:`torch.cuda.memory_snapshot`.

    Args:
        mempool_id: ``None`` (or ``(0, 0)``, the default pool): neuron has no
            other memory pools.
        include_traces: accepted for torch.cuda's signature (segments carry no traces).
    """
    if mempool_id is not None and tuple(mempool_id) != (0, 0):
        raise ValueError(f"memory_snapshot(): neuron has only the default memory pool (0, 0), "
                         f"got mempool_id={mempool_id!r}")
    lazy_init()
    return _C._memory_snapshot(False)["segments"]
