"""Errors the NKI simulator raises, each pointing at the kernel's own source line.

AWS's simulator raises ``AssertionError`` for constraint violations and its ISA
module defines ``NkiValidationError`` (nki-api-facts.md: 12). Ours is one class
deriving from ``AssertionError`` so code written against either catches it.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass

__all__ = ["NkiValidationError", "NkiUninitializedReadError", "SourceLocation", "kernel_location", "fail"]

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


def kernel_location() -> SourceLocation | None:
    """The innermost stack frame outside ``torchneuron.nki``: the kernel line being run."""
    frame = sys._getframe(1)
    while frame is not None:
        known = _FILES.get(frame.f_code.co_filename)
        if known is None:
            absolute = os.path.abspath(frame.f_code.co_filename)
            known = _FILES[frame.f_code.co_filename] = (absolute, absolute.startswith(_PACKAGE_DIR + os.sep))
        filename, inside = known
        if not inside:
            import linecache

            line = linecache.getline(filename, frame.f_lineno).strip()
            return SourceLocation(filename, frame.f_lineno, frame.f_code.co_name, line)
        frame = frame.f_back
    return None


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


def fail(instruction: str, message: str, error: type[NkiValidationError] = NkiValidationError) -> None:
    """Raise ``error`` for ``instruction`` at the kernel line currently executing."""
    raise error(instruction, message, kernel_location())
