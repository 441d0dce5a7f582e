"""The unboxed kernels of the hottest ops (csrc/aten/fastpath.cpp) behave as the fallback does.

They skip the boxed fallback's boxing, so each must still give CPU's exact results
(broadcasting, type promotion, CPU scalar operands, non-contiguous and overlapping
inputs, in-place), raise CPU's and CUDA's errors, and be counted and charged once.
"""

import pytest
import torch
import torch.nn.functional as F

import torchneuron
from conftest import on_device, run_python
from torchneuron.profiler import metrics

pytestmark = pytest.mark.usefixtures("fresh_accounting")


def _inputs():
    g = torch.Generator().manual_seed(0)
    return {
        "a": torch.randn(8, 16, generator=g),
        "b": torch.randn(8, 16, generator=g),
        "row": torch.randn(16, generator=g),           # broadcast
        "ints": torch.randint(-5, 5, (8, 16), generator=g),  # type promotion
        "pos": torch.rand(8, 16, generator=g) + 0.1,
        "m": torch.randn(16, 12, generator=g),
        "bm": torch.randn(3, 8, 16, generator=g),
        "bm2": torch.randn(3, 16, 4, generator=g),
        "target": torch.randint(0, 16, (8,), generator=g),
        "wide": torch.randn(16, 8, generator=g).t(),    # non-contiguous (8, 16)
    }


CASES = {
    "add": lambda t: t["a"] + t["b"],
    "add alpha broadcast": lambda t: torch.add(t["a"], t["row"], alpha=3),
    "add promotes int": lambda t: t["a"] + t["ints"],
    "add cpu scalar": lambda t: t["a"] + torch.tensor(2.5),
    "add python scalar": lambda t: t["a"] + 2,
    "sub non-contiguous": lambda t: t["wide"] - t["a"],
    "mul": lambda t: t["a"] * t["b"],
    "div": lambda t: t["a"] / t["pos"],
    "int div promotes": lambda t: t["ints"] / 2,
    "add_": lambda t: t["a"].clone().add_(t["b"], alpha=0.5),
    "mul_ broadcast": lambda t: t["a"].clone().mul_(t["row"]),
    "div_": lambda t: t["a"].clone().div_(t["pos"]),
    "sub_": lambda t: t["a"].clone().sub_(t["b"]),
    "addcmul_": lambda t: t["a"].clone().addcmul_(t["b"], t["pos"], value=0.1),
    "addcdiv_": lambda t: t["a"].clone().addcdiv_(t["b"], t["pos"], value=-0.3),
    "lerp_": lambda t: t["a"].clone().lerp_(t["b"], 0.25),
    "pow": lambda t: t["pos"] ** 1.5,
    "fill_": lambda t: t["a"].clone().fill_(3.0),
    "zero_": lambda t: t["a"].clone().zero_(),
    "relu": lambda t: torch.relu(t["a"]),
    "silu": lambda t: F.silu(t["a"]),
    "gelu tanh": lambda t: F.gelu(t["a"], approximate="tanh"),
    "neg exp sqrt rsqrt tanh sigmoid": lambda t: [f(t["pos"]) for f in (
        torch.neg, torch.exp, torch.sqrt, torch.rsqrt, torch.tanh, torch.sigmoid)],
    "mm": lambda t: t["a"] @ t["m"],
    "addmm": lambda t: torch.addmm(t["row"][:12], t["a"], t["m"], beta=0.5, alpha=2),
    "bmm": lambda t: torch.bmm(t["bm"], t["bm2"]),
    "sum dim": lambda t: t["a"].sum(dim=1, keepdim=True),
    "sum dtype": lambda t: t["ints"].sum(dim=0, dtype=torch.float32),
    "mean dim": lambda t: t["a"].mean(dim=(0, 1)),
    "softmax": lambda t: torch.softmax(t["a"], dim=-1),
    "log_softmax + nll": lambda t: F.nll_loss(F.log_softmax(t["a"], dim=1), t["target"]),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_fast_kernel_equals_cpu(case):
    cpu_inputs = _inputs()
    dev_inputs = {k: v.to("neuron") if k != "wide" else v.t().contiguous().to("neuron").t()
                  for k, v in cpu_inputs.items()}
    want = CASES[case](cpu_inputs)
    got = CASES[case](dev_inputs)
    wants, gots = (want, got) if isinstance(want, list) else ([want], [got])
    for w, g in zip(wants, gots):
        assert on_device(g)
        assert g.dtype == w.dtype and g.shape == w.shape and g.stride() == w.stride()
        assert torch.equal(g.cpu(), w)


def test_training_gradients_through_fast_kernels_equal_cpu():
    def run(device):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(),
                                    torch.nn.Linear(32, 4)).to(device)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)  # foreach on neuron
        x = torch.randn(8, 16, generator=torch.Generator().manual_seed(1)).to(device)
        y = torch.tensor([0, 1, 2, 3, 0, 1, 2, 3], device=device)
        for _ in range(3):
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
            opt.step()
        return [p.detach().cpu() for p in model.parameters()]

    cpu = run("cpu")
    dev = run("neuron")
    # CPU steps with the single-tensor AdamW, neuron with foreach: same formula,
    # another evaluation order for a few terms.
    for c, d in zip(cpu, dev):
        torch.testing.assert_close(d, c, rtol=1e-5, atol=1e-6)


def test_overlap_errors_are_cpus():
    a = torch.arange(16.0, device="neuron").view(4, 4)
    with pytest.raises(RuntimeError, match="single memory location|overlap"):
        a.add_(a.t())
    assert torch.equal(a.cpu(), torch.arange(16.0).view(4, 4))  # untouched
    b = torch.zeros(3, device="neuron").expand(2, 3)
    with pytest.raises(RuntimeError, match="single memory location|overlap"):
        b.mul_(2)


def test_device_errors_are_cudas():
    a = torch.ones(4, device="neuron")
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        a + torch.ones(4)                     # a CPU operand that is not a scalar
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        a + torch.ones(4, device="neuron:1")
    cpu0 = torch.tensor(1.0)
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        cpu0.add_(torch.tensor(2.0, device="neuron"))
    assert float(cpu0) == 1.0


def test_counted_and_charged_once_under_the_same_key_as_the_fallback():
    a, b = torch.randn(32, 32, device="neuron"), torch.randn(32, 32, device="neuron")
    est = torchneuron.estimate(lambda: [a + b for _ in range(3)], targets=("trn2",))
    ops = {o.op: o for o in est.targets["trn2"].ops}
    assert ops["aten::add.Tensor"].calls == 3 and ops["aten::add.Tensor"].seconds > 0
    metrics.reset()
    _ = a + b
    assert {c.op: c.calls for c in metrics.ops()} == {"aten::add.Tensor": 1}
    # The boxed fallback (taken while a numerics switch is on) finds the same cost
    # entry: both paths build one key. Stochastic rounding leaves float32 results alone.
    from torchneuron import _C, config

    _C._reset_cost_counts()
    _ = a + b                                   # the fast kernel
    with config.override(NEURON_RT_STOCHASTIC_ROUNDING_EN="1"):
        boxed = a + b                           # the boxed fallback
    assert torch.equal(boxed.cpu(), a.cpu() + b.cpu())
    entries = [e for e in _C._cost_entries() if e[0][0] == "aten::add.Tensor"]
    assert [calls for _, calls, _ in entries] == [2]


def test_host_placed_dtype_goes_through_the_fallback():
    a = torch.ones(4, dtype=torch.float64, device="neuron")
    got = a + a                               # real Trainium runs float64 on the host
    assert on_device(got) and torch.equal(got.cpu(), torch.full((4,), 2.0, dtype=torch.float64))
    falls = {c.op for c in metrics.fallbacks()}
    assert "aten::add.Tensor" in falls


def test_strict_mode_refuses_host_placed_dtypes_on_fast_ops():
    result = run_python("""
        import torch
        a = torch.ones(4, device="neuron")
        print((a + a).sum().item())
        try:
            torch.ones(4, dtype=torch.float64, device="neuron") * 2
        except NotImplementedError as e:
            print("refused", "TORCHNEURON_CPU_FALLBACK" in str(e))
    """, env={"TORCHNEURON_CPU_FALLBACK": "0"})
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["8.0", "refused", "True"]


def test_foreach_ops_equal_cpu_and_count_once():
    g = torch.Generator().manual_seed(3)
    cpu = [torch.randn(s, generator=g) for s in [(5, 3), (7,), (2, 2, 2)]]
    other = [torch.rand(t.shape, generator=g) + 0.5 for t in cpu]
    dev, dev_other = [t.to("neuron") for t in cpu], [t.to("neuron") for t in other]
    steps = [
        lambda x, y: torch._foreach_mul_(x, 0.9),
        lambda x, y: torch._foreach_add_(x, y, alpha=0.1),
        lambda x, y: torch._foreach_addcdiv_(x, y, y, [0.1, 0.2, 0.3]),
        lambda x, y: torch._foreach_lerp_(x, y, 0.5),
        lambda x, y: torch._foreach_div_(x, [1.5, 2.0, 3.0]),
    ]
    metrics.reset()
    for step in steps:
        step(cpu, other)
        step(dev, dev_other)
    norms_cpu = torch._foreach_norm(cpu, 2)
    norms_dev = torch._foreach_norm(dev, 2)
    for c, d in zip(cpu + list(norms_cpu), dev + list(norms_dev)):
        assert on_device(d) and torch.equal(d.cpu(), c)
    assert sum(c.calls for c in metrics.ops()) == len(steps) + 1
