"""PyTorch's own internals do not count as the program's CPU fallbacks.

Printing a tensor and the standard AMP recipe run float64 ops inside PyTorch
(``torch/_tensor_str.py``, ``GradScaler.unscale_``). They must not warn, fill
``metrics.fallbacks()`` or fail strict mode (``TORCHNEURON_CPU_FALLBACK=0``);
printing is one host read (a sync and a device-to-host copy), as for XLA tensors.
The user's own float64 ops still count and still fail strict mode.
"""

import re
import warnings
from pathlib import Path

import pytest
import torch

import torchneuron
from conftest import run_python
from torchneuron.device.fallback import NeuronCPUFallbackWarning

PRINTED = {
    "float_with_specials": lambda d: torch.tensor([1.5, float("nan"), float("inf"), -2e-5], device=d),
    "summarized": lambda d: torch.linspace(-1e6, 1e6, 5000, device=d).reshape(50, 100),
    "bfloat16": lambda d: torch.linspace(0, 1, 7, device=d, dtype=torch.bfloat16),
    "int64": lambda d: torch.arange(12, device=d).reshape(3, 4),
    "bool": lambda d: torch.arange(5, device=d) > 2,
    "scalar": lambda d: torch.tensor(3.25, device=d),
    "empty": lambda d: torch.empty(0, 3, device=d),
    "requires_grad": lambda d: torch.ones(2, device=d, requires_grad=True) * 3,
    "negative_view": lambda d: torch.ones(3, device=d)._neg_view(),
}


@pytest.mark.parametrize("name", sorted(PRINTED))
def test_printing_is_one_host_read_with_cpu_text(name):
    cpu = PRINTED[name]("cpu")
    neuron = PRINTED[name]("neuron")
    torchneuron.metrics.reset()
    with warnings.catch_warnings():
        warnings.simplefilter("error", NeuronCPUFallbackWarning)
        text = repr(neuron)
    counters = torchneuron.metrics.counters()
    assert "device='neuron:0'" in text
    squeeze = lambda t: re.sub(r"\s+", "", t)  # noqa: E731 (line wrapping moves with the suffix)
    assert squeeze(text).replace(",device='neuron:0'", "") == squeeze(repr(cpu))
    assert torchneuron.metrics.fallbacks() == []
    assert counters["cpu_fallbacks"] == 0
    reads = 1 if cpu.numel() else 0  # an empty tensor prints without reading values
    assert counters["host_syncs"] == reads and counters["copies_to_host"] == reads


def test_grad_scaler_reciprocal_is_counted_apart():
    model = torch.nn.Linear(4, 2).to("neuron")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("neuron")
    torchneuron.metrics.reset()
    with warnings.catch_warnings():
        warnings.simplefilter("error", NeuronCPUFallbackWarning)
        with torch.autocast("neuron"):
            loss = model(torch.ones(3, 4, device="neuron")).float().sum()
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
    assert torchneuron.metrics.fallbacks() == []
    internal = torchneuron.metrics.pytorch_internal_ops()
    assert any(c.op == "aten::reciprocal" and "float64" in c.dtypes for c in internal)
    assert torchneuron.metrics.counters()["pytorch_internal_host_ops"] >= 1


def test_users_own_float64_op_still_counts():
    t = torch.ones(3, device="neuron")
    torchneuron.metrics.reset()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        t.double().reciprocal()
    ops = {c.op for c in torchneuron.metrics.fallbacks()}
    assert "aten::reciprocal" in ops


def test_strict_mode_accepts_printing_and_amp_but_not_user_float64():
    result = run_python("""
        import warnings, torch
        warnings.simplefilter("error")
        t = torch.linspace(-1, 1, 10, device="neuron")
        print(t)
        model = torch.nn.Linear(4, 2).to("neuron")
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        scaler = torch.amp.GradScaler("neuron")
        with torch.autocast("neuron"):
            loss = model(torch.ones(3, 4, device="neuron")).float().sum()
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        print("AMP OK")
        try:
            t.double().reciprocal()
        except NotImplementedError as e:
            print("REFUSED", "TORCHNEURON_CPU_FALLBACK=0" in str(e))
    """, env={"TORCHNEURON_CPU_FALLBACK": "0"})
    assert result.returncode == 0, result.stderr
    assert "device='neuron:0'" in result.stdout
    assert "AMP OK" in result.stdout
    assert "REFUSED True" in result.stdout


def _readme_quick_start() -> str:
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", readme, flags=re.S)
    return next(b for b in blocks if "import torch" in b)


def test_readme_quick_start_runs_without_warnings(tmp_path):
    code = _readme_quick_start()  # Python's default warning filters, as a user runs it
    result = run_python(code, env={"NEURON_COMPILE_CACHE_URL": str(tmp_path / "cache")}, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Warning" not in result.stderr, result.stderr[-3000:]
