"""Cost model: per-instruction formulas (nki-api-facts.md section 9) and scheduling.

Kernels here are synthetic instruction logs built from Operand/Instruction records,
so the expected cycle counts are computed from the documented formulas in the test.
"""

from __future__ import annotations

import math

import pytest

from torchneuron.hardware.specs import get_chip
from torchneuron.nki import cost as C
from torchneuron.nki.instruction import Instruction, Operand

ITEMSIZE = {"float32": 4, "bfloat16": 2, "float16": 2, "float8_e4m3": 1, "uint16": 2, "int32": 4}
TRN1, TRN2, TRN3 = get_chip("trn1"), get_chip("trn2"), get_chip("trn3")


def op(alloc: int, shape: tuple[int, ...], dtype: str = "float32", buffer: str = "sbuf", *,
       stride: int | None = None, rows: tuple[int, int] | None = None, cols: tuple[int, int] | None = None,
       pitch: int | None = None, offset: int = 0) -> Operand:
    """An operand record; ``rows``/``cols`` select a (partition x element) box of an allocation with
    ``pitch`` bytes per row (default: the operand's own row)."""
    isz = ITEMSIZE[dtype]
    free = math.prod(shape[1:]) if len(shape) > 1 else 1
    pitch = pitch or free * isz
    if rows is None:
        rows = (0, shape[0])
    c0 = cols[0] * isz if cols else 0
    c1 = cols[1] * isz if cols else free * isz
    lo = offset + rows[0] * pitch + c0
    hi = offset + (rows[1] - 1) * pitch + c1
    return Operand(buffer=buffer, allocation=alloc, dtype=dtype, shape=tuple(shape), start_partition=rows[0],
                   partitions=shape[0], free_elements=free, itemsize=isz,
                   inner_stride_bytes=isz if stride is None else stride, extent=(lo, hi), row_bytes=pitch)


class Log:
    """Builds an instruction log like KernelRun.record does."""

    def __init__(self) -> None:
        self.instructions: list[Instruction] = []

    def __call__(self, opcode: str, engine: str, reads=(), writes=(), *, program: int = 0, flops: int = 0,
                 **attrs) -> Instruction:
        ins = Instruction(len(self.instructions), opcode, engine, tuple(reads), tuple(writes), attrs, None,
                          program, flops)
        self.instructions.append(ins)
        return ins


def ns(cycles: float, clock_hz: float) -> float:
    return cycles / clock_hz * 1e9


def single(opcode, engine, reads, writes, target=TRN2, **attrs) -> C.InstructionCost:
    return C.instruction_cost(Instruction(0, opcode, engine, tuple(reads), tuple(writes), attrs), target)


# ------------------------------------------------------------------------------ formulas
@pytest.mark.parametrize("target", [TRN1, TRN2, TRN3], ids=lambda c: c.name)
def test_matmul_bf16_is_max_of_min64_stationary_and_moving(target):
    cases = [(128, 512, 512), (128, 1, 64), (1, 128, 128), (8, 1, 8), (128, 64, 64)]
    for ns_, nm, expected in cases:
        c = single("nc_matmul", "tensor", [op(1, (128, ns_), "bfloat16"), op(2, (128, nm), "bfloat16")],
                   [op(3, (ns_, nm), "float32", "psum")], target)
        # facts 9: max(min(64, N_stationary), N_moving); LoadStationary N_stat/4 never binds
        assert c.cycles == expected, (ns_, nm)
        assert c.ns == pytest.approx(ns(expected, target.tensor_clock_hz))


def test_matmul_fp32_is_4x_and_modes_halve_it():
    reads = [op(1, (128, 128)), op(2, (128, 512))]
    dst = [op(3, (128, 512), "float32", "psum")]
    assert single("nc_matmul", "tensor", reads, dst, TRN1).cycles == 4 * 512
    assert single("nc_matmul", "tensor", reads, dst, TRN2, is_transpose=True).cycles == 2 * 512
    assert single("nc_matmul", "tensor", reads, dst, TRN1, is_transpose=True).cycles == 4 * 512  # v3+ only
    assert single("nc_matmul", "tensor", reads, dst, TRN2, is_moving_onezero=True).cycles == 2 * 512
    # fp8 double_row: K=256 in the same time (dst-side sizes give the cycles)
    fp8 = [op(1, (128, 2, 128), "float8_e4m3"), op(2, (128, 2, 512), "float8_e4m3")]
    c = single("nc_matmul", "tensor", fp8, dst, TRN2, perf_mode="double_row")
    assert c.cycles == 512


def test_matmul_dst_side_attrs_take_precedence():
    c = single("nc_matmul", "tensor", [op(1, (128, 128), "bfloat16"), op(2, (128, 512), "bfloat16")],
               [op(3, (128, 512), "float32", "psum")], TRN2, stationary_free=32, moving_free=48)
    assert c.cycles == max(min(64, 32), 48)


def test_nc_transpose_on_tensor_and_vector():
    c = single("nc_transpose", "tensor", [op(1, (128, 32), "bfloat16")], [op(2, (32, 128), "bfloat16", "psum")])
    assert c.cycles == max(128, min(64, 32))
    c = single("nc_transpose", "tensor", [op(1, (16, 128), "bfloat16")], [op(2, (128, 16), "bfloat16", "psum")])
    assert c.cycles == max(16, min(64, 128))
    c = single("nc_transpose", "vector", [op(1, (32, 32))], [op(2, (32, 32))])
    assert c.cycles == max(C.MIN_II, 32)


def test_tensor_tensor_rules_v2():
    n = 512
    fp32 = [op(1, (128, n)), op(2, (128, n))]
    assert single("tensor_tensor", "vector", fp32, [op(3, (128, n))], TRN1, op="add").cycles == 2 * n
    mixed = [op(1, (128, n), buffer="psum"), op(2, (128, n))]
    assert single("tensor_tensor", "vector", mixed, [op(3, (128, n))], TRN1, op="multiply").cycles == n
    bf16 = [op(1, (128, n), "bfloat16"), op(2, (128, n), "bfloat16")]
    out = [op(3, (128, n), "bfloat16")]
    assert single("tensor_tensor", "vector", bf16, out, TRN1, op="add").cycles == n
    assert single("tensor_tensor", "vector", bf16, out, TRN1, op="maximum").cycles == 2 * n
    strided = [op(1, (128, n), "bfloat16", stride=4), op(2, (128, n), "bfloat16")]
    assert single("tensor_tensor", "vector", strided, out, TRN1, op="add").cycles == 2 * n  # not contiguous
    tiny = [op(1, (128, 4)), op(2, (128, 4))]
    assert single("tensor_tensor", "vector", tiny, [op(3, (128, 4))], TRN1, op="add").cycles == C.MIN_II


def test_tensor_tensor_v3_performance_mode():
    n = 512
    bf16 = [op(1, (128, n), "bfloat16"), op(2, (128, n), "bfloat16")]
    out = [op(3, (128, n), "bfloat16")]
    # v2 rule gives N (bf16 add), v3 perf mode halves it: N/2
    assert single("tensor_tensor", "vector", bf16, out, TRN2, op="add").cycles == n / 2
    assert single("tensor_tensor", "vector", bf16, out, TRN2, op="maximum").cycles == n
    fp32 = [op(1, (128, n)), op(2, (128, n))]
    assert single("tensor_tensor", "vector", fp32, [op(3, (128, n))], TRN2, op="add").cycles == 2 * n


def test_tensor_copy_and_tensor_scalar_performance_modes():
    n = 1024
    sb = [op(1, (128, n), "bfloat16")]
    out = [op(2, (128, n), "bfloat16")]
    assert single("tensor_copy", "vector", sb, out, TRN1).cycles == n
    assert single("tensor_copy", "vector", sb, out, TRN2).cycles == n / 4  # all SBUF, bf16, contiguous
    assert single("tensor_scalar", "vector", sb, out, TRN3, op0="multiply").cycles == n / 4
    psum = [op(1, (128, n), "bfloat16", "psum")]
    assert single("tensor_copy", "vector", psum, out, TRN2).cycles == n / 2
    strided = [op(1, (128, n), "bfloat16", stride=4)]
    assert single("tensor_copy", "vector", strided, out, TRN2).cycles == n / 2
    fp32 = [op(1, (128, n), "float32", "psum")]
    assert single("tensor_copy", "vector", fp32, [op(2, (128, n))], TRN2).cycles == n
    assert single("tensor_copy", "vector", [op(1, (128, 8), "bfloat16")], [op(2, (128, 8), "bfloat16")],
                  TRN2).cycles == C.MIN_II


def test_inner_stride_above_16_bytes_doubles_the_work():
    n = 512
    c = single("tensor_copy", "vector", [op(1, (128, n), stride=32)], [op(2, (128, n))], TRN1)
    assert c.cycles == 2 * n
    c = single("tensor_copy", "vector", [op(1, (128, n), stride=16)], [op(2, (128, n))], TRN1)
    assert c.cycles == n  # 16 B is not above the limit


@pytest.mark.parametrize("opcode,attrs,dtype,expected", [
    ("tensor_reduce", {"op": "add"}, "bfloat16", 1024 / 2),
    ("tensor_reduce", {"op": "maximum"}, "bfloat16", 1024 / 2),
    ("tensor_reduce", {"op": "multiply"}, "bfloat16", 1024),
    ("tensor_reduce", {"op": "add"}, "float32", 1024),
    ("reciprocal", {}, "float32", 8 * 1024),
    ("bn_stats", {}, "float32", 1024),
    ("bn_aggr", {}, "float32", 13 * 1024 / 3),
    ("tensor_tensor_scan", {}, "float32", 2 * 1024),
    ("tensor_scalar_reduce", {"op0": "add"}, "float32", 1024 + 64),
    ("select_reduce", {}, "float32", 1024),
    ("max8", {}, "float32", 1024),
])
def test_vector_single_input_formulas(opcode, attrs, dtype, expected):
    c = single(opcode, "vector", [op(1, (128, 1024), dtype)], [op(2, (128, 8), dtype)], TRN1, **attrs)
    assert c.cycles == expected


def test_memset_scalar_tensor_tensor_predicated_exponential():
    assert single("memset", "vector", [], [op(1, (128, 512), "bfloat16")], TRN1, value=0.0).cycles == 256
    assert single("memset", "vector", [], [op(1, (128, 512), "bfloat16")], TRN1, value=1.0).cycles == 512
    assert single("memset", "vector", [], [op(1, (128, 512))], TRN1, value=0.0).cycles == 512
    bf = [op(1, (128, 512), "bfloat16"), op(2, (128, 1), "bfloat16"), op(3, (128, 512), "bfloat16")]
    out = [op(4, (128, 512), "bfloat16")]
    assert single("scalar_tensor_tensor", "vector", bf, out, TRN1, op0="subtract", op1="multiply").cycles == 512
    assert single("scalar_tensor_tensor", "vector", bf, out, TRN1, op0="add", op1="multiply").cycles == 1024
    pred = [op(1, (128, 512)), op(2, (128, 512), "uint16")]
    assert single("tensor_copy_predicated", "vector", pred, [op(3, (128, 512))], TRN1).cycles == 1024
    pred_psum = [op(1, (128, 512), buffer="psum"), op(2, (128, 512), "uint16")]
    assert single("tensor_copy_predicated", "vector", pred_psum, [op(3, (128, 512))], TRN1).cycles == 512
    exp = single("exponential", "vector", [op(1, (128, 2048))], [op(2, (128, 2048))], TRN3)
    act = single("activation", "scalar", [op(1, (128, 2048))], [op(2, (128, 2048))], TRN3, op="exp")
    assert exp.cycles == 2048 / 4 and act.cycles == 2048  # v4: 4x ScalarE exp throughput


def test_scalar_engine_formulas():
    data, out = [op(1, (128, 700)), op(9, (128, 1))], [op(2, (128, 700))]
    c = single("activation", "scalar", data, out, TRN1, op="exp")
    assert c.cycles == 700 and c.ns == pytest.approx(ns(700, TRN1.scalar_clock_hz))
    # scale/bias/reduce are free; reading the accumulator out costs MIN_II
    assert single("activation", "scalar", data, out, TRN1, op="exp", reduce_res=True).cycles == 700 + 64
    assert single("activation_reduce", "scalar", data, out, TRN1, op="exp").cycles == 700 + 64
    assert single("activation", "scalar", [op(1, (128, 10))], [op(2, (128, 10))], TRN1).cycles == 64
    bf = [op(1, (128, 700), "bfloat16")], [op(2, (128, 700), "bfloat16")]
    assert single("tensor_copy", "scalar", *bf, TRN3).cycles == 350  # v4 ScalarE 2x bf16
    assert single("tensor_copy", "scalar", *bf, TRN2).cycles == 700


def test_gpsimd_formulas():
    assert single("iota", "gpsimd", [], [op(1, (128, 300), "int32")], TRN2).cycles == 150 + 300
    assert single("affine_select", "gpsimd", [op(1, (128, 300))], [op(2, (128, 300))], TRN2).cycles == 450
    e, valid, dsize = 4, 64, 2
    c = single("local_gather", "gpsimd", [op(1, (128, 512), "bfloat16"), op(2, (128, 4), "uint16")],
               [op(3, (128, 256), "bfloat16")], TRN2, num_elem_per_idx=e, num_valid_indices=valid)
    cc = ((28 + 4 * e) / (4 * e)) / min(4 / dsize, e)
    assert c.cycles == pytest.approx(150 + valid * e / cc)
    # default valid count: index elements per 16-partition core
    c = single("local_gather", "gpsimd", [op(1, (128, 512)), op(2, (128, 4), "uint16")],
               [op(3, (128, 64))], TRN2)
    cc = ((28 + 4) / 4) / min(1, 1)
    assert c.cycles == pytest.approx(150 + 64 / cc)


def test_dma_cost_formula_trn2():
    # [128, 512] bf16 HBM -> SBUF: 128 KiB over 16 engines, 1 KiB per partition.
    c = single("dma_copy", "dma", [op(1, (128, 512), "bfloat16", "shared_hbm")], [op(2, (128, 512), "bfloat16")],
               TRN2)
    rate = min(23.0, 2.9e12 / 8 / 1e9 / 16)  # 23 B/ns table, capped by the HBM share per core
    expected = 1300 + (128 * 1024 / 16) / (rate * C.dma_efficiency(1024))
    assert c.dma_engines == 16 and c.bytes == 128 * 1024
    assert c.ns == pytest.approx(expected)
    # 4 partitions use one engine; hwdge pays 600 ns on v3+
    c = single("dma_copy", "dma", [op(1, (4, 1024), "float32", "shared_hbm")], [op(2, (4, 1024))], TRN2,
               dge_mode="hwdge")
    assert c.dma_engines == 1 and c.fixed_ns == 600
    assert c.ns == pytest.approx(600 + 4 * 4096 / (rate * C.dma_efficiency(4096)))
    c = single("dma_copy", "dma", [op(1, (4, 1024), "float32", "shared_hbm")], [op(2, (4, 1024))], TRN1,
               dge_mode="hwdge")
    assert c.fixed_ns == 1300  # hwdge is v3+
    assert c.ns == pytest.approx(1300 + 4 * 4096 / (17.0 * C.dma_efficiency(4096)))  # Trn1 HBM share (410 GB/s) exceeds 16 x 17


def test_dma_transpose_and_load_transpose2d():
    src, dst = [op(1, (128, 512), "bfloat16", "shared_hbm")], [op(2, (128, 512), "bfloat16")]
    plain = single("dma_copy", "dma", src, dst, TRN2)
    hw = single("dma_transpose", "dma", src, dst, TRN2)
    assert hw.data_ns == pytest.approx(plain.data_ns / 0.9)
    sb = single("dma_transpose", "dma", [op(1, (128, 512), "bfloat16")], dst, TRN2)
    assert sb.data_ns == pytest.approx(plain.data_ns * C.dma_efficiency(1024) / C.dma_efficiency(1024) / 0.5
                                       * (min(23.0, 22.65625) / 23.0))
    lt = single("dma_copy", "dma", src, dst, TRN2, transpose=True)
    assert lt.data_ns == pytest.approx(plain.data_ns * C.dma_efficiency(1024) / C.dma_efficiency(2))


# ------------------------------------------------------------------------------ scheduling
def test_dependent_vector_chain_pays_static_overhead():
    log = Log()
    n, steps = 512, 6
    for _ in range(steps):
        log("tensor_tensor", "vector", [op(1, (128, n)), op(2, (128, n))], [op(1, (128, n))], op="add")
    cost = C.estimate(log.instructions, "trn2")
    per = ns(2 * n, TRN2.vector_clock_hz)
    assert cost.latency_ns == pytest.approx(steps * per + (steps - 1) * ns(100, TRN2.vector_clock_hz))
    assert cost.engine_busy_ns["vector"] == pytest.approx(steps * per)
    # the same instructions on distinct tiles issue back to back
    log = Log()
    for i in range(steps):
        log("tensor_tensor", "vector", [op(10 + i, (128, n)), op(2, (128, n))], [op(20 + i, (128, n))], op="add")
    assert C.estimate(log.instructions, "trn2").latency_ns == pytest.approx(steps * per)


def test_independent_dma_and_compute_overlap():
    log = Log()
    for i in range(8):
        log("dma_copy", "dma", [op(100, (128, 2048), "bfloat16", "shared_hbm", offset=i * 1 << 20)],
            [op(200 + i, (128, 2048), "bfloat16")])
        log("activation", "scalar", [op(300 + i, (128, 2048))], [op(400 + i, (128, 2048))], op="exp")
    cost = C.estimate(log.instructions, "trn2")
    busy_sum = sum(e.duration_ns for e in cost.events)
    assert cost.latency_ns < busy_sum
    scalar = 8 * ns(2048, TRN2.scalar_clock_hz)
    assert cost.latency_ns >= scalar - 1e-6
    assert cost.engine_busy_ns["scalar"] == pytest.approx(scalar)


def test_dependencies_serialise_load_compute_store():
    log = Log()
    log("dma_copy", "dma", [op(1, (128, 512), "float32", "shared_hbm")], [op(2, (128, 512))])
    log("activation", "scalar", [op(2, (128, 512))], [op(3, (128, 512))], op="exp")
    log("dma_copy", "dma", [op(3, (128, 512))], [op(4, (128, 512), "float32", "shared_hbm")])
    cost = C.estimate(log.instructions, "trn2")
    load, act, store = sorted(cost.events, key=lambda e: e.index)
    assert act.start_ns == pytest.approx(load.end_ns + ns(200, TRN2.scalar_clock_hz))  # 264 - MIN_II cycles
    assert store.start_ns == pytest.approx(act.end_ns)
    assert cost.latency_ns == pytest.approx(store.end_ns)
    assert cost.latency_ns == pytest.approx(load.duration_ns + ns(200 + 512, TRN2.scalar_clock_hz)
                                            + store.duration_ns)


def test_write_after_read_waits_for_the_reader():
    log = Log()
    log("tensor_copy", "vector", [op(1, (128, 4096))], [op(2, (128, 4096))])
    log("dma_copy", "dma", [op(5, (128, 16), "float32", "shared_hbm")], [op(1, (128, 16))])
    cost = C.estimate(log.instructions, "trn1")
    copy, dma = sorted(cost.events, key=lambda e: e.index)
    assert dma.start_ns == pytest.approx(copy.end_ns)


def test_column_slices_of_one_tile_do_not_alias():
    log = Log()
    full = (128, 1024)
    # a slow write of columns [512, 1024) and a read of columns [0, 512) on another engine
    log("tensor_copy", "vector", [op(1, (128, 512))], [op(2, (128, 512), cols=(512, 1024), pitch=4096)])
    log("activation", "scalar", [op(2, (128, 512), cols=(0, 512), pitch=4096)], [op(3, (128, 512))])
    log("activation", "scalar", [op(2, full)], [op(4, full)])  # the whole tile does depend on the write
    cost = C.estimate(log.instructions, "trn1")
    write, read_other, read_all = sorted(cost.events, key=lambda e: e.index)
    assert read_other.start_ns == 0.0
    assert read_all.start_ns >= write.end_ns


def test_psum_accumulation_chain_has_no_dependency_bubbles():
    log = Log()
    k = 16
    for i in range(k):
        log("nc_matmul", "tensor", [op(10 + i, (128, 128), "bfloat16"), op(50 + i, (128, 512), "bfloat16")],
            [op(1, (128, 512), "float32", "psum")], flops=2 * 128 * 128 * 512)
    cost = C.estimate(log.instructions, "trn1")
    assert cost.latency_ns == pytest.approx(k * ns(512, TRN1.tensor_clock_hz))
    assert cost.flops == k * 2 * 128 * 128 * 512
    assert cost.hfu == pytest.approx(cost.flops / (cost.latency_seconds * 92e12))
    assert cost.utilisation("tensor") == pytest.approx(1.0)


def test_matmul_loop_overlaps_loads_with_tensor_engine():
    log = Log()
    k = 32
    for i in range(k):
        log("dma_copy", "dma", [op(1, (128, 128), "bfloat16", "shared_hbm", rows=(0, 128), pitch=1 << 16)],
            [op(100 + i, (128, 128), "bfloat16")])
        log("dma_copy", "dma", [op(2, (128, 512), "bfloat16", "shared_hbm", rows=(0, 128), pitch=1 << 16)],
            [op(200 + i, (128, 512), "bfloat16")])
        log("nc_matmul", "tensor", [op(100 + i, (128, 128), "bfloat16"), op(200 + i, (128, 512), "bfloat16")],
            [op(3, (128, 512), "float32", "psum")], flops=2 * 128 * 128 * 512)
    log("tensor_copy", "vector", [op(3, (128, 512), "float32", "psum")], [op(4, (128, 512), "bfloat16")])
    log("dma_copy", "dma", [op(4, (128, 512), "bfloat16")], [op(5, (128, 512), "bfloat16", "shared_hbm")])
    cost = C.estimate(log.instructions, "trn1")
    total_busy = sum(e.duration_ns for e in cost.events)
    assert cost.latency_ns < 0.5 * total_busy
    dma_events = [e for e in cost.events if e.engine == "dma"]
    queues = {e.queue for e in dma_events}
    assert len(queues) == 16  # round-robin over the 16 queues
    for q in queues:  # a queue runs its transfers in order, one at a time
        on_q = sorted((e for e in dma_events if e.queue == q), key=lambda e: e.index)
        assert all(a.end_ns <= b.start_ns + 1e-9 for a, b in zip(on_q, on_q[1:]))
    mm = sorted((e for e in cost.events if e.opcode == "nc_matmul"), key=lambda e: e.index)
    assert all(a.end_ns <= b.start_ns + 1e-9 for a, b in zip(mm, mm[1:]))  # in-order TensorE
    assert cost.dma_bytes == k * (128 * 128 * 2 + 128 * 512 * 2) + 128 * 512 * 2
    assert 0 < cost.mbu < 1 and 0 < cost.hfu < 1


def test_dma_engines_move_one_transfer_at_a_time():
    log = Log()
    for i in range(4):
        log("dma_copy", "dma", [op(1, (128, 4096), "float32", "shared_hbm", offset=i << 22)],
            [op(10 + i, (128, 4096))])
    cost = C.estimate(log.instructions, "trn2")
    events = sorted(cost.events, key=lambda e: e.index)
    data = events[0].end_ns - events[0].data_start_ns
    assert all(e.start_ns == 0.0 for e in events)  # four queues start together
    assert events[0].data_start_ns == pytest.approx(1300)
    for a, b in zip(events, events[1:]):  # all 16 engines are shared: bytes move one transfer at a time
        assert b.data_start_ns == pytest.approx(a.end_ns)
    assert cost.latency_ns == pytest.approx(1300 + 4 * data)
    assert cost.utilisation("dma") == pytest.approx(4 * data / cost.latency_ns)


def test_small_dmas_spread_over_engines():
    log = Log()
    for i in range(4):  # 8 partitions each: one engine each, round-robin
        log("dma_copy", "dma", [op(1, (8, 4096), "float32", "shared_hbm", offset=i << 20)],
            [op(10 + i, (8, 4096))])
    cost = C.estimate(log.instructions, "trn2")
    assert sorted(e.dma_engines for e in cost.events) == [(0,), (1,), (2,), (3,)]
    assert len({round(e.end_ns, 6) for e in cost.events}) == 1  # in parallel


def test_depends_on_and_no_reorder_edges():
    log = Log()
    a = log("tensor_copy", "vector", [op(1, (128, 2048))], [op(2, (128, 2048))])
    log("activation", "scalar", [op(3, (128, 64))], [op(4, (128, 64))], depends_on=[a.index])
    cost = C.estimate(log.instructions, "trn1")
    first, second = sorted(cost.events, key=lambda e: e.index)
    assert second.start_ns == pytest.approx(first.end_ns + ns(200, TRN1.scalar_clock_hz))
    log = Log()
    log("tensor_copy", "vector", [op(1, (128, 2048))], [op(2, (128, 2048))], no_reorder=1)
    log("activation", "scalar", [op(3, (128, 64))], [op(4, (128, 64))], no_reorder=1)
    log("iota", "gpsimd", [], [op(5, (128, 64), "int32")])  # outside the scope: free to overlap
    cost = C.estimate(log.instructions, "trn2")  # (v2 would serialise VectorE/GpSimd SBUF access)
    first, second, third = sorted(cost.events, key=lambda e: e.index)
    assert second.start_ns == pytest.approx(first.end_ns)
    assert third.start_ns == 0.0


def test_v2_shared_sbuf_and_psum_ports_serialise():
    log = Log()
    log("tensor_copy", "vector", [op(1, (128, 2048))], [op(2, (128, 2048))])
    log("iota", "gpsimd", [], [op(3, (128, 2048), "int32")])
    v2 = C.estimate(log.instructions, "trn1")
    vec, gp = sorted(v2.events, key=lambda e: e.index)
    assert gp.start_ns == pytest.approx(vec.end_ns)  # VectorE and GpSimd share SBUF on v2
    v3 = C.estimate(log.instructions, "trn2")
    assert all(e.start_ns == 0.0 for e in v3.events)  # lifted on v3
    log = Log()
    log("tensor_copy", "vector", [op(1, (128, 512), buffer="psum")], [op(2, (128, 512))])
    log("activation", "scalar", [op(3, (128, 512), buffer="psum")], [op(4, (128, 512))])
    v2 = C.estimate(log.instructions, "trn1")
    vec, act = sorted(v2.events, key=lambda e: e.index)
    assert act.start_ns == pytest.approx(vec.end_ns)  # VectorE and ScalarE share PSUM on v2
    assert all(e.start_ns == 0.0 for e in C.estimate(log.instructions, "trn2").events)


def test_shared_port_gap_is_filled():
    log = Log()
    # a GpSimd op waiting on a long VectorE op leaves the SBUF port free for an earlier VectorE op
    log("tensor_copy", "vector", [op(1, (128, 8192))], [op(2, (128, 8192))])
    log("affine_select", "gpsimd", [op(2, (128, 64))], [op(3, (128, 64))])
    log("activation", "scalar", [op(9, (128, 64), buffer="psum")], [op(10, (128, 64), buffer="psum")])
    cost = C.estimate(log.instructions, "trn1")
    copy, select, act = sorted(cost.events, key=lambda e: e.index)
    assert select.start_ns >= copy.end_ns
    assert act.start_ns == 0.0


def _two_program_log() -> Log:
    log = Log()
    for program in (0, 1):
        log("nc_matmul", "tensor", [op(10 * program + 1, (128, 128), "bfloat16"),
                                    op(10 * program + 2, (128, 512), "bfloat16")],
            [op(10 * program + 3, (128, 512), "float32", "psum")], program=program, flops=2 * 128 * 128 * 512)
        log("tensor_copy", "vector", [op(10 * program + 3, (128, 512), "float32", "psum")],
            [op(10 * program + 4, (128, 512))], program=program)
    return log


def test_lnc2_runs_programs_on_two_cores_and_grid_runs_them_serially():
    log = _two_program_log()
    lnc2 = C.estimate(log.instructions, "trn2", lnc=2)
    serial = C.estimate(log.instructions, "trn2", lnc=1, grid=(2,))
    one = ns(512, TRN2.tensor_clock_hz) + ns(64, TRN2.tensor_clock_hz) * 0 + ns(100 + 512, TRN2.vector_clock_hz)
    assert lnc2.latency_ns == pytest.approx(one)
    assert serial.latency_ns == pytest.approx(2 * one)
    assert {e.core for e in lnc2.events} == {0, 1} and {e.core for e in serial.events} == {0}
    assert lnc2.cores == 2 and serial.cores == 1 and serial.programs == 2
    # HFU is measured against the peak of the physical cores used
    assert lnc2.hfu == pytest.approx(lnc2.flops / (lnc2.latency_seconds * 79e12 * 2))
    assert serial.hfu == pytest.approx(serial.flops / (serial.latency_seconds * 79e12))


def test_core_barrier_aligns_programs():
    log = Log()
    log("tensor_copy", "vector", [op(1, (128, 8192))], [op(2, (128, 8192))], program=0)
    log("core_barrier", "gpsimd", [op(2, (128, 1))], [], program=0)
    log("iota", "gpsimd", [], [op(3, (128, 64), "int32")], program=0)
    log("core_barrier", "gpsimd", [op(12, (128, 1))], [], program=1)
    log("iota", "gpsimd", [], [op(13, (128, 64), "int32")], program=1)
    cost = C.estimate(log.instructions, "trn2", lnc=2)
    by_index = {e.index: e for e in cost.events}
    assert by_index[1].start_ns == pytest.approx(by_index[3].start_ns)
    assert by_index[3].start_ns >= by_index[0].end_ns  # program 1 waits for program 0 at the barrier
    assert by_index[4].start_ns >= by_index[3].end_ns


def test_estimate_accepts_a_kernel_run_and_validates_inputs():
    from torchneuron.nki.context import KernelRun

    log = _two_program_log()
    run = KernelRun(kernel_name="k", target=TRN2, grid=(2,), lnc=2, instructions=log.instructions)
    cost = C.estimate(run)
    assert cost.kernel_name == "k" and cost.lnc == 2 and cost.target == "trn2"
    assert C.estimate(run, "trn1", lnc=1).target == "trn1"
    with pytest.raises(TypeError, match="target"):
        C.estimate(log.instructions)
    with pytest.raises(ValueError, match="lnc"):
        C.estimate(log.instructions, "trn2", lnc=4)


def test_flops_fallback_and_counts():
    log = Log()
    log("nc_matmul", "tensor", [op(1, (64, 128), "bfloat16"), op(2, (64, 256), "bfloat16")],
        [op(3, (128, 256), "float32", "psum")])  # flops not recorded
    log("dma_copy", "dma", [op(3, (128, 256), "float32", "psum")], [op(4, (128, 256), "float32", "shared_hbm")])
    cost = C.estimate(log.instructions, "trn2")
    assert cost.flops == 2 * 64 * 128 * 256
    assert cost.instruction_counts == {"tensor": 1, "dma": 1}


def test_large_log_is_estimated():
    log = Log()
    for i in range(2500):
        log("dma_copy", "dma", [op(1, (128, 512), "bfloat16", "shared_hbm", rows=(0, 128), pitch=1 << 20)],
            [op(1000 + i, (128, 512), "bfloat16")])
        log("nc_matmul", "tensor", [op(5, (128, 128), "bfloat16"), op(1000 + i, (128, 512), "bfloat16")],
            [op(2, (128, 512), "float32", "psum")])
        log("tensor_copy", "vector", [op(2, (128, 512), "float32", "psum")], [op(9000 + i, (128, 512))])
        log("dma_copy", "dma", [op(9000 + i, (128, 512))],
            [op(3, (128, 512), "float32", "shared_hbm", rows=(128 * i, 128 * i + 128), pitch=2048)])
    cost = C.estimate(log.instructions, "trn2")
    assert len(cost.events) == 10000
    assert cost.latency_ns > 0
