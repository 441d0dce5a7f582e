"""Work formulas: what an op asks of each engine and of HBM, from shapes alone.

A :class:`Work` is target-independent (no clocks, no bandwidths): useful FLOPs,
compulsory HBM bytes (every operand read once, every result written once), and
per-engine load. :mod:`torchneuron.hardware.cost` turns it into seconds.

Engine loads follow trainium-facts.md "Engines":

- TensorE is a 128x128 systolic array; contraction runs over the 128 partitions,
  the stationary operand is <= 128 wide and the moving one <= 512, and a matmul
  instruction takes ``max(N, 64)`` cycles for moving free size N. ``tensor_flops``
  is the FLOPs the array is *occupied* for: ``2 * 128 * 128 * cycles``, so ragged
  tiles and tiny N cost what the hardware spends, and a large aligned matmul
  costs exactly ``2*M*N*K``.
- VectorE and ScalarE have 128 lanes; an instruction over N elements per lane
  costs about N cycles per input tensor plus about 100 cycles static overhead.
  ``*_element_passes`` counts elements x passes, ``*_instructions`` the passes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = [
    "Work",
    "attention_work",
    "broadcast_shapes",
    "causal_pairs",
    "check_shape",
    "conv_output_shape",
    "conv_backward_work",
    "conv_work",
    "matmul_work",
    "numel",
    "pointwise_work",
    "rnn_work",
    "tile_flops",
]

PE_ROWS = PE_COLS = 128  # trainium-facts.md: Engines, TensorE 128x128
MOVING_MAX = 512  # trainium-facts.md: Engines, moving tile <= 128x512
MATMUL_MIN_CYCLES = 64  # trainium-facts.md: Engines, "about every max(N, 64) cycles"


@dataclass(frozen=True, kw_only=True)
class Work:
    """Shape-level cost inputs for one op. Counts are exact integers."""

    formula: str
    flops: int
    bytes_read: int
    bytes_written: int
    tensor_flops: int = 0
    tensor_dtypes: tuple[str, ...] = ()
    vector_element_passes: int = 0
    vector_instructions: int = 0
    scalar_element_passes: int = 0
    scalar_instructions: int = 0
    # Dtypes of VectorE's operands and whether they are contiguous; Trn2/Trn3
    # run all-bf16/fp16 contiguous VectorE work faster (see cost.py).
    vector_dtypes: tuple[str, ...] = ()
    contiguous: bool = True


def check_shape(shape: Sequence[int], what: str = "shape") -> tuple[int, ...]:
    """Validate a tensor shape: a sequence of non-negative ints (``()`` is a 0-d tensor).

    Raises:
        TypeError: not a sequence of ints.
        ValueError: a negative size.
    """
    if isinstance(shape, (str, bytes)) or not isinstance(shape, Sequence):
        raise TypeError(f"{what} must be a sequence of ints such as (4, 8), got {shape!r}")
    for dim, size in enumerate(shape):
        if isinstance(size, bool) or not isinstance(size, int):
            raise TypeError(f"{what} {tuple(shape)!r}: size at dim {dim} is {size!r}, not an int")
        if size < 0:
            raise ValueError(f"{what} {tuple(shape)!r}: size at dim {dim} is {size}; sizes must be >= 0")
    return tuple(shape)


def numel(shape: Sequence[int]) -> int:
    return math.prod(shape)


def tile_flops(m: int, n: int, k: int) -> int:
    """FLOPs TensorE is occupied for by an ``[m,k] @ [k,n]`` product (one orientation).

    m is the stationary free size (tiles of 128), k the contraction (tiles of 128
    partitions), n the moving free size (tiles of 512, each at least 64 cycles).
    """
    if m == 0 or n == 0 or k == 0:
        return 0
    full, rest = divmod(n, MOVING_MAX)
    moving_cycles = full * MOVING_MAX + (max(rest, MATMUL_MIN_CYCLES) if rest else 0)
    cycles = math.ceil(k / PE_ROWS) * math.ceil(m / PE_COLS) * moving_cycles
    return 2 * PE_ROWS * PE_COLS * cycles


def _array_flops(m: int, n: int, k: int) -> int:
    # The compiler may compute C or C^T = B^T A^T; take the cheaper orientation.
    return min(tile_flops(m, n, k), tile_flops(n, m, k))


def broadcast_shapes(a: Sequence[int], b: Sequence[int], what: str = "broadcast") -> tuple[int, ...]:
    """torch's broadcasting of two shapes; ``what`` names the op in the error."""
    out = []
    for x, y in zip(reversed((1,) * (len(b) - len(a)) + tuple(a)), reversed((1,) * (len(a) - len(b)) + tuple(b))):
        if x != y and 1 not in (x, y):
            raise ValueError(f"{what}: shapes {tuple(a)} and {tuple(b)} do not broadcast (size {x} vs {y})")
        out.append(y if x == 1 else x)
    return tuple(reversed(out))


def matmul_work(
    a: Sequence[int],
    b: Sequence[int],
    *,
    itemsizes: tuple[int, int, int],
    dtypes: tuple[str, ...],
    bias: Sequence[int] | None = None,
    bias_itemsize: int = 0,
    reduce_batch: bool = False,
) -> Work:
    """``torch.matmul(a, b)`` (+ ``bias``): 1-D operands promoted, batch dims broadcast.

    FLOPs are ``2*B*M*N*K`` plus ``B*M*N`` for the bias add. Every result passes
    once through VectorE to leave PSUM (bias fused into that pass).

    Args:
        itemsizes: bytes per element of a, b and the result.
        dtypes: the input dtypes; the slowest TensorE rate among them applies.
        reduce_batch: ``addbmm``: the batch is summed into one ``[M, N]`` result.
    """
    a, b = check_shape(a, "matmul input"), check_shape(b, "matmul other")
    if not a or not b:
        raise ValueError(f"matmul needs at least 1-D operands, got {a} and {b}")
    a2 = (1,) + a if len(a) == 1 else a
    b2 = b + (1,) if len(b) == 1 else b
    if a2[-1] != b2[-2]:
        raise ValueError(
            f"matmul: inner sizes differ: {a} @ {b} contracts {a2[-1]} with {b2[-2]}; "
            "the last dim of the first must equal the second-to-last of the second"
        )
    m, k, n = a2[-2], a2[-1], b2[-1]
    batch = numel(broadcast_shapes(a2[:-2], b2[:-2], "matmul batch dims"))
    out_elems = m * n if reduce_batch else batch * m * n
    flops = 2 * batch * m * n * k
    bias_read = 0
    if bias is not None:
        bias_read = numel(check_shape(bias, "matmul bias")) * bias_itemsize
        flops += out_elems
    return Work(
        formula="matmul: 2*B*M*N*K (+ M*N bias add)",
        flops=flops,
        bytes_read=numel(a) * itemsizes[0] + numel(b) * itemsizes[1] + bias_read,
        bytes_written=out_elems * itemsizes[2],
        tensor_flops=batch * _array_flops(m, n, k),
        tensor_dtypes=dtypes,
        vector_element_passes=out_elems,
        vector_instructions=1 if out_elems else 0,
    )


def _per_dim(value: int | Sequence[int], nd: int, name: str) -> tuple[int, ...]:
    values = (value,) * nd if isinstance(value, int) else tuple(value)
    if len(values) == 1:
        values *= nd
    if len(values) != nd or any(isinstance(v, bool) or not isinstance(v, int) for v in values):
        raise ValueError(f"conv {name} must be an int or {nd} ints for a {nd}-d convolution, got {value!r}")
    return values


def conv_output_shape(
    input: Sequence[int],
    weight: Sequence[int],
    *,
    stride: int | Sequence[int] = 1,
    padding: int | Sequence[int] | str = 0,
    dilation: int | Sequence[int] = 1,
    groups: int = 1,
    transposed: bool = False,
    output_padding: int | Sequence[int] = 0,
) -> tuple[int, ...]:
    """Output shape of ``aten::convolution`` (batched input ``[N, C, *spatial]``).

    Weight is ``[C_out, C_in/groups, *k]``, or ``[C_in, C_out/groups, *k]`` when
    ``transposed``. ``padding`` may be ``"valid"`` or ``"same"`` as for ``conv2d``.
    """
    input, weight = check_shape(input, "conv input"), check_shape(weight, "conv weight")
    nd = len(input) - 2
    if nd < 1 or len(weight) != len(input):
        raise ValueError(
            f"conv input {input} and weight {weight} must both be [N, C, *spatial] / "
            "[C_out, C_in/groups, *kernel] with at least one spatial dim"
        )
    if isinstance(groups, bool) or not isinstance(groups, int) or groups < 1:
        raise ValueError(f"conv groups must be a positive int, got {groups!r}")
    expected = weight[0] if transposed else weight[1] * groups
    if input[1] != expected or weight[0] % groups:
        raise ValueError(
            f"conv: input {input} has {input[1]} channels but weight {weight} with groups={groups} "
            f"(transposed={transposed}) expects {expected}, and weight dim 0 must divide by groups"
        )
    s, d = _per_dim(stride, nd, "stride"), _per_dim(dilation, nd, "dilation")
    kernel, spatial = weight[2:], input[2:]
    if padding == "same":
        if transposed or any(v != 1 for v in s):
            raise ValueError("conv padding='same' needs stride 1 and a non-transposed conv")
        out_spatial = spatial
    else:
        p = _per_dim(0 if padding == "valid" else padding, nd, "padding")
        if transposed:
            op = _per_dim(output_padding, nd, "output_padding")
            out_spatial = tuple(
                (i - 1) * st - 2 * pd + dl * (kk - 1) + o + 1
                for i, st, pd, dl, kk, o in zip(spatial, s, p, d, kernel, op)
            )
        else:
            out_spatial = tuple(
                (i + 2 * pd - dl * (kk - 1) - 1) // st + 1 for i, st, pd, dl, kk in zip(spatial, s, p, d, kernel)
            )
    if any(o < 0 for o in out_spatial):
        raise ValueError(f"conv: kernel {kernel} does not fit input {spatial} with these settings")
    c_out = weight[1] * groups if transposed else weight[0]
    return (input[0], c_out, *out_spatial)


def conv_work(
    input: Sequence[int],
    weight: Sequence[int],
    *,
    itemsize: int,
    dtypes: tuple[str, ...],
    bias: bool = False,
    **conv_args,
) -> Work:
    """``aten::convolution`` forward: ``2 * MACs`` (+ one add per output for bias).

    MACs = output elements x (C_in/groups) x prod(kernel); for a transposed conv,
    input elements x (C_out/groups) x prod(kernel). Padded positions count: the
    hardware multiplies them too. TensorE occupancy assumes implicit GEMM per group
    (stationary = output channels, moving = output positions, contraction =
    C_in/groups x kernel taps).
    """
    out = conv_output_shape(input, weight, **conv_args)
    groups = conv_args.get("groups", 1)
    taps = numel(weight[2:])
    if conv_args.get("transposed", False):
        macs = numel(input) * (out[1] // groups) * taps
        gemm = (out[1] // groups, input[0] * numel(input[2:]), (input[1] // groups) * taps)
    else:
        macs = numel(out) * weight[1] * taps
        gemm = (out[1] // groups, out[0] * numel(out[2:]), weight[1] * taps)
    out_elems = numel(out)
    return Work(
        formula="conv: 2 * out_elems * (C_in/groups) * prod(kernel) (+ bias)",
        flops=2 * macs + (out_elems if bias else 0),
        bytes_read=(numel(input) + numel(weight) + (out[1] if bias else 0)) * itemsize,
        bytes_written=out_elems * itemsize,
        tensor_flops=groups * _array_flops(*gemm),
        tensor_dtypes=dtypes,
        vector_element_passes=out_elems,
        vector_instructions=1 if out_elems else 0,
    )


def conv_backward_work(
    grad_output: Sequence[int],
    input: Sequence[int],
    weight: Sequence[int],
    *,
    itemsize: int,
    dtypes: tuple[str, ...],
    output_mask: Sequence[bool] = (True, True, True),
    **conv_args,
) -> Work:
    """``aten::convolution_backward``: grad_input and grad_weight each cost the forward's
    MACs; grad_bias is one add per grad_output element. ``output_mask`` picks which."""
    fwd = conv_work(input, weight, itemsize=itemsize, dtypes=dtypes, **conv_args)
    if check_shape(grad_output, "conv grad_output") != conv_output_shape(input, weight, **conv_args):
        raise ValueError(f"conv backward: grad_output {tuple(grad_output)} does not match the forward output")
    want_input, want_weight, want_bias = (bool(x) for x in output_mask)
    matmuls = want_input + want_weight
    g = numel(grad_output)
    return Work(
        formula="conv backward: 2*MACs per requested grad_input/grad_weight (+ grad_bias sum)",
        flops=fwd.flops * matmuls + (g if want_bias else 0),
        bytes_read=(g + (numel(input) if want_weight else 0) + (numel(weight) if want_input else 0)) * itemsize,
        bytes_written=((numel(input) if want_input else 0) + (numel(weight) if want_weight else 0)
                       + (grad_output[1] if want_bias else 0)) * itemsize,
        tensor_flops=fwd.tensor_flops * matmuls,
        tensor_dtypes=dtypes,
        vector_element_passes=g * (matmuls + want_bias),
        vector_instructions=matmuls + want_bias,
    )  # fmt: skip


def causal_pairs(l: int, s: int) -> int:
    """Unmasked (query, key) pairs under ``is_causal`` (``tril(ones(L, S))``: key j <= query i)."""
    return l * (l + 1) // 2 if l <= s else s * (s + 1) // 2 + (l - s) * s


def attention_work(
    query: Sequence[int],
    key: Sequence[int],
    value: Sequence[int],
    *,
    itemsize: int,
    dtypes: tuple[str, ...],
    causal: bool = False,
    backward: bool = False,
    mask: Sequence[int] | None = None,
) -> Work:
    """Scaled dot-product attention, flash-style (scores never reach HBM).

    Forward: ``2*P*E`` (Q K^T) + ``2*P*Ev`` (P V) FLOPs over P scored pairs per
    batch-head (``L*S``, or :func:`causal_pairs` when causal: masked pairs are
    skipped), plus softmax at 4 FLOP per pair (max, subtract, exp, sum) and one
    divide per output element. Backward recomputes Q K^T, as flash attention does:
    ``2*P*(3E + 2Ev)`` matmul FLOPs, 2 VectorE passes over pairs for dS.
    """
    q, k, v = (check_shape(x, f"attention {n}") for x, n in ((query, "query"), (key, "key"), (value, "value")))
    if min(len(q), len(k), len(v)) < 2 or q[-1] != k[-1] or k[-2] != v[-2]:
        raise ValueError(
            f"attention expects query [..., L, E], key [..., S, E], value [..., S, Ev]; got {q}, {k}, {v}"
        )
    batch, kv_batch = numel(q[:-2]), numel(k[:-2])
    if kv_batch == 0 or batch % kv_batch:
        raise ValueError(f"attention: query batch/heads {q[:-2]} is not a multiple of key's {k[:-2]}")
    l, e, s, ev = q[-2], q[-1], k[-2], v[-1]
    pairs = causal_pairs(l, s) if causal else l * s
    fraction = pairs / (l * s) if l * s else 0.0
    out_elems = batch * l * ev
    dense = _array_flops(l, s, e) + _array_flops(l, ev, s)
    lse_bytes = batch * l * 4  # fp32 logsumexp saved for backward
    io = numel(q) + numel(k) + numel(v)
    mask_bytes = numel(check_shape(mask, "attention mask")) * itemsize if mask is not None else 0
    if not backward:
        return Work(
            formula="attention fwd: 2*P*(E+Ev) + 4*P + L*Ev per batch-head",
            flops=batch * (2 * pairs * (e + ev) + 4 * pairs) + out_elems,
            bytes_read=io * itemsize + mask_bytes,
            bytes_written=out_elems * itemsize + lse_bytes,
            tensor_flops=math.ceil(batch * dense * fraction),
            tensor_dtypes=dtypes,
            vector_element_passes=batch * pairs + out_elems,  # row max, then normalise the output
            vector_instructions=2,
            scalar_element_passes=batch * pairs,  # exp(s - max) with the row sum fused
            scalar_instructions=1,
        )
    recompute = _array_flops(l, s, e)
    return Work(
        formula="attention bwd: 2*P*(3E+2Ev) + 5*P + 2*L*Ev per batch-head",
        flops=batch * (2 * pairs * (3 * e + 2 * ev) + 5 * pairs) + 2 * out_elems,
        bytes_read=(io + 2 * batch * l * ev) * itemsize + lse_bytes + mask_bytes,  # + out, grad_out
        bytes_written=io * itemsize,  # grad q, k, v
        tensor_flops=math.ceil(batch * (2 * dense + recompute) * fraction),
        tensor_dtypes=dtypes,
        vector_element_passes=2 * batch * pairs + 2 * out_elems,
        vector_instructions=4,
        scalar_element_passes=batch * pairs,
        scalar_instructions=1,
    )


def pointwise_work(
    *,
    formula: str,
    bytes_read: int,
    bytes_written: int,
    pass_elements: int,
    flops_per_element: int = 1,
    vector_passes: int = 0,
    scalar_passes: int = 0,
    vector_dtypes: tuple[str, ...] = (),
    contiguous: bool = True,
) -> Work:
    """Elementwise ops, reductions and normalisations: a fixed number of engine passes
    over ``pass_elements`` (the larger of input and output), no TensorE."""
    return Work(
        formula=formula,
        flops=flops_per_element * pass_elements,
        bytes_read=bytes_read,
        bytes_written=bytes_written,
        vector_element_passes=vector_passes * pass_elements,
        vector_instructions=vector_passes,
        scalar_element_passes=scalar_passes * pass_elements,
        scalar_instructions=scalar_passes,
        vector_dtypes=vector_dtypes,
        contiguous=contiguous,
    )


# Per timestep, after the gate matmuls: (ScalarE activations, VectorE passes) over
# the gate elements. LSTM: i, f, g, o and tanh(c); f*c + i*g, o*tanh(c), the gate
# sum. GRU: r, z, n; the gate sums, r*h_n, (h - n)*z + n. RNN: the activation.
_RNN_CELL_PASSES = {"lstm": (2, 4), "gru": (2, 4), "rnn_tanh": (1, 1), "rnn_relu": (0, 2)}
_RNN_GATES = {"lstm": 4, "gru": 3, "rnn_tanh": 1, "rnn_relu": 1}


def _scaled(work: Work, k: int) -> dict[str, int]:
    return {f: getattr(work, f) * k for f in ("flops", "bytes_read", "bytes_written", "tensor_flops",
                                             "vector_element_passes", "vector_instructions",
                                             "scalar_element_passes", "scalar_instructions")}


def rnn_work(
    mode: str,
    *,
    rows: int,
    steps: int,
    batch: int,
    layer_weights: Sequence[tuple[Sequence[int], Sequence[int], Sequence[int] | None]],
    has_biases: bool,
    itemsize: int,
    dtype: str,
    backward: bool = False,
) -> Work:
    """A whole-sequence RNN (``aten::lstm``/``gru``/``rnn_tanh``/``rnn_relu``), as the
    device runs it: per layer and direction, the input projection as one matmul over
    all ``rows`` (timesteps x batch), then per timestep the recurrent matmul (and the
    LSTM projection), each a TensorE instruction stream of its own, and the cell's
    elementwise passes. Backward: twice the matmuls (input and weight gradients) and
    twice the elementwise passes.

    Args:
        layer_weights: per layer and direction, the shapes of ``w_ih``, ``w_hh`` and
            ``w_hr`` (``None`` without projections).
        rows: input rows (``seq * batch``, or the packed data's rows); ``steps``
            timesteps; ``batch`` the largest batch of a step.
    """
    if mode not in _RNN_GATES:
        raise ValueError(f"rnn_work: mode must be one of {sorted(_RNN_GATES)}, got {mode!r}")
    total: dict[str, int] = dict.fromkeys(_scaled(matmul_work((1, 1), (1, 1), itemsizes=(1, 1, 1),
                                                             dtypes=()), 0), 0)
    sizes = (itemsize, itemsize, itemsize)
    scalar, vector = _RNN_CELL_PASSES[mode]
    repeat = 2 if backward else 1

    def add(work: Work, k: int) -> None:
        for f, v in _scaled(work, k * repeat).items():
            total[f] += v

    for w_ih, w_hh, w_hr in layer_weights:
        gate_size, in_size = check_shape(w_ih, "w_ih")
        _, state_size = check_shape(w_hh, "w_hh")
        bias = (gate_size,) if has_biases else None
        add(matmul_work((rows, in_size), (in_size, gate_size), itemsizes=sizes, dtypes=(dtype,),
                        bias=bias, bias_itemsize=itemsize), 1)
        add(matmul_work((batch, state_size), (state_size, gate_size), itemsizes=sizes,
                        dtypes=(dtype,), bias=bias, bias_itemsize=itemsize), steps)
        if w_hr is not None:
            proj, hidden = check_shape(w_hr, "w_hr")
            add(matmul_work((batch, hidden), (hidden, proj), itemsizes=sizes, dtypes=(dtype,)), steps)
        elements = batch * gate_size
        add(pointwise_work(formula="", bytes_read=2 * elements * itemsize,
                           bytes_written=elements * itemsize, pass_elements=elements,
                           vector_passes=vector, scalar_passes=scalar, vector_dtypes=(dtype,)), steps)
    return Work(formula=f"{mode}{' backward' if backward else ''}: per layer and direction, the input "
                        "projection over all rows, then per step the recurrent matmul and the cell",
                tensor_dtypes=(dtype,), vector_dtypes=(dtype,), **total)  # fmt: skip
