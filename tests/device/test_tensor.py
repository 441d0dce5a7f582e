"""Tensor semantics on neuron are CPU's: metadata, aliasing, in-place, out=, copies, errors."""

import warnings

import pytest
import torch
from torchneuron.device.fallback import NeuronCPUFallbackWarning

from conftest import on_device


VIEW_BUG = ("BUG: view ops with backend kernels (unfold, view_as_real/complex, .real/.imag) raise "
            "'Cannot set version_counter for inference tensor'")


def pair(*shape, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    cpu = torch.randn(*shape, generator=g).to(dtype)
    return cpu, cpu.to("neuron")


def same(neuron_t, cpu_t):
    """Exact equality of values and metadata with the CPU oracle."""
    assert neuron_t.device.type == "neuron"
    assert neuron_t.dtype == cpu_t.dtype
    assert neuron_t.shape == cpu_t.shape
    assert neuron_t.stride() == cpu_t.stride()
    assert neuron_t.storage_offset() == cpu_t.storage_offset()
    assert torch.equal(neuron_t.cpu(), cpu_t)


def test_big_add_result_lives_in_device_memory():
    c1, n1 = pair(16 * 2**20)
    c2, n2 = pair(16 * 2**20, seed=1)
    out = n1 + n2
    assert on_device(out, 0)
    assert torch.equal(out.cpu(), c1 + c2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16,
                                   torch.int64, torch.int32, torch.uint8, torch.bool])
def test_elementwise_ops_equal_cpu_for_dtype(dtype):
    c, n = pair(5, 7, dtype=dtype)
    if dtype == torch.bool:
        results = [(c & c.logical_not(), n & n.logical_not()), (c | c, n | n)]
    elif dtype.is_floating_point:
        results = [(c * 3 - c.exp(), n * 3 - n.exp()), (c.sum(1), n.sum(1)),
                   (c.softmax(-1), n.softmax(-1))]
    else:
        results = [(c * 3 + c, n * 3 + n), (c.sum(1), n.sum(1)), (c.max(0).values, n.max(0).values)]
    for cr, nr in results:
        assert on_device(nr, 0)
        same(nr, cr)


def test_matmul_reductions_indexing_equal_cpu():
    c, n = pair(8, 6)
    cw, nw = pair(6, 4, seed=2)
    same(n @ nw, c @ cw)
    same(n.mean(0), c.mean(0))
    same(n.argmax(1), c.argmax(1))
    same(n[n > 0], c[c > 0])
    idx = torch.tensor([3, 0, 5])
    same(n[idx], c[idx])
    same(n[idx.to("neuron")], c[idx])
    same(torch.cat([n, n], 1), torch.cat([c, c], 1))
    vals_n, idx_n = n.sort(1)
    vals_c, idx_c = c.sort(1)
    same(vals_n, vals_c)
    same(idx_n, idx_c)
    same(torch.where(n > 0, n, nw.sum()), torch.where(c > 0, c, cw.sum()))


@pytest.mark.parametrize("view", [
    lambda t: t.t(),
    lambda t: t[1:, ::2],
    lambda t: t.view(4, 6),
    lambda t: t.reshape(2, 12),
    lambda t: t.narrow(1, 1, 3),
    lambda t: t.unsqueeze(0).expand(3, 6, 4),
    lambda t: t.as_strided((3, 3), (2, 5), 1),
    lambda t: t.diagonal(),
    lambda t: t.select(0, 2),
    pytest.param(lambda t: t.unfold(1, 2, 1), id="unfold"),
    pytest.param(lambda t: torch.view_as_complex(t.view(12, 2)), id="view_as_complex"),
    lambda t: t.permute(1, 0),
    lambda t: t.view(torch.int32),
    lambda t: t.unbind(0)[1],
    lambda t: t.split(2, 0)[1],
    lambda t: t.chunk(2, 1)[1],
    lambda t: t.movedim(0, 1),
    lambda t: t.flatten(),
])
def test_views_have_cpu_metadata_and_alias_base(view):
    c, n = pair(6, 4)
    vc, vn = view(c), view(n)
    same(vn, vc)
    assert (vn._base is n) == (vc._base is c)
    assert vn.untyped_storage().data_ptr() == n.untyped_storage().data_ptr()
    assert vn.data_ptr() == n.data_ptr() + (vc.data_ptr() - c.data_ptr())
    assert on_device(vn, 0)
    # write through the view shows in the base
    vn.fill_(7) if not vn.dtype.is_floating_point else vn.fill_(7.5)
    vc.fill_(7) if not vc.dtype.is_floating_point else vc.fill_(7.5)
    assert torch.equal(n.cpu(), c)
    # write to the base shows in the view
    n.mul_(2)
    c.mul_(2)
    assert torch.equal(vn.cpu(), vc)


def test_view_ranges_lie_inside_base_storage():
    c, n = pair(10, 10)
    v = n[2:5, 3:7]
    start = n.untyped_storage().data_ptr()
    end = start + n.untyped_storage().nbytes()
    assert start <= v.data_ptr() < end
    last = v.data_ptr() + ((v.size(0) - 1) * v.stride(0) + (v.size(1) - 1) * v.stride(1)) * v.element_size()
    assert last < end


def test_in_place_ops_modify_same_memory():
    c, n = pair(4, 5)
    ptr = n.data_ptr()
    for op in (lambda t: t.add_(1), lambda t: t.mul_(t), lambda t: t.clamp_(-0.5, 0.5),
               lambda t: t.exp_(), lambda t: t.copy_(t.flip(0)), lambda t: t.zero_().add_(3)):
        op(c)
        r = op(n)
        assert r is n
        assert n.data_ptr() == ptr
        assert torch.equal(n.cpu(), c)
    assert on_device(n)


def test_in_place_on_non_contiguous_view():
    c, n = pair(6, 6)
    c[:, ::2].add_(10)
    n[:, ::2].add_(10)
    assert torch.equal(n.cpu(), c)
    c.t()[1:3].mul_(-1)
    n.t()[1:3].mul_(-1)
    assert torch.equal(n.cpu(), c)


def test_indexed_assignment_equals_cpu():
    c, n = pair(5, 5)
    c[c > 0] = 0.5
    n[n > 0] = 0.5
    c[1] = torch.arange(5.0)
    n[1] = torch.arange(5.0).to("neuron")
    c[:, 2] = 9
    n[:, 2] = 9
    c.index_put_((torch.tensor([0, 4]),), torch.tensor(1.5))
    n.index_put_((torch.tensor([0, 4]).to("neuron"),), torch.tensor(1.5).to("neuron"))
    assert torch.equal(n.cpu(), c)


def test_out_same_size_writes_into_given_tensor():
    c, n = pair(3, 4)
    out_c = torch.empty(3, 4)
    out_n = torch.empty(3, 4, device="neuron")
    ptr = out_n.data_ptr()
    r = torch.add(n, 1, out=out_n)
    torch.add(c, 1, out=out_c)
    assert r is out_n
    assert out_n.data_ptr() == ptr
    assert on_device(out_n)
    assert torch.equal(out_n.cpu(), out_c)


def test_out_empty_is_resized_into_device_memory():
    c, n = pair(3, 4)
    cw, nw = pair(4, 5, seed=3)
    out_c = torch.empty(0)
    out_n = torch.empty(0, device="neuron")
    torch.mm(c, cw, out=out_c)
    r = torch.mm(n, nw, out=out_n)
    assert r is out_n
    same(out_n, out_c)
    assert on_device(out_n, 0)


def test_out_empty_on_other_device_is_resized_on_that_device():
    c, n = pair(3, 4)
    n = n.to("neuron:2")
    out_n = torch.empty(0, device="neuron:2")
    torch.exp(n, out=out_n)
    assert out_n.device == torch.device("neuron", 2)
    assert on_device(out_n, 2)
    assert torch.equal(out_n.cpu(), c.exp())


def test_out_wrong_size_nonempty_warns_and_resizes_like_cpu():
    c, n = pair(3, 4)
    out_c = torch.empty(5)
    out_n = torch.empty(5, device="neuron")
    with warnings.catch_warnings(record=True) as wc:
        warnings.simplefilter("always")
        torch.mul(c, 2, out=out_c)
    with warnings.catch_warnings(record=True) as wn:
        warnings.simplefilter("always")
        torch.mul(n, 2, out=out_n)
    assert [str(w.message) for w in wn] == [str(w.message) for w in wc]
    assert len(wc) == 1 and "resized" in str(wc[0].message)
    same(out_n, out_c)
    assert on_device(out_n)


def test_out_multiple_outputs():
    c, n = pair(4, 6)
    vc, ic = torch.empty(0), torch.empty(0, dtype=torch.long)
    vn, in_ = torch.empty(0, device="neuron"), torch.empty(0, dtype=torch.long, device="neuron")
    torch.max(c, 1, out=(vc, ic))
    torch.max(n, 1, out=(vn, in_))
    same(vn, vc)
    same(in_, ic)
    assert on_device(vn) and on_device(in_)


def test_out_non_contiguous_view_target():
    c, n = pair(4, 4)
    base_c = torch.zeros(4, 8)
    base_n = torch.zeros(4, 8, device="neuron")
    torch.add(c, 1, out=base_c[:, ::2])
    torch.add(n, 1, out=base_n[:, ::2])
    assert torch.equal(base_n.cpu(), base_c)


def test_out_wrong_dtype_raises_like_cpu():
    c, n = pair(3)
    with pytest.raises(RuntimeError) as ec:
        torch.add(c, c, out=torch.empty(3, dtype=torch.long))
    with pytest.raises(RuntimeError) as en:
        torch.add(n, n, out=torch.empty(3, dtype=torch.long, device="neuron"))
    assert str(en.value) == str(ec.value)


def test_resize_grows_and_shrinks_like_cpu():
    c, n = pair(2, 3)
    c.resize_(4, 5)
    n.resize_(4, 5)
    assert n.shape == c.shape and n.stride() == c.stride()
    assert on_device(n)
    assert torch.equal(n.cpu().flatten()[:6], c.flatten()[:6])
    c.resize_(2)
    n.resize_(2)
    same(n, c)


def test_set_shares_storage():
    c, n = pair(6)
    tn = torch.empty(0, device="neuron")
    tc = torch.empty(0)
    tn.set_(n)
    tc.set_(c)
    same(tn, tc)
    assert tn.data_ptr() == n.data_ptr()
    tn2 = torch.empty(0, device="neuron")
    tc2 = torch.empty(0)
    tn2.set_(n.untyped_storage(), 2, (2, 2), (1, 2))
    tc2.set_(c.untyped_storage(), 2, (2, 2), (1, 2))
    same(tn2, tc2)
    tn2.fill_(3)
    tc2.fill_(3)
    assert torch.equal(n.cpu(), c)
    e = torch.ones(3, device="neuron").set_()
    assert e.shape == torch.ones(3).set_().shape
    assert e.device.type == "neuron"


def test_set_rejects_storage_of_other_device():
    n = torch.ones(4, device="neuron:1")
    t = torch.empty(0, device="neuron:0")
    with pytest.raises(RuntimeError):
        t.set_(n)


@pytest.mark.parametrize("shape,op", [
    ((3, 1, 4), lambda t: t.transpose_(0, 1)),
    ((3, 4), lambda t: t.t_()),
    ((3, 1, 4), lambda t: t.squeeze_()),
    ((3, 1, 4), lambda t: t.squeeze_(1)),
    ((3, 1, 4), lambda t: t.unsqueeze_(2)),
    ((3, 1, 4), lambda t: t.as_strided_((2, 2), (1, 3), 1)),
    ((3, 1, 4), lambda t: t.swapdims_(0, 2)),
    ((3, 1, 4), lambda t: t.resize_(2, 2)),
])
def test_metadata_changing_in_place_ops(shape, op):
    c = torch.randn(*shape)
    n = c.to("neuron")
    storage_ptr = n.untyped_storage().data_ptr()
    rc, rn = op(c), op(n)
    assert rn is n
    same(n, c)
    assert n.untyped_storage().data_ptr() == storage_ptr  # same memory, new metadata
    assert on_device(n)
    n.add_(1)
    c.add_(1)
    assert torch.equal(n.cpu(), c)


def test_untyped_storage_sharing_and_data_ptr():
    c, n = pair(4)
    v = n[1:]
    assert v.untyped_storage().data_ptr() == n.untyped_storage().data_ptr()
    assert v.data_ptr() == n.data_ptr() + v.element_size()
    s = n.untyped_storage()
    assert s.device == torch.device("neuron", 0)
    assert s.nbytes() == c.untyped_storage().nbytes()
    t = torch.tensor([], device="neuron").set_(s)
    assert t.data_ptr() == n.data_ptr()
    assert bytes(s.cpu()) == bytes(c.untyped_storage())


def test_storage_resize_keeps_prefix():
    c, n = pair(4)
    s = n.untyped_storage()
    s.resize_(32)
    assert s.nbytes() == 32
    assert bytes(s.cpu())[:16] == bytes(c.untyped_storage())


@pytest.mark.parametrize("factory", [
    lambda **kw: torch.zeros(3, 2, **kw),
    lambda **kw: torch.ones(4, dtype=torch.int32, **kw),
    lambda **kw: torch.full((2, 2), 3.5, **kw),
    lambda **kw: torch.arange(10, **kw),
    lambda **kw: torch.linspace(0, 1, 7, **kw),
    lambda **kw: torch.eye(3, **kw),
    lambda **kw: torch.tensor([[1, 2], [3, 4]], **kw),
    lambda **kw: torch.empty(0, **kw),
    lambda **kw: torch.zeros_like(torch.ones(2, 3), **kw),
    lambda **kw: torch.empty_strided((2, 3), (1, 2), **kw).fill_(1),
    lambda **kw: torch.tril_indices(3, 3, **kw),
])
@pytest.mark.parametrize("device", ["neuron", "neuron:3"])
def test_factories_with_device(factory, device):
    n = factory(device=device)
    c = factory(device="cpu")
    assert n.device == torch.device(device if ":" in device else "neuron:0")
    same(n, c)
    assert on_device(n, n.device.index)


def test_new_tensor_methods_stay_on_device():
    n = torch.ones(2, device="neuron:1")
    for t in (n.new_zeros(3), n.new_ones(2, 2), n.new_full((2,), 5), n.new_empty(4),
              n.new_tensor([1, 2]), torch.empty_like(n), torch.rand_like(n)):
        assert t.device == torch.device("neuron", 1)
        assert on_device(t, 1)


@pytest.mark.parametrize("src_dev,dst_dev", [("cpu", "neuron:0"), ("neuron:0", "cpu"),
                                             ("neuron:0", "neuron:1"), ("neuron:3", "neuron:2")])
@pytest.mark.parametrize("non_blocking", [False, True])
def test_copies_between_devices(src_dev, dst_dev, non_blocking):
    c = torch.randn(4, 6)
    src = c.to(src_dev)
    for s, expected in ((src, c), (src.t(), c.t()), (src[:, 1::2], c[:, 1::2])):
        d = s.to(dst_dev, non_blocking=non_blocking)
        assert d.device == torch.device(dst_dev)
        if dst_dev != "cpu":
            assert on_device(d, d.device.index)
        assert torch.equal(d.cpu(), expected)
        # dtype-converting copy
        d2 = s.to(dst_dev, dtype=torch.float16, non_blocking=non_blocking)
        assert d2.dtype == torch.float16
        assert torch.equal(d2.cpu(), expected.half())


def test_copy_into_existing_non_contiguous_destination():
    c = torch.randn(3, 4)
    dst_c = torch.zeros(4, 3).t()
    dst_n = torch.zeros(4, 3, device="neuron:1").t()
    dst_c.copy_(c)
    dst_n.copy_(c.to("neuron:2"))
    same(dst_n, dst_c)
    dst_n.copy_(c.double())  # dtype converting from cpu
    assert torch.equal(dst_n.cpu(), c)
    ci = torch.zeros(3, 4, dtype=torch.int64)
    ci.copy_(dst_n)
    assert torch.equal(ci, c.long())


def test_to_same_device_returns_self_and_copy_true_copies():
    n = torch.ones(3, device="neuron:1")
    assert n.to("neuron:1") is n
    m = n.to("neuron:1", copy=True)
    assert m is not n and m.data_ptr() != n.data_ptr()
    assert torch.equal(m.cpu(), n.cpu())
    assert n.clone().data_ptr() != n.data_ptr()


def test_tolist_and_item():
    c, n = pair(3, 2)
    assert n.tolist() == c.tolist()
    assert n[1, 1].item() == c[1, 1].item()
    assert torch.tensor(7, device="neuron").item() == 7
    assert torch.tensor(True, device="neuron").item() is True
    assert float(n[0, 0]) == float(c[0, 0])
    assert int(torch.tensor(5, device="neuron")) == 5
    assert bool(torch.tensor([1], device="neuron"))


def test_repr_shows_device():
    n = torch.tensor([1.0, 2.0], device="neuron")
    assert repr(n) == "tensor([1., 2.], device='neuron:0')"
    n3 = torch.tensor([1, 2], device="neuron:3")
    assert "device='neuron:3'" in repr(n3)
    assert str(n3) == repr(n3)
    big = torch.arange(2000.0, device="neuron")
    assert repr(big) == repr(torch.arange(2000.0)).replace(")", ", device='neuron:0')")
    assert "device='neuron:0'" in repr(torch.ones(3, device="neuron", requires_grad=True))


def test_numpy_raises_type_error_like_cuda():
    n = torch.ones(3, device="neuron")
    with pytest.raises(TypeError, match="neuron"):
        n.numpy()
    assert (n.cpu().numpy() == 1).all()


def test_mixing_neuron_devices_raises():
    a = torch.ones(3, device="neuron:0")
    b = torch.ones(3, device="neuron:1")
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        a + b
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        torch.mm(a.view(3, 1), b.view(1, 3))
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        a.add_(b)
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        torch.cat([a, b])


def test_mixing_neuron_with_cpu_tensor_raises():
    a = torch.ones(3, device="neuron")
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        a + torch.ones(3)
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        torch.ones(3) + a
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        torch.add(a, a, out=torch.empty(3))


def test_zero_dim_cpu_scalar_accepted():
    c, n = pair(4)
    r = n + torch.tensor(2.0)
    assert on_device(r)
    assert torch.equal(r.cpu(), c + torch.tensor(2.0))
    r2 = torch.tensor(3.0) * n
    assert r2.device.type == "neuron"
    assert torch.equal(r2.cpu(), torch.tensor(3.0) * c)
    n.add_(torch.tensor(1.0))
    c.add_(torch.tensor(1.0))
    assert torch.equal(n.cpu(), c)
    r3 = n.to("neuron:2") + torch.tensor(1, dtype=torch.long)
    assert r3.device == torch.device("neuron", 2)


def test_result_lands_on_inputs_device_not_current_device():
    c, n = pair(5)
    n3 = n.to("neuron:3")
    r = n3 * 2
    assert r.device == torch.device("neuron", 3)
    assert on_device(r, 3)
    with torch.neuron.device(1):
        r = n3.exp()
    assert on_device(r, 3)
    assert torch.equal(r.cpu(), c.exp())


def test_is_neuron_and_neuron_method():
    c = torch.arange(4.0)
    assert not c.is_neuron
    n = c.neuron()
    assert n.is_neuron and n.device == torch.device("neuron", 0)
    assert c.neuron(2).device == torch.device("neuron", 2)
    assert torch.equal(n.cpu(), c)
    assert on_device(n)


def test_empty_and_zero_size_tensors():
    n = torch.empty(0, 3, device="neuron")
    c = torch.empty(0, 3)
    same(n.sum(0), c.sum(0))
    same(n.t(), c.t())
    assert n.tolist() == []


def test_complex_real_imag_views_alias_base():
    c = torch.randn(4, dtype=torch.complex64)
    n = c.to("neuron")
    for f in (lambda t: t.real, lambda t: t.imag, torch.view_as_real):
        vn, vc = f(n), f(c)
        same(vn, vc)
        assert vn._base is n
    n.real.fill_(1.0)
    c.real.fill_(1.0)
    assert torch.equal(n.cpu(), c)


def test_complex_arithmetic_equals_cpu():
    c = torch.randn(5, 3, dtype=torch.complex64)
    n = c.to("neuron")
    for cr, nr in ((c * c, n * n), (c.abs(), n.abs()), (c.angle(), n.angle()), (c @ c.T, n @ n.T)):
        assert on_device(nr)
        same(nr, cr)


_CONJ_SCRIPT = """
import torch
c = torch.randn(5, 3, dtype=torch.complex64)
n = c.to("neuron")
r = {expr_n}
expected = {expr_c}
assert r.device.type == "neuron", r.device
assert torch.equal(r.cpu().resolve_conj().resolve_neg(), expected.resolve_conj().resolve_neg())
print("OK")
"""


@pytest.mark.parametrize("expr", ["X.conj() + X", "X._neg_view() + X"])
def test_conj_and_neg_bit_views_compute_like_cpu(expr):
    # Run in a subprocess: the failure mode is a crash of the interpreter.
    from conftest import run_python
    r = run_python(_CONJ_SCRIPT.format(expr_n=expr.replace("X", "n"), expr_c=expr.replace("X", "c")))
    assert r.returncode == 0 and r.stdout.strip() == "OK", (r.returncode, r.stderr[-2000:])


# ---- numerics of library ops: neuron must equal CPU bit for bit, with the same warnings ----

import torch.nn.functional as F  # noqa: E402

_g = torch.Generator().manual_seed(0)
_X = torch.randn(2, 4, 6, 6, generator=_g)
_W = torch.randn(3, 4, 3, 3, generator=_g)
_V = torch.randn(5, 8, generator=_g)
_TGT = torch.randint(0, 8, (5,), generator=_g)
_EMB = torch.randn(10, 8, generator=_g)
_IDX = torch.tensor([1, 3, 9])

_OPS = [
    pytest.param(lambda d: F.layer_norm(_V.to(d), (8,)), id="layer_norm"),
    pytest.param(lambda d: F.group_norm(_X.to(d), 2), id="group_norm"),
    pytest.param(lambda d: F.batch_norm(_X.to(d), None, None, training=True), id="batch_norm"),
    pytest.param(lambda d: F.instance_norm(_X.to(d)), id="instance_norm"),
    pytest.param(lambda d: F.rms_norm(_V.to(d), (8,)), id="rms_norm"),
    pytest.param(lambda d: F.conv2d(_X.to(d), _W.to(d), padding=1), id="conv2d"),
    pytest.param(lambda d: F.conv1d(_X[0, :, 0].to(d), _W[:, :, 0].to(d)), id="conv1d"),
    pytest.param(lambda d: F.conv_transpose2d(_X.to(d), _W.transpose(0, 1).contiguous().to(d)),
                 id="conv_transpose2d"),
    pytest.param(lambda d: F.max_pool2d(_X.to(d), 2), id="max_pool2d"),
    pytest.param(lambda d: F.adaptive_avg_pool2d(_X.to(d), 1), id="adaptive_avg_pool2d"),
    pytest.param(lambda d: F.interpolate(_X.to(d), scale_factor=2, mode="bilinear"), id="interpolate"),
    pytest.param(lambda d: F.cross_entropy(_V.to(d), _TGT.to(d)), id="cross_entropy"),
    pytest.param(lambda d: F.nll_loss(_V.log_softmax(1).to(d), _TGT.to(d)), id="nll_loss"),
    pytest.param(lambda d: F.mse_loss(_V.to(d), _V.flip(0).to(d)), id="mse_loss"),
    pytest.param(lambda d: F.smooth_l1_loss(_V.to(d), _V.flip(0).to(d)), id="smooth_l1_loss"),
    pytest.param(lambda d: F.l1_loss(_V.to(d), _V.flip(0).to(d)), id="l1_loss"),
    pytest.param(lambda d: F.binary_cross_entropy_with_logits(_V.to(d), _V.sigmoid().to(d)), id="bce_logits"),
    pytest.param(lambda d: F.gelu(_V.to(d)), id="gelu"),
    pytest.param(lambda d: F.embedding(_IDX.to(d), _EMB.to(d)), id="embedding"),
    pytest.param(lambda d: F.scaled_dot_product_attention(_X.to(d), _X.to(d), _X.to(d)), id="sdpa"),
    pytest.param(lambda d: torch.bmm(_X[0].to(d), _X[1].to(d)), id="bmm"),
    pytest.param(lambda d: torch.linalg.inv(_V[:5, :5].to(d)), id="linalg_inv"),
    pytest.param(lambda d: torch.fft.rfft(_V.to(d)).abs(), id="rfft"),
    pytest.param(lambda d: torch.unique(_TGT.to(d)), id="unique"),
    pytest.param(lambda d: (_V.to(d) > 0).nonzero(), id="nonzero"),
    pytest.param(lambda d: torch.zeros(8, device=d).scatter_add(0, _TGT.to(d), _V[:, 0].to(d)), id="scatter_add"),
    pytest.param(lambda d: torch.zeros(10, 8, device=d).index_add(0, _IDX.to(d), _V[:3].to(d)), id="index_add"),
    pytest.param(lambda d: _V.to(d).cumsum(1), id="cumsum"),
    pytest.param(lambda d: torch.var_mean(_V.to(d), 1)[0], id="var_mean"),
    pytest.param(lambda d: _V.to(d).topk(3).values, id="topk"),
    pytest.param(lambda d: F.pad(_X.to(d), (1, 1, 2, 0), mode="reflect"), id="reflect_pad"),
    pytest.param(lambda d: torch.cdist(_V.to(d), _V.to(d)), id="cdist"),
    pytest.param(lambda d: F.embedding_bag(_IDX.to(d), _EMB.to(d), torch.tensor([0, 2]).to(d)), id="embedding_bag"),
    pytest.param(lambda d: F.grid_sample(_X.to(d), torch.zeros(2, 3, 3, 2, device=d), align_corners=False),
                 id="grid_sample"),
]


@pytest.mark.parametrize("op", _OPS)
def test_library_op_equals_cpu_with_same_warnings(op):
    with warnings.catch_warnings(record=True) as wc:
        warnings.simplefilter("always")
        expected = op("cpu")
    with warnings.catch_warnings(record=True) as wn:
        warnings.simplefilter("always")
        got = op("neuron")
    assert got.device.type == "neuron"
    assert on_device(got)
    assert got.dtype == expected.dtype and got.shape == expected.shape
    assert torch.equal(got.cpu(), expected)
    # Besides CPU's warnings, neuron may add its own CPU-fallback notice (test_fallback.py).
    own = [str(w.message) for w in wn if not issubclass(w.category, NeuronCPUFallbackWarning)]
    assert own == [str(w.message) for w in wc]


def test_repr_of_complex_tensor():
    c = torch.tensor([1 + 2j, 3 - 1j], dtype=torch.complex64)
    n = c.to("neuron")
    assert repr(n) == repr(c)[:-1] + ", device='neuron:0')"
