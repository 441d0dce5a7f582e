"""Run an AWS NKI kernel file unmodified: ``python -m torchneuron.nki.run kernel.py [args...]``.

A file that starts with ``import nki`` or ``import neuronxcc.nki`` finds torchneuron's
modules only once the alias hook (:mod:`torchneuron.nki.aliases`) is installed, which
importing ``torchneuron.nki`` does. A bare ``python kernel.py`` imports nothing of
torchneuron first, and no hook is installed into the interpreter's startup (a ``.pth``
file would import torchneuron - and torch - in every Python process, and could answer
``import nki`` where a user means something else): this runner is the no-edit way. It
installs the hook and runs the file as ``__main__`` with ``sys.argv`` and ``sys.path[0]`` set
as ``python kernel.py`` would.
"""

from __future__ import annotations

import os
import runpy
import sys

from torchneuron.nki import aliases

__all__ = ["main"]


def main(argv: list[str] | None = None) -> None:
    """Install the alias hook and run ``argv[0]`` (a path) as ``__main__`` with ``argv`` as its ``sys.argv``."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args:
        raise SystemExit("usage: python -m torchneuron.nki.run KERNEL_FILE.py [args...]")
    aliases.install()
    sys.argv = args
    sys.path[0] = os.path.dirname(os.path.abspath(args[0]))  # as `python kernel.py` would (-m put the cwd there)
    runpy.run_path(args[0], run_name="__main__")


if __name__ == "__main__":
    main()
