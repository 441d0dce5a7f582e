"""``python -m torchneuron.nki.run kernel.py`` runs an AWS kernel file that imports ``nki`` /
``neuronxcc.nki`` with no edit and without importing torchneuron first (issue 17)."""

import os
import subprocess
import sys
from pathlib import Path

import torchneuron

KERNEL_FILE = '''
import sys
import numpy as np
import neuronxcc.nki as nki
import nki.language as nl
from helper_next_to_kernel import SCALE


@nki.jit
def scale(a):
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    nl.store(out, value=nl.multiply(nl.load(a), SCALE))
    return out


if __name__ == "__main__":
    a = np.arange(8, dtype=np.float32).reshape(2, 4)
    assert np.array_equal(nki.simulate(scale)(a), a * SCALE)
    print("ran", sys.argv[1:], nki.__name__)
'''


def _run(args, cwd):
    root = str(Path(torchneuron.__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": root, "NEURON_PLATFORM_TARGET_OVERRIDE": "trn2"}
    return subprocess.run([sys.executable, "-m", "torchneuron.nki.run", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


def test_runs_a_kernel_file_unmodified(tmp_path):
    kernels = tmp_path / "kernels"
    kernels.mkdir()
    (kernels / "kernel.py").write_text(KERNEL_FILE)
    (kernels / "helper_next_to_kernel.py").write_text("SCALE = 3.0\n")
    done = _run([str(kernels / "kernel.py"), "--flag", "x"], cwd=tmp_path)  # the helper is found next to the file
    assert done.returncode == 0, done.stderr
    assert "ran ['--flag', 'x'] torchneuron.nki" in done.stdout


def test_without_a_file_it_says_how_to_use_it(tmp_path):
    done = _run([], cwd=tmp_path)
    assert done.returncode != 0 and "usage: python -m torchneuron.nki.run KERNEL_FILE.py" in done.stderr
