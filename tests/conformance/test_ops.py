"""PyTorch's OpInfo database on `neuron`, with CPU as the oracle.

The pattern of PyTorch's ``test_ops.py::TestCommon::test_compare_cpu``, which
out-of-tree devices use: each op's sample inputs are built on CPU, copied to
neuron, and the op runs on both; results must agree to ``atol=rtol=1e-3``
(neuron runs CPU's kernels, so in practice they are equal). Per op and dtype
there are five checks: forward on reference inputs, forward on non-contiguous
inputs, gradients (float32, ops with autograd), ``out=`` and the in-place
variant. Random ops are compared too: seeding both devices with the same seed
gives the same stream.

The default run takes a representative slice (``SLICE``: every op family,
gradients included); ``-m conformance`` runs every op in ``op_db``.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from torch.testing._internal.common_methods_invocations import op_db
from torch.testing._internal.opinfo.core import OpInfo, SampleInput
from torch.utils._pytree import tree_flatten, tree_map

from expected_failures import OPS as EXPECTED_FAILURES

ATOL = RTOL = 1e-3
DTYPES = (torch.float32, torch.bfloat16, torch.int64, torch.bool)
CHECKS = ("forward", "noncontiguous", "grad", "out", "inplace")
MAX_SAMPLES = 8  # per check; reference inputs can run to hundreds
# Ops returning uninitialised memory: only their metadata can be compared.
UNINITIALIZED = {"empty", "empty_like", "new_empty", "new_empty_strided", "empty_strided",
                 "empty_permuted"}

# The default run's slice: a few ops from every family (unary and binary
# ufuncs, reductions, shape and indexing ops, linalg, fft, nn.functional,
# random, sorting, scans, special functions, factories), with gradients.
SLICE = {
    "abs", "exp", "sigmoid", "add", "mul", "div.no_rounding_mode", "pow", "where",
    "sum", "mean", "amax", "std", "argmax", "cumsum", "sort", "topk",
    "cat", "stack", "reshape", "transpose", "narrow", "index_select", "index_put",
    "gather", "scatter_add", "masked_fill", "nonzero", "unique",
    "matmul", "mm", "addmm", "bmm", "einsum", "linalg.norm", "linalg.solve",
    "fft.fft", "nn.functional.conv2d", "nn.functional.layer_norm", "softmax",
    "nn.functional.cross_entropy", "nn.functional.embedding", "nn.functional.gelu",
    "nn.functional.scaled_dot_product_attention", "nn.functional.max_pool2d",
    "nn.functional.interpolate.bilinear", "nn.functional.dropout", "bernoulli",
    "randn_like", "special.erfcx", "full_like", "arange", "clamp", "lerp", "baddbmm",
}


def op_id(op: OpInfo) -> str:
    return f"{op.name}.{op.variant_test_name}" if op.variant_test_name else op.name


def _cases(ops: list[OpInfo], slice_only: bool) -> Iterator[Any]:
    for op in ops:
        name = op_id(op)
        if slice_only and name not in SLICE:
            continue
        supported = op.supported_dtypes("cpu")
        for dtype, check in itertools.product(DTYPES, CHECKS):
            if dtype not in supported or not _applies(op, dtype, check):
                continue
            reason = (EXPECTED_FAILURES.get((name, check, str(dtype)[6:]))
                      or EXPECTED_FAILURES.get((name, check)) or EXPECTED_FAILURES.get((name, "*")))
            marks = [pytest.mark.xfail(reason=reason, strict=True)] if reason else []
            if not slice_only:
                marks.append(pytest.mark.conformance)
            yield pytest.param(op, dtype, check, id=f"{name}-{str(dtype)[6:]}-{check}", marks=marks)


def _applies(op: OpInfo, dtype: torch.dtype, check: str) -> bool:
    if check == "grad":
        return (dtype == torch.float32 and op.supports_autograd
                and dtype in op.supported_backward_dtypes("cpu"))
    if check == "out":
        return op.supports_out
    if check == "inplace":
        return op.inplace_variant is not None
    return True


# ---- moving samples between devices ------------------------------------------


def _leaf_on(device: str) -> Callable[[Any], Any]:
    """Copies a tensor to `device` as a fresh leaf (keeping requires_grad)."""
    def move(t: Any) -> Any:
        if not isinstance(t, torch.Tensor):
            return t
        out = t.detach().to(device, copy=True)
        return out.requires_grad_() if t.requires_grad else out
    return move


_to_neuron = _leaf_on("neuron")


def _sample_on(sample: SampleInput, device: str) -> SampleInput:
    """The sample with fresh leaf copies of its tensors on `device` (both devices get
    identically built inputs), and a factory's ``device=`` set to it."""
    moved = sample.transform(_leaf_on(device))
    if "device" in moved.kwargs:
        moved.kwargs["device"] = device
    return moved


def _to_cpu(value: Any) -> Any:
    return tree_map(lambda t: t.detach().cpu() if isinstance(t, torch.Tensor) else t, value)


def _tensors(value: Any) -> list[torch.Tensor]:
    return [t for t in tree_flatten(value)[0] if isinstance(t, torch.Tensor)]


def _samples(op: OpInfo, dtype: torch.dtype, requires_grad: bool = False) -> list[SampleInput]:
    """Reference inputs (the larger set) for float32 forward checks, else sample inputs."""
    torch.manual_seed(0)
    use_reference = dtype == torch.float32 and not requires_grad
    maker = op.reference_inputs if use_reference else op.sample_inputs
    return list(itertools.islice(maker("cpu", dtype, requires_grad=requires_grad), MAX_SAMPLES))


# ---- running both devices -------------------------------------------------------


def _run(fn: Callable, sample: SampleInput, seed: int = 1234) -> tuple[Any, BaseException | None]:
    """Runs fn on the sample with a fixed seed; returns (result, exception)."""
    torch.manual_seed(seed)
    try:
        return fn(sample.input, *sample.args, **sample.kwargs), None
    except Exception as e:  # compared against CPU's behaviour below
        return None, e


def _explicit_device(sample: SampleInput) -> bool:
    """True if the sample names a device positionally (``x.to("cpu", ...)``)."""
    return any(isinstance(a, (str, torch.device)) and str(a).split(":")[0] in ("cpu", "neuron")
               for a in sample.args)


def _assert_same(actual: Any, expected: Any, what: str, *, values: bool = True,
                 on_neuron: bool = True) -> None:
    """neuron's result equals CPU's (values, or only metadata), and lives on neuron."""
    for t in _tensors(actual):
        assert not on_neuron or t.device.type == "neuron", f"{what}: a result is on {t.device}, not neuron"
    if not values:
        got = [(t.shape, t.dtype, t.stride()) for t in _tensors(actual)]
        want = [(t.shape, t.dtype, t.stride()) for t in _tensors(expected)]
        assert got == want, f"{what}: shape/dtype/stride {got} != CPU's {want}"
        return
    torch.testing.assert_close(
        _to_cpu(actual), expected, atol=ATOL, rtol=RTOL, equal_nan=True,
        check_device=False, msg=lambda m: f"{what}: {m}")


def _compare(fn_cpu: Callable, fn_neuron: Callable, sample: SampleInput, what: str,
             prepare: Callable[[SampleInput], SampleInput] = lambda s: s, values: bool = True) -> bool:
    """Runs a sample on both devices; False if CPU rejects it (neuron must too)."""
    expected, cpu_error = _run(fn_cpu, prepare(_sample_on(sample, "cpu")))
    actual, neuron_error = _run(fn_neuron, prepare(_sample_on(sample, "neuron")))
    if cpu_error is not None:
        assert neuron_error is not None and isinstance(neuron_error, type(cpu_error)), (
            f"{what}: CPU raised {type(cpu_error).__name__}({cpu_error}) but neuron "
            f"{'returned normally' if neuron_error is None else f'raised {neuron_error!r}'}")
        return False
    if neuron_error is not None:
        raise AssertionError(f"{what}: neuron raised but CPU did not") from neuron_error
    _assert_same(actual, _to_cpu(expected), what, values=values,
                 on_neuron=not _explicit_device(sample))
    return True


def _check_forward(op: OpInfo, dtype: torch.dtype, noncontiguous: bool) -> int:
    """Forward on both devices; `noncontiguous` re-lays each device's inputs out
    with gaps (after the copy, which would make them contiguous again)."""
    prepare = (lambda s: s.noncontiguous()) if noncontiguous else (lambda s: s)
    ran = 0
    for i, sample in enumerate(_samples(op, dtype)):
        ran += _compare(op, op, sample, f"{op_id(op)} sample {i} ({sample.summary()})", prepare,
                        values=op.name not in UNINITIALIZED)
    return ran


def _differentiable_outputs(result: Any, sample: SampleInput) -> list[torch.Tensor]:
    out = sample.output_process_fn_grad(result)
    return [t for t in _tensors(out) if t.requires_grad and t.is_floating_point()]


def _grads(op: OpInfo, sample: SampleInput) -> tuple[Any, BaseException | None]:
    """Forward then backward with grad_outputs drawn from a fixed seed."""
    result, error = _run(op, sample)
    if error is not None:
        return None, error
    outputs = _differentiable_outputs(result, sample)
    inputs = [t for t in _tensors((sample.input, sample.args, sample.kwargs)) if t.requires_grad]
    if not outputs or not inputs:
        return [], None
    gen = torch.Generator().manual_seed(7)
    grad_outputs = [torch.randn(o.shape, generator=gen, dtype=o.dtype).to(o.device) for o in outputs]
    try:
        return torch.autograd.grad(outputs, inputs, grad_outputs, allow_unused=True), None
    except Exception as e:
        return None, e


def _check_grad(op: OpInfo, dtype: torch.dtype) -> int:
    ran = 0
    for i, sample in enumerate(_samples(op, dtype, requires_grad=True)):
        what = f"{op_id(op)} grad of sample {i} ({sample.summary()})"
        expected, cpu_error = _grads(op, _sample_on(sample, "cpu"))
        actual, neuron_error = _grads(op, _sample_on(sample, "neuron"))
        if cpu_error is not None:
            assert isinstance(neuron_error, type(cpu_error)), f"{what}: CPU raised {cpu_error!r}, neuron {neuron_error!r}"
            continue
        if neuron_error is not None:
            raise AssertionError(f"{what}: neuron raised but CPU did not") from neuron_error
        _assert_same(actual, _to_cpu(expected), what)
        ran += 1
    return ran


def _check_out(op: OpInfo, dtype: torch.dtype) -> int:
    ran = 0
    for i, sample in enumerate(_samples(op, dtype)[:3]):
        expected, cpu_error = _run(op, sample)
        if cpu_error is not None or not _tensors(expected):
            continue
        what = f"{op_id(op)} out= sample {i} ({sample.summary()})"
        # Wrong-sized out tensors, as PyTorch's test_out does: the op must resize them.
        out_cpu = tree_map(lambda t: t.new_empty(0) if isinstance(t, torch.Tensor) else t, expected)
        out_neuron = tree_map(_to_neuron, out_cpu)
        s_neuron = _sample_on(sample, "neuron")
        ref, cpu_error = _run(lambda x, *a, **k: op(x, *a, **k, out=out_cpu), _sample_on(sample, "cpu"))
        got, neuron_error = _run(lambda x, *a, **k: op(x, *a, **k, out=out_neuron), s_neuron)
        if cpu_error is not None:
            assert isinstance(neuron_error, type(cpu_error)), f"{what}: CPU raised {cpu_error!r}, neuron {neuron_error!r}"
            continue
        if neuron_error is not None:
            raise AssertionError(f"{what}: neuron raised but CPU did not") from neuron_error
        _assert_same(out_neuron, _to_cpu(out_cpu), what, values=op.name not in UNINITIALIZED)
        for got_t, out_t in zip(_tensors(got), _tensors(out_neuron)):
            assert got_t.data_ptr() == out_t.data_ptr(), f"{what}: result is not the out= tensor"
        ran += 1
    return ran


def _check_inplace(op: OpInfo, dtype: torch.dtype) -> int:
    ran = 0
    for i, sample in enumerate(_samples(op, dtype)):
        if not isinstance(sample.input, torch.Tensor):
            continue
        what = f"{op_id(op)} in-place sample {i} ({sample.summary()})"

        def clone_input(s: SampleInput) -> SampleInput:
            return SampleInput(s.input.clone(), args=s.args, kwargs=s.kwargs)

        def inplace(x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
            result = op.inplace_variant(x, *args, **kwargs)
            assert result is x, "the in-place variant did not return its input"
            return x

        ran += _compare(inplace, inplace, sample, what, prepare=clone_input)
    return ran


_CHECK_FUNCTIONS = {
    "forward": lambda op, dtype: _check_forward(op, dtype, noncontiguous=False),
    "noncontiguous": lambda op, dtype: _check_forward(op, dtype, noncontiguous=True),
    "grad": _check_grad,
    "out": _check_out,
    "inplace": _check_inplace,
}


def _run_check(op: OpInfo, dtype: torch.dtype, check: str) -> None:
    ran = _CHECK_FUNCTIONS[check](op, dtype)
    if ran == 0:
        pytest.skip(f"no sample of {op_id(op)} is valid for {check} on CPU")


@pytest.mark.parametrize("op, dtype, check", list(_cases(op_db, slice_only=True)))
def test_op_slice(op: OpInfo, dtype: torch.dtype, check: str) -> None:
    _run_check(op, dtype, check)


@pytest.mark.parametrize("op, dtype, check", list(_cases(op_db, slice_only=False)))
def test_op(op: OpInfo, dtype: torch.dtype, check: str) -> None:
    _run_check(op, dtype, check)


def test_slice_covers_every_family() -> None:
    names = {op_id(op) for op in op_db}
    assert SLICE <= names, f"slice names not in op_db: {sorted(SLICE - names)}"
    families = {type(op).__name__ for op in op_db if op_id(op) in SLICE}
    assert families >= {"UnaryUfuncInfo", "BinaryUfuncInfo", "ReductionOpInfo", "SpectralFuncInfo"}
