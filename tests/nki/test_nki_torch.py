"""NKI kernels on torch tensors: eager calls, custom ops in torch.compile graphs, training through kernels."""

from __future__ import annotations


import pytest
import torch

import torchneuron
import torchneuron.nki as nki
import torchneuron.nki.isa as nisa
import torchneuron.nki.language as nl
from torchneuron.testing import is_on_neuron as on_neuron


@nki.jit
def add_kernel(a, b):
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    for i in range(a.shape[0] // 128):
        rows = slice(i * 128, (i + 1) * 128)
        nl.store(out[rows, :], value=nl.add(nl.load(a[rows, :]), nl.load(b[rows, :])))
    return out


@nki.jit
def scale_in_place(a, factor=2.0):
    for i in range(a.shape[0] // 128):
        rows = slice(i * 128, (i + 1) * 128)
        nl.store(a[rows, :], value=nl.multiply(nl.load(a[rows, :]), factor))
    return a


@nki.jit
def silu_kernel(x):
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    for i in range(x.shape[0] // 128):
        rows = slice(i * 128, (i + 1) * 128)
        tile = nl.load(x[rows, :])
        y = nl.ndarray(tile.shape, dtype=x.dtype, buffer=nl.sbuf)
        nisa.activation(dst=y, op=nl.silu, data=tile)
        nl.store(out[rows, :], value=y)
    return out


@nki.jit
def silu_backward_kernel(x, grad):
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    for i in range(x.shape[0] // 128):
        rows = slice(i * 128, (i + 1) * 128)
        slope = nl.ndarray((128, x.shape[1]), dtype=nl.float32, buffer=nl.sbuf)
        nisa.activation(dst=slope, op=nl.silu_dx, data=nl.load(x[rows, :]))
        nl.store(out[rows, :], value=nl.multiply(slope, nl.load(grad[rows, :])))
    return out


def _backward(ctx, grad):
    (x,) = ctx.saved_tensors
    return silu_backward(x, grad.contiguous())


def _setup(ctx, inputs, output):
    ctx.save_for_backward(inputs[0])


silu_backward = nki.torch_op("tn_nki_test::silu_backward", silu_backward_kernel)
silu = nki.torch_op("tn_nki_test::silu", silu_kernel, backward=_backward, setup_context=_setup)
add = nki.torch_op("tn_nki_test::add", add_kernel)


@pytest.fixture(autouse=True)
def _fresh_stats():
    nki.reset_kernel_stats()
    yield


def _calls(name: str) -> int:
    return sum(s.calls for s in nki.kernel_stats() if s.name == name)


def test_kernel_on_neuron_tensors_returns_neuron_tensors():
    a = torch.randn(256, 512, dtype=torch.bfloat16, device="neuron")
    b = torch.randn(256, 512, dtype=torch.bfloat16, device="neuron")
    before = torch.neuron.memory_allocated()
    c = add_kernel(a, b)
    assert on_neuron(c) and c.dtype == torch.bfloat16 and c.shape == a.shape
    assert torch.equal(c.cpu(), a.cpu() + b.cpu())
    # the output was allocated on the device, once, with no staging copies left behind
    assert torch.neuron.memory_allocated() - before == c.untyped_storage().nbytes()
    assert _calls("add_kernel") == 1


def test_kernel_writes_land_in_the_argument_without_copies():
    a = torch.randn(128, 64, device="neuron")
    expected = a.cpu() * 3.0
    ptr = a.data_ptr()
    out = scale_in_place(a, 3.0)
    assert out.data_ptr() == ptr
    assert torch.equal(a.cpu(), expected)


def test_kernel_follows_the_tensors_device_and_charges_its_stream():
    a = torch.randn(256, 512, device="neuron:1")
    b = torch.randn(256, 512, device="neuron:1")
    with torch.neuron.device(1):
        start, end = torch.neuron.Event(enable_timing=True), torch.neuron.Event(enable_timing=True)
        start.record()
        c = add_kernel(a, b)
        end.record()
    end.synchronize()
    assert on_neuron(c, 1)
    [stats] = nki.kernel_stats()
    assert stats.calls == 1 and stats.instructions > 0
    assert start.elapsed_time(end) == pytest.approx(stats.modeled_seconds * 1e3, rel=1e-6)


def test_cpu_tensors_run_the_same_kernel():
    a, b = torch.randn(128, 32), torch.randn(128, 32)
    c = add_kernel(a, b)
    assert c.device.type == "cpu" and torch.equal(c, a + b)


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_bad_arguments_are_reported_clearly():
    with pytest.raises(RuntimeError, match="same device.*cpu.*neuron:0"):
        add_kernel(torch.randn(128, 8), torch.randn(128, 8, device="neuron"))
    with pytest.raises(TypeError, match="float64.*no FP64"):
        add_kernel(torch.randn(128, 8, dtype=torch.float64, device="neuron"),
                   torch.randn(128, 8, dtype=torch.float64, device="neuron"))


def test_direct_call_warns_that_it_does_not_track_gradients():
    x = torch.randn(128, 16, device="neuron", requires_grad=True)
    with pytest.warns(UserWarning, match="not differentiable.*torch_op"):
        y = silu_kernel(x)
    assert not y.requires_grad


def test_custom_op_runs_the_kernel_inside_a_compiled_graph():
    torch.neuron.reset_compile_metrics()
    torch._dynamo.reset()
    a = torch.randn(256, 128, device="neuron")
    b = torch.randn(256, 128, device="neuron")

    def fn(x, y):
        return add(x.relu(), y) * 2

    compiled = torch.compile(fn, backend="neuron", fullgraph=True)
    out = compiled(a, b)
    assert on_neuron(out)
    torch.testing.assert_close(out.cpu(), (a.cpu().relu() + b.cpu()) * 2, rtol=0, atol=0)
    metrics = torch.neuron.compile_metrics()
    assert metrics["compiles"] >= 1 and metrics["graph_breaks"] == 0
    assert not metrics["partitioned_ops"] and not metrics["eager_fallbacks"]
    assert _calls("add_kernel") == 1  # the compiled graph called our kernel
    compiled(a, b)
    assert _calls("add_kernel") == 2


def test_custom_op_shape_inference_traces_without_computing():
    a = torch.randn(384, 64, device="neuron")
    with torch._subclasses.fake_tensor.FakeTensorMode() as mode:
        fake = mode.from_tensor(a)
        out = add(fake, fake)
    assert out.shape == (384, 64) and out.dtype == torch.float32
    assert _calls("add_kernel") == 0  # shape inference is not a device run


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_kernel_pair_trains_like_the_reference(compiled):
    torch._dynamo.reset()
    torch.neuron.reset_compile_metrics()
    torch.manual_seed(0)
    reference = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.SiLU(), torch.nn.Linear(64, 1))

    class WithKernel(torch.nn.Module):
        def __init__(self, layers):
            super().__init__()
            self.first, self.last = layers[0], layers[2]

        def forward(self, x):
            return self.last(silu(self.first(x)))

    model = WithKernel(torch.nn.Sequential(*[torch.nn.Linear(32, 64), torch.nn.SiLU(),
                                             torch.nn.Linear(64, 1)]))
    model.load_state_dict({"first.weight": reference[0].weight, "first.bias": reference[0].bias,
                           "last.weight": reference[2].weight, "last.bias": reference[2].bias})
    model = model.to("neuron")
    run = torch.compile(model, backend="neuron", fullgraph=True) if compiled else model
    opt_ref = torch.optim.SGD(reference.parameters(), lr=0.1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, target = torch.randn(128, 32), torch.randn(128, 1)
    for _ in range(4):
        loss_ref = torch.nn.functional.mse_loss(reference(x), target)
        opt_ref.zero_grad()
        loss_ref.backward()
        opt_ref.step()
        loss = torch.nn.functional.mse_loss(run(x.to("neuron")), target.to("neuron"))
        opt.zero_grad()
        loss.backward()
        opt.step()
        torch.testing.assert_close(loss.cpu(), loss_ref.detach(), rtol=1e-5, atol=1e-6)
    assert _calls("silu_kernel") == 4 and _calls("silu_backward_kernel") == 4
    if compiled:
        assert torch.neuron.compile_metrics()["graph_breaks"] == 0
    torch.testing.assert_close(model.first.weight.cpu(), reference[0].weight.detach(), rtol=1e-5, atol=1e-6)


def test_metrics_report_lists_kernels_with_modelled_time():
    a = torch.randn(256, 64, device="neuron")
    torchneuron.metrics.reset()  # the report covers the record since the last reset
    add_kernel(a, a)
    add_kernel(a, a)
    report = torchneuron.metrics.report()
    assert "NKI kernels" in report
    line = next(line for line in report.splitlines() if "add_kernel" in line)
    assert " 2 " in line and " us" in line
