"""Instruction issue and retargeting for ``nl``: every ``nl`` result's final ISA call is
issued through :func:`_emit`, which remembers it so ``t[...] = <nl call>`` and
``psum += nl.matmul(...)`` can write straight into ``t`` (module docstring,
decision 4) when the value is a temporary."""

from __future__ import annotations

import builtins as _b
import sys
import weakref
from dataclasses import dataclass
from typing import Any, Callable

from torchneuron.nki import context
from torchneuron.nki.instruction import Instruction
from torchneuron.nki.memory import Buffer
from torchneuron.nki.tensor import NkiTensor
from torchneuron.nki.language._base_ops import _local, _program, _region


# ============================================================ instruction issue


@dataclass
class _Fresh:
    """The newest ``nl`` result: how to re-issue its final instruction into another destination."""

    result: "weakref.ref[NkiTensor]"
    run: Any
    instructions: tuple[Instruction, ...]
    reissue: Callable[..., None]
    kind: str
    region: tuple[int, ...] | None = None  # leading sub-box of the result the instruction wrote


def _mine_since(run: Any, marker: Instruction | None) -> list[Instruction]:
    """Instructions this program appended after ``marker`` (its newest one before the call)."""
    program = _program()
    found: list[Instruction] = []
    for ins in reversed(run.instructions):
        if ins is marker:
            break
        if ins.program == program:
            found.append(ins)
    found.reverse()
    return found


def _last_mine(run: Any) -> Instruction | None:
    program = _program()
    for ins in reversed(run.instructions):
        if ins.program == program:
            return ins
    return None


def _issue(call: Callable[[], Any], tag: dict | None = None) -> list[Instruction]:
    """Run one ISA call; tag the instructions it recorded with ``tag`` attrs (if not set by isa)."""
    run = context.current()
    marker = _last_mine(run)
    call()
    new = _mine_since(run, marker)
    if tag:
        for ins in new:
            for key, value in tag.items():
                ins.attrs.setdefault(key, value)
    return new


def _emit(out: NkiTensor, issue: Callable[..., Any], kind: str = "", region: tuple[int, ...] | None = None,
          **kw: Any) -> NkiTensor:
    """Issue ``issue(out)`` - the final instruction producing ``out`` - and remember it for retargeting."""
    run = context.current()
    marker = _last_mine(run)
    issue(out, **kw)
    new = tuple(_mine_since(run, marker))
    _local.fresh = _Fresh(weakref.ref(out), run, new, issue, kind, region)
    return out


def _forget_run(run: Any) -> None:
    """A finished run's retarget record goes: it holds the run and the tiles of its last ``nl`` call."""
    fresh = getattr(_local, "fresh", None)
    if fresh is not None and fresh.run is run:
        _local.fresh = None


context.on_release(_forget_run)


def _take_fresh(value: Any) -> _Fresh | None:
    """The retarget record of ``value`` if it is the newest result and its instructions end the log."""
    fresh = getattr(_local, "fresh", None)
    if fresh is None or fresh.result() is not value:
        return None
    _local.fresh = None
    if fresh.run is not context.maybe_current() or not _is_tail(fresh):
        return None  # something ran since (it may have read the value): keep the copy
    return fresh


def _is_tail(fresh: _Fresh) -> bool:
    log, n = fresh.run.instructions, len(fresh.instructions)
    return len(log) >= n and _b.all(a is b for a, b in zip(log[len(log) - n:], fresh.instructions))


def _retract(fresh: _Fresh) -> None:
    """Remove ``fresh``'s instructions from the log (they are its newest entries; nothing refers to them)."""
    with fresh.run._lock:
        if fresh.instructions and _is_tail(fresh):
            del fresh.run.instructions[-len(fresh.instructions):]


def _retarget(target: NkiTensor, value: NkiTensor, temporary: bool, **kw: Any) -> bool:
    """Write the temporary ``value`` straight into ``target`` (decision 4); False if not possible."""
    if not temporary:
        return False
    fresh = _take_fresh(value)
    if fresh is None:
        return False
    if (target.shape != value.shape or target.dtype != value.dtype or target.buffer is not value.buffer
            or target.is_partial):
        return False
    if not kw and _move_result(fresh, value, target):
        return True
    _retract(fresh)
    fresh.reissue(target, **kw)
    return True


def _move_result(fresh: _Fresh, value: NkiTensor, target: NkiTensor) -> bool:
    """Retarget without running the instruction twice: its destination operand becomes ``target``.

    Done when the recorded instruction with ``target`` as ``dst`` is exactly what
    a re-issue would check and record: ``target`` has ``value``'s shape, dtype and
    buffer, and either the instruction is a DMA (no partition-placement rules)
    or both start at the same SBUF partition. The values it wrote are moved over.
    Otherwise (PSUM, another start partition) the caller re-issues it.
    """
    if len(fresh.instructions) != 1:
        return False
    ins = fresh.instructions[0]
    if ins.opcode != "dma_copy" and (target.buffer is not Buffer.sbuf
                                     or target.start_partition != value.start_partition):
        return False
    old_id = value.operand().allocation
    written = [w for w in ins.writes if w.allocation == old_id]
    if len(written) != 1:
        return False
    box = tuple(fresh.region) if fresh.region is not None else tuple(written[0].shape)
    if len(box) != value.ndim:
        return False
    src, dst = value[_region(box)], target[_region(box)]
    new = dst.operand()
    ins.writes = tuple(new if w.allocation == old_id else w for w in ins.writes)
    ins.reads = tuple(new if r.allocation == old_id else r for r in ins.reads)
    dst.write(src.values())
    return True


# ======================================================== temporary detection
#
# A value is a temporary when nothing but the call path of ``t[...] = value`` /
# ``t += value`` holds it. How many references that path holds depends on the
# interpreter's state, not only on the CPython version: while a frame-evaluation
# hook is installed (torch.compile's Dynamo installs one and leaves it, checked
# on CPython 3.11 / torch 2.13), Python-to-Python calls are not inlined and each
# keeps one more reference on the caller's stack. So the count a temporary has
# is measured, not assumed: a probe object replays the same path (a C slot into
# a Python method that calls a Python function) with a fresh object.


class _RefProbe:
    """Stand-in target whose ``[...] =`` and ``+=`` take the same path as NkiTensor's."""

    __slots__ = ("refs",)

    def __setitem__(self, key: Any, value: Any) -> None:
        _record_refs(self, value)

    def __iadd__(self, value: Any) -> "_RefProbe":
        _record_refs(self, value)
        return self


def _record_refs(probe: _RefProbe, value: Any) -> None:
    probe.refs = sys.getrefcount(value)  # measured where _assign/_accumulate measure theirs


def _temporary_refs(kind: str) -> int:
    """References a temporary has at the top of ``_assign`` (kind "assign") or ``_accumulate`` ("accumulate")."""
    probe = _RefProbe()
    if kind == "assign":
        probe[0] = object()
    else:
        probe += object()
    return probe.refs


def _is_temporary(refs: int, kind: str) -> bool:
    """True when ``refs`` (``sys.getrefcount`` of the value at the top of the hook) means no other holder."""
    return refs <= _temporary_refs(kind)
