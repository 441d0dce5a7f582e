"""Eager ops and torch.compile(backend="neuron") follow one numerics rule (device/numerics.py).

Deterministic switches (the int64 wrap, --auto-cast) give bitwise-equal results; stochastic
rounding rounds the same ops, with the same (unbiased) distribution.
"""

import pytest
import torch
from compile_support import _fresh_compile_state  # noqa: F401
from torch import nn

from torchneuron import config
from torchneuron.compiler import passes
from torchneuron.device import numerics

STOCHASTIC = {"NEURON_RT_STOCHASTIC_ROUNDING_EN": "1"}

# 1.25 + 2**-7 (exact in BF16) times 1 + 2**-7 lies 0.2578125 of a BF16 ulp (2**-7 in [1, 2))
# above 1.2578125 + 2**-7: nearest rounding always rounds it down, stochastic rounding rounds
# it up with that probability.
LOW, HIGH = 1.2578125 + 2.0**-7, 1.2578125 + 2 * 2.0**-7
P_UP = 0.2578125
N = 1 << 16  # fraction rounded up: standard deviation 0.0017, checked to 0.02


def eager_and_compiled(fn, *cpu_args, **env):
    with config.override(**env):
        args = [a.to("neuron") for a in cpu_args]
        eager = fn(*args)
        compiled = torch.compile(fn, backend="neuron")(*args)
    as_cpu = lambda r: tuple(t.cpu() for t in r) if isinstance(r, tuple) else r.cpu()
    return as_cpu(eager), as_cpu(compiled)


def fraction_up(result: torch.Tensor, scale: float = 1.0) -> float:
    values = result.float() / scale
    assert set(values.unique().tolist()) <= {LOW, HIGH}, "a result is not one of the two BF16 neighbours"
    return (values == HIGH).double().mean().item()


def product_operands():
    a = torch.full((N,), 1.25 + 2.0**-7, dtype=torch.bfloat16)
    b = torch.full((N,), 1.0 + 2.0**-7, dtype=torch.bfloat16)
    return a, b


def test_stochastic_rounding_rounds_bf16_op_results_in_compiled_code_as_in_eager():
    # The product is a BF16 result: eager computes it in FP32 and rounds it stochastically;
    # compiled code must too (it used to round only FP32->BF16 conversions, so fused
    # code rounded the product to nearest: never up). The doubling is exact.
    eager, compiled = eager_and_compiled(lambda a, b: (a * b) * 2, *product_operands(), **STOCHASTIC)
    assert eager.dtype == compiled.dtype == torch.bfloat16
    assert fraction_up(eager, 2) == pytest.approx(P_UP, abs=0.02)
    assert fraction_up(compiled, 2) == pytest.approx(P_UP, abs=0.02)


class Scale(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(1, 256, bias=False, dtype=torch.bfloat16)
        nn.init.constant_(self.proj.weight, 1.0 + 2.0**-7)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.proj(x)) * 4


def test_bf16_model_eager_and_compiled_round_the_same_ops():
    # A BF16 layer (its matmul is the one inexact op) under stochastic rounding: eager and
    # compiled results have the same distribution, unbiased; nearest rounding would give none up.
    x = torch.full((N // 256, 1), 1.25 + 2.0**-7, dtype=torch.bfloat16)
    model = Scale()
    with config.override(**STOCHASTIC):
        device_model = model.to("neuron")
        inputs = x.to("neuron")
        with torch.no_grad():
            eager = device_model(inputs).cpu()
            compiled = torch.compile(device_model, backend="neuron")(inputs).cpu()
    assert fraction_up(eager, 4) == pytest.approx(P_UP, abs=0.02)
    assert fraction_up(compiled, 4) == pytest.approx(P_UP, abs=0.02)
    assert compiled.float().mean().item() == pytest.approx(eager.float().mean().item(), abs=0.02 * 4 * 2**-7)


def test_int64_conversions_and_creation_wrap_in_compiled_code_as_in_eager():
    # Every int64 value the device writes wraps at 32 bits, conversions and factories too
    # (compiled code used to leave them unwrapped, so comparisons and float results differed).
    def fn(x):
        i = x.to(torch.int64)
        big = torch.full((3,), 2**32 + 3, dtype=torch.int64, device=x.device)
        return i > 0, i.float(), big // 2

    x = torch.tensor([2.0**32 + 1024, -5.0, 3e9])
    eager, compiled = eager_and_compiled(fn, x, TORCHNEURON_INT64_AS_INT32="1")
    assert eager[0].tolist() == [True, False, False]
    assert eager[1].tolist() == [1024.0, -5.0, 3e9 - 2.0**32]
    assert eager[2].tolist() == [1, 1, 1]
    for e, c in zip(eager, compiled):
        assert torch.equal(e, c)


def test_autocast_leaves_ops_run_on_the_host_alone_in_compiled_code_as_in_eager():
    # linalg_inv_ex runs on the host CPU on real Trainium: CPU numerics, not auto-cast, in
    # eager; compiled code used to auto-cast it as well.
    a = torch.eye(8) * 3 + torch.randn(8, 8, generator=torch.Generator().manual_seed(0)) * 0.1
    eager, compiled = eager_and_compiled(torch.linalg.inv, a,
                                         NEURON_CC_FLAGS="--auto-cast all --auto-cast-type bf16")
    assert torch.equal(eager, torch.linalg.inv(a))
    assert torch.equal(compiled, eager)


def test_rule_covers_views_samplers_allocations_and_host_ops():
    assert numerics.rounds_bf16("aten::mul.Tensor") and numerics.rounds_bf16("aten::mm")
    assert not numerics.rounds_bf16("aten::view")  # computes nothing
    assert not numerics.rounds_bf16("aten::uniform_")  # BF16 samples drawn for BF16
    assert not numerics.rounds_bf16("aten::rand")  # a random factory, as compiled graphs hold
    assert numerics.rounds_bf16("aten::native_dropout")  # computes on its input (tagged seeded)
    assert not numerics.rounds_bf16("aten::empty.memory_format")
    assert not numerics.rounds_bf16("aten::mm", on_device=False)
    assert numerics.record_rules("aten::linalg_inv_ex", on_device=False) == 0
    assert numerics.record_rules("aten::mm", on_device=True) == (
        numerics.RULE_AUTOCAST_MATMULT | numerics.RULE_AUTOCAST_ALL | numerics.RULE_ROUNDS_BF16)
    # Conversions round only from FP32; other ops when they read BF16 or are asked for it.
    assert numerics.rounds_bf16_result("aten::_to_copy", [torch.float32], torch.bfloat16)
    assert not numerics.rounds_bf16_result("aten::_to_copy", [torch.float16], torch.bfloat16)
    assert numerics.rounds_bf16_result("aten::sum.dim_IntList", [torch.float32], torch.bfloat16)
    assert not numerics.rounds_bf16_result("aten::add.Tensor", [torch.float32], None)
    assert numerics.wraps_int64("aten::full") and not numerics.wraps_int64("aten::view")


def test_pass_computes_bf16_ops_in_fp32_and_rounds_their_results():
    a, b = (t[:16] for t in product_operands())
    gm = torch.fx.experimental.proxy_tensor.make_fx(lambda a, b: a * b, tracing_mode="fake")(a, b)
    settings = numerics.Numerics("none", "bf16", True, False)
    assert passes.apply_numerics(gm, settings) == 1
    mul = next(n for n in gm.graph.nodes if n.target is torch.ops.aten.mul.Tensor)
    assert mul.meta["val"].dtype == torch.float32
    assert all(arg.meta["val"].dtype == torch.float32 for arg in mul.args)
    assert any(n.target is torch.ops.aten.randint.low for n in gm.graph.nodes)
    (result,) = torch.fx.node.map_arg(next(n for n in gm.graph.nodes if n.op == "output").args,
                                      lambda n: n.meta["val"])
    assert result.dtype == torch.bfloat16
