"""One record of what ran: metrics, estimate, stream clocks and events agree.

Every op, copy, compiled kernel and NKI kernel is recorded once in the
accounting layer; these tests run each kind of work and check that every view
(``metrics``, ``estimate``, the stream clocks, the per-call events) reports the
same calls, bytes and modelled time. Settings changed through
``torchneuron.config`` reach the C++ core with no manual call.
"""

from __future__ import annotations

import ast
import pathlib
import warnings

import pytest
import torch

import torchneuron
import torchneuron.nki as nki
import torchneuron.nki.language as nl
from torchneuron import config
from torchneuron.device import accounting
from torchneuron.device.fallback import NeuronCPUFallbackWarning


@nki.jit
def double_kernel(a):
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    for i in range(a.shape[0] // 128):
        rows = slice(i * 128, (i + 1) * 128)
        nl.store(out[rows, :], value=nl.add(nl.load(a[rows, :]), nl.load(a[rows, :])))
    return out


def _estimate_seconds(est, target="trn2") -> float:
    return est.targets[target].seconds


def test_estimate_of_an_nki_kernel_equals_its_stream_charge():
    x = torch.randn(256, 64, device="neuron")
    double_kernel(x)  # traced once
    torch.neuron.synchronize()
    start = accounting.stream_clock(0)
    est = torchneuron.estimate(lambda: double_kernel(x), targets=("trn2",))
    charged = accounting.stream_clock(0) - start
    assert torch.equal(est.result.cpu(), x.cpu() * 2)
    assert charged > 0
    [row] = [o for o in est.targets["trn2"].ops if "double_kernel" in o.op]
    assert row.calls == 1
    assert row.seconds == pytest.approx(charged, rel=1e-9)
    assert _estimate_seconds(est) == pytest.approx(charged, rel=1e-9)


def test_estimate_matches_the_stream_clock_for_eager_work_and_copies():
    model = torch.nn.Linear(64, 32).to("neuron")
    x = torch.randn(16, 64)

    def step():
        y = model(x.to("neuron"))
        return y.sum().item()

    step()
    torch.neuron.synchronize()
    start = accounting.stream_clock(0)
    est = torchneuron.estimate(step, targets=("trn2",))
    assert _estimate_seconds(est) == pytest.approx(accounting.stream_clock(0) - start, rel=1e-6)
    labels = {o.op for o in est.targets["trn2"].ops}
    assert {"copies host -> device", "copies device -> host", "aten::addmm"} <= labels


def test_estimate_leaves_the_metrics_counters_alone():
    torchneuron.metrics.reset()
    torch.ones(8, device="neuron").add(1)
    before = torchneuron.metrics.counters()
    torchneuron.estimate(lambda: torch.ones(8, device="neuron").add(1).cpu(), targets=("trn2",))
    after = torchneuron.metrics.counters()
    assert after["ops"] > before["ops"]  # estimate's work is counted, nothing was zeroed
    assert after["copies_to_host"] == before["copies_to_host"] + 1


def test_copies_are_counted_once_with_the_cost_model_off():
    """The transfer counter behind estimate is the one metrics reads: with the cost
    model off both still see the copies (before: metrics one each way, estimate none)."""
    host = torch.randn(32, 32)
    with config.override(TORCHNEURON_COST_MODEL="0"):
        torchneuron.metrics.reset()
        start = accounting.stream_clock(0)
        back = host.to("neuron").cpu()
        assert accounting.stream_clock(0) == start  # nothing charged
        counters = torchneuron.metrics.counters()
        moved = accounting.transfers()
    assert torch.equal(back, host)
    assert counters["copies_to_device"] == moved["host_to_device"][0] == 1
    assert counters["copies_to_host"] == moved["device_to_host"][0] == 1
    assert counters["bytes_to_device"] == moved["host_to_device"][1] == host.nbytes


def test_settings_reach_the_core_without_a_configure_call():
    x = torch.randn(64, 64, device="neuron")
    x @ x
    start = accounting.stream_clock(0)
    with config.override(TORCHNEURON_COST_MODEL="0"):
        x @ x
        assert accounting.stream_clock(0) == start
    x @ x  # back on when the override ends
    assert accounting.stream_clock(0) > start
    with config.override(TORCHNEURON_CPU_FALLBACK="0"):
        with pytest.raises(NotImplementedError, match="TORCHNEURON_CPU_FALLBACK=0"):
            torch.ones(4, dtype=torch.float64, device="neuron").add(1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NeuronCPUFallbackWarning)
        torch.ones(4, dtype=torch.float64, device="neuron").add(1)  # allowed again


def test_a_bad_setting_is_refused_and_the_old_one_stays():
    with pytest.raises(ValueError, match="TORCHNEURON_COST_MODEL"):
        with config.override(TORCHNEURON_COST_MODEL="maybe"):
            pass
    x = torch.randn(8, 8, device="neuron")
    start = accounting.stream_clock(0)
    x @ x
    assert accounting.stream_clock(0) > start  # still on


def test_events_record_every_kind_of_work():
    x = torch.randn(256, 64, device="neuron")
    double_kernel(x)
    with accounting.recording() as events:
        y = double_kernel(x)
        z = (y * 2).cpu()
        torch.randn(4).to("neuron")
    kinds = {e.kind for e in events}
    assert {"nki_kernel", "op", "copy", "host_sync"} <= kinds, kinds
    [kernel] = [e for e in events if e.kind == "nki_kernel"]
    [stats] = [w for w in accounting.work_totals(accounting.WorkKind.NKI_KERNEL) if w.name == kernel.name]
    assert kernel.seconds == pytest.approx(stats.modeled_seconds / stats.calls, rel=1e-9)
    assert torch.equal(z, x.cpu() * 4)
    # each stream's events are contiguous on its modelled clock
    on_stream = [e for e in events if e.device == 0 and e.kind != "host_sync"]
    for a, b in zip(on_stream, on_stream[1:]):
        assert b.device_start == pytest.approx(a.device_start + a.seconds, rel=1e-9, abs=1e-15)


def test_record_work_checks_its_arguments():
    with pytest.raises(ValueError, match="NKI kernels and collectives"):
        accounting.record_work(accounting.WorkKind.OP, "x", 0, 1e-6)
    with pytest.raises(RuntimeError, match="Invalid device index"):
        accounting.record_work(accounting.WorkKind.COLLECTIVE, "all_reduce", 99, 1e-6)
    with pytest.raises(ValueError, match="non-negative"):
        accounting.record_work(accounting.WorkKind.COLLECTIVE, "all_reduce", 0, -1.0)


def test_only_the_device_layer_imports_the_core():
    """The record has one reader: nothing outside torchneuron/device imports torchneuron._C
    (testing's memory check and compiled code's allocator are named by device/_core)."""
    root = pathlib.Path(torchneuron.__file__).parent
    offenders = []
    for path in root.rglob("*.py"):
        relative = path.relative_to(root).as_posix()
        if relative.startswith("device/"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module in ("torchneuron", "torchneuron._C"):
                if node.module == "torchneuron._C" or any(a.name == "_C" for a in node.names):
                    offenders.append(relative)
            elif isinstance(node, ast.Import) and any(a.name == "torchneuron._C" for a in node.names):
                offenders.append(relative)
    assert offenders == []


def test_trace_estimate_and_clocks_agree_for_eager_compiled_and_nki_work(tmp_path):
    """One record, three views: per device, the trace's device time, the stream clock's
    advance and estimate's total on the configured chip are the same number."""
    import json

    from torch.profiler import ProfilerActivity, profile

    from torchneuron.device import cost

    devices = list(range(min(2, torch.neuron.device_count())))
    torch._dynamo.reset()

    @torch.compile(backend="neuron")
    def fused(t):
        return torch.tanh(t * 3 - 1).sum(dim=0)

    inputs = {d: torch.randn(256, 64, device=f"neuron:{d}") for d in devices}

    def work():
        out = []
        for d, t in inputs.items():
            with torch.neuron.device(d):
                out.append(fused(t))
                out.append(double_kernel(t).mean())
                out.append((t @ t.T).relu().sum())
        return out

    work()  # compile, trace and cost outside the measured run
    torch.neuron.synchronize()
    clocks = {d: _clock(d) for d in devices}
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]) as prof:
        est = torchneuron.estimate(work, targets=(cost.target().chip.name,))
    advanced = {d: _clock(d) - clocks[d] for d in devices}
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(str(path))
    device_events = [e for e in json.loads(path.read_text())["traceEvents"]
                     if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy")]
    for d in devices:
        mine = [e for e in device_events if e["args"]["device"] == d]
        kinds = {e["args"]["kind"] for e in mine}
        assert {"op", "compiled_kernel", "nki_kernel"} <= kinds, kinds
        traced_us = sum(e["dur"] for e in mine)
        assert traced_us == pytest.approx(advanced[d] * 1e6, abs=1e-3 * len(mine))
    [target] = est.targets.values()
    assert target.seconds == pytest.approx(sum(advanced.values()), rel=1e-9)


def _clock(device: int) -> float:
    with torch.neuron.device(device):
        return accounting.stream_clock(device)


def test_set_value_applies_for_the_process_and_a_bad_value_leaves_the_old(monkeypatch):
    """config.set_value: as if exported before start, applied to the C++ core at once;
    a bad value raises naming the variable and the previous setting stays in force."""
    monkeypatch.delenv("TORCHNEURON_COST_MODEL", raising=False)
    x = torch.randn(16, 16, device="neuron")
    try:
        config.set_value("TORCHNEURON_COST_MODEL", "0")
        start = accounting.stream_clock(0)
        x @ x
        assert accounting.stream_clock(0) == start
        with pytest.raises(ValueError, match="TORCHNEURON_COST_MODEL='maybe'"):
            config.set_value("TORCHNEURON_COST_MODEL", "maybe")
        assert config.get("TORCHNEURON_COST_MODEL") == "0"
        x @ x
        assert accounting.stream_clock(0) == start  # still off
    finally:
        config.set_value("TORCHNEURON_COST_MODEL", None)
    x @ x
    assert accounting.stream_clock(0) > start
