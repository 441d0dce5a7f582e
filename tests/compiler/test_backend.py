"""torch.compile(backend="neuron"): the pipeline, its checks and its counters."""

import re
import threading
import warnings

import pytest
import torch
from compile_support import _fresh_compile_state, generated_code, on_neuron  # noqa: F401
from compile_support import U32, linear_tolerance, softmax_tolerance
from torch.testing import assert_close

import torchneuron
from torchneuron.compiler import NeuronCompileWarning
from torchneuron.testing import assert_close_to_reference, sum_tolerance
from torchneuron import config
from torchneuron.device import fallback


def mlp_block(x, w, b):
    return torch.nn.functional.gelu(x @ w + b).softmax(-1) * 2 + x.sum()


def assert_mlp_block_close(out, x, w, b):
    """``out`` (compiled) against eager mlp_block on CPU, within first-order bounds: gelu's slope
    is at most 1.13 (plus a few ulp of erf), x.sum() is a reduction of all of x."""
    expected = mlp_block(x, w, b)
    z = (x.double() @ w.double() + b.double())
    gelu_error = 1.13 * linear_tolerance(x, w, b) + 8 * U32 * (z.abs() + 1)
    bound = (2 * softmax_tolerance(torch.nn.functional.gelu(z), gelu_error) + sum_tolerance(x)
             + 4 * U32 * expected.double().abs())
    assert_close_to_reference(out, expected, bound)


def inputs(*shapes, device="neuron", seed=0):
    g = torch.Generator().manual_seed(seed)
    cpu = [torch.randn(*s, generator=g) for s in shapes]
    return cpu, [t.to(device) for t in cpu]


def test_backend_is_registered_by_entry_point():
    assert "neuron" in torch._dynamo.list_backends()
    from torch._dynamo.backends.registry import lookup_backend

    assert lookup_backend("neuron") is torchneuron.compiler.neuron_backend


def test_compiled_result_equals_cpu_and_stays_on_device():
    cpu, dev = inputs((8, 16), (16, 16), (16,))
    compiled = torch.compile(mlp_block, backend="neuron")
    out = compiled(*dev)
    assert on_neuron(out)
    assert_mlp_block_close(out, *cpu)
    metrics = torch.neuron.compile_metrics()
    assert metrics["compiles"] == 1 and metrics["compile_seconds"] > 0


def test_generated_code_is_fused_cpp_charged_on_the_device_clock():
    cpu, dev = inputs((32, 64), (64, 64), (64,))
    compiled = torch.compile(mlp_block, backend="neuron")
    code = generated_code(compiled, *dev)
    assert "cpp_fused" in code and "extern \"C\"" in code  # Inductor C++ kernels
    assert "_neuron_kernel(" in code and "_neuron_charge(_neuron_k0, 0)" in code  # modelled clock
    assert "extern_kernels.mm" in code or "extern_kernels.addmm" in code  # matmul via the device
    before = torchneuron._C._stream_clock(0)
    compiled(*dev)
    assert torchneuron._C._stream_clock(0) > before


def test_matmul_inside_graph_runs_through_the_device_op_path():
    cpu, dev = inputs((8, 16), (16, 16), (16,))
    compiled = torch.compile(mlp_block, backend="neuron")
    compiled(*dev)
    torchneuron.metrics.reset()
    compiled(*dev)
    ops = {c.op for c in torchneuron.metrics.ops()}
    assert any(op.startswith(("aten::mm", "aten::addmm")) for op in ops), ops


def test_fused_kernel_time_shrinks_with_fusion():
    """A chain of pointwise ops compiled is modelled faster than the same ops eagerly:
    the intermediates no longer go through HBM and only one launch is paid."""
    x = torch.randn(256, 1024, device="neuron")

    def chain(t):
        return ((t * 2 + 1).relu() - 3).abs() * 0.5

    chain(x)  # eager warm-up (cost entries cached)
    start = torchneuron._C._stream_clock(0)
    chain(x)
    eager = torchneuron._C._stream_clock(0) - start
    compiled = torch.compile(chain, backend="neuron")
    compiled(x)
    start = torchneuron._C._stream_clock(0)
    compiled(x)
    fused = torchneuron._C._stream_clock(0) - start
    assert 0 < fused < eager / 3


def test_graph_breaks_are_counted():
    def broken(x):
        y = x.sin()
        torch._dynamo.graph_break()
        return y.cos()

    x = torch.randn(4, 4, device="neuron")
    out = torch.compile(broken, backend="neuron")(x)
    assert_close(out.cpu(), x.cpu().sin().cos())
    metrics = torch.neuron.compile_metrics()
    assert metrics["graph_breaks"] == 1
    assert metrics["compiles"] == 2
    assert any("graph_break" in reason for reason in metrics["graph_break_reasons"])
    # the break's call site, and the text report's row of them (its entries are dicts: this crashed)
    assert "test_backend.py" in metrics["graph_break_sites"][0]["site"]
    assert "graph_break_sites" in torchneuron.metrics.report()


def test_new_shapes_recompile_static_with_reasons():
    compiled = torch.compile(lambda t: (t * 3).sum(0), backend="neuron")
    for rows in (4, 6, 8):
        t = torch.randn(rows, 5)
        assert_close_to_reference(compiled(t.to("neuron")), (t * 3).sum(0), sum_tolerance(t * 3, 0))
    compiled(torch.randn(8, 5, device="neuron"))  # seen shape: no new compile
    metrics = torch.neuron.compile_metrics()
    assert metrics["compiles"] == 3
    assert metrics["recompiles"] == 2
    first, second = metrics["recompile_reasons"]
    assert "size mismatch" in first and "expected 4, actual 6" in first
    assert "[6, 5] float32 -> [8, 5] float32" in second


def test_dynamic_true_is_rejected():
    compiled = torch.compile(lambda t: t + 1, backend="neuron", dynamic=True)
    with pytest.raises(Exception, match=r"dynamic=True\) is not supported"):
        compiled(torch.randn(3, device="neuron"))


def test_other_modes_warn_and_compile_with_default():
    compiled = torch.compile(lambda t: t * 2, backend="neuron", mode="max-autotune")
    with pytest.warns(NeuronCompileWarning, match="only mode='default'"):
        out = compiled(torch.ones(3, device="neuron"))
    assert_close(out.cpu(), torch.full((3,), 2.0))


def _float64_island(x):
    return (x.double().exp() * 2).float() + 1


def test_ops_that_would_fall_back_are_partitioned_and_counted():
    x = torch.randn(5, 3)
    compiled = torch.compile(_float64_island, backend="neuron")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", fallback.NeuronCPUFallbackWarning)
        compiled(x.to("neuron"))
        torchneuron.metrics.reset()
        out = compiled(x.to("neuron"))
    assert_close(out.cpu(), _float64_island(x))
    partitioned = torch.neuron.compile_metrics()["partitioned_ops"]
    assert any("float64" in op for op in partitioned), partitioned
    assert torchneuron.metrics.counters()["cpu_fallbacks"] > 0  # run through the device, counted


def test_strict_mode_names_op_and_source_line():
    with config.override(TORCHNEURON_CPU_FALLBACK="0"):
        compiled = torch.compile(_float64_island, backend="neuron")
        with pytest.raises(Exception) as info:
            compiled(torch.randn(5, 3, device="neuron"))
    message = str(info.value)
    assert "float64" in message and "Strict mode" in message
    assert "test_backend.py" in message and "x.double().exp()" in message


def test_compile_failure_raises_by_default(monkeypatch):
    import torchneuron.compiler.backend as backend

    def broken(*args, **kwargs):
        raise RuntimeError("simulated code generation failure")

    monkeypatch.setattr(backend, "_compile", broken)
    compiled = torch.compile(lambda t: t - 1, backend="neuron")
    with pytest.raises(Exception, match="simulated code generation failure"):
        compiled(torch.ones(2, device="neuron"))


def test_compile_failure_runs_eagerly_when_fallback_execution_is_on(monkeypatch):
    import torchneuron.compiler.backend as backend

    def broken(*args, **kwargs):
        raise RuntimeError("simulated code generation failure")

    monkeypatch.setattr(backend, "_compile", broken)
    with config.override(TORCH_NEURONX_DISABLE_FALLBACK_EXECUTION="0"):
        compiled = torch.compile(lambda t: t - 1, backend="neuron")
        with pytest.warns(NeuronCompileWarning, match="running this graph eagerly"):
            out = compiled(torch.ones(2, device="neuron"))
    assert on_neuron(out)
    assert_close(out.cpu(), torch.zeros(2))
    assert torch.neuron.compile_metrics()["eager_fallbacks"] == 1


def test_second_device():
    if torch.neuron.device_count() < 2:
        pytest.skip("needs two neuron devices")
    cpu, dev = inputs((8, 16), (16, 16), (16,), device="neuron:1")
    out = torch.compile(mlp_block, backend="neuron")(*dev)
    assert on_neuron(out, index=1)
    assert_mlp_block_close(out, *cpu)


@pytest.mark.parametrize("context", [torch.no_grad, torch.inference_mode])
def test_no_grad_and_inference_mode(context):
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    x = torch.randn(3, 16)
    expected = model(x)
    first, last = model[0], model[2]
    hidden_error = linear_tolerance(x, first.weight.T, first.bias)  # ReLU's slope is at most 1
    bound = linear_tolerance(model[:2](x), last.weight.T, last.bias, hidden_error)
    model.to("neuron")
    compiled = torch.compile(model, backend="neuron")
    with context():
        out = compiled(x.to("neuron"))
    assert on_neuron(out) and not out.requires_grad
    assert_close_to_reference(out, expected, bound)


def test_autocast_inside_compiled_graph():
    model = torch.nn.Linear(32, 32)
    x = torch.randn(4, 32)
    model_n = torch.nn.Linear(32, 32).to("neuron")
    model_n.load_state_dict(model.state_dict())
    with torch.autocast("cpu", dtype=torch.bfloat16):
        expected = model(x)
    with torch.autocast("neuron", dtype=torch.bfloat16):
        out = torch.compile(model_n, backend="neuron")(x.to("neuron"))
    assert out.dtype == torch.bfloat16
    # bf16 operands accumulated in fp32 (any order) and the bias add, then one bf16 rounding each side
    xb, wb, bb = x.bfloat16(), model.weight.detach().bfloat16(), model.bias.detach().bfloat16()
    bound = linear_tolerance(xb.float(), wb.float().T, bb.float()) * 1.01
    assert_close_to_reference(out, expected, bound, rtol=2.01 * 2 ** -8)


def test_plain_torch_compile_works_on_neuron_tensors():
    cpu, dev = inputs((8, 16), (16, 16), (16,))
    out = torch.compile(mlp_block)(*dev)  # default backend: Inductor
    assert on_neuron(out)
    assert_mlp_block_close(out, *cpu)


def test_plain_torch_compile_with_dynamic_shapes_runs_and_charges_each_size():
    """Inductor's default recompiles a second shape with dynamic sizes: its kernels' element
    counts are then expressions (this crashed with 'Cannot convert symbols to int'); each run
    is charged at its own size."""
    from torchneuron.device import kernel_costs

    def f(t, n):
        return ((t.sin() + n) * 3).cos()

    compiled = torch.compile(f)  # default backend, automatic dynamic shapes
    charged = {}
    for size in (64, 4096, 65536):
        x = torch.randn(size)
        before = torchneuron._C._stream_clock(0)
        out = compiled(x.to("neuron"), size)
        charged[size] = torchneuron._C._stream_clock(0) - before
        assert on_neuron(out)
        assert_close(out.cpu(), torch.compile(f)(x, size))  # CPU Inductor: the same kernels
    sizes = {w.elements for w in kernel_costs.works()}
    assert {4096, 65536} <= sizes  # the dynamic kernel registered at each run's size
    assert charged[65536] > charged[4096] > 0


def test_estimate_covers_compiled_kernels_for_each_target():
    x = torch.randn(256, 1024, device="neuron")
    compiled = torch.compile(lambda t: ((t * 2 + 1).relu() - 3).abs().sum(-1), backend="neuron")
    compiled(x)
    est = torchneuron.estimate(compiled, x)
    for target in ("trn2", "trn3"):
        rows = {o.op: o for o in est.targets[target].ops}
        assert rows["compiled fused kernels"].calls >= 1
        assert rows["compiled fused kernels"].seconds > 0
    assert est.targets["trn3"].seconds != est.targets["trn2"].seconds


def test_backward_of_a_graph_compiled_first_runs_on_the_calling_thread():
    # A thread whose first neuron ops run while compiling (the buffer's constant is
    # made inside AOTAutograd's set_multithreading_enabled(False)) still runs its
    # backward on the calling thread, as after an eager op.
    class Scaled(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(8, 8)
            self.register_buffer("scale", 1.0 / (100 ** (torch.arange(0, 8, 2).float() / 8)),
                                 persistent=False)

        def forward(self, x):
            return (self.lin(x)[:, :4] * self.scale).sum()

    seen = {}

    def work():
        model = torch.compile(Scaled().to("neuron"), backend="neuron")
        x = torch.randn(8, 8).to("neuron").requires_grad_()
        threads = set()
        x.register_hook(lambda g: threads.add(threading.get_ident()))
        for _ in range(2):
            model(x).backward()
        seen.update(threads=threads, caller=threading.get_ident(),
                    multithreading=torch.autograd.is_multithreading_enabled())

    t = threading.Thread(target=work)
    t.start()
    t.join()
    assert seen["threads"] == {seen["caller"]}
    assert not seen["multithreading"]


def _cpp_kernels(code):
    return re.findall(r"cpp_pybinding\((.*?)'''\)", code, re.S)


@pytest.mark.parametrize("fn", [
    lambda x: x * 2 + torch.cat((-x[..., 16:], x[..., :16]), -1),  # rotary embedding's rotate_half
    lambda x: torch.cat((x.sin(), x.cos()), -1) + 1,
    lambda x: torch.nn.functional.pad(x.sin(), (0, 3)) * 2,  # right pad: not a cat on CPU
], ids=["rotate_half", "cat", "pad"])
def test_lowering_choices_match_cpu_inductor(fn):
    # Inductor chooses some lowerings by device type for the C++ backend's sake (cat is a
    # copy kernel on CPU, not a masked pointwise cat): neuron's kernels are that backend's,
    # so a neuron graph gets CPU Inductor's kernels, to the character.
    cpu = torch.randn(4, 8, 32)
    expected = _cpp_kernels(generated_code(torch.compile(fn), cpu))
    got = _cpp_kernels(generated_code(torch.compile(fn, backend="neuron"), cpu.to("neuron")))
    assert got and got == expected
    assert_close(torch.compile(fn, backend="neuron")(cpu.to("neuron")).cpu(), fn(cpu))


def test_fullgraph():
    cpu, dev = inputs((8, 16), (16, 16), (16,))
    out = torch.compile(mlp_block, backend="neuron", fullgraph=True)(*dev)
    assert_mlp_block_close(out, *cpu)

    def broken(x):
        torch._dynamo.graph_break()
        return x + 1

    with pytest.raises(Exception, match="graph_break"):
        torch.compile(broken, backend="neuron", fullgraph=True)(dev[0])


def test_debug_dir_gets_the_graphs(tmp_path):
    with config.override(TORCH_NEURONX_DEBUG_DIR=str(tmp_path)):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", fallback.NeuronCPUFallbackWarning)
            torch.compile(_float64_island, backend="neuron")(torch.randn(5, 3, device="neuron"))
    written = list(tmp_path.iterdir())
    assert len(written) == 1 and written[0].name.endswith("_forward.txt")
    text = written[0].read_text()
    assert "float64" in text and "def forward" in text
