"""Opt-in Trainium numerics change results the way the hardware would; the
defaults leave every result equal to CPU's."""

import pytest
import torch

from torchneuron.device import config, numerics


@pytest.fixture
def numerics_env():
    """Applies settings for one test, then restores the (default) environment."""
    def apply(**values):
        stack.enter_context(config.override(**values))
        return numerics.configure()

    import contextlib
    with contextlib.ExitStack() as stack:
        yield apply
    numerics.configure()


def _pair(*shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g), torch.randn(*shape, generator=g)


def test_defaults_equal_cpu_exactly():
    n = numerics.current()
    assert (n.auto_cast, n.stochastic_rounding, n.int64_as_int32) == ("none", False, False)
    a, b = _pair(32, 32)
    assert torch.equal((a.to("neuron") @ b.to("neuron")).cpu(), a @ b)
    assert torch.equal(a.to("neuron").bfloat16().cpu(), a.bfloat16())
    big = torch.tensor([2**40, -(2**35)])
    assert torch.equal((big.to("neuron") * 3).cpu(), big * 3)


@pytest.mark.parametrize("cast, dtype", [("bf16", torch.bfloat16), ("fp16", torch.float16),
                                         ("fp8_e4m3", torch.float8_e4m3fn)])
def test_auto_cast_matmult_rounds_matmul_inputs_and_output(numerics_env, cast, dtype):
    numerics_env(NEURON_CC_FLAGS=f"-O2 --auto-cast matmult --auto-cast-type {cast} --verbose=info")
    a, b = _pair(48, 48)
    got = (a.to("neuron") @ b.to("neuron")).cpu()
    rounded = (a.to(dtype).float() @ b.to(dtype).float()).to(dtype).float()
    assert torch.equal(got, rounded)  # FP32 accumulation of rounded inputs, rounded result
    assert not torch.equal(got, a @ b)
    assert torch.equal((a.to("neuron") + b.to("neuron")).cpu(), a + b)  # not a matmul: exact
    lin = torch.nn.Linear(48, 8).to("neuron")  # linear reaches the device as addmm
    lin_cpu = torch.nn.Linear(48, 8)
    lin_cpu.load_state_dict({k: v.cpu() for k, v in lin.state_dict().items()})
    assert not torch.equal(lin(a.to("neuron")).detach().cpu(), lin_cpu(a).detach())


def test_auto_cast_tf32_keeps_ten_mantissa_bits(numerics_env):
    numerics_env(NEURON_CC_FLAGS="--auto-cast=matmult --auto-cast-type=tf32")
    a, b = _pair(16, 16)
    got = (a.to("neuron") @ b.to("neuron")).cpu()
    assert not torch.equal(got, a @ b)
    low_bits = got.view(torch.int32) & 0x1FFF
    assert torch.all(low_bits == 0)  # 23 - 10 = 13 dropped mantissa bits
    torch.testing.assert_close(got, a @ b, rtol=1e-2, atol=1e-2)  # TF32: ~3 decimal digits


def test_auto_cast_all_rounds_elementwise_ops_too(numerics_env):
    numerics_env(NEURON_CC_FLAGS="--auto-cast all")
    a, b = _pair(100)
    got = (a.to("neuron") * b.to("neuron")).cpu()
    assert torch.equal(got, (a.bfloat16().float() * b.bfloat16().float()).bfloat16().float())


def test_stochastic_rounding_is_unbiased_and_seeded(numerics_env):
    numerics_env(NEURON_RT_STOCHASTIC_ROUNDING_EN="1")
    x = torch.full((20000,), 1.0 + 2**-9)  # a quarter of the way between two bf16 values
    lo, hi = 1.0, 1.0 + 2**-7
    torch.neuron.manual_seed(0)
    r = x.to("neuron").bfloat16().cpu().float()
    assert set(r.unique().tolist()) == {lo, hi}
    up = (r == hi).float().mean().item()
    assert 0.2 < up < 0.3  # rounds up with probability 1/4; nearest rounding never would
    assert abs(r.mean().item() - x.mean().item()) < 5e-4  # unbiased
    torch.neuron.manual_seed(0)
    assert torch.equal(x.to("neuron").bfloat16().cpu().float(), r)  # reproducible
    special = torch.tensor([float("inf"), float("-inf"), float("nan"), 0.0])
    out = special.to("neuron").bfloat16().cpu()
    assert torch.equal(out[:2].float(), special[:2]) and out[2].isnan() and out[3] == 0


def test_int64_as_int32_wraps_results(numerics_env):
    numerics_env(TORCHNEURON_INT64_AS_INT32="1")
    x = torch.tensor([2**31 - 1, 5, -(2**31)])
    got = (x.to("neuron") + 1).cpu()
    assert got.tolist() == [-(2**31), 6, -(2**31) + 1]  # int32 wraparound
    big = torch.tensor([2**33 + 7]).to("neuron")  # stored as int32 on the device
    assert big.cpu().tolist() == [7]
    assert (torch.arange(10, device="neuron") * 2).cpu().tolist() == list(range(0, 20, 2))


@pytest.mark.parametrize("flags, match", [
    ("--auto-cast sometimes", "--auto-cast 'sometimes' is not valid"),
    ("--auto-cast matmult --auto-cast-type fp64", "--auto-cast-type 'fp64' is not valid"),
])
def test_bad_settings_are_clear_errors(numerics_env, flags, match):
    with pytest.raises(ValueError, match=match):
        numerics_env(NEURON_CC_FLAGS=flags)


def test_bad_flag_value_is_a_clear_error(numerics_env):
    with pytest.raises(ValueError, match="NEURON_RT_STOCHASTIC_ROUNDING_EN='yes'"):
        numerics_env(NEURON_RT_STOCHASTIC_ROUNDING_EN="yes")
