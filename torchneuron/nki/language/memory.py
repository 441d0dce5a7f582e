"""Dtypes, buffers and allocation in ``nl``: the NKI dtype objects (and their legacy
``fp32``-style aliases), the memory-region constants and predicates, ``NKIObject``, the
``nl.tile_size`` limits of the current target, and creation: ``ndarray``,
``zeros``/``ones``/``full`` and their ``*_like`` forms, shared constants and identity
matrices, ``rand``/``random_seed``. Fills lower onto ``memset`` (HBM: an SBUF memset tile
DMA'd over the tensor); shared-HBM declarations are one tensor per launch (decision 11)."""

from __future__ import annotations

import builtins as _b
import math
import os
from typing import Any

import ml_dtypes
import numpy as np

from torchneuron.nki import context
from torchneuron.nki.context import current_program
from torchneuron.nki import dtypes as _dtypes
from torchneuron.nki.dtypes import NkiDType
from torchneuron.nki.errors import NkiValidationError, fail
from torchneuron.nki.language.core import (
    BlockTensor, as_buffer, as_dtype, as_int, as_scalar, as_tile, emit, is_scalar, issue_call,
    mask_shape, nisa, require_on_chip, result_name, split_shape,
)
from torchneuron.nki.memory import Allocation, Buffer
from torchneuron.nki.mx import require_mx_target
from torchneuron.nki.tensor import NkiTensor


# ======================================================================= dtypes
# nki-api-facts.md: 3.8. NkiDType objects compare equal to every spelling
# (strings, numpy / ml_dtypes dtypes, torch dtypes), so legacy code comparing
# ``t.dtype == np.float32`` and current code passing "bfloat16" both work.
DTYPES = _dtypes.DTYPES
bool_ = DTYPES["bool_"]
int8, int16, int32, int64 = DTYPES["int8"], DTYPES["int16"], DTYPES["int32"], DTYPES["int64"]
uint8, uint16, uint32, uint64 = DTYPES["uint8"], DTYPES["uint16"], DTYPES["uint32"], DTYPES["uint64"]
float16, float32, bfloat16, tfloat32 = DTYPES["float16"], DTYPES["float32"], DTYPES["bfloat16"], DTYPES["tfloat32"]
float8_e4m3, float8_e5m2 = DTYPES["float8_e4m3"], DTYPES["float8_e5m2"]
float8_e4m3fn, float8_e8m0fnu = DTYPES["float8_e4m3fn"], DTYPES["float8_e8m0fnu"]
# Packed MX quads (nc_matmul_mx / quantize_mx, NeuronCore-v4): names on every target, usable on trn3.
float8_e4m3fn_x4, float8_e5m2_x4 = DTYPES["float8_e4m3fn_x4"], DTYPES["float8_e5m2_x4"]
float4_e2m1fn_x4 = DTYPES["float4_e2m1fn_x4"]
# Legacy constant holders (``nl.fp32.min``); their min/max are the dtype's finite range.
fp32, fp16, bf16, bfp16 = float32, float16, bfloat16, bfloat16



def finfo(dtype: Any) -> Any:
    """Legacy ``nl.finfo``: ``ml_dtypes.finfo`` of an NKI float dtype."""
    return ml_dtypes.finfo(as_dtype(dtype, "finfo").storage)


# ====================================================================== buffers
MemoryRegion = Buffer  # nki-api-facts.md: 3.1 (``MemoryRegion`` enum)
sbuf = Buffer.sbuf
psum = Buffer.psum
private_hbm = Buffer.private_hbm
hbm = Buffer.private_hbm  # alias of private_hbm
shared_hbm = Buffer.shared_hbm


def is_sbuf(buffer: Buffer) -> bool:
    return as_buffer(buffer, "is_sbuf") is Buffer.sbuf


def is_psum(buffer: Buffer) -> bool:
    return as_buffer(buffer, "is_psum") is Buffer.psum


def is_hbm(buffer: Buffer) -> bool:
    return as_buffer(buffer, "is_hbm").is_hbm


def is_on_chip(buffer: Buffer) -> bool:
    return as_buffer(buffer, "is_on_chip").on_chip


class NKIObject:
    """Base class for kernel-side user classes (required by the NKI 0.3 parser; plain here).

    AWS's kernels declare them as dataclasses whose fields are plain class attributes with a
    default (``section_idx = None``, no annotation) and construct them by keyword
    (``SectionParams(section_idx=i, ...)``). A bare ``@dataclass`` would see no fields there and
    refuse the keywords, so each subclass's unannotated, immutable class-level defaults are
    annotated (as ``Any``) before ``@dataclass`` runs: they become fields with those defaults.
    """

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        own = cls.__dict__
        annotations = own.get("__annotations__")
        if annotations is None:
            annotations = {}
            cls.__annotations__ = annotations
        for name, value in list(own.items()):
            if name.startswith("_") or name in annotations or callable(value) \
                    or isinstance(value, (property, staticmethod, classmethod, list, dict, set)):
                continue
            annotations[name] = Any

    def __init__(self, **kwargs: Any) -> None:
        for key, value in kwargs.items():
            setattr(self, key, value)


# =================================================================== tile_size
_PE_TRANSPOSE_ENV = "NKI_DMA_TRANSPOSE_AS_PE_TRANSPOSE"


def _target() -> Any:
    run = context.maybe_current()
    return run.target if run is not None else context.default_target()


class _TileSize:
    """``nl.tile_size``: hardware tile limits of the current target (nki-api-facts.md: 3.9).

    Values that depend on the chip are read from the running kernel's target
    (else ``NEURON_PLATFORM_TARGET_OVERRIDE`` / the device's chip). The
    unpublished ones are decisions (module docstring, decision 2).
    """

    pmax = 128
    psum_bank_fmax = 512
    psum_bank_fmax_bytes = 2048
    psum_fmax = 512  # deprecated in 0.4.0 (it is the per-bank size)
    psum_fmax_bytes = 2048
    gemm_stationary_fmax = 128
    gemm_moving_fmax = 512
    bn_stats_fmax = 512
    psum_min_align = 4  # decision 2 (unpublished)
    sbuf_min_align = 1  # decision 2 (unpublished)

    @property
    def psum_num_banks(self) -> int:
        return context.usable_psum_banks(_target())

    @property
    def sbuf_size_bytes(self) -> int:
        return int(_target().sbuf_bytes_per_core)

    @property
    def sbuf_fmax_bytes(self) -> int:
        chip = _target()
        return int(chip.sbuf_bytes_per_partition or chip.sbuf_bytes_per_core // (chip.sbuf_partitions or 128))

    @property
    def sbuf_fmax(self) -> int:
        return self.sbuf_fmax_bytes // 4

    @property
    def total_available_sbuf_size(self) -> int:
        """Deprecated in 0.4.0: the usable SBUF bytes *per partition*."""
        return self.sbuf_fmax_bytes

    def __repr__(self) -> str:
        names = ("pmax", "psum_bank_fmax", "psum_num_banks", "gemm_stationary_fmax", "gemm_moving_fmax",
                 "bn_stats_fmax", "sbuf_size_bytes", "sbuf_fmax_bytes")
        return "nl.tile_size(" + ", ".join(f"{n}={getattr(self, n)}" for n in names) + ")"


tile_size = _TileSize()


# ===================================================================== creation


def allocate_tensor(shape: Any, dtype: Any, buffer: Any, name: str, op: str,
                    address: tuple[int, int] | None = None) -> "NkiTensor | BlockTensor":
    run = context.current()
    block, dims = split_shape(shape, op)
    dt = as_dtype(dtype, op)
    require_mx_target(op, dt)
    buf = as_buffer(buffer, op)
    explicit_name = bool(name)
    name = result_name(name, op)
    if block and buf.is_hbm:
        dims, block = block + dims, ()
    if block:
        if address is not None:
            fail(op, "address= cannot place a legacy block tensor (dims before nl.par_dim); allocate a "
                 "Python list of tiles with one address each")
        count = math.prod(block)
        tiles = [allocate_tensor(dims, dt, buf, f"{name}[{i}]", op) for i in range(count)]
        return BlockTensor(block, tiles, name)
    if buf.is_hbm:
        if address is not None:
            fail(op, f"address= places on-chip tensors only; {name!r} is in {buf.value}")
        if buf is Buffer.shared_hbm:
            return NkiTensor(_shared_allocation(run, dims, dt, name, explicit_name))
        return NkiTensor(run.allocate_hbm(buf, dims, dt, name))
    if address is not None:
        if not (isinstance(address, (tuple, list)) and len(address) == 2):
            raise TypeError(f"nl.{op}: address must be (partition_offset, free_offset), got {address!r}")
        address = (as_int(address[0], op), as_int(address[1], op))
    alloc = Allocation.create(buf, dims, dt, name, fill=run.compute_values, precise=run.precise_fp)
    tensor = NkiTensor(alloc)
    run.memory().place(alloc, address, owner=tensor)
    return tensor


def _shared_allocation(run: Any, dims: tuple[int, ...], dtype: NkiDType, name: str, explicit: bool) -> Allocation:
    """One shared-HBM allocation per declaration for all programs of a launch (decision 11).

    Every SPMD program (LNC2 core, legacy grid instance) runs the kernel body and
    declares the same ``nl.shared_hbm`` tensors; they are one tensor visible to all
    programs, matched by name when one was given, else by declaration order.
    """
    with run._lock:
        shared = run.__dict__.setdefault("_nl_shared_hbm", {})
        counters = run.__dict__.setdefault("_nl_shared_hbm_count", {})
        program = current_program()
        index = counters.get(program, 0)
        counters[program] = index + 1
        key = ("name", name) if explicit else ("order", index)
        alloc = shared.get(key)
    if alloc is None:
        alloc = run.allocate_hbm(Buffer.shared_hbm, dims, dtype, name)
        with run._lock:
            alloc = shared.setdefault(key, alloc)
    if alloc.shape != dims or alloc.dtype is not dtype:
        fail("ndarray", f"shared_hbm tensor {name!r} is declared as {list(dims)} {dtype.name} by program "
             f"{program} but as {list(alloc.shape)} {alloc.dtype.name} by another program; every program "
             "must declare shared tensors alike")
    return alloc


def ndarray(shape: Any, dtype: Any, buffer: Any = sbuf, name: str = "",
            address: tuple[int, int] | None = None, **legacy: Any) -> "NkiTensor | BlockTensor":
    """An uninitialised tensor (NaN / 4 filled, as AWS's simulator does; nki-api-facts.md: 3.1, 8).

    ``address=(partition_offset, free_offset)`` places an on-chip tensor manually
    (free offset in **bytes** within each partition, as AWS's allocators compute it; a PSUM
    offset starts a 2 KiB bank: bank ``k`` is ``k * 2048``).
    """
    reject_legacy_kwargs("ndarray", legacy)
    return allocate_tensor(shape, dtype, buffer, name, "ndarray", address)


# Legacy options of creation functions with no effect on values: the compiler's choice of when
# to materialise a constant (``nl.full(..., lazy_initialization=True)``).
_IGNORED_LEGACY = {"full": ("lazy_initialization",), "zeros": ("lazy_initialization",),
                   "ones": ("lazy_initialization",)}


def reject_legacy_kwargs(op: str, kwargs: dict) -> None:
    for key in _IGNORED_LEGACY.get(op, ()):
        kwargs.pop(key, None)
    if kwargs:
        raise TypeError(f"nl.{op}() got unexpected keyword argument(s) {', '.join(sorted(kwargs))}")


def as_fill_value(value: Any, dtype: NkiDType, op: str) -> float | int:
    if not is_scalar(value):
        raise TypeError(f"nl.{op}: fill value must be a Python number, got {type(value).__name__}")
    value = as_scalar(value)
    if dtype.is_integer:
        if isinstance(value, float) and not value.is_integer():
            raise TypeError(f"nl.{op}: fill value {value} is not an integer but dtype is {dtype.name}")
        return int(value)
    return float(value)


def fill_tensor(t: "NkiTensor | BlockTensor", value: Any, op: str) -> None:
    """``memset`` ``t`` to ``value`` (HBM: memset an SBUF tile and DMA it over ``t``)."""
    if isinstance(t, BlockTensor):
        for tile in t.tiles:
            fill_tensor(tile, value, op)
        return
    value = as_fill_value(value, t.dtype, op)
    if t.on_chip:
        issue_call(lambda: nisa().memset(dst=t, value=value), tag={"value": value})
        return
    rows = t.shape[0] if t.ndim >= 2 else 1
    cols = t.size // rows
    if t.ndim == 2:
        flat = t
    else:
        try:
            flat = t.reshape((rows, cols))
        except NkiValidationError:  # a strided view: fill it one leading index at a time
            for i in range(t.shape[0]):
                fill_tensor(t[i], value, op)
            return
    chunk = _b.max(1, _b.min(cols, 65536 // t.dtype.itemsize))
    src = full((_b.min(rows, 128), chunk), value, t.dtype, name=f"{t.name}.fill")
    for r in range(0, rows, 128):
        for c in range(0, cols, chunk):
            pr, pc = _b.min(128, rows - r), _b.min(chunk, cols - c)
            nisa().dma_copy(dst=flat[r:r + pr, c:c + pc], src=src[0:pr, 0:pc])


def zeros(shape: Any, dtype: Any, buffer: Any = sbuf, name: str = "", **legacy: Any) -> "NkiTensor | BlockTensor":
    """A tensor filled with 0 (a ``memset``)."""
    return full(shape, 0, dtype, buffer, name, **legacy)


def ones(shape: Any, dtype: Any, buffer: Any = sbuf, name: str = "", **legacy: Any) -> "NkiTensor | BlockTensor":
    """A tensor filled with 1 (a ``memset``)."""
    return full(shape, 1, dtype, buffer, name, **legacy)


def full(shape: Any, fill_value: Any, dtype: Any, buffer: Any = sbuf, name: str = "",
         **legacy: Any) -> "NkiTensor | BlockTensor":
    """A tensor filled with ``fill_value`` (a ``memset``; the value type must match the dtype)."""
    reject_legacy_kwargs("full", legacy)
    t = allocate_tensor(shape, dtype, buffer, name, "full")
    fill_tensor(t, fill_value, "full")
    return t


def zeros_like(x: Any, dtype: Any = None, buffer: Any = None, name: str = "", **legacy: Any) -> Any:
    """Zeros with ``x``'s shape; dtype defaults to ``x``'s, buffer to sbuf (documented default)."""
    reject_legacy_kwargs("zeros_like", legacy)
    return zeros(x.shape, dtype if dtype is not None else x.dtype, as_buffer(buffer, "zeros_like"), name)


def ones_like(x: Any, dtype: Any = None, buffer: Any = None, name: str = "") -> Any:
    """Ones with ``x``'s shape (dtype defaults to ``x``'s, buffer to sbuf)."""
    return ones(x.shape, dtype if dtype is not None else x.dtype, as_buffer(buffer, "ones_like"), name)


def empty_like(x: Any, dtype: Any = None, buffer: Any = None, name: str = "", **legacy: Any) -> Any:
    """An uninitialised tensor like ``x`` (dtype and buffer default to ``x``'s)."""
    reject_legacy_kwargs("empty_like", legacy)
    return ndarray(x.shape, dtype if dtype is not None else x.dtype,
                   buffer if buffer is not None else x.buffer, name)


def shared_constant(constant: Any, dtype: Any = None, **legacy: Any) -> NkiTensor:
    """A shared-HBM tensor holding ``constant`` (an array or an ``.npy`` path), loaded with the kernel.

    Constants are part of the compiled binary, so no instruction is recorded.
    float64 data becomes float32 (Trainium has no FP64).
    """
    reject_legacy_kwargs("shared_constant", legacy)
    run = context.current()
    if isinstance(constant, (str, os.PathLike)):
        constant = np.load(constant)
    array = np.asarray(constant)
    if dtype is None:
        dtype = np.float32 if array.dtype == np.float64 else array.dtype
    dt = _dtypes.resolve(dtype)
    alloc = run.allocate_hbm(Buffer.shared_hbm, tuple(array.shape), dt, result_name("", "shared_constant"))
    tensor = NkiTensor(alloc)
    tensor.write(_dtypes.to_storage(array.astype(np.float32) if array.dtype == np.float64 else array, dt))
    return tensor


def shared_identity_matrix(n: int, dtype: Any = uint8, dst: NkiTensor | None = None, **legacy: Any) -> NkiTensor:
    """An ``[n, n]`` identity matrix in SBUF: a shared constant DMA'd on chip."""
    reject_legacy_kwargs("shared_identity_matrix", legacy)
    n = as_int(n, "shared_identity_matrix")
    dt = _dtypes.resolve(dtype)
    constant = shared_constant(np.eye(n, dtype=np.float32), dt)
    if dst is None:
        dst = allocate_tensor((n, n), dt, sbuf, "", "shared_identity_matrix")
    nisa().dma_copy(dst=dst, src=constant)
    return dst


def rand(shape: Any, dtype: Any = float32, buffer: Any = sbuf, name: str = "", **legacy: Any) -> NkiTensor:
    """Uniform U[0, 1) values; the sequence follows :func:`random_seed`.

    Lowered to VectorE ``rng`` (32 random bits), a logical right shift keeping as
    many bits as ``dtype`` has significand bits (at most 24), and a multiply by
    ``2**-bits``: every value is exactly representable and below 1.
    """
    reject_legacy_kwargs("rand", legacy)
    out = as_tile(allocate_tensor(shape, dtype, buffer, name, "rand"), "rand", "result")
    mantissa = 10 if out.dtype.name == "tfloat32" else ml_dtypes.finfo(out.dtype.storage).nmant \
        if out.dtype.is_float else 23
    bits = _b.min(24, mantissa + 1)
    raw = as_tile(allocate_tensor(out.shape, uint32, sbuf, "", "rand"), "rand")
    nisa().rng(dst=raw)
    nisa().tensor_scalar(dst=raw, data=raw, op0=np.right_shift, operand0=32 - bits)
    return emit(out, lambda dst: nisa().tensor_scalar(dst=dst, data=raw, op0=np.multiply, operand0=2.0 ** -bits))


def random_seed(seed: NkiTensor, **legacy: Any) -> None:
    """Seed the random generator from a ``[1, 1]`` int32 SBUF/PSUM tile (``set_rng_seed``)."""
    mask = legacy.pop("mask", None)
    reject_legacy_kwargs("random_seed", legacy)
    seed = require_on_chip(as_tile(seed, "random_seed", "seed"), "random_seed", "seed")
    if seed.size != 1:
        fail("random_seed", f"the seed must be a [1, 1] tile, got shape {list(seed.shape)}")
    if 0 in mask_shape(mask, tuple(seed.shape), "random_seed"):
        return  # a legacy mask that keeps nothing: the instruction does not run
    nisa().set_rng_seed(src_seeds=seed)
