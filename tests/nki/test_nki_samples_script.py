"""scripts/nki_samples.py as a user runs it on AWS's kernel files (issue 17, h17f): relative paths,
files that only define kernels, and driver scripts that need a framework integration."""

from __future__ import annotations

import importlib.util
import os
import pathlib
import sys
import textwrap

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def samples():
    spec = importlib.util.spec_from_file_location("nki_samples_script", ROOT / "scripts" / "nki_samples.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks its module up while being defined
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        del sys.modules[spec.name]


def _write(path: pathlib.Path, source: str) -> pathlib.Path:
    path.write_text(textwrap.dedent(source))
    return path


CHECKED_KERNEL = """
    import numpy as np
    import nki
    import nki.language as nl

    @nki.jit
    def double(a):
        out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
        nl.store(out, nl.add(nl.load(a), nl.load(a)))
        return out

    if __name__ == "__main__":
        a = np.arange(128 * 4, dtype=np.float32).reshape(128, 4)
        print("NKI and NumPy match" if np.array_equal(double(a), a + a) else "NKI and NumPy differ")
"""


def test_a_relative_path_is_taken_from_the_current_directory(samples, tmp_path, monkeypatch):
    # Each file runs with its own directory as working directory: a relative path used to be
    # resolved a second time there (examples/nki/examples/nki/x.py, FileNotFoundError).
    (tmp_path / "kernels").mkdir()
    _write(tmp_path / "kernels" / "double.py", CHECKED_KERNEL)
    monkeypatch.chdir(tmp_path)
    [target] = samples.kernel_files(["kernels"])
    assert target == tmp_path / "kernels" / "double.py"
    outcome = samples.run_file(target, timeout=300)
    assert (outcome.status, outcome.reason) == ("pass", "")


def test_a_file_that_only_defines_kernels_is_not_reported_as_passing(samples, tmp_path):
    # AWS's matmul and attention tutorial kernel files have no __main__: running them defines
    # kernels and checks nothing, which used to be reported as "pass".
    source = CHECKED_KERNEL.split("if __name__")[0]
    outcome = samples.run_file(_write(tmp_path / "only_kernels.py", source), timeout=300)
    assert outcome.status == "not run"
    assert "__main__" in outcome.reason and "call its kernels" in outcome.reason


def test_an_error_while_defining_kernels_is_still_reported(samples, tmp_path):
    # AWS's mx_kernels.py has no __main__ but stops at import (a removed decorator argument)
    source = "import nki\n\n@nki.jit(platform_target='trn2')\ndef k(a):\n    return a\n"
    outcome = samples.run_file(_write(tmp_path / "defines.py", source), timeout=300)
    assert outcome.status == "unsupported"
    assert "platform_target" in outcome.reason


@pytest.mark.parametrize("source, runs", [
    ("def f():\n    pass\n", False),
    ("x = 1\nif __name__ == '__main__':\n    print(x)\n", True),
    ('if "__main__" == __name__:\n    pass\n', True),
    ("def check(v):\n    assert v\n\ncheck(1)\n", True),  # a test file that calls its check at top level
    ("def f(:\n", True),  # cannot be parsed: run it, so the syntax error is what is reported
])
def test_what_counts_as_running_something(samples, tmp_path, source, runs):
    assert samples.runs_something(_write(tmp_path / "k.py", source)) is runs


def test_a_driver_that_needs_torch_xla_is_skipped_with_the_module_named(samples, tmp_path):
    path = _write(tmp_path / "toplevel.py", """
        import torch_xla.core.xla_model as xm

        if __name__ == "__main__":
            print(xm.xla_device())
    """)
    outcome = samples.run_file(path, timeout=300)
    assert outcome.status == "skipped"
    assert "torch_xla" in outcome.reason and "not installed" in outcome.reason


def test_a_missing_module_of_the_users_own_is_still_an_error(samples, tmp_path):
    path = _write(tmp_path / "uses_helper.py", """
        import my_missing_helper_module

        if __name__ == "__main__":
            pass
    """)
    outcome = samples.run_file(path, timeout=300)
    assert outcome.status == "unsupported"
    assert "my_missing_helper_module" in outcome.reason
    assert os.path.exists(path)
