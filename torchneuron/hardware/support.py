"""Whether real Trainium runs an ATen op on the device or falls back to CPU.

TorchNeuron publishes a per-release table marking each op ``Y`` or
``CPU_FALLBACK``, per dtype (trainium-facts.md: TorchNeuron). We do not copy a
table: :func:`placement` derives the answer from a few documented rules, each a
:class:`Category` with the fact it rests on, checked in this order:

1. op families the hardware has no kernel for: data-dependent output shapes,
   sparse layouts, FFT, linalg decompositions and solvers;
2. dtypes with no Trainium type (float64, complex, quantized, sub-byte);
3. everything else runs on the device, with notes for dtypes it converts
   (int64 computed as int32, FP8 encodings widened) and integer matmuls (FP32).

Results are cached per ``(op, dtypes, target, native_int64)``: the device layer
calls this for every op, and a cache hit costs a dict lookup.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

from torchneuron.hardware.dtypes import Treatment, dtype_support, normalize_dtype
from torchneuron.hardware.engines import TENSOR_ENGINE
from torchneuron.hardware.opname import OpName, parse_op_name
from torchneuron.hardware.specs import get_chip

__all__ = ["Category", "Device", "Placement", "placement", "op_category"]


class Device(enum.StrEnum):
    DEVICE = "device"
    CPU_FALLBACK = "cpu_fallback"


class Category(enum.StrEnum):
    """Why an op runs where it runs; the values are stable strings for logs and tests."""

    DEVICE = "device"
    UNSUPPORTED_DTYPE = "unsupported_dtype"
    DATA_DEPENDENT_SHAPE = "data_dependent_shape"
    SPARSE = "sparse"
    FFT = "fft"
    LINALG_DECOMPOSITION = "linalg_decomposition"


@dataclass(frozen=True, kw_only=True)
class Placement:
    """Where one op runs. ``reason`` is user-facing; ``notes`` qualify a device placement."""

    op: str
    device: Device
    category: Category
    reason: str
    notes: tuple[str, ...] = ()

    @property
    def on_device(self) -> bool:
        return self.device is Device.DEVICE


# Output size depends on tensor values, which a compiled Trainium kernel (static
# shapes, trainium-facts.md: TorchNeuron, torch.compile: "each new shape recompiles")
# cannot know before it runs. nonzero_static and histogram bins have static sizes.
_DATA_DEPENDENT = frozenset(
    {
        "nonzero", "nonzero_numpy", "argwhere", "masked_select", "unique_consecutive",
        "unique_dim", "unique_dim_consecutive", "_unique", "_unique2", "bincount",
    }
)  # fmt: skip
# repeat_interleave with a tensor of repeats; the int overload has a static size.
_DATA_DEPENDENT_OVERLOADS = frozenset({("repeat_interleave", "Tensor"), ("repeat_interleave", "self_Tensor")})
# index.Tensor with a bool/uint8 mask index is a masked_select.
_MASK_DTYPES = frozenset({"bool", "uint8"})

# Sparse layouts: the device registers only the dense (strided) dispatch key;
# these ops create, inspect or compute on sparse tensors. Names containing
# "sparse" are caught by the substring rule.
_SPARSE = frozenset(
    {
        "coalesce", "_coalesce", "_coalesced", "is_coalesced", "indices", "_indices",
        "indices_copy", "_indices_copy", "values", "_values", "values_copy", "_values_copy",
        "crow_indices", "col_indices", "ccol_indices", "row_indices", "crow_indices_copy",
        "col_indices_copy", "ccol_indices_copy", "row_indices_copy", "_nnz", "dense_dim",
        "to_dense", "_to_dense", "to_dense_backward", "_convert_indices_from_coo_to_csr",
        "_convert_indices_from_csr_to_coo", "sspaddmm", "smm", "hspmm",
    }
)  # fmt: skip

_FFT_PREFIXES = ("fft_", "_fft_")
_FFT = frozenset({"stft", "istft"})
# Real-valued helpers in the fft namespace: fftfreq is arange, fftshift is roll.
_FFT_ON_DEVICE = frozenset({"fft_fftfreq", "fft_rfftfreq", "fft_fftshift", "fft_ifftshift"})

# Decompositions and solvers: pivoting, iteration to convergence and
# back-substitution are sequential, data-dependent algorithms with no TensorE
# (matmul) or VectorE (elementwise) mapping; LAPACK on CPU runs them.
_LINALG_LEGACY = frozenset(
    {
        "svd", "qr", "cholesky", "cholesky_solve", "cholesky_inverse", "_cholesky_solve_helper",
        "inverse", "det", "logdet", "slogdet", "lu_solve", "_lu_with_info", "triangular_solve",
        "geqrf", "orgqr", "ormqr", "pinverse", "matrix_exp", "matrix_exp_backward", "symeig",
        "eig", "lstsq",
    }
)  # fmt: skip
# linalg_* ops that are matmuls, reductions or indexing, so stay on device. The
# composite norms (matrix_norm, norm) reach the device already decomposed: their
# 2-norm and nuclear-norm paths call linalg_svdvals, which this table sends to CPU.
_LINALG_ON_DEVICE = frozenset(
    {
        "linalg_matmul", "linalg_vecdot", "linalg_cross", "linalg_diagonal", "linalg_multi_dot",
        "linalg_vector_norm", "linalg_matrix_norm", "linalg_norm", "linalg__powsum",
        "linalg_vander", "linalg_matrix_power", "_linalg_check_errors",
    }
)  # fmt: skip

_INTEGER_DTYPES = frozenset({"uint8", "int8", "int16", "uint16", "int32", "uint32", "int64", "uint64"})

_REASONS = {
    Category.DATA_DEPENDENT_SHAPE: (
        "its output shape depends on tensor values, and Trainium kernels are compiled for "
        "static shapes (trainium-facts.md: TorchNeuron)"
    ),
    Category.SPARSE: (
        "sparse layouts have no Trainium kernels; the device implements dense (strided) tensors "
        "only (trainium-facts.md: TorchNeuron, unsupported ops fall back to CPU)"
    ),
    Category.FFT: (
        "FFTs produce or consume complex values, and Trainium has no complex types "
        "(trainium-facts.md: Data types)"
    ),
    Category.LINALG_DECOMPOSITION: (
        "matrix decompositions and solvers (pivoting, iteration to convergence, "
        "back-substitution) are sequential and data-dependent, with no TensorE (matmul) or "
        "VectorE (elementwise) mapping (trainium-facts.md: Engines); LAPACK on CPU runs them"
    ),
}


def op_category(op_name: str, dtypes: Sequence[str] = ()) -> Category:
    """The op-family rule alone (step 1 of the module docstring), ignoring dtype rules."""
    return _op_category(parse_op_name(op_name), tuple(normalize_dtype(d) for d in dtypes))


def placement(
    op_name: str,
    dtypes: Sequence[str] = (),
    *,
    target: str = "trn2",
    native_int64: bool = False,
) -> Placement:
    """Where real Trainium runs ``op_name`` with tensors of ``dtypes``.

    Args:
        op_name: ATen overload name, e.g. ``"aten::add.Tensor"`` or ``"aten::linalg_eigh"``;
            a bare ``"add"`` means ``aten::add``.
        dtypes: dtype names (``"float32"`` or ``"torch.float32"``) of the tensor arguments
            in schema order, tensor lists flattened, followed by the value of a ``dtype=``
            argument if the op has one. Order matters only for ``index.Tensor``, whose
            first entry is ``self``. Pass a tuple: it is the cache key.
        target: chip, any ``NEURON_PLATFORM_TARGET_OVERRIDE`` spelling.
        native_int64: whether the Trn2/Trn3 native-INT64 compiler flag is on.

    Raises:
        TypeError: ``op_name`` or a dtype is not a string.
        ValueError: unparseable op name, unknown dtype or target, or ``native_int64``
            on trn1.
    """
    key = dtypes if isinstance(dtypes, tuple) else _as_tuple(dtypes)
    return _placement(op_name, key, target, native_int64)


def _as_tuple(dtypes: Sequence[str]) -> tuple[str, ...]:
    if isinstance(dtypes, list):
        return tuple(dtypes)
    if isinstance(dtypes, str) or not isinstance(dtypes, Sequence):
        raise TypeError(
            f"dtypes must be a sequence of dtype names such as ('float32', 'int64'), "
            f"got {type(dtypes).__name__} {dtypes!r}"
        )
    return tuple(dtypes)


@lru_cache(maxsize=16384)
def _placement(op_name: str, dtypes: tuple[str, ...], target: str, native_int64: bool) -> Placement:
    op = parse_op_name(op_name)
    get_chip(target)  # validate the target even when there are no dtypes to look up
    names = tuple(normalize_dtype(d) for d in dtypes)
    supports = {name: dtype_support(name, target, native_int64=native_int64) for name in names}
    category = _op_category(op, names)
    if category is not Category.DEVICE:
        return _fallback(op, category, f"{op.qualified} runs on CPU: {_REASONS[category]}")
    unsupported = [s for s in supports.values() if s.treatment is Treatment.UNSUPPORTED]
    if unsupported:
        return _fallback(op, Category.UNSUPPORTED_DTYPE, f"{op.qualified} runs on CPU: {unsupported[0].reason}")
    notes = [s.reason for s in supports.values() if s.treatment is Treatment.CONVERTED]
    # Integer inputs to what TensorE runs go through FP32 there (trainium-facts.md: Data types).
    if op.base in TENSOR_ENGINE and any(name in _INTEGER_DTYPES for name in names):
        notes.append("integer matmuls run through FP32 on TensorE (trainium-facts.md: Data types); exact only below 2**24")
    return Placement(
        op=op.qualified, device=Device.DEVICE, category=Category.DEVICE, reason="", notes=tuple(notes)
    )


def _fallback(op: OpName, category: Category, reason: str) -> Placement:
    return Placement(op=op.qualified, device=Device.CPU_FALLBACK, category=category, reason=reason)


def _op_category(op: OpName, dtypes: tuple[str, ...]) -> Category:
    if op.namespace != "aten":
        return Category.DEVICE  # custom ops (NKI kernels) are the registrant's business
    base = op.base
    if (
        base in _DATA_DEPENDENT
        or (base, op.overload) in _DATA_DEPENDENT_OVERLOADS
        or (base == "index" and any(d in _MASK_DTYPES for d in dtypes[1:]))
    ):
        return Category.DATA_DEPENDENT_SHAPE
    if "sparse" in base or base in _SPARSE:
        return Category.SPARSE
    if (base.startswith(_FFT_PREFIXES) and base not in _FFT_ON_DEVICE) or base in _FFT:
        return Category.FFT
    if base in _LINALG_LEGACY or (
        base.startswith(("linalg_", "_linalg_")) and base not in _LINALG_ON_DEVICE
    ):
        return Category.LINALG_DECOMPOSITION
    return Category.DEVICE
