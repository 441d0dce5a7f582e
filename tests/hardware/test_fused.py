"""The fused-kernel roofline: formulas on known shapes."""

import pytest

from torchneuron.hardware import cost_target
from torchneuron.hardware.cost import STATIC_OVERHEAD_CYCLES, VECTOR_LANES
from torchneuron.hardware.fused import KernelWork, fused_kernel_cost


def test_memory_bound_kernel_pays_its_compulsory_traffic_once():
    target = cost_target("trn2")
    n = 1 << 22  # 4M fp32 elements: two inputs read, one output written
    work = KernelWork(elements=n, vector_ops=3, scalar_ops=0, reductions=0,
                      bytes_read=8 * n, bytes_written=4 * n, dtypes=("float32",))
    c = fused_kernel_cost(work, target)
    assert c.bound == "memory"
    assert c.memory_seconds == pytest.approx(12 * n / target.hbm_bytes_per_second)
    assert c.seconds == pytest.approx(target.launch_seconds + c.memory_seconds)


def test_compute_bound_kernel_charges_one_pass_per_op_on_its_engine():
    target = cost_target("trn2")
    n = 1 << 20
    work = KernelWork(elements=n, vector_ops=40, scalar_ops=0, reductions=0,
                      bytes_read=4 * n, bytes_written=4 * n, dtypes=("float32",))
    c = fused_kernel_cost(work, target)
    per_pass = n / (VECTOR_LANES * target.lnc * target.chip.vector_clock_hz)
    overhead = STATIC_OVERHEAD_CYCLES / target.chip.vector_clock_hz
    assert c.compute_seconds == pytest.approx(40 * (per_pass + overhead))
    assert c.bound == "compute"


def test_fusion_is_cheaper_than_the_same_ops_unfused():
    target = cost_target("trn2")
    n = 1 << 20
    fused = fused_kernel_cost(KernelWork(n, 4, 0, 0, 4 * n, 4 * n, ("float32",)), target).seconds
    single = fused_kernel_cost(KernelWork(n, 1, 0, 0, 4 * n, 4 * n, ("float32",)), target).seconds
    assert fused < 4 * single / 2


def test_negative_work_is_rejected():
    with pytest.raises(ValueError, match="bytes_read must be >= 0"):
        KernelWork(1, 1, 0, 0, -1, 0)
