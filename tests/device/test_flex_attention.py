"""FlexAttention on neuron, forward and backward, eager and compiled (backend="neuron" and plain
torch.compile): one fused op each way (torchneuron/device/flex_attention.py,
compiler/flex_attention_lowering.py) with CPU's values.

Oracles: CPU's own FlexAttention forward (PyTorch's dense implementation, bit for bit); for
gradients, CPU autograd through the same dense implementation (bit for bit) and CPU SDPA with
the equivalent mask (a different algorithm: tolerances scale with the operands)."""

import json
import sys

import pytest
import torch
import torch.nn.functional as F
from torch._inductor import config as inductor_config
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

from torchneuron.hardware.cost import cost_target, op_cost
from torchneuron.profiler import metrics
from torchneuron.testing import is_on_neuron, run_python

FLEX = "torchneuron::flex_attention"
FLEX_BWD = FLEX + "_backward"
B, H, L, E = 2, 4, 128, 16


def causal(b, h, q, k):
    return q >= k


def _qkv(kv_heads=H, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, L, E, generator=g)
    k, v = (torch.randn(B, kv_heads, L, E, generator=g) for _ in range(2))
    return [t.to(dtype) for t in (q, k, v)]


def _cpu_dense_with_grads(q, k, v, score_mod, block_mask, grad, **kw):
    """CPU autograd through PyTorch's dense FlexAttention (the public API refuses CPU backward)."""
    hop = sys.modules["torch._higher_order_ops.flex_attention"].flex_attention
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    scale = kw.get("scale", 1.0 / E ** 0.5)
    out = hop(*leaves, score_mod or (lambda s, b, h, qi, ki: s), block_mask.as_tuple(), scale,
              {"OUTPUT_LOGSUMEXP": True, "OUTPUT_MAX": False})[0]
    out.backward(grad)
    return out.detach(), [t.grad for t in leaves]


def _names():
    return {o.op: o for o in metrics.ops()}


def test_eager_forward_equals_cpu_flex_attention():
    q, k, v = _qkv()
    slopes = {"cpu": torch.linspace(-1, 1, H)}
    slopes["neuron"] = slopes["cpu"].to("neuron")  # a captured tensor lives with the inputs, as on CUDA

    def relative(device):
        def mod(score, b, h, qi, ki):
            return score + slopes[device][h] * (qi - ki) / L
        return mod

    cpu_mask = create_block_mask(causal, None, None, L, L, device="cpu")
    ref = flex_attention(q, k, v, score_mod=relative("cpu"), block_mask=cpu_mask)
    mask = create_block_mask(causal, None, None, L, L, device="neuron")
    metrics.reset()
    out = flex_attention(q.to("neuron"), k.to("neuron"), v.to("neuron"), score_mod=relative("neuron"),
                         block_mask=mask)
    assert is_on_neuron(out)
    assert _names()[FLEX].calls == 1 and "aten::bmm" not in _names()  # one fused op
    torch.testing.assert_close(out.cpu(), ref, rtol=0, atol=0)


@pytest.mark.parametrize("kv_heads", [H, 2], ids=["mha", "gqa"])
def test_eager_backward_equals_cpu_dense_and_sdpa(kv_heads):
    q, k, v = _qkv(kv_heads)
    grad = torch.randn(B, H, L, E, generator=torch.Generator().manual_seed(5))
    cpu_out, cpu_grads = _cpu_dense_with_grads(q, k, v, None, create_block_mask(causal, None, None, L, L, device="cpu"),
                                               grad)
    leaves = [t.to("neuron").requires_grad_() for t in (q, k, v)]
    metrics.reset()
    out = flex_attention(*leaves, block_mask=create_block_mask(causal, None, None, L, L, device="neuron"),
                         enable_gqa=kv_heads != H)
    out.backward(grad.to("neuron"))
    assert _names()[FLEX].calls == 1 and _names()[FLEX_BWD].calls == 1
    torch.testing.assert_close(out.detach().cpu(), cpu_out, rtol=0, atol=0)
    for mine, ref in zip(leaves, cpu_grads):
        assert is_on_neuron(mine.grad)
        torch.testing.assert_close(mine.grad.cpu(), ref, rtol=0, atol=0)
    # and the attention it computes is causal SDPA's (another algorithm: a tolerance)
    sdpa = [t.clone().requires_grad_() for t in (q, k, v)]
    ref = F.scaled_dot_product_attention(*sdpa, is_causal=True, enable_gqa=kv_heads != H)
    ref.backward(grad)
    torch.testing.assert_close(out.detach().cpu(), ref.detach(), rtol=1e-4, atol=1e-5)
    for mine, theirs in zip(leaves, sdpa):
        tol = 1e-5 * theirs.grad.abs().max().item()
        torch.testing.assert_close(mine.grad.cpu(), theirs.grad, rtol=1e-4, atol=tol)


def test_a_captured_learnable_bias_gets_its_gradient():
    q, k, v = _qkv()
    bias = torch.randn(H, generator=torch.Generator().manual_seed(2))

    def biased(score, b, h, qi, ki):
        return score + bias_leaf[h]

    bias_leaf = bias.to("neuron").requires_grad_()
    out = flex_attention(*(t.to("neuron") for t in (q, k, v)), score_mod=biased)
    out.square().sum().backward()
    ref_bias = bias.clone().requires_grad_()
    mask = ref_bias.view(1, H, 1, 1).expand(B, H, L, L)
    F.scaled_dot_product_attention(q, k, v, attn_mask=mask).square().sum().backward()
    assert is_on_neuron(bias_leaf.grad)
    # a per-head constant cancels in the softmax: both gradients are (near) zero alike
    torch.testing.assert_close(bias_leaf.grad.cpu(), ref_bias.grad, rtol=0, atol=1e-4)


def test_charged_as_fused_attention():
    q, k, v = (t.to("neuron") for t in _qkv(dtype=torch.bfloat16))
    metrics.reset()
    flex_attention(q, k, v)
    charged = _names()[FLEX].modeled_seconds
    expected = op_cost(FLEX, [q.shape, k.shape, v.shape], ["bfloat16"] * 3, cost_target())
    assert charged == pytest.approx(expected.seconds, abs=1e-9) and charged > 0
    assert expected.bytes_read == 3 * B * H * L * E * 2  # Q, K, V: no L x L scores in HBM


def test_compiled_forward_and_backward_equal_eager():
    q, k, v = _qkv()
    mask = create_block_mask(causal, None, None, L, L, device="neuron")

    def step(q, k, v):
        return flex_attention(q, k, v, block_mask=mask).square().sum()

    eager = [t.to("neuron").requires_grad_() for t in (q, k, v)]
    step(*eager).backward()
    torch._dynamo.reset()
    compiled = [t.to("neuron").requires_grad_() for t in (q, k, v)]
    metrics.reset()
    torch.compile(step, backend="neuron")(*compiled).backward()
    assert _names()[FLEX].calls == 1 and _names()[FLEX_BWD].calls == 1  # compiled into the same op
    for c, e in zip(compiled, eager):
        torch.testing.assert_close(c.grad.cpu(), e.grad.cpu(), rtol=0, atol=0)


def test_cpu_flex_attention_is_left_as_torch_has_it():
    q, k, v = (t.requires_grad_() for t in _qkv())
    with pytest.raises(NotImplementedError, match="backward on CPU"):
        flex_attention(q, k, v)


def test_dataless_flex_attention_agrees_with_the_normal_run():
    import torchneuron

    def step():
        gc.collect()  # FlexAttention's autograd leaves reference cycles over earlier steps' tensors
        torch.neuron.reset_peak_memory_stats()
        q, k, v = (t.to("neuron").requires_grad_() for t in _qkv())
        mask = create_block_mask(causal, None, None, L, L, device="neuron")
        flex_attention(q, k, v, block_mask=mask).sum().backward()
        return sorted((o.op, o.calls, o.modeled_seconds) for o in metrics.ops()), torch.neuron.max_memory_allocated()

    import gc

    metrics.reset()
    normal = step()
    metrics.reset()
    with torchneuron.dataless():
        dataless = step()
    assert normal == dataless and FLEX in {op for op, *_ in normal[0]}


def _biased_relative(slopes, bias):
    def mod(score, b, h, qi, ki):
        return score + slopes[h] * (qi - ki) / L + bias[h]
    return mod


def test_plain_torch_compile_runs_the_fused_op_with_cpu_values():
    """The default backend (torchtitan's): Inductor lowers FlexAttention on neuron to the op."""
    q, k, v = _qkv()
    g = torch.Generator().manual_seed(3)
    slopes, bias, grad = torch.randn(H, generator=g), torch.randn(H, generator=g), torch.randn(B, H, L, E, generator=g)

    def run(compile_it):
        leaves = [t.to("neuron").requires_grad_() for t in (q, k, v, bias)]
        mask = create_block_mask(causal, None, None, L, L, device="neuron")
        mod = _biased_relative(slopes.to("neuron"), leaves[3])

        def step(q, k, v):
            return flex_attention(q, k, v, score_mod=mod, block_mask=mask) * 2

        torch._dynamo.reset()
        metrics.reset()
        with inductor_config.patch(force_disable_caches=True):  # lowered here, not read from a cache
            out = (torch.compile(step) if compile_it else step)(*leaves[:3])
            out.backward(grad.to("neuron"))
        return out.detach(), leaves, _names()

    eager_out, eager_leaves, eager_ops = run(False)
    out, leaves, ops = run(True)
    assert ops[FLEX].calls == 1 and ops[FLEX_BWD].calls == 1  # compiled into the same op
    assert ops[FLEX].modeled_seconds == eager_ops[FLEX].modeled_seconds > 0  # charged as eager
    assert ops[FLEX_BWD].modeled_seconds == eager_ops[FLEX_BWD].modeled_seconds > 0
    assert is_on_neuron(out) and all(is_on_neuron(t.grad) for t in leaves)
    torch.testing.assert_close(out.cpu(), eager_out.cpu(), rtol=0, atol=0)
    for c, e in zip(leaves, eager_leaves):
        torch.testing.assert_close(c.grad.cpu(), e.grad.cpu(), rtol=0, atol=0)
    # CPU: the forward is CPU's flex_attention, the q/k/v gradients CPU autograd through the same
    # dense implementation (the score_mod captures CPU tensors there)
    cpu_mask = create_block_mask(causal, None, None, L, L, device="cpu")
    cpu_mod = _biased_relative(slopes, bias)
    torch.testing.assert_close(out.cpu(), 2 * flex_attention(q, k, v, score_mod=cpu_mod, block_mask=cpu_mask),
                               rtol=0, atol=0)
    _, cpu_grads = _cpu_dense_with_grads(q, k, v, cpu_mod, cpu_mask, 2 * grad)
    for mine, ref in zip(leaves, cpu_grads):
        torch.testing.assert_close(mine.grad.cpu(), ref, rtol=0, atol=0)
    # the bias's gradient: against SDPA with the same additive mask (another algorithm)
    ref_bias = bias.clone().requires_grad_()
    rel = slopes.view(1, H, 1, 1) * (torch.arange(L).view(L, 1) - torch.arange(L)) / L
    additive = (rel + ref_bias.view(1, H, 1, 1)).masked_fill(~torch.ones(L, L, dtype=torch.bool).tril(), float("-inf"))
    (2 * F.scaled_dot_product_attention(q, k, v, attn_mask=additive)).backward(grad)
    tol = 1e-5 * max(ref_bias.grad.abs().max().item(), 1.0)
    torch.testing.assert_close(leaves[3].grad.cpu(), ref_bias.grad, rtol=1e-4, atol=tol)


CACHE_CHILD = """
import json, torch
from torch._dynamo.utils import counters
from torch.nn.attention.flex_attention import create_block_mask, flex_attention
from torchneuron.profiler import metrics

g = torch.Generator().manual_seed(0)
q, k, v = (torch.randn(1, 2, 128, 16, generator=g).to("neuron").requires_grad_() for _ in range(3))

def causal(b, h, qi, ki):  # new_ones: retraced from the cache, a neuron constant in the subgraph
    return b.new_ones((), dtype=torch.bool) & (qi >= ki)

def step(q, k, v):
    mask = create_block_mask(causal, 1, None, 128, 128, device="neuron")
    return flex_attention(q, k, v, block_mask=mask, score_mod=lambda s, b, h, qi, ki: s + (qi - ki) / 64).sum()

def grads():
    return [t.grad.cpu() for t in (q, k, v)]

step(q, k, v).backward()
eager = grads()
for t in (q, k, v):
    t.grad = None
metrics.reset()
torch.compile(step, backend=BACKEND)(q, k, v).backward()
print(json.dumps({"hits": counters["inductor"]["fxgraph_cache_hit"],
                  "ops": {o.op: o.calls for o in metrics.ops() if "flex" in o.op},
                  "equal_to_eager": all(torch.equal(c, e) for c, e in zip(grads(), eager))}))
"""


@pytest.mark.parametrize("backend", ["inductor", "neuron"])
def test_compiled_flex_attention_served_from_the_cache_in_a_new_process(backend, tmp_path):
    """A cache hit skips lowering: the cached module itself registers the subgraphs it calls with."""
    env = {"TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor"),  # the default backend's cache
           "NEURON_COMPILE_CACHE_URL": str(tmp_path / "neuron"),  # backend="neuron"'s
           "TORCHNEURON_COMPILE_CACHE_KEY_FILE": str(tmp_path / "neuron.key")}
    runs = []
    for _ in range(2):
        done = run_python(CACHE_CHILD.replace("BACKEND", repr(backend)), env=env, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
        runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
    first, second = runs
    assert first["hits"] == 0 and second["hits"] == 2  # forward and backward from the cache
    assert second["ops"] == first["ops"] == {FLEX: 1, FLEX_BWD: 1}
    assert first["equal_to_eager"] and second["equal_to_eager"]


def test_plain_torch_compile_of_cpu_flex_attention_keeps_inductors_lowering():
    q, k, v = _qkv()
    mask = create_block_mask(causal, None, None, L, L, device="cpu")
    torch._dynamo.reset()
    metrics.reset()
    with inductor_config.patch(force_disable_caches=True):
        out = torch.compile(flex_attention)(q, k, v, block_mask=mask)
    assert FLEX not in _names()  # Inductor's C++ template, not the device's op
    torch.testing.assert_close(out, flex_attention(q, k, v, block_mask=mask), rtol=1e-4, atol=1e-5)

