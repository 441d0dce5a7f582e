"""``torch_neuronx``: TorchNeuron's names, each backed by torchneuron or refusing clearly."""

from __future__ import annotations

import pytest
import torch

import torch_neuronx
import torchneuron.nki as nki
import torchneuron.nki.language as nl
from torchneuron.testing import is_on_neuron, run_python


def test_device_and_memory_names_are_torch_neuron():
    for name in ("device_count", "current_device", "set_device", "synchronize", "get_device_properties",
                 "empty_cache", "memory_allocated", "memory_reserved", "max_memory_allocated",
                 "max_memory_reserved", "memory_stats", "memory_summary", "reset_peak_memory_stats",
                 "reset_accumulated_memory_stats", "current_stream", "default_stream", "set_stream",
                 "stream", "device", "StreamContext", "Stream", "Event"):
        assert getattr(torch_neuronx, name) is getattr(torch.neuron, name), name
    assert torch_neuronx.neuron is torch.neuron
    assert torch_neuronx.device_count() == torch.neuron.device_count() > 0
    x = torch.ones(1024, device="neuron")
    assert torch_neuronx.is_neuron_runtime_initialized()
    assert torch_neuronx.memory_allocated() >= x.untyped_storage().nbytes()


@pytest.mark.filterwarnings("ignore::UserWarning")  # the float64 fallback's NeuronCPUFallbackWarning
def test_op_tracking_lists_device_ops_and_cpu_fallbacks_per_call():
    a = torch.arange(6.0).view(2, 3)
    x = a.to("neuron")
    torch_neuronx.clear_op_tracking()
    assert torch_neuronx.get_executed_ops() == [] and torch_neuronx.get_fallback_ops() == []
    y = x + x
    y = y + x
    z = x.double().sin()  # float64: real Trainium runs it on the host
    assert torch.equal(y.cpu(), a + a + a) and torch.equal(z.cpu(), a.double().sin())

    executed, fallback = torch_neuronx.get_executed_ops(), torch_neuronx.get_fallback_ops()
    assert executed.count("aten::add") == 2  # one entry per call, overload dropped (add.Tensor)
    assert "aten::sin" in fallback and "aten::sin" not in executed
    assert all(name.startswith("aten::") and "." not in name for name in executed + fallback)
    torch_neuronx.clear_op_tracking()
    assert torch_neuronx.get_executed_ops() == [] and torch_neuronx.get_fallback_ops() == []


def test_unbacked_names_raise_not_implemented():
    with pytest.raises(NotImplementedError, match="NeuronProfiler.*torch.profiler"):
        torch_neuronx.NeuronProfiler()
    with pytest.raises(NotImplementedError, match="compile_metrics"):
        torch_neuronx.get_dynamo_metrics()


def test_import_registers_the_device_with_autoload_off():
    result = run_python("""
        import torch_neuronx, torch
        print(torch.ones(2, device="neuron").device, torch_neuronx.device_count())
    """, env={"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"})
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["neuron:0", "4"]


@nki.jit
def _add_into(a, b, out):
    """TorchNeuron's style: the caller allocates ``out`` and the kernel writes it."""
    for i in range(a.shape[0] // 128):
        rows = slice(i * 128, (i + 1) * 128)
        nl.store(out[rows, :], value=nl.add(nl.load(a[rows, :]), nl.load(b[rows, :])))


@nki.jit
def _scale(a, factor=2.0):
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    for i in range(a.shape[0] // 128):
        rows = slice(i * 128, (i + 1) * 128)
        nl.store(out[rows, :], value=nl.multiply(nl.load(a[rows, :]), factor))
    return out


@torch_neuronx.nki_op("tn_neuronx_test::add_scaled", mutates_args={})
def add_scaled(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    out = torch.empty_like(x)
    torch_neuronx.wrap_nki(_add_into)(x, y, out)
    return torch_neuronx.wrap_nki(_scale)(out, 3.0)


def _kernel_calls() -> int:
    return sum(s.calls for s in nki.kernel_stats())


def test_nki_op_runs_its_kernels_eagerly():
    nki.reset_kernel_stats()
    a, b = torch.randn(256, 64), torch.randn(256, 64)
    out = add_scaled(a.to("neuron"), b.to("neuron"))
    assert is_on_neuron(out)
    assert torch.equal(out.cpu(), (a + b) * 3.0)
    assert _kernel_calls() == 2
    assert torch.equal(torch.ops.tn_neuronx_test.add_scaled(a, b), (a + b) * 3.0)


def test_nki_op_compiles_without_graph_break():
    torch._dynamo.reset()
    torch.neuron.reset_compile_metrics()
    nki.reset_kernel_stats()
    a, b = torch.randn(256, 64), torch.randn(256, 64)

    def fn(x, y):
        return add_scaled(x.relu(), y) - 1

    out = torch.compile(fn, backend="neuron", fullgraph=True)(a.to("neuron"), b.to("neuron"))
    assert is_on_neuron(out)
    assert torch.equal(out.cpu(), (a.relu() + b) * 3.0 - 1)
    metrics = torch.neuron.compile_metrics()
    assert metrics["compiles"] >= 1 and metrics["graph_breaks"] == 0
    assert _kernel_calls() == 2  # shape inference for the graph did not run the kernels


def test_wrap_nki_rejects_what_is_not_an_nki_kernel():
    with pytest.raises(TypeError, match="torchneuron.nki.jit kernel"):
        torch_neuronx.wrap_nki(lambda x: x)
