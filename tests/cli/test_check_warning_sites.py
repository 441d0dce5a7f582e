"""Under `torchneuron check` (tensors on neuron through the default-device mode), the CPU
fallback warning points at the user's line, not at torch's or check's wrappers."""

from check_cli_support import run_check

SCRIPT = """\
import torch
scale = torch.ones(4, dtype=torch.float64)  # float64 on the default device
"""


def test_the_fallback_warning_names_the_users_line(tmp_path):
    result, _ = run_check(tmp_path, "train.py", files={"train.py": SCRIPT})
    assert result.returncode == 0, result.stdout + result.stderr
    warned = [line for line in result.stderr.splitlines() if "NeuronCPUFallbackWarning" in line]
    assert warned and all(line.startswith(f"{tmp_path / 'train.py'}:2: ") or line.startswith("train.py:2: ")
                          for line in warned), result.stderr
