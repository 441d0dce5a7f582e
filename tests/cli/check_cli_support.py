"""Running `torchneuron check` as a user would, for the check CLI tests."""

import json
import os
import subprocess
import sys
import textwrap


def run_check(tmp_path, *args, files=None):
    """Writes `files` ({relative path: source}) under tmp_path and runs `torchneuron check`
    there; returns (process, JSON report or None)."""
    for name, text in (files or {}).items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(textwrap.dedent(text))
    result = subprocess.run([sys.executable, "-m", "torchneuron", "check", *args],
                            cwd=tmp_path, capture_output=True, text=True, timeout=600,
                            env={**os.environ, "COLUMNS": "200"})
    try:
        data = json.loads((tmp_path / "torchneuron-check.json").read_text())
    except (OSError, ValueError):  # no report, or the user's own file of that name
        data = None
    return result, data
