"""torchneuron.testing's summation-order bounds: a reorder passes, a wrong result fails.

The bounds replace fixed rtol/atol where a result is checked against a computation that
sums in another order (NumPy vs the NKI simulator, torch vs NumPy, compiled vs eager):
that order changes with the CPU and BLAS build, so a fixed tolerance either fails on
another machine (elements that cancel to near zero) or is too loose to catch an error.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
import torch

from torchneuron.testing import (accumulation_tolerance, assert_close_to_reference, is_on_neuron,
                                 matmul_tolerance, sum_tolerance, unit_roundoff)

RNG = np.random.default_rng(0)


def _chunked_reverse(a: np.ndarray, b: np.ndarray, step: int = 7) -> np.ndarray:
    """a @ b in fp32, accumulated chunk by chunk from the last K to the first: a summation
    order no BLAS uses, so every element rounds differently from np.matmul's."""
    out = np.zeros((a.shape[0], b.shape[1]), np.float32)
    for s in reversed(range(0, a.shape[1], step)):
        out += a[:, s:s + step] @ b[s:s + step]
    return out


def _operands(m=64, k=128, n=512, dtype=np.float32):
    return RNG.uniform(-2, 2, (m, k)).astype(dtype), RNG.uniform(-2, 2, (k, n)).astype(dtype)


def test_unit_roundoff_of_torch_numpy_and_ml_dtypes():
    assert unit_roundoff(torch.float32) == unit_roundoff(np.float32) == 2.0 ** -24
    assert unit_roundoff(torch.bfloat16) == unit_roundoff(ml_dtypes.bfloat16) == 2.0 ** -8
    assert unit_roundoff(np.float64) == 2.0 ** -53


def test_other_summation_orders_pass_where_a_fixed_rtol_fails():
    a, b = _operands()
    blas = a @ b
    tol = matmul_tolerance(a, b)
    others = {"float64 then rounded": (a.astype(np.float64) @ b).astype(np.float32),
              "chunked, reversed": _chunked_reverse(a, b),
              "torch": (torch.from_numpy(a) @ torch.from_numpy(b)).numpy()}
    for name, other in others.items():
        assert_close_to_reference(blas, other, tol, msg=name)
        assert_close_to_reference(other, blas, tol, msg=name)
    # the old check: some element that cancels to near zero is off by more than rtol=1e-5
    with pytest.raises(AssertionError):
        np.testing.assert_allclose(_chunked_reverse(a, b), blas, rtol=1e-5)
    # the bound scales with the operands, not with the result: larger where terms cancel
    assert np.all(tol > 0) and tol.shape == blas.shape
    np.testing.assert_allclose(tol, 2 * 128 * 2.0 ** -24 / (1 - 128 * 2.0 ** -24)
                               * (np.abs(a.astype(np.float64)) @ np.abs(b)))


def test_a_dropped_term_or_a_wrong_input_fails():
    a, b = _operands()
    ref = a.astype(np.float64) @ b
    tol = matmul_tolerance(a, b)
    # one element loses one term of ordinary size (the median over k of |a_ik b_kj|)
    i, j = 5, 17
    terms = a[i].astype(np.float64) * b[:, j]
    k = int(np.argsort(np.abs(terms))[len(terms) // 2])
    wrong = ref.copy()
    wrong[i, j] -= terms[k]
    with pytest.raises(AssertionError, match=r"1 of 32768 elements .* worst at \(5, 17\)"):
        assert_close_to_reference(wrong, ref, tol)
    # for K = 128, losing any one term of median size is caught in almost every element
    median_term = np.median(np.abs(a[:, :, None].astype(np.float64) * b[None]), axis=1)
    assert (median_term > tol).mean() > 0.95
    # an input rounded to bf16 (a wrong dtype on the way) is far outside the fp32 bound
    rounded = a.astype(ml_dtypes.bfloat16).astype(np.float32) @ b
    with pytest.raises(AssertionError):
        assert_close_to_reference(rounded, ref, tol)


def test_bf16_inputs_accumulate_in_fp32_by_default():
    a, b = _operands(16, 64, 32, ml_dtypes.bfloat16)
    tol = matmul_tolerance(a, b)
    exact = a.astype(np.float64) @ b.astype(np.float64)
    assert np.allclose(tol, accumulation_tolerance(np.abs(a.astype(np.float64)) @ np.abs(b.astype(np.float64)),
                                                   64, np.float32))
    assert_close_to_reference(a.astype(np.float32) @ b.astype(np.float32), exact, tol)
    # a bf16 result adds one bf16 rounding, passed as rtol
    assert_close_to_reference((a.astype(np.float32) @ b.astype(np.float32)).astype(ml_dtypes.bfloat16),
                              exact, tol * (1 + 2 ** -8), rtol=unit_roundoff(ml_dtypes.bfloat16))
    with pytest.raises(AssertionError):  # without that rtol the bf16 rounding is caught
        assert_close_to_reference((a.astype(np.float32) @ b.astype(np.float32)).astype(ml_dtypes.bfloat16),
                                  exact, tol)


def test_sum_tolerance_passes_reorders_and_catches_a_lost_element():
    x = RNG.standard_normal((32, 1000)).astype(np.float32)
    exact = x.astype(np.float64).sum(axis=1)
    tol = sum_tolerance(x, 1)
    pairwise, sequential = x.sum(axis=1), np.zeros(32, np.float32)
    for col in x.T[::-1]:
        sequential += col
    assert_close_to_reference(pairwise, exact, tol)
    assert_close_to_reference(sequential, exact, tol)
    assert_close_to_reference(pairwise, sequential, tol)
    lost = exact.copy()
    lost[3] -= x[3, 500]
    assert abs(x[3, 500]) > tol[3]
    with pytest.raises(AssertionError, match="1 of 32 elements"):
        assert_close_to_reference(lost, exact, tol)
    assert sum_tolerance(x, (0, 1)).shape == () and sum_tolerance(x, 0, keepdims=True).shape == (1, 1000)


def test_tensors_on_any_device_and_mixed_kinds():
    a, b = torch.randn(8, 32), torch.randn(32, 8)
    an, bn = a.to("neuron"), b.to("neuron")
    out = an @ bn
    assert is_on_neuron(out)
    tol = matmul_tolerance(an, bn)
    assert isinstance(tol, torch.Tensor) and tol.dtype == torch.float64 and tol.device.type == "cpu"
    assert_close_to_reference(out, a.numpy().astype(np.float64) @ b.numpy(), tol)
    assert isinstance(sum_tolerance(an, 1), torch.Tensor)
    with pytest.raises(AssertionError):
        assert_close_to_reference(out + 1e-3, a.double() @ b.double(), tol)


def test_assert_close_to_reference_shapes_nans_and_infinities():
    ref = np.array([1.0, np.nan, np.inf, -np.inf])
    assert_close_to_reference(ref.copy(), ref)
    with pytest.raises(AssertionError, match="1 of 4"):
        assert_close_to_reference(np.array([1.0, 0.0, np.inf, -np.inf]), ref)
    with pytest.raises(AssertionError, match="1 of 4"):
        assert_close_to_reference(np.array([1.0, np.nan, -np.inf, -np.inf]), ref, atol=1.0)
    with pytest.raises(AssertionError, match=r"shape \(3,\) != reference shape \(4,\)"):
        assert_close_to_reference(ref[:3], ref)
    assert_close_to_reference(np.array([1.5]), np.array([1.0]), atol=np.array([0.5]))


def test_no_bound_exists_when_n_times_u_reaches_one():
    with pytest.raises(ValueError, match="n\\*u >= 1"):
        accumulation_tolerance(1.0, 2 ** 8, torch.bfloat16)
