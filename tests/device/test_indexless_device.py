"""An index-less ``neuron`` device means the current device, as ``cuda`` does.

``torch.Stream(device="neuron")`` and the other generic entry points hand the
device guard index -1; CUDA maps it to the current device.
"""

import pytest
import torch


@pytest.mark.parametrize("current", [0, 2])
def test_generic_stream_without_index_is_on_the_current_device(current):
    torch.neuron.set_device(current)
    for stream in (torch.Stream(device="neuron"), torch.Stream("neuron"),
                   torch.Stream(device=torch.device("neuron"), priority=0)):
        assert stream.device == torch.device("neuron", current)
        stream.synchronize()
        assert stream.query()


@pytest.mark.parametrize("current", [0, 3])
def test_stream_api_without_index_uses_the_current_device(current):
    torch.neuron.set_device(current)
    expected = torch.device("neuron", current)
    assert torch.neuron.current_stream("neuron").device == expected
    assert torch.neuron.default_stream("neuron").device == expected
    assert torch.accelerator.current_stream().device == expected
    with torch.neuron.stream(torch.Stream(device="neuron")):
        x = torch.ones(3, device="neuron") * 2
    assert x.device == expected


def test_event_on_indexless_stream_times_work():
    torch.neuron.set_device(1)
    stream = torch.Stream(device="neuron")
    start = torch.Event(device="neuron", enable_timing=True)
    end = torch.Event(device="neuron", enable_timing=True)
    with torch.neuron.stream(stream):
        start.record(stream)
        torch.ones(256, 256, device="neuron") @ torch.ones(256, 256, device="neuron")
        end.record(stream)
    assert start.device == torch.device("neuron", 1)
    assert start.elapsed_time(end) > 0


def test_invalid_index_still_raises():
    with pytest.raises(RuntimeError, match="[Ii]nvalid device"):
        torch.Stream(device="neuron:99")
