"""`torchneuron check` and NaN/Inf: the verdict says when the loss or a model's output became
non-finite, and with --detect-nonfinite names the op that first made it."""

import math

import torch

from check_cli_support import run_check

# Step 2 takes the log of a negative number (NaN, as NumPy's and CPU's log give): the loss
# is NaN from then on, and after that step's update the parameters, so the model's output.
NAN_AT_STEP_2 = """\
import torch
torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x = torch.randn(8, 4)
for step in range(4):
    out = model(x)
    if step == 2:
        out = out * torch.log(out - 1e9)  # the first NaN
    loss = out.square().mean()
    opt.zero_grad()
    loss.backward()  # the NaN loss
    opt.step()
"""


def _line(marker):
    return next(i for i, line in enumerate(NAN_AT_STEP_2.splitlines(), 1) if marker in line)


def _cpu_oracle():
    """Runs the script's computation on CPU: the optimizer steps done before the loss was
    first non-finite, and before the model's output was."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(8, 4)
    first_loss = first_output = None
    for step in range(4):
        out = model(x)
        if first_output is None and not torch.isfinite(out).all():
            first_output = step
        if step == 2:
            out = out * torch.log(out - 1e9)
        loss = out.square().mean()
        if first_loss is None and not math.isfinite(loss.item()):
            first_loss = step
        opt.zero_grad()
        loss.backward()
        opt.step()
    return first_loss, first_output


def test_verdict_says_when_the_loss_and_the_output_became_nan(tmp_path):
    result, data = run_check(tmp_path, "script.py", files={"script.py": NAN_AT_STEP_2})
    assert result.returncode == 0, result.stdout + result.stderr
    loss_step, output_step = _cpu_oracle()
    found = {f["kind"]: f for f in data["nonfinite"]["found"]}
    assert data["nonfinite"]["detect"] is False
    assert found["loss"]["step"] == loss_step and found["loss"]["nan"] == 1
    assert found["loss"]["site"].endswith(f"script.py:{_line('the NaN loss')} in <module>")
    assert found["output"]["step"] == output_step and found["output"]["module"] == "Linear"
    assert found["output"]["nan"] == 8 and found["output"]["shape"] == [8, 1]
    assert data["verdict"].startswith("runs on device, but the loss became NaN/Inf")
    assert f"after {loss_step} optimizer steps at " in data["verdict"]
    assert "--detect-nonfinite" in data["verdict"]
    assert "verdict: runs on device, but the loss became NaN/Inf" in " ".join(result.stdout.split())


def test_detect_nonfinite_names_the_op_that_made_it(tmp_path):
    result, data = run_check(tmp_path, "--detect-nonfinite", "script.py",
                             files={"script.py": NAN_AT_STEP_2})
    assert result.returncode == 1
    assert data["nonfinite"]["detect"] is True
    assert data["outcome"]["nonfinite_op"] == "aten::log"
    assert data["outcome"]["exception_type"] == "NonFiniteError"
    site = f"script.py:{_line('the first NaN')} in <module>"
    assert data["verdict"] == f"fails: aten::log made the first NaN/Inf at {data['outcome']['site']}"
    assert data["outcome"]["site"].endswith(site)
    assert data["steps"] == _cpu_oracle()[0]  # it stopped in the step that made the NaN


def test_the_switch_is_the_environment_variable(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHNEURON_DETECT_NONFINITE", "1")
    result, data = run_check(tmp_path, "script.py", files={"script.py": NAN_AT_STEP_2})
    assert result.returncode == 1 and data["outcome"]["nonfinite_op"] == "aten::log"


def test_a_finite_run_says_nothing_of_nan(tmp_path):
    clean = NAN_AT_STEP_2.replace("out = out * torch.log(out - 1e9)", "out = out * 1.0")
    result, data = run_check(tmp_path, "script.py", files={"script.py": clean})
    assert result.returncode == 0
    assert data["nonfinite"]["found"] == [] and data["verdict"] == "runs on device"
