"""Element-wise math and activations in ``nl``: dtype promotion and broadcasting, the
binary ops (``tensor_scalar``/``tensor_tensor``), ScalarE activations, VectorE unary
ops, ``reciprocal``/``rsqrt``, range-reduced trigonometry, ``trunc``/``floor``/``ceil``
the non-function operator constants (``prelu``, ``bypass``, ``average``, ``identity``) and
``broadcast_to`` (a partition broadcast is a TensorE matmul against a ones row), which the
binary ops use to broadcast their operands."""

from __future__ import annotations

import builtins as _b
import math
from typing import Any, Callable

import numpy as np

from torchneuron.nki import context
from torchneuron.nki import dtypes as _dtypes
from torchneuron.nki.dtypes import NkiDType
from torchneuron.nki.errors import fail
from torchneuron.nki.memory import Buffer
from torchneuron.nki.tensor import NkiTensor
from torchneuron.nki.language._movement_ops import copy
from torchneuron.nki.language._dtype_buffer_ops import _D, bfloat16, float32, psum, sbuf
from torchneuron.nki.language._base_ops import _int, _is_scalar, _isa, _on_chip, _scalar, _tile
from torchneuron.nki.language._creation_ops import _allocate, _reject_legacy_kwargs, ones
from torchneuron.nki.language._issue_ops import _emit, _issue
from torchneuron.nki.language._movement_ops import _mask_shape, _masked


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
    return float32 if size > 4 else _D[f"int{size * 8}"]


def _result_dtype(dtype: Any, *operands: Any) -> NkiDType:
    if dtype is not None:
        return _dtypes.resolve(dtype)
    tiles = [o.dtype for o in operands if isinstance(o, NkiTensor)]
    result = tiles[0]
    for other in tiles[1:]:
        result = _promote(result, other)
    if result.is_integer and _b.any(_is_scalar(o) and isinstance(_scalar(o), float) for o in operands):
        return float32
    return result


def _is_column(t: NkiTensor, partitions: int) -> bool:
    return t.shape[0] == partitions and t.free_size == 1


def _column(t: NkiTensor) -> NkiTensor:
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


def _expand(t: NkiTensor, shape: tuple[int, ...], op: str) -> NkiTensor:
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
    for v, what in ((x, "x"), (y, "y")):
        if not isinstance(v, NkiTensor) and not _is_scalar(v):
            _tile(v, name, what)
    if not x_tile and not y_tile:
        raise TypeError(f"nl.{name}: at least one operand must be a tile, got {x!r} and {y!r}")
    out_dtype = _result_dtype(dtype, x, y)
    if x_tile and y_tile:
        _on_chip(x, name, "x")
        _on_chip(y, name, "y")
        if y.shape != x.shape and _is_column(y, x.shape[0]) and x.free_size > 1:
            data, operand, reverse = x, _column(y), False
        elif x.shape != y.shape and _is_column(x, y.shape[0]) and y.free_size > 1:
            data, operand, reverse = y, _column(x), True
        else:
            shape = _broadcast_shape(name, x, y)
            a, b = _expand(x, shape, name), _expand(y, shape, name)
            valid = _mask_shape(mask, shape, name)
            a, b = _masked(a, valid), _masked(b, valid)
            out = _tile(_allocate(shape, out_dtype, sbuf, "", name), name)
            return _emit(out, lambda dst: _isa().tensor_tensor(dst=_masked(dst, valid), data1=a, data2=b, op=op))
    else:
        data, operand, reverse = (x, _scalar(y), False) if x_tile else (y, _scalar(x), True)
        _on_chip(data, name)
    valid = _mask_shape(mask, data.shape, name)
    data_part = _masked(data, valid)
    if isinstance(operand, NkiTensor):
        operand = _masked(operand, (valid[0], 1))
    out = _tile(_allocate(data.shape, out_dtype, sbuf, "", name), name)
    return _emit(out, lambda dst: _isa().tensor_scalar(dst=_masked(dst, valid), data=data_part, op0=op,
                                                        operand0=operand, reverse0=reverse))


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
    x = _on_chip(_tile(x, name), name)
    out = _tile(_allocate(x.shape, _result_dtype(dtype, x), sbuf, "", name), name)
    valid = _mask_shape(mask, x.shape, name)
    return x, out, valid


def _define_activation(name: str, doc: str) -> Callable[..., NkiTensor]:
    def fn(x: Any, dtype: Any = None, *, mask: Any = None) -> NkiTensor:
        x, out, valid = _unary_out(name, x, dtype, mask)
        data = _masked(x, valid)
        return _emit(out, lambda dst: _isa().activation(dst=_masked(dst, valid), op=fn, data=data))

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
        data = _masked(x, valid)
        op = fn if op0 is None else op0
        return _emit(out, lambda dst: _isa().tensor_scalar(dst=_masked(dst, valid), data=data, op0=op,
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
    data = _masked(x, valid)
    return _emit(out, lambda dst: _isa().reciprocal(dst=_masked(dst, valid), data=data))


@_op("rsqrt")
def rsqrt(x: Any, dtype: Any = None, *, mask: Any = None) -> NkiTensor:
    """``1 / sqrt(x)`` element-wise on GpSimd (``tensor_scalar(op0=rsqrt)``); PSUM input is rejected (0.5.0)."""
    x = _tile(x, "rsqrt")
    if x.buffer is Buffer.psum:
        fail("rsqrt", f"nl.rsqrt runs on GpSimd, which cannot read PSUM, and {x.name!r} is in psum; "
             "copy it to SBUF first (nl.copy)")
    x, out, valid = _unary_out("rsqrt", x, dtype, mask)
    data = _masked(x, valid)
    return _emit(out, lambda dst: _isa().tensor_scalar(dst=_masked(dst, valid), data=data, op0=rsqrt,
                                                        operand0=None, engine=_isa().engine.gpsimd))


def _fp32_like(x: NkiTensor, op: str) -> NkiTensor:
    return _tile(_allocate(x.shape, float32, sbuf, "", op), op)


_TWO_PI = 2.0 * math.pi


def _sin_of_shifted(x: NkiTensor, shift: float, out: NkiTensor, op: str, valid: tuple[int, ...]) -> NkiTensor:
    """``sin(x + shift)`` accurate for any x: t = (x + shift) mod 2pi, then sin(pi - t) on ScalarE."""
    data = _masked(x, valid)
    t = _fp32_like(x, op)
    _isa().tensor_scalar(dst=_masked(t, valid), data=data, op0=add, operand0=shift, op1=mod, operand1=_TWO_PI)
    pi = _tile(_allocate((x.shape[0], 1), float32, sbuf, "", op), op)
    _issue(lambda: _isa().memset(dst=pi, value=math.pi), tag={"value": math.pi})
    src = _masked(t, valid)
    bias = pi[0:valid[0], :]
    return _emit(out, lambda dst: _isa().activation(dst=_masked(dst, valid), op=sin, data=src, bias=bias,
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
    x = _on_chip(_tile(x, "tan"), "tan")
    s = sin(x, float32, mask=mask)
    c = cos(x, float32, mask=mask)
    return divide(s, c, _result_dtype(dtype, x), mask=mask)


def _integral(name: str, x: Any, dtype: Any, mask: Any, adjust: Any) -> NkiTensor:
    """trunc / floor / ceil from ``x - fmod(x, 1)`` (exact in fp32), corrected by a comparison."""
    x, out, valid = _unary_out(name, x, dtype, mask)
    data = _masked(x, valid)
    frac = _fp32_like(x, name)
    _isa().tensor_scalar(dst=_masked(frac, valid), data=data, op0=fmod, operand0=1.0)
    whole = out if adjust is None else _fp32_like(x, name)
    frac_v = _masked(frac, valid)
    if adjust is None:
        return _emit(out, lambda dst: _isa().tensor_tensor(dst=_masked(dst, valid), data1=data, data2=frac_v,
                                                           op=subtract))
    _isa().tensor_tensor(dst=_masked(whole, valid), data1=data, data2=frac_v, op=subtract)
    whole_v = _masked(whole, valid)
    step = _fp32_like(x, name)
    compare, combine = adjust
    _isa().tensor_tensor(dst=_masked(step, valid), data1=data, data2=whole_v, op=compare)
    step_v = _masked(step, valid)
    return _emit(out, lambda dst: _isa().tensor_tensor(dst=_masked(dst, valid), data1=whole_v, data2=step_v,
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
    _isa().dma_copy(dst=out, src=repeated)
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
    _reject_legacy_kwargs("broadcast_to", legacy)
    x = _on_chip(_tile(x, "broadcast_to"), "broadcast_to")
    shape = tuple(_int(s, "broadcast_to") for s in shape)
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
    out = _tile(_allocate(shape, dt, sbuf, "", "broadcast_to"), "broadcast_to")
    if shape[0] == x.shape[0]:
        src = _expand(x, shape, "broadcast_to")
        return _emit(out, lambda dst: _isa().tensor_copy(dst=dst, src=src), "copy")
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
    isa = _isa()
    if free == 1:  # one value per partition after the matmul; the copy broadcasts it along the row
        part = _tile(_allocate((shape[0], 1), float32, psum, "", "broadcast_to"), "broadcast_to")
        isa.nc_matmul(dst=part, stationary=lhs, moving=row, accumulate=False)
        isa.tensor_copy(dst=flat_out, src=part.broadcast(1, width) if width > 1 else part)
        return out
    for start in range(0, width, 512):
        cols = _b.min(512, width - start)
        part = _tile(_allocate((shape[0], cols), float32, psum, "", "broadcast_to"), "broadcast_to")
        isa.nc_matmul(dst=part, stationary=lhs, moving=row[:, start:start + cols], accumulate=False)
        isa.tensor_copy(dst=flat_out[:, start:start + cols], src=part)
    return out
