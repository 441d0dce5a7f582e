"""Buffers of compiled code: allocated through the neuron fast path, accounted as eager's."""

import gc
import re

import pytest
import torch
from compile_support import _fresh_compile_state, generated_code, on_neuron  # noqa: F401
from compile_support import U32, linear_tolerance, softmax_tolerance
from torch.testing import assert_close

import torchneuron
from torchneuron.testing import assert_close_to_reference, matmul_tolerance, sum_tolerance

MiB = 2**20
# What one allocation changes in the caching allocator's statistics.
ACCOUNTED = ("allocated_bytes.all.current", "requested_bytes.all.current", "active_bytes.all.current",
             "allocation.all.current", "allocation.all.allocated", "allocated_bytes.small_pool.current",
             "allocated_bytes.large_pool.current")


def block(x, w):
    h = (x @ w).relu() * 2 + 1  # the matmul writes into a buffer the wrapper allocates
    return h.softmax(-1) + x.sum()


def assert_block_close(out, x, w):
    """Compiled ``block`` against eager on CPU: first-order bounds (compile_support)."""
    expected = block(x, w)
    h = (x.double() @ w.double()).relu() * 2 + 1
    h_error = 2 * linear_tolerance(x, w) + 4 * U32 * h.abs()
    bound = softmax_tolerance(h, h_error) + sum_tolerance(x) + 4 * U32 * expected.double().abs()
    assert_close_to_reference(out, expected, bound)


def inputs(device="neuron"):
    g = torch.Generator().manual_seed(0)
    cpu = [torch.randn(32, 64, generator=g), torch.randn(64, 64, generator=g)]
    return cpu, [t.to(device) for t in cpu]


def stats(dev=0):
    s = torch.neuron.memory_stats(dev)
    return {k: s[k] for k in ACCOUNTED}


def delta(after, before):
    return {k: after[k] - before[k] for k in ACCOUNTED}


@pytest.mark.parametrize("dev", [0, 1])
def test_generated_code_allocates_with_the_neuron_fast_path(dev):
    if dev >= torch.neuron.device_count():
        pytest.skip("needs two neuron devices")
    cpu, args = inputs(f"neuron:{dev}")
    code = generated_code(torch.compile(block, backend="neuron"), *args)
    assert "from torchneuron.device._core import empty_strided_neuron as empty_strided_neuron" in code
    # As CPU's empty_strided_cpu(size, stride, dtype), plus the buffer's device index.
    allocations = re.findall(r"= empty_strided_neuron\((\(.*?\)), (\(.*?\)), (torch\.\w+), (\d+)\)", code)
    assert allocations and {a[3] for a in allocations} == {str(dev)}
    assert ("(32, 64)", "(64, 1)", "torch.float32", str(dev)) in allocations
    assert not re.search(r"\bempty_strided\(", code)  # no generic empty_strided(..., device='neuron')
    out = torch.compile(block, backend="neuron")(*args)
    assert on_neuron(out, dev)
    assert_block_close(out, *cpu)


@pytest.mark.parametrize("dev", [0, 1])
@pytest.mark.parametrize("shape, stride, dtype", [((32, 64), (64, 1), torch.float32),
                                                  ((4, 64, 1), (64, 1, 256), torch.bfloat16),
                                                  ((3 * MiB,), (1,), torch.int64),  # large pool
                                                  ((0, 5), (5, 1), torch.float32)])
def test_fast_path_allocates_exactly_as_torch_empty_strided(dev, shape, stride, dtype):
    if dev >= torch.neuron.device_count():
        pytest.skip("needs two neuron devices")
    gc.collect()
    s0 = stats(dev)
    eager = torch.empty_strided(shape, stride, dtype=dtype, device=f"neuron:{dev}")
    s1 = stats(dev)
    fast = torchneuron._C._empty_strided_neuron(shape, stride, dtype, dev)
    s2 = stats(dev)
    assert fast.device == eager.device == torch.device("neuron", dev)
    assert (fast.dtype, fast.shape, fast.stride()) == (eager.dtype, eager.shape, eager.stride())
    assert fast.untyped_storage().nbytes() == eager.untyped_storage().nbytes()
    assert on_neuron(fast, dev) and not fast.requires_grad
    assert delta(s2, s1) == delta(s1, s0)
    del eager, fast
    assert stats(dev)["allocated_bytes.all.current"] == s0["allocated_bytes.all.current"]
    assert stats(dev)["allocation.all.current"] == s0["allocation.all.current"]


def test_fast_path_defaults_to_the_current_device_and_checks_its_arguments():
    with torch.neuron.device(torch.neuron.device_count() - 1):
        t = torchneuron._C._empty_strided_neuron((2, 3), (3, 1), torch.float16)
        assert t.device == torch.device("neuron", torch.neuron.device_count() - 1)
        assert on_neuron(t, torch.neuron.device_count() - 1)
    with pytest.raises(RuntimeError, match="Invalid device index neuron:"):
        torchneuron._C._empty_strided_neuron((2,), (1,), torch.float32, torch.neuron.device_count())
    with pytest.raises(RuntimeError, match="negative dimension"):
        torchneuron._C._empty_strided_neuron((-1,), (1,), torch.float32, 0)
    with pytest.raises(RuntimeError, match="mismatch in length of strides and shape"):
        torchneuron._C._empty_strided_neuron((2, 2), (1,), torch.float32, 0)
    with pytest.raises(TypeError):
        torchneuron._C._empty_strided_neuron((2,), (1,), "float32", 0)


def test_compiled_call_allocates_and_frees_as_eager():
    cpu, args = inputs()
    compiled = torch.compile(block, backend="neuron")
    code = generated_code(compiled, *args)  # compiles and runs once
    gc.collect()
    base = stats()
    torch.neuron.reset_peak_memory_stats()
    out = compiled(*args)
    after = stats()
    peak = torch.neuron.max_memory_allocated()
    # Every buffer the wrapper allocates is counted (more if extern kernels allocate too).
    assert delta(after, base)["allocation.all.allocated"] >= code.count("= empty_strided_neuron(")
    assert peak > after["allocated_bytes.all.current"]  # intermediates were counted, then freed
    compiled_held = delta(after, base)
    del out
    assert stats()["allocated_bytes.all.current"] == base["allocated_bytes.all.current"]
    assert stats()["allocation.all.current"] == base["allocation.all.current"]

    eager_out = block(*args)
    eager_held = delta(stats(), base)
    # What the call leaves allocated (its result) is what eager leaves.
    for key in ("allocated_bytes.all.current", "requested_bytes.all.current", "allocation.all.current"):
        assert compiled_held[key] == eager_held[key], key
    del eager_out
    assert stats()["allocated_bytes.all.current"] == base["allocated_bytes.all.current"]


def test_control_flow_subgraphs_allocate_and_charge_like_the_graph():
    def branches(p, x):
        return torch.cond(p, lambda t: (t.sin() @ t).cos(), lambda t: (t * 2) @ t, (x,))

    x = torch.randn(8, 8)
    compiled = torch.compile(branches, backend="neuron")
    for p in (True, False):
        code = generated_code(compiled, torch.tensor(p).to("neuron"), x.to("neuron"))
        # an 8-term matmul of (sin x or 2x) and x, then cos (slope <= 1); a few ulp for sin/cos
        lhs = x.sin() if p else x * 2
        bound = matmul_tolerance(lhs, x) + 8 * U32 * (lhs.double().abs() @ x.double().abs() + 1)
        assert_close_to_reference(compiled(torch.tensor(p).to("neuron"), x.to("neuron")),
                                  branches(torch.tensor(p), x), bound)
    assert "def true_graph_0" in code and "def false_graph_0" in code
    assert "empty_strided_neuron(" in code and not re.search(r"\bempty_strided\(", code)
    # Each fused kernel of each subgraph has a slot of its own in the one module.
    slots = re.findall(r"^(_neuron_k\d+) = _neuron_kernel\(", code, re.M)
    assert len(slots) >= 3 and len(set(slots)) == len(slots)
    assert set(re.findall(r"_neuron_charge\((_neuron_k\d+), 0\)", code)) == set(slots)


def test_compiled_allocation_past_capacity_raises_out_of_memory_as_eager():
    a_c, b_c = torch.randn(2048, 1), torch.randn(1, 2048)
    a, b = a_c.to("neuron"), b_c.to("neuron")
    compiled = torch.compile(lambda x, y: (x @ y).relu(), backend="neuron")  # a 16 MiB buffer
    assert "= empty_strided_neuron((2048, 2048)" in generated_code(compiled, a, b)
    gc.collect()
    torch.neuron.empty_cache()
    before = torch.neuron.memory_allocated()
    fraction = torch.neuron.get_per_process_memory_fraction(0)
    total = torch.neuron.get_device_properties(0).total_memory
    torch.neuron.set_per_process_memory_fraction((torch.neuron.memory_reserved() + 4 * MiB) / total, 0)
    try:
        with pytest.raises(torch.OutOfMemoryError) as error:
            compiled(a, b)
        assert "neuron:0" in str(error.value) and "16.00 MiB" in str(error.value)
        assert torch.neuron.memory_allocated() == before
    finally:
        torch.neuron.set_per_process_memory_fraction(fraction, 0)
    out = compiled(a, b)
    assert_close(out.cpu(), (a_c @ b_c).relu())
