"""``nki.language`` (``nl``): tile-level helpers that lower onto ``nki.isa`` instructions.

Kernels import this module as ``nl`` (``import torchneuron.nki.language as nl``).
Every ``nl`` function allocates its result tile and issues the ISA instructions a
compiler would emit for it (nki-api-facts.md: 3, "built on top of nki.isa"); it
never computes values itself and never records an instruction of its own, so
the simulator's checks and the cost model see exactly the ISA instruction stream.
Current NKI (0.6/0.7) is the primary dialect; legacy ``neuronxcc.nki`` idioms of
nki-api-facts.md section 10 are accepted too (masks, ``nl.par_dim`` block dims,
``mgrid``/``arange`` indices, ``psum += nl.matmul(...)``, SPMD grids).

Lowering rules (nki-api-facts.md: 4.7 engine table)
---------------------------------------------------
* Binary element-wise ops (arithmetic, comparisons, logical, bitwise):
  ``tensor_scalar`` when one operand is a Python scalar or a per-partition column
  (a tile with the same partition count and one element per partition, e.g.
  ``(P, 1)`` or ``(P,)``); ``tensor_tensor`` otherwise. Free dims broadcast
  NumPy-style through stride-0 views; a partition broadcast (``1 -> P``) is
  materialised first by :func:`broadcast_to` (a TensorE matmul against a ones row).
* Unary transcendental and activation functions (``exp log sqrt tanh sigmoid
  relu gelu* silu* softplus mish erf erf_dx sign arctan``): ScalarE ``activation``.
  ``abs square negative invert logical_not``: VectorE ``tensor_scalar``.
  ``reciprocal``: VectorE ``reciprocal`` (the precise one). ``rsqrt``: GpSimd
  ``tensor_scalar(op0=rsqrt)`` (0.5.0 behaviour; PSUM input rejected).
  ``sin``/``cos``/``tan``: range reduction to [-pi, pi] with ``tensor_scalar`` (mod
  2*pi) then ``activation(sin)`` (the ISA activation is valid only on [-pi, pi],
  nki-api-facts.md: 5); ``tan = sin / cos``. ``trunc = x - fmod(x, 1)``,
  ``floor = trunc - (x < trunc)``, ``ceil = trunc + (x > trunc)`` (exact in fp32).
* Reductions: ``tensor_reduce``; ``mean`` sums into fp32 then scales;
  ``var`` = mean of squared deviations (population variance, keepdims shape).
* ``softmax``: ``tensor_reduce(max, negate)``, ``activation(exp, bias=-max)``
  with its free-dim add reduction, ``reciprocal``, ``tensor_scalar(multiply)``.
* ``rms_norm``: ``activation(square)`` with add reduction, ``tensor_scalar``
  (``*1/n + eps``), GpSimd rsqrt, then two multiplies.
* ``load``/``store``: ``dma_copy``; ``load_transpose2d``: ``dma_copy`` of the
  transposed HBM view, recorded with ``attrs["transpose"] = True``; ``copy``:
  ``tensor_copy``; ``matmul``: ``nc_matmul`` (plus ``nc_transpose`` and a
  PSUM->SBUF ``tensor_copy`` of ``x`` when ``transpose_x=False``); ``transpose``:
  ``nc_transpose`` into PSUM; creation with a value: ``memset`` (HBM: an SBUF
  memset tile DMA'd over the tensor).

Decisions where the facts are silent (for docs/nki.md)
------------------------------------------------------
1. **Result dtype.** Tile/tile: the NKI promotion table of the legacy docs
   (float beats int; fp16 with bf16 -> fp32; two fp8 kinds -> bf16; signed with
   a not-narrower unsigned -> the next wider signed type, int64 -> fp32).
   Tile/scalar: the tile's dtype (current docs), except an integer tile with a
   float scalar gives fp32. Comparisons return 1/0 in that dtype.
2. **tile_size values.** ``sbuf_fmax_bytes`` = ``total_available_sbuf_size`` =
   the full per-partition SBUF (192/224/256 KiB): the reserved amount is not
   published, and it is the limit our capacity check enforces. ``sbuf_fmax`` is
   that in fp32 elements. ``sbuf_min_align = 1`` and ``psum_min_align = 4``
   bytes (unpublished; our allocator packs tiles without padding).
   ``psum_num_banks`` is 7 with ``NKI_DMA_TRANSPOSE_AS_PE_TRANSPOSE=true|1`` on
   trn2/trn3, else 8.
3. **Legacy block dims.** ``nl.ndarray((nb, nl.par_dim(128), F))`` on chip is a
   :class:`BlockTensor`: a Python list of ``nb`` separately allocated ``[128, F]``
   tiles (what the migration guide tells users to write), indexed ``t[i]`` /
   ``t[i, p, f]``. In HBM, ``par_dim`` is just its size.
4. **Retargeting.** ``t[...] = <nl call>`` and ``psum += nl.matmul(...)`` write
   the result straight into ``t`` as the compiler does: no extra copy and no
   extra accumulation instruction. The recorded instruction gets ``t`` as its
   destination (values moved over) when that is exactly what re-issuing it would
   record (a DMA, or an SBUF target at the same start partition); otherwise it is
   removed from the log and re-issued into ``t`` (so the ISA checks ``t``); a
   matmul ``+=`` onto a zeroed or open accumulation group is folded by
   ``nisa.accumulate_matmul_result``. This happens only when the value is a
   temporary (no other Python reference; CPython reference count), its
   instructions are the newest in the log and shape, dtype and buffer match;
   otherwise a ``tensor_copy`` / ``dma_copy`` / add is issued.
5. **Legacy matmul accumulation** (``psum += nl.matmul(...)``): a matmul
   accumulation group starts with an overwrite (``accumulate=False``) when the
   PSUM region is uninitialised or was last written by a zero ``memset``
   (``nl.zeros``), and accumulates (``accumulate=True``) when a matmul wrote it
   last - the hardware behaviour of NKI's inferred ``accumulate``. After any other
   writer, the fresh PSUM result is added with ``tensor_tensor`` (a ``memset``
   then matmul-accumulate is UB on v2/v3, nki-api-facts.md: 4.1).
6. **Legacy masks** keep a leading run of each index (``i_p < n``); the
   dimension a mask bounds is the position of its ``arange``/``mgrid`` variable.
   Masked compute ops write only the valid region of a full-shape result tile.
7. **Loops**: ``affine_range``/``sequential_range``/``static_range`` are Python
   ``range`` (legacy kernels get standard Python semantics: a body runs once per
   iteration). ``fori_loop``/``while_loop`` run on the host; ``dynamic_range`` is
   accepted with a DeprecationWarning (removed in NKI 0.7.0).
8. ``num_programs()`` without ``axes`` counts axis 0 (current default) on 1-D
   grids and all axes on legacy multi-dimensional SPMD grids (legacy default).
9. ``device_print`` prints to stdout and is not a recorded instruction.
10. ``no_reorder()`` tags every instruction issued in its (dynamic) scope with
    ``attrs["no_reorder"]`` = scope id (a tuple of ids for nested scopes).
11. ``nl.shared_hbm`` tensors are shared by all programs of a launch (LNC2 cores,
    legacy SPMD instances): each program's k-th unnamed ``shared_hbm`` declaration
    (or the declaration with the same ``name=``) is the same tensor, so
    ``out = nl.ndarray(..., buffer=nl.shared_hbm)`` written piecewise by every
    program is one output. ``nl.hbm``/``private_hbm`` stay private per program.
12. ``nl.rand`` uses VectorE ``rng`` bits on every target (``rand2`` is v4-only),
    scaled so every value is exactly representable in the dtype and below 1.
"""

from __future__ import annotations

import builtins as _b
import contextlib
import itertools
import math
import operator
import os
import sys
import threading
import warnings
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence

import ml_dtypes
import numpy as np

from torchneuron.nki import context
from torchneuron.nki import dtypes as _dtypes
from torchneuron.nki.dtypes import NkiDType
from torchneuron.nki.errors import NkiValidationError, fail
from torchneuron.nki.indexing import MaskExpr, arange, ds, mgrid
from torchneuron.nki.instruction import Instruction
from torchneuron.nki.memory import Allocation, Buffer
from torchneuron.nki.tensor import NkiTensor

__all__ = [  # the public nl namespace (dtypes, buffers and functions)
    "NkiTensor", "NKIObject", "MemoryRegion", "BlockTensor", "tile_size", "par_dim", "ds", "arange", "mgrid",
    "sbuf", "psum", "hbm", "private_hbm", "shared_hbm", "is_sbuf", "is_psum", "is_hbm", "is_on_chip",
    "ndarray", "zeros", "ones", "full", "zeros_like", "empty_like", "ones_like", "rand", "random_seed",
    "shared_constant", "shared_identity_matrix", "load", "store", "load_transpose2d", "copy", "matmul",
    "transpose", "softmax", "rms_norm", "dropout", "where", "broadcast_to", "expand_dims",
    "gather_flattened", "affine_range", "sequential_range", "static_range", "dynamic_range", "fori_loop",
    "while_loop", "no_reorder", "program_id", "num_programs", "program_ndim", "device_print", "nc",
    "spmd_dim", "finfo", "static_cast",
]

# ======================================================================= dtypes
# nki-api-facts.md: 3.8. NkiDType objects compare equal to every spelling
# (strings, numpy / ml_dtypes dtypes, torch dtypes), so legacy code comparing
# ``t.dtype == np.float32`` and current code passing "bfloat16" both work.
_D = _dtypes.DTYPES
bool_ = _D["bool_"]
int8, int16, int32, int64 = _D["int8"], _D["int16"], _D["int32"], _D["int64"]
uint8, uint16, uint32, uint64 = _D["uint8"], _D["uint16"], _D["uint32"], _D["uint64"]
float16, float32, bfloat16, tfloat32 = _D["float16"], _D["float32"], _D["bfloat16"], _D["tfloat32"]
float8_e4m3, float8_e5m2 = _D["float8_e4m3"], _D["float8_e5m2"]
float8_e4m3fn, float8_e8m0fnu = _D["float8_e4m3fn"], _D["float8_e8m0fnu"]
# Legacy constant holders (``nl.fp32.min``); their min/max are the dtype's finite range.
fp32, fp16, bf16, bfp16 = float32, float16, bfloat16, bfloat16
__all__ += [name for name in _D] + ["fp32", "fp16", "bf16", "bfp16"]


def finfo(dtype: Any) -> Any:
    """Legacy ``nl.finfo``: ``ml_dtypes.finfo`` of an NKI float dtype."""
    return ml_dtypes.finfo(_dtype(dtype, "finfo").storage)


# ====================================================================== buffers
MemoryRegion = Buffer  # nki-api-facts.md: 3.1 (``MemoryRegion`` enum)
sbuf = Buffer.sbuf
psum = Buffer.psum
private_hbm = Buffer.private_hbm
hbm = Buffer.private_hbm  # alias of private_hbm
shared_hbm = Buffer.shared_hbm


def is_sbuf(buffer: Buffer) -> bool:
    return _buffer(buffer, "is_sbuf") is Buffer.sbuf


def is_psum(buffer: Buffer) -> bool:
    return _buffer(buffer, "is_psum") is Buffer.psum


def is_hbm(buffer: Buffer) -> bool:
    return _buffer(buffer, "is_hbm").is_hbm


def is_on_chip(buffer: Buffer) -> bool:
    return _buffer(buffer, "is_on_chip").on_chip


class NKIObject:
    """Base class for kernel-side user classes (required by the NKI 0.3 parser; plain here)."""

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

# ============================================================ ISA access, state


def _isa() -> Any:
    """``torchneuron.nki.isa``, imported on first use (isa imports this module's operators)."""
    from torchneuron.nki import isa

    return isa


_local = threading.local()
_scope_ids = itertools.count(1)


def _program() -> int:
    return getattr(context._local, "program", 0)


# ================================================================ normalisers


class ParDim(int):
    """Legacy ``nl.par_dim(n)``: marks the partition dimension inside a shape."""

    def __repr__(self) -> str:
        return f"nl.par_dim({int(self)})"


def par_dim(size: int) -> ParDim:
    """Legacy: mark ``size`` as the partition dim of a shape (``(nb, nl.par_dim(128), F)``)."""
    return ParDim(_int(size, "par_dim"))


def _int(value: Any, op: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"nl.{op}: expected an int, got {type(value).__name__} {value!r}")
    return int(value)


def _dtype(dtype: Any, op: str) -> NkiDType:
    if dtype is None:
        raise TypeError(f"nl.{op}: dtype is required (e.g. nl.float32)")
    return _dtypes.resolve(dtype)


def _buffer(buffer: Any, op: str, default: Buffer = Buffer.sbuf) -> Buffer:
    """A Buffer; legacy ``buffer=None`` means sbuf; strings are rejected (NKI 0.3.0)."""
    if buffer is None:
        return default
    if isinstance(buffer, Buffer):
        return buffer
    if isinstance(buffer, str):
        raise TypeError(f"nl.{op}: buffer names as strings were removed in NKI 0.3.0; pass "
                        f"nl.{buffer if buffer in Buffer.__members__ else 'sbuf'} (one of nl.sbuf, nl.psum, "
                        "nl.hbm, nl.private_hbm, nl.shared_hbm), got {buffer!r}")
    raise TypeError(f"nl.{op}: buffer must be nl.sbuf, nl.psum, nl.hbm, nl.private_hbm or nl.shared_hbm, "
                    f"got {buffer!r}")


def _shape(shape: Any, op: str) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(block dims, tile dims) of a shape; block dims precede a legacy ``nl.par_dim``."""
    dims = [shape] if isinstance(shape, (int, np.integer)) else list(shape)
    marks = [i for i, d in enumerate(dims) if isinstance(d, ParDim)]
    ints = tuple(_int(d, op) for d in dims)
    if _b.any(d <= 0 for d in ints):
        raise ValueError(f"nl.{op}: every dimension must be positive, got shape {list(ints)}")
    if len(marks) > 1:
        raise ValueError(f"nl.{op}: a shape has one partition dimension, got nl.par_dim at positions {marks}")
    split = marks[0] if marks else 0
    return ints[:split], ints[split:]


def _is_scalar(value: Any) -> bool:
    return isinstance(value, (int, float, np.number, np.bool_)) or (
        isinstance(value, np.ndarray) and value.ndim == 0)


def _scalar(value: Any) -> float | int:
    value = value.item() if isinstance(value, (np.ndarray, np.generic)) else value
    return int(value) if isinstance(value, (bool, int)) else float(value)


def _tile(value: Any, op: str, what: str = "x") -> NkiTensor:
    if isinstance(value, NkiTensor):
        return value
    if isinstance(value, BlockTensor):
        raise TypeError(f"nl.{op}: {what} is a legacy block tensor {list(value.shape)} (dims before "
                        "nl.par_dim); index it to get a tile, e.g. t[i]")
    raise TypeError(f"nl.{op}: {what} must be a tile (NkiTensor), got {type(value).__name__}")


def _on_chip(value: NkiTensor, op: str, what: str = "x") -> NkiTensor:
    if not value.on_chip:
        fail(op, f"{what} {value.name!r} is in {value.buffer.value}; compute engines read SBUF or PSUM "
             "tiles: load it first with nl.load (or nisa.dma_copy)")
    return value


_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
_OUTSIDE: dict[Any, bool] = {}  # code object -> defined outside torchneuron.nki


def _name(name: str, op: str) -> str:
    """``name``, or ``op@file.py:line`` of the kernel line allocating (cheaper than kernel_location)."""
    if name:
        return name
    frame = sys._getframe(1)
    while frame is not None:
        code = frame.f_code
        outside = _OUTSIDE.get(code)
        if outside is None:
            outside = _OUTSIDE[code] = not os.path.abspath(code.co_filename).startswith(_PACKAGE_DIR)
        if outside:
            return f"{op}@{os.path.basename(code.co_filename)}:{frame.f_lineno}"
        frame = frame.f_back
    return op


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
    alloc = Allocation.create(buf, dims, dt, name, fill=run.compute_values)
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


def _reject_legacy_kwargs(op: str, kwargs: dict) -> None:
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
    _isa().tensor_scalar(dst=raw, data=raw, op0=right_shift, operand0=32 - bits)
    return _emit(out, lambda dst: _isa().tensor_scalar(dst=dst, data=raw, op0=multiply, operand0=2.0 ** -bits))


def random_seed(seed: NkiTensor, **legacy: Any) -> None:
    """Seed the random generator from a ``[1, 1]`` int32 SBUF/PSUM tile (``set_rng_seed``)."""
    legacy.pop("mask", None)
    _reject_legacy_kwargs("random_seed", legacy)
    seed = _on_chip(_tile(seed, "random_seed", "seed"), "random_seed", "seed")
    if seed.size != 1:
        fail("random_seed", f"the seed must be a [1, 1] tile, got shape {list(seed.shape)}")
    _isa().set_rng_seed(src_seeds=seed)


# ================================================================ block tensors


class BlockTensor:
    """A legacy on-chip tensor with block dims before its partition dim (``nl.par_dim``).

    It is a Python list of separately allocated tiles (decision 3): ``t[i]`` is
    tile ``i`` (``t[i, j]`` for two block dims), ``t[i, p, f]`` indexes into it,
    and ``t[i, ...] = x`` assigns into it. Compute functions take tiles, not
    block tensors, as in legacy NKI.
    """

    def __init__(self, block_shape: tuple[int, ...], tiles: list[NkiTensor], name: str) -> None:
        self.block_shape = tuple(block_shape)
        self.tiles = tiles
        self._name = name

    @property
    def shape(self) -> tuple[int, ...]:
        return self.block_shape + tuple(self.tiles[0].shape)

    @property
    def dtype(self) -> NkiDType:
        return self.tiles[0].dtype

    @property
    def buffer(self) -> Buffer:
        return self.tiles[0].buffer

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def name(self) -> str:
        return self._name

    def __len__(self) -> int:
        return self.block_shape[0]

    def __repr__(self) -> str:
        return (f"BlockTensor(name={self._name!r}, blocks={list(self.block_shape)}, "
                f"tile={list(self.tiles[0].shape)}, dtype={self.dtype.name}, buffer={self.buffer.value})")

    def __getitem__(self, key: Any) -> "NkiTensor | BlockTensor":
        keys = list(key) if isinstance(key, tuple) else [key]
        if keys and keys[0] is Ellipsis and len(keys) == 1:
            return self
        nb = len(self.block_shape)
        head, rest = keys[:nb], keys[nb:]
        if len(head) < nb or not _b.all(isinstance(k, (int, np.integer)) and not isinstance(k, bool)
                                         for k in head):
            raise IndexError(f"legacy block tensor {self._name!r} (blocks {list(self.block_shape)}) is "
                             f"indexed with one integer per block dim first, e.g. t[i] or t[i, :, :]; "
                             f"got {key!r}")
        flat = 0
        for k, n in zip(head, self.block_shape):
            k = int(k)
            if not -n <= k < n:
                fail("index", f"block index {k} is out of bounds for block dim of size {n} of {self._name!r}")
            flat = flat * n + (k % n)
        tile = self.tiles[flat]
        return tile[tuple(rest)] if rest else tile

    def __setitem__(self, key: Any, value: Any) -> None:
        target = self[key]
        if not isinstance(target, NkiTensor):
            raise IndexError(f"assign into one tile of block tensor {self._name!r} at a time (t[i] = x)")
        if isinstance(value, NkiTensor) and value.same_memory(target):
            return  # result of an in-place ``t[i, ...] += x``
        _assign(target, value)


# ============================================================ instruction issue


@dataclass
class _Fresh:
    """The newest ``nl`` result: how to re-issue its final instruction into another destination."""

    result: "weakref.ref[NkiTensor]"
    run: Any
    instructions: tuple[Instruction, ...]
    reissue: Callable[..., None]
    kind: str
    region: tuple[int, ...] | None = None  # leading sub-box of the result the instruction wrote


def _mine_since(run: Any, marker: Instruction | None) -> list[Instruction]:
    """Instructions this program appended after ``marker`` (its newest one before the call)."""
    program = _program()
    found: list[Instruction] = []
    for ins in reversed(run.instructions):
        if ins is marker:
            break
        if ins.program == program:
            found.append(ins)
    found.reverse()
    return found


def _last_mine(run: Any) -> Instruction | None:
    program = _program()
    for ins in reversed(run.instructions):
        if ins.program == program:
            return ins
    return None


def _issue(call: Callable[[], Any], tag: dict | None = None) -> list[Instruction]:
    """Run one ISA call; tag the instructions it recorded with ``tag`` attrs (if not set by isa)."""
    run = context.current()
    marker = _last_mine(run)
    call()
    new = _mine_since(run, marker)
    if tag:
        for ins in new:
            for key, value in tag.items():
                ins.attrs.setdefault(key, value)
    return new


def _emit(out: NkiTensor, issue: Callable[..., Any], kind: str = "", region: tuple[int, ...] | None = None,
          **kw: Any) -> NkiTensor:
    """Issue ``issue(out)`` - the final instruction producing ``out`` - and remember it for retargeting."""
    run = context.current()
    marker = _last_mine(run)
    issue(out, **kw)
    new = tuple(_mine_since(run, marker))
    _local.fresh = _Fresh(weakref.ref(out), run, new, issue, kind, region)
    return out


def _take_fresh(value: Any) -> _Fresh | None:
    """The retarget record of ``value`` if it is the newest result and its instructions end the log."""
    fresh = getattr(_local, "fresh", None)
    if fresh is None or fresh.result() is not value:
        return None
    _local.fresh = None
    if fresh.run is not context.maybe_current() or not _is_tail(fresh):
        return None  # something ran since (it may have read the value): keep the copy
    return fresh


def _is_tail(fresh: _Fresh) -> bool:
    log, n = fresh.run.instructions, len(fresh.instructions)
    return len(log) >= n and _b.all(a is b for a, b in zip(log[len(log) - n:], fresh.instructions))


def _retract(fresh: _Fresh) -> None:
    """Remove ``fresh``'s instructions from the log (they are its newest entries; nothing refers to them)."""
    with fresh.run._lock:
        if fresh.instructions and _is_tail(fresh):
            del fresh.run.instructions[-len(fresh.instructions):]


def _retarget(target: NkiTensor, value: NkiTensor, temporary: bool, **kw: Any) -> bool:
    """Write the temporary ``value`` straight into ``target`` (decision 4); False if not possible."""
    if not temporary:
        return False
    fresh = _take_fresh(value)
    if fresh is None:
        return False
    if (target.shape != value.shape or target.dtype != value.dtype or target.buffer is not value.buffer
            or target.is_partial):
        return False
    if not kw and _move_result(fresh, value, target):
        return True
    _retract(fresh)
    fresh.reissue(target, **kw)
    return True


def _move_result(fresh: _Fresh, value: NkiTensor, target: NkiTensor) -> bool:
    """Retarget without running the instruction twice: its destination operand becomes ``target``.

    Done when the recorded instruction with ``target`` as ``dst`` is exactly what
    a re-issue would check and record: ``target`` has ``value``'s shape, dtype and
    buffer, and either the instruction is a DMA (no partition-placement rules)
    or both start at the same SBUF partition. The values it wrote are moved over.
    Otherwise (PSUM, another start partition) the caller re-issues it.
    """
    if len(fresh.instructions) != 1:
        return False
    ins = fresh.instructions[0]
    if ins.opcode != "dma_copy" and (target.buffer is not Buffer.sbuf
                                     or target.start_partition != value.start_partition):
        return False
    old_id = value.operand().allocation
    written = [w for w in ins.writes if w.allocation == old_id]
    if len(written) != 1:
        return False
    box = tuple(fresh.region) if fresh.region is not None else tuple(written[0].shape)
    if len(box) != value.ndim:
        return False
    src, dst = value[_region(box)], target[_region(box)]
    new = dst.operand()
    ins.writes = tuple(new if w.allocation == old_id else w for w in ins.writes)
    ins.reads = tuple(new if r.allocation == old_id else r for r in ins.reads)
    dst.write(src.values())
    return True


# Reference count of a temporary argument at the first line of _assign/_accumulate
# when reached from NkiTensor.__setitem__/__iadd__ or BlockTensor.__setitem__
# (CPython 3.11: the callee frames hold it twice, plus getrefcount's own).
_TEMPORARY_REFS = 4


def _is_temporary(refs: int) -> bool:
    return refs <= _TEMPORARY_REFS


# ================================================================= data movement


def _valid(t: NkiTensor) -> tuple[int, ...]:
    return tuple(t.valid_shape)


def _region(shape: Sequence[int]) -> tuple[slice, ...]:
    return tuple(slice(0, n) for n in shape)


def _mask_shape(mask: Any, shape: tuple[int, ...], op: str) -> tuple[int, ...]:
    """The valid (leading) extent per dim of a legacy ``mask=`` over a tile of ``shape`` (decision 6)."""
    if mask is None:
        return shape
    if isinstance(mask, (bool, np.bool_)):
        return shape if mask else tuple(0 for _ in shape)
    if not isinstance(mask, MaskExpr):
        raise TypeError(f"nl.{op}: mask must be a comparison of nl.arange/nl.mgrid indices, e.g. "
                        f"mask=(i * 128 + i_p < n); got {mask!r}")
    valid = list(shape)
    for term in mask.terms:
        expr = term[0]
        dim = expr.position
        if not 0 <= dim < len(shape):
            fail(op, f"mask bounds index position {dim}, but the tile has {len(shape)} dims")
        try:
            count = expr.valid_count(MaskExpr((term,)))
        except IndexError as exc:
            fail(op, f"{exc}")
        valid[dim] = _b.min(valid[dim], count)
    return tuple(valid)


def _masked(t: NkiTensor, valid: tuple[int, ...]) -> NkiTensor:
    return t if tuple(valid) == tuple(t.shape) else t[_region(valid)]


def _elementwise_min(*shapes: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(_b.min(dims) for dims in zip(*shapes))


def load(src: NkiTensor, dtype: Any = None, *, mask: Any = None, **legacy: Any) -> NkiTensor:
    """Copy HBM ``src`` into a new SBUF tile of ``src.shape`` (dim 0 becomes the partitions).

    Legacy masked / clipped views (``a[i * 128 + i_p, i_f]`` past the edge,
    ``mask=``) load only the valid region; the rest of the tile stays uninitialised.
    """
    _reject_legacy_kwargs("load", legacy)
    src = _tile(src, "load", "src")
    if src.on_chip:
        fail("load", f"src {src.name!r} is already on chip ({src.buffer.value}); nl.load reads HBM - "
             "use nl.copy for an on-chip copy")
    dt = _dtypes.resolve(dtype) if dtype is not None else src.dtype
    out = _tile(_allocate(src.shape, dt, sbuf, "", "load"), "load")
    valid = _elementwise_min(_valid(src), _mask_shape(mask, src.shape, "load"))
    src_part = _masked(src, valid) if src.is_partial or valid != src.shape else src

    def issue(dst: NkiTensor) -> None:
        _isa().dma_copy(dst=_masked(dst, valid), src=src_part)

    return _emit(out, issue, "load", region=valid)


def store(dst: NkiTensor, value: NkiTensor, *, mask: Any = None, **legacy: Any) -> None:
    """Copy an SBUF tile into HBM ``dst`` (legacy: a PSUM value is first copied to SBUF)."""
    _reject_legacy_kwargs("store", legacy)
    dst = _tile(dst, "store", "dst")
    value = _tile(value, "store", "value")
    if dst.on_chip:
        fail("store", f"dst {dst.name!r} is in {dst.buffer.value}; nl.store writes HBM - use "
             "dst[...] = value or nisa.tensor_copy for on-chip copies")
    valid = _mask_shape(mask, dst.shape, "store")
    if dst.is_partial or valid != dst.shape:
        if value.ndim != dst.ndim:
            fail("store", f"a masked/clipped store needs value and dst of the same rank, got "
                 f"{list(value.shape)} and {list(dst.shape)}")
        valid = _elementwise_min(valid, _valid(dst), value.shape)
        dst, value = _masked(dst, valid), _masked(value, valid)
    _copy_to_hbm(dst, value, "store")


def _copy_to_hbm(dst: NkiTensor, value: NkiTensor, op: str) -> None:
    if value.size != dst.size:
        fail(op, f"value {value.name!r} has {value.size} elements (shape {list(value.shape)}) but dst "
             f"{dst.name!r} has {dst.size} (shape {list(dst.shape)}); DMA element counts must match")
    if value.buffer is Buffer.psum:  # DMA cannot read PSUM (0.3.0): legacy implicit copy
        staged = _tile(_allocate(value.shape, value.dtype, sbuf, "", op), op)
        _isa().tensor_copy(dst=staged, src=value)
        value = staged
    _isa().dma_copy(dst=dst, src=value)


def load_transpose2d(src: NkiTensor, dtype: Any = None, *, mask: Any = None, **legacy: Any) -> NkiTensor:
    """Load 2-D HBM ``src`` ``[A, B]`` as an SBUF tile ``[B, A]`` (a slow transposing DMA).

    Recorded as a ``dma_copy`` of the transposed HBM view with
    ``attrs["transpose"] = True`` (the cost model charges it element-wise).
    """
    _reject_legacy_kwargs("load_transpose2d", legacy)
    src = _tile(src, "load_transpose2d", "src")
    if src.on_chip or src.ndim != 2:
        fail("load_transpose2d", f"src must be a 2-D HBM tensor, got {src.buffer.value} shape {list(src.shape)}")
    valid = _elementwise_min(_valid(src), _mask_shape(mask, src.shape, "load_transpose2d"))
    dt = _dtypes.resolve(dtype) if dtype is not None else src.dtype
    out = _tile(_allocate((src.shape[1], src.shape[0]), dt, sbuf, "", "load_transpose2d"), "load_transpose2d")
    src_t = _masked(src, valid).permute((1, 0))

    def issue(dst: NkiTensor) -> None:
        _issue(lambda: _isa().dma_copy(dst=_masked(dst, (valid[1], valid[0])), src=src_t),
               tag={"transpose": True})

    return _emit(out, issue, "load_transpose2d", region=(valid[1], valid[0]))


def copy(x: NkiTensor, dtype: Any = None, *, mask: Any = None, **legacy: Any) -> NkiTensor:
    """A new SBUF copy of an SBUF or PSUM tile (``tensor_copy``), e.g. a matmul result out of PSUM."""
    _reject_legacy_kwargs("copy", legacy)
    x = _on_chip(_tile(x, "copy"), "copy")
    dt = _dtypes.resolve(dtype) if dtype is not None else x.dtype
    out = _tile(_allocate(x.shape, dt, sbuf, "", "copy"), "copy")
    valid = _mask_shape(mask, x.shape, "copy")
    src = _masked(x, valid)
    return _emit(out, lambda dst: _isa().tensor_copy(dst=_masked(dst, valid), src=src), "copy")


def static_cast(x: NkiTensor, dtype: Any) -> NkiTensor:
    """Legacy ``nl.static_cast``: a copy converted to ``dtype``."""
    return copy(x, dtype)


# ====================================================================== matmul


def matmul(x: NkiTensor, y: NkiTensor, transpose_x: bool = False, *, mask: Any = None,
           **legacy: Any) -> NkiTensor:
    """``x @ y`` (``x.T @ y`` with ``transpose_x=True``) into a new fp32 PSUM tile (nki-api-facts.md: 3.2).

    TensorE contracts over the partition dim, so with ``transpose_x=False`` ``x``
    ``[M, K]`` is first transposed (``nc_transpose`` into PSUM, ``tensor_copy`` back
    to SBUF) as the docs describe; ``transpose_x=True`` takes ``x`` as ``[K, M]``.
    """
    _reject_legacy_kwargs("matmul", legacy)
    x = _on_chip(_tile(x, "matmul"), "matmul")
    y = _on_chip(_tile(y, "matmul", "y"), "matmul", "y")
    if transpose_x:
        stationary = x
    else:
        if x.ndim != 2:
            fail("matmul", f"x must be a 2-D tile [M, K] when transpose_x=False, got {list(x.shape)}")
        xt_psum = _tile(_allocate((x.shape[1], x.shape[0]), x.dtype, psum, "", "matmul.transpose"), "matmul")
        _isa().nc_transpose(dst=xt_psum, data=x)
        stationary = _tile(_allocate(xt_psum.shape, x.dtype, sbuf, "", "matmul.transpose"), "matmul")
        _isa().tensor_copy(dst=stationary, src=xt_psum)
        del xt_psum
    shape = (stationary.free_size,) + tuple(y.shape[1:])
    valid = _mask_shape(mask, shape, "matmul")
    if valid != shape:
        if len(valid) != 2 or y.ndim != 2 or stationary.ndim != 2:
            fail("matmul", "a masked matmul needs 2-D operands")
        stationary, y = stationary[:, 0:valid[0]], y[:, 0:valid[1]]
    out = _tile(_allocate(shape, float32, psum, "", "matmul"), "matmul")

    def issue(dst: NkiTensor, accumulate: bool = False) -> None:
        _isa().nc_matmul(dst=_masked(dst, valid), stationary=stationary, moving=y, accumulate=accumulate)

    return _emit(out, issue, "matmul")


def transpose(x: NkiTensor, dtype: Any = None, *, mask: Any = None, **legacy: Any) -> NkiTensor:
    """Swap the partition and free dims of a 2-D tile into a new PSUM tile (``nc_transpose``)."""
    _reject_legacy_kwargs("transpose", legacy)
    if mask is not None:
        raise TypeError("nl.transpose: mask= is not supported; slice the input instead")
    x = _on_chip(_tile(x, "transpose"), "transpose")
    src = x if x.ndim == 2 else x.reshape((x.shape[0], x.free_size))
    out = _tile(_allocate((src.shape[1], src.shape[0]), x.dtype, psum, "", "transpose"), "transpose")
    _emit(out, lambda dst: _isa().nc_transpose(dst=dst, data=src), "transpose")
    dt = _dtypes.resolve(dtype) if dtype is not None else x.dtype
    if dt == x.dtype:
        return out
    cast = _tile(_allocate(out.shape, dt, psum, "", "transpose"), "transpose")
    return _emit(cast, lambda dst: _isa().tensor_copy(dst=dst, src=out), "copy")


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

    fn.__name__ = fn.__qualname__ = name
    fn.__doc__ = f"{doc} element-wise; ``x``/``y`` are tiles or scalars (lowering: module docstring)."
    fn.__module__ = __name__
    return _op(name)(fn)


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

    fn.__name__ = fn.__qualname__ = name
    fn.__doc__ = f"{doc} element-wise (ScalarE ``activation``)."
    fn.__module__ = __name__
    return _op(name)(fn)


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

    fn.__name__ = fn.__qualname__ = name
    fn.__doc__ = f"{doc} element-wise (VectorE ``tensor_scalar``)."
    fn.__module__ = __name__
    return _op(name)(fn)


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


# ================================================================= reductions


def _axes(x: NkiTensor, axis: Any, op: str) -> tuple[int, ...]:
    """Validate reduction axes: free dims only, trailing and contiguous (nki-api-facts.md: 3.5)."""
    raw = list(axis) if isinstance(axis, (tuple, list)) else [axis]
    if not raw:
        fail(op, "axis must name at least one free dimension")
    axes = []
    for a in raw:
        a = _int(a, op)
        if a < 0:
            a += x.ndim
        axes.append(a)
    axes = sorted(set(axes))
    if axes[0] <= 0 or axes[-1] >= x.ndim:
        fail(op, f"axis {list(raw)} must be free dims of the {x.ndim}-D tile {list(x.shape)} (1..{x.ndim - 1}); "
             "the partition dim 0 cannot be reduced - transpose first or use nisa.tensor_partition_reduce")
    if axes != list(range(axes[0], x.ndim)):
        fail(op, f"axis {list(raw)} must be the trailing contiguous free dims, e.g. [{x.ndim - 1}] or "
             f"{list(range(1, x.ndim))}")
    return tuple(axes)


def _reduced_shape(shape: Sequence[int], axes: tuple[int, ...], keepdims: bool) -> tuple[int, ...]:
    if keepdims:
        return tuple(1 if d in axes else n for d, n in enumerate(shape))
    return tuple(n for d, n in enumerate(shape) if d not in axes)


def _reduce(name: str, op: Any, x: Any, axis: Any, dtype: Any, keepdims: bool, mask: Any = None,
            negate: bool = False) -> NkiTensor:
    x = _on_chip(_tile(x, name), name)
    axes = _axes(x, axis, name)
    valid = _mask_shape(mask, x.shape, name)
    data = _masked(x, valid)
    out = _tile(_allocate(_reduced_shape(x.shape, axes, keepdims), _result_dtype(dtype, x), sbuf, "", name), name)
    out_valid = _reduced_shape(valid, axes, keepdims)
    return _emit(out, lambda dst: _isa().tensor_reduce(dst=_masked(dst, out_valid), op=op, data=data, axis=axes,
                                                       negate=negate, keepdims=keepdims))


def _into_full(result: NkiTensor, shape: tuple[int, ...], valid: tuple[int, ...], op: str) -> NkiTensor:
    """A legacy-masked composite result (computed on the valid region) placed in a full-shape tile."""
    if tuple(valid) == tuple(shape):
        return result
    out = _tile(_allocate(shape, result.dtype, sbuf, "", op), op)
    _isa().tensor_copy(dst=out[_region(result.shape)], src=result)
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
    x = _on_chip(_tile(x, "mean"), "mean")
    axes = _axes(x, axis, "mean")
    valid = _mask_shape(mask, x.shape, "mean")
    data = _masked(x, valid)
    total = _reduce("mean", add, data, axes, float32, keepdims)
    n = math.prod(data.shape[d] for d in axes)
    out = _tile(_allocate(_reduced_shape(x.shape, axes, keepdims), _result_dtype(dtype, x), sbuf, "", "mean"),
                "mean")
    out_valid = _reduced_shape(valid, axes, keepdims)
    return _emit(out, lambda dst: _isa().tensor_scalar(dst=_masked(dst, out_valid), data=total, op0=multiply,
                                                       operand0=1.0 / n))


def var(x: Any, axis: Any, dtype: Any = None, keepdims: bool = False, *, mask: Any = None) -> NkiTensor:
    """Population variance over ``axis`` in fp32; the result always has the keepdims shape (as documented)."""
    x = _on_chip(_tile(x, "var"), "var")
    axes = _axes(x, axis, "var")
    valid = _mask_shape(mask, x.shape, "var")
    data = _masked(x, valid)
    n = math.prod(data.shape[d] for d in axes)
    mu = mean(data, axes, float32, keepdims=True)
    centered = subtract(data, mu, float32)
    squares = multiply(centered, centered, float32)
    total = _reduce("var", add, squares, axes, float32, True)
    out = _tile(_allocate(_reduced_shape(x.shape, axes, True), _result_dtype(dtype, x), sbuf, "", "var"), "var")
    out_valid = _reduced_shape(valid, axes, True)
    return _emit(out, lambda dst: _isa().tensor_scalar(dst=_masked(dst, out_valid), data=total, op0=multiply,
                                                       operand0=1.0 / n))


# ======================================================== activations and norms


def _covers_all_free(x: NkiTensor, axes: tuple[int, ...]) -> bool:
    return axes == tuple(range(1, x.ndim))


def softmax(x: Any, axis: Any = -1, dtype: Any = None, compute_dtype: Any = None, *,
            mask: Any = None) -> NkiTensor:
    """``exp(x - max) / sum(exp(x - max))`` over the free ``axis`` (fp32 intermediates)."""
    x = _on_chip(_tile(x, "softmax"), "softmax")
    valid = _mask_shape(mask, x.shape, "softmax")
    if valid != x.shape:
        return _into_full(softmax(_masked(x, valid), axis, dtype, compute_dtype), x.shape, valid, "softmax")
    axes = _axes(x, axis, "softmax")
    cdt = _dtypes.resolve(compute_dtype) if compute_dtype is not None else float32
    out_dtype = _result_dtype(dtype, x)
    isa = _isa()
    if _covers_all_free(x, axes):
        p = x.shape[0]
        neg_max = _tile(_allocate(_reduced_shape(x.shape, axes, True), float32, sbuf, "", "softmax"), "softmax")
        isa.tensor_reduce(dst=neg_max, op=maximum, data=x, axis=axes, negate=True, keepdims=True)
        e = _tile(_allocate(x.shape, cdt, sbuf, "", "softmax"), "softmax")
        total = _tile(_allocate((p, 1), float32, sbuf, "", "softmax"), "softmax")
        isa.activation(dst=e, op=exp, data=x, bias=_column(neg_max), scale=1.0, reduce_op=add,
                       reduce_res=total, reduce_cmd=isa.reduce_cmd.reset_reduce)
        inv = _tile(_allocate((p, 1), float32, sbuf, "", "softmax"), "softmax")
        isa.reciprocal(dst=inv, data=total)
        out = _tile(_allocate(x.shape, out_dtype, sbuf, "", "softmax"), "softmax")
        return _emit(out, lambda dst: isa.tensor_scalar(dst=dst, data=e, op0=multiply, operand0=inv))
    top = max(x, axes, float32, keepdims=True)
    e = exp(subtract(x, top, cdt), cdt)
    total = sum(e, axes, float32, keepdims=True)
    return multiply(e, reciprocal(total, float32), out_dtype)


def rms_norm(x: Any, w: Any, axis: Any, n: Any, epsilon: float = 1e-06, dtype: Any = None,
             compute_dtype: Any = None, *, mask: Any = None) -> NkiTensor:
    """``x / sqrt(sum(x**2, axis) / n + epsilon) * w`` (fp32 intermediates unless ``compute_dtype``)."""
    x = _on_chip(_tile(x, "rms_norm"), "rms_norm")
    valid = _mask_shape(mask, x.shape, "rms_norm")
    if valid != x.shape:
        w_part = _masked(w, valid) if isinstance(w, NkiTensor) and w.shape == x.shape else w
        return _into_full(rms_norm(_masked(x, valid), w_part, axis, n, epsilon, dtype, compute_dtype),
                          x.shape, valid, "rms_norm")
    axes = _axes(x, axis, "rms_norm")
    cdt = _dtypes.resolve(compute_dtype) if compute_dtype is not None else float32
    isa = _isa()
    if _covers_all_free(x, axes):
        squares = _tile(_allocate(x.shape, cdt, sbuf, "", "rms_norm"), "rms_norm")
        total = _tile(_allocate((x.shape[0], 1), float32, sbuf, "", "rms_norm"), "rms_norm")
        isa.activation(dst=squares, op=square, data=x, reduce_op=add, reduce_res=total,
                       reduce_cmd=isa.reduce_cmd.reset_reduce)
        del squares
    else:
        total = sum(square(x, cdt), axes, float32, keepdims=True)
    ms = _tile(_allocate(total.shape, float32, sbuf, "", "rms_norm"), "rms_norm")
    isa.tensor_scalar(dst=ms, data=total, op0=multiply, operand0=1.0 / float(n), op1=add,
                      operand1=float(epsilon))
    scale = rsqrt(ms, float32)
    normed = multiply(x, scale, cdt)
    return multiply(normed, w, _result_dtype(dtype, x))


def dropout(x: Any, rate: Any, dtype: Any = None, *, mask: Any = None) -> NkiTensor:
    """Zero elements with probability ``rate`` (a scalar or ``(P, 1)`` tile) (VectorE ``dropout``)."""
    x, out, valid = _unary_out("dropout", x, dtype, mask)
    data = _masked(x, valid)
    prob = _column(_masked(rate, (valid[0], 1))) if isinstance(rate, NkiTensor) else _scalar(rate)
    return _emit(out, lambda dst: _isa().dropout(dst=_masked(dst, valid), data=data, prob=prob))


# ================================================ manipulation and selection


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
        fail("broadcast_to", f"partition broadcast (1 -> {shape[0]}) runs on TensorE, which takes float "
             f"inputs; {x.name!r} is {x.dtype.name}")
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


def expand_dims(x: Any, axis: Any) -> NkiTensor:
    """A view of ``x`` with new size-1 dims at ``axis`` (an int or a sequence of ints)."""
    x = _tile(x, "expand_dims")
    axes = sorted(axis) if isinstance(axis, (tuple, list)) else [axis]
    for a in axes:
        a = _int(a, "expand_dims")
        x = x.expand_dim(a if a >= 0 else a + x.ndim + 1)
    return x


def where(condition: Any, x: Any, y: Any, dtype: Any = None, *, mask: Any = None) -> NkiTensor:
    """``x`` where ``condition`` (a 1.0 / 0.0 tile) is non-zero, else ``y``.

    Lowered to ``out = y`` (``tensor_copy``, or ``memset`` for a scalar) then
    ``tensor_copy_predicated(out, x, predicate=condition)``; a float condition is
    read as its bit pattern (``.view`` as an unsigned type: 0.0 is false).
    """
    cond = _on_chip(_tile(condition, "where", "condition"), "where", "condition")
    tiles = [t for t in (cond, x, y) if isinstance(t, NkiTensor)]
    shape = _broadcast_shape("where", *tiles)
    valid = _mask_shape(mask, shape, "where")
    values = [v for v in (x, y) if isinstance(v, NkiTensor)]
    out_dtype = _result_dtype(dtype, *values, *[v for v in (x, y) if _is_scalar(v)]) if values else \
        _result_dtype(dtype, cond, *(v for v in (x, y) if _is_scalar(v)))
    out = _tile(_allocate(shape, out_dtype, sbuf, "", "where"), "where")
    region = _masked(out, valid)
    if isinstance(y, NkiTensor):
        _isa().tensor_copy(dst=region, src=_masked(_expand(_on_chip(y, "where", "y"), shape, "where"), valid))
    else:
        _issue(lambda: _isa().memset(dst=region, value=_fill_value(y, out_dtype, "where")))
    if isinstance(x, NkiTensor):
        src = _expand(_on_chip(x, "where", "x"), shape, "where")
        if src.dtype != out_dtype:
            src = copy(src, out_dtype)
    else:
        src = full(shape, x, out_dtype, name="where.x")
    src = _masked(src, valid)
    pred = _masked(_expand(cond, shape, "where"), valid)
    if pred.dtype.name not in ("uint8", "uint16", "uint32"):
        pred = pred.view(_D[f"uint{pred.dtype.itemsize * 8}"])
    _isa().tensor_copy_predicated(dst=region, src=src, predicate=pred)
    return out


def gather_flattened(data: Any, indices: Any, axis: int = 0, dtype: Any = None, *, mask: Any = None,
                     **legacy: Any) -> NkiTensor:
    """Per partition, gather ``data``'s flattened free elements at uint32 ``indices`` (``nc_n_gather``)."""
    _reject_legacy_kwargs("gather_flattened", legacy)
    data = _on_chip(_tile(data, "gather_flattened", "data"), "gather_flattened", "data")
    indices = _on_chip(_tile(indices, "gather_flattened", "indices"), "gather_flattened", "indices")
    if axis not in (0, -1, 1):
        fail("gather_flattened", f"axis={axis}: the gather runs within each partition over the flattened "
             "free dims")
    out = _tile(_allocate(indices.shape, data.dtype, sbuf, "", "gather_flattened"), "gather_flattened")
    _emit(out, lambda dst: _isa().nc_n_gather(dst=dst, data=data, indices=indices))
    dt = _dtypes.resolve(dtype) if dtype is not None else data.dtype
    return out if dt == data.dtype else copy(out, dt)


# ===================================================== loops and control flow


def _range(op: str, start: Any, stop: Any, step: Any) -> range:
    if stop is None:
        start, stop = 0, start
    return range(_int(start, op), _int(stop, op), _int(step, op))


def affine_range(start: Any, stop: Any = None, step: Any = 1, **legacy: Any) -> range:
    """Alias of Python ``range`` (deprecated in current NKI: prefer ``range``)."""
    return _range("affine_range", start, stop, step)


def sequential_range(start: Any, stop: Any = None, step: Any = 1, **legacy: Any) -> range:
    """Alias of Python ``range`` (deprecated in current NKI: prefer ``range``)."""
    return _range("sequential_range", start, stop, step)


def static_range(start: Any, stop: Any = None, step: Any = 1, **legacy: Any) -> range:
    """Alias of Python ``range`` (deprecated in current NKI: prefer ``range``)."""
    return _range("static_range", start, stop, step)


def dynamic_range(start: Any, stop: Any = None, step: Any = 1) -> range:
    """Removed in NKI 0.7.0: runs as ``range`` with a DeprecationWarning; use :func:`fori_loop`."""
    warnings.warn("nl.dynamic_range was removed in NKI 0.7.0; use nl.fori_loop(lower, upper, body)",
                  DeprecationWarning, stacklevel=2)
    return range(_register_value(start if stop is not None else 0),
                 _register_value(stop if stop is not None else start), _int(step, "dynamic_range"))


def _register_value(value: Any) -> int:
    """The integer held by a loop bound: an int or an ISA register."""
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        return int(value)
    for attr in ("value", "_value"):
        held = getattr(value, attr, None)
        if isinstance(held, (int, np.integer)):
            return int(held)
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"a loop bound must be an int or a register (nisa.register_alloc), got "
                        f"{type(value).__name__}") from None


def _no_dynamic_loop_in_no_reorder(op: str) -> None:
    if getattr(_local, "no_reorder", ()):
        fail(op, f"nl.{op} is not allowed inside nl.no_reorder() (nki-api-facts.md: 3.7); move the loop out "
             "or use a static range() loop")


def fori_loop(lower: Any, upper: Any, body_fun: Callable[[Any], Any], step: int = 1) -> None:
    """Runtime loop ``for i in range(lower, upper, step): body_fun(i)``; bounds may be registers.

    ``i`` is a ``nisa.VirtualRegister`` (its value lives on the device: it feeds
    register instructions, not Python arithmetic), as in NKI 0.6/0.7.
    """
    _no_dynamic_loop_in_no_reorder("fori_loop")
    step = _int(step, "fori_loop")
    if step <= 0:
        fail("fori_loop", f"step must be a positive compile-time int, got {step}")
    register = _isa().VirtualRegister
    for i in range(_register_value(lower), _register_value(upper), step):
        body_fun(register(i))  # a fresh read-only register per iteration, as on the device


def while_loop(init: Any, body_fun: Callable[[Any], Any]) -> None:
    """Runtime loop: while the condition register is non-zero, ``cond = body_fun(cond)``."""
    _no_dynamic_loop_in_no_reorder("while_loop")
    cond = init
    while _register_value(cond) != 0:
        cond = body_fun(cond)
        if cond is None:
            fail("while_loop", "the body must return the next condition register")


@contextlib.contextmanager
def no_reorder() -> Iterator[None]:
    """Keep program order for every instruction issued in this (dynamic) scope (decision 10)."""
    run = context.current()
    scope = next(_scope_ids)
    marker = _last_mine(run)
    outer = getattr(_local, "no_reorder", ())
    _local.no_reorder = outer + (scope,)
    try:
        yield
    finally:
        _local.no_reorder = outer
        for ins in _mine_since(run, marker):
            have = ins.attrs.get("no_reorder")
            scopes = () if have is None else (have if isinstance(have, tuple) else (have,))
            scopes = (scope,) + scopes
            ins.attrs["no_reorder"] = scopes[0] if len(scopes) == 1 else scopes


def program_id(axis: int = 0) -> int:
    """Index of this program along ``axis`` of the launch grid (0 or 1 under LNC2)."""
    return context.program_id(axis)


_ALL_AXES = object()


def num_programs(axes: Any = _ALL_AXES) -> int:
    """Programs along ``axes`` (default: axis 0; all axes of a legacy multi-dim grid; decision 8)."""
    if axes is _ALL_AXES:
        axes = None if context.program_ndim() > 1 else 0
    return context.num_programs(axes)


def program_ndim() -> int:
    """Dimensions of the launch grid."""
    return context.program_ndim()


def device_print(print_prefix: str, tensor: Any, *, mask: Any = None) -> None:
    """Print ``print_prefix`` and the tile's values to stdout (simulator behaviour; not an instruction)."""
    t = _tile(tensor, "device_print", "tensor")
    print(print_prefix, np.asarray(t.values()), flush=True)


class GridDim(int):
    """A legacy launch-grid dim (``nl.nc(2)``, ``nl.spmd_dim(...)``): its size; programs run serially."""

    @property
    def lnc_degree(self) -> int:
        return int(self)

    def __repr__(self) -> str:
        return f"GridDim({int(self)})"


def nc(n: int) -> GridDim:
    """Legacy: a launch-grid dim of ``n`` logical cores (``kernel[nl.nc(2), 2]``)."""
    return GridDim(_int(n, "nc"))


def spmd_dim(*factors: Any) -> GridDim:
    """Legacy: a launch-grid dim tiled over sub-dims (``nl.spmd_dim(nl.nc(2), 2)`` has size 4)."""
    return GridDim(math.prod(_int(f, "spmd_dim") for f in factors))


# =================================================== legacy assignment hooks


def _assign(target: NkiTensor, value: Any) -> None:
    """``target[...] = value`` (from ``NkiTensor.__setitem__``): a copy, DMA or memset into ``target``."""
    temporary = _is_temporary(sys.getrefcount(value))
    if _is_scalar(value):
        _fill(target, value, "assign")
        return
    value = _tile(value, "assign", "value")
    if not target.on_chip:
        dst = target
        if target.is_partial:
            valid = _elementwise_min(_valid(target), value.shape if value.ndim == target.ndim else target.shape)
            dst, value = _masked(target, valid), _masked(value, valid)
        _copy_to_hbm(dst, value, "assign")
        return
    if _retarget(target, value, temporary):
        return
    if not value.on_chip:
        _isa().dma_copy(dst=target, src=value)
        return
    src = value
    if value.shape != target.shape and value.shape[0] in (target.shape[0], 1):
        try:
            src = _expand(value, target.shape, "assign")
        except (ValueError, AssertionError):
            src = value
    _isa().tensor_copy(dst=target, src=src)


def _accumulate(target: NkiTensor, value: Any) -> None:
    """``target += value`` (from ``NkiTensor.__iadd__``): matmul accumulation or an element-wise add.

    A temporary fresh ``nl.matmul`` result accumulating into a PSUM tile of the
    same shape becomes the matmul itself writing ``target`` (decisions 4 and 5).
    """
    temporary = _is_temporary(sys.getrefcount(value))
    if not target.on_chip:
        fail("accumulate", f"{target.name!r} is in {target.buffer.value}; '+=' on HBM needs a read-modify-write "
             "DMA: load the tile, add, and store it back (or use nisa.dma_compute)")
    if isinstance(value, NkiTensor) and target.buffer is Buffer.psum and value.buffer is Buffer.psum:
        fresh = getattr(_local, "fresh", None)
        if temporary and fresh is not None and fresh.kind == "matmul" and fresh.result() is value:
            group = _matmul_group(target)
            if group in ("open", "zero") and target.shape == value.shape and \
                    _isa().accumulate_matmul_result(target, value):
                _local.fresh = None
                return  # the ISA folds the add into the recorded matmul (no second matmul run)
            if group is not None and _retarget(target, value, True, accumulate=group == "open"):
                return
        elif temporary and _isa().accumulate_matmul_result(target, value):
            return  # legacy ``psum += nisa.nc_matmul(a, b)``: the ISA folds it into the matmul
        staged = copy(value, float32) if value.dtype.is_float else copy(value)
        _isa().tensor_tensor(dst=target, data1=target, data2=staged, op=add)
        return
    if _is_scalar(value):
        _isa().tensor_scalar(dst=target, data=target, op0=add, operand0=_scalar(value))
        return
    value = _on_chip(_tile(value, "accumulate", "value"), "accumulate", "value")
    if value.shape != target.shape and _is_column(value, target.shape[0]) and target.free_size > 1:
        _isa().tensor_scalar(dst=target, data=target, op0=add, operand0=_column(value))
        return
    _isa().tensor_tensor(dst=target, data1=target, data2=_expand(value, target.shape, "accumulate"), op=add)


def _box(op: Any) -> tuple[int, int, int, int]:
    """(first row, end row, first byte, end byte within a row) of an operand's extent."""
    lo, hi = op.extent
    pitch = op.row_bytes
    if pitch <= 0 or hi <= lo:
        return (0, 1, lo, _b.max(hi, lo + 1))
    r0, r1 = lo // pitch, (hi - 1) // pitch + 1
    if r1 - r0 == 1:
        return (r0, r1, lo - r0 * pitch, hi - r0 * pitch)
    c0, c1 = lo - r0 * pitch, (hi - 1) - (r1 - 1) * pitch + 1
    return (r0, r1, c0, c1) if c1 > c0 else (r0, r1, 0, pitch)


def _matmul_group(target: NkiTensor) -> str | None:
    """How ``target`` was last written, for a legacy ``+=`` of a matmul (decision 5).

    ``"open"``: by a matmul (accumulate); ``"zero"``: by a zero memset (``nl.zeros``),
    and ``"fresh"``: never (both start a group by overwriting); None: by another
    instruction (an element-wise add is needed instead).
    """
    run = context.current()
    mine = target.operand()
    box = _box(mine)
    fresh = getattr(_local, "fresh", None)
    skip = set(map(id, fresh.instructions)) if fresh is not None else set()
    for ins in reversed(run.instructions):
        if id(ins) in skip:
            continue
        for w in ins.writes:
            if w.allocation != mine.allocation:
                continue
            other = _box(w)
            if box[0] < other[1] and other[0] < box[1] and box[2] < other[3] and other[2] < box[3]:
                if ins.opcode == "nc_matmul":
                    return "open"
                if ins.opcode == "memset" and ins.attrs.get("value") in (0, 0.0):
                    return "zero"
                return None
    return "fresh"


# ===================================================== removed legacy APIs


def _removed(name: str, replacement: str) -> Callable[..., Any]:
    def fn(*args: Any, **kwargs: Any) -> Any:
        fail(name, f"nl.{name} was removed from NKI; {replacement}")

    fn.__name__ = name
    fn.__doc__ = f"Removed legacy API: {replacement}"
    return fn


loop_reduce = _removed("loop_reduce", "accumulate explicitly, e.g. acc[...] = nl.add(acc, x) or "
                       "nisa.tensor_tensor(dst=acc, data1=acc, data2=x, op=nl.add)")
atomic_rmw = _removed("atomic_rmw", "use nisa.dma_compute (DMA read-add-write) for a read-modify-write of HBM")
all_reduce = _removed("all_reduce", "use the nki.collectives APIs")


_REMOVED_ALLOCATORS = ("alloc", "mod_alloc", "par_alloc")


class _LegacyAllocator:
    """``nki.compiler.sbuf`` / ``.psum``: ``auto_alloc()`` is the buffer; manual allocators are removed."""

    def __init__(self, buffer: Buffer) -> None:
        self._buffer = buffer

    def auto_alloc(self) -> Buffer:
        return self._buffer

    def __getattr__(self, name: str) -> Any:
        if name not in _REMOVED_ALLOCATORS:
            raise AttributeError(f"nki.compiler.{self._buffer.value} has no attribute {name!r}")
        buffer = self._buffer.value

        def removed(*args: Any, **kwargs: Any) -> Any:
            fail(f"nki.compiler.{buffer}.{name}",
                 f"nki.compiler allocators were removed (NKI 0.3.0); allocate with nl.ndarray(shape, dtype, "
                 f"buffer=nl.{buffer}, address=(partition_offset, free_offset)) for manual placement, or "
                 "omit address= to let the compiler place it")

        return removed


class _LegacyCompiler:
    """Legacy ``nki.compiler``: hint decorators are no-ops; allocators raise with the replacement."""

    sbuf = _LegacyAllocator(Buffer.sbuf)
    psum = _LegacyAllocator(Buffer.psum)

    @staticmethod
    def skip_middle_end_transformations(fn: Callable[..., Any]) -> Callable[..., Any]:
        return fn

    @staticmethod
    def enable_stack_allocator(fn: Any = None, **kwargs: Any) -> Any:
        return fn if fn is not None else (lambda f: f)

    @staticmethod
    def force_auto_alloc(fn: Any = None, **kwargs: Any) -> Any:
        return fn if fn is not None else (lambda f: f)

    def __getattr__(self, name: str) -> Any:
        raise AttributeError(f"nki.compiler.{name} does not exist: the nki.compiler namespace was removed in "
                             "NKI 0.3.0 (allocate with nl.ndarray(..., address=...) and drop compiler directives)")


compiler = _LegacyCompiler()
