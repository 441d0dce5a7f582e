"""Cost model reports: table, timeline, Chrome trace, and the nki.benchmark / nki.profile / estimate API.

The kernels here record instructions directly through the run (no ISA needed), so
the plumbing is tested independently of the simulator's instruction set.
"""

from __future__ import annotations

import json
import types

import numpy as np
import pytest

from torchneuron.nki import benchmarking, context
from torchneuron.nki import cost as C
from torchneuron.nki.errors import kernel_location
from torchneuron.nki.kernel import jit


def _record(opcode, engine, reads, writes, **attrs):
    return context.current().record(opcode, engine, tuple(t.operand() for t in reads),
                                    tuple(t.operand() for t in writes), kernel_location(), **attrs)


def copy_kernel(a, out):
    """A 'kernel' whose only device instruction is one HBM-to-HBM DMA (recorded, not computed)."""
    _record("dma_copy", "dma", [a], [out])  # the copy line
    if context.current().compute_values:
        out.write(a.read("dma_copy"))
    return out


def matmul_like_kernel(a, out):
    _record("dma_copy", "dma", [a], [out])
    _record("nc_matmul", "tensor", [a, a], [out], flops=2 * 128 * 128 * 128, stationary_free=128,
            moving_free=128)
    return out


def test_report_table_timeline_and_trace(tmp_path):
    a = np.ones((128, 128), np.float32)
    out = np.zeros((128, 128), np.float32)
    result, cost = benchmarking.profile(matmul_like_kernel, target="trn2")(a, out)
    assert isinstance(cost, C.KernelCost)
    np.testing.assert_array_equal(result, out)
    text = str(cost)
    for needle in ("modelled latency", "HFU", "MBU", "tensor", "dma", "nc_matmul", "utilisation",
                   "test_nki_cost_report.py", "kernel_location()"):
        assert needle in text, needle
    events = cost.timeline()
    assert [e.start_ns for e in events] == sorted(e.start_ns for e in events)
    mm = next(e for e in events if e.opcode == "nc_matmul")
    assert mm.engine == "tensor" and mm.queue is None and mm.location.startswith("test_nki_cost_report.py:")
    assert "kernel_location()" in mm.source  # the line that issued it (here: the recording helper)
    dma = next(e for e in events if e.opcode == "dma_copy")
    assert dma.queue == 0 and dma.track == "dma queue 0" and dma.bytes == 128 * 128 * 4
    assert mm.start_ns >= dma.end_ns  # the matmul reads what the DMA wrote

    path = tmp_path / "trace" / "k.json"
    trace = cost.to_chrome_trace(path)
    loaded = json.loads(path.read_text())
    assert loaded == json.loads(json.dumps(trace))
    complete = [e for e in loaded["traceEvents"] if e["ph"] == "X"]
    assert len(complete) == 2
    names = {e["args"]["name"] for e in loaded["traceEvents"] if e["name"] == "thread_name"}
    assert names == {"TensorE", "DMA queue 0"}
    x = next(e for e in complete if e["name"] == "nc_matmul")
    assert x["ts"] == pytest.approx(mm.start_ns / 1e3) and x["dur"] == pytest.approx(mm.duration_ns / 1e3)
    assert x["args"]["flops"] == 2 * 128 ** 3 and "location" in x["args"]
    assert loaded["otherData"]["target"] == "trn2"
    assert cost.to_chrome_trace()["traceEvents"]  # in memory, no file


def test_top_instructions_group_by_kernel_line():
    a = np.ones((128, 64), np.float32)

    def kernel(x, out):
        for _ in range(3):
            _record("tensor_copy", "vector", [x], [out])
        _record("activation", "scalar", [x], [out], op="exp")
        return out

    cost = benchmarking.estimate(kernel, a, np.zeros_like(a), target="trn1")
    top = cost.top_instructions()
    assert top[0]["opcode"] == "tensor_copy" and top[0]["count"] == 3
    assert top[0]["total_ns"] == pytest.approx(3 * C.MIN_II / 1.12)
    assert {t["opcode"] for t in top} == {"tensor_copy", "activation"}


def test_benchmark_decorator_reports_percentiles_and_writes_trace(tmp_path):
    trace = tmp_path / "profile.ntff"

    @benchmarking.benchmark(warmup=2, iters=5, save_neff_name="file.neff", save_trace_name=str(trace))
    def kernel(a, out):
        return copy_kernel(a, out)

    a = np.arange(128 * 512, dtype=np.float32).reshape(128, 512)
    out = kernel(a, np.zeros_like(a))
    np.testing.assert_array_equal(out, a)
    latency = kernel.benchmark_result.nc_latency
    expected = C.estimate(_run_of(copy_kernel, a)).latency_us  # the same kernel, modelled directly
    assert kernel.benchmark_result.cost.latency_us == pytest.approx(expected)
    values = {p: latency.get_latency_percentile(p) for p in benchmarking.LATENCY_PERCENTILES}
    assert all(v == pytest.approx(expected) for v in values.values())
    assert kernel.benchmark_result.warmup == 2 and kernel.benchmark_result.iters == 5
    assert json.loads(trace.read_text())["traceEvents"]
    with pytest.raises(ValueError, match="percentiles 0, 1, 10, 25, 50, 90, 99, 100"):
        latency.get_latency_percentile(95)
    assert kernel.__name__ == "kernel"


def _run_of(kernel, a):
    _, run = benchmarking.run_kernel(kernel, (a, np.zeros_like(a)), {}, target=None)
    return run


def test_benchmark_call_forms_and_validation():
    a = np.ones((128, 512), np.float32)
    wrapped = benchmarking.benchmark(jit(copy_kernel), target="trn1")
    wrapped(a, np.zeros_like(a))
    assert wrapped.benchmark_result.cost.target == "trn1"
    grid = benchmarking.benchmark(warmup=1, iters=1, target="trn2")(copy_kernel)
    with pytest.warns(DeprecationWarning, match="SPMD"):
        grid[2, 2](a, np.zeros_like(a))
    result = grid.benchmark_result
    assert result.cost.programs == 4 and result.cost.instruction_counts == {"dma": 4}
    single = C.estimate(_run_of(copy_kernel, a), "trn2").latency_us
    assert result.nc_latency.get_latency_percentile(50) == pytest.approx(4 * single)  # serial programs
    with pytest.raises(ValueError, match="iters"):
        benchmarking.benchmark(iters=0)
    with pytest.raises(ValueError, match="warmup"):
        benchmarking.benchmark(warmup=-1)


def test_profile_lnc2_and_legacy_decorator(tmp_path):
    a = np.ones((128, 512), np.float32)
    kernel = jit(copy_kernel)
    outputs, cost = benchmarking.profile(kernel[2], target="trn2")(a, np.zeros_like(a))
    assert cost.lnc == 2 and cost.cores == 2 and {e.core for e in cost.events} == {0, 1}
    one = benchmarking.estimate(kernel, a, np.zeros_like(a), target="trn2")
    assert cost.latency_ns == pytest.approx(one.latency_ns)  # the two cores run at the same time

    legacy = benchmarking.profile(working_directory=str(tmp_path), save_neff_name="x.neff", profile_nth=2)
    wrapped = legacy(copy_kernel)
    out = wrapped(a, np.zeros_like(a))
    np.testing.assert_array_equal(out, a)
    assert isinstance(wrapped.cost, C.KernelCost)
    assert json.loads((tmp_path / "copy_kernel.json").read_text())["traceEvents"]
    with pytest.raises(TypeError, match="unexpected keyword"):
        benchmarking.profile(working_dir="x")


def test_estimate_shape_only_runs_with_placeholders():
    seen = []

    def kernel(a, out):
        seen.append(context.current().compute_values)
        return copy_kernel(a, out)

    spec = types.SimpleNamespace(shape=(4096, 8192), dtype="bfloat16")
    out_spec = types.SimpleNamespace(shape=(4096, 8192), dtype="bfloat16")
    cost = benchmarking.estimate(kernel, spec, out_spec, target="trn1", compute_values=False)
    assert seen == [False]
    assert cost.dma_bytes == 4096 * 8192 * 2 and cost.target == "trn1"
    run = _run_of(copy_kernel, np.ones((128, 16), np.float32))
    assert benchmarking.estimate(run).latency_ns == pytest.approx(C.estimate(run).latency_ns)
    with pytest.raises(TypeError, match="no kernel arguments"):
        benchmarking.estimate(run, 1)
    with pytest.raises(TypeError, match="NKI kernel"):
        benchmarking.estimate(42)


def test_report_text_leaves_no_file_open(monkeypatch):
    """The text report renders into memory (it used to open os.devnull and never close it)."""
    import gc
    import sys
    import warnings

    unraisable = []  # an unclosed file's ResourceWarning is raised in its finalizer
    monkeypatch.setattr(sys, "unraisablehook", unraisable.append)
    _, cost = benchmarking.profile(matmul_like_kernel, target="trn2")(
        np.ones((128, 128), np.float32), np.zeros((128, 128), np.float32))
    with warnings.catch_warnings():
        warnings.simplefilter("error", ResourceWarning)
        text = cost.table()
        gc.collect()
    assert not unraisable, [str(u.exc_value) for u in unraisable]
    assert "modelled latency" in text
