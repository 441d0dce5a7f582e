"""Computation in ``nl``: element-wise math (dtype promotion and broadcasting, the binary
ops on ``tensor_scalar``/``tensor_tensor``, ScalarE activations, VectorE unary ops,
``reciprocal``/``rsqrt``, range-reduced trigonometry, ``trunc``/``floor``/``ceil``, the
operator constants ``prelu``/``bypass``/``average``/``identity`` and ``broadcast_to``);
reductions and normalisations (``sum``/``max``/``min``/``prod``/``all`` on
``tensor_reduce``, ``mean``/``var``, ``softmax``, ``rms_norm``, ``dropout``); and
selection (``expand_dims``, ``where``, ``gather_flattened``). Lowerings: package docstring."""

from __future__ import annotations

import builtins as _b
import math
from typing import Any, Callable, Sequence

import numpy as np

from torchneuron.nki import context
from torchneuron.nki import dtypes as _dtypes
from torchneuron.nki.dtypes import NkiDType
from torchneuron.nki.errors import fail
from torchneuron.nki.language.core import (
    as_int, as_scalar, as_tile, emit, is_scalar, issue_call, mask_shape, masked_view, nisa, region_slices,
    require_on_chip,
)
from torchneuron.nki.language.memory import (
    DTYPES, allocate_tensor, as_fill_value, bfloat16, float32, full, ones, psum, reject_legacy_kwargs, sbuf,
)
from torchneuron.nki.language.movement import copy
from torchneuron.nki.memory import Buffer
from torchneuron.nki.tensor import NkiTensor


# ============================================================ element-wise ops

_FLOAT_RANK = {"float8_e4m3": 1, "float8_e5m2": 1, "float8_e4m3fn": 1, "float8_e8m0fnu": 1,
               "bfloat16": 2, "float16": 2, "tfloat32": 3, "float32": 4}


def _promote(a: NkiDType, b: NkiDType) -> NkiDType:
    """The NKI type-promotion table (decision 1)."""
    if a is b:
        return a
    if a.is_float and b.is_float:
        ra, rb = _FLOAT_RANK[a.name], _FLOAT_RANK[b.name]
        if ra != rb:
            return a if ra > rb else b
        return bfloat16 if ra == 1 else float32
    if a.is_float or b.is_float:
        return a if a.is_float else b
    a_signed, b_signed = a.kind == "int", b.kind == "int"
    if a_signed == b_signed:
        return a if a.itemsize >= b.itemsize else b
    s, u = (a, b) if a_signed else (b, a)
    if s.itemsize > u.itemsize:
        return s
    size = 2 * _b.max(s.itemsize, u.itemsize)
    return float32 if size > 4 else DTYPES[f"int{size * 8}"]


def _result_dtype(dtype: Any, *operands: Any) -> NkiDType:
    if dtype is not None:
        return _dtypes.resolve(dtype)
    tiles = [o.dtype for o in operands if isinstance(o, NkiTensor)]
    result = tiles[0]
    for other in tiles[1:]:
        result = _promote(result, other)
    if result.is_integer and _b.any(is_scalar(o) and isinstance(as_scalar(o), float) for o in operands):
        return float32
    return result


def is_column(t: NkiTensor, partitions: int) -> bool:
    return t.shape[0] == partitions and t.free_size == 1


def column_operand(t: NkiTensor) -> NkiTensor:
    return t if t.shape == (t.shape[0], 1) else t.reshape((t.shape[0], 1))


def _broadcast_shape(op: str, *tiles: NkiTensor) -> tuple[int, ...]:
    parts = {t.shape[0] for t in tiles}
    if len(parts - {1}) > 1:
        fail(op, f"operand partition dims {[t.shape[0] for t in tiles]} differ; element-wise operands "
             "must span the same partitions")
    p = _b.max(parts)
    try:
        free = np.broadcast_shapes(*(tuple(t.shape[1:]) for t in tiles))
    except ValueError:
        fail(op, f"operand shapes {[list(t.shape) for t in tiles]} do not broadcast")
    return (p,) + tuple(free)


def broadcast_view(t: NkiTensor, shape: tuple[int, ...], op: str) -> NkiTensor:
    """``t`` as a view of ``shape``: free dims broadcast by stride-0 views, partitions via broadcast_to."""
    if t.shape == shape:
        return t
    if t.shape[0] != shape[0]:
        t = broadcast_to(t, (shape[0],) + tuple(t.shape[1:]))
    free = tuple(t.shape[1:])
    lead = len(shape) - 1 - len(free)
    if lead:
        t = t.reshape((t.shape[0],) + (1,) * lead + free)
    for dim, (have, want) in enumerate(zip(t.shape, shape)):
        if have != want:
            t = t.broadcast(dim, want)
    return t


def _op(name: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Mark an ``nl`` function as the operator ``name`` (``op=nl.add`` in ISA calls; ops.py)."""

    def mark(fn: Callable[..., Any]) -> Callable[..., Any]:
        fn.nki_op = name  # type: ignore[attr-defined]
        return fn

    return mark


def _published(fn: Callable[..., Any], name: str, doc: str) -> Callable[..., Any]:
    """A generated ``nl`` function under its public name and docstring, marked as operator ``name``."""
    fn.__name__ = fn.__qualname__ = name
    fn.__doc__ = doc
    fn.__module__ = __name__
    return _op(name)(fn)


def _binary(name: str, x: Any, y: Any, dtype: Any, mask: Any, op: Any) -> NkiTensor:
    """``x op y`` element-wise: ``tensor_scalar`` for a scalar / column operand, else ``tensor_tensor``."""
    x_tile, y_tile = isinstance(x, NkiTensor), isinstance(y, NkiTensor)
    x, y = (_one_element_as_2d(x) if x_tile else x), (_one_element_as_2d(y) if y_tile else y)
    for v, what in ((x, "x"), (y, "y")):
        if not isinstance(v, NkiTensor) and not is_scalar(v):
            as_tile(v, name, what)
    if not x_tile and not y_tile:
        raise TypeError(f"nl.{name}: at least one operand must be a tile, got {x!r} and {y!r}")
    out_dtype = _result_dtype(dtype, x, y)
    if x_tile and y_tile:
        require_on_chip(x, name, "x")
        require_on_chip(y, name, "y")
        if y.shape != x.shape and is_column(y, x.shape[0]) and x.free_size > 1:
            data, operand, reverse = x, column_operand(y), False
        elif x.shape != y.shape and is_column(x, y.shape[0]) and y.free_size > 1:
            data, operand, reverse = y, column_operand(x), True
        else:
            shape = _broadcast_shape(name, x, y)
            a, b = broadcast_view(x, shape, name), broadcast_view(y, shape, name)
            valid = mask_shape(mask, shape, name)
            a, b = masked_view(a, valid), masked_view(b, valid)
            out = as_tile(allocate_tensor(shape, out_dtype, sbuf, "", name), name)
            return emit(out, lambda dst: nisa().tensor_tensor(dst=masked_view(dst, valid), data1=a, data2=b, op=op))
    else:
        data, operand, reverse = (x, as_scalar(y), False) if x_tile else (y, as_scalar(x), True)
        require_on_chip(data, name)
    valid = mask_shape(mask, data.shape, name)
    data_part = masked_view(data, valid)
    if isinstance(operand, NkiTensor):
        operand = masked_view(operand, (valid[0], 1))
    out = as_tile(allocate_tensor(data.shape, out_dtype, sbuf, "", name), name)
    return emit(out, lambda dst: nisa().tensor_scalar(dst=masked_view(dst, valid), data=data_part, op0=op,
                                                        operand0=operand, reverse0=reverse))


def _one_element_as_2d(t: NkiTensor) -> NkiTensor:
    """A 0-d tile (``nl.load(x[b, h])``) as a ``[1, 1]`` view: element-wise ops give a ``[1, 1]``
    result and, with a tile of more partitions, broadcast it to every partition like a ``[1, 1]``
    tile (AWS's legacy flash_attn_bwd adds one to a ``[128, 1]`` tile)."""
    return t.reshape((1, 1)) if t.ndim == 0 else t


def _define_binary(name: str, doc: str) -> Callable[..., NkiTensor]:
    def fn(x: Any, y: Any, dtype: Any = None, *, mask: Any = None) -> NkiTensor:
        return _binary(name, x, y, dtype, mask, fn)

    return _published(fn, name, f"{doc} element-wise; ``x``/``y`` are tiles or scalars (lowering: module docstring).")


add = _define_binary("add", "``x + y``")
subtract = _define_binary("subtract", "``x - y``")
multiply = _define_binary("multiply", "``x * y``")
divide = _define_binary("divide", "``x / y``")
maximum = _define_binary("maximum", "``max(x, y)``")
minimum = _define_binary("minimum", "``min(x, y)``")
power = _define_binary("power", "``x ** y``")
fmod = _define_binary("fmod", "Remainder of ``x / y`` with the sign of ``x``")
mod = _define_binary("mod", "Remainder of ``x / y`` with the sign of ``y``")
abs_max = _define_binary("abs_max", "The operand of larger magnitude (ties: ``y``; trn3 only)")
abs_min = _define_binary("abs_min", "The operand of smaller magnitude (ties: ``y``; trn3 only)")
equal = _define_binary("equal", "1 where ``x == y`` else 0")
not_equal = _define_binary("not_equal", "1 where ``x != y`` else 0")
less = _define_binary("less", "1 where ``x < y`` else 0")
less_equal = _define_binary("less_equal", "1 where ``x <= y`` else 0")
greater = _define_binary("greater", "1 where ``x > y`` else 0")
greater_equal = _define_binary("greater_equal", "1 where ``x >= y`` else 0")
logical_and = _define_binary("logical_and", "``x AND y`` (inputs 0/1)")
logical_or = _define_binary("logical_or", "``x OR y`` (inputs 0/1)")
logical_xor = _define_binary("logical_xor", "``x XOR y`` (inputs 0/1)")
bitwise_and = _define_binary("bitwise_and", "``x & y`` (integers)")
bitwise_or = _define_binary("bitwise_or", "``x | y`` (integers)")
bitwise_xor = _define_binary("bitwise_xor", "``x ^ y`` (integers)")
left_shift = _define_binary("left_shift", "``x << y`` (integers)")
right_shift = _define_binary("right_shift", "``x >> y`` (logical shift; integers)")


def _unary_out(name: str, x: Any, dtype: Any, mask: Any) -> tuple[NkiTensor, NkiTensor, tuple[int, ...]]:
    x = _one_element_as_2d(require_on_chip(as_tile(x, name), name))
    out = as_tile(allocate_tensor(x.shape, _result_dtype(dtype, x), sbuf, "", name), name)
    valid = mask_shape(mask, x.shape, name)
    return x, out, valid


def _define_activation(name: str, doc: str) -> Callable[..., NkiTensor]:
    def fn(x: Any, dtype: Any = None, *, mask: Any = None) -> NkiTensor:
        x, out, valid = _unary_out(name, x, dtype, mask)
        data = masked_view(x, valid)
        return emit(out, lambda dst: nisa().activation(dst=masked_view(dst, valid), op=fn, data=data))

    return _published(fn, name, f"{doc} element-wise (ScalarE ``activation``).")


exp = _define_activation("exp", "``e ** x``")
log = _define_activation("log", "Natural logarithm")
sqrt = _define_activation("sqrt", "Square root")
tanh = _define_activation("tanh", "Hyperbolic tangent")
sigmoid = _define_activation("sigmoid", "Logistic sigmoid")
relu = _define_activation("relu", "``max(x, 0)``")
gelu = _define_activation("gelu", "GELU")
gelu_dx = _define_activation("gelu_dx", "Derivative of GELU")
gelu_apprx_tanh = _define_activation("gelu_apprx_tanh", "GELU (tanh approximation)")
gelu_apprx_sigmoid = _define_activation("gelu_apprx_sigmoid", "GELU (sigmoid approximation)")
gelu_apprx_sigmoid_dx = _define_activation("gelu_apprx_sigmoid_dx", "Derivative of sigmoid-approximated GELU")
silu = _define_activation("silu", "SiLU (``x * sigmoid(x)``)")
silu_dx = _define_activation("silu_dx", "Derivative of SiLU")
softplus = _define_activation("softplus", "``log(1 + e ** x)``")
mish = _define_activation("mish", "Mish")
erf = _define_activation("erf", "Error function")
erf_dx = _define_activation("erf_dx", "Derivative of the error function")
sign = _define_activation("sign", "-1, 0 or 1 by sign")
arctan = _define_activation("arctan", "Inverse tangent (valid on [-pi/2, pi/2])")


def _define_vector_unary(name: str, doc: str, op0: Any = None, operand0: Any = None) -> Callable[..., NkiTensor]:
    """A unary VectorE op: ``tensor_scalar(op0=<this function>)``, or ``op0``/``operand0`` when given."""

    def fn(x: Any, dtype: Any = None, *, mask: Any = None) -> NkiTensor:
        x, out, valid = _unary_out(name, x, dtype, mask)
        data = masked_view(x, valid)
        op = fn if op0 is None else op0
        return emit(out, lambda dst: nisa().tensor_scalar(dst=masked_view(dst, valid), data=data, op0=op,
                                                            operand0=operand0))

    return _published(fn, name, f"{doc} element-wise (VectorE ``tensor_scalar``).")


abs = _define_vector_unary("abs", "``|x|``")
square = _define_vector_unary("square", "``x * x``")
negative = _define_vector_unary("negative", "``-x``", multiply, -1)
invert = _define_vector_unary("invert", "Bitwise NOT (integers)")
logical_not = _define_vector_unary("logical_not", "``NOT x`` as XOR with 1 (inputs 0/1)", logical_xor, 1)


@_op("reciprocal")
def reciprocal(x: Any, dtype: Any = None, *, mask: Any = None) -> NkiTensor:
    """``1 / x`` element-wise (VectorE ``reciprocal``, the precise one)."""
    x, out, valid = _unary_out("reciprocal", x, dtype, mask)
    data = masked_view(x, valid)
    return emit(out, lambda dst: nisa().reciprocal(dst=masked_view(dst, valid), data=data))


@_op("rsqrt")
def rsqrt(x: Any, dtype: Any = None, *, mask: Any = None) -> NkiTensor:
    """``1 / sqrt(x)`` element-wise on GpSimd (``tensor_scalar(op0=rsqrt)``); PSUM input is rejected (0.5.0)."""
    x = as_tile(x, "rsqrt")
    if x.buffer is Buffer.psum:
        fail("rsqrt", f"nl.rsqrt runs on GpSimd, which cannot read PSUM, and {x.name!r} is in psum; "
             "copy it to SBUF first (nl.copy)")
    x, out, valid = _unary_out("rsqrt", x, dtype, mask)
    data = masked_view(x, valid)
    return emit(out, lambda dst: nisa().tensor_scalar(dst=masked_view(dst, valid), data=data, op0=rsqrt,
                                                        operand0=None, engine=nisa().engine.gpsimd))


def _fp32_like(x: NkiTensor, op: str) -> NkiTensor:
    return as_tile(allocate_tensor(x.shape, float32, sbuf, "", op), op)


_TWO_PI = 2.0 * math.pi


def _sin_of_shifted(x: NkiTensor, shift: float, out: NkiTensor, op: str, valid: tuple[int, ...]) -> NkiTensor:
    """``sin(x + shift)`` accurate for any x: t = (x + shift) mod 2pi, then sin(pi - t) on ScalarE."""
    data = masked_view(x, valid)
    t = _fp32_like(x, op)
    nisa().tensor_scalar(dst=masked_view(t, valid), data=data, op0=add, operand0=shift, op1=mod, operand1=_TWO_PI)
    pi = as_tile(allocate_tensor((x.shape[0], 1), float32, sbuf, "", op), op)
    issue_call(lambda: nisa().memset(dst=pi, value=math.pi), tag={"value": math.pi})
    src = masked_view(t, valid)
    bias = pi[0:valid[0], :]
    return emit(out, lambda dst: nisa().activation(dst=masked_view(dst, valid), op=sin, data=src, bias=bias,
                                                    scale=-1.0))


@_op("sin")
def sin(x: Any, dtype: Any = None, *, mask: Any = None) -> NkiTensor:
    """``sin(x)``, range-reduced to [-pi, pi] before the ScalarE activation (accurate everywhere)."""
    x, out, valid = _unary_out("sin", x, dtype, mask)
    return _sin_of_shifted(x, 0.0, out, "sin", valid)


@_op("cos")
def cos(x: Any, dtype: Any = None, *, mask: Any = None) -> NkiTensor:
    """``cos(x) = sin(x + pi/2)``, range-reduced like :func:`sin`."""
    x, out, valid = _unary_out("cos", x, dtype, mask)
    return _sin_of_shifted(x, math.pi / 2, out, "cos", valid)


def tan(x: Any, dtype: Any = None, *, mask: Any = None) -> NkiTensor:
    """``tan(x) = sin(x) / cos(x)`` (fp32 intermediates)."""
    x = require_on_chip(as_tile(x, "tan"), "tan")
    s = sin(x, float32, mask=mask)
    c = cos(x, float32, mask=mask)
    return divide(s, c, _result_dtype(dtype, x), mask=mask)


def _integral(name: str, x: Any, dtype: Any, mask: Any, adjust: Any) -> NkiTensor:
    """trunc / floor / ceil from ``x - fmod(x, 1)`` (exact in fp32), corrected by a comparison."""
    x, out, valid = _unary_out(name, x, dtype, mask)
    data = masked_view(x, valid)
    frac = _fp32_like(x, name)
    nisa().tensor_scalar(dst=masked_view(frac, valid), data=data, op0=fmod, operand0=1.0)
    whole = out if adjust is None else _fp32_like(x, name)
    frac_v = masked_view(frac, valid)
    if adjust is None:
        return emit(out, lambda dst: nisa().tensor_tensor(dst=masked_view(dst, valid), data1=data, data2=frac_v,
                                                           op=subtract))
    nisa().tensor_tensor(dst=masked_view(whole, valid), data1=data, data2=frac_v, op=subtract)
    whole_v = masked_view(whole, valid)
    step = _fp32_like(x, name)
    compare, combine = adjust
    nisa().tensor_tensor(dst=masked_view(step, valid), data1=data, data2=whole_v, op=compare)
    step_v = masked_view(step, valid)
    return emit(out, lambda dst: nisa().tensor_tensor(dst=masked_view(dst, valid), data1=whole_v, data2=step_v,
                                                       op=combine))


def trunc(x: Any, dtype: Any = None, *, mask: Any = None) -> NkiTensor:
    """Round toward zero element-wise."""
    return _integral("trunc", x, dtype, mask, None)


def floor(x: Any, dtype: Any = None, *, mask: Any = None) -> NkiTensor:
    """Round down element-wise."""
    return _integral("floor", x, dtype, mask, (less, subtract))


def ceil(x: Any, dtype: Any = None, *, mask: Any = None) -> NkiTensor:
    """Round up element-wise."""
    return _integral("ceil", x, dtype, mask, (greater, add))


copy.nki_op = "copy"  # type: ignore[attr-defined]


class _Operator:
    """An operator constant that is not a function (``nl.prelu``, ``nl.bypass``, ``nl.average``)."""

    def __init__(self, name: str, doc: str) -> None:
        self.nki_op = name
        self.__doc__ = doc

    def __repr__(self) -> str:
        return f"nl.{self.nki_op}"


prelu = _Operator("prelu", "Parametric ReLU activation (slope from ``relu_param``).")
bypass = _Operator("bypass", "No-op stage for ``op0``/``op1``.")
average = _Operator("average", "Mean, for ``tensor_partition_reduce``.")
identity = _Operator("copy", "Identity activation (alias of ``nl.copy`` as an operator).")


# ================================================ broadcasting
def _legacy_integer_partition_broadcast(x: NkiTensor, out: NkiTensor) -> NkiTensor:
    """A legacy kernel's integer tile broadcast across partitions, bit-exact: one SBUF -> SBUF DMA
    whose source repeats partition 0 (a stride-0 descriptor), noted once per kernel line.

    TensorE (the float path) would round integers above 2^24; the legacy compiler legalised
    the broadcast itself (issue 17). Which instruction it used is not published: the DMA
    is torchneuron's choice (decision recorded in ``torchneuron/nki/isa/legalise.py``).
    """
    from torchneuron.nki.isa.legalise import note_legacy_legalisation

    src = x if x.buffer is Buffer.sbuf else copy(x)
    repeated = src._view(np.broadcast_to(src._data, out._data.shape), np.broadcast_to(src._mask, out._data.shape))
    nisa().dma_copy(dst=out, src=repeated)
    note_legacy_legalisation("broadcast_to", f"partition broadcast of {x.dtype.name} tile {x.name!r}: TensorE takes "
                             "float inputs; legacy NKI's compiler legalised it, so torchneuron issued a bit-exact "
                             "SBUF -> SBUF DMA that repeats partition 0. Current NKI refuses this")
    return out


def broadcast_to(x: Any, shape: Any, dtype: Any = None, **legacy: Any) -> NkiTensor:
    """``x`` broadcast to ``shape`` (same rank; each dim equal or from 1) as a new SBUF tile.

    Returns ``x`` itself when the shape already matches (and no dtype change).
    Free dims are copied from a stride-0 view (``tensor_copy``); a partition
    broadcast ``1 -> P`` is a TensorE matmul of a ones row against ``x``
    (in 512-column pieces) copied out of PSUM.
    """
    reject_legacy_kwargs("broadcast_to", legacy)
    x = require_on_chip(as_tile(x, "broadcast_to"), "broadcast_to")
    shape = tuple(as_int(s, "broadcast_to") for s in shape)
    dt = _dtypes.resolve(dtype) if dtype is not None else x.dtype
    if len(shape) != x.ndim:
        fail("broadcast_to", f"shape {list(shape)} must have the rank of x {list(x.shape)}")
    for have, want in zip(x.shape, shape):
        if have != want and have != 1:
            fail("broadcast_to", f"cannot broadcast {list(x.shape)} to {list(shape)}: a dim must match or be 1")
    if shape == x.shape and dt == x.dtype:
        return x
    if shape[0] != x.shape[0] and shape[1:] != x.shape[1:] and x.free_size != 1:
        return broadcast_to(broadcast_to(x, (shape[0],) + x.shape[1:]), shape, dt)  # partitions, then free
    out = as_tile(allocate_tensor(shape, dt, sbuf, "", "broadcast_to"), "broadcast_to")
    if shape[0] == x.shape[0]:
        src = broadcast_view(x, shape, "broadcast_to")
        return emit(out, lambda dst: nisa().tensor_copy(dst=dst, src=src), "copy")
    if not x.dtype.is_float:
        if not context.current().legacy:
            fail("broadcast_to", f"partition broadcast (1 -> {shape[0]}) runs on TensorE, which takes float "
                 f"inputs; {x.name!r} is {x.dtype.name}")
        return _legacy_integer_partition_broadcast(x, out)
    row = x if x.buffer is Buffer.sbuf else copy(x)
    row = row.reshape((1, row.free_size))
    ones_dt = float32 if row.dtype.name in ("float32", "tfloat32") else bfloat16
    lhs = ones((1, shape[0]), ones_dt, name="broadcast_to.ones")
    flat_out = out.reshape((shape[0], math.prod(shape[1:])))
    width, free = flat_out.shape[1], x.free_size
    isa = nisa()
    if free == 1:  # one value per partition after the matmul; the copy broadcasts it along the row
        part = as_tile(allocate_tensor((shape[0], 1), float32, psum, "", "broadcast_to"), "broadcast_to")
        isa.nc_matmul(dst=part, stationary=lhs, moving=row, accumulate=False)
        isa.tensor_copy(dst=flat_out, src=part.broadcast(1, width) if width > 1 else part)
        return out
    for start in range(0, width, 512):
        cols = _b.min(512, width - start)
        part = as_tile(allocate_tensor((shape[0], cols), float32, psum, "", "broadcast_to"), "broadcast_to")
        isa.nc_matmul(dst=part, stationary=lhs, moving=row[:, start:start + cols], accumulate=False)
        isa.tensor_copy(dst=flat_out[:, start:start + cols], src=part)
    return out


# ================================================================= reductions


def _axes(x: NkiTensor, axis: Any, op: str) -> tuple[int, ...]:
    """Validate reduction axes: free dims only, trailing and contiguous (nki-api-facts.md: 3.5)."""
    raw = list(axis) if isinstance(axis, (tuple, list)) else [axis]
    if not raw:
        fail(op, "axis must name at least one free dimension")
    axes = []
    for a in raw:
        a = as_int(a, op)
        if a < 0:
            a += x.ndim
        axes.append(a)
    axes = sorted(set(axes))
    if axes[0] <= 0 or axes[-1] >= x.ndim:
        fail(op, f"axis {list(raw)} must be free dims of the {x.ndim}-D tile {list(x.shape)} (1..{x.ndim - 1}); "
             "the partition dim 0 cannot be reduced - transpose first or use nisa.tensor_partition_reduce")
    return tuple(axes)


def _trailing(x: NkiTensor, axes: tuple[int, ...]) -> tuple[int, ...] | None:
    """The free-dim order that puts non-trailing reduction ``axes`` last (None: already trailing).

    ``tensor_reduce`` reduces the trailing free dims; reducing others (AWS's average-pool
    tutorial sums ``axis=[2, 4]``) is the same instruction over a permuted free-dim
    access pattern, which is what the compiler emits (decision 13).
    """
    if list(axes) == list(range(axes[0], x.ndim)):
        return None
    return (0,) + tuple(d for d in range(1, x.ndim) if d not in axes) + tuple(axes)


def _reduced_shape(shape: Sequence[int], axes: tuple[int, ...], keepdims: bool) -> tuple[int, ...]:
    if keepdims:
        return tuple(1 if d in axes else n for d, n in enumerate(shape))
    return tuple(n for d, n in enumerate(shape) if d not in axes)


def _reduce(name: str, op: Any, x: Any, axis: Any, dtype: Any, keepdims: bool, mask: Any = None,
            negate: bool = False) -> NkiTensor:
    x = require_on_chip(as_tile(x, name), name)
    axes = _axes(x, axis, name)
    valid = mask_shape(mask, x.shape, name)
    data = masked_view(x, valid)
    result_shape = _reduced_shape(x.shape, axes, keepdims)
    out = as_tile(allocate_tensor(result_shape, _result_dtype(dtype, x), sbuf, "", name), name)
    out_valid = _reduced_shape(valid, axes, keepdims)
    if 0 in valid:  # the mask keeps nothing (a legacy kernel's all-padding last tile): no instruction
        return out
    order = _trailing(x, axes)
    if order is not None:
        if tuple(valid[1:]) != tuple(x.shape[1:]):  # a partition-only mask (i_p < n) is a slice of dim 0
            fail(name, f"a legacy mask= on free dims with non-trailing reduction axes {list(axes)} is not "
                 "simulated; reduce the trailing free dims, or slice the tile instead of masking it")
        data = data.permute(order)
        axes = tuple(range(x.ndim - len(axes), x.ndim))
        permuted = _reduced_shape(data.shape, axes, keepdims)
        return emit(out, lambda dst: nisa().tensor_reduce(dst=masked_view(dst, out_valid).reshape(permuted), op=op,
                                                           data=data, axis=axes, negate=negate, keepdims=keepdims))
    return emit(out, lambda dst: nisa().tensor_reduce(dst=masked_view(dst, out_valid), op=op, data=data, axis=axes,
                                                       negate=negate, keepdims=keepdims))


def _into_full(result: NkiTensor, shape: tuple[int, ...], valid: tuple[int, ...], op: str) -> NkiTensor:
    """A legacy-masked composite result (computed on the valid region) placed in a full-shape tile."""
    if tuple(valid) == tuple(shape):
        return result
    out = as_tile(allocate_tensor(shape, result.dtype, sbuf, "", op), op)
    nisa().tensor_copy(dst=out[region_slices(result.shape)], src=result)
    return out


@_op("add")
def sum(x: Any, axis: Any, dtype: Any = None, keepdims: bool = False, *, mask: Any = None) -> NkiTensor:
    """Sum over the trailing free ``axis`` (``tensor_reduce(add)``)."""
    return _reduce("sum", add, x, axis, dtype, keepdims, mask)


@_op("maximum")
def max(x: Any, axis: Any, dtype: Any = None, keepdims: bool = False, *, mask: Any = None) -> NkiTensor:
    """Maximum over the trailing free ``axis``."""
    return _reduce("max", maximum, x, axis, dtype, keepdims, mask)


@_op("minimum")
def min(x: Any, axis: Any, dtype: Any = None, keepdims: bool = False, *, mask: Any = None) -> NkiTensor:
    """Minimum over the trailing free ``axis``."""
    return _reduce("min", minimum, x, axis, dtype, keepdims, mask)


@_op("multiply")
def prod(x: Any, axis: Any, dtype: Any = None, keepdims: bool = False, *, mask: Any = None) -> NkiTensor:
    """Product over the trailing free ``axis``."""
    return _reduce("prod", multiply, x, axis, dtype, keepdims, mask)


def all(x: Any, axis: Any, dtype: Any = None, *, mask: Any = None) -> NkiTensor:
    """1 where every element along ``axis`` is non-zero (``tensor_reduce(logical_and)``)."""
    return _reduce("all", logical_and, x, axis, dtype, False, mask)


def mean(x: Any, axis: Any, dtype: Any = None, keepdims: bool = False, *, mask: Any = None) -> NkiTensor:
    """Mean over the trailing free ``axis``, accumulated in fp32 (sum, then a scale)."""
    x = require_on_chip(as_tile(x, "mean"), "mean")
    axes = _axes(x, axis, "mean")
    valid = mask_shape(mask, x.shape, "mean")
    data = masked_view(x, valid)
    total = _reduce("mean", add, data, axes, float32, keepdims)
    n = math.prod(data.shape[d] for d in axes)
    out = as_tile(allocate_tensor(_reduced_shape(x.shape, axes, keepdims), _result_dtype(dtype, x), sbuf, "", "mean"),
                  "mean")
    out_valid = _reduced_shape(valid, axes, keepdims)
    return emit(out, lambda dst: nisa().tensor_scalar(dst=masked_view(dst, out_valid), data=total, op0=multiply,
                                                       operand0=1.0 / n))


def var(x: Any, axis: Any, dtype: Any = None, keepdims: bool = False, *, mask: Any = None) -> NkiTensor:
    """Population variance over ``axis`` in fp32; the result always has the keepdims shape (as documented)."""
    x = require_on_chip(as_tile(x, "var"), "var")
    axes = _axes(x, axis, "var")
    valid = mask_shape(mask, x.shape, "var")
    data = masked_view(x, valid)
    n = math.prod(data.shape[d] for d in axes)
    mu = mean(data, axes, float32, keepdims=True)
    centered = subtract(data, mu, float32)
    squares = multiply(centered, centered, float32)
    total = _reduce("var", add, squares, axes, float32, True)
    out = as_tile(allocate_tensor(_reduced_shape(x.shape, axes, True), _result_dtype(dtype, x), sbuf, "", "var"), "var")
    out_valid = _reduced_shape(valid, axes, True)
    return emit(out, lambda dst: nisa().tensor_scalar(dst=masked_view(dst, out_valid), data=total, op0=multiply,
                                                       operand0=1.0 / n))


# ======================================================== activations and norms


def _covers_all_free(x: NkiTensor, axes: tuple[int, ...]) -> bool:
    return axes == tuple(range(1, x.ndim))


def softmax(x: Any, axis: Any = -1, dtype: Any = None, compute_dtype: Any = None, *,
            mask: Any = None) -> NkiTensor:
    """``exp(x - max) / sum(exp(x - max))`` over the free ``axis`` (fp32 intermediates)."""
    x = require_on_chip(as_tile(x, "softmax"), "softmax")
    valid = mask_shape(mask, x.shape, "softmax")
    if valid != x.shape:
        return _into_full(softmax(masked_view(x, valid), axis, dtype, compute_dtype), x.shape, valid, "softmax")
    axes = _axes(x, axis, "softmax")
    cdt = _dtypes.resolve(compute_dtype) if compute_dtype is not None else float32
    out_dtype = _result_dtype(dtype, x)
    isa = nisa()
    if _covers_all_free(x, axes):
        p = x.shape[0]
        neg_max = as_tile(allocate_tensor(_reduced_shape(x.shape, axes, True), float32, sbuf, "", "softmax"), "softmax")
        isa.tensor_reduce(dst=neg_max, op=maximum, data=x, axis=axes, negate=True, keepdims=True)
        e = as_tile(allocate_tensor(x.shape, cdt, sbuf, "", "softmax"), "softmax")
        total = as_tile(allocate_tensor((p, 1), float32, sbuf, "", "softmax"), "softmax")
        isa.activation(dst=e, op=exp, data=x, bias=column_operand(neg_max), scale=1.0, reduce_op=add,
                       reduce_res=total, reduce_cmd=isa.reduce_cmd.reset_reduce)
        inv = as_tile(allocate_tensor((p, 1), float32, sbuf, "", "softmax"), "softmax")
        isa.reciprocal(dst=inv, data=total)
        out = as_tile(allocate_tensor(x.shape, out_dtype, sbuf, "", "softmax"), "softmax")
        return emit(out, lambda dst: isa.tensor_scalar(dst=dst, data=e, op0=multiply, operand0=inv))
    top = max(x, axes, float32, keepdims=True)
    e = exp(subtract(x, top, cdt), cdt)
    total = sum(e, axes, float32, keepdims=True)
    return multiply(e, reciprocal(total, float32), out_dtype)


def rms_norm(x: Any, w: Any, axis: Any, n: Any, epsilon: float = 1e-06, dtype: Any = None,
             compute_dtype: Any = None, *, mask: Any = None) -> NkiTensor:
    """``x / sqrt(sum(x**2, axis) / n + epsilon) * w`` (fp32 intermediates unless ``compute_dtype``)."""
    x = require_on_chip(as_tile(x, "rms_norm"), "rms_norm")
    valid = mask_shape(mask, x.shape, "rms_norm")
    if valid != x.shape:
        w_part = masked_view(w, valid) if isinstance(w, NkiTensor) and w.shape == x.shape else w
        return _into_full(rms_norm(masked_view(x, valid), w_part, axis, n, epsilon, dtype, compute_dtype),
                          x.shape, valid, "rms_norm")
    axes = _axes(x, axis, "rms_norm")
    cdt = _dtypes.resolve(compute_dtype) if compute_dtype is not None else float32
    isa = nisa()
    if _covers_all_free(x, axes):
        squares = as_tile(allocate_tensor(x.shape, cdt, sbuf, "", "rms_norm"), "rms_norm")
        total = as_tile(allocate_tensor((x.shape[0], 1), float32, sbuf, "", "rms_norm"), "rms_norm")
        isa.activation(dst=squares, op=square, data=x, reduce_op=add, reduce_res=total,
                       reduce_cmd=isa.reduce_cmd.reset_reduce)
        del squares
    else:
        total = sum(square(x, cdt), axes, float32, keepdims=True)
    ms = as_tile(allocate_tensor(total.shape, float32, sbuf, "", "rms_norm"), "rms_norm")
    isa.tensor_scalar(dst=ms, data=total, op0=multiply, operand0=1.0 / float(n), op1=add,
                      operand1=float(epsilon))
    scale = rsqrt(ms, float32)
    normed = multiply(x, scale, cdt)
    return multiply(normed, w, _result_dtype(dtype, x))


def dropout(x: Any, rate: Any, dtype: Any = None, *, mask: Any = None) -> NkiTensor:
    """Zero elements with probability ``rate`` (a scalar or ``(P, 1)`` tile) (VectorE ``dropout``)."""
    x, out, valid = _unary_out("dropout", x, dtype, mask)
    data = masked_view(x, valid)
    prob = column_operand(masked_view(rate, (valid[0], 1))) if isinstance(rate, NkiTensor) else as_scalar(rate)
    return emit(out, lambda dst: nisa().dropout(dst=masked_view(dst, valid), data=data, prob=prob))


# ================================================ manipulation and selection


def expand_dims(x: Any, axis: Any) -> NkiTensor:
    """A view of ``x`` with new size-1 dims at ``axis`` (an int or a sequence of ints)."""
    x = as_tile(x, "expand_dims")
    axes = sorted(axis) if isinstance(axis, (tuple, list)) else [axis]
    for a in axes:
        a = as_int(a, "expand_dims")
        x = x.expand_dim(a if a >= 0 else a + x.ndim + 1)
    return x


def where(condition: Any, x: Any, y: Any, dtype: Any = None, *, mask: Any = None) -> NkiTensor:
    """``x`` where ``condition`` (a 1.0 / 0.0 tile) is non-zero, else ``y``.

    Lowered to ``out = y`` (``tensor_copy``, or ``memset`` for a scalar) then
    ``tensor_copy_predicated(out, x, predicate=condition)``; a float condition is
    read as its bit pattern (``.view`` as an unsigned type: 0.0 is false).
    """
    cond = require_on_chip(as_tile(condition, "where", "condition"), "where", "condition")
    tiles = [t for t in (cond, x, y) if isinstance(t, NkiTensor)]
    shape = _broadcast_shape("where", *tiles)
    valid = mask_shape(mask, shape, "where")
    values = [v for v in (x, y) if isinstance(v, NkiTensor)]
    out_dtype = _result_dtype(dtype, *values, *[v for v in (x, y) if is_scalar(v)]) if values else \
        _result_dtype(dtype, cond, *(v for v in (x, y) if is_scalar(v)))
    out = as_tile(allocate_tensor(shape, out_dtype, sbuf, "", "where"), "where")
    region = masked_view(out, valid)
    if isinstance(y, NkiTensor):
        y_full = broadcast_view(require_on_chip(y, "where", "y"), shape, "where")
        nisa().tensor_copy(dst=region, src=masked_view(y_full, valid))
    else:
        issue_call(lambda: nisa().memset(dst=region, value=as_fill_value(y, out_dtype, "where")))
    if isinstance(x, NkiTensor):
        src = broadcast_view(require_on_chip(x, "where", "x"), shape, "where")
        if src.dtype != out_dtype:
            src = copy(src, out_dtype)
    else:
        src = full(shape, x, out_dtype, name="where.x")
    src = masked_view(src, valid)
    pred = masked_view(broadcast_view(cond, shape, "where"), valid)
    if pred.dtype.name not in ("uint8", "uint16", "uint32"):
        pred = pred.view(DTYPES[f"uint{pred.dtype.itemsize * 8}"])
    nisa().tensor_copy_predicated(dst=region, src=src, predicate=pred)
    return out


def gather_flattened(data: Any, indices: Any, axis: int = 0, dtype: Any = None, *, mask: Any = None,
                     **legacy: Any) -> NkiTensor:
    """Per partition, gather ``data``'s flattened free elements at uint32 ``indices`` (``nc_n_gather``)."""
    reject_legacy_kwargs("gather_flattened", legacy)
    if mask is not None and mask is not True:
        raise TypeError("nl.gather_flattened: a legacy mask= is not simulated (it would be ignored); slice data "
                        "and indices to the valid region instead")
    data = require_on_chip(as_tile(data, "gather_flattened", "data"), "gather_flattened", "data")
    indices = require_on_chip(as_tile(indices, "gather_flattened", "indices"), "gather_flattened", "indices")
    if axis not in (0, -1, 1):
        fail("gather_flattened", f"axis={axis}: the gather runs within each partition over the flattened "
             "free dims")
    out = as_tile(allocate_tensor(indices.shape, data.dtype, sbuf, "", "gather_flattened"), "gather_flattened")
    emit(out, lambda dst: nisa().nc_n_gather(dst=dst, data=data, indices=indices))
    dt = _dtypes.resolve(dtype) if dtype is not None else data.dtype
    return out if dt == data.dtype else copy(out, dt)
