"""torch.neuron and torch.accelerator: the device module shaped like torch.cuda."""

import inspect

import pytest
import torch

from conftest import on_device, run_python


def test_import_torch_autoloads_neuron_without_importing_torchneuron():
    r = run_python("""
        import sys, torch
        t = torch.ones(3, device="neuron")
        assert t.device == torch.device("neuron", 0), t.device
        assert t.tolist() == torch.ones(3).tolist()
        assert "torchneuron" in sys.modules  # loaded by torch's backend autoload
        print("OK", torch.neuron.device_count())
    """)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["OK", "4"]


def test_autoload_disabled_by_env_var():
    r = run_python("""
        import sys, torch
        assert "torchneuron" not in sys.modules
        try:
            torch.ones(3, device="neuron")
        except RuntimeError as e:
            print("RAISED", type(e).__name__)
        else:
            print("NO ERROR")
    """, env={"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"})
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "RAISED RuntimeError"


def test_default_device_count_and_availability():
    assert torch.neuron.is_available()
    assert torch.neuron.device_count() == 4
    assert torch.accelerator.is_available()
    assert torch.accelerator.device_count() == 4
    assert torch.accelerator.current_accelerator() == torch.device("neuron")


def test_device_name_and_properties():
    GiB = 2**30
    for i in range(torch.neuron.device_count()):
        # TorchNeuron's names, as torchtitan reads them (trainium-facts.md: TorchNeuron names):
        # the name contains "neuron", the properties' name is the chip family.
        assert "neuron" in torch.neuron.get_device_name(i)
        assert "Trainium2" in torch.neuron.get_device_name(i)
        props = torch.neuron.get_device_properties(i)
        assert props.name == "trn2"
        assert props.chip == "Trainium2"
        assert props.total_memory == 24 * GiB
        assert torch.neuron.get_device_properties(torch.device("neuron", i)) == props
        assert torch.neuron.get_device_properties(f"neuron:{i}") == props
    assert torch.neuron.get_device_name() == torch.neuron.get_device_name(torch.neuron.current_device())
    cap = torch.neuron.get_device_capability(0)
    assert cap == (torch.neuron.get_device_properties(0).major, torch.neuron.get_device_properties(0).minor)


def test_accelerator_get_device_capability():
    caps = torch.accelerator.get_device_capability(0)
    assert {torch.float32, torch.bfloat16, torch.int64} <= set(caps["supported_dtypes"])


def test_set_device_changes_where_new_tensors_go():
    assert torch.neuron.current_device() == 0
    torch.neuron.set_device(2)
    assert torch.neuron.current_device() == 2
    assert torch.accelerator.current_device_index() == 2
    t = torch.ones(2, device="neuron")
    assert t.device == torch.device("neuron", 2)
    assert on_device(t, 2)
    torch.neuron.set_device("neuron:1")
    assert torch.neuron.current_device() == 1
    torch.neuron.set_device(torch.device("neuron", 3))
    assert torch.neuron.current_device() == 3
    torch.accelerator.set_device_index(0)
    assert torch.neuron.current_device() == 0


def test_device_context_manager_switches_and_restores():
    assert torch.neuron.current_device() == 0
    with torch.neuron.device(3):
        assert torch.neuron.current_device() == 3
        assert torch.empty(1, device="neuron").device.index == 3
        with torch.neuron.device("neuron:1"):
            assert torch.neuron.current_device() == 1
        assert torch.neuron.current_device() == 3
    assert torch.neuron.current_device() == 0
    with torch.neuron.device(None):
        assert torch.neuron.current_device() == 0


def test_device_context_restored_after_exception():
    with pytest.raises(ValueError):
        with torch.neuron.device(2):
            assert torch.neuron.current_device() == 2
            raise ValueError("boom")
    assert torch.neuron.current_device() == 0
    with pytest.raises(ValueError):
        with torch.accelerator.device_index(3):
            assert torch.neuron.current_device() == 3
            raise ValueError("boom")
    assert torch.neuron.current_device() == 0


def test_device_of_uses_tensor_device():
    t = torch.ones(1, device="neuron:2")
    with torch.neuron.device_of(t):
        assert torch.neuron.current_device() == 2
    assert torch.neuron.current_device() == 0
    with torch.neuron.device_of(torch.ones(1)):  # CPU tensor: no-op
        assert torch.neuron.current_device() == 0


def test_torch_device_context_places_factories_on_neuron():
    with torch.device("neuron:1"):
        t = torch.zeros(3)
    assert t.device == torch.device("neuron", 1)
    assert on_device(t, 1)
    assert torch.zeros(3).device.type == "cpu"


def test_set_default_device_neuron():
    try:
        torch.set_default_device("neuron")
        t = torch.arange(5)
        assert t.device.type == "neuron"
        assert on_device(t)
        assert t.cpu().tolist() == torch.arange(5, device="cpu").tolist()
    finally:
        torch.set_default_device(None)
    assert torch.arange(5).device.type == "cpu"


@pytest.mark.parametrize("make", [
    lambda: torch.ones(1, device="neuron:9"),
    lambda: torch.ones(1, device="neuron:4"),
    lambda: torch.neuron.set_device(9),
    lambda: torch.neuron.get_device_properties(9),
    lambda: torch.ones(1, device="neuron").to("neuron:7"),
])
def test_invalid_device_index_raises_runtime_error(make):
    with pytest.raises(RuntimeError, match="neuron"):
        make()
    assert torch.neuron.current_device() == 0


def test_synchronize_all_forms():
    for arg in (None, 0, 3, "neuron:1", torch.device("neuron", 2)):
        torch.neuron.synchronize(arg)
    torch.accelerator.synchronize()
    torch.accelerator.synchronize(1)
    with pytest.raises(RuntimeError):
        torch.neuron.synchronize(9)


def test_bf16_and_amp_dtypes():
    assert torch.neuron.is_bf16_supported() is True
    dtypes = torch.neuron.get_amp_supported_dtype()
    assert torch.bfloat16 in dtypes and torch.float16 in dtypes
    assert torch.get_autocast_dtype("neuron") == torch.bfloat16


def test_lazy_init_and_is_initialized():
    torch.neuron.init()
    assert torch.neuron.is_initialized()


def test_accelerator_memory_functions_match_torch_neuron():
    x = torch.empty(1000, device="neuron:1")
    assert torch.accelerator.memory_allocated(1) == torch.neuron.memory_allocated(1) > 0
    assert torch.accelerator.memory_reserved(1) == torch.neuron.memory_reserved(1)
    assert torch.accelerator.max_memory_allocated(1) == torch.neuron.max_memory_allocated(1)
    assert torch.accelerator.max_memory_reserved(1) == torch.neuron.max_memory_reserved(1)
    assert torch.accelerator.memory_stats(1) == torch.neuron.memory_stats(1)
    assert torch.accelerator.get_memory_info(1) == torch.neuron.mem_get_info(1)
    torch.accelerator.reset_peak_memory_stats(1)
    assert torch.neuron.max_memory_allocated(1) == torch.neuron.memory_allocated(1)
    torch.accelerator.reset_accumulated_memory_stats(1)
    torch.accelerator.empty_cache()
    del x


def test_accelerator_current_stream_and_event_timing():
    s = torch.accelerator.current_stream()
    assert s.device == torch.device("neuron", 0)
    s1 = torch.accelerator.current_stream(2)
    assert s1.device == torch.device("neuron", 2)
    start = torch.Event(device="neuron", enable_timing=True)
    end = torch.Event(device="neuron", enable_timing=True)
    start.record()
    (torch.ones(64, 64, device="neuron") @ torch.ones(64, 64, device="neuron")).sum().item()
    end.record()
    end.synchronize()
    assert start.elapsed_time(end) >= 0


# Functions torch.neuron provides under torch.cuda's names; same parameter names.
_CUDA_NAMED_FUNCTIONS = [
    "is_available", "device_count", "current_device", "set_device", "synchronize",
    "get_device_name", "get_device_properties", "get_device_capability",
    "current_stream", "default_stream", "set_stream", "stream",
    "manual_seed", "manual_seed_all", "seed", "seed_all", "initial_seed",
    "get_rng_state", "set_rng_state", "get_rng_state_all", "set_rng_state_all",
    "memory_allocated", "memory_reserved", "max_memory_allocated", "max_memory_reserved",
    "memory_cached", "max_memory_cached", "reset_peak_memory_stats",
    "reset_max_memory_allocated", "reset_max_memory_cached", "reset_accumulated_memory_stats",
    "memory_stats", "memory_stats_as_nested_dict", "memory_summary", "mem_get_info",
    "empty_cache", "set_per_process_memory_fraction", "get_per_process_memory_fraction",
    "is_bf16_supported", "init", "is_initialized",
]


@pytest.mark.parametrize("name", _CUDA_NAMED_FUNCTIONS)
def test_signature_matches_torch_cuda(name):
    ours = getattr(torch.neuron, name)
    theirs = getattr(torch.cuda, name)
    assert list(inspect.signature(ours).parameters) == list(inspect.signature(theirs).parameters)


@pytest.mark.parametrize("name", ["device", "device_of", "StreamContext", "Stream"])
def test_class_constructor_signature_matches_torch_cuda(name):
    ours = inspect.signature(getattr(torch.neuron, name))
    theirs = inspect.signature(getattr(torch.cuda, name))
    assert [p for p in theirs.parameters if p != "kwargs"] == [
        p for p in ours.parameters if p != "kwargs"]


def test_event_constructor_signature_matches_torch_cuda():
    ours = inspect.signature(torch.neuron.Event)
    theirs = inspect.signature(torch.cuda.Event)
    assert list(ours.parameters) == list(theirs.parameters)
