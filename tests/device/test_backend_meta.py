"""Neuron tensors keep no backend metadata, and say so instead of dropping it."""

import io

import pytest
import torch


def test_setting_backend_metadata_raises_naming_the_keys():
    t = torch.ones(3, device="neuron")
    with pytest.raises(RuntimeError, match=r"keep no backend metadata.*'format_tag'"):
        torch._utils.set_tensor_metadata(t, {"format_tag": True})
    assert torch._utils.get_tensor_metadata(t) == {}
    torch.testing.assert_close(t.cpu(), torch.ones(3), rtol=0, atol=0)  # tensor intact


def test_pytorch_conj_and_neg_bits_still_round_trip():
    t = torch.ones(3, device="neuron")._neg_view()
    assert torch._utils.get_tensor_metadata(t) == {"neg": True}
    plain = torch.ones(3, device="neuron")
    torch._utils.set_tensor_metadata(plain, {"neg": True})
    assert plain.is_neg()
    buffer = io.BytesIO()
    torch.save(t, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer)
    assert loaded.device.type == "neuron" and loaded.is_neg()
    torch.testing.assert_close(loaded.cpu(), t.cpu(), rtol=0, atol=0)
