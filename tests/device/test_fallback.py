"""Counted CPU fallback: ops real Trainium runs on the host are counted, warned about
once with the call site, charged their transfers, and refused in strict mode."""

import warnings

import pytest
import torch

import torchneuron
from torchneuron import config
from torchneuron.device.fallback import NeuronCPUFallbackWarning

from conftest import run_python

metrics = torchneuron.metrics


pytestmark = pytest.mark.usefixtures("fresh_accounting")


def _by_op(op: str) -> list:
    return [c for c in metrics.ops() if c.op == op]


def test_device_ops_are_counted_per_op_and_dtype():
    x = torch.randn(8, 8, device="neuron")
    for _ in range(3):
        x = x @ x
    (x.to(torch.bfloat16) + 1).sum()
    mm = _by_op("aten::mm")
    assert [(c.dtypes, c.calls, c.cpu_fallback) for c in mm] == [(("float32", "float32"), 3, False)]
    assert not metrics.fallbacks()
    assert metrics.counters()["ops"] >= 5


def test_float64_op_falls_back_counted_with_bytes_and_call_site():
    a = torch.randn(4, 4, dtype=torch.float64)
    an = a.to("neuron")
    with pytest.warns(NeuronCPUFallbackWarning, match="float64 is not a Trainium dtype") as record:
        got = an * an
    assert got.device.type == "neuron" and torch.equal(got.cpu(), a * a)  # still correct
    assert "test_fallback.py" in str(record[0].message)  # the user's call site
    (mul,) = [c for c in metrics.fallbacks() if c.op == "aten::mul.Tensor"]
    assert mul.dtypes == ("float64", "float64") and mul.calls == 1
    assert mul.bytes_to_host == 2 * a.nbytes and mul.bytes_to_device == a.nbytes
    assert mul.call_site and "test_fallback.py" in mul.call_site
    counters = metrics.counters()
    assert counters["cpu_fallbacks"] == 1 and counters["fallback_bytes_to_host"] == 2 * a.nbytes


def test_fallback_warns_once_per_op_but_counts_every_call():
    x = torch.randn(6, 6, device="neuron")
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        for _ in range(3):
            torch.linalg.eigh(x @ x.T)
    ours = [w for w in seen if issubclass(w.category, NeuronCPUFallbackWarning)]
    assert len(ours) == 1 and "linalg_eigh" in str(ours[0].message)
    (eigh,) = [c for c in metrics.fallbacks() if "eigh" in c.op]
    assert eigh.calls == 3 and "decompositions" in eigh.reason


@pytest.mark.parametrize("make, op", [
    (lambda: torch.arange(10, device="neuron").nonzero(), "aten::nonzero"),
    (lambda: torch.fft.rfft(torch.randn(16, device="neuron")), "aten::_fft_r2c"),
    (lambda: torch.randn(3, device="neuron", dtype=torch.complex64).abs(), "aten::abs.out"),
])
def test_documented_fallback_families(make, op):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NeuronCPUFallbackWarning)
        make()
    assert op in {c.op for c in metrics.fallbacks()}, metrics.report()


def test_int64_stays_on_device():
    i = torch.arange(10, device="neuron")
    (i * 3 + 1).sum()
    assert not metrics.fallbacks()


def test_strict_mode_raises_before_anything_changes():
    x = torch.randn(3, 3, dtype=torch.float64, device="neuron")
    before = x.clone()
    with config.override(TORCHNEURON_CPU_FALLBACK="0"):
        with pytest.raises(NotImplementedError, match=r"float64 is not a Trainium dtype.*TORCHNEURON_CPU_FALLBACK=0"):
            x.mul_(2)
        assert torch.equal(x.cpu(), before.cpu())  # the in-place op did not run
        y = torch.randn(3, 3, device="neuron")  # float32 keeps working
        assert torch.equal((y + y).cpu(), y.cpu() * 2)
    x.mul_(2)  # allowed again
    assert torch.equal(x.cpu(), before.cpu() * 2)


def test_strict_mode_from_environment_in_a_fresh_process():
    out = run_python("""
        import torch
        try:
            torch.ones(2, dtype=torch.float64, device="neuron") + 1
        except NotImplementedError as e:
            print("refused:", "float64 is not a Trainium dtype" in str(e))
    """, env={"TORCHNEURON_CPU_FALLBACK": "0"})
    assert out.returncode == 0, out.stderr
    assert "refused: True" in out.stdout


def test_bad_fallback_setting_is_a_clear_error():
    with pytest.raises(ValueError, match="TORCHNEURON_CPU_FALLBACK='maybe'.*use 1.*or 0"):
        with config.override(TORCHNEURON_CPU_FALLBACK="maybe"):
            pass


def test_host_syncs_and_transfers_are_counted():
    x = torch.randn(100)
    n = x.to("neuron")  # 400 bytes in
    n.sum().item()  # a sync
    n.cpu()  # a sync, 400 bytes out
    repr(n)  # printing reads values too
    c = metrics.counters()
    assert c["copies_to_device"] == 1 and c["bytes_to_device"] == x.nbytes
    assert c["host_syncs"] >= 3 and c["bytes_to_host"] >= x.nbytes + 4
    metrics.reset()
    assert metrics.counters()["host_syncs"] == 0 and metrics.ops() == []


def test_report_lists_fallbacks_and_frequent_ops():
    x = torch.randn(4, 4, device="neuron")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NeuronCPUFallbackWarning)
        torch.linalg.inv(x @ x.T + torch.eye(4, device="neuron"))
    text = metrics.report()
    assert "CPU fallbacks" in text and "linalg_inv" in text and "aten::mm" in text


def test_counts_are_consistent_across_threads():
    import threading

    x = torch.randn(16, device="neuron")

    def work():
        for _ in range(200):
            torch.add(x, x)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    (add,) = _by_op("aten::add.Tensor")
    assert add.calls == 800


def test_text_reports_leave_no_file_open(monkeypatch):
    """metrics.report() and str(estimate) render with rich into memory: they used to open
    /dev/null per call and never close it (a ResourceWarning in every user's run)."""
    import gc
    import sys

    unraisable = []  # a warning raised by a finalizer (an unclosed file's) arrives here
    monkeypatch.setattr(sys, "unraisablehook", unraisable.append)
    x = torch.randn(8, 8, device="neuron")
    with warnings.catch_warnings():
        warnings.simplefilter("error", ResourceWarning)
        report = torchneuron.metrics.report()
        text = str(torchneuron.estimate(lambda: x @ x))
        gc.collect()
    assert not unraisable, [str(u.exc_value) for u in unraisable]
    assert "aten::mm" in text and report
