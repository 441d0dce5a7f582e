"""torchneuron.debug.detect_nonfinite(): the first op whose output holds a NaN or Inf is
named, with the user's line and its inputs' statistics; off, nothing is checked."""

import inspect

import pytest
import torch

import torchneuron
from torchneuron.debug import NonFiniteError, detect_nonfinite
from torchneuron.testing import run_python


def test_names_the_first_op_with_a_nan_and_its_line():
    x = torch.tensor([4.0, 1.0, -1.0, 9.0], device="neuron")
    with pytest.raises(NonFiniteError) as info:
        with detect_nonfinite():
            y = x * 2  # finite: passes
            line = inspect.currentframe().f_lineno + 1
            z = torch.sqrt(y - 1)  # sqrt(-3) is NaN: the first non-finite output
            z.exp()
    error = info.value
    assert error.op == "aten::sqrt"
    assert any(f"{__file__}:{line} in " in frame for frame in error.stack)
    assert error.inputs[0]["nan"] == 0 and error.inputs[0]["min"] == -3.0  # the input was finite
    assert "aten::sqrt produced a non-finite value" in str(error)
    assert "input 0: float32[4] on neuron:0: 0 NaN, 0 Inf, finite min -3" in str(error)


def test_an_inf_from_division_and_the_check_adds_no_accounting():
    a = torch.tensor([1.0, 2.0], device="neuron")
    b = torch.tensor([1.0, 0.0], device="neuron")
    torchneuron.metrics.reset()
    with pytest.raises(NonFiniteError, match="aten::div.Tensor") as info:
        with detect_nonfinite():
            a / b
    assert info.value.inputs[1]["min"] == 0.0
    counters = torchneuron.metrics.counters()
    assert counters["host_syncs"] == 0 and counters["copies_to_host"] == 0  # read through aliases
    assert counters["ops"] == 1  # the division only


def test_a_nan_made_in_backward_names_the_backward_op():
    x = torch.tensor([0.0, 1.0], device="neuron", requires_grad=True)
    with pytest.raises(NonFiniteError) as info:
        with detect_nonfinite():
            y = torch.sqrt(x)  # finite forward: sqrt(0) = 0; its gradient 1/(2*sqrt(0)) is Inf
            y.sum().backward()
    assert "SqrtBackward0" in str(info.value)


def test_finite_work_runs_unchanged_and_off_checks_nothing():
    x = torch.randn(16, 16, device="neuron")
    with detect_nonfinite():
        y = (x @ x).softmax(-1)
    assert torch.equal(y.cpu(), (x.cpu() @ x.cpu()).softmax(-1))
    z = torch.log(torch.tensor([-1.0], device="neuron"))  # outside: NaN is allowed
    assert torch.isnan(z.cpu()).all()


def test_compiled_code_is_checked_op_by_op():
    def f(t):
        return torch.log(t - 2) * 3

    compiled = torch.compile(f, backend="neuron")
    x = torch.tensor([1.0, 5.0], device="neuron")
    with pytest.raises(NonFiniteError, match="aten::log"):
        with detect_nonfinite():
            compiled(x)


def test_the_setting_turns_it_on_from_the_start():
    result = run_python(
        "import torch\n"
        "from torchneuron.debug import NonFiniteError\n"
        "try:\n"
        "    torch.log(torch.tensor([-1.0], device='neuron'))\n"
        "except NonFiniteError as e:\n"
        "    print('caught', e.op)\n",
        env={"TORCHNEURON_DETECT_NONFINITE": "1"})
    assert result.returncode == 0, result.stderr
    assert "caught aten::log" in result.stdout
