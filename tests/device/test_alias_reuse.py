"""A neuron tensor lends the same CPU alias object to every op it takes part in.

Ops run their CPU kernel on CPU tensors over the neuron tensors' memory. Those
CPU tensor objects are reused from call to call (for speed), so these tests use
each neuron tensor many times and change it between uses: every result must
still equal CPU's, overlap must still be detected, and no reused alias may keep
device memory alive or be shared by two calls at once.
"""

import gc
import threading

import pytest
import torch

from conftest import on_device


def _both(build):
    """Runs `build(device)` on CPU and on neuron, returning both results."""
    return build("cpu"), build("neuron")


def _equal(cpu, neuron):
    assert on_device(neuron)
    torch.testing.assert_close(neuron.cpu(), cpu, rtol=0, atol=0)


def test_reused_tensor_after_each_kind_of_metadata_change_matches_cpu():
    def run(device):
        g = torch.Generator().manual_seed(0)
        a = torch.randn(6, 4, generator=g).to(device)
        b = torch.randn(6, 4, generator=g).to(device)
        outs = [a + b, a * b]  # warm: both tensors have lent their alias
        a.resize_(4, 6)  # same storage, other sizes
        outs.append(a + 1)
        a.as_strided_((3, 3), (1, 3), 2)  # other strides and offset
        outs.append(a * 2)
        a.set_(b.storage(), 4, (5, 4), (4, 1))  # another storage
        outs.append(a - 1)
        a.set_(torch.arange(10.0, device=device))  # a fresh storage
        outs.append(a.sqrt())
        outs.append(b.t() @ b)  # b's view changed by none of this
        c = a.to(torch.float64)  # dtype of a new tensor; a unchanged
        outs.append(c + c)
        return outs

    for cpu, neuron in zip(*_both(run)):
        _equal(cpu, neuron)


def test_conj_and_neg_views_of_a_reused_tensor():
    def run(device):
        z = torch.complex(torch.arange(4.0), torch.arange(4.0) + 1).to(device)
        outs = [z * 2]  # warm
        outs.append(z.conj() * 2)  # a conj view: another TensorImpl, its own alias
        outs.append(z._neg_view() + 1)
        outs.append(z * 2)  # the plain tensor again: no conj bit left on its alias
        return outs

    for cpu, neuron in zip(*_both(run)):
        _equal(cpu.resolve_conj().resolve_neg(), neuron.resolve_conj().resolve_neg())


def _error_or_result(fn, device):
    try:
        return fn(device)
    except RuntimeError as e:
        return str(e).split(".")[0]


@pytest.mark.parametrize("warm_calls", [0, 1, 3])
def test_overlap_detected_with_warm_aliases(warm_calls):
    def run(device):
        a = torch.arange(8.0, device=device)
        x, y = a[1:5], a[0:4]
        for _ in range(warm_calls):  # each view has lent its alias before
            x + y
        return _error_or_result(lambda _: x.add_(y), device)

    cpu, neuron = _both(run)
    assert isinstance(cpu, str) and "single memory location" in cpu
    assert neuron == cpu


def test_in_place_through_two_warm_views_of_one_storage_matches_cpu():
    def run(device):
        a = torch.arange(12.0, device=device)
        lo, hi = a[:6], a[6:]
        for _ in range(3):
            lo.add_(hi)  # disjoint views of one storage, both warm
            hi.mul_(lo)
        return a

    _equal(*_both(run))


def test_a_reused_alias_keeps_no_device_memory_alive():
    torch.neuron.synchronize()
    gc.collect()
    a = torch.ones(1 << 18, device="neuron")  # 1 MiB
    b = a + a
    b = a * a  # a's alias lent twice
    before = torch.neuron.memory_allocated()
    a.set_(torch.empty(0, device="neuron"))  # a lets go of its 1 MiB storage
    assert torch.neuron.memory_allocated() == before - (1 << 20)
    del b
    assert torch.neuron.memory_allocated() == before - (2 << 20)


def test_detached_copy_and_original_change_independently():
    def run(device):
        t = torch.arange(6.0, device=device)
        outs = [t + 1]
        d = t.detach()
        outs.append(d + 1)
        d.resize_(2, 3)
        outs += [d * 2, t * 2]  # d's new shape must not leak into t's alias
        return outs

    for cpu, neuron in zip(*_both(run)):
        _equal(cpu, neuron)


def test_threads_sharing_weights_get_correct_results():
    g = torch.Generator().manual_seed(1)
    w_cpu = torch.randn(32, 32, generator=g)
    xs_cpu = [torch.randn(8, 32, generator=g) for _ in range(4)]
    w = w_cpu.to("neuron")
    xs = [x.to("neuron") for x in xs_cpu]
    errors = []

    def worker(i):
        try:
            for _ in range(200):
                y = torch.relu(xs[i] @ w + w[0])  # every thread borrows w's alias
                torch.testing.assert_close(y.cpu(), torch.relu(xs_cpu[i] @ w_cpu + w_cpu[0]),
                                           rtol=0, atol=0)
        except Exception as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]


def test_tensor_used_inside_and_outside_inference_mode_matches_cpu():
    def run(device):
        w = torch.arange(16.0, device=device).view(4, 4).requires_grad_()
        with torch.inference_mode():
            y0 = w.detach() @ w.detach()  # aliases lent inside inference mode
            y1 = w @ w
        loss = (w * w).sum()  # and outside, with autograd
        loss.backward()
        with torch.no_grad():
            w.add_(1)  # an in-place write through the reused alias
        return [y0, y1, loss.detach(), w.grad, w.detach()]

    for cpu, neuron in zip(*_both(run)):
        _equal(cpu, neuron)


def test_fallback_ops_lend_aliases_of_temporaries_safely():
    # torch.fft.hfft runs through the boxed fallback (complex), whose composite makes
    # temporary neuron tensors (a conj view) held last by the call itself: their cached
    # aliases must be given back before they die (this crashed with heap corruption when
    # the call's arguments were dropped before its aliases).
    def run(device):
        g = torch.Generator().manual_seed(0)
        z = torch.complex(torch.randn(5, 8, generator=g), torch.randn(5, 8, generator=g)).to(device)
        outs = []
        for n in (None, 10, 16):
            for _ in range(3):
                outs.append(torch.fft.hfft(z, n=n))
                outs.append(torch.fft.ihfft(outs[-1]))
        gc.collect()
        return outs

    for cpu, neuron in zip(*_both(run)):
        _equal(cpu, neuron)


def test_overlap_detected_between_views_warmed_in_separate_calls():
    def run(device):
        a = torch.arange(8.0, device=device)
        x, y = a[1:5], a[0:4]
        x + 1  # each view's alias (and the CPU storage it keeps) warmed on its own
        y + 1
        return _error_or_result(lambda _: x.add_(y), device)

    cpu, neuron = _both(run)
    assert isinstance(cpu, str) and "single memory location" in cpu
    assert neuron == cpu


def test_storage_freed_and_regrown_under_a_warm_alias():
    """FSDP frees an unsharded parameter with storage.resize_(0) and regrows it before
    use: the warm alias must neither keep the freed bytes nor read the old ones."""
    torch.neuron.synchronize()
    gc.collect()
    a = torch.ones(1 << 18, device="neuron")  # 1 MiB
    (a + a).sum()  # warm
    before = torch.neuron.memory_allocated()
    a.untyped_storage().resize_(0)
    assert torch.neuron.memory_allocated() == before - (1 << 20)
    a.untyped_storage().resize_(1 << 20)
    a.copy_(torch.arange(1 << 18, dtype=torch.float32))
    assert torch.equal((a * 2).cpu(), torch.arange(1 << 18, dtype=torch.float32) * 2)


def test_out_resized_through_a_warm_alias_matches_cpu():
    def run(device):
        x = torch.arange(6.0, device=device)
        out = torch.empty(2, device=device)
        torch.add(x[:2], 1, out=out)  # warm, right size
        torch.add(x, 1, out=out)  # resized by the kernel: new memory
        return [out.clone(), out * 2, x + out]

    for cpu, neuron in zip(*_both(run)):
        _equal(cpu, neuron)
