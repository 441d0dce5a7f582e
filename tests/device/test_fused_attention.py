"""Fused attention on neuron: F.scaled_dot_product_attention takes PyTorch's PrivateUse1
fused path (OVERRIDEABLE), runs as one op with CPU's values (CPU is the oracle, bit for
bit, dropout included), is charged as fused attention, and falls back to math where a
fused kernel cannot apply, as CUDA does."""

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import torchneuron
from torchneuron.hardware.cost import cost_target, op_cost
from torchneuron.profiler import metrics
from torchneuron.testing import is_on_neuron

FUSED = "aten::_scaled_dot_product_fused_attention_overrideable"
FUSED_BWD = FUSED + "_backward"


def _inputs(q_shape, kv_shape, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(s, generator=g).to(dtype) for s in (q_shape, kv_shape, kv_shape)]


def _run(device, q, k, v, seed=7, mask=None, **kw):
    """Forward and backward of SDPA on ``device``; the RNG seeded alike on both devices."""
    leaves = [t.detach().to(device).requires_grad_() for t in (q, k, v)]
    (torch.neuron if device == "neuron" else torch).manual_seed(seed)
    out = F.scaled_dot_product_attention(*leaves, attn_mask=None if mask is None else mask.to(device), **kw)
    out.backward(torch.linspace(-1, 1, out.numel()).reshape(out.shape).to(out.dtype).to(device))
    return out, [t.grad for t in leaves]


def _op_names():
    return {o.op for o in metrics.ops()}


CASES = {
    "plain": dict(q=(2, 4, 16, 8), kv=(2, 4, 16, 8)),
    "causal": dict(q=(2, 4, 16, 8), kv=(2, 4, 16, 8), is_causal=True),
    "causal-rectangular": dict(q=(1, 2, 5, 8), kv=(1, 2, 11, 8), is_causal=True),
    "bool-mask": dict(q=(2, 4, 16, 8), kv=(2, 4, 16, 8), mask=lambda: torch.rand(16, 16, generator=torch.Generator().manual_seed(1)) > 0.3),
    "float-mask": dict(q=(2, 4, 16, 8), kv=(2, 4, 16, 8), mask=lambda: torch.randn(2, 1, 16, 16, generator=torch.Generator().manual_seed(2))),
    "gqa": dict(q=(2, 8, 16, 8), kv=(2, 2, 16, 8), enable_gqa=True),
    "scale": dict(q=(2, 4, 16, 8), kv=(2, 4, 12, 8), scale=0.3),
    "bfloat16-causal": dict(q=(2, 4, 16, 8), kv=(2, 4, 16, 8), dtype=torch.bfloat16, is_causal=True),
    "dropout": dict(q=(2, 4, 16, 8), kv=(2, 4, 16, 8), dropout_p=0.3),
    "dropout-causal-gqa": dict(q=(2, 8, 16, 8), kv=(2, 2, 16, 8), dropout_p=0.2, is_causal=True, enable_gqa=True),
    "dropout-bfloat16-mask": dict(q=(2, 4, 16, 8), kv=(2, 4, 16, 8), dtype=torch.bfloat16, dropout_p=0.2,
                                  mask=lambda: torch.rand(16, 16, generator=torch.Generator().manual_seed(3)) > 0.2),
}


@pytest.mark.parametrize("name", list(CASES))
def test_fused_attention_equals_cpu_forward_and_backward(name):
    kw = dict(CASES[name])
    q, k, v = _inputs(kw.pop("q"), kw.pop("kv"), kw.pop("dtype", torch.float32))
    mask = kw.pop("mask", None)
    mask = mask() if mask else None
    cpu_out, cpu_grads = _run("cpu", q, k, v, mask=mask, **kw)
    metrics.reset()
    out, grads = _run("neuron", q, k, v, mask=mask, **kw)
    assert is_on_neuron(out) and all(is_on_neuron(g) for g in grads)
    assert {FUSED, FUSED_BWD} <= _op_names()  # our fused path ran, not the math composite
    assert "aten::_safe_softmax" not in _op_names() and "aten::bmm" not in _op_names()
    assert out.stride() == cpu_out.stride()
    torch.testing.assert_close(out.cpu(), cpu_out, rtol=0, atol=0)
    for g, c in zip(grads, cpu_grads):
        assert g.stride() == c.stride()
        torch.testing.assert_close(g.cpu(), c, rtol=0, atol=0)


def test_query_layout_is_kept_as_fake_tensor_predicts():
    # [batch, seq, heads, dim] projections transposed to [batch, heads, seq, dim], as HF models do
    q, k, v = (t.transpose(1, 2) for t in _inputs((2, 16, 4, 8), (2, 16, 4, 8)))
    out = F.scaled_dot_product_attention(q.to("neuron"), k.to("neuron"), v.to("neuron"))
    ref = F.scaled_dot_product_attention(q, k, v)
    assert out.stride() == ref.stride() and out.stride() != out.contiguous().stride()
    torch.testing.assert_close(out.cpu(), ref, rtol=0, atol=0)


def test_dropout_draws_from_the_neuron_generator_as_cpu_draws_from_cpus():
    q, k, v = _inputs((1, 2, 8, 4), (1, 2, 8, 4))
    torch.neuron.manual_seed(3)
    a = F.scaled_dot_product_attention(q.to("neuron"), k.to("neuron"), v.to("neuron"), dropout_p=0.5)
    after_neuron = torch.rand(4, device="neuron").cpu()
    torch.manual_seed(3)
    b = F.scaled_dot_product_attention(q, k, v, dropout_p=0.5)
    after_cpu = torch.rand(4)
    torch.testing.assert_close(a.cpu(), b, rtol=0, atol=0)
    torch.testing.assert_close(after_neuron, after_cpu, rtol=0, atol=0)  # the generators advanced alike
    torch.manual_seed(3)  # CPU's generator does not feed neuron's dropout
    torch.neuron.manual_seed(4)
    c = F.scaled_dot_product_attention(q.to("neuron"), k.to("neuron"), v.to("neuron"), dropout_p=0.5)
    assert not torch.equal(c.cpu(), b)


def test_dropout_backward_replays_the_forwards_noise_after_other_draws():
    q, k, v = _inputs((1, 2, 8, 4), (1, 2, 8, 4))
    cpu = [t.clone().requires_grad_() for t in (q, k, v)]
    dev = [t.to("neuron").requires_grad_() for t in (q, k, v)]
    torch.manual_seed(5)
    torch.neuron.manual_seed(5)
    cpu_out = F.scaled_dot_product_attention(*cpu, dropout_p=0.4)
    out = F.scaled_dot_product_attention(*dev, dropout_p=0.4)
    torch.rand(100), torch.rand(100, device="neuron")  # the generators move on before backward
    cpu_out.sum().backward()
    out.sum().backward()
    for g, c in zip(dev, cpu):
        torch.testing.assert_close(g.grad.cpu(), c.grad, rtol=0, atol=0)


def test_backward_refuses_a_philox_seed_that_is_not_the_forwards():
    q, k, v = (t.to("neuron") for t in _inputs((1, 2, 8, 4), (1, 2, 8, 4)))
    out, lse, _, _, mq, mk, seed, offset, _ = torch.ops.aten._scaled_dot_product_fused_attention_overrideable(
        q, k, v, None, 0.5)
    with pytest.raises(RuntimeError, match="philox_seed must be the one the forward returned"):
        torch.ops.aten._scaled_dot_product_fused_attention_overrideable_backward(
            torch.ones_like(out), q, k, v, None, [True, True, True, False], out, lse, None, None,
            mq, mk, 0.5, False, torch.tensor(0), offset)


@pytest.mark.parametrize("why, call", [
    ("3-D inputs", lambda q, k, v: F.scaled_dot_product_attention(q[0], k[0], v[0])),
    ("mask requires grad", lambda q, k, v: F.scaled_dot_product_attention(
        q, k, v, attn_mask=torch.zeros(8, 8, device="neuron", requires_grad=True))),
    ("unequal head sizes", lambda q, k, v: F.scaled_dot_product_attention(q, k, v[..., :2])),
])
def test_math_where_a_fused_kernel_cannot_apply(why, call):
    q, k, v = (t.to("neuron") for t in _inputs((1, 2, 8, 4), (1, 2, 8, 4)))
    metrics.reset()
    call(q, k, v)
    assert FUSED not in _op_names(), why
    assert "aten::_safe_softmax" in _op_names() or "aten::_softmax" in _op_names(), why


def test_the_users_sdpa_switches_are_obeyed():
    q, k, v = (t.to("neuron") for t in _inputs((1, 2, 8, 4), (1, 2, 8, 4)))
    assert torch._fused_sdp_choice(q, k, v) == SDPBackend.OVERRIDEABLE.value
    with sdpa_kernel(SDPBackend.MATH):
        assert torch._fused_sdp_choice(q, k, v) == SDPBackend.MATH.value
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):  # CUDA code asking for a fused kernel gets neuron's
        assert torch._fused_sdp_choice(q, k, v) == SDPBackend.OVERRIDEABLE.value
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        with pytest.raises(RuntimeError, match="No viable backend|No available kernel"):
            F.scaled_dot_product_attention(q[0], k[0], v[0])  # 3-D: no fused kernel, and math is off


def test_direct_call_with_unsupported_inputs_says_what_is_needed():
    q, k, v = (t.to("neuron") for t in _inputs((1, 2, 8, 4), (1, 2, 8, 4)))
    with pytest.raises(RuntimeError, match="needs dense 4-D query, key and value"):
        torch.ops.aten._scaled_dot_product_fused_attention_overrideable(q, k, v[..., :2])
    with pytest.raises(NotImplementedError, match="return_debug_mask"):
        torch.ops.aten._scaled_dot_product_fused_attention_overrideable(q, k, v, return_debug_mask=True)


def test_charged_as_fused_attention_no_scores_in_hbm():
    b, h, l, e = 1, 4, 512, 64
    q, k, v = (t.to(torch.bfloat16).to("neuron") for t in _inputs((b, h, l, e), (b, h, l, e)))
    metrics.reset()
    F.scaled_dot_product_attention(q, k, v, is_causal=True)
    fused = {o.op: o.modeled_seconds for o in metrics.ops()}[FUSED]
    expected = op_cost(FUSED, [q.shape, k.shape, v.shape], ["bfloat16"] * 3, cost_target(), is_causal=True)
    assert fused == pytest.approx(expected.seconds, abs=1e-9)  # the record keeps whole ns
    assert expected.bytes_read == 3 * b * h * l * e * 2  # Q, K, V: the L x L scores never reach HBM
    metrics.reset()
    with sdpa_kernel(SDPBackend.MATH):
        F.scaled_dot_product_attention(q, k, v, is_causal=True)
    math_seconds = sum(o.modeled_seconds for o in metrics.ops())
    assert math_seconds > fused  # the math composite writes and reads the scores


def test_compiled_attention_equals_eager_and_runs_the_fused_op():
    q, k, v = _inputs((2, 4, 16, 8), (2, 2, 16, 8))

    def fn(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True).relu().sum()

    torch._dynamo.reset()
    leaves = [t.to("neuron").requires_grad_() for t in (q, k, v)]
    metrics.reset()
    torch.compile(fn, backend="neuron")(*leaves).backward()
    assert {FUSED, FUSED_BWD} <= _op_names()
    cpu = [t.clone().requires_grad_() for t in (q, k, v)]
    fn(*cpu).backward()
    for g, c in zip(leaves, cpu):
        torch.testing.assert_close(g.grad.cpu(), c.grad, rtol=1e-6, atol=1e-6 * c.grad.abs().max().item())


def test_hf_llama_sdpa_attention_takes_the_fused_path():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                         attn_implementation="sdpa")
    model = LlamaForCausalLM(config)
    ids = torch.randint(0, 128, (2, 16))
    ref = model(input_ids=ids, labels=ids).loss
    model.to("neuron")
    metrics.reset()
    loss = model(input_ids=ids.to("neuron"), labels=ids.to("neuron")).loss
    loss.backward()
    calls = {o.op: o.calls for o in metrics.ops()}
    assert calls[FUSED] == 2 and calls[FUSED_BWD] == 2  # one per layer, each way
    torch.testing.assert_close(loss.cpu(), ref, rtol=0, atol=0)


def test_dataless_fused_attention_agrees_with_the_normal_run():
    q, k, v = _inputs((2, 4, 32, 8), (2, 4, 32, 8))

    def step():
        leaves = [t.to("neuron").requires_grad_() for t in (q, k, v)]
        out = F.scaled_dot_product_attention(*leaves, dropout_p=0.1)
        out.sum().backward()
        return [(o.op, o.calls, o.modeled_seconds) for o in metrics.ops()], torch.neuron.max_memory_allocated()

    metrics.reset()
    torch.neuron.reset_peak_memory_stats()
    normal = step()
    metrics.reset()
    torch.neuron.reset_peak_memory_stats()
    with torchneuron.dataless():
        dataless = step()
    assert sorted(normal[0]) == sorted(dataless[0]) and normal[1] == dataless[1]
    assert FUSED in {op for op, *_ in normal[0]}
