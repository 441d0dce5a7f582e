"""Opt-in Trainium numerics change results the way the hardware would; the
defaults leave every result equal to CPU's."""

import pytest
import torch

from torchneuron import config
from torchneuron.device import numerics
from torchneuron.testing import assert_close_to_reference, matmul_tolerance


@pytest.fixture
def numerics_env():
    """Applies settings for one test, then restores the (default) environment."""
    def apply(**values):
        stack.enter_context(config.override(**values))  # reaches the core by itself
        return numerics.current()

    import contextlib
    with contextlib.ExitStack() as stack:
        yield apply


def _pair(*shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g), torch.randn(*shape, generator=g)


def _conv_args(dtype=torch.float32):
    g = torch.Generator().manual_seed(1)
    return (torch.randn(2, 3, 12, 12, generator=g).to(dtype), torch.randn(5, 3, 3, 3, generator=g).to(dtype),
            torch.randn(5, generator=g).to(dtype))


def _conv_and_grads(x, w, bias, device):
    """conv2d's output and the gradients of its input, weight and bias, as CPU tensors."""
    x, w, bias = (t.to(device).requires_grad_() for t in (x, w, bias))
    y = torch.nn.functional.conv2d(x, w, bias, padding=1)
    g = torch.Generator().manual_seed(2)
    grad_output = torch.randn(y.shape, generator=g).to(device, y.dtype)
    (y * grad_output).sum().backward()  # the mul is exact under --auto-cast matmult
    return [t.detach().cpu() for t in (y, x.grad, w.grad, bias.grad)]


def _bf16_neighbours(exact: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The two BF16 values around each FP32 value: toward zero, and the next one away."""
    bits = exact.view(torch.int32)
    down = bits & ~0xFFFF
    return down.view(torch.float32), (down + 0x10000).view(torch.float32)


def test_defaults_equal_cpu_exactly():
    n = numerics.current()
    assert (n.auto_cast, n.stochastic_rounding, n.int64_as_int32) == ("none", False, False)
    a, b = _pair(32, 32)
    assert torch.equal((a.to("neuron") @ b.to("neuron")).cpu(), a @ b)
    assert torch.equal(a.to("neuron").bfloat16().cpu(), a.bfloat16())
    big = torch.tensor([2**40, -(2**35)])
    assert torch.equal((big.to("neuron") * 3).cpu(), big * 3)
    x, w, bias = _conv_args()
    for got, want in zip(_conv_and_grads(x, w, bias, "neuron"), _conv_and_grads(x, w, bias, "cpu")):
        assert torch.equal(got, want)
    h, k = a.bfloat16(), b.bfloat16()  # BF16 ops round to nearest, as CPU
    for op in (lambda p, q: p + 2**-10, lambda p, q: p * q, lambda p, q: p @ q, lambda p, q: p.sum(1)):
        assert torch.equal(op(h.to("neuron"), k.to("neuron")).cpu(), op(h, k))


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


def test_auto_cast_matmult_rounds_convolution_like_a_matmul(numerics_env):
    # Convolution runs on TensorE: its FP32 operands are rounded to the cast type, it
    # accumulates in FP32, and its results are rounded again -- forward and backward.
    numerics_env(NEURON_CC_FLAGS="--auto-cast matmult --auto-cast-type bf16")
    x, w, bias = _conv_args()
    y, gx, gw, gb = _conv_and_grads(x, w, bias, "neuron")

    def r(t):
        return t.bfloat16().float()

    assert torch.equal(y, r(torch.nn.functional.conv2d(r(x), r(w), r(bias), padding=1)))
    exact = _conv_and_grads(x, w, bias, "cpu")
    assert not torch.equal(y, exact[0])
    grad_output = torch.randn(y.shape, generator=torch.Generator().manual_seed(2))
    want = torch.ops.aten.convolution_backward(r(grad_output), r(x), r(w), [5], [1, 1], [1, 1], [1, 1],
                                               False, [0, 0], 1, [True, True, True])
    for got, expected in zip((gx, gw, gb), want):
        assert torch.equal(got, r(expected))


def test_auto_cast_tf32_keeps_ten_mantissa_bits(numerics_env):
    numerics_env(NEURON_CC_FLAGS="--auto-cast=matmult --auto-cast-type=tf32")
    a, b = _pair(16, 16)
    got = (a.to("neuron") @ b.to("neuron")).cpu()
    assert not torch.equal(got, a @ b)
    low_bits = got.view(torch.int32) & 0x1FFF
    assert torch.all(low_bits == 0)  # 23 - 10 = 13 dropped mantissa bits
    # TF32 inputs (relative error 2**-11 each) accumulated in FP32 (in some order): within
    # (2 * 2**-11 + 2**-22) |a| @ |b| of the FP32 product, plus both products' summation bounds
    bound = (2 * 2.0 ** -11 + 2.0 ** -22) * (a.abs().double() @ b.abs().double()) + matmul_tolerance(a, b)
    assert_close_to_reference(got, a.double() @ b.double(), bound)
    with pytest.raises(AssertionError):  # the bound is tight enough to tell TF32 from BF16 inputs
        assert_close_to_reference((a.bfloat16().float() @ b.bfloat16().float()), a.double() @ b.double(), bound)


def test_auto_cast_all_rounds_elementwise_ops_too(numerics_env):
    numerics_env(NEURON_CC_FLAGS="--auto-cast all")
    a, b = _pair(100)
    got = (a.to("neuron") * b.to("neuron")).cpu()
    assert torch.equal(got, (a.bfloat16().float() * b.bfloat16().float()).bfloat16().float())


def test_in_place_addr_is_counted_charged_and_switched_like_out_of_place(numerics_env):
    # addr_ runs its own kernel (CPU's in-place path needs self and result to be one
    # reference): it must count, charge and apply the switches as the fallback does for addr.
    import torchneuron
    y, _ = _pair(16, 16, seed=3)
    a, b = _pair(16, seed=4)
    yn = y.to("neuron")
    torchneuron.metrics.reset()
    assert yn.addr_(a.to("neuron"), b.to("neuron"), beta=0.5, alpha=2.0) is yn
    assert torch.equal(yn.cpu(), y.addr(a, b, beta=0.5, alpha=2.0))  # default: CPU's bits
    [record] = [o for o in torchneuron.metrics.ops() if o.op == "aten::addr.out"]
    assert record.calls == 1 and record.modeled_seconds > 0 and not record.cpu_fallback

    numerics_env(NEURON_CC_FLAGS="--auto-cast all --auto-cast-type bf16")
    in_place = y.to("neuron").addr_(a.to("neuron"), b.to("neuron"))
    out_of_place = torch.addr(y.to("neuron"), a.to("neuron"), b.to("neuron"))
    rounded = [t.bfloat16().float() for t in (y, a, b)]
    assert torch.equal(in_place.cpu(), rounded[0].addr(rounded[1], rounded[2]).bfloat16().float())
    assert torch.equal(in_place.cpu(), out_of_place.cpu())


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


def test_stochastic_rounding_of_bf16_results_is_unbiased(numerics_env):
    # 1 + 2**-10 lies an eighth of the way from 1 to the next BF16 value (1 + 2**-7).
    # Rounding to nearest, as CPU does, loses every such addition; an engine that
    # computes in FP32 and rounds stochastically keeps them on average.
    small, n, steps = 2**-10, 20000, 32
    cpu = torch.ones(n, dtype=torch.bfloat16)
    for _ in range(steps):
        cpu += small
    assert torch.all(cpu == 1)  # round-to-nearest is biased: the sum never moves
    numerics_env(NEURON_RT_STOCHASTIC_ROUNDING_EN="1")
    torch.neuron.manual_seed(0)
    once = torch.ones(n, dtype=torch.bfloat16, device="neuron") + small
    assert once.dtype == torch.bfloat16 and set(once.cpu().float().unique().tolist()) == {1.0, 1 + 2**-7}
    assert abs(once.cpu().float().mean().item() - (1 + small)) < 1e-4  # unbiased (sd ~2e-5)
    acc = torch.ones(n, dtype=torch.bfloat16, device="neuron")
    storage = acc.untyped_storage().data_ptr()
    for _ in range(steps):
        assert acc.add_(small) is acc  # in place: the caller's tensor and memory
    assert acc.untyped_storage().data_ptr() == storage
    assert abs(acc.cpu().float().mean().item() - (1 + steps * small)) < 2e-3
    out = torch.empty(3, dtype=torch.bfloat16, device="neuron")
    assert torch.add(torch.ones(3, dtype=torch.bfloat16, device="neuron"), small, out=out) is out
    torch.neuron.manual_seed(0)  # seeded by the device's generator: reproducible
    assert torch.equal((torch.ones(n, dtype=torch.bfloat16, device="neuron") + small).cpu(), once.cpu())


@pytest.mark.parametrize("name", ["matmul", "sum", "conv2d"])
def test_stochastic_rounding_rounds_bf16_results_computed_in_fp32(numerics_env, name):
    a, b = (t.bfloat16() for t in _pair(64, 64))
    x, w, bias = _conv_args(torch.bfloat16)
    op, args = {"matmul": (torch.matmul, (a, b)), "sum": (lambda t: t.sum(1), (a,)),
                "conv2d": (lambda *t: torch.nn.functional.conv2d(*t, padding=1), (x, w, bias))}[name]
    exact = op(*(t.float() for t in args))  # CPU in FP32 on the same (BF16) values
    numerics_env(NEURON_RT_STOCHASTIC_ROUNDING_EN="1")
    got = op(*(t.to("neuron") for t in args)).cpu()
    assert got.dtype == torch.bfloat16
    down, up = _bf16_neighbours(exact)
    got = got.float()
    assert torch.all((got == down) | (got == up))  # one of the two neighbours of the FP32 result
    assert not torch.equal(got, op(*args).float())  # not CPU's round-to-nearest everywhere


def test_stochastic_rounding_keeps_cpu_result_dtypes(numerics_env):
    numerics_env(NEURON_RT_STOCHASTIC_ROUNDING_EN="1")
    q = torch.randn(2, 4, 16, 8).bfloat16()
    nq = q.to("neuron").requires_grad_()
    out, logsumexp = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(nq, nq, nq, 0.0, True)[:2]
    assert (out.dtype, logsumexp.dtype) == (torch.bfloat16, torch.float32)  # as CPU returns them
    norm = torch.nn.LayerNorm(8).to("neuron", torch.bfloat16)
    y = norm(torch.nn.functional.scaled_dot_product_attention(nq, nq, nq, is_causal=True))
    y.float().sum().backward()
    assert y.dtype == nq.grad.dtype == norm.weight.grad.dtype == torch.bfloat16
    half = torch.ones(4, dtype=torch.bfloat16, device="neuron")
    half.add_(torch.full((4,), 2**-10, device="neuron"))  # an FP32 operand, a BF16 result
    assert half.dtype == torch.bfloat16
    x = torch.randn(8).to("neuron")
    assert torch.equal((x * 3).cpu(), x.cpu() * 3)  # FP32 results are not rounded
    torch.manual_seed(0)
    torch.neuron.manual_seed(0)  # random samples are drawn for BF16, as on CPU
    drawn = torch.empty(1000, dtype=torch.bfloat16, device="neuron").random_()
    assert torch.equal(drawn.cpu(), torch.empty(1000, dtype=torch.bfloat16).random_())


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


def test_auto_cast_all_rounds_the_ops_compiled_code_rounds(numerics_env):
    """One rule (numerics.autocasts) for eager and compiled code: under --auto-cast all,
    ops that compute are rounded, copies, clones and views are not (eager used to round
    clone's result, which the compiler never did)."""
    from torchneuron.device import numerics

    numerics_env(NEURON_CC_FLAGS="--auto-cast all")
    x = torch.randn(4096).to("neuron")
    assert torch.equal(x.clone().cpu(), x.cpu())
    assert torch.equal(x.view(64, 64).cpu(), x.cpu().view(64, 64))
    tripled = (x * 3).cpu()
    assert torch.equal(tripled, (x.cpu().bfloat16().float() * 3).bfloat16().float())  # operand, result
    assert [numerics.autocasts(op) for op in ("aten::clone", "aten::add.Tensor", "aten::mm")] \
        == [False, True, True]
    torch._dynamo.reset()
    compiled = torch.compile(lambda t: (t.clone(), t * 3), backend="neuron")
    c_clone, c_tripled = compiled(x)
    assert torch.equal(c_clone.cpu(), x.cpu())
    assert torch.equal(c_tripled.cpu(), tripled)
