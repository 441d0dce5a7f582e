"""Creation and allocation in ``nl``: ``ndarray``, ``zeros``/``ones``/``full`` and their
``*_like`` forms, shared constants and identity matrices, ``rand``/``random_seed``;
fills lower onto ``memset`` (HBM: an SBUF memset tile DMA'd over the tensor) and
shared-HBM declarations are one tensor per launch (module docstring, decision 11)."""

from __future__ import annotations

import builtins as _b
import math
import os
from typing import Any

import ml_dtypes
import numpy as np

from torchneuron.nki import context
from torchneuron.nki import dtypes as _dtypes
from torchneuron.nki.dtypes import NkiDType
from torchneuron.nki.errors import NkiValidationError, fail
from torchneuron.nki.memory import Allocation, Buffer
from torchneuron.nki.tensor import NkiTensor
from torchneuron.nki.language._dtype_buffer_ops import float32, sbuf, uint8
from torchneuron.nki.language._dtype_buffer_ops import uint32
from torchneuron.nki.language._base_ops import (
    BlockTensor, _buffer, _dtype, _int, _is_scalar, _isa, _name, _on_chip, _program, _scalar, _shape, _tile,
)
from torchneuron.nki.language._issue_ops import _emit, _issue


# ===================================================================== creation


def _allocate(shape: Any, dtype: Any, buffer: Any, name: str, op: str,
              address: tuple[int, int] | None = None) -> "NkiTensor | BlockTensor":
    run = context.current()
    block, dims = _shape(shape, op)
    dt = _dtype(dtype, op)
    buf = _buffer(buffer, op)
    explicit_name = bool(name)
    name = _name(name, op)
    if block and buf.is_hbm:
        dims, block = block + dims, ()
    if block:
        if address is not None:
            fail(op, "address= cannot place a legacy block tensor (dims before nl.par_dim); allocate a "
                 "Python list of tiles with one address each")
        count = math.prod(block)
        tiles = [_allocate(dims, dt, buf, f"{name}[{i}]", op) for i in range(count)]
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
        address = (_int(address[0], op), _int(address[1], op))
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
        program = _program()
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
    (free offset in elements of ``dtype``; PSUM offsets must be bank-aligned).
    """
    _reject_legacy_kwargs("ndarray", legacy)
    return _allocate(shape, dtype, buffer, name, "ndarray", address)


# Legacy options of creation functions with no effect on values: the compiler's choice of when
# to materialise a constant (``nl.full(..., lazy_initialization=True)``).
_IGNORED_LEGACY = {"full": ("lazy_initialization",), "zeros": ("lazy_initialization",),
                   "ones": ("lazy_initialization",)}


def _reject_legacy_kwargs(op: str, kwargs: dict) -> None:
    for key in _IGNORED_LEGACY.get(op, ()):
        kwargs.pop(key, None)
    if kwargs:
        raise TypeError(f"nl.{op}() got unexpected keyword argument(s) {', '.join(sorted(kwargs))}")


def _fill_value(value: Any, dtype: NkiDType, op: str) -> float | int:
    if not _is_scalar(value):
        raise TypeError(f"nl.{op}: fill value must be a Python number, got {type(value).__name__}")
    value = _scalar(value)
    if dtype.is_integer:
        if isinstance(value, float) and not value.is_integer():
            raise TypeError(f"nl.{op}: fill value {value} is not an integer but dtype is {dtype.name}")
        return int(value)
    return float(value)


def _fill(t: "NkiTensor | BlockTensor", value: Any, op: str) -> None:
    """``memset`` ``t`` to ``value`` (HBM: memset an SBUF tile and DMA it over ``t``)."""
    if isinstance(t, BlockTensor):
        for tile in t.tiles:
            _fill(tile, value, op)
        return
    value = _fill_value(value, t.dtype, op)
    if t.on_chip:
        _issue(lambda: _isa().memset(dst=t, value=value), tag={"value": value})
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
                _fill(t[i], value, op)
            return
    chunk = _b.max(1, _b.min(cols, 65536 // t.dtype.itemsize))
    src = full((_b.min(rows, 128), chunk), value, t.dtype, name=f"{t.name}.fill")
    for r in range(0, rows, 128):
        for c in range(0, cols, chunk):
            pr, pc = _b.min(128, rows - r), _b.min(chunk, cols - c)
            _isa().dma_copy(dst=flat[r:r + pr, c:c + pc], src=src[0:pr, 0:pc])


def zeros(shape: Any, dtype: Any, buffer: Any = sbuf, name: str = "", **legacy: Any) -> "NkiTensor | BlockTensor":
    """A tensor filled with 0 (a ``memset``)."""
    return full(shape, 0, dtype, buffer, name, **legacy)


def ones(shape: Any, dtype: Any, buffer: Any = sbuf, name: str = "", **legacy: Any) -> "NkiTensor | BlockTensor":
    """A tensor filled with 1 (a ``memset``)."""
    return full(shape, 1, dtype, buffer, name, **legacy)


def full(shape: Any, fill_value: Any, dtype: Any, buffer: Any = sbuf, name: str = "",
         **legacy: Any) -> "NkiTensor | BlockTensor":
    """A tensor filled with ``fill_value`` (a ``memset``; the value type must match the dtype)."""
    _reject_legacy_kwargs("full", legacy)
    t = _allocate(shape, dtype, buffer, name, "full")
    _fill(t, fill_value, "full")
    return t


def zeros_like(x: Any, dtype: Any = None, buffer: Any = None, name: str = "", **legacy: Any) -> Any:
    """Zeros with ``x``'s shape; dtype defaults to ``x``'s, buffer to sbuf (documented default)."""
    _reject_legacy_kwargs("zeros_like", legacy)
    return zeros(x.shape, dtype if dtype is not None else x.dtype, _buffer(buffer, "zeros_like"), name)


def ones_like(x: Any, dtype: Any = None, buffer: Any = None, name: str = "") -> Any:
    """Ones with ``x``'s shape (dtype defaults to ``x``'s, buffer to sbuf)."""
    return ones(x.shape, dtype if dtype is not None else x.dtype, _buffer(buffer, "ones_like"), name)


def empty_like(x: Any, dtype: Any = None, buffer: Any = None, name: str = "", **legacy: Any) -> Any:
    """An uninitialised tensor like ``x`` (dtype and buffer default to ``x``'s)."""
    _reject_legacy_kwargs("empty_like", legacy)
    return ndarray(x.shape, dtype if dtype is not None else x.dtype,
                   buffer if buffer is not None else x.buffer, name)


def shared_constant(constant: Any, dtype: Any = None, **legacy: Any) -> NkiTensor:
    """A shared-HBM tensor holding ``constant`` (an array or an ``.npy`` path), loaded with the kernel.

    Constants are part of the compiled binary, so no instruction is recorded.
    float64 data becomes float32 (Trainium has no FP64).
    """
    _reject_legacy_kwargs("shared_constant", legacy)
    run = context.current()
    if isinstance(constant, (str, os.PathLike)):
        constant = np.load(constant)
    array = np.asarray(constant)
    if dtype is None:
        dtype = np.float32 if array.dtype == np.float64 else array.dtype
    dt = _dtypes.resolve(dtype)
    alloc = run.allocate_hbm(Buffer.shared_hbm, tuple(array.shape), dt, _name("", "shared_constant"))
    tensor = NkiTensor(alloc)
    tensor.write(_dtypes.to_storage(array.astype(np.float32) if array.dtype == np.float64 else array, dt))
    return tensor


def shared_identity_matrix(n: int, dtype: Any = uint8, dst: NkiTensor | None = None, **legacy: Any) -> NkiTensor:
    """An ``[n, n]`` identity matrix in SBUF: a shared constant DMA'd on chip."""
    _reject_legacy_kwargs("shared_identity_matrix", legacy)
    n = _int(n, "shared_identity_matrix")
    dt = _dtypes.resolve(dtype)
    constant = shared_constant(np.eye(n, dtype=np.float32), dt)
    if dst is None:
        dst = _allocate((n, n), dt, sbuf, "", "shared_identity_matrix")
    _isa().dma_copy(dst=dst, src=constant)
    return dst


def rand(shape: Any, dtype: Any = float32, buffer: Any = sbuf, name: str = "", **legacy: Any) -> NkiTensor:
    """Uniform U[0, 1) values; the sequence follows :func:`random_seed`.

    Lowered to VectorE ``rng`` (32 random bits), a logical right shift keeping as
    many bits as ``dtype`` has significand bits (at most 24), and a multiply by
    ``2**-bits``: every value is exactly representable and below 1.
    """
    _reject_legacy_kwargs("rand", legacy)
    out = _tile(_allocate(shape, dtype, buffer, name, "rand"), "rand", "result")
    mantissa = 10 if out.dtype.name == "tfloat32" else ml_dtypes.finfo(out.dtype.storage).nmant \
        if out.dtype.is_float else 23
    bits = _b.min(24, mantissa + 1)
    raw = _tile(_allocate(out.shape, uint32, sbuf, "", "rand"), "rand")
    _isa().rng(dst=raw)
    _isa().tensor_scalar(dst=raw, data=raw, op0=np.right_shift, operand0=32 - bits)
    return _emit(out, lambda dst: _isa().tensor_scalar(dst=dst, data=raw, op0=np.multiply, operand0=2.0 ** -bits))


def random_seed(seed: NkiTensor, **legacy: Any) -> None:
    """Seed the random generator from a ``[1, 1]`` int32 SBUF/PSUM tile (``set_rng_seed``)."""
    legacy.pop("mask", None)
    _reject_legacy_kwargs("random_seed", legacy)
    seed = _on_chip(_tile(seed, "random_seed", "seed"), "random_seed", "seed")
    if seed.size != 1:
        fail("random_seed", f"the seed must be a [1, 1] tile, got shape {list(seed.shape)}")
    _isa().set_rng_seed(src_seeds=seed)
