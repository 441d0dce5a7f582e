"""neuron accepts the dtypes CUDA accepts where CPU's kernels refuse them.

Libraries branch on ``device.type != "cpu"`` and then use what CUDA accepts
(transformers' MoE layers call ``torch.histc`` on int32 expert ids). The audit
compares each OpInfo's CUDA dtypes with its CPU dtypes
(``torch.testing._internal.common_methods_invocations.op_db``); every entry where
CPU's kernel really refuses the dtype is in ``WIDENED`` below and runs on neuron
(``torchneuron/csrc/aten/widening.cpp``). The oracle is CPU PyTorch on the input
upcast to a dtype it accepts, with the result in CUDA's dtype; each test also
proves the op ran on neuron: result in device memory, the op counted under the
caller's dtypes as a device op and charged modelled time.
"""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F

import torchneuron
from torchneuron import config

from conftest import on_device

metrics = torchneuron.metrics
HALF = (torch.float16, torch.bfloat16)

# OpInfo name -> (dtypes CPU refuses and CUDA accepts, the dtype the oracle computes in,
# the ATen op neuron counts). Results are in the input's dtype except trace's (int64).
WIDENED: dict[str, tuple[tuple[torch.dtype, ...], torch.dtype, str]] = {
    "histc": ((torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64), torch.float64,
              "aten::histc"),
    "abs": ((torch.bool,), torch.uint8, "aten::abs.out"),
    "nn.functional.softsign": ((torch.bool,), torch.uint8, "aten::abs.out"),
    "trace": ((torch.bool,), torch.int64, "aten::trace"),
    "nn.functional.avg_pool3d": (HALF, torch.float32, "aten::avg_pool3d"),
    "_upsample_bilinear2d_aa": (HALF, torch.float32, "aten::_upsample_bilinear2d_aa"),
    "nn.functional.multi_margin_loss": (HALF, torch.float32, "aten::multi_margin_loss"),
    "nn.functional.multilabel_margin_loss": (HALF, torch.float32,
                                             "aten::multilabel_margin_loss_forward"),
    "nn.functional.rrelu": ((torch.float16,), torch.float32, "aten::rrelu_with_noise"),
}
# Left out on purpose: complex dtypes and FFTs (real Trainium runs them on the host CPU,
# hardware/support.py, so CPU's kernels and errors are what a user gets there), and
# CUDA-only kernels with no CPU kernel at all (flash/efficient attention: neuron takes
# CPU's SDPA path).
CUDA_ONLY = {"torch.ops.aten._flash_attention_forward", "torch.ops.aten._efficient_attention_forward"}

_OPS = None


def _op_db() -> dict[str, object]:
    global _OPS
    if _OPS is None:
        from torch.testing._internal.common_methods_invocations import op_db
        _OPS = {}
        for op in op_db:
            _OPS.setdefault(op.name, op)
    return _OPS


pytestmark = pytest.mark.usefixtures("fresh_accounting")


def _move(sample, fn):
    return sample.transform(lambda t: fn(t) if isinstance(t, torch.Tensor) else t)


def _counted(op_name: str, dtype: torch.dtype):
    """The metrics entries of ``op_name`` whose first dtype is ``dtype``: device ops, charged."""
    name = str(dtype).removeprefix("torch.")
    found = [c for c in metrics.ops() if c.op == op_name and c.dtypes[:1] == (name,)]
    assert found, f"{op_name} ({name}) was not counted: {[c.op for c in metrics.ops()]}"
    for entry in found:  # one per combination of argument dtypes
        assert not entry.cpu_fallback, entry.reason
        assert entry.calls >= 1 and entry.modeled_seconds > 0
    return found[0]


def _cases():
    return [pytest.param(name, dtype, id=f"{name}-{str(dtype).removeprefix('torch.')}")
            for name, (dtypes, _, _) in WIDENED.items() for dtype in dtypes]


def _cpu_refuses(op, dtype) -> bool:
    samples = list(op.sample_inputs("cpu", dtype))
    try:
        op(samples[0].input, *samples[0].args, **samples[0].kwargs)
    except (RuntimeError, NotImplementedError):
        return True
    return False


def test_audit_covers_every_dtype_cuda_accepts_and_cpu_refuses():
    """Re-derives the audit from op_db: each (op, dtype) CUDA lists, CPU does not, and
    CPU's kernel really refuses is in WIDENED (or is complex, an FFT or CUDA-only)."""
    refused = set()
    for name, op in _op_db().items():
        extra = set(op.supported_dtypes("cuda")) - set(op.supported_dtypes("cpu"))
        for dtype in sorted(extra, key=str):
            if dtype.is_complex or name.startswith("fft.") or name in CUDA_ONLY:
                continue
            if _cpu_refuses(op, dtype):
                refused.add((name, dtype))
    listed = {(name, d) for name, (dtypes, _, _) in WIDENED.items() for d in dtypes}
    assert refused == listed, f"not widened: {refused - listed}; not refused: {listed - refused}"


def _expected(name: str, dtype: torch.dtype, sample, seed: int):
    """CPU's result on the upcast input, in CUDA's result dtype (None: CUDA raises)."""
    op = _op_db()[name]
    if name == "histc":
        kwargs = {"bins": 100, "min": 0, "max": 0, **sample.kwargs}
        return _histc_oracle(sample.input, kwargs["bins"], kwargs["min"], kwargs["max"])
    _, wide, _ = WIDENED[name]
    up = _move(sample, lambda t: t.to(wide) if t.dtype == dtype else t)
    torch.manual_seed(seed)
    expected = op(up.input, *up.args, **up.kwargs)
    if name == "trace":
        return expected  # int64, CUDA's diagonal sum
    return expected.to(torch.float32 if name == "nn.functional.softsign" else dtype)


@pytest.mark.parametrize("name, dtype", _cases())
def test_opinfo_samples_match_cpu_on_upcast_input(name: str, dtype: torch.dtype):
    """Every OpInfo sample: neuron's result equals CPU's on the upcast input, in CUDA's dtype."""
    op = _op_db()[name]
    _, _, counted_as = WIDENED[name]
    checked = 0
    for i, sample in enumerate(op.sample_inputs("cpu", dtype)):
        expected = _expected(name, dtype, sample, seed=1234 + i)
        dev = _move(sample, lambda t: t.to("neuron"))
        torch.manual_seed(1234 + i)  # rrelu draws its noise from the neuron generator
        if expected is None:
            with pytest.raises(RuntimeError, match="max must be larger than min"):
                op(dev.input, *dev.args, **dev.kwargs)
            continue
        got = op(dev.input, *dev.args, **dev.kwargs)
        assert got.dtype == expected.dtype and on_device(got)
        torch.testing.assert_close(got.cpu(), expected, rtol=0, atol=0, equal_nan=True)
        checked += 1
    assert checked
    _counted(counted_as, dtype)


GRADS = ["nn.functional.avg_pool3d", "_upsample_bilinear2d_aa",
         "nn.functional.multi_margin_loss", "nn.functional.multilabel_margin_loss"]


@pytest.mark.parametrize("name", GRADS)
@pytest.mark.parametrize("dtype", HALF, ids=["float16", "bfloat16"])
def test_gradients_match_cpu_on_upcast_input(name: str, dtype: torch.dtype):
    """Backward kernels are widened too: input gradients equal CPU's float32 ones, rounded."""
    op = _op_db()[name]
    checked = 0
    for sample in op.sample_inputs("cpu", dtype, requires_grad=True):
        x = sample.input.detach()
        wide = _move(sample, lambda t: t.detach().float() if t.is_floating_point() else t)
        up = wide.input.detach().requires_grad_()
        out = op(up, *wide.args, **wide.kwargs)
        (expected,) = torch.autograd.grad(out, up, torch.ones_like(out))
        xd = x.to("neuron").requires_grad_()
        dev = _move(sample, lambda t: t.detach().to("neuron"))
        out_d = op(xd, *dev.args, **dev.kwargs)
        (got,) = torch.autograd.grad(out_d, xd, torch.ones_like(out_d))
        assert got.dtype == dtype and on_device(got)
        torch.testing.assert_close(got.cpu(), expected.to(dtype), rtol=0, atol=0)
        checked += 1
    assert checked
    backward = {"nn.functional.avg_pool3d": "aten::avg_pool3d_backward",
                "_upsample_bilinear2d_aa": "aten::_upsample_bilinear2d_aa_backward",
                "nn.functional.multi_margin_loss": "aten::multi_margin_loss_backward",
                "nn.functional.multilabel_margin_loss": "aten::multilabel_margin_loss_backward"}
    _counted(backward[name], dtype)


# --------------------------------------------------------------------------- histc


def _wrap(value: int, dtype: torch.dtype) -> int:
    """An int64 converted to ``dtype`` as C++ converts it (modulo 2**bits)."""
    return torch.tensor(value, dtype=torch.int64).to(dtype).item()


def _histc_oracle(x: torch.Tensor, bins: int, lo: float, hi: float) -> torch.Tensor | None:
    """CUDA's integer histc: ``min``/``max`` truncated to int64 and converted to the input's
    type, the data's range if they are equal, widened by one each way if that is empty;
    the counts are CPU's histc on float64 with those bounds (exact for these values).
    None where CUDA raises "max must be larger than min"."""
    a, b = _wrap(int(lo), x.dtype), _wrap(int(hi), x.dtype)
    if int(lo) == int(hi) and x.numel():
        a, b = int(x.min()), int(x.max())
    if a == b:
        a, b = _wrap(a - 1, x.dtype), _wrap(b + 1, x.dtype)
    if a >= b:
        return None
    return torch.histc(x.double(), bins=bins, min=a, max=b).to(x.dtype)


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64])
@pytest.mark.parametrize("bins, lo, hi", [(8, 0, 7), (5, 0, 0), (3, 0.5, 3.9), (4, -2.7, 2.2),
                                          (256, 0, 255), (1000, 0, 100), (7, 3, 2)])
def test_integer_histc_is_cudas(dtype, bins, lo, hi):
    """Values in and out of range and on both bounds (the last bin is closed), truncated
    bounds, the data's range when min == max, bounds wrapped into uint8 as CUDA wraps them."""
    g = torch.Generator().manual_seed(bins)
    low = 0 if dtype == torch.uint8 else -10
    x = torch.randint(low, 120, (300,), generator=g, dtype=dtype)
    x[0], x[1] = max(int(lo), low), min(int(hi), torch.iinfo(dtype).max)
    expected = _histc_oracle(x, bins, lo, hi)
    if expected is None:
        with pytest.raises(RuntimeError, match="max must be larger than min"):
            torch.histc(x.to("neuron"), bins=bins, min=lo, max=hi)
        return
    got = torch.histc(x.to("neuron"), bins=bins, min=lo, max=hi)
    assert got.dtype == dtype and on_device(got)
    assert torch.equal(got.cpu(), expected)
    assert _counted("aten::histc", dtype).calls == 1


def test_integer_histc_out_converts_into_out_dtype_and_resizes():
    """histc.out as CUDA: computed in the input's dtype, resized and copied into ``out``."""
    x = torch.tensor([[0, 1, 2], [2, 3, 3]], dtype=torch.int32)
    out = torch.empty(0, device="neuron")  # float32, resized
    ret = torch.histc(x.to("neuron"), bins=4, min=0, max=3, out=out)
    assert ret is out and on_device(out) and out.dtype == torch.float32
    assert torch.equal(out.cpu(), _histc_oracle(x, 4, 0, 3).float())
    _counted("aten::histc.out", torch.int32)


def test_integer_histc_of_an_empty_tensor_and_constant_input():
    empty = torch.histc(torch.empty(0, dtype=torch.int32, device="neuron"), bins=3)
    assert torch.equal(empty.cpu(), torch.zeros(3, dtype=torch.int32))
    const = torch.full((5,), 4, dtype=torch.int64)
    got = torch.histc(const.to("neuron"), bins=3)  # min == max: data range 4..4 -> 3..5
    assert torch.equal(got.cpu(), _histc_oracle(const, 3, 0, 0))


def test_integer_histc_bad_arguments_raise_like_cuda():
    x = torch.arange(4, dtype=torch.int32, device="neuron")
    with pytest.raises(RuntimeError, match="bins must be > 0"):
        torch.histc(x, bins=0)
    with pytest.raises(RuntimeError, match="max must be larger than min"):
        torch.histc(x, bins=3, min=5, max=1)
    with pytest.raises(RuntimeError, match="same device"):
        torch.histc(x, bins=3, out=torch.empty(3, dtype=torch.int32))


def test_float_histc_is_unchanged():
    """Dtypes CPU accepts still go through the fallback: CPU's results bit for bit."""
    x = torch.randn(100)
    assert torch.equal(torch.histc(x.to("neuron"), bins=7).cpu(), torch.histc(x, bins=7))
    _counted("aten::histc", torch.float32)


def test_widened_ops_follow_strict_mode_and_placement(monkeypatch):
    """Placement still comes from the hardware model: a widened op is a device op, so
    strict mode lets it run, while one placed on the host is still refused."""
    f64 = torch.eye(3, dtype=torch.float64).to("neuron")
    with config.override(TORCHNEURON_CPU_FALLBACK="0"):  # reaches the core by itself
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            got = torch.histc(torch.tensor([0, 1, 1], dtype=torch.int32, device="neuron"),
                              bins=2, min=0, max=1)
        assert got.tolist() == [1, 2]
        assert not metrics.fallbacks()
        with pytest.raises(NotImplementedError, match="TORCHNEURON_CPU_FALLBACK=0"):
            torch.trace(f64)


def test_rrelu_half_training_is_seeded_by_the_neuron_generator():
    """rrelu's noise comes from the neuron generator: same seed, CPU's float32 draws."""
    x = torch.randn(64, dtype=torch.float16)
    torch.manual_seed(5)
    expected = F.rrelu(x.float(), training=True).half()
    torch.neuron.manual_seed(5)
    got = F.rrelu(x.to("neuron"), training=True)
    assert torch.equal(got.cpu(), expected)
    torch.neuron.manual_seed(6)
    assert not torch.equal(F.rrelu(x.to("neuron"), training=True).cpu(), expected)


def test_bfloat16_results_round_stochastically_when_asked(monkeypatch):
    """With NEURON_RT_STOCHASTIC_ROUNDING_EN=1 a widened BF16 result is rounded as an
    engine writing BF16 rounds: stochastically, so repeated runs differ."""
    from conftest import run_python
    res = run_python("""
        import torch, torch.nn.functional as F
        x = torch.randn(1, 4, 8, 8, 8).bfloat16()
        ref = F.avg_pool3d(x.float(), 2)
        outs = [F.avg_pool3d(x.to("neuron"), 2).cpu() for _ in range(8)]
        assert all(o.dtype == torch.bfloat16 for o in outs)
        assert any(not torch.equal(outs[0], o) for o in outs[1:]), "no stochastic rounding"
        # within one BF16 ulp of the float32 result (2**-7 relative)
        assert all(((o.float() - ref).abs() <= ref.abs() * 2**-7).all() for o in outs)
        print("ok")
    """, env={"NEURON_RT_STOCHASTIC_ROUNDING_EN": "1"})
    assert res.returncode == 0 and "ok" in res.stdout, res.stderr[-2000:]
