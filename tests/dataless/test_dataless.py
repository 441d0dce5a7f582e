"""Dataless execution: shapes, memory and modelled time without values.

What a user relies on: results have the shapes, strides and device memory of a normal
run; reading values gives a defined placeholder and says where; data-dependent shapes take
a bound or a hint and say where; nothing without values reaches a normal run; errors are
the normal run's; and large tensors cost no host memory."""

from __future__ import annotations

import re
import textwrap

import pytest
import torch

import torchneuron
from torchneuron.device import dataless
from torchneuron.testing import is_on_neuron, run_python

HERE = __file__


@pytest.fixture(autouse=True)
def _fresh_notes():
    dataless.reset()
    yield
    dataless.reset()
    assert not dataless.is_active()


def _line_of(pattern: str) -> int:
    """The line of this file that contains ``pattern`` (for call-site assertions)."""
    with open(HERE) as f:
        for number, line in enumerate(f, 1):
            if pattern in line and "_line_of" not in line:
                return number
    raise AssertionError(pattern)


# ---- results -------------------------------------------------------------------

OPS = {
    "matmul": lambda a, b: a @ b.T,
    "view+transpose": lambda a, b: a.view(8, 2, 8).transpose(0, 2),
    "softmax": lambda a, b: torch.softmax(a, dim=-1),
    "cat": lambda a, b: torch.cat([a, b, a], dim=1),
    "layer_norm": lambda a, b: torch.nn.functional.layer_norm(a, (16,)),
    "index_select": lambda a, b: a.index_select(0, torch.tensor([3, 0, 1]).to(a.device)),
    "sum-dim": lambda a, b: a.sum(dim=0, keepdim=True),
    "to-bf16": lambda a, b: a.to(torch.bfloat16),
    "expand+contiguous": lambda a, b: a[:1].expand(5, 16).contiguous(),
    "in-place": lambda a, b: a.mul_(2).add_(b),
}


@pytest.mark.parametrize("name", OPS)
def test_results_have_the_normal_shapes_strides_and_memory_but_no_values(name):
    fn = OPS[name]
    a, b = torch.randn(8, 16), torch.randn(8, 16)
    expected = fn(a.clone(), b)
    with torchneuron.dataless():
        x, y = a.to("neuron"), b.to("neuron")
        before = torch.neuron.memory_allocated()
        out = fn(x, y)
        allocated = torch.neuron.memory_allocated() - before
    assert (out.shape, out.stride(), out.dtype) == (expected.shape, expected.stride(), expected.dtype)
    assert is_on_neuron(out) and not dataless.holds_values(out)
    x, y = a.to("neuron"), b.to("neuron")  # the normal run allocates the same
    before = torch.neuron.memory_allocated()
    normal = fn(x, y)
    assert torch.neuron.memory_allocated() - before == allocated
    assert dataless.holds_values(normal)


def test_views_alias_the_device_storage_as_in_a_normal_run():
    with torchneuron.dataless():
        x = torch.empty(4, 6, device="neuron")
        v = x.t()[1:]
        assert v.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()
        assert v._base is x and v.storage_offset() == 1


# ---- reads of values never computed ---------------------------------------------

def test_item_returns_a_placeholder_and_names_its_line():
    with torchneuron.dataless():
        loss = (torch.randn(4, 4, device="neuron") ** 2).mean()
        value = loss.item()  # the read
    assert value == 0.0
    (read,) = dataless.reads()
    assert read.what == "item" and not read.known and read.placeholder == 0.0
    assert read.site == f"{HERE}:{_line_of('loss.item()  # the read')} in test_item_returns_a_placeholder_and_names_its_line"


def test_values_known_without_data_are_what_a_healthy_run_reads():
    with torchneuron.dataless():
        loss = torch.randn(8, device="neuron").exp().sum()
        assert torch.isfinite(loss).item() is True  # dataless values are taken as finite
        assert torch.isnan(loss).any().item() is False
        assert bool(torch.logical_or(loss.isnan(), loss.isinf())) is False  # clip_grad_norm_'s check
        assert torch.full((3,), 2.5, device="neuron").max().item() == 2.5
        assert torch.zeros(2, 2, device="neuron").tolist() == [[0.0, 0.0], [0.0, 0.0]]
    assert all(r.known for r in dataless.reads() if r.what == "item")


def test_grad_scaler_steps_the_optimizer_as_when_no_inf_was_found():
    with torchneuron.dataless():
        model = torch.nn.Linear(8, 8).to("neuron")
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        scaler = torch.amp.GradScaler("neuron")
        with torch.autocast("neuron"):
            loss = model(torch.randn(4, 8, device="neuron")).float().sum()
        scaler.scale(loss).backward()
        stepped = []
        opt.register_step_post_hook(lambda *args: stepped.append(True))
        scaler.step(opt)
        scaler.update()
    assert stepped == [True]
    assert any(r.what == "item" and r.known for r in dataless.reads())  # found_inf, known to be 0


def test_copies_to_the_host_and_printing_give_placeholders():
    with torchneuron.dataless():
        x = torch.randn(3, device="neuron")
        assert torch.equal(x.cpu(), torch.zeros(3))
        assert "tensor([0., 0., 0.], device='neuron:0')" in repr(x)
    assert {r.what for r in dataless.reads()} == {"copy to the host"}


def test_values_that_exist_are_read_for_real():
    step = torch.tensor(7.0).to("neuron")  # made outside: it holds its value
    with torchneuron.dataless():
        assert step.item() == 7.0
        assert torch.equal(step.cpu(), torch.tensor(7.0))
    assert dataless.reads() == []


# ---- data-dependent shapes ------------------------------------------------------

def test_data_dependent_shapes_take_the_bound_or_the_hint_and_are_listed():
    with torchneuron.dataless():
        x = torch.randn(10, 20, device="neuron")
        assert torch.nonzero(x).shape == (200, 2)
        assert x[x > 0].shape == (200,)  # boolean-mask indexing
        with dataless.shape_hints(nonzero=0.25):
            assert x[x > 0].shape == (50,)
        assert torch.unique(x).shape == (200,)
        assert torch.masked_select(x, x > 0).shape == (200,)
        assert torch.bincount(torch.zeros(6, dtype=torch.long, device="neuron"), minlength=4).shape == (4,)
        x[x > 0] = 0.0  # in place: x keeps its shape
        assert x.shape == (10, 20)
    shapes = {(s.op, s.chosen, s.hinted) for s in dataless.data_dependent_shapes()}
    assert {("nonzero", 200, False), ("nonzero", 50, True), ("unique", 200, False),
            ("masked_select", 200, False), ("bincount", 4, False)} <= shapes
    assert all(s.site.startswith(HERE) for s in dataless.data_dependent_shapes())


def test_a_bad_hint_is_refused():
    with pytest.raises(ValueError, match=r"shape_hints\(nonzero=1.5\): a fraction between 0 and 1"):
        with dataless.shape_hints(nonzero=1.5):
            pass


# ---- nothing without values reaches a normal run --------------------------------

def test_tensors_without_values_refuse_normal_ops_copies_and_reads():
    with torchneuron.dataless():
        x = torch.randn(4, device="neuron")
    message = re.escape("holds no values: it was made or last written under dataless execution")
    for use in (lambda: x + 1, lambda: x.cpu(), lambda: x[0].item(), lambda: x.sum(), lambda: print(x)):
        with pytest.raises(RuntimeError, match=message):
            use()


def test_a_dataless_write_into_a_tensor_with_values_takes_them_away():
    weight = torch.ones(4).to("neuron")
    with torchneuron.dataless():
        weight.mul_(3)
    assert not dataless.holds_values(weight)
    with pytest.raises(RuntimeError, match="holds no values"):
        weight.cpu()
    fresh = torch.ones(4).to("neuron")  # memory reused after dataless holds values again
    assert dataless.holds_values(fresh) and torch.equal(fresh.cpu(), torch.ones(4))


def test_compiled_code_refuses_inputs_without_values_outside_dataless_execution():
    fn = torch.compile(lambda t: (t * 2).sin(), backend="neuron")
    good = torch.randn(16).to("neuron")
    expected = (good.cpu() * 2).sin()
    with torchneuron.dataless():
        bad = torch.randn(16, device="neuron")
        out = fn(bad)  # compiled (or cached) code runs dataless: no kernel touches memory
        assert out.shape == (16,) and not dataless.holds_values(out)
    with pytest.raises(RuntimeError, match="holds no values"):
        fn(bad)
    torch.testing.assert_close(fn(good).cpu(), expected)  # the same compiled code, with values


# ---- errors and memory ----------------------------------------------------------

def test_errors_are_the_normal_runs():
    a, b = torch.randn(3, 4).to("neuron"), torch.randn(5, 6).to("neuron")
    with pytest.raises(RuntimeError) as normal:
        a @ b
    with torchneuron.dataless():
        c, d = torch.randn(3, 4, device="neuron"), torch.randn(5, 6, device="neuron")
        with pytest.raises(RuntimeError) as dataless_error:
            c @ d
        with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
            c + torch.randn(3, 4)
    # The meta kernel words it its own way, naming both shapes.
    assert "[3, 4]" in str(dataless_error.value) and "[5, 6]" in str(dataless_error.value)
    assert type(normal.value) is type(dataless_error.value)


def _rss_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def test_large_tensors_cost_no_host_memory():
    rss = _rss_bytes()
    with torchneuron.dataless():
        weights = [torch.empty(1024, 1024, 1024, dtype=torch.bfloat16, device="neuron") for _ in range(4)]
        activations = [w @ w for w in weights[:2]]  # 2 x 2 GiB more
        assert torch.neuron.memory_allocated() >= 12 * 2**30
        grown = _rss_bytes() - rss
    del weights, activations
    torch.neuron.empty_cache()
    assert grown < 64 * 2**20, f"12 GiB of dataless tensors took {grown / 2**20:.0f} MiB of host memory"


def test_out_of_memory_is_raised_where_the_device_would_run_out():
    capacity = torch.neuron.get_device_properties(0).total_memory
    with torchneuron.dataless():
        held = [torch.empty(capacity // 4, dtype=torch.uint8, device="neuron") for _ in range(3)]
        with pytest.raises(torch.OutOfMemoryError, match="Neuron out of memory. Tried to allocate"):
            held.append(torch.empty(capacity // 2, dtype=torch.uint8, device="neuron"))
    del held
    torch.neuron.empty_cache()


def test_ops_without_a_meta_kernel_still_run():
    with torchneuron.dataless():
        params = [torch.zeros(4, device="neuron")] * 1
        grads, m, v = [torch.zeros(4, device="neuron")], [torch.zeros(4, device="neuron")], [torch.zeros(4, device="neuron")]
        steps = [torch.zeros((), device="neuron")]
        # fused Adam with a tensor learning rate has no Meta kernel: in place, shapes kept
        torch._fused_adam_(params, grads, m, v, [], steps, lr=torch.tensor(0.1, device="neuron"), beta1=0.9,
                           beta2=0.99, weight_decay=0.0, eps=1e-8, amsgrad=False, maximize=False)
        assert params[0].shape == (4,) and not dataless.holds_values(params[0])


def test_nested_tensors_are_refused_with_a_clear_error():
    nested = torch.nested.nested_tensor([torch.ones(2), torch.ones(3)]).to("neuron")
    with torchneuron.dataless():
        with pytest.raises(NotImplementedError, match="not supported under dataless execution"):
            nested * 2


def test_the_setting_runs_a_whole_script_dataless():
    script = textwrap.dedent("""
        import torch
        from torchneuron.device import dataless
        x = torch.randn(1024, 1024, device="neuron")
        print(dataless.is_active(), (x @ x).sum().item(), dataless.reads()[0].what)
    """)
    out = run_python(script, env={"TORCHNEURON_DATALESS": "1"})
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "True 0.0 item"


def test_the_metrics_report_lists_reads_and_data_dependent_shapes():
    with torchneuron.dataless():
        x = torch.randn(10, device="neuron")
        x.sum().item()
        torch.nonzero(x)
    text = torchneuron.metrics.report()
    assert "dataless: values read that were never computed" in text and HERE in text
    assert "dataless: shapes that depend on values" in text and "nonzero" in text
