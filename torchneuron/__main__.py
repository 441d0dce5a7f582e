"""``python -m torchneuron``: runs the command line (see :mod:`torchneuron.cli`)."""

import sys

from torchneuron.cli import main

if __name__ == "__main__":
    sys.exit(main())
