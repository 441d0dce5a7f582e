"""A copy within one neuron device is placed like any op: the record, the stream charge,
the trace and ``estimate`` agree on where it runs.

A cast to a dtype Trainium lacks (``x.double()``) cannot run on the device: real
TorchNeuron sends it to the host. Before, metrics counted it as an on-device copy
while the cost model charged a CPU fallback's transfers.
"""

from __future__ import annotations

import warnings

import pytest
import torch

import torchneuron
from torchneuron import config, metrics
from torchneuron.device import accounting, fallback
from torchneuron.device.fallback import NeuronCPUFallbackWarning
from torchneuron.testing import is_on_neuron

COPY = "aten::_copy_from"


def _copy_totals(dtypes: tuple[str, ...]) -> accounting.OpTotals:
    rows = [o for o in accounting.op_totals() if o.op == COPY and o.dtypes == dtypes and o.calls]
    assert len(rows) == 1, [(o.op, o.dtypes, o.calls) for o in accounting.op_totals()]
    return rows[0]


def test_cast_to_float64_is_one_cpu_fallback_in_every_view(monkeypatch):
    monkeypatch.setattr(fallback, "_warned_ops", set())  # warned once per process: forget earlier tests'
    x = torch.randn(64, 64, device="neuron")
    torch.neuron.synchronize()
    metrics.reset()
    with warnings.catch_warnings(record=True) as caught, accounting.recording() as events:
        warnings.simplefilter("always")
        y = x.double()
    assert is_on_neuron(y) and torch.equal(y.cpu(), x.cpu().double())

    totals = _copy_totals(("float32", "float64"))
    assert totals.cpu_fallback and "float64" in totals.reason
    assert (totals.calls, totals.bytes_to_host, totals.bytes_to_device) == (1, x.nbytes, y.nbytes)
    counters = metrics.counters()
    assert counters["cpu_fallbacks"] == 1
    assert counters["fallback_bytes_to_host"] == x.nbytes
    assert counters["fallback_bytes_to_device"] == y.nbytes
    assert [f.op for f in metrics.fallbacks()] == [COPY]
    assert any(issubclass(w.category, NeuronCPUFallbackWarning) and COPY in str(w.message)
               for w in caught)

    [event] = [e for e in events if e.name == COPY]
    assert event.kind == "cpu_fallback"
    assert event.seconds == pytest.approx(totals.modeled_seconds, abs=1e-9)  # totals keep whole ns
    # The charge is the fallback's transfers: the source to the host, the result back.
    expected = torchneuron.device.cost.op_cost(
        COPY, {"self": ("tensor", (64, 64), "float32", True), "dst": ("tensor", (64, 64), "float64", True)},
        [("tensor", (64, 64), "float64", True)], cpu_fallback=True)
    assert event.seconds == pytest.approx(expected.seconds, rel=1e-9)


def test_estimate_marks_the_cast_as_a_cpu_fallback():
    x = torch.randn(32, 32, device="neuron")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NeuronCPUFallbackWarning)
        report = torchneuron.estimate(lambda: x.double())
    for target in report.targets.values():
        [row] = [o for o in target.ops if o.op == COPY]
        assert row.cpu_fallback and row.calls == 1 and row.seconds > 0


def test_copy_in_a_supported_dtype_stays_on_the_device():
    x = torch.randn(16, 16, device="neuron")
    torch.neuron.synchronize()
    metrics.reset()
    with accounting.recording() as events:
        y = x.to(torch.bfloat16)
    assert torch.equal(y.cpu(), x.cpu().to(torch.bfloat16))
    totals = _copy_totals(("float32", "bfloat16"))
    assert not totals.cpu_fallback and totals.calls == 1 and totals.bytes_to_host == 0
    assert metrics.counters()["cpu_fallbacks"] == 0
    [event] = [e for e in events if e.name == COPY]
    assert event.kind == "copy" and event.seconds == pytest.approx(totals.modeled_seconds, abs=1e-9)  # totals keep whole ns


def test_strict_mode_refuses_the_cast_before_anything_changes():
    x = torch.randn(8, 8, device="neuron")
    dst = torch.zeros(8, 8, dtype=torch.float64, device="neuron")
    torch.neuron.synchronize()
    metrics.reset()
    with config.override(TORCHNEURON_CPU_FALLBACK="0"):
        with pytest.raises(NotImplementedError, match=r"float64 is not a Trainium dtype.*TORCHNEURON_CPU_FALLBACK=0"):
            dst.copy_(x)
        assert torch.equal(dst.cpu(), torch.zeros(8, 8, dtype=torch.float64))
        assert torch.equal(x.to(torch.float16).cpu(), x.cpu().half())  # supported casts still run
    assert metrics.counters()["cpu_fallbacks"] == 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NeuronCPUFallbackWarning)
        dst.copy_(x)  # allowed again
    assert torch.equal(dst.cpu(), x.cpu().double())


def test_with_the_cost_model_off_the_cast_is_still_a_fallback_event():
    x = torch.randn(8, 8, device="neuron")
    with config.override(TORCHNEURON_COST_MODEL="0"), warnings.catch_warnings():
        warnings.simplefilter("ignore", NeuronCPUFallbackWarning)
        with accounting.recording() as events:
            x.double()
    [event] = [e for e in events if e.name == COPY]
    assert event.kind == "cpu_fallback" and event.seconds == 0
