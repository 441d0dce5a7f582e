"""torch.save/torch.load and deepcopy of neuron tensors and models."""

import copy
import io

import pytest
import torch
import torch.nn as nn

from conftest import on_device


def _roundtrip(obj, **load_kwargs):
    buf = io.BytesIO()
    torch.save(obj, buf)
    buf.seek(0)
    return torch.load(buf, **load_kwargs)  # default weights_only=True


def test_save_load_keeps_device_index():
    c = torch.randn(3, 4)
    n = c.to("neuron:2")
    loaded = _roundtrip({"t": n, "view": n[1:, ::2], "i": torch.arange(5, device="neuron:2")})
    t = loaded["t"]
    assert t.device == torch.device("neuron", 2)
    assert on_device(t, 2)
    assert torch.equal(t.cpu(), c)
    assert loaded["view"].device == torch.device("neuron", 2)
    assert torch.equal(loaded["view"].cpu(), c[1:, ::2])
    assert loaded["i"].dtype == torch.int64


def test_save_load_preserves_view_sharing():
    n = torch.randn(6, device="neuron:1")
    loaded = _roundtrip([n, n[2:]])
    loaded[0].fill_(1.0)
    assert torch.equal(loaded[1].cpu(), torch.ones(4))  # still a view of the same storage
    assert loaded[1].untyped_storage().data_ptr() == loaded[0].untyped_storage().data_ptr()


@pytest.mark.parametrize("map_location,expected", [
    ("cpu", torch.device("cpu")),
    ("neuron", torch.device("neuron", 0)),
    ("neuron:2", torch.device("neuron", 2)),
    (torch.device("neuron", 3), torch.device("neuron", 3)),
    ({"neuron:2": "neuron:1"}, torch.device("neuron", 1)),
])
def test_map_location(map_location, expected):
    c = torch.randn(5)
    loaded = _roundtrip(c.to("neuron:2"), map_location=map_location)
    assert loaded.device == expected
    if expected.type == "neuron":
        assert on_device(loaded, expected.index)
    assert torch.equal(loaded.cpu(), c)


def test_cpu_checkpoint_loads_onto_neuron():
    c = torch.randn(4, 4)
    loaded = _roundtrip({"w": c}, map_location="neuron:1")
    assert loaded["w"].device == torch.device("neuron", 1)
    assert on_device(loaded["w"], 1)
    assert torch.equal(loaded["w"].cpu(), c)


def test_save_to_file(tmp_path):
    c = torch.randn(3)
    path = tmp_path / "t.pt"
    torch.save(c.to("neuron:3"), path)
    loaded = torch.load(path)
    assert loaded.device == torch.device("neuron", 3)
    assert torch.equal(loaded.cpu(), c)
    assert torch.equal(torch.load(path, map_location="cpu"), c)


def test_model_state_dict_round_trip():
    torch.manual_seed(0)
    src = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Linear(8, 2)).to("neuron:1")
    src(torch.randn(5, 4, device="neuron:1"))  # update BN running stats
    sd = _roundtrip(src.state_dict())
    for k, v in sd.items():
        assert v.device == torch.device("neuron", 1), k
    torch.manual_seed(1)
    dst = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Linear(8, 2)).to("neuron:1")
    dst.load_state_dict(sd)
    for (k, a), b in zip(src.state_dict().items(), dst.state_dict().values()):
        assert torch.equal(a.cpu(), b.cpu()), k
    src.eval(), dst.eval()
    x = torch.randn(3, 4, device="neuron:1")
    assert torch.equal(src(x).cpu(), dst(x).cpu())
    # and the same checkpoint into a CPU model matches
    cpu_model = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Linear(8, 2)).eval()
    cpu_model.load_state_dict(_roundtrip(src.state_dict(), map_location="cpu"))
    assert torch.equal(cpu_model(x.cpu()), src(x).detach().cpu())


def test_deepcopy_tensor():
    c = torch.randn(4)
    n = c.to("neuron:2").requires_grad_()
    d = copy.deepcopy(n)
    assert d.device == torch.device("neuron", 2) and on_device(d, 2)
    assert d.data_ptr() != n.data_ptr()
    assert d.requires_grad
    assert torch.equal(d.detach().cpu(), c)
    d.detach().add_(1)
    assert torch.equal(n.detach().cpu(), c)


def test_deepcopy_model():
    torch.manual_seed(0)
    m = nn.Linear(3, 3).to("neuron:3")
    m2 = copy.deepcopy(m)
    for p, q in zip(m.parameters(), m2.parameters()):
        assert q.device == torch.device("neuron", 3) and on_device(q, 3)
        assert q.data_ptr() != p.data_ptr()
        assert torch.equal(p.detach().cpu(), q.detach().cpu())
    with torch.no_grad():
        m2.weight.zero_()
    assert m.weight.abs().sum().item() > 0


def test_load_with_weights_only_false_and_storages():
    n = torch.randn(3, device="neuron")
    loaded = _roundtrip({"s": n.untyped_storage()}, weights_only=False)
    assert loaded["s"].device == torch.device("neuron", 0)
    assert bytes(loaded["s"].cpu()) == bytes(n.cpu().untyped_storage())
