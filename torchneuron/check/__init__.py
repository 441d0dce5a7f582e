"""``torchneuron check script.py [args]``: the portability report of a PyTorch script.

Runs the unmodified script (or ``-m module``) in a child interpreter with its tensors on
``neuron`` (:mod:`torchneuron.check.runner`), reads what the accounting record saw
(:mod:`~torchneuron.check.collect`), and writes a terminal summary, a JSON file with every
figure and a self-contained HTML report with plots. Exit status: 0, 1 if the script fails,
3 if ``--strict`` finds offenders (CPU fallbacks, host syncs repeated in a loop).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from torchneuron.check import analysis, outputs

__all__ = ["run_check"]

EXIT_FAILED = 1
EXIT_STRICT = 3


def run_check(console: Console, command: list[str], *, module: str | None = None,
              json_path: str = "torchneuron-check.json", html_path: str = "torchneuron-check.html",
              strict: bool = False, target: str | None = None, lnc: int | None = None,
              steps: int = 0) -> int:
    """Runs ``command`` (script and its args, or the module's args) and reports on it."""
    if module is None:
        if not command:
            raise ValueError("torchneuron check needs a script (torchneuron check script.py [args]) "
                             "or -m module")
        if not os.path.isfile(command[0]):
            raise FileNotFoundError(f"torchneuron check: no script {command[0]!r}")
    if steps < 0:
        raise ValueError(f"--steps {steps}: use a positive number of optimizer steps, or 0 for all")
    env = dict(os.environ)  # the script's child: our environment, plus the target
    if target is not None:
        env["NEURON_PLATFORM_TARGET_OVERRIDE"] = target
    if lnc is not None:
        env["NEURON_LOGICAL_NC_CONFIG"] = str(lnc)
    with tempfile.TemporaryDirectory(prefix="torchneuron-check-") as tmp:
        raw = os.path.join(tmp, "raw.json")
        child = [sys.executable, "-m", "torchneuron.check.runner", raw, str(steps),
                 *(["-m", module] if module is not None else []), *command]
        result = subprocess.run(child, env=env)
        if not os.path.exists(raw):
            console.print(f"[bold red]verdict: fails[/bold red]: the check's child process ended "
                          f"with status {result.returncode} before writing its record (a crash, "
                          f"os._exit or a signal)", highlight=False)
            return EXIT_FAILED
        with open(raw) as f:
            data = json.load(f)
    analysis.analyse(data)
    from torchneuron.check import report_html, report_terminal

    written = {"JSON": str(outputs.write_json(Path(json_path), data)),
               "HTML": str(outputs.write_text(Path(html_path), report_html.render(data)))}
    report_terminal.print_report(console, data, written)
    if data["outcome"]["status"] == "failed":
        return EXIT_FAILED
    if strict and data["strict_offenders"]:
        console.print("[bold red]--strict: refused[/bold red]")
        for offender in data["strict_offenders"]:
            console.print(f"  {escape(offender)}", highlight=False)
        return EXIT_STRICT
    return 0
