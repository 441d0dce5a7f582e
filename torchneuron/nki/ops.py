"""ALU operators and activation functions: what ``op=`` arguments mean.

ISA instructions take operators as ``nl`` functions (``op=nl.add``), and legacy
kernels also pass NumPy ufuncs (``np.add``, ``np.max``) (nki-api-facts.md: 5).
:func:`alu_op` and :func:`activation_fn` normalise all spellings to one spec
with a vectorised NumPy implementation. Engines compute in fp32
(nki-api-facts.md: 4): implementations take and return float32 arrays, except
bit-vector ops, which act on integer bit patterns.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

__all__ = ["AluOp", "ActivationFn", "ALU_OPS", "ACTIVATIONS", "alu_op", "activation_fn", "nki_op_name"]


@dataclass(frozen=True)
class AluOp:
    """A VectorE/GpSimd ALU operator (``op`` of tensor_tensor, tensor_scalar, tensor_reduce...)."""

    name: str
    fn: Callable[..., np.ndarray]
    arity: int = 2
    reducible: bool = False  # "Legal Reduction op" in nki-api-facts.md: 5
    bitvec: bool = False
    identity: float | None = None  # for reductions
    trn3_only: bool = False

    def reduce(self, values: np.ndarray, axis: tuple[int, ...], keepdims: bool) -> np.ndarray:
        if not self.reducible:
            raise ValueError(f"{self.name} is not a legal reduction op")
        ufunc = _REDUCERS[self.name]
        return ufunc.reduce(values, axis=axis, keepdims=keepdims)


@dataclass(frozen=True)
class ActivationFn:
    """A ScalarE activation function; ``valid_range`` is where its approximation holds."""

    name: str
    fn: Callable[..., np.ndarray]
    valid_range: tuple[float, float] | None = None  # None: valid on [-inf, inf]
    symmetric_range: bool = False  # valid on +/- [lo, hi] (reciprocal)


def _erf(x: np.ndarray) -> np.ndarray:
    import torch

    return torch.special.erf(torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32))).numpy()


def _sigmoid(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        return (1.0 / (1.0 + np.exp(-x))).astype(np.float32)


def _gelu(x: np.ndarray) -> np.ndarray:
    return (0.5 * x * (1.0 + _erf(x / math.sqrt(2.0)))).astype(np.float32)


def _gelu_dx(x: np.ndarray) -> np.ndarray:
    cdf = 0.5 * (1.0 + _erf(x / math.sqrt(2.0)))
    pdf = np.exp(-0.5 * x * x) / math.sqrt(2.0 * math.pi)
    return (cdf + x * pdf).astype(np.float32)


def _gelu_tanh(x: np.ndarray) -> np.ndarray:
    inner = math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)
    return (0.5 * x * (1.0 + np.tanh(inner))).astype(np.float32)


def _gelu_sigmoid(x: np.ndarray) -> np.ndarray:
    return (x * _sigmoid(1.702 * x)).astype(np.float32)


def _gelu_sigmoid_dx(x: np.ndarray) -> np.ndarray:
    s = _sigmoid(1.702 * x)
    return (s + 1.702 * x * s * (1.0 - s)).astype(np.float32)


def _silu_dx(x: np.ndarray) -> np.ndarray:
    s = _sigmoid(x)
    return (s * (1.0 + x * (1.0 - s))).astype(np.float32)


def _softplus(x: np.ndarray) -> np.ndarray:
    return np.logaddexp(0.0, x).astype(np.float32)


def _mish(x: np.ndarray) -> np.ndarray:
    return (x * np.tanh(_softplus(x))).astype(np.float32)


def _erf_dx(x: np.ndarray) -> np.ndarray:
    return (2.0 / math.sqrt(math.pi) * np.exp(-x * x)).astype(np.float32)


def _safe(fn: Callable[[np.ndarray], np.ndarray]) -> Callable[[np.ndarray], np.ndarray]:
    def run(x: np.ndarray) -> np.ndarray:
        with np.errstate(all="ignore"):
            return np.asarray(fn(x), dtype=np.float32)

    run.__name__ = getattr(fn, "__name__", "fn")
    return run


ACTIVATIONS: dict[str, ActivationFn] = {a.name: a for a in (
    ActivationFn("copy", _safe(lambda x: x)),
    ActivationFn("bypass", _safe(lambda x: x)),
    ActivationFn("square", _safe(np.square)),
    ActivationFn("sigmoid", _safe(_sigmoid)),
    ActivationFn("relu", _safe(lambda x: np.maximum(x, 0.0))),
    ActivationFn("gelu", _safe(_gelu)),
    ActivationFn("gelu_dx", _safe(_gelu_dx)),
    ActivationFn("gelu_apprx_tanh", _safe(_gelu_tanh)),
    ActivationFn("gelu_apprx_sigmoid", _safe(_gelu_sigmoid)),
    ActivationFn("gelu_apprx_sigmoid_dx", _safe(_gelu_sigmoid_dx)),
    ActivationFn("silu", _safe(lambda x: x * _sigmoid(x))),
    ActivationFn("silu_dx", _safe(_silu_dx)),
    ActivationFn("tanh", _safe(np.tanh)),
    ActivationFn("softplus", _safe(_softplus)),
    ActivationFn("mish", _safe(_mish)),
    ActivationFn("erf", _safe(_erf)),
    ActivationFn("erf_dx", _safe(_erf_dx)),
    ActivationFn("exp", _safe(np.exp)),
    ActivationFn("sign", _safe(np.sign)),
    ActivationFn("abs", _safe(np.abs)),
    ActivationFn("log", _safe(np.log), (2.0 ** -64, 2.0 ** 64)),
    ActivationFn("sin", _safe(np.sin), (-math.pi, math.pi)),
    ActivationFn("cos", _safe(np.cos), (-math.pi, math.pi)),
    ActivationFn("arctan", _safe(np.arctan), (-math.pi / 2, math.pi / 2)),
    ActivationFn("sqrt", _safe(np.sqrt), (2.0 ** -116, 2.0 ** 118)),
    ActivationFn("rsqrt", _safe(lambda x: 1.0 / np.sqrt(x)), (2.0 ** -87, 2.0 ** 97)),
    ActivationFn("reciprocal", _safe(lambda x: 1.0 / x), (2.0 ** -42, 2.0 ** 42), symmetric_range=True),
    ActivationFn("negative", _safe(np.negative)),
)}


def _int_or_float(fn: Callable[..., np.ndarray]) -> Callable[..., np.ndarray]:
    def run(*args: np.ndarray) -> np.ndarray:
        with np.errstate(all="ignore"):
            return fn(*args)

    return run


def _abs_max(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    return np.where(np.abs(x) > np.abs(y), x, y)


def _abs_min(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    return np.where(np.abs(x) < np.abs(y), x, y)


def _cmp(fn: Callable[..., np.ndarray]) -> Callable[..., np.ndarray]:
    return lambda x, y: fn(x, y).astype(np.float32)


ALU_OPS: dict[str, AluOp] = {o.name: o for o in (
    AluOp("add", _int_or_float(np.add), reducible=True, identity=0.0),
    AluOp("subtract", _int_or_float(np.subtract), reducible=True, identity=0.0),
    AluOp("multiply", _int_or_float(np.multiply), reducible=True, identity=1.0),
    AluOp("maximum", _int_or_float(np.maximum), reducible=True, identity=-np.inf),
    AluOp("minimum", _int_or_float(np.minimum), reducible=True, identity=np.inf),
    AluOp("divide", _int_or_float(np.divide)),
    AluOp("power", _int_or_float(np.power)),
    AluOp("fmod", _int_or_float(np.fmod)),
    AluOp("mod", _int_or_float(np.mod)),
    AluOp("abs_max", _int_or_float(_abs_max), trn3_only=True),
    AluOp("abs_min", _int_or_float(_abs_min), trn3_only=True),
    AluOp("equal", _cmp(np.equal)),
    AluOp("not_equal", _cmp(np.not_equal)),
    AluOp("greater", _cmp(np.greater)),
    AluOp("greater_equal", _cmp(np.greater_equal)),
    AluOp("less", _cmp(np.less)),
    AluOp("less_equal", _cmp(np.less_equal)),
    AluOp("logical_and", _cmp(lambda x, y: np.logical_and(x != 0, y != 0)), reducible=True),
    AluOp("logical_or", _cmp(lambda x, y: np.logical_or(x != 0, y != 0)), reducible=True),
    AluOp("logical_xor", _cmp(lambda x, y: np.logical_xor(x != 0, y != 0)), reducible=True),
    AluOp("bitwise_and", np.bitwise_and, reducible=True, bitvec=True),
    AluOp("bitwise_or", np.bitwise_or, reducible=True, bitvec=True),
    AluOp("bitwise_xor", np.bitwise_xor, reducible=True, bitvec=True),
    AluOp("left_shift", np.left_shift, bitvec=True),
    AluOp("right_shift", lambda x, y: np.right_shift(x.view(_unsigned(x.dtype)),
                                                     np.asarray(y).astype(_unsigned(x.dtype))).view(x.dtype),
          bitvec=True),
    AluOp("invert", np.invert, arity=1, bitvec=True),
    AluOp("abs", _int_or_float(np.abs), arity=1),
    AluOp("square", _int_or_float(np.square), arity=1),
    AluOp("relu", _int_or_float(lambda x: np.maximum(x, 0)), arity=1),
    AluOp("rsqrt", _int_or_float(lambda x: 1.0 / np.sqrt(x)), arity=1),
    AluOp("reciprocal", _int_or_float(lambda x: 1.0 / x), arity=1),
    AluOp("bypass", lambda x, y=None: x, arity=1),
)}

_REDUCERS = {
    "add": np.add, "subtract": np.add, "multiply": np.multiply, "maximum": np.maximum, "minimum": np.minimum,
    "logical_and": np.logical_and, "logical_or": np.logical_or, "logical_xor": np.logical_xor,
    "bitwise_and": np.bitwise_and, "bitwise_or": np.bitwise_or, "bitwise_xor": np.bitwise_xor,
}


def _unsigned(dtype: np.dtype) -> np.dtype:
    return np.dtype(f"u{np.dtype(dtype).itemsize}")


# Legacy kernels pass NumPy callables as operators.
_NUMPY_ALIASES: dict[Any, str] = {
    np.add: "add", np.subtract: "subtract", np.multiply: "multiply", np.maximum: "maximum",
    np.minimum: "minimum", np.max: "maximum", np.min: "minimum", np.amax: "maximum", np.amin: "minimum",
    np.divide: "divide", np.power: "power", np.equal: "equal", np.not_equal: "not_equal",
    np.greater: "greater", np.greater_equal: "greater_equal", np.less: "less", np.less_equal: "less_equal",
    np.logical_and: "logical_and", np.logical_or: "logical_or", np.logical_xor: "logical_xor",
    np.bitwise_and: "bitwise_and", np.bitwise_or: "bitwise_or", np.bitwise_xor: "bitwise_xor",
    np.left_shift: "left_shift", np.right_shift: "right_shift", np.invert: "invert", np.abs: "abs",
    np.square: "square", np.exp: "exp", np.log: "log", np.sqrt: "sqrt", np.tanh: "tanh", np.sin: "sin",
    np.cos: "cos", np.arctan: "arctan", np.sign: "sign", np.negative: "negative", np.reciprocal: "reciprocal",
    np.sum: "add", np.prod: "multiply", np.fmod: "fmod", np.mod: "mod",
}
_NAME_ALIASES = {"max": "maximum", "min": "minimum", "sum": "add", "prod": "multiply", "sub": "subtract",
                 "mul": "multiply", "identity": "copy", "bitwise_not": "invert", "logical_not": "invert"}


def nki_op_name(op: Any) -> str:
    """The canonical name of an operator given as an ``nl`` function, NumPy callable or string."""
    if isinstance(op, (AluOp, ActivationFn)):
        return op.name
    if isinstance(op, str):
        name = op
    elif getattr(op, "nki_op", None):
        name = op.nki_op
    else:
        try:
            name = _NUMPY_ALIASES.get(op)
        except TypeError:
            name = None
        if name is None:
            raise TypeError(f"{op!r} is not an NKI operator: pass nl.add, nl.exp, ... (or a NumPy ufunc)")
    return _NAME_ALIASES.get(name, name)


def alu_op(op: Any) -> AluOp:
    """The ALU operator ``op`` names; ``TypeError`` listing the valid ones otherwise."""
    name = nki_op_name(op)
    if name not in ALU_OPS:
        raise TypeError(f"{name!r} is not an ALU operator; valid: {', '.join(sorted(ALU_OPS))}")
    return ALU_OPS[name]


def activation_fn(op: Any) -> ActivationFn:
    """The activation function ``op`` names; ``TypeError`` listing the valid ones otherwise."""
    name = nki_op_name(op)
    if name not in ACTIVATIONS:
        raise TypeError(f"{name!r} is not an activation function; valid: {', '.join(sorted(ACTIVATIONS))}")
    return ACTIVATIONS[name]
