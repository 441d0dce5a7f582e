"""Errors the NKI simulator raises, each pointing at the kernel's own source line.

AWS's simulator raises ``AssertionError`` for constraint violations and its ISA
module defines ``NkiValidationError`` (nki-api-facts.md: 12). Ours is one class
deriving from ``AssertionError`` so code written against either catches it.
"""

from __future__ import annotations

import ast
import linecache
import os
import sys
from dataclasses import dataclass
from typing import Any

__all__ = ["NkiValidationError", "NkiUninitializedReadError", "NkiInstructionLimitError", "SourceLocation",
           "kernel_location", "kernel_loops", "located", "in_simulator", "fail"]

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))


@dataclass(frozen=True)
class SourceLocation:
    """Where in the user's kernel an instruction was issued."""

    filename: str
    lineno: int
    function: str
    line: str = ""

    def __str__(self) -> str:
        return f"{os.path.basename(self.filename)}:{self.lineno} in {self.function}"


_FILES: dict[str, tuple[str, bool]] = {}  # code filename -> (absolute path, inside this package)


def _file_of(frame: Any) -> tuple[str, bool]:
    return _classify(frame.f_code.co_filename)


def _classify(code_filename: str) -> tuple[str, bool]:
    known = _FILES.get(code_filename)
    if known is None:
        absolute = os.path.abspath(code_filename)
        known = _FILES[code_filename] = (absolute, absolute.startswith(_PACKAGE_DIR + os.sep))
    return known


def in_simulator(code_filename: str) -> bool:
    """True for source files of ``torchneuron.nki`` itself (frames that are not the user's kernel)."""
    return _classify(code_filename)[1]


def _location(frame: Any, filename: str) -> SourceLocation:
    return SourceLocation(filename, frame.f_lineno, frame.f_code.co_name,
                          linecache.getline(filename, frame.f_lineno).strip())


def kernel_location() -> SourceLocation | None:
    """The innermost stack frame outside ``torchneuron.nki``: the kernel line being run."""
    frame = sys._getframe(1)
    while frame is not None:  # runs for every instruction: _file_of inlined
        known = _FILES.get(frame.f_code.co_filename)
        if known is None:
            known = _file_of(frame)
        filename, inside = known
        if not inside:
            return _location(frame, filename)
        frame = frame.f_back
    return None


def kernel_loops() -> list[SourceLocation]:
    """The ``for``/``while`` loops (outermost first) around the kernel line being run.

    Walks the kernel's own frames (the kernel and the helpers it called, up to the
    simulator frame that called the kernel) and finds, in each frame's source, the
    loops lexically enclosing its current line. For error messages only: it parses
    source files. Frames without readable source contribute nothing.
    """
    frames = []
    frame = sys._getframe(1)
    while frame is not None:
        filename, inside = _file_of(frame)
        if not inside:
            frames.append((frame, filename))
        elif frames:
            break  # the simulator frame that called the kernel
        frame = frame.f_back
    loops: list[SourceLocation] = []
    for frame, filename in reversed(frames):
        loops.extend(_loops_around(filename, frame.f_lineno, frame.f_code.co_name))
    return loops


def _loops_around(filename: str, lineno: int, function: str) -> list[SourceLocation]:
    lines = linecache.getlines(filename)
    if not lines:
        return []
    try:
        tree = ast.parse("".join(lines))
    except (SyntaxError, ValueError):
        return []

    def encloses(node: ast.AST) -> bool:
        return node.lineno <= lineno <= (node.end_lineno or node.lineno)  # type: ignore[attr-defined]

    scopes = [n for n in ast.walk(tree)
              if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and encloses(n)]
    scope: ast.AST = min(scopes, key=lambda n: n.end_lineno - n.lineno) if scopes else tree  # type: ignore
    loops = [n for n in ast.walk(scope) if isinstance(n, (ast.For, ast.While, ast.AsyncFor)) and encloses(n)]
    return [SourceLocation(filename, n.lineno, function, _loop_header(n))
            for n in sorted(loops, key=lambda n: n.lineno)]


def _loop_header(node: Any) -> str:
    """``for x in range(n):`` / ``while cond:`` as written, without the body or comments."""
    if isinstance(node, ast.While):
        return f"while {ast.unparse(node.test)}:"
    prefix = "async for" if isinstance(node, ast.AsyncFor) else "for"
    return f"{prefix} {ast.unparse(node.target)} in {ast.unparse(node.iter)}:"


class NkiValidationError(AssertionError):
    """A kernel broke a hardware rule; the message names the rule, the limit and the kernel line."""

    def __init__(self, instruction: str, message: str, location: SourceLocation | None = None) -> None:
        self.instruction = instruction
        self.location = location
        self.reason = message
        where = f"{location}: " if location is not None else ""
        code = f"\n    {location.line}" if location is not None and location.line else ""
        super().__init__(f"{where}{instruction}: {message}{code}")


class NkiUninitializedReadError(NkiValidationError):
    """An instruction read on-chip memory no instruction had written (the simulator fills it with NaN)."""


class NkiInstructionLimitError(NkiValidationError):
    """A kernel launch issued more instructions than the simulator's budget (a runaway loop, most often)."""


def located(error: type[Exception], message: str) -> Exception:
    """``error(message)`` prefixed with the kernel line being run, as :class:`NkiValidationError` is.

    For errors that keep their Python type (``TypeError`` / ``ValueError`` for a bad
    dtype) but must still point at the kernel's line; outside a kernel the message is unchanged.
    """
    from torchneuron.nki import context

    if context.maybe_current() is None:
        return error(message)
    location = kernel_location()
    if location is None:
        return error(message)
    code = f"\n    {location.line}" if location.line else ""
    return error(f"{location}: {message}{code}")


def fail(instruction: str, message: str, error: type[NkiValidationError] = NkiValidationError) -> None:
    """Raise ``error`` for ``instruction`` at the kernel line currently executing."""
    raise error(instruction, message, kernel_location())
