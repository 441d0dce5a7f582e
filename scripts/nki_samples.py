"""Runs NKI kernel files unmodified on torchneuron's simulator and says what happened to each.

AWS's kernel files (aws-neuron/nki-samples tutorials, the Neuron SDK examples, your
own) import ``neuronxcc.nki`` or ``nki``; each file here runs as ``__main__`` in its
own process with torchneuron's import aliases installed (``python -m torchneuron.nki.run``),
so the file is not edited. The script fetches nothing: point it at files or
directories you have (a missing path is reported as skipped, so CI without network
stays green)::

    python scripts/nki_samples.py ~/nki-samples/src/nki_samples/tutorials
    python scripts/nki_samples.py my_kernel.py --timeout 300

A file's outcome is ``pass`` (it ran and printed no mismatch), ``wrong`` (it ran but
raised an AssertionError or printed that NKI and NumPy differ), ``unsupported`` (it
stopped with an error - the reason is its last error line), ``timeout``, or
``not run``: a file with no ``if __name__ == "__main__":`` block that imports cleanly only
defines kernels (AWS's matmul and attention tutorial kernel files), so running it checks
nothing; call its kernels from your own script or test (an error while importing it is
still reported). Files whose name ends in ``_jax.py`` or
``_torch.py``, and files that stop because ``torch_xla``, ``jax`` or another framework
integration is not installed, need those frameworks' Neuron integrations and are
listed as skipped. With no path, the NKI examples of this repository
(``examples/nki``) are run. Relative paths are taken from the current directory.
"""

from __future__ import annotations

import argparse
import ast
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
_MISMATCH = ("differ", "mismatch", "do not match", "not match")
_FRAMEWORK_SUFFIXES = ("_jax.py", "_torch.py")
# Framework integrations AWS's driver scripts import; torchneuron provides none of them.
_FRAMEWORK_MODULES = ("torch_xla", "torch_neuronx", "jax", "jax_neuronx", "libneuronxla")
_MISSING_MODULE = re.compile(r"ModuleNotFoundError: No module named '([\w.]+)'")


@dataclass
class Outcome:
    path: Path
    status: str  # pass, wrong, unsupported, timeout, not run, skipped
    reason: str = ""


def kernel_files(paths: list[str]) -> list[Path | str]:
    """The .py files to run (directories searched recursively), as absolute paths (each file runs with
    its own directory as working directory); a missing path is returned as text."""
    found: list[Path | str] = []
    for text in paths:
        path = Path(text).expanduser().absolute()
        if not path.exists():
            found.append(text)
        elif path.is_dir():
            found.extend(sorted(p for p in path.rglob("*.py") if not p.name.startswith(("test_", "__"))))
        else:
            found.append(path)
    return found


def run_file(path: Path, timeout: float) -> Outcome:
    """Run one file as ``__main__`` in a fresh interpreter (cwd and sys.path at its directory)."""
    if path.name.endswith(_FRAMEWORK_SUFFIXES):
        return Outcome(path, "skipped", "needs the JAX / torch-xla Neuron integration")
    env_path = [str(ROOT), str(path.parent)]
    try:
        done = subprocess.run([sys.executable, "-m", "torchneuron.nki.run", str(path)], cwd=path.parent, capture_output=True,
                              text=True, timeout=timeout,
                              env={**_environ(), "PYTHONPATH": ":".join(env_path)})
    except subprocess.TimeoutExpired:
        return Outcome(path, "timeout", f"still running after {timeout:.0f} s")
    output = (done.stdout + done.stderr).lower()
    if done.returncode == 0:
        if not runs_something(path):  # it imported cleanly; its kernels were defined, none was run
            return Outcome(path, "not run", "no `if __name__ == \"__main__\":` block: it only defines kernels, so "
                                            "running it checks nothing; call its kernels from a script or test")
        if any(word in output for word in _MISMATCH):
            return Outcome(path, "wrong", _last_line(done.stdout))
        return Outcome(path, "pass")
    reason = _error_line(done.stderr)
    missing = _MISSING_MODULE.search(done.stderr)
    if missing and missing.group(1).split(".")[0] in _FRAMEWORK_MODULES:
        return Outcome(path, "skipped", f"needs {missing.group(1)} (a framework's Neuron integration), not installed")
    status = "wrong" if reason.startswith("AssertionError") and "Nki" not in reason else "unsupported"
    return Outcome(path, status, reason)


def runs_something(path: Path) -> bool:
    """Does the file run anything as a script: a top-level ``if __name__ == "__main__":`` or a
    top-level call statement (``test_attn_tutorial("accuracy", attn_fwd_v1)``)? A file Python
    cannot parse counts as running something, so running it reports the syntax error."""
    try:
        tree = ast.parse(path.read_text(), filename=str(path))
    except (SyntaxError, UnicodeDecodeError, ValueError):
        return True
    for node in tree.body:
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):
            return True
        if isinstance(node, ast.If) and isinstance(node.test, ast.Compare) and len(node.test.comparators) == 1:
            names = {ast.unparse(node.test.left), ast.unparse(node.test.comparators[0])}
            if "__name__" in names and ("'__main__'" in names or '"__main__"' in names):
                return True
    return False


def _environ() -> dict[str, str]:
    import os  # the child's environment is the user's (it is their kernel run), plus PYTHONPATH

    return dict(os.environ)


def _error_line(stderr: str) -> str:
    lines = [line.strip() for line in stderr.strip().splitlines() if line.strip()]
    for line in reversed(lines):
        if not line.startswith(("File ", "^", "~", "raised by NKI kernel line")) and ("Error" in line or
                                                                                      "Exception" in line):
            return line[:300]
    return lines[-1][:300] if lines else "exited with an error and no message"


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1][:300] if lines else ""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("paths", nargs="*", help="kernel files or directories (default: examples/nki)")
    parser.add_argument("--timeout", type=float, default=600, help="seconds per file (default 600)")
    args = parser.parse_args(argv)
    targets = kernel_files(args.paths or [str(ROOT / "examples" / "nki")])
    outcomes = []
    for target in targets:
        if isinstance(target, str):
            outcome = Outcome(Path(target), "skipped", "path does not exist (nothing is fetched)")
        else:
            outcome = run_file(target, args.timeout)
        outcomes.append(outcome)
        print(f"{outcome.status:<12} {outcome.path}" + (f"  -- {outcome.reason}" if outcome.reason else ""),
              flush=True)
    counts = {s: sum(o.status == s for o in outcomes)
              for s in ("pass", "wrong", "unsupported", "timeout", "not run", "skipped")}
    print(", ".join(f"{n} {s}" for s, n in counts.items() if n))
    return 1 if counts["wrong"] else 0


if __name__ == "__main__":
    sys.exit(main())
