"""Helpers for tests of code that runs on neuron: proving the device did the work, and
comparing against references whose summation order differs.

A test that only compares values cannot tell a neuron result from one a silent
CPU fallback produced. :func:`is_on_neuron` checks where a tensor's bytes live,
and :func:`run_python` runs a snippet in a fresh interpreter (for behaviour fixed
at start-up, such as environment variables read when the device registers).

A neuron result equals CPU's bit for bit on the same machine, so neuron-vs-CPU
tests compare exactly. A result checked against a *different* computation (an
NKI kernel against NumPy, a compiled kernel against eager, NumPy's BLAS against
PyTorch's) sums in another order, and that order changes between CPUs and BLAS
builds (``OPENBLAS_CORETYPE``, ``MKL_CBWR``, ``ATEN_CPU_CAPABILITY``). A fixed
``rtol``/``atol`` is then either too tight (elements near zero after
cancellation fail on another CPU) or too loose to catch a wrong result.
:func:`matmul_tolerance`, :func:`sum_tolerance` and :func:`accumulation_tolerance`
give the worst-case bound for two evaluation orders instead, elementwise and scaled
by the operands; :func:`assert_close_to_reference` checks against it.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
import textwrap
from collections.abc import Sequence
from typing import Any, TypeVar

import numpy as np
import torch

from torchneuron.device._core import is_device_memory

__all__ = ["is_on_neuron", "run_python", "unit_roundoff", "accumulation_tolerance", "matmul_tolerance",
           "sum_tolerance", "assert_close_to_reference"]

ArrayLike = TypeVar("ArrayLike", np.ndarray, torch.Tensor)

# Variables that configure the device at start-up; a child process starts from
# the defaults unless a test sets them.
_DEVICE_ENV = ("NEURON_PLATFORM_TARGET_OVERRIDE", "NEURON_LOGICAL_NC_CONFIG", "NEURON_RT_VISIBLE_CORES",
               "TORCHNEURON_INSTANCE", "TORCH_DEVICE_BACKEND_AUTOLOAD", "TORCHNEURON_DATALESS")


def is_on_neuron(t: torch.Tensor, index: int | None = None) -> bool:
    """True if ``t`` is a neuron tensor (of device ``index``, if given) whose bytes are
    in that device's memory, not a CPU tensor or a view of host memory."""
    if t.device.type != "neuron" or (index is not None and t.device.index != index):
        return False
    return t.numel() == 0 or is_device_memory(t)


def run_python(code: str, env: dict[str, str | None] | None = None,
               timeout: float = 120) -> subprocess.CompletedProcess:
    """Runs ``code`` (dedented) in a fresh interpreter with the device's start-up
    variables cleared; ``env`` entries are then added (``None`` removes one)."""
    full_env = {k: v for k, v in os.environ.items() if k not in _DEVICE_ENV}
    for key, value in (env or {}).items():
        if value is None:
            full_env.pop(key, None)
        else:
            full_env[key] = value
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=full_env,
                          capture_output=True, text=True, timeout=timeout)


# ------------------------------------------------------------------ summation-order tolerances
def unit_roundoff(dtype: Any) -> float:
    """``u = eps / 2`` of a float dtype (torch, NumPy or ml_dtypes): the largest relative
    error of one round-to-nearest operation in that dtype."""
    if isinstance(dtype, torch.dtype):
        return torch.finfo(dtype).eps / 2
    try:
        return float(np.finfo(dtype).eps) / 2
    except ValueError:  # ml_dtypes' bfloat16/float8 are unknown to np.finfo
        import ml_dtypes

        return float(ml_dtypes.finfo(dtype).eps) / 2


def _gamma(n_terms: int, dtype: Any) -> float:
    """Higham's ``gamma_n = n u / (1 - n u)``: the relative error bound of an n-term dot
    product or sum evaluated in *any* order (Accuracy and Stability of Numerical
    Algorithms, 2nd ed., section 3.1), FMA or not."""
    nu = max(int(n_terms), 1) * unit_roundoff(dtype)
    if nu >= 1:
        raise ValueError(f"{n_terms} terms in {dtype}: n*u >= 1, no summation bound exists")
    return nu / (1 - nu)


def _float64(x: Any) -> np.ndarray | torch.Tensor:
    """``x`` as float64 on the host: a CPU tensor for tensors (any device), an ndarray otherwise."""
    if isinstance(x, torch.Tensor):
        return x.detach().to("cpu", torch.float64)
    return np.asarray(x).astype(np.float64)


def _default_accumulation(*operands: Any) -> Any:
    """float32 for inputs narrower than float32 (CPU, BLAS and TensorE all accumulate them in
    fp32), else the widest input dtype."""
    dtypes = [x.dtype for x in operands]
    if all(isinstance(d, torch.dtype) for d in dtypes):
        widest = max(dtypes, key=lambda d: torch.finfo(d).bits)
        return widest if torch.finfo(widest).bits >= 32 else torch.float32
    widest = max((np.dtype(d) for d in dtypes), key=lambda d: d.itemsize)
    return widest if widest.itemsize >= 4 and widest.kind == "f" else np.dtype(np.float32)


def accumulation_tolerance(abs_sum: ArrayLike | float, n_terms: int, dtype: Any) -> ArrayLike | float:
    """Elementwise bound on ``|x - y|`` where ``x`` and ``y`` are two evaluations, in any
    summation orders, of sums of ``n_terms`` products (or terms) accumulated in ``dtype``
    (or one of them exact, e.g. a float64 reference).

    ``abs_sum`` is the same sum over the absolute values of the terms (``|a| @ |b|`` for a
    matmul, ``conv(|x|, |w|)`` for a convolution), computed in float64. The bound is
    ``2 gamma_n abs_sum``: each order is within ``gamma_n abs_sum`` of the exact value. It
    scales with the operands, so elements that cancel to near zero get an absolute
    tolerance while a lost or wrong term (about ``abs_sum / n``) still fails as long as
    ``n^2 u`` is well below 1 (n up to ~1000 in fp32). For terms of one sign ``abs_sum`` is
    ``|sum|``, so ``accumulation_tolerance(1.0, n, dtype)`` is a relative tolerance.

    A result rounded to a narrower dtype after accumulating (a bf16 output) adds
    ``rtol=unit_roundoff(narrow)`` per rounded side (pass it to
    :func:`assert_close_to_reference`).
    """
    return abs_sum * (2 * _gamma(n_terms, dtype))


def matmul_tolerance(a: ArrayLike, b: ArrayLike, dtype: Any | None = None) -> ArrayLike:
    """Elementwise bound on the difference of two evaluations of ``a @ b`` whose summation
    orders differ (another BLAS kernel, blocking, CPU, or a float64 reference).

    ``dtype`` is the accumulation dtype (default: float32 for narrower inputs, as CPU BLAS
    and TensorE accumulate them, else the inputs'). Batched and broadcast ``@`` work; returns
    float64 of ``a``'s kind
    (a CPU tensor or an ndarray). Inputs should be the values actually multiplied (round them
    to bf16/tf32 first if the kernel does).
    """
    if dtype is None:
        dtype = _default_accumulation(a, b)
    a64, b64 = _float64(a), _float64(b)
    return accumulation_tolerance(abs(a64) @ abs(b64), a64.shape[-1], dtype)


def sum_tolerance(x: ArrayLike, axis: int | Sequence[int] | None = None, dtype: Any | None = None,
                  keepdims: bool = False) -> ArrayLike:
    """Elementwise bound on the difference of two evaluations of ``x.sum(axis)`` in different
    orders (pairwise vs sequential vs SIMD lanes, NumPy vs torch vs a kernel); ``dtype``
    is the accumulation dtype (default as :func:`matmul_tolerance`). A mean's bound is this
    divided by the count (plus one rounding of the division)."""
    if dtype is None:
        dtype = _default_accumulation(x)
    x64 = _float64(x)
    axes = tuple(range(x64.ndim)) if axis is None else (
        (axis,) if isinstance(axis, int) else tuple(axis))
    n_terms = math.prod(x64.shape[d] for d in axes)
    if isinstance(x64, torch.Tensor):
        abs_sum = x64.abs().sum(dim=axes, keepdim=keepdims)
    else:
        abs_sum = np.abs(x64).sum(axis=axes, keepdims=keepdims)
    return accumulation_tolerance(abs_sum, n_terms, dtype)


def _host64(x: Any) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        return x.detach().to("cpu", torch.float64).numpy()
    return np.asarray(x).astype(np.float64)


def assert_close_to_reference(actual: Any, expected: Any, atol: Any = 0.0, rtol: float = 0.0,
                              msg: str = "") -> None:
    """Assert ``|actual - expected| <= atol + rtol * |expected|`` elementwise, where ``atol`` may
    be an array (e.g. from :func:`matmul_tolerance`). Shapes must match exactly (no
    broadcasting of the results); NaNs must be in the same places. Tensors (any device,
    any float dtype) and arrays (NumPy or ml_dtypes) are compared in float64. The message
    names how many elements fail and the worst one, with its value, reference and bound."""
    got, ref = _host64(actual), _host64(expected)
    if got.shape != ref.shape:
        raise AssertionError(f"{msg}{': ' if msg else ''}shape {got.shape} != reference shape {ref.shape}")
    with np.errstate(invalid="ignore"):  # inf - inf, 0 * inf: NaN, handled below
        bound = np.broadcast_to(_host64(atol) + rtol * np.abs(ref), ref.shape)
        same = (got == ref) | (np.isnan(got) & np.isnan(ref))  # equal infinities too
        bad = ~same & ~(np.abs(got - ref) <= bound)
        excess = np.where(bad, np.nan_to_num(np.abs(got - ref), nan=np.inf) - bound, -np.inf)
    if bad.any():
        worst = np.unravel_index(int(np.argmax(excess)), ref.shape)
        raise AssertionError(
            f"{msg}{': ' if msg else ''}{int(bad.sum())} of {bad.size} elements differ from the reference "
            f"by more than their bound; worst at {tuple(int(i) for i in worst)}: {float(got[worst])!r} vs "
            f"{float(ref[worst])!r} (|diff| {abs(got[worst] - ref[worst]):.3e} > bound {bound[worst]:.3e})")
