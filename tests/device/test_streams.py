"""Streams and events on neuron, shaped like torch.cuda's."""

import contextlib
import time

import pytest
import torch
from torchneuron import config

from conftest import on_device


def test_stream_on_current_and_explicit_device():
    s = torch.neuron.Stream()
    assert s.device == torch.device("neuron", 0)
    assert isinstance(s, torch.Stream)
    with torch.neuron.device(2):
        assert torch.neuron.Stream().device == torch.device("neuron", 2)
    s3 = torch.neuron.Stream(device=3)
    assert s3.device == torch.device("neuron", 3)
    assert torch.neuron.Stream("neuron:1").device_index == 1
    assert torch.neuron.Stream() != torch.neuron.Stream()  # fresh streams are distinct
    with pytest.raises(RuntimeError):
        torch.neuron.Stream(device=9)


def test_default_and_current_stream():
    d = torch.neuron.default_stream()
    c = torch.neuron.current_stream()
    assert d == c
    assert d.device == torch.device("neuron", 0)
    assert torch.neuron.default_stream(3).device == torch.device("neuron", 3)
    assert torch.neuron.current_stream(3) == torch.neuron.default_stream(3)


def test_stream_context_switches_current_stream_and_restores():
    default = torch.neuron.current_stream()
    s = torch.neuron.Stream()
    with torch.neuron.stream(s) as entered:
        assert entered == s
        assert torch.neuron.current_stream() == s
        assert torch.accelerator.current_stream() == s
        x = torch.ones(4, device="neuron") * 2
    assert torch.neuron.current_stream() == default
    assert torch.equal(x.cpu(), torch.ones(4) * 2)
    with torch.neuron.stream(None):
        assert torch.neuron.current_stream() == default


def test_stream_context_on_other_device_switches_device_and_restores():
    s2 = torch.neuron.Stream(device=2)
    with torch.neuron.stream(s2):
        assert torch.neuron.current_device() == 2
        assert torch.neuron.current_stream() == s2
        t = torch.ones(2, device="neuron")
        assert t.device.index == 2 and on_device(t, 2)
    assert torch.neuron.current_device() == 0
    assert torch.neuron.current_stream(2) == torch.neuron.default_stream(2)
    assert torch.neuron.current_stream(0) == torch.neuron.default_stream(0)


def test_stream_context_restores_after_exception():
    s = torch.neuron.Stream(device=1)
    with pytest.raises(KeyError):
        with torch.neuron.stream(s):
            raise KeyError("x")
    assert torch.neuron.current_device() == 0
    assert torch.neuron.current_stream(1) == torch.neuron.default_stream(1)


def test_set_stream():
    s = torch.neuron.Stream()
    try:
        torch.neuron.set_stream(s)
        assert torch.neuron.current_stream() == s
    finally:
        torch.neuron.set_stream(torch.neuron.default_stream())
    assert torch.neuron.current_stream() == torch.neuron.default_stream()


def test_wait_stream_wait_event_record_event_keep_results_correct():
    s1, s2 = torch.neuron.Stream(), torch.neuron.Stream()
    a_c = torch.randn(32, 32)
    with torch.neuron.stream(s1):
        a = a_c.to("neuron", non_blocking=True)
        b = a @ a
        ev = s1.record_event()
    assert isinstance(ev, torch.neuron.Event)
    s2.wait_event(ev)
    s2.wait_stream(s1)
    with torch.neuron.stream(s2):
        c = b + 1
    torch.neuron.current_stream().wait_stream(s2)
    s2.synchronize()
    assert s1.query() and s2.query()
    assert ev.query()
    assert torch.equal(c.cpu(), a_c @ a_c + 1)
    b.record_stream(s2)


@contextlib.contextmanager
def host_event_time():
    """Events measure wall-clock time inside; the default (modelled device
    time, tested in test_modeled_time.py) is back afterwards."""
    with config.override(TORCHNEURON_EVENT_TIME="host"):  # reaches the core by itself
        yield


def test_host_event_time_is_monotonic_over_sleep():
    with host_event_time():
        _check_host_events_over_sleep()


def _check_host_events_over_sleep():
    start = torch.neuron.Event(enable_timing=True)
    mid = torch.neuron.Event(enable_timing=True)
    end = torch.neuron.Event(enable_timing=True)
    start.record()
    mid.record()
    time.sleep(0.05)
    end.record()
    end.synchronize()
    t_mid = start.elapsed_time(mid)
    t_end = start.elapsed_time(end)
    assert t_mid >= 0
    assert t_end >= t_mid
    assert t_end >= 40  # milliseconds, at least most of the sleep
    assert end.query()


def test_elapsed_time_requires_enable_timing():
    a = torch.neuron.Event()
    b = torch.neuron.Event()
    a.record()
    b.record()
    with pytest.raises((RuntimeError, ValueError), match="enable_timing"):
        a.elapsed_time(b)


def test_elapsed_time_requires_recorded_events():
    a = torch.neuron.Event(enable_timing=True)
    b = torch.neuron.Event(enable_timing=True)
    a.record()
    with pytest.raises(RuntimeError, match="recorded"):
        a.elapsed_time(b)


def test_event_on_explicit_stream_and_wait():
    s = torch.neuron.Stream(device=1)
    with torch.neuron.device(1):
        e = torch.neuron.Event(enable_timing=True)
    e.record(s)
    e.wait(s)
    e.synchronize()
    assert e.device == torch.device("neuron", 1)
    assert e.query()


def test_generic_torch_stream_and_event_with_neuron():
    s = torch.Stream(device="neuron:1")
    assert s.device == torch.device("neuron", 1)
    e1 = torch.Event(device="neuron:1", enable_timing=True)
    e2 = torch.Event(device="neuron:1", enable_timing=True)
    e1.record(s)
    e2.record(s)
    assert e1.elapsed_time(e2) >= 0
    s.synchronize()
    assert s.query()


def test_event_elapsed_time_with_generic_end_event():
    # The same timing with a plain torch.Event as the end marker.
    start = torch.neuron.Event(enable_timing=True)
    end = torch.Event(device="neuron", enable_timing=True)
    with host_event_time():
        start.record()
        time.sleep(0.02)
        end.record()
        assert start.elapsed_time(end) >= 15
    untimed = torch.Event(device="neuron")
    untimed.record()
    with pytest.raises((RuntimeError, ValueError), match="enable_timing"):
        start.elapsed_time(untimed)
