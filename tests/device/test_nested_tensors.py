"""Nested tensors on neuron: PyTorch's Transformer fast path (BERT-style inference with a
padding mask) and the public torch.nested API, against CPU as the oracle.

Nested tensors on neuron run CPU's NestedTensorCPU kernels on the device's memory, so
results are CPU's bit for bit; the tests prove the nested path ran on the device (the
op counters, and where the buffers live)."""


import pytest
import torch
from torch import nn

import torchneuron

from conftest import on_device

metrics = torchneuron.metrics

pytestmark = [pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors"),
              pytest.mark.filterwarnings("ignore:enable_nested_tensor is True")]


def _calls(op: str) -> int:
    return sum(c.calls for c in metrics.ops() if c.op == op)


def _padding_mask(lengths: list[int], seq: int) -> torch.Tensor:
    return torch.arange(seq)[None, :] >= torch.tensor(lengths)[:, None]


def _encoder(norm_first: bool, activation: str, batch_first: bool, layers: int = 3) -> nn.Module:
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.1, activation=activation,
                                       batch_first=batch_first, norm_first=norm_first)
    return nn.TransformerEncoder(layer, layers, enable_nested_tensor=True).eval()


def _assert_nested_equal(neuron: torch.Tensor, cpu: torch.Tensor) -> None:
    assert neuron.is_nested and neuron.device.type == "neuron" and on_device(neuron)
    assert neuron.size(0) == cpu.size(0)
    for a, b in zip(neuron.unbind(), cpu.unbind()):
        assert torch.equal(a.cpu(), b)


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
@pytest.mark.parametrize("batch_first", [True, False])
def test_transformer_encoder_fast_path_with_padding_mask_equals_cpu(norm_first, activation,
                                                                    batch_first):
    enc = _encoder(norm_first, activation, batch_first)
    lengths = [7, 4, 1, 6]
    src = torch.randn(4, 7, 32)
    mask = _padding_mask(lengths, 7)
    if not batch_first:
        src = src.transpose(0, 1).contiguous()
    with torch.no_grad():
        expected = enc(src, src_key_padding_mask=mask)
        enc.to("neuron")
        metrics.reset()
        got = enc(src.to("neuron"), src_key_padding_mask=mask.to("neuron"))
    assert on_device(got) and not got.is_nested
    # CPU's fast path: only the encoder's mask-free positions, padding zeroed.
    assert torch.equal(got.cpu(), expected)
    # The fast path ran on the device: every layer fused. PyTorch converts to a nested
    # tensor (once, back to padded at the end) only for post-norm layers; pre-norm
    # layers take the padding mask into the fused layer instead.
    # Without batch_first PyTorch takes no fast path at all (on CPU either).
    nested = int(batch_first and not norm_first)
    assert enc.use_nested_tensor == bool(nested)
    assert _calls("aten::_transformer_encoder_layer_fwd") == (3 if batch_first else 0)
    assert _calls("aten::_nested_tensor_from_mask") == nested
    assert _calls("aten::to_padded_tensor") == nested


def test_transformer_encoder_without_mask_takes_the_dense_fast_path():
    enc = _encoder(False, "relu", True)
    src = torch.randn(2, 5, 32)
    with torch.no_grad():
        expected = enc(src)
        enc.to("neuron")
        metrics.reset()
        got = enc(src.to("neuron"))
    assert torch.equal(got.cpu(), expected)
    assert _calls("aten::_transformer_encoder_layer_fwd") == 3
    assert _calls("aten::_nested_tensor_from_mask") == 0


def test_transformer_encoder_fast_path_output_is_on_the_device_and_counts_no_fallback():
    enc = _encoder(False, "gelu", True, layers=2).to("neuron")
    src = torch.randn(3, 6, 32, device="neuron")
    mask = _padding_mask([6, 2, 4], 6).to("neuron")
    metrics.reset()
    with torch.inference_mode():
        out = enc(src, src_key_padding_mask=mask)
    assert on_device(out)
    assert not metrics.fallbacks()
    # Each nested op was charged modelled Trainium time.
    nested_ops = [c for c in metrics.ops() if c.op == "aten::_transformer_encoder_layer_fwd"]
    assert nested_ops and all(c.modeled_seconds > 0 for c in nested_ops)


def test_transformer_encoder_layer_fast_path_with_padding_mask():
    torch.manual_seed(1)
    layer = nn.TransformerEncoderLayer(16, 2, 32, batch_first=True).eval()
    src = torch.randn(3, 5, 16)
    mask = _padding_mask([5, 3, 2], 5)
    with torch.no_grad():
        expected = layer(src, src_key_padding_mask=mask)
        layer.to("neuron")
        metrics.reset()
        got = layer(src.to("neuron"), src_key_padding_mask=mask.to("neuron"))
    assert torch.equal(got.cpu(), expected)
    assert _calls("aten::_transformer_encoder_layer_fwd") == 1


@pytest.mark.parametrize("with_mask", [False, True])
def test_multihead_attention_fast_path_equals_cpu(with_mask):
    torch.manual_seed(2)
    mha = nn.MultiheadAttention(16, 4, batch_first=True).eval()
    x = torch.randn(3, 5, 16)
    mask = _padding_mask([5, 3, 1], 5) if with_mask else None
    with torch.no_grad():
        expected, expected_w = mha(x, x, x, key_padding_mask=mask)
        mha.to("neuron")
        xn = x.to("neuron")  # self-attention (query is key is value): the fast path's condition
        metrics.reset()
        got, got_w = mha(xn, xn, xn, key_padding_mask=None if mask is None else mask.to("neuron"))
    assert torch.equal(got.cpu(), expected) and torch.equal(got_w.cpu(), expected_w)
    assert _calls("aten::_native_multi_head_attention") == 1


def test_multihead_attention_on_nested_query_equals_cpu():
    torch.manual_seed(3)
    mha = nn.MultiheadAttention(8, 2, batch_first=True).eval()
    parts = [torch.randn(4, 8), torch.randn(2, 8)]
    with torch.no_grad():
        q = torch.nested.nested_tensor(parts)
        expected, _ = mha(q, q, q, need_weights=False)
        mha.to("neuron")
        qn = torch.nested.nested_tensor(parts, device="neuron")
        metrics.reset()
        got, _ = mha(qn, qn, qn, need_weights=False)
    _assert_nested_equal(got, expected)
    assert _calls("aten::_native_multi_head_attention") == 1


def test_nested_tensor_from_mask_and_to_padded_tensor_round_trip():
    x = torch.randn(3, 4, 5)
    keep = ~_padding_mask([4, 1, 3], 4)
    nested_cpu = torch._nested_tensor_from_mask(x, keep)
    nested = torch._nested_tensor_from_mask(x.to("neuron"), keep.to("neuron"))
    _assert_nested_equal(nested, nested_cpu)
    for pad, size in [(0.0, None), (-1.5, (3, 6, 5))]:
        got = torch.nested.to_padded_tensor(nested, pad, size)
        assert on_device(got)
        assert torch.equal(got.cpu(), torch.nested.to_padded_tensor(nested_cpu, pad, size))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64])
def test_nested_tensor_creation_and_unbind_round_trip(dtype):
    parts = [torch.arange(6).reshape(2, 3).to(dtype), torch.arange(12).reshape(4, 3).to(dtype) * 3]
    for make in (lambda: torch.nested.nested_tensor(parts, device="neuron"),
                 lambda: torch.nested.as_nested_tensor([p.to("neuron") for p in parts]),
                 lambda: torch.nested.nested_tensor(parts).to("neuron")):
        nt = make()
        assert nt.is_nested and nt.dtype == dtype
        _assert_nested_equal(nt, torch.nested.nested_tensor(parts))
        back = nt.cpu()
        assert back.is_nested and back.device.type == "cpu"
        for a, b in zip(back.unbind(), parts):
            assert torch.equal(a, b)


def test_nested_tensor_copies_are_counted_as_transfers():
    parts = [torch.randn(2, 3), torch.randn(5, 3)]
    metrics.reset()
    nt = torch.nested.nested_tensor(parts).to("neuron")
    counters = metrics.counters()
    assert counters["copies_to_device"] == 1 and counters["bytes_to_device"] == 7 * 3 * 4
    nt.cpu()
    counters = metrics.counters()
    assert counters["copies_to_host"] == 1 and counters["bytes_to_host"] == 7 * 3 * 4
    assert counters["host_syncs"] >= 1


def test_nested_tensor_ops_equal_cpu():
    torch.manual_seed(4)
    parts = [torch.randn(2, 6), torch.randn(3, 6), torch.randn(1, 6)]
    a_cpu, b_cpu = torch.nested.nested_tensor(parts), torch.nested.nested_tensor(
        [p * 2 for p in parts])
    a, b = a_cpu.to("neuron"), b_cpu.to("neuron")
    linear = nn.Linear(6, 4)
    cases = [
        lambda x, y: x + y,
        lambda x, y: x * y,
        lambda x, y: torch.nn.functional.gelu(x),
        lambda x, y: torch.nn.functional.relu(x),
        lambda x, y: torch.nn.functional.softmax(x, -1),
        lambda x, y: torch.nn.functional.layer_norm(x, (6,), torch.full((6,), 1.5, device=x.device),
                                                    torch.full((6,), 0.25, device=x.device)),
        lambda x, y: torch.matmul(x, y.transpose(-1, -2)),
        lambda x, y: x.transpose(1, 2).contiguous(),
        lambda x, y: x.clone(),
    ]
    for case in cases:
        _assert_nested_equal(case(a, b), case(a_cpu, b_cpu))
    _assert_nested_equal(torch.nn.functional.linear(a, linear.weight.to("neuron"),
                                                    linear.bias.to("neuron")), linear(a_cpu))


def test_nested_tensor_views_and_in_place_ops_write_device_memory():
    parts = [torch.randn(2, 4), torch.randn(3, 4)]
    nt = torch.nested.nested_tensor(parts, device="neuron")
    first = nt.unbind()[0]  # a view of the nested buffer
    assert on_device(first)
    result = nt.mul_(2)
    assert result is nt
    assert torch.equal(first.cpu(), parts[0] * 2)  # the view sees the in-place write
    nt.zero_()
    assert all(torch.equal(t.cpu(), torch.zeros_like(p)) for t, p in zip(nt.unbind(), parts))


def test_nested_tensor_metadata_stays_on_the_host():
    nt = torch.nested.nested_tensor([torch.randn(2, 4), torch.randn(3, 4)], device="neuron")
    y = nt + 1  # made by a CPU nested kernel under the device's allocator
    for meta in (y._nested_tensor_size(), y._nested_tensor_strides(),
                 y._nested_tensor_storage_offsets()):
        assert meta.device.type == "cpu"
    assert torch.equal(y._nested_tensor_size(), torch.tensor([[2, 4], [3, 4]]))


def test_nested_and_dense_arguments_on_different_devices_raise():
    nt = torch.nested.nested_tensor([torch.randn(2, 4)], device="neuron")
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        nt + torch.nested.nested_tensor([torch.randn(2, 4)])


def test_nested_op_without_a_cpu_kernel_raises_a_clear_error():
    nt = torch.nested.nested_tensor([torch.randn(2, 4), torch.randn(3, 4)], device="neuron")
    with pytest.raises(NotImplementedError, match="nested tensors on the neuron device"):
        torch.exp(nt)  # no NestedTensorCPU kernel in PyTorch
    with pytest.raises(NotImplementedError):
        torch.exp(torch.nested.nested_tensor([torch.randn(2, 4)]))  # nor on CPU


def test_jagged_layout_works_on_neuron():
    parts = [torch.randn(2, 4), torch.randn(5, 4)]
    nt = torch.nested.nested_tensor(parts, layout=torch.jagged, device="neuron")
    ref = torch.nested.nested_tensor(parts, layout=torch.jagged)
    assert torch.equal((nt * 2 + 1).to_padded_tensor(0.0).cpu(), (ref * 2 + 1).to_padded_tensor(0.0))
    for a, b in zip(nt.unbind(), parts):
        assert on_device(a) and torch.equal(a.cpu(), b)


def test_nested_tensor_moves_between_devices():
    if torch.neuron.device_count() < 2:
        pytest.skip("needs two neuron devices")
    parts = [torch.randn(2, 3), torch.randn(4, 3)]
    nt = torch.nested.nested_tensor(parts, device="neuron:0")
    moved = nt.to("neuron:1")
    assert moved.device == torch.device("neuron:1") and on_device(moved, 1)
    like = torch.empty_like(nt, device="neuron:1")  # a device= argument places the result
    assert on_device(like, 1)
    _assert_nested_equal(moved, torch.nested.nested_tensor(parts))


def test_as_nested_tensor_of_a_dense_neuron_tensor_views_its_memory():
    dense = torch.randn(3, 4, 5, device="neuron")
    nt = torch.nested.as_nested_tensor(dense)  # _nested_view_from_buffer, host metadata
    assert nt.is_nested and on_device(nt)
    _assert_nested_equal(nt, torch.nested.as_nested_tensor(dense.cpu()))
    dense.add_(1)
    assert torch.equal(nt.unbind()[2].cpu(), dense[2].cpu())  # a view: it sees the write


def test_nested_tensor_backward_equals_cpu():
    torch.manual_seed(5)
    parts = [torch.randn(2, 4), torch.randn(3, 4)]
    weight = torch.randn(3, 4)
    grads = []
    for device in ("cpu", "neuron"):
        nt = torch.nested.nested_tensor(parts, device=device, requires_grad=True)
        w = weight.to(device, copy=True).requires_grad_()  # a leaf on each device
        out = torch.nn.functional.linear(nt, w).relu()
        torch.nested.to_padded_tensor(out, 0.0).sum().backward()
        grads.append((nt.grad, w.grad))
    (nt_cpu, w_cpu), (nt_dev, w_dev) = grads
    _assert_nested_equal(nt_dev, nt_cpu)
    assert on_device(w_dev) and torch.equal(w_dev.cpu(), w_cpu)


def test_nested_tensor_random_ops_use_the_device_generator():
    parts = [torch.randn(2, 4), torch.randn(3, 4)]
    expected = torch.empty_like(torch.nested.nested_tensor(parts)).normal_(
        generator=torch.Generator().manual_seed(7))  # the stream neuron seeded with 7 gives
    torch.neuron.manual_seed(7)
    nt = torch.nested.nested_tensor(parts, device="neuron")
    torch.randn(100)  # CPU randomness in between must not change the device's draw
    _assert_nested_equal(torch.empty_like(nt).normal_(), expected)


def _nested_dropout(device):
    nt = torch.nested.nested_tensor([torch.ones(3, 4), torch.ones(5, 4)], device=device)
    return [t.cpu() for t in torch.nn.functional.dropout(nt, 0.5, training=True).unbind()]


@pytest.mark.usefixtures("restore_rng")
def test_nested_dropout_draws_from_the_neuron_generator_as_cpu_draws_from_its_own():
    torch.manual_seed(5)
    cpu = _nested_dropout("cpu")
    torch.neuron.manual_seed(5)
    torch.default_generator.manual_seed(1234)  # unrelated CPU randomness
    got = _nested_dropout("neuron")
    assert all(torch.equal(a, b) for a, b in zip(got, cpu))
    torch.neuron.manual_seed(6)
    assert not all(torch.equal(a, b) for a, b in zip(_nested_dropout("neuron"), cpu))
    # The CPU default generator's own stream is left where it was.
    torch.default_generator.manual_seed(42)
    expected = torch.rand(3)
    torch.default_generator.manual_seed(42)
    _nested_dropout("neuron")
    assert torch.equal(torch.rand(3), expected)
