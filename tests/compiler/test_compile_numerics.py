"""The numerics switches apply in compiled code as in eager; defaults equal CPU."""

import pytest
import torch
from compile_support import _fresh_compile_state  # noqa: F401
from torch.testing import assert_close

from torchneuron.compiler import passes
from torchneuron import config
from torchneuron.device import numerics


def matmul_then_scale(a, b):
    return (a @ b) * 1.5 + 0.25


def operands(seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(16, 64, generator=g), torch.randn(64, 16, generator=g)


def compiled_and_eager(fn, *cpu_args, **env):
    with config.override(**env):
        args = [a.to("neuron") for a in cpu_args]
        eager = fn(*args).cpu()
        compiled = torch.compile(fn, backend="neuron")(*args).cpu()
    return compiled, eager


@pytest.mark.parametrize("cast_type,dtype", [("bf16", torch.bfloat16), ("fp16", torch.float16)])
def test_autocast_matmult_in_compiled_code(cast_type, dtype):
    a, b = operands()
    compiled, eager = compiled_and_eager(
        matmul_then_scale, a, b, NEURON_CC_FLAGS=f"--auto-cast matmult --auto-cast-type {cast_type}")
    # As the hardware: inputs rounded to the cast type, FP32 accumulation, result rounded.
    product = (a.to(dtype).float() @ b.to(dtype).float()).to(dtype).float()
    expected = product * 1.5 + 0.25
    assert_close(compiled, expected, rtol=1e-6, atol=1e-6)
    assert_close(compiled, eager, rtol=1e-6, atol=1e-6)
    assert not torch.allclose(compiled, matmul_then_scale(a, b), rtol=1e-6, atol=1e-6)


def test_default_numerics_equal_cpu():
    a, b = operands()
    compiled, _ = compiled_and_eager(matmul_then_scale, a, b)
    assert_close(compiled, matmul_then_scale(a, b), rtol=1e-6, atol=1e-6)


def test_int64_wraps_at_32_bits_in_compiled_code():
    x = torch.tensor([2**31 - 1, 5, -(2**31)], dtype=torch.int64)
    compiled, eager = compiled_and_eager(lambda t: t + 1, x, TORCHNEURON_INT64_AS_INT32="1")
    assert compiled.tolist() == [-(2**31), 6, -(2**31) + 1]
    assert compiled.tolist() == eager.tolist()


def test_stochastic_rounding_of_conversions_in_compiled_code():
    # 1 + 2**-10 lies a quarter of the way between two BF16 neighbours (ulp 2**-7 at 1.0...
    # here between 1.0 and 1.0078125): round-to-nearest always gives 1.0, stochastic
    # rounding gives the upper neighbour about an eighth of the time.
    x = torch.full((20000,), 1.0 + 2.0**-10)
    compiled, _ = compiled_and_eager(lambda t: (t * 1.0).to(torch.bfloat16), x,
                                     NEURON_RT_STOCHASTIC_ROUNDING_EN="1")
    assert set(compiled.float().unique().tolist()) == {1.0, 1.0078125}
    assert abs(compiled.float().mean().item() - (1.0 + 2.0**-10)) < 2e-4
    nearest, _ = compiled_and_eager(lambda t: (t * 1.0).to(torch.bfloat16), x)
    assert nearest.float().unique().tolist() == [1.0]


def test_numerics_pass_rewrites_matmul_nodes():
    gm = torch.fx.experimental.proxy_tensor.make_fx(matmul_then_scale, tracing_mode="fake")(*operands())
    settings = numerics.Numerics("matmult", "bf16", False, False)
    assert passes.apply_numerics(gm, settings) == 3  # two inputs and the result
    converts = [n for n in gm.graph.nodes if n.target is torch.ops.prims.convert_element_type.default]
    assert {n.args[1] for n in converts} == {torch.bfloat16, torch.float32}
