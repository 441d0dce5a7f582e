"""How a user's script run by a report's child process ended, as the report shows it.

``torchneuron check``'s child and ``torchneuron plan``'s workers run a script and report its
outcome the same way: completed, stopped after the asked-for steps (:class:`StopAfterSteps`),
or failed, with the exception, the user's line it came from and, out of device memory, what
filled the device (:mod:`torchneuron.device.oom`).
"""

from __future__ import annotations

import traceback
from typing import Any

__all__ = ["StopAfterSteps", "user_site", "exit_outcome", "failure_outcome"]


class StopAfterSteps(BaseException):
    """Raised by an optimizer-step hook after the asked-for steps (a BaseException, so the
    script's own ``except Exception`` does not swallow it)."""


def user_site(frames: list[traceback.FrameSummary]) -> str:
    """The innermost frame outside torch, torchneuron and the standard library."""
    from torchneuron.device import accounting

    prefixes = accounting.library_prefixes()
    for frame in reversed(frames):
        if not frame.filename.startswith(prefixes):
            return f"{frame.filename}:{frame.lineno} in {frame.name}"
    return "<unknown>"


def exit_outcome(code: Any) -> dict[str, Any] | None:
    """A ``sys.exit(code)``'s outcome: None for success (0 or None)."""
    if code in (None, 0):
        return None
    return {"status": "failed", "exception_type": "SystemExit",
            "exception": f"the script exited with status {code!r}", "site": "", "traceback": ""}


def failure_outcome(error: BaseException, traceback_chars: int = 8000) -> dict[str, Any]:
    """A failed script's outcome: the exception, its user site, the traceback's tail and, out of
    device memory, the explanation by category and site."""
    from torchneuron.device import oom

    outcome = {"status": "failed", "exception_type": type(error).__name__,
               "exception": str(error).strip()[:4000], "site": user_site(traceback.extract_tb(error.__traceback__)),
               "traceback": "".join(traceback.format_exception(error))[-traceback_chars:]}
    explanation = getattr(error, "memory_explanation", None)
    if isinstance(explanation, oom.OomExplanation):  # out of device memory: what filled it
        outcome["out_of_memory"] = explanation.as_dict()
    return outcome
