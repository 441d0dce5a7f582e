"""Overlapping views of one neuron storage behave as on CPU.

The fallback runs CPU kernels on CPU aliases of the neuron tensors. Each neuron
storage must map to one CPU storage within an op, or CPU's memory-overlap checks
(out= overlapping an input, in-place on expanded views, index_put_/scatter_ into
views of self, copy_ between overlapping views) and ``is_set_to`` cannot see the
aliasing, and the op silently writes garbage. Each case runs on CPU (the oracle)
and on neuron: both raise the same error, or both give the same result.
"""

import warnings

import pytest
import torch

from conftest import on_device


def _outcome(fn, device):
    """(error type and first words of its message, None) or (None, the result on the CPU)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            result = fn(device)
        except RuntimeError as e:
            return (type(e), str(e).split(".")[0]), None
    if isinstance(result, torch.Tensor):
        return None, result.cpu()
    return None, result


def _base(device):
    return torch.arange(8.0, device=device)


OVERLAPPING = {
    # out= overlapping an input
    "cat_out_over_inputs": lambda d: torch.cat([(a := _base(d))[:2], a[2:4]], out=a[1:5]),
    "add_out_shifted": lambda d: torch.add((a := _base(d))[:4], 1, out=a[1:5]),
    "mul_out_shifted": lambda d: torch.mul((a := _base(d))[2:6], (a[2:6]), out=a[:4]),
    "addcmul_out_shifted": lambda d: torch.addcmul((a := _base(d))[:4], a[:4], a[:4], out=a[2:6]),
    "where_out_shifted": lambda d: torch.where((a := _base(d))[:4] > 2, a[:4], a[4:], out=a[1:5]),
    "neg_out_shifted": lambda d: torch.neg((a := _base(d))[:4], out=a[1:5]),
    # in-place on expanded / internally overlapping views
    "add_inplace_expanded": lambda d: _base(d).expand(3, 8).add_(1),
    "mul_inplace_stride0": lambda d: _base(d)[:1].expand(5).mul_(2),
    # in-place with an overlapping operand
    "add_inplace_shifted_operand": lambda d: (a := _base(d))[1:5].add_(a[:4]),
    # index_put_ / scatter_ / masked ops writing into self from views of self
    "index_put_from_self": lambda d: (a := _base(d)).index_put_(
        (torch.tensor([0, 1], device=d),), a[1:3]),
    "scatter_from_self": lambda d: (a := _base(d)).scatter_(
        0, torch.tensor([0, 1], device=d), a[1:3]),
    "index_copy_from_self": lambda d: (a := _base(d)).index_copy_(
        0, torch.tensor([0, 1], device=d), a[1:3]),
    # copy_ between overlapping views of one storage
    "copy_shifted": lambda d: (a := _base(d))[1:5].copy_(a[0:4]),
}

ACCEPTED_ALIASING = {
    # aliasing CPU allows must keep working
    "copy_same_view": lambda d: ((a := _base(d))[:3].copy_(a[:3]), a)[1],
    # overlapping aliasing CPU accepts: the results must be CPU's
    "copy_between_overlapping_views": lambda d: ((a := _base(d).reshape(2, 4))[0].copy_(
        a.t()[:4, 0]), a)[1],
    "exp_inplace_self_overlapping": lambda d: ((a := _base(d))[:4].as_strided(
        (3, 2), (1, 1)).exp_(), a)[1],
    "masked_scatter_from_self": lambda d: ((a := _base(d)).masked_scatter_(a > 4, a[:8]), a)[1],
    "add_out_is_self": lambda d: torch.add(a := _base(d), 1, out=a),
    "mul_self_by_self_out_self": lambda d: torch.mul(a := _base(d), a, out=a),
    "add_out_disjoint_views": lambda d: (torch.add((a := _base(d))[:4], a[4:], out=a[4:]), a)[1],
    "add_inplace_disjoint": lambda d: ((a := _base(d))[:4].add_(a[4:]), a)[1],
    "copy_disjoint_views": lambda d: ((a := _base(d))[:4].copy_(a[4:]), a)[1],
    "index_put_disjoint": lambda d: ((a := _base(d))[:4].index_put_(
        (torch.tensor([0, 1], device=d),), a[5:7]), a)[1],
    "out_resized_inside_storage": lambda d: (torch.add(
        (a := _base(d))[:3], a[3:6], out=a[6:6]), a)[1],
}


@pytest.mark.parametrize("name", sorted(OVERLAPPING))
def test_overlap_is_refused_as_on_cpu(name):
    fn = OVERLAPPING[name]
    cpu_error, cpu_result = _outcome(fn, "cpu")
    neuron_error, neuron_result = _outcome(fn, "neuron")
    assert cpu_error is not None, f"{name}: CPU accepted it; the case does not test overlap"
    assert neuron_error == cpu_error


@pytest.mark.parametrize("name", sorted(ACCEPTED_ALIASING))
def test_allowed_aliasing_matches_cpu(name):
    fn = ACCEPTED_ALIASING[name]
    cpu_error, cpu_result = _outcome(fn, "cpu")
    neuron_error, neuron_result = _outcome(fn, "neuron")
    assert cpu_error is None and neuron_error is None, (cpu_error, neuron_error)
    torch.testing.assert_close(neuron_result, cpu_result, rtol=0, atol=0)


def test_overlap_error_leaves_the_tensor_intact():
    a = _base("neuron")
    with pytest.raises(RuntimeError, match="single memory location"):
        torch.cat([a[:2], a[2:4]], out=a[1:5])
    torch.testing.assert_close(a.cpu(), _base("cpu"), rtol=0, atol=0)
    assert on_device(a)


def test_is_set_to_sees_one_storage():
    a = _base("neuron")
    assert a[:3].is_set_to(a[:3])
    assert not a[:3].is_set_to(a[1:4])
    assert not a.is_set_to(a.clone())
    b = torch.empty(0, device="neuron").set_(a)
    assert b.is_set_to(a)


def test_out_resize_moves_every_view_of_the_storage():
    """A resize that reallocates an out= storage gives every neuron view of it the new memory,
    as CPU does (the views share one StorageImpl)."""
    def run(device):
        a = torch.zeros(2, device=device)
        view = a[:0]
        torch.add(torch.ones(4, device=device), 1, out=view)
        return a.untyped_storage().nbytes(), view.cpu(), a.cpu()

    cpu_bytes, cpu_view, cpu_a = run("cpu")
    neuron_bytes, neuron_view, neuron_a = run("neuron")
    assert neuron_bytes == cpu_bytes
    torch.testing.assert_close(neuron_view, cpu_view, rtol=0, atol=0)
    torch.testing.assert_close(neuron_a, cpu_a, rtol=0, atol=0)
