"""Modelled Trainium time: events read each stream's modelled clock, and
torchneuron.estimate models a function on several chips."""

import pytest
import torch

import torchneuron
from torchneuron import config
from torchneuron.device import cost
from torchneuron.hardware import cost as hw_cost

from conftest import run_python


def _timed(fn) -> float:
    start, end = torch.neuron.Event(enable_timing=True), torch.neuron.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    return start.elapsed_time(end)


def _clocks(*devices: int) -> list[float]:
    """Modelled seconds on the current stream of each device."""
    from torchneuron import _C
    return [_C._stream_clock(d) for d in devices]


def test_event_time_of_a_matmul_is_the_cost_model_figure():
    a = torch.randn(1024, 2048, device="neuron", dtype=torch.bfloat16)
    b = torch.randn(2048, 512, device="neuron", dtype=torch.bfloat16)
    ms = _timed(lambda: a @ b)
    expected = hw_cost.op_cost("aten::mm", [(1024, 2048), (2048, 512)], ["bfloat16"] * 2,
                               cost.target(), out_shapes=[(1024, 512)], out_dtypes=["bfloat16"])
    assert ms == pytest.approx(expected.seconds * 1e3, rel=1e-9)
    # A large bf16 matmul models close to the logical core's TensorE peak.
    peak_ms = 2 * 1024 * 2048 * 512 / cost.target().tensor_flops_per_second("bfloat16") * 1e3
    assert peak_ms <= ms < 1.5 * peak_ms


def test_event_time_grows_with_work_and_is_monotonic():
    x = torch.randn(256, 256, device="neuron")
    times = [_timed(lambda: [x @ x for _ in range(n)]) for n in (1, 2, 4)]
    assert 0 < times[0] < times[1] < times[2]
    assert times[2] == pytest.approx(4 * times[0], rel=1e-6)  # same op, same cost each time
    e1, e2, e3 = (torch.neuron.Event(enable_timing=True) for _ in range(3))
    e1.record(); x.sin(); e2.record(); x.sin(); e3.record()  # noqa: E702
    assert 0 < e1.elapsed_time(e2) <= e1.elapsed_time(e3)


def test_fp32_matmul_models_slower_than_bf16():
    a = torch.randn(2048, 2048, device="neuron")  # large enough to be compute-bound
    fp32 = _timed(lambda: a @ a)
    bf16_a = a.bfloat16()
    bf16 = _timed(lambda: bf16_a @ bf16_a)
    assert fp32 > 2 * bf16  # FP32 runs at a quarter of the BF16 TensorE rate


def test_streams_have_their_own_clock_and_wait_event_joins_them():
    x = torch.randn(512, 512, device="neuron")
    side = torch.neuron.Stream()
    main = torch.neuron.current_stream()
    start = torch.neuron.Event(enable_timing=True)
    start.record(main)
    with torch.neuron.stream(side):
        side_start = torch.neuron.Event(enable_timing=True)
        side_start.record()
        for _ in range(4):
            x @ x
        done = torch.neuron.Event(enable_timing=True)
        done.record()
    assert side_start.elapsed_time(done) > 0
    before_wait = torch.neuron.Event(enable_timing=True)
    before_wait.record(main)
    main.wait_event(done)  # main cannot run ahead of the side stream's work
    after_wait = torch.neuron.Event(enable_timing=True)
    after_wait.record(main)
    assert start.elapsed_time(before_wait) == 0  # nothing ran on main
    assert after_wait.elapsed_time(done) <= 0 <= before_wait.elapsed_time(after_wait)


def test_cpu_fallback_is_charged_transfer_time():
    x = torch.randn(1024, 1024, device="neuron", dtype=torch.float64)
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ms = _timed(lambda: x * 2)
    host_link = cost.target().host_link_bytes_per_second
    assert ms * 1e-3 >= 2 * x.nbytes / host_link  # the input out and the result back


def test_host_event_time_switch():
    with config.override(TORCHNEURON_EVENT_TIME="host"):  # reaches the core by itself
        x = torch.randn(64, 64, device="neuron")
        ms = _timed(lambda: [x @ x for _ in range(50)])
    assert ms > 0  # wall-clock time, not the model's (which would be ~50 x 3 us)


def test_bad_event_time_setting_is_a_clear_error():
    with pytest.raises(ValueError, match="TORCHNEURON_EVENT_TIME='gpu'.*'modeled'.*'host'"):
        with config.override(TORCHNEURON_EVENT_TIME="gpu"):
            pass


def test_estimate_reports_time_flops_mfu_and_memory_for_two_chips():
    torch.manual_seed(0)
    m = torch.nn.Linear(512, 1024, bias=False).to("neuron", torch.bfloat16)
    x = torch.randn(256, 512, device="neuron", dtype=torch.bfloat16)
    est = torchneuron.estimate(lambda: m(x).float().sum())
    assert set(est.targets) == {"trn2", "trn3"}
    assert est.result.device.type == "neuron"
    # the same bf16 linear on CPU: neuron runs CPU's kernel on the same bytes, so bit for bit
    expected_cpu = torch.nn.functional.linear(x.cpu(), m.weight.detach().cpu()).float().sum()
    assert torch.equal(est.result.detach().cpu(), expected_cpu)
    trn2 = est.targets["trn2"]
    (mm,) = [o for o in trn2.ops if o.op == "aten::mm"]
    assert mm.flops == 2 * 256 * 512 * 1024 and mm.calls == 1
    assert trn2.flops >= mm.flops and 0 < trn2.mfu < 1
    assert trn2.seconds == pytest.approx(sum(o.seconds for o in trn2.ops))
    assert est.targets["trn3"].seconds != trn2.seconds
    assert est.peak_memory_bytes >= 256 * 1024 * 2  # the matmul's bf16 output
    assert "MFU" in str(est) and "aten::mm" in str(est)


def test_estimate_costs_copies_that_leave_a_device_as_the_streams_are_charged():
    x = torch.randn(512, 512, device="neuron")
    host = torch.randn(256, 256)

    def moves():
        before = _clocks(0, 1)
        y, z, w = x.to("neuron:1"), x.cpu(), host.to("neuron")
        return [after - b for after, b in zip(_clocks(0, 1), before)]

    est = torchneuron.estimate(moves, targets=("trn2", "trn3"))
    trn2 = {o.op: o for o in est.targets["trn2"].ops}
    to_peer = trn2["copies device -> device (same chip)"]
    to_host, to_device = trn2["copies device -> host"], trn2["copies host -> device"]
    assert (to_peer.calls, to_host.calls, to_device.calls) == (1, 1, 1)
    on = cost.target("trn2")
    assert to_peer.seconds == pytest.approx(cost.device_copy_seconds(x.nbytes, on, cross_chip=False))
    assert to_host.seconds == pytest.approx(hw_cost.DMA_FIXED_SECONDS + x.nbytes / on.host_link_bytes_per_second)
    assert to_device.seconds == pytest.approx(cost.transfer_seconds("host_to_device", 1, host.nbytes, on))
    # The configured target (trn2 here) charged those times to device 0's stream (the
    # peer copy also waits for device 1's clock, so the advance can only be longer).
    clock0, clock1 = est.result
    assert clock0 >= (to_peer.seconds + to_host.seconds + to_device.seconds) * (1 - 1e-9) and clock1 > 0
    trn3 = {o.op: o for o in est.targets["trn3"].ops}
    assert trn3["copies device -> host"].calls == 1


def test_estimate_needs_a_target():
    with pytest.raises(ValueError, match="at least one target"):
        torchneuron.estimate(lambda: None, targets=())


def test_cost_model_off_in_a_fresh_process():
    out = run_python("""
        import torch, torchneuron
        x = torch.randn(128, 128, device="neuron")
        s, e = torch.neuron.Event(enable_timing=True), torch.neuron.Event(enable_timing=True)
        s.record(); x @ x; e.record()
        print("modelled ops:", sum(o.modeled_seconds for o in torchneuron.metrics.ops()))
    """, env={"TORCHNEURON_COST_MODEL": "0"})
    assert out.returncode == 0, out.stderr
    assert "modelled ops: 0" in out.stdout


def test_optimizer_steps_reuse_cost_entries():
    # Learning-rate-like float arguments change every step; they must not make
    # every step a new (uncached, Python-costed) entry.
    from torchneuron import _C

    model = torch.nn.Linear(16, 16).to("neuron")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(4, 16, device="neuron")

    def step():
        opt.zero_grad()
        model(x).square().mean().backward()
        opt.step()

    step(); step()  # noqa: E702
    known = len(_C._cost_entries())
    step(); step()  # noqa: E702
    assert len(_C._cost_entries()) == known


def test_convolution_is_counted_and_charged_with_the_conv_formula():
    conv = torch.nn.Conv2d(16, 32, 3, padding=1).to("neuron", torch.bfloat16)
    x = torch.randn(8, 16, 32, 32, device="neuron", dtype=torch.bfloat16, requires_grad=True)
    est = torchneuron.estimate(lambda: conv(x).float().sum().backward())
    ops = {o.op: o for o in est.targets["trn2"].ops}
    fwd = ops["aten::convolution_overrideable"]
    assert fwd.calls == 1 and fwd.flops >= 2 * (8 * 32 * 32 * 32) * 16 * 9  # 2 x MACs (+ bias)
    bwd = ops["aten::convolution_backward_overrideable"]
    assert bwd.flops >= 2 * fwd.flops * 0.9  # grad input and grad weight
    assert est.targets["trn2"].mfu > 0


def test_host_to_device_copies_are_charged_transfer_time():
    x = torch.randn(1 << 20)  # 4 MiB
    t = cost.target()
    ms = _timed(lambda: x.to("neuron"))
    expected = (hw_cost.DMA_FIXED_SECONDS + x.nbytes / t.host_link_bytes_per_second) * 1e3
    assert ms == pytest.approx(expected, rel=1e-6)
    n = x.to("neuron")
    assert _timed(lambda: n.cpu()) == pytest.approx(expected, rel=1e-6)


def test_copies_within_a_device_are_charged_as_hbm_copies():
    x = torch.randn(512, 1024, device="neuron")  # 2 MiB
    t = cost.target()
    (before,) = _clocks(0)
    y = x.clone()
    (after,) = _clocks(0)
    # A same-dtype copy is memory-bound: one launch, then the bytes read and written.
    assert after - before == pytest.approx(t.launch_seconds + 2 * x.nbytes / t.hbm_bytes_per_second,
                                           rel=1e-9)
    (before,) = _clocks(0)
    h = x.to(torch.bfloat16)  # a converting copy: the cost model's _to_copy to bf16
    (after,) = _clocks(0)
    cast = hw_cost.op_cost("aten::_to_copy", [(512, 1024)], ["float32"], t,
                           out_shapes=[(512, 1024)], out_dtypes=["bfloat16"])
    assert after - before == pytest.approx(cast.seconds, rel=1e-9)
    assert torch.equal(y.cpu(), x.cpu()) and torch.equal(h.cpu(), x.cpu().to(torch.bfloat16))
    est = torchneuron.estimate(lambda: x.t().contiguous())
    (copy,) = [o for o in est.targets["trn2"].ops if o.op == "aten::_copy_from"]
    assert copy.calls == 1 and copy.seconds > 0


def test_copies_between_devices_are_charged_on_both_streams():
    t = cost.target()
    x = torch.randn(1 << 20, device="neuron:0")  # 4 MiB
    torch.randn(256, 256, device="neuron:1").exp_()  # the two clocks differ
    assert _clocks(0) != _clocks(1)
    start = max(_clocks(0, 1))
    y = x.to("neuron:1")
    # One DMA (fixed cost) at the slower of a logical core's DMA engines and its HBM share
    # (trainium-facts.md, Chips); both streams wait for each other, then for the copy.
    rate = min(t.chip.dma_bytes_per_second_per_core * t.lnc, t.hbm_bytes_per_second)
    expected = hw_cost.DMA_FIXED_SECONDS + x.nbytes / rate
    assert expected == pytest.approx(cost.device_copy_seconds(x.nbytes, t, cross_chip=False))
    assert _clocks(0, 1) == pytest.approx([start + expected] * 2, rel=1e-9)
    assert y.device == torch.device("neuron:1") and torch.equal(y.cpu(), x.cpu())
    y.copy_(x.to(torch.bfloat16))  # the same two streams; the bf16 cast is charged on neuron:0
    assert _clocks(0) == _clocks(1)


def test_copies_between_chips_cross_the_chip_link():
    from torchneuron import _C

    # Made-up rates: devices 0-1 on chip 0, 2-3 on chip 1; the copy's rate follows the chips.
    fixed, same_chip, cross_chip = 1e-6, 1e12, 1e9
    _C._set_transfer_model(fixed, 32e9, same_chip, cross_chip, [0, 0, 1, 1])
    try:
        x = torch.randn(1 << 18, device="neuron:0")  # 1 MiB
        for dst, rate in ((1, same_chip), (2, cross_chip)):
            start = max(_clocks(0, dst))
            x.to(f"neuron:{dst}")
            assert _clocks(0, dst) == pytest.approx([start + fixed + x.nbytes / rate] * 2, rel=1e-9)
    finally:
        cost.configure()  # the real transfer model again, for the tests that follow
    # With the published figures the chip link never binds: NeuronLink carries more than
    # one logical core's DMA engines (trainium-facts.md, Chips).
    for chip in ("trn1", "trn2", "trn3"):
        on = hw_cost.cost_target(chip)
        assert cost.device_link_bytes_per_second(on, cross_chip=True) == \
            cost.device_link_bytes_per_second(on, cross_chip=False) < on.chip.chip_link_bytes_per_second


def test_copy_between_chips_of_a_trn2_48xlarge():
    out = run_python("""
        import torch
        from torchneuron import _C
        from torchneuron.device import cost
        x = torch.randn(1 << 20, device="neuron:0")
        start = max(_C._stream_clock(0), _C._stream_clock(4))
        y = x.to("neuron:4")  # logical core 4 is on the second chip
        src, dst = _C._stream_clock(0) - start, _C._stream_clock(4) - start
        assert torch.equal(y.cpu(), x.cpu())
        print("clocks", src, dst, cost.device_copy_seconds(x.nbytes, cost.target(), cross_chip=True))
    """, env={"TORCHNEURON_INSTANCE": "trn2.48xlarge"})
    assert out.returncode == 0, out.stderr
    line = next(line for line in out.stdout.splitlines() if line.startswith("clocks"))
    src, dst, expected = map(float, line.split()[1:])
    assert src == dst == pytest.approx(expected, rel=1e-9)
