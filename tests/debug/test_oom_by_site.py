"""With torch.neuron.memory._record_memory_history() on, an out-of-memory error lists the live
memory by allocation site of the user's code (file:line) and category, adding up to the
allocated bytes."""

import contextlib
import gc

import pytest
import torch

from torchneuron.device import oom

MiB = 2**20
THIS_FILE = __file__


def _activation(device):
    return torch.empty(8 * MiB, dtype=torch.uint8, device=device)  # activation site


@contextlib.contextmanager
def _capped_device(headroom):
    """The last neuron device with its capacity cut to what is allocated plus ``headroom``
    bytes, restored (and its cache emptied) afterwards."""
    device = torch.device("neuron", torch.neuron.device_count() - 1)
    gc.collect()
    torch.neuron.empty_cache()
    total = torch.neuron.get_device_properties(device).total_memory
    capacity_before = torch.neuron.mem_get_info(device)[1]
    base = torch.neuron.memory_allocated(device)
    try:
        torch.neuron.set_per_process_memory_fraction((base + headroom) / total, device)
        yield device
    finally:
        torch.neuron.set_per_process_memory_fraction(capacity_before / total, device)
        gc.collect()
        torch.neuron.empty_cache()


def _line(marker):
    with open(THIS_FILE) as f:
        return next(i for i, line in enumerate(f, 1) if line.rstrip().endswith(f"# {marker}"))


def test_out_of_memory_lists_allocation_sites_by_category():
    with _capped_device(64 * MiB) as device:
        torch.neuron.memory._record_memory_history()
        try:
            model = torch.nn.Linear(1024, 1024, device=device)  # parameters site
            x = torch.ones(16, 1024, device=device)
            model(x).sum().backward()  # gradients site
            activations = [_activation(device) for _ in range(3)]
            with pytest.raises(torch.OutOfMemoryError) as info:
                torch.empty(48 * MiB, dtype=torch.uint8, device=device)
            allocated = torch.neuron.memory_allocated(device)
            explanation = info.value.memory_explanation
            sites = {(s.site.split(" in ")[0], s.category): s for s in explanation.sites}
            here = THIS_FILE
            assert sites[(f"{here}:{_line('activation site')}", oom.ACTIVATIONS)].blocks == 3
            assert sites[(f"{here}:{_line('activation site')}", oom.ACTIVATIONS)].bytes == 3 * 8 * MiB
            assert sites[(f"{here}:{_line('parameters site')}", oom.PARAMETERS)].blocks == 2  # weight, bias
            assert sites[(f"{here}:{_line('gradients site')}", oom.GRADIENTS)].blocks == 2
            assert sum(s.bytes for s in explanation.sites) == allocated  # every live block, once
            message = str(info.value)
            assert "By allocation site and category (most bytes first" in message
            assert f"activations and other tensors  at {here}:{_line('activation site')} in _activation" in message
            assert explanation.as_dict()["sites"][0]["bytes"] == max(s.bytes for s in explanation.sites)
            del activations, model, x
        finally:
            torch.neuron.memory._record_memory_history(None)
    assert oom.memory_by_site(device) == []  # not recording: no sites (and no snapshot taken)


def test_out_of_memory_without_recorded_stacks_says_how_to_get_the_sites():
    with _capped_device(16 * MiB) as device:
        with pytest.raises(torch.OutOfMemoryError) as info:
            torch.empty(48 * MiB, dtype=torch.uint8, device=device)
    assert info.value.memory_explanation.sites == ()
    assert ("By allocation site: not recorded; call torch.neuron.memory._record_memory_history() "
            "before the run (or run it under `torchneuron check`)") in str(info.value)


def test_a_profiler_recording_memory_with_stacks_names_allocation_sites_until_it_stops():
    """What an out-of-memory error lists (oom.memory_by_site) while torchneuron.profiler.profile
    records memory with stacks; no OOM is raised here: under with_stack the profiler traces
    every Python call the explainer makes, which is slow to collect."""
    import torchneuron
    from torchneuron.device import memory_history

    device = torch.device("neuron", torch.neuron.device_count() - 1)
    with torchneuron.profiler.profile(profile_memory=True, with_stack=True):
        held = [_activation(device) for _ in range(2)]
        sites = oom.memory_by_site(device)
    mine = [s for s in sites if s.site.split(" in ")[0] == f"{THIS_FILE}:{_line('activation site')}"]
    assert [(s.category, s.blocks, s.bytes) for s in mine] == [(oom.ACTIVATIONS, 2, 16 * MiB)]
    assert not memory_history.is_recording() and oom.memory_by_site(device) == []  # off at stop
    with torchneuron.profiler.profile(profile_memory=True):  # no stacks asked: none recorded
        assert not memory_history.is_recording()
    del held
