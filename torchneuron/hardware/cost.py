"""Roofline cost of one op on one logical NeuronCore.

``seconds = launch + max(compute, memory)`` where

- compute is the busiest engine's time (engines pipeline across tiles, so they
  overlap): TensorE ``tensor_flops / (peak(dtype) * lnc)``; VectorE and ScalarE
  ``(element_passes / (128 lanes * lnc * speedup) + 100 * instructions) / clock``;
- memory is compulsory HBM traffic over the logical core's share of chip HBM
  bandwidth, ``hbm_bytes_per_second / logical_cores_per_chip``;
- launch is a fixed per-op cost, by default two DMA fixed costs (see
  :data:`DEFAULT_LAUNCH_SECONDS`).

An op that falls back to CPU (:func:`torchneuron.hardware.support.placement`)
pays instead the host transfer of its inputs and outputs. Figures come from
trainium-facts.md; the two that do not (host link bandwidth, launch cost) are
named assumptions, overridable per :class:`CostTarget`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from torchneuron.hardware import flops as F
from torchneuron.hardware.dtypes import (
    TORCH_DTYPE_ITEMSIZE,
    Treatment,
    dtype_support,
    normalize_dtype,
)
from torchneuron.hardware.engines import (
    ATTENTION,
    CONVOLUTION,
    CONVOLUTION_BACKWARD,
    DMA_FIXED_SECONDS,
    FACTORIES,
    MATMUL,
    MOVEMENT,
    RECURRENT,
    TENSOR_ENGINE,
    VIEWS,
    Engine,
)
from torchneuron.hardware.opname import parse_op_name
from torchneuron.hardware.specs import ChipSpec, get_chip
from torchneuron.hardware.support import placement
from torchneuron.hardware.topology import Topology

__all__ = [
    "ASSUMED_HOST_LINK_BYTES_PER_SECOND",
    "DEFAULT_LAUNCH_SECONDS",
    "DMA_FIXED_SECONDS",
    "dma_seconds",
    "CostTarget",
    "Engine",
    "OpCost",
    "cost_target",
    "fallback_cost",
    "is_matmul",
    "runs_on_tensor_engine",
    "op_cost",
    "roofline",
    "target_from_topology",
]

# No per-op eager launch figure is published. Floor used: an op's input load and
# its dependent output store each pay the DMA fixed cost, 2 x 1.3 us. The Trn2
# hardware-DGE figure (~0.6 us) is per descriptor-generating instruction, which
# the compiler may or may not choose, so it is not used.
DEFAULT_LAUNCH_SECONDS = 2 * DMA_FIXED_SECONDS
# ASSUMPTION, not from the facts sheet: host <-> device bandwidth for CPU
# fallback transfers. The sheet gives none; 32 GB/s is a PCIe Gen4 x16-class
# link, chosen as a round, named placeholder. Override per CostTarget.
ASSUMED_HOST_LINK_BYTES_PER_SECOND = 32e9

VECTOR_LANES = 128  # trainium-facts.md: Engines, VectorE and ScalarE: 128 lanes
STATIC_OVERHEAD_CYCLES = 100  # trainium-facts.md: Engines, "about 100 cycles static overhead"
# trainium-facts.md: Engines, "Trn2 VectorE runs BF16/FP16 2-4x faster on contiguous
# SBUF data"; we take the low end, and apply it to Trn3 too (nki-api-facts.md: 7).
VECTOR_LOW_PRECISION_SPEEDUP = 2
_FAST_VECTOR_DTYPES = frozenset({"bfloat16", "float16"})


@dataclass(frozen=True, kw_only=True)
class CostTarget:
    """One logical NeuronCore of ``chip`` at ``lnc``, plus the model's tunable assumptions."""

    chip: ChipSpec
    lnc: int
    launch_seconds: float = DEFAULT_LAUNCH_SECONDS
    host_link_bytes_per_second: float = ASSUMED_HOST_LINK_BYTES_PER_SECOND
    native_int64: bool = False
    # The Neuron compiler auto-casts FP32 matmuls to BF16 by default (trainium-facts.md:
    # Data types); eager ops here run FP32 at the FP32 rate unless this is set.
    fp32_matmul_as_bf16: bool = False

    def __post_init__(self) -> None:
        if self.lnc not in self.chip.supported_lnc:
            raise ValueError(
                f"lnc={self.lnc!r} is not supported on {self.chip.name}; use "
                f"{' or '.join(map(str, self.chip.supported_lnc))}"
            )
        for name in ("launch_seconds", "host_link_bytes_per_second"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or value < 0 or (value == 0 and name != "launch_seconds"):
                raise ValueError(f"CostTarget.{name} must be a positive number, got {value!r}")
        if self.native_int64 and not self.chip.flag_gated_dtypes:
            raise ValueError(f"native_int64=True needs trn2 or trn3; {self.chip.name} has no native INT64")

    @property
    def hbm_bytes_per_second(self) -> float:
        """This logical core's share of chip HBM bandwidth (chip figure / logical cores)."""
        return self.chip.hbm_bytes_per_second * self.lnc / self.chip.physical_cores_per_chip

    def tensor_flops_per_second(self, dtype: str) -> float:
        """TensorE peak of this logical core for a torch dtype (rate of its device type)."""
        support = dtype_support(dtype, self.chip.name, native_int64=self.native_int64)
        if support.treatment is Treatment.UNSUPPORTED:
            raise ValueError(f"no TensorE rate for {dtype}: {support.reason}")
        device_dtype = support.device_dtype
        if device_dtype == "float32" and self.fp32_matmul_as_bf16:
            device_dtype = "bfloat16"
        rate = self.chip.tensor_flops_per_second(device_dtype)
        if rate is None:
            # Integers run through FP32 (trainium-facts.md: Data types). Non-MX FP8 on
            # trn3 has no published figure; its datapath is the BF16 one (nki-api-facts.md: 7).
            precision = "fp32" if "int" in device_dtype else "bf16"
            rate = getattr(self.chip, f"tensor_{precision}_flops_per_second")
        return rate * self.lnc

    def vector_elements_per_second(self, dtypes: Sequence[str] = (), contiguous: bool = True) -> float:
        fast = (
            self.chip.name in ("trn2", "trn3")
            and contiguous
            and bool(dtypes)
            and all(d in _FAST_VECTOR_DTYPES for d in dtypes)
        )
        speedup = VECTOR_LOW_PRECISION_SPEEDUP if fast else 1
        return VECTOR_LANES * self.lnc * speedup * self.chip.vector_clock_hz

    @property
    def scalar_elements_per_second(self) -> float:
        return VECTOR_LANES * self.lnc * self.chip.scalar_clock_hz


def cost_target(target: str = "trn2", lnc: int | None = None, **assumptions) -> CostTarget:
    """A :class:`CostTarget` by chip spelling (``trn2``, ``gen3``...); ``lnc=None`` is the chip default."""
    chip = get_chip(target)
    return CostTarget(chip=chip, lnc=chip.default_lnc if lnc is None else lnc, **assumptions)


def target_from_topology(topology: Topology, **assumptions) -> CostTarget:
    """The cost target of one device of ``topology`` (all its devices are alike)."""
    return CostTarget(chip=topology.chip, lnc=topology.lnc, **assumptions)


@dataclass(frozen=True, kw_only=True)
class OpCost:
    """Modelled cost of one op. ``bound`` names the term that set ``seconds``."""

    op: str
    formula: str
    engine: Engine | None
    bound: str  # "compute", "memory", "transfer" (CPU fallback) or "none" (views)
    flops: int
    bytes_read: int
    bytes_written: int
    compute_seconds: float
    memory_seconds: float
    launch_seconds: float
    transfer_seconds: float = 0.0
    engine_seconds: Mapping[Engine, float] = field(default_factory=dict)

    @property
    def seconds(self) -> float:
        return self.launch_seconds + self.transfer_seconds + max(self.compute_seconds, self.memory_seconds)

    @property
    def arithmetic_intensity(self) -> float:
        """FLOPs per byte of HBM traffic (0 when the op moves no bytes)."""
        traffic = self.bytes_read + self.bytes_written
        return self.flops / traffic if traffic else 0.0


def roofline(work: F.Work, target: CostTarget, op: str = "") -> OpCost:
    """Seconds for ``work`` on ``target``'s logical core."""
    engines: dict[Engine, float] = {}
    if work.tensor_flops:
        rate = min(target.tensor_flops_per_second(d) for d in work.tensor_dtypes or ("float32",))
        engines[Engine.TENSOR] = work.tensor_flops / rate
    if work.vector_instructions:
        per_second = target.vector_elements_per_second(work.vector_dtypes, work.contiguous)
        engines[Engine.VECTOR] = (
            work.vector_element_passes / per_second
            + work.vector_instructions * STATIC_OVERHEAD_CYCLES / target.chip.vector_clock_hz
        )
    if work.scalar_instructions:
        engines[Engine.SCALAR] = (
            work.scalar_element_passes / target.scalar_elements_per_second
            + work.scalar_instructions * STATIC_OVERHEAD_CYCLES / target.chip.scalar_clock_hz
        )
    compute = max(engines.values(), default=0.0)
    memory = (work.bytes_read + work.bytes_written) / target.hbm_bytes_per_second
    busiest = max(engines, key=engines.__getitem__) if engines else None
    return OpCost(
        op=op,
        formula=work.formula,
        engine=busiest if compute >= memory else Engine.DMA,
        bound="compute" if compute >= memory else "memory",
        flops=work.flops,
        bytes_read=work.bytes_read,
        bytes_written=work.bytes_written,
        compute_seconds=compute,
        memory_seconds=memory,
        launch_seconds=target.launch_seconds,
        engine_seconds=engines,
    )


def dma_seconds(copies: int, nbytes: float, bytes_per_second: float) -> float:
    """``copies`` DMAs moving ``nbytes`` in all over a link: each pays the DMA fixed
    cost, the bytes go at the link's rate (host link, device link; assumptions 2, 10)."""
    return copies * DMA_FIXED_SECONDS + nbytes / bytes_per_second


def fallback_cost(op: str, bytes_in: int, bytes_out: int, transfers: int, target: CostTarget) -> OpCost:
    """Host round trip of a CPU fallback: each transfer pays the DMA fixed cost, the
    bytes cross the (assumed) host link. CPU compute time is not modelled here."""
    for name, value in (("bytes_in", bytes_in), ("bytes_out", bytes_out), ("transfers", transfers)):
        if value < 0:
            raise ValueError(f"fallback_cost: {name} must be >= 0, got {value}")
    seconds = dma_seconds(transfers, bytes_in + bytes_out, target.host_link_bytes_per_second)
    return OpCost(
        op=op,
        formula="CPU fallback: transfers * DMA fixed cost + bytes / host link",
        engine=Engine.DMA,
        bound="transfer",
        flops=0,
        bytes_read=bytes_in,
        bytes_written=bytes_out,
        compute_seconds=0.0,
        memory_seconds=0.0,
        launch_seconds=0.0,
        transfer_seconds=seconds,
    )


# --- op families -------------------------------------------------------------

# ScalarE runs transcendental activations (trainium-facts.md: Engines).
_TRANSCENDENTAL = frozenset(
    {
        "exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "sqrt", "rsqrt", "reciprocal",
        "sigmoid", "tanh", "gelu", "silu", "mish", "softplus", "elu", "selu", "celu", "erf",
        "erfc", "erfinv", "sin", "cos", "tan", "asin", "acos", "atan", "sinh", "cosh", "asinh",
        "acosh", "atanh", "logit", "pow", "atan2", "lgamma", "digamma", "sgn", "xlogy",
        "gelu_backward", "silu_backward", "mish_backward", "softplus_backward", "elu_backward",
        "logit_backward", "sinc", "special_expit",
    }
)  # fmt: skip
_BOOL_RESULT = frozenset(
    {"eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or", "logical_xor",
     "logical_not", "isnan", "isinf", "isfinite", "isposinf", "isneginf", "signbit", "isclose"}
)  # fmt: skip
# base -> (FLOPs per element, VectorE passes, ScalarE passes, output has the input's shape)
_REDUCTIONS: dict[str, tuple[int, int, int, bool]] = {
    **dict.fromkeys(
        ("sum", "mean", "nansum", "nanmean", "prod", "amax", "amin", "max", "min", "argmax",
         "argmin", "all", "any", "count_nonzero", "norm", "linalg_vector_norm", "aminmax"),
        (1, 1, 0, False),
    ),
    **dict.fromkeys(("var", "std", "var_mean", "std_mean"), (3, 2, 0, False)),
    "logsumexp": (3, 1, 1, False),
    **dict.fromkeys(("_softmax", "softmax", "_log_softmax", "log_softmax", "_safe_softmax"), (4, 2, 1, True)),
    **dict.fromkeys(("_softmax_backward_data", "_log_softmax_backward_data"), (3, 2, 0, True)),
    **dict.fromkeys(
        ("native_layer_norm", "layer_norm", "rms_norm", "_fused_rms_norm", "native_group_norm",
         "group_norm", "native_batch_norm", "batch_norm", "_native_batch_norm_legit",
         "_native_batch_norm_legit_no_training"),
        (5, 2, 0, True),
    ),
    **dict.fromkeys(
        ("native_layer_norm_backward", "native_group_norm_backward", "native_batch_norm_backward",
         "_fused_rms_norm_backward"),
        (8, 3, 0, True),
    ),
    **dict.fromkeys(("cumsum", "cumprod"), (1, 2, 0, True)),  # scans cost 2N (nki-api-facts.md: 9)
    "logcumsumexp": (3, 2, 1, True),
}  # fmt: skip
def is_matmul(op_name: str) -> bool:
    """True for ops TensorE runs as a matrix multiply."""
    return parse_op_name(op_name).base in MATMUL


def runs_on_tensor_engine(op_name: str) -> bool:
    """True for the ops ``--auto-cast matmult`` casts: those TensorE runs, the matmul
    family and convolutions (an implicit GEMM), forward and backward. The one
    predicate eager kernels, the fallback and the compiler's numerics pass share."""
    return parse_op_name(op_name).base in TENSOR_ENGINE


_BIAS_FIRST = frozenset({"addmm", "baddbmm", "addbmm", "addmv", "_addmm_activation"})
_CONV_ARGS = ("stride", "padding", "dilation", "groups", "transposed", "output_padding")


def op_cost(
    op_name: str,
    shapes: Sequence[Sequence[int]],
    dtypes: Sequence[str],
    target: CostTarget,
    *,
    out_shapes: Sequence[Sequence[int]] | None = None,
    out_dtypes: Sequence[str] | None = None,
    strides: Sequence[Sequence[int] | None] | None = None,
    on_device: bool | None = None,
    **op_args,
) -> OpCost:
    """Modelled cost of one ATen op on ``target``.

    Args:
        op_name: ATen overload name, e.g. ``"aten::mm"``.
        shapes: tensor arguments in schema order (tensor lists flattened); for ``.out``
            overloads the last one is the ``out`` tensor.
        dtypes: one dtype name per entry of ``shapes``.
        out_shapes, out_dtypes: results; default: the ``out`` tensor, the op's own
            formula, or the broadcast of the inputs in the first input's dtype.
        strides: per input, its strides (``None`` entries = contiguous); stride-0
            (expanded) dims are read once and non-unit inner strides lose the Trn2/Trn3
            VectorE low-precision speedup.
        op_args: the op's non-tensor arguments the formula needs: ``stride``,
            ``padding``, ``dilation``, ``groups``, ``transposed``, ``output_padding``,
            ``output_mask`` (conv); ``is_causal`` (attention).
        on_device: where the caller already placed the op on ``target`` (the device
            layer's record decides once per (op, dtypes) with :func:`placement`); None:
            decided here, from the inputs' and results' dtypes.

    Raises:
        ValueError / TypeError: naming the bad shape, dtype, argument or target.
    """
    if not isinstance(target, CostTarget):
        raise TypeError(f"target must be a CostTarget (use cost_target('trn2')), got {type(target).__name__}")
    op = parse_op_name(op_name)
    shapes = [F.check_shape(s, f"{op.qualified} input {i}") for i, s in enumerate(shapes)]
    dtypes = [normalize_dtype(d) for d in dtypes]
    if len(dtypes) != len(shapes):
        raise ValueError(f"{op.qualified}: got {len(shapes)} shapes but {len(dtypes)} dtypes; pass one dtype per shape")
    if out_shapes is None and (op.overload == "out" or op.overload.endswith("_out")) and shapes:
        out_shapes, out_dtypes = [shapes.pop()], [dtypes.pop()]
    outs = None if out_shapes is None else [F.check_shape(s, f"{op.qualified} output {i}") for i, s in enumerate(out_shapes)]
    out_dtypes = None if out_dtypes is None else [normalize_dtype(d) for d in out_dtypes]

    if on_device is None:
        on_device = placement(op_name, tuple(dtypes) + tuple(out_dtypes or ()), target=target.chip.name,
                              native_int64=target.native_int64).on_device  # fmt: skip
    if not on_device:
        return _fallback(op.qualified, shapes, dtypes, outs, out_dtypes, target)
    # max.other / min.other are the elementwise maximum / minimum.
    base = {"max": "maximum", "min": "minimum"}.get(op.base, op.base) if op.overload == "other" else op.base
    work = _work(base, op.qualified, shapes, dtypes, outs, out_dtypes, strides, op_args)
    if work is None:
        return OpCost(op=op.qualified, formula="view or allocation: no kernel", engine=None, bound="none",
                      flops=0, bytes_read=0, bytes_written=0, compute_seconds=0.0, memory_seconds=0.0,
                      launch_seconds=0.0)  # fmt: skip
    return roofline(work, target, op.qualified)


def _itemsize(dtype: str) -> int:
    return TORCH_DTYPE_ITEMSIZE[dtype]


def _nbytes(shapes: Sequence[Sequence[int]], dtypes: Sequence[str]) -> int:
    return sum(F.numel(s) * _itemsize(d) for s, d in zip(shapes, dtypes))


def _fallback(op, shapes, dtypes, outs, out_dtypes, target) -> OpCost:
    # Without known outputs, assume one result the size of the first input.
    if outs is None:
        outs, out_dtypes = shapes[:1], dtypes[:1]
    out_dtypes = out_dtypes or dtypes[:1] * len(outs)
    return fallback_cost(op, _nbytes(shapes, dtypes), _nbytes(outs, out_dtypes), len(shapes) + len(outs), target)


def _read_elements(shape: Sequence[int], stride: Sequence[int] | None) -> int:
    if stride is None:
        return F.numel(shape)
    return math.prod(size for size, st in zip(shape, stride) if st != 0)


def _is_contiguous_inner(shape: Sequence[int], stride: Sequence[int] | None) -> bool:
    return stride is None or not shape or shape[-1] <= 1 or stride[-1] == 1


def _work(base, qualified, shapes, dtypes, outs, out_dtypes, strides, op_args) -> F.Work | None:
    if base in VIEWS:
        return None
    if base in MATMUL:
        return _matmul(base, qualified, shapes, dtypes, outs, out_dtypes)
    if base in CONVOLUTION:
        return _conv(base, qualified, shapes, dtypes, op_args)
    if base in CONVOLUTION_BACKWARD:
        _need(qualified, shapes, 3, "(grad_output, input, weight)")
        args = {k: op_args[k] for k in _CONV_ARGS + ("output_mask",) if k in op_args}
        return F.conv_backward_work(*shapes[:3], itemsize=_itemsize(dtypes[1]), dtypes=tuple(dtypes[1:3]), **args)
    if base in ATTENTION or (base.endswith("_backward") and base.removesuffix("_backward") in ATTENTION):
        backward = base.endswith("_backward")
        qkv = shapes[1:4] if backward else shapes[:3]
        _need(qualified, shapes, 4 if backward else 3, "(grad_out, query, key, value, ...)" if backward else "(query, key, value[, mask])")
        # FlexAttention's further tensors are its block mask and captured buffers, not a mask
        mask = None if backward or len(shapes) < 4 or base.startswith("flex_attention") else shapes[3]
        return F.attention_work(*qkv, itemsize=_itemsize(dtypes[1 if backward else 0]), dtypes=tuple(dtypes[:3]),
                                causal=bool(op_args.get("is_causal", False)), backward=backward, mask=mask)  # fmt: skip
    if base in RECURRENT or (base.endswith("_backward") and base.removesuffix("_backward") in RECURRENT):
        return _rnn(base, qualified, shapes, dtypes, op_args)
    return _pointwise(base, qualified, shapes, dtypes, outs, out_dtypes, strides)


def _rnn(base, qualified, shapes, dtypes, op_args) -> F.Work:
    """``aten::lstm.input``-style calls (and their ``torchneuron::*_backward``): tensors in
    schema order: input (or packed data and batch_sizes), the hidden states, the weights."""
    mode = base.removesuffix("_backward")
    packed = qualified.endswith(".data")
    states = 2 if mode == "lstm" else 1
    head = (2 if packed else 1) + states
    _need(qualified, shapes, head + 2, "(input, hidden states..., weights...)")
    layers = int(op_args.get("num_layers", 1)) * (2 if op_args.get("bidirectional") else 1)
    params = shapes[head:]
    if layers <= 0 or len(params) % layers:
        raise ValueError(f"{qualified}: {len(params)} weights do not split into {layers} layers x directions")
    per = len(params) // layers
    has_proj = mode == "lstm" and shapes[head - 2][-1] != shapes[head - 1][-1]
    weights = [(params[i], params[i + 1], params[i + per - 1] if has_proj else None)
               for i in range(0, len(params), per)]  # fmt: skip
    batch = shapes[head - 1][1]
    if packed:
        rows, steps = shapes[0][0], shapes[1][0]
    else:
        seq, b = shapes[0][:2]
        rows, steps = seq * b, (b if op_args.get("batch_first") else seq)
    return F.rnn_work(mode, rows=rows, steps=steps, batch=batch, layer_weights=weights,
                      has_biases=bool(op_args.get("has_biases", True)), itemsize=_itemsize(dtypes[0]),
                      dtype=dtypes[0], backward=base.endswith("_backward"))  # fmt: skip


def _need(qualified: str, shapes, count: int, layout: str) -> None:
    if len(shapes) < count:
        raise ValueError(f"{qualified} needs at least {count} tensor shapes {layout}, got {len(shapes)}")


def _matmul(base, qualified, shapes, dtypes, outs, out_dtypes) -> F.Work:
    bias = None
    if base in _BIAS_FIRST:
        _need(qualified, shapes, 3, "(self, mat1, mat2)")
        bias, bias_dtype, shapes, dtypes = shapes[0], dtypes[0], shapes[1:], dtypes[1:]
    elif base == "linear":
        _need(qualified, shapes, 2, "(input, weight[, bias])")
        if len(shapes) > 2:
            bias, bias_dtype = shapes[2], dtypes[2]
        weight = shapes[1]
        shapes = [shapes[0], tuple(weight[::-1]) if len(weight) == 2 else weight]
    _need(qualified, shapes, 2, "(input, other)")
    out_dtype = out_dtypes[0] if out_dtypes else dtypes[0]
    return F.matmul_work(
        shapes[0], shapes[1],
        itemsizes=(_itemsize(dtypes[0]), _itemsize(dtypes[1]), _itemsize(out_dtype)),
        dtypes=tuple(dtypes[:2]),
        bias=bias,
        bias_itemsize=_itemsize(bias_dtype) if bias is not None else 0,
        reduce_batch=base == "addbmm",
    )  # fmt: skip


def _conv(base, qualified, shapes, dtypes, op_args) -> F.Work:
    _need(qualified, shapes, 2, "(input, weight[, bias])")
    args = {k: op_args[k] for k in _CONV_ARGS if k in op_args}
    if base.startswith("conv_transpose"):
        args["transposed"] = True
    return F.conv_work(shapes[0], shapes[1], itemsize=_itemsize(dtypes[0]), dtypes=tuple(dtypes[:2]),
                       bias=len(shapes) > 2, **args)  # fmt: skip


def _broadcast_all(qualified: str, shapes) -> tuple[int, ...]:
    out: tuple[int, ...] = ()
    for shape in shapes:
        out = F.broadcast_shapes(out, shape, qualified)
    return out


# Ops that read only the rows their indices select (an embedding lookup reads one row per
# token, not the table), and ops that write only the rows their indices select (the rest of
# their result is the input, updated in place on the device). ``index`` is advanced indexing.
_GATHERS = frozenset({"index_select", "gather", "embedding", "take", "index", "_unsafe_index",
                      "take_along_dim"})
_SCATTERS = frozenset({"index_add", "index_copy", "scatter", "scatter_add", "scatter_reduce",
                       "index_put", "_index_put_impl", "index_fill", "masked_scatter"})
_INTEGER_DTYPES = frozenset({"int64", "int32", "int16", "int8", "uint8", "bool"})


def _indexed_work(base, shapes, dtypes, outs, out_dtypes, common) -> F.Work:
    """DMA of the selected rows: gathers read what they return, scatters read and write what
    their source (the smaller operands) holds, plus the indices either way."""
    index_bytes = sum(F.numel(s) * _itemsize(d) for s, d in zip(shapes, dtypes) if d in _INTEGER_DTYPES)
    if base in _GATHERS:
        moved = _nbytes(outs, out_dtypes)
        formula = "gather: DMA of the selected rows"
    else:
        values = [(s, d) for s, d in zip(shapes[1:], dtypes[1:]) if d not in _INTEGER_DTYPES]
        moved = min((F.numel(s) * _itemsize(d) for s, d in values), default=0) if values else 0
        formula = "scatter: DMA of the updated rows"
    elements = max((F.numel(s) for s in outs), default=0) if base in _GATHERS else moved // max(1, _itemsize(dtypes[0]))
    return F.pointwise_work(formula=formula, pass_elements=elements, flops_per_element=0,
                            **{**common, "bytes_read": moved + index_bytes, "bytes_written": moved})


def _pointwise(base, qualified, shapes, dtypes, outs, out_dtypes, strides) -> F.Work:
    strides = list(strides) if strides is not None else [None] * len(shapes)
    if len(strides) != len(shapes):
        raise ValueError(f"{qualified}: got {len(strides)} strides for {len(shapes)} shapes; pass one per shape (None = contiguous)")
    bytes_read = sum(_read_elements(s, st) * _itemsize(d) for s, st, d in zip(shapes, strides, dtypes))
    contiguous = all(_is_contiguous_inner(s, st) for s, st in zip(shapes, strides))
    in_elems = max((F.numel(s) for s in shapes), default=0)
    reduction = _REDUCTIONS.get(base)
    if outs is None:
        if base in FACTORIES or not shapes:
            raise ValueError(f"{qualified}: pass out_shapes (and out_dtypes) for factory ops; they have no input to size them")
        same = reduction[3] if reduction else True
        outs = [_broadcast_all(qualified, shapes) if same else ()]
    if out_dtypes is None:
        out_dtypes = ["bool" if base in _BOOL_RESULT else (dtypes[0] if dtypes else "float32")] * len(outs)
    out_elems = sum(F.numel(s) for s in outs)
    common = dict(bytes_read=bytes_read, bytes_written=_nbytes(outs, out_dtypes),
                  vector_dtypes=tuple(dtypes) + tuple(out_dtypes), contiguous=contiguous)  # fmt: skip
    if base in FACTORIES:
        return F.pointwise_work(formula="factory: one VectorE write pass", pass_elements=out_elems,
                                flops_per_element=0, vector_passes=1, **common)  # fmt: skip
    if base in _GATHERS or base in _SCATTERS:
        return _indexed_work(base, shapes, dtypes, outs, out_dtypes, common)
    if base in MOVEMENT and (base not in ("copy", "_to_copy", "clone") or len(set(dtypes + out_dtypes)) == 1):
        return F.pointwise_work(formula="data movement: DMA only", pass_elements=max(in_elems, out_elems),
                                flops_per_element=0, **common)  # fmt: skip
    if reduction:
        per_element, vector, scalar, _ = reduction
        return F.pointwise_work(formula=f"reduction/normalisation: {per_element} FLOP per input element",
                                pass_elements=in_elems, flops_per_element=per_element, vector_passes=vector,
                                scalar_passes=scalar, **common)  # fmt: skip
    tensors = max(1, len(shapes))
    if base in _TRANSCENDENTAL:
        return F.pointwise_work(formula="elementwise transcendental: ScalarE, 1 FLOP per element",
                                pass_elements=max(in_elems, out_elems), scalar_passes=1,
                                vector_passes=tensors - 1, **common)  # fmt: skip
    return F.pointwise_work(formula="elementwise: VectorE, 1 pass per tensor input, 1 FLOP per element",
                            pass_elements=max(in_elems, out_elems), vector_passes=tensors, **common)  # fmt: skip
