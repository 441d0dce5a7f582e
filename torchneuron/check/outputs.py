"""Writing report files without ever losing one of the user's files.

A report goes to the path asked for only if nothing is there or a previous check
report is (recognised by its marker); otherwise the next free ``name-N.ext`` is
used and the terminal says so. Each file is written whole to a temporary name in
the same directory and renamed into place, so an interrupted write leaves no
half file.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from torchneuron.check.collect import SCHEMA
from torchneuron.check.migrate import DIFF_MARKER
from torchneuron.check.report_html import MARKER


def _is_previous_report(path: Path) -> bool:
    """Whether ``path`` holds a report check wrote (JSON with its schema, HTML or a migration
    diff with its marker)."""
    if not path.is_file():
        return False
    try:
        if path.stat().st_size > 256 * 2**20:
            return False
        text = path.read_text(errors="replace")
    except OSError:
        return False
    if f"<meta name='generator' content='{MARKER}'>" in text[:2048] or text.startswith(DIFF_MARKER + "\n"):
        return True
    try:
        data = json.loads(text)  # JSON only: parsing runs nothing
    except ValueError:
        return False
    return isinstance(data, dict) and data.get("schema") == SCHEMA


def free_path(path: Path) -> Path:
    """``path`` if writing there loses nothing, else the first free ``stem-N.suffix``."""
    if not path.exists() and not path.is_symlink():
        return path
    if _is_previous_report(path) and not path.is_symlink():
        return path
    for n in range(1, 10_000):
        candidate = path.with_name(f"{path.stem}-{n}{path.suffix}")
        if not candidate.exists() and not candidate.is_symlink():
            return candidate
    raise FileExistsError(f"no free name for the report next to {path}")


def write_text(path: Path, text: str) -> Path:
    """Writes ``text`` atomically to :func:`free_path` of ``path``; returns where."""
    target = free_path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".part")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, target)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return target


def write_json(path: Path, data: dict) -> Path:
    return write_text(path, json.dumps(data, indent=1, sort_keys=True))
