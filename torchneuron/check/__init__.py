"""``torchneuron check script.py [args]``: the portability report of a PyTorch script.

Runs the unmodified script (or ``-m module``, or one pytest test by node id) in a child interpreter with its tensors on
``neuron`` (:mod:`torchneuron.check.runner`), reads what the accounting record saw
(:mod:`~torchneuron.check.collect`), and writes a terminal summary, a JSON file with every
figure and a self-contained HTML report with plots. CUDA-only code in the user's files is
listed with its device-generic replacement (:mod:`~torchneuron.check.cuda_code`);
``--migrate`` runs it on neuron unedited and writes the rewrite as a unified diff
(:mod:`~torchneuron.check.migrate`). Exit status: 0, 1 if the script fails,
3 if ``--strict`` finds offenders (CPU fallbacks, host syncs repeated in a loop).
"""

from __future__ import annotations

import importlib.util
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


def _pytest_node_id(command: list[str]) -> str:
    """``command`` as one pytest node id (``path.py::test[::...]``), checked: a test file that
    exists, nothing pytest would read as an option, no further arguments."""
    node_id = command[0]
    path = node_id.split("::", 1)[0]
    if node_id.startswith("-") or not path.endswith(".py"):
        raise ValueError(f"{node_id!r} is not a pytest node id; write it as tests/test_x.py::test_y")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"torchneuron check: no test file {path!r} (from node id {node_id!r})")
    if len(command) > 1:
        raise ValueError(f"a pytest node id takes no further arguments (got {' '.join(command[1:])!r}); "
                         f"check one test at a time")
    if importlib.util.find_spec("pytest") is None:
        raise ValueError("checking a pytest node id needs pytest: pip install pytest")
    return node_id


def _child_environment(target: str | None, lnc: int | None, instance: str | None,
                       detect_nonfinite: bool = False) -> dict[str, str]:
    """Our environment plus the target options, checked here so that a bad name is a usage
    error naming the valid ones, not a failure of the script's child process."""
    from torchneuron.hardware import INSTANCES, INSTANCE_ENV, LNC_ENV, TARGET_ENV, topology_from_env

    env = dict(os.environ)  # the script's child: our environment, plus the target
    if instance is not None:
        if not isinstance(instance, str) or instance.strip().lower() not in INSTANCES:
            raise ValueError(f"--instance {instance!r} is not a known instance type; use one of "
                             f"{', '.join(INSTANCES)} (trainium-facts.md: Instances)")
        env[INSTANCE_ENV] = instance.strip().lower()
    if target is not None:
        env[TARGET_ENV] = target
    if lnc is not None:
        env[LNC_ENV] = str(lnc)
    if detect_nonfinite:  # the run stops at the first op that makes a NaN/Inf, naming it
        env["TORCHNEURON_DETECT_NONFINITE"] = "1"
    try:
        topology_from_env(env)
    except ValueError as e:
        raise ValueError(f"--instance/--target/--lnc or the environment: {e}") from None
    return env


def run_check(console: Console, command: list[str], *, module: str | None = None,
              json_path: str = "torchneuron-check.json", html_path: str = "torchneuron-check.html",
              strict: bool = False, target: str | None = None, lnc: int | None = None,
              steps: int = 0, instance: str | None = None, migrate: bool = False,
              diff_path: str = "torchneuron-migrate.diff", detect_nonfinite: bool = False) -> int:
    """Runs ``command`` (script and its args, or the module's args) and reports on it.

    ``migrate`` runs the user's CUDA code on neuron from its device-generic rewrite (in
    memory) and writes that rewrite as a unified diff to ``diff_path`` (or the next free
    name: a file that is not a previous check diff is never overwritten).

    ``instance`` (e.g. ``"trn2.48xlarge"``) models that instance's chips and devices and sizes
    the run's memory against all of them; ``target``/``lnc`` pick the chip and core size.

    ``detect_nonfinite`` runs the script as ``TORCHNEURON_DETECT_NONFINITE=1`` does: it stops at
    the first op whose output holds a NaN or Inf and the verdict names that op. Without it the
    verdict still says when a loss or a model's output became NaN/Inf."""
    node_id = None
    if module is None:
        if not command:
            raise ValueError("torchneuron check needs a script (torchneuron check script.py [args]), "
                             "-m module or a pytest node id (tests/test_x.py::test_y)")
        if "::" in command[0]:
            node_id = _pytest_node_id(command)
        elif not os.path.isfile(command[0]):
            raise FileNotFoundError(f"torchneuron check: no script {command[0]!r}")
    if steps < 0:
        raise ValueError(f"--steps {steps}: use a positive number of optimizer steps, or 0 for all")
    env = _child_environment(target, lnc, instance, detect_nonfinite)
    with tempfile.TemporaryDirectory(prefix="torchneuron-check-") as tmp:
        raw = os.path.join(tmp, "raw.json")
        if node_id is not None:
            env.pop("PYTEST_ADDOPTS", None)  # options from the environment could add more tests
            target_args = ["--pytest", node_id]
        else:
            target_args = [*(["-m", module] if module is not None else []), *command]
        child = [sys.executable, "-m", "torchneuron.check.runner", raw, str(steps),
                 *(["--migrate"] if migrate else []), *target_args]
        result = subprocess.run(child, env=env)
        if not os.path.exists(raw):
            console.print(f"[bold red]verdict: fails[/bold red]: the check's child process ended "
                          f"with status {result.returncode} before writing its record (a crash, "
                          f"os._exit or a signal)", highlight=False)
            return EXIT_FAILED
        with open(raw) as f:
            data = json.load(f)
    diff = data["cuda"].pop("diff", "")
    data["cuda"]["diff_path"] = str(outputs.write_text(Path(diff_path), diff)) if diff else None
    analysis.analyse(data)
    from torchneuron.check import report_html, report_terminal

    written = {**({"migration diff": data["cuda"]["diff_path"]} if diff else {}),"JSON": str(outputs.write_json(Path(json_path), data)),
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
