"""Roofline cost model: FLOP formulas, engine choice, LNC scaling and published-figure checks."""

import itertools
import math

import pytest

from torchneuron.hardware import flops as F
from torchneuron.hardware.cost import (
    ASSUMED_HOST_LINK_BYTES_PER_SECOND,
    DEFAULT_LAUNCH_SECONDS,
    DMA_FIXED_SECONDS,
    Engine,
    cost_target,
    fallback_cost,
    op_cost,
    target_from_topology,
)
from torchneuron.hardware.specs import CHIPS
from torchneuron.hardware.topology import resolve_topology

BF16 = ["bfloat16", "bfloat16"]


def test_mm_flops_and_bytes():
    m, k, n = 3, 5, 7
    cost = op_cost("aten::mm", [(m, k), (k, n)], ["float32"] * 2, cost_target())
    assert cost.flops == 2 * m * n * k
    assert cost.bytes_read == 4 * (m * k + k * n)
    assert cost.bytes_written == 4 * m * n


def test_matmul_broadcasts_batch_and_promotes_vectors():
    b, m, k, n = 4, 3, 5, 7
    bmm = op_cost("aten::matmul", [(b, 1, m, k), (2, k, n)], ["float32"] * 2, cost_target())
    assert bmm.flops == 2 * (b * 2) * m * n * k
    mv = op_cost("aten::matmul", [(m, k), (k,)], ["float32"] * 2, cost_target())
    assert mv.flops == 2 * m * k and mv.bytes_written == 4 * m


def test_addmm_and_linear_add_the_bias():
    m, k, n = 3, 5, 7
    addmm = op_cost("aten::addmm", [(n,), (m, k), (k, n)], ["float32"] * 3, cost_target())
    assert addmm.flops == 2 * m * n * k + m * n
    linear = op_cost("aten::linear", [(m, k), (n, k), (n,)], ["float32"] * 3, cost_target())
    assert linear.flops == addmm.flops
    addbmm = op_cost("aten::addbmm", [(m, n), (2, m, k), (2, k, n)], ["float32"] * 3, cost_target())
    assert addbmm.flops == 2 * 2 * m * n * k + m * n and addbmm.bytes_written == 4 * m * n


def test_out_overload_takes_the_last_shape_as_output():
    cost = op_cost("aten::mm.out", [(3, 5), (5, 7), (3, 7)], ["float32"] * 3, cost_target())
    assert cost.flops == 2 * 3 * 5 * 7 and cost.bytes_read == 4 * (15 + 35)


def test_tile_flops_pads_to_the_array_and_the_64_cycle_minimum():
    # One 128x128 stationary tile, N=8 moving columns: the instruction still takes 64 cycles.
    assert F.tile_flops(128, 8, 128) == 2 * 128 * 128 * 64
    # Aligned shapes occupy the array exactly.
    assert F.tile_flops(256, 1024, 384) == 2 * 256 * 1024 * 384


def brute_force_conv_macs(n, c_in, spatial, c_out, kernel, stride, padding, dilation, groups):
    """Count MACs by walking every output position that fits in the padded input."""
    positions = []
    for i, k, s, p, d in zip(spatial, kernel, stride, padding, dilation):
        span = d * (k - 1) + 1
        positions.append(sum(1 for start in range(0, i + 2 * p, s) if start + span <= i + 2 * p))
    macs = 0
    for _ in itertools.product(*(range(o) for o in positions)):
        macs += math.prod(kernel) * (c_in // groups)
    return n * c_out * macs, positions


@pytest.mark.parametrize(
    "n, c_in, spatial, c_out, kernel, stride, padding, dilation, groups",
    [
        (2, 4, (7, 6), 6, (3, 2), (2, 1), (1, 0), (1, 2), 2),
        (1, 3, (9,), 5, (4,), (3,), (2,), (1,), 1),
        (1, 2, (5, 5, 4), 4, (2, 3, 1), (1, 2, 1), (0, 1, 0), (2, 1, 1), 2),
    ],
)
def test_conv_flops_match_brute_force(n, c_in, spatial, c_out, kernel, stride, padding, dilation, groups):
    macs, positions = brute_force_conv_macs(n, c_in, spatial, c_out, kernel, stride, padding, dilation, groups)
    weight = (c_out, c_in // groups, *kernel)
    cost = op_cost("aten::convolution", [(n, c_in, *spatial), weight], ["float32"] * 2, cost_target(),
                   stride=stride, padding=padding, dilation=dilation, groups=groups, transposed=False)
    assert cost.flops == 2 * macs
    assert F.conv_output_shape((n, c_in, *spatial), weight, stride=stride, padding=padding,
                               dilation=dilation, groups=groups) == (n, c_out, *positions)


def test_conv_bias_and_transposed_and_backward():
    x, w = (1, 4, 5, 5), (8, 4, 3, 3)
    fwd = op_cost("aten::conv2d", [x, w, (8,)], ["float32"] * 3, cost_target(), padding=1)
    out_elems = 1 * 8 * 5 * 5
    assert fwd.flops == 2 * out_elems * 4 * 9 + out_elems
    # Transposed conv: every input element scatters into C_out/groups x kernel outputs.
    tw = (4, 3, 2, 2)
    tconv = op_cost("aten::conv_transpose2d", [x, tw], ["float32"] * 2, cost_target(), stride=2)
    assert tconv.flops == 2 * (1 * 4 * 5 * 5) * 3 * 4
    assert F.conv_output_shape(x, tw, stride=2, transposed=True) == (1, 3, 10, 10)
    bwd = op_cost("aten::convolution_backward", [(1, 8, 5, 5), x, w], ["float32"] * 3, cost_target(),
                  padding=[1, 1], output_mask=[True, True, False])
    assert bwd.flops == 2 * (2 * out_elems * 4 * 9)


def test_sdpa_flops():
    b, h, l, s, e = 2, 3, 16, 16, 8
    q = (b, h, l, e)
    cost = op_cost("aten::_scaled_dot_product_fused_attention_overrideable", [q, q, q], ["bfloat16"] * 3, cost_target())
    pairs = l * s
    assert cost.flops == b * h * (2 * pairs * (e + e) + 4 * pairs) + b * h * l * e
    causal = op_cost("aten::scaled_dot_product_attention", [q, q, q], ["bfloat16"] * 3, cost_target(), is_causal=True)
    cpairs = sum(i + 1 for i in range(l))
    assert causal.flops == b * h * (2 * cpairs * 2 * e + 4 * cpairs) + b * h * l * e
    bwd = op_cost("aten::_scaled_dot_product_flash_attention_backward", [q, q, q, q, q], ["bfloat16"] * 5,
                  cost_target())
    assert bwd.flops == b * h * (2 * pairs * 5 * e + 5 * pairs) + 2 * b * h * l * e


def test_causal_pairs_counts_the_lower_triangle():
    for l, s in [(4, 4), (3, 7), (7, 3)]:
        assert F.causal_pairs(l, s) == sum(1 for i in range(l) for j in range(s) if j <= i)


def test_elementwise_engines():
    t = cost_target()
    add = op_cost("aten::add.Tensor", [(1024, 1024)] * 2, ["float32"] * 2, t)
    assert add.flops == 1024 * 1024 and set(add.engine_seconds) == {Engine.VECTOR}
    exp = op_cost("aten::exp", [(1024, 1024)], ["float32"], t)
    assert set(exp.engine_seconds) == {Engine.SCALAR}
    # Two inputs cost two VectorE passes, one input one (trainium-facts.md: Engines).
    relu = op_cost("aten::relu", [(1024, 1024)], ["float32"], t)
    overhead = 100 / t.chip.vector_clock_hz
    assert add.engine_seconds[Engine.VECTOR] - 2 * overhead == pytest.approx(
        2 * (relu.engine_seconds[Engine.VECTOR] - overhead))
    eq = op_cost("aten::eq.Tensor", [(10,), (10,)], ["float32"] * 2, t)
    assert eq.bytes_written == 10  # bool result


def test_broadcast_operand_and_expanded_strides_are_read_once():
    t = cost_target()
    add = op_cost("aten::add.Tensor", [(64, 32), (32,)], ["float32"] * 2, t)
    assert add.bytes_read == 4 * (64 * 32 + 32) and add.bytes_written == 4 * 64 * 32
    expanded = op_cost("aten::add.Tensor", [(64, 32), (64, 32)], ["float32"] * 2, t, strides=[None, (0, 1)])
    assert expanded.bytes_read == add.bytes_read


def test_bf16_contiguous_vector_speedup_on_trn2_only():
    shape = [(4096, 4096)] * 2
    trn2, trn1 = cost_target("trn2"), cost_target("trn1")
    fast = op_cost("aten::mul.Tensor", shape, BF16, trn2).engine_seconds[Engine.VECTOR]
    slow = op_cost("aten::mul.Tensor", shape, BF16, trn2, strides=[(1, 4096), None]).engine_seconds[Engine.VECTOR]
    assert slow / fast == pytest.approx(2, rel=1e-2)  # static overhead aside
    assert trn1.vector_elements_per_second(BF16) == trn1.vector_elements_per_second(["float32"])


def test_reductions_write_the_reduced_shape():
    cost = op_cost("aten::sum.dim_IntList", [(128, 256)], ["float32"], cost_target(), out_shapes=[(128,)])
    assert cost.flops == 128 * 256 and cost.bytes_written == 4 * 128
    softmax = op_cost("aten::_softmax", [(128, 256)], ["float32"], cost_target())
    assert softmax.bytes_written == 4 * 128 * 256 and Engine.SCALAR in softmax.engine_seconds


def test_views_cost_nothing_and_copies_are_memory_bound():
    assert op_cost("aten::view", [(4, 4)], ["float32"], cost_target()).seconds == 0
    clone = op_cost("aten::clone", [(1 << 20,)], ["float32"], cost_target())
    assert clone.bound == "memory" and clone.flops == 0 and clone.engine is Engine.DMA


def test_roofline_picks_memory_bound_and_compute_bound():
    t = cost_target("trn2")
    matvec = op_cost("aten::mm", [(8192, 8192), (8192, 1)], BF16, t)
    assert matvec.bound == "memory" and matvec.engine is Engine.DMA
    assert matvec.seconds == pytest.approx(t.launch_seconds + matvec.memory_seconds)
    square = op_cost("aten::mm", [(4096, 4096), (4096, 4096)], BF16, t)
    assert square.bound == "compute" and square.engine is Engine.TENSOR
    assert square.seconds == pytest.approx(t.launch_seconds + square.compute_seconds)


def test_fp32_matmul_runs_at_the_fp32_rate_unless_autocast():
    shapes = [(2048, 2048), (2048, 2048)]
    bf16 = op_cost("aten::mm", shapes, BF16, cost_target()).compute_seconds
    fp32 = op_cost("aten::mm", shapes, ["float32"] * 2, cost_target()).compute_seconds
    chip = CHIPS["trn2"]
    assert fp32 / bf16 == pytest.approx(chip.tensor_bf16_flops_per_second / chip.tensor_fp32_flops_per_second)
    cast = op_cost("aten::mm", shapes, ["float32"] * 2, cost_target(fp32_matmul_as_bf16=True)).compute_seconds
    assert cast == pytest.approx(bf16)
    fp8 = op_cost("aten::mm", shapes, ["float8_e5m2"] * 2, cost_target()).compute_seconds
    assert fp8 == pytest.approx(bf16 / 2)  # 158 vs 79 TFLOPS


def test_lnc2_doubles_compute_and_hbm_share():
    shapes = [(4096, 4096), (4096, 4096)]
    one, two = cost_target("trn2", lnc=1), cost_target("trn2", lnc=2)
    assert op_cost("aten::mm", shapes, BF16, one).compute_seconds == pytest.approx(
        2 * op_cost("aten::mm", shapes, BF16, two).compute_seconds)
    chip = CHIPS["trn2"]
    assert two.hbm_bytes_per_second == pytest.approx(chip.hbm_bytes_per_second / 4)  # 4 logical cores
    assert one.hbm_bytes_per_second == pytest.approx(chip.hbm_bytes_per_second / 8)
    assert target_from_topology(resolve_topology(lnc=1)) == one


def test_large_bf16_matmul_models_at_tensore_peak():
    m = n = k = 8192
    t = cost_target("trn2", lnc=1)
    cost = op_cost("aten::mm", [(m, k), (k, n)], BF16, t)
    peak_time = 2 * m * n * k / CHIPS["trn2"].tensor_bf16_flops_per_second
    assert cost.compute_seconds == pytest.approx(peak_time, rel=1e-12)
    assert abs(cost.seconds - peak_time) / peak_time < 0.001  # launch is the only addition


def test_nki_matmul_tutorial_figure():
    # trainium-facts.md: Published figures. Trn1, BF16, [4096,8192] x [8192,8192]:
    # fully optimised 6.97 ms at 85.24% hardware FLOPs utilisation.
    m, k, n = 4096, 8192, 8192
    cost = op_cost("aten::mm", [(m, k), (k, n)], BF16, cost_target("trn1"))
    peak_time = 2 * m * n * k / CHIPS["trn1"].tensor_bf16_flops_per_second
    assert cost.bound == "compute"
    assert abs(cost.seconds - peak_time) / peak_time < 0.001
    # The model is a peak roofline, so it should predict the tutorial's utilisation:
    # published 6.97 ms x 85.24% is the peak-bound time; we agree within 1 percentage point.
    assert peak_time / 6.97e-3 == pytest.approx(0.8524, abs=0.01)


def test_trn1_hbm_share_matches_the_published_222_flop_per_byte():
    # trainium-facts.md: "TensorE saturates at about 222 FLOP/B arithmetic intensity (BF16, NeuronCore-v2)".
    t = cost_target("trn1")
    ridge = t.tensor_flops_per_second("bfloat16") / t.hbm_bytes_per_second
    assert ridge == pytest.approx(222, rel=0.02)


def test_fallback_pays_host_transfers():
    t = cost_target()
    cost = op_cost("aten::linalg_eigh", [(64, 64)], ["float32"], t, out_shapes=[(64,), (64, 64)])
    nbytes_in, nbytes_out = 4 * 64 * 64, 4 * (64 + 64 * 64)
    expected = 3 * DMA_FIXED_SECONDS + (nbytes_in + nbytes_out) / ASSUMED_HOST_LINK_BYTES_PER_SECOND
    assert cost.bound == "transfer" and cost.seconds == pytest.approx(expected)
    assert fallback_cost("x", 0, 0, 0, t).seconds == 0
    f64 = op_cost("aten::add.Tensor", [(8,), (8,)], ["float64"] * 2, t)
    assert f64.bound == "transfer"


def test_assumptions_are_overridable():
    t = cost_target(launch_seconds=0.0, host_link_bytes_per_second=64e9)
    assert op_cost("aten::relu", [(1,)], ["float32"], t).launch_seconds == 0
    assert cost_target().launch_seconds == DEFAULT_LAUNCH_SECONDS == 2 * DMA_FIXED_SECONDS


@pytest.mark.parametrize(
    "call, error, message",
    [
        (lambda: cost_target("trn9"), ValueError, "NEURON_PLATFORM_TARGET_OVERRIDE"),
        (lambda: cost_target("trn1", lnc=2), ValueError, "lnc=2 is not supported on trn1"),
        (lambda: cost_target(host_link_bytes_per_second=0), ValueError, "host_link_bytes_per_second"),
        (lambda: op_cost("aten::mm", [(2, -3), (3, 2)], BF16, cost_target()), ValueError, r"size at dim 1 is -3"),
        (lambda: op_cost("aten::mm", [(2, 3.0), (3, 2)], BF16, cost_target()), TypeError, "not an int"),
        (lambda: op_cost("aten::mm", [(2, 3), (4, 2)], BF16, cost_target()), ValueError, "inner sizes differ"),
        (lambda: op_cost("aten::mm", [(2, 3), (3, 2)], ["bfloat16"], cost_target()), ValueError, "one dtype per shape"),
        (lambda: op_cost("aten::mm", [(2, 3), (3, 2)], BF16, "trn2"), TypeError, "CostTarget"),
        (lambda: op_cost("aten::add.Tensor", [(2, 3), (4,)], BF16, cost_target()), ValueError, "do not broadcast"),
        (lambda: op_cost("aten::zeros", [], [], cost_target()), ValueError, "pass out_shapes"),
        (lambda: op_cost("aten::conv2d", [(1, 3, 5, 5), (4, 2, 3, 3)], BF16, cost_target()), ValueError, "channels"),
        (lambda: fallback_cost("x", -1, 0, 1, cost_target()), ValueError, "bytes_in"),
    ],
)
def test_bad_input_names_the_problem(call, error, message):
    with pytest.raises(error, match=message):
        call()


def test_tensor_engine_ops_are_what_auto_cast_matmult_casts():
    from torchneuron.hardware import is_matmul, runs_on_tensor_engine

    for op in ("aten::mm", "aten::addmm", "aten::bmm.out", "aten::linear", "aten::convolution",
               "aten::convolution_overrideable", "aten::convolution_backward_overrideable"):
        assert runs_on_tensor_engine(op), op
    for op in ("aten::add.Tensor", "aten::addr", "aten::softmax.int", "aten::sum.dim_IntList"):
        assert not runs_on_tensor_engine(op), op
    assert is_matmul("aten::mm") and not is_matmul("aten::convolution")  # the cost formulas' split


def test_gathers_read_the_rows_they_select_not_the_table():
    """An embedding lookup of one token reads one row (a decode step's cost was once the whole
    128k x 8k table's: 2.9 ms of a 19 ms token)."""
    target = cost_target("trn2")
    table, dim = 128256, 8192
    one = op_cost("aten::index_select", [(table, dim), (1,)], ["bfloat16", "int64"], target,
                  out_shapes=[(1, dim)], out_dtypes=["bfloat16"])
    many = op_cost("aten::index_select", [(table, dim), (4096,)], ["bfloat16", "int64"], target,
                   out_shapes=[(4096, dim)], out_dtypes=["bfloat16"])
    assert one.bytes_read == dim * 2 + 8 and one.bytes_written == dim * 2
    assert many.bytes_read == 4096 * (dim * 2 + 8)
    small_table = op_cost("aten::index_select", [(1000, dim), (1,)], ["bfloat16", "int64"], target,
                          out_shapes=[(1, dim)], out_dtypes=["bfloat16"])
    assert small_table.seconds == one.seconds  # the table's size does not matter


def test_scatters_move_the_rows_they_update():
    target = cost_target("trn2")
    cost = op_cost("aten::index_add", [(100000, 64), (10,), (10, 64)], ["float32", "int64", "float32"], target,
                   out_shapes=[(100000, 64)], out_dtypes=["float32"])
    assert cost.bytes_read == 10 * 64 * 4 + 10 * 8 and cost.bytes_written == 10 * 64 * 4
