"""The neuron caching allocator: statistics, caching, limits and out-of-memory."""

import gc

import pytest
import torch

from conftest import on_device, run_python

MiB = 2**20
GiB = 2**30


def stats(dev=0):
    return torch.neuron.memory_stats(dev)


def test_memory_stats_use_cuda_key_names():
    torch.ones(1, device="neuron")
    keys = set(stats())
    for metric in ("allocated_bytes", "reserved_bytes", "active_bytes", "requested_bytes",
                   "allocation", "segment", "active", "inactive_split", "inactive_split_bytes"):
        for pool in ("all", "small_pool", "large_pool"):
            for kind in ("current", "peak", "allocated", "freed"):
                assert f"{metric}.{pool}.{kind}" in keys
    for key in ("num_alloc_retries", "num_ooms", "num_device_alloc", "num_device_free"):
        assert key in keys
    nested = torch.neuron.memory_stats_as_nested_dict()
    assert nested["allocated_bytes"]["all"]["current"] == stats()["allocated_bytes.all.current"]


@pytest.mark.parametrize("dev", [0, 3])
@pytest.mark.parametrize("numel", [1, 1000, 300_000, 3 * MiB])
def test_memory_allocated_grows_by_rounded_size_and_drops_on_free(dev, numel):
    gc.collect()
    before = torch.neuron.memory_allocated(dev)
    req_before = stats(dev)["requested_bytes.all.current"]
    t = torch.empty(numel, dtype=torch.float32, device=f"neuron:{dev}")
    assert on_device(t, dev)
    grown = torch.neuron.memory_allocated(dev) - before
    nbytes = numel * 4
    assert stats(dev)["requested_bytes.all.current"] - req_before == nbytes
    assert nbytes <= grown <= nbytes * 1.25 + 512  # rounded up to a size class, not wildly
    assert torch.neuron.memory_reserved(dev) >= torch.neuron.memory_allocated(dev)
    # other devices are not charged
    other = (dev + 1) % torch.neuron.device_count()
    a_other = torch.neuron.memory_allocated(other)
    u = torch.empty(numel, device=f"neuron:{dev}")
    assert torch.neuron.memory_allocated(other) == a_other
    del u
    del t
    assert torch.neuron.memory_allocated(dev) == before


def test_small_and_large_pools():
    gc.collect()
    s0, l0 = stats()["allocated_bytes.small_pool.current"], stats()["allocated_bytes.large_pool.current"]
    small = torch.empty(MiB // 4 - 100, dtype=torch.uint8, device="neuron")  # < 1 MiB
    s1, l1 = stats()["allocated_bytes.small_pool.current"], stats()["allocated_bytes.large_pool.current"]
    assert s1 > s0 and l1 == l0
    large = torch.empty(2 * MiB, dtype=torch.uint8, device="neuron")  # >= 1 MiB
    s2, l2 = stats()["allocated_bytes.small_pool.current"], stats()["allocated_bytes.large_pool.current"]
    assert s2 == s1 and l2 - l1 >= 2 * MiB
    assert stats()["allocation.all.current"] == (
        stats()["allocation.small_pool.current"] + stats()["allocation.large_pool.current"])
    del small, large


def test_freed_block_is_cached_and_reused():
    gc.collect()
    t = torch.empty(5 * MiB, dtype=torch.uint8, device="neuron")
    ptr = t.data_ptr()
    reserved = torch.neuron.memory_reserved()
    del t
    assert torch.neuron.memory_reserved() == reserved  # cached, not released
    t2 = torch.empty(5 * MiB, dtype=torch.uint8, device="neuron")
    assert torch.neuron.memory_reserved() == reserved
    assert t2.data_ptr() == ptr
    del t2


def test_empty_cache_drops_reserved_to_allocated():
    gc.collect()
    keep = torch.ones(1000, device="neuron")
    t = torch.empty(4 * MiB, device="neuron")
    del t
    assert torch.neuron.memory_reserved() > torch.neuron.memory_allocated()
    torch.neuron.empty_cache()
    assert torch.neuron.memory_reserved() == torch.neuron.memory_allocated()
    free, total = torch.neuron.mem_get_info()
    assert total - free == torch.neuron.memory_reserved()
    assert keep.sum().item() == 1000  # live tensors are untouched


def test_peak_stats_and_reset():
    gc.collect()
    base = torch.neuron.memory_allocated()
    t = torch.empty(8 * MiB, dtype=torch.uint8, device="neuron")
    peak = torch.neuron.max_memory_allocated()
    assert peak >= base + 8 * MiB
    del t
    assert torch.neuron.max_memory_allocated() == peak
    assert torch.neuron.max_memory_reserved() >= peak
    torch.neuron.reset_peak_memory_stats()
    assert torch.neuron.max_memory_allocated() == torch.neuron.memory_allocated() == base
    assert torch.neuron.max_memory_reserved() == torch.neuron.memory_reserved()


def test_accumulated_counters_and_reset():
    before = stats()["allocation.all.allocated"]
    for _ in range(3):
        torch.empty(10, device="neuron")
    assert stats()["allocation.all.allocated"] - before == 3
    assert stats()["allocation.all.freed"] >= 3
    torch.neuron.reset_accumulated_memory_stats()
    assert stats()["allocation.all.allocated"] == 0
    assert stats()["num_ooms"] == 0


def test_mem_get_info_and_memory_summary():
    free, total = torch.neuron.mem_get_info(1)
    assert total == torch.neuron.get_device_properties(1).total_memory
    assert free == total - torch.neuron.memory_reserved(1)
    x = torch.ones(10, device="neuron:1")
    summary = torch.neuron.memory_summary(1)
    assert "device ID 1" in summary and "Allocated memory" in summary
    assert "small pool" in summary
    assert "small pool" not in torch.neuron.memory_summary(1, abbreviated=True)
    del x


def test_set_per_process_memory_fraction_limits_capacity():
    torch.neuron.set_per_process_memory_fraction(0.5, 1)
    free, total = torch.neuron.mem_get_info(1)
    assert total == torch.neuron.get_device_properties(1).total_memory // 2
    assert torch.neuron.get_per_process_memory_fraction(1) == 0.5
    with pytest.raises(ValueError):
        torch.neuron.set_per_process_memory_fraction(1.5)
    with pytest.raises(ValueError):
        torch.neuron.set_per_process_memory_fraction(-0.1)


def _limit_to(dev, extra_bytes):
    """Caps device ``dev`` at its current usage plus ``extra_bytes``."""
    gc.collect()
    torch.neuron.empty_cache()
    total = torch.neuron.get_device_properties(dev).total_memory
    cap = torch.neuron.memory_reserved(dev) + extra_bytes
    torch.neuron.set_per_process_memory_fraction(cap / total, dev)


@pytest.mark.parametrize("dev", [0, 2])
def test_oom_raises_out_of_memory_error_naming_device_and_size(dev):
    live_c = torch.randn(1000)
    live = live_c.to(f"neuron:{dev}")
    _limit_to(dev, 8 * MiB)
    before = torch.neuron.memory_allocated(dev)
    with pytest.raises(torch.OutOfMemoryError) as e:
        torch.empty(64 * MiB, dtype=torch.uint8, device=f"neuron:{dev}")
    msg = str(e.value)
    assert f"neuron:{dev}" in msg
    assert "64.00 MiB" in msg
    assert isinstance(e.value, RuntimeError)  # torch.OutOfMemoryError is one, as on CUDA
    assert torch.neuron.memory_allocated(dev) == before
    assert stats(dev)["num_ooms"] >= 1


def test_oom_leaves_live_tensors_intact_and_allocation_works_again():
    live_c = torch.randn(257, 3)
    live = live_c.to("neuron")
    _limit_to(0, 4 * MiB)
    before = torch.neuron.memory_allocated()
    for _ in range(2):
        with pytest.raises(torch.OutOfMemoryError):
            torch.ones(32 * MiB, device="neuron")
    assert torch.neuron.memory_allocated() == before
    assert torch.equal(live.cpu(), live_c)
    # small allocations within the limit still work
    t = live * 2
    assert on_device(t)
    assert torch.equal(t.cpu(), live_c * 2)
    del t
    torch.neuron.set_per_process_memory_fraction(1.0)
    big = torch.ones(32 * MiB, dtype=torch.uint8, device="neuron")
    assert on_device(big)
    assert big.sum().item() == torch.ones(32 * MiB, dtype=torch.uint8).sum().item()


def test_oom_frees_cache_before_failing():
    gc.collect()
    torch.neuron.empty_cache()
    t = torch.empty(6 * MiB, dtype=torch.uint8, device="neuron")
    del t  # now cached
    cached = torch.neuron.memory_reserved() - torch.neuron.memory_allocated()
    assert cached >= 6 * MiB
    total = torch.neuron.get_device_properties(0).total_memory
    # Capacity admits the new allocation only if the cache is released first.
    torch.neuron.set_per_process_memory_fraction(
        (torch.neuron.memory_allocated() + 7 * MiB + MiB // 2) / total)
    u = torch.empty(7 * MiB, dtype=torch.uint8, device="neuron")
    assert on_device(u)
    assert stats()["num_alloc_retries"] >= 1


def test_oom_inside_an_op_output():
    a_c = torch.randn(2048, 1)
    b_c = torch.randn(1, 2048)
    a, b = a_c.to("neuron"), b_c.to("neuron")
    _limit_to(0, 4 * MiB)
    before = torch.neuron.memory_allocated()
    with pytest.raises(torch.OutOfMemoryError) as e:
        a @ b  # 16 MiB result
    assert "neuron:0" in str(e.value)
    assert "16.00 MiB" in str(e.value)
    assert torch.neuron.memory_allocated() == before
    assert torch.equal(a.cpu(), a_c) and torch.equal(b.cpu(), b_c)
    torch.neuron.set_per_process_memory_fraction(1.0)
    r = a @ b
    assert on_device(r)
    assert torch.equal(r.cpu(), a_c @ b_c)


def test_oom_inside_out_resize_keeps_out_tensor():
    x_c = torch.randn(1024, 1)
    x = x_c.to("neuron")
    out = torch.empty(0, device="neuron")
    _limit_to(0, 2 * MiB)
    before = torch.neuron.memory_allocated()
    with pytest.raises(torch.OutOfMemoryError):
        torch.mul(x, x.t(), out=out)  # needs 4 MiB
    assert torch.neuron.memory_allocated() == before
    assert out.shape == (0,) or out.numel() == 0
    torch.neuron.set_per_process_memory_fraction(1.0)
    torch.mul(x, x.t(), out=out)
    assert on_device(out)
    assert torch.equal(out.cpu(), x_c * x_c.t())


@pytest.mark.parametrize("env", [
    {"NEURON_PLATFORM_TARGET_OVERRIDE": "trn2"},
    {"NEURON_PLATFORM_TARGET_OVERRIDE": "trn2", "NEURON_LOGICAL_NC_CONFIG": "1"},
    {"NEURON_PLATFORM_TARGET_OVERRIDE": "trn3"},
    {"NEURON_PLATFORM_TARGET_OVERRIDE": "trn1"},
    {"TORCHNEURON_INSTANCE": "trn2.48xlarge"},
], ids=["trn2", "trn2-lnc1", "trn3", "trn1", "trn2.48xlarge"])
def test_oom_at_each_targets_capacity(env):
    # Capacity is checked before host memory is touched, so each target's real HBM
    # share can be exceeded on any machine: one byte-class over it must raise.
    out = run_python("""
        import torch
        from torchneuron.device import _core
        topo = _core.topology()
        chip, lnc = topo.chip, topo.lnc
        expected = chip.hbm_bytes_per_chip * lnc // chip.physical_cores_per_chip
        total = torch.neuron.get_device_properties(0).total_memory
        assert total == expected, (total, expected)
        last = torch.neuron.device_count() - 1
        try:
            torch.empty(total + 2**30, dtype=torch.uint8, device=f"neuron:{last}")
            print("no OOM")
        except torch.OutOfMemoryError as e:
            gib = f"{total / 2**30:.2f} GiB"
            print("OOM", f"neuron:{last}" in str(e), gib in str(e), torch.neuron.memory_reserved(last))
    """, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "OOM True True 0", out.stdout
