"""Legacy typed storages on neuron: the classes torch.cuda has, found where PyTorch looks."""

import io
import warnings

import pytest
import torch


@pytest.fixture(autouse=True)
def _quiet_typed_storage_warning():
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="TypedStorage is deprecated")
        yield


CUDA_NAMES = sorted(n for n in dir(torch.cuda) if n.endswith("Storage"))
DTYPES = [torch.float, torch.double, torch.half, torch.bfloat16, torch.uint8, torch.int8,
          torch.short, torch.int, torch.long, torch.bool, torch.cfloat, torch.cdouble]


def test_same_storage_classes_as_torch_cuda():
    assert len(CUDA_NAMES) == 12
    for name in CUDA_NAMES:
        cls = getattr(torch.neuron, name)
        assert cls.dtype == getattr(torch.cuda, name).dtype
        assert f"{cls.__module__}.{cls.__name__}" == f"torch.neuron.{name}"


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_storage_type_names_the_neuron_class(dtype):
    cpu = torch.zeros(3, dtype=dtype)
    n = cpu.to("neuron")
    cls = n.storage_type()
    assert cls is not None and cls.__name__ == cpu.storage_type().__name__
    assert cls is getattr(torch.neuron, cpu.storage_type().__name__)
    assert n.storage().type() == f"torch.neuron.{cls.__name__}"
    assert isinstance(n.storage(), cls)
    assert not isinstance(cpu.storage(), cls)
    assert not isinstance(n.storage(), cpu.storage_type())


def test_constructors_make_neuron_storages_with_cpus_values():
    for cls, cpu_cls, data in [(torch.neuron.FloatStorage, torch.FloatStorage, [1.5, -2.0, 3.25]),
                               (torch.neuron.LongStorage, torch.LongStorage, [1, 2, 3]),
                               (torch.neuron.BoolStorage, torch.BoolStorage, [True, False])]:
        s = cls(data)
        assert s.device.type == "neuron" and s.dtype == cpu_cls.dtype
        assert s.tolist() == cpu_cls(data).tolist()
        assert cls(4).size() == 4 and cls(4).device.type == "neuron"
    x = torch.arange(4.0, device="neuron")
    wrapped = torch.neuron.FloatStorage(wrap_storage=x.untyped_storage())
    assert wrapped.tolist() == [0.0, 1.0, 2.0, 3.0]
    t = torch.tensor([], device="neuron").set_(torch.neuron.FloatStorage([1.0, 2.0]))
    assert t.device.type == "neuron" and t.cpu().tolist() == [1.0, 2.0]


def test_refuses_what_cuda_refuses():
    with pytest.raises(RuntimeError, match="Device of 'wrap_storage' must be neuron, but got cpu"):
        torch.neuron.FloatStorage(wrap_storage=torch.UntypedStorage(8))
    with pytest.raises(RuntimeError, match="from_buffer: Not available for neuron storage"):
        torch.neuron.FloatStorage.from_buffer(b"\x00" * 8, "native")


def test_storage_moves_and_saves_keep_the_class():
    n = torch.arange(3.0, device="neuron").storage()
    assert n.cpu().type() == "torch.FloatStorage"
    assert n.cpu().neuron().type() == "torch.neuron.FloatStorage"
    buf = io.BytesIO()
    torch.save(n, buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=False)
    assert isinstance(loaded, torch.neuron.FloatStorage) and loaded.tolist() == [0.0, 1.0, 2.0]
