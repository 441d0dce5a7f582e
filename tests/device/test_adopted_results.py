"""A fresh result of a CPU kernel becomes the neuron tensor the op returns.

When nothing else holds the CPU kernel's result, its own TensorImpl is turned
into the neuron tensor (device, dispatch keys) instead of a second TensorImpl
being made around its memory. These tests check that such results are neuron
tensors in every way PyTorch looks at them: the same dispatch keys as a
neuron tensor made by a factory (with and without autograd, in inference
mode), correct autograd and values equal to CPU's, and that results the
kernel also keeps elsewhere are not taken over.
"""

import pytest
import torch

from conftest import on_device


def _keys(t: torch.Tensor) -> str:
    return str(torch._C._dispatch_keys(t))


def _factory_keys(dtype=torch.float32) -> str:
    return _keys(torch.empty(2, dtype=dtype, device="neuron"))


@pytest.mark.parametrize("build", [
    lambda a, b: a + b,  # the unboxed fast path
    lambda a, b: torch.atan2(a, b),  # the boxed fallback
    lambda a, b: torch.cumsum(a, 0),
])
def test_fresh_results_have_a_factory_made_neuron_tensors_keys(build):
    g = torch.Generator().manual_seed(0)
    a_cpu, b_cpu = torch.randn(8, 8, generator=g), torch.randn(8, 8, generator=g)
    a, b = a_cpu.to("neuron"), b_cpu.to("neuron")
    out = build(a, b)
    assert on_device(out) and out.device == torch.device("neuron", 0)
    assert not out.is_cpu and out.device.type == "neuron"
    assert _keys(out) == _factory_keys()
    assert out.untyped_storage().device == out.device
    torch.testing.assert_close(out.cpu(), build(a_cpu, b_cpu), rtol=0, atol=0)
    # The adopted tensor dispatches to neuron kernels like any other.
    assert on_device(out * 2)
    torch.testing.assert_close((out * 2).cpu(), build(a_cpu, b_cpu) * 2, rtol=0, atol=0)


def test_results_made_in_inference_mode_are_inference_neuron_tensors():
    a = torch.randn(4, 4).to("neuron")
    with torch.inference_mode():
        out = a + a
        factory = torch.empty(2, device="neuron")
    assert out.is_inference() and on_device(out)
    assert _keys(out) == _keys(factory)
    with torch.inference_mode():
        cpu_out = a.cpu() + a.cpu()
    with pytest.raises(RuntimeError) as cpu_error:
        cpu_out.requires_grad_(True)
    with pytest.raises(RuntimeError) as neuron_error:  # refused exactly as CPU refuses it
        out.requires_grad_(True)
    assert str(neuron_error.value) == str(cpu_error.value)


def test_autograd_through_adopted_results_matches_cpu():
    def run(device):
        torch.manual_seed(0)
        w = torch.randn(5, 5).to(device).requires_grad_()
        x = torch.randn(3, 5).to(device)
        y = torch.tanh(x @ w + 1).sum()
        y.backward()
        return y.detach(), w.grad

    (y_cpu, g_cpu), (y_n, g_n) = run("cpu"), run("neuron")
    assert on_device(g_n) and _keys(g_n) == _factory_keys()
    torch.testing.assert_close(y_n.cpu(), y_cpu, rtol=0, atol=0)
    torch.testing.assert_close(g_n.cpu(), g_cpu, rtol=0, atol=0)


def test_integer_bool_and_complex_results_keep_their_dtype_and_keys():
    a = torch.arange(6).to("neuron")
    z = torch.complex(torch.arange(3.0), torch.ones(3)).to("neuron")
    for out, dtype in [(a + a, torch.int64), (a > 2, torch.bool), (z * z, torch.complex64)]:
        assert out.dtype == dtype and _keys(out) == _factory_keys(dtype)
    torch.testing.assert_close((z * z).cpu(), (z.cpu() * z.cpu()), rtol=0, atol=0)


def test_a_result_the_kernel_also_returns_twice_stays_correct():
    # aten::_unique2-style ops and views of a fresh result share one storage:
    # the shared storage must survive the first result's adoption.
    x = torch.tensor([3, 1, 3, 2, 1]).to("neuron")
    values, inverse, counts = torch.unique(x, return_inverse=True, return_counts=True)
    ref = torch.unique(x.cpu(), return_inverse=True, return_counts=True)
    for got, want in zip((values, inverse, counts), ref):
        assert on_device(got)
        torch.testing.assert_close(got.cpu(), want, rtol=0, atol=0)
    a = torch.randn(4, 6).to("neuron")
    parts = torch.split(a * 1, 2, dim=1)  # views of one fresh result
    for got, want in zip(parts, torch.split(a.cpu(), 2, dim=1)):
        torch.testing.assert_close(got.cpu(), want, rtol=0, atol=0)
