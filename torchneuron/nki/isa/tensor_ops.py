"""TensorE instructions: ``nc_matmul`` (with the legacy ``psum += nc_matmul(...)`` folding
of ``accumulate_matmul_result``), and ``nc_transpose``, plus
their PSUM bank, tiling, accumulation and single-thread BLAS helpers (``nc_matmul_mx``, in
``mx_ops.py``, shares them).
"""

from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from torchneuron.nki.cost import formulas as F
from torchneuron.nki.dtypes import resolve, round_tf32
from torchneuron.nki.errors import fail
from torchneuron.nki.instruction import Engine, Instruction
from torchneuron.nki.isa.core import (
    NkiInstruction, as_enum, as_tensor, buffer_rule, engine_operand, instruction, new_tile, raw_values,
    read_values, record, run_and_version, store_values, written_marks,
)
from torchneuron.nki.isa.enums import ENGINE_NAME, EngineKind, PerfMode, engine, matmul_perf_mode
from torchneuron.nki.isa.vector_ops import cast_legacy_result
from torchneuron.nki.legacy_masks import mapped_mask_counts
from torchneuron.nki.memory import PSUM_BANK_BYTES, Buffer
from torchneuron.nki.tensor import NkiTensor


# ============================================================================ TensorE
_MATMUL_INPUTS = frozenset(("float8_e4m3", "float8_e5m2", "bfloat16", "float16", "tfloat32", "float32"))
_FP8 = frozenset(("float8_e4m3", "float8_e5m2", "float8_e4m3fn"))
_FP32ISH = frozenset(("float32", "tfloat32"))
_PERF_ALIASES = {"none": PerfMode.none, "double_row": PerfMode.double_row, "double_row_gen3": PerfMode.double_row}

# The newest legacy nc_matmul result of each thread, for folding ``psum += nisa.nc_matmul(...)``
# (accumulate_matmul_result): (weak reference to the result tile, its instruction).
_LEGACY_MATMUL = threading.local()


def _check_bank(instr: str, dst: NkiTensor, version: int) -> None:
    """Rule 3: on v2/v3 a TensorE output stays inside one 2 KiB PSUM bank per partition."""
    alloc = dst._alloc
    data = dst._data
    row = alloc.data.strides[0] if alloc.data.ndim else 0
    low = data.__array_interface__["data"][0] - alloc.data.__array_interface__["data"][0]
    in_row = low % row if row else low
    span = sum((n - 1) * abs(s) for n, s in zip(data.shape[1:], data.strides[1:])) + data.itemsize
    first = alloc.free_offset + in_row
    last = first + span - 1
    if first // PSUM_BANK_BYTES != last // PSUM_BANK_BYTES:
        fail(instr, f"dst {dst.name!r} covers PSUM bytes {first}..{last} of each partition, crossing the "
             f"{PSUM_BANK_BYTES} B bank boundary (banks {first // PSUM_BANK_BYTES} and {last // PSUM_BANK_BYTES}); "
             f"on NeuronCore-v{version} a TensorE output must stay within one PSUM bank (512 fp32 elements per "
             "partition, nl.tile_size.psum_bank_fmax): split the moving free dimension at bank boundaries")


def tiling(instr: str, tile_position: Any, tile_size: Any, version: int) -> tuple[int, int]:
    """Tiling mode (facts 4.1): (row_size, column_size), (128, 128) when off."""
    position = tuple(tile_position or ())
    size = tuple(tile_size or ())
    if not position and not size:
        return 128, 128
    if bool(position) != bool(size):
        fail(instr, f"tile_position={position} and tile_size={size}: both must be set to enable TensorE tiling "
             "mode (or neither, for the full 128x128 array)")
    if len(position) != 2 or len(size) != 2:
        fail(instr, f"tile_position and tile_size are (row, column) pairs, got {position} and {size}")
    rows, cols = int(size[0]), int(size[1])
    row0, col0 = int(position[0]), int(position[1])
    valid = (32, 64, 128) if version >= 3 else (64, 128)
    for what, value in (("row", rows), ("column", cols)):
        if value not in valid:
            fail(instr, f"tile_size {what} size {value} is not one of {valid} on NeuronCore-v{version}"
                 + (" (32 needs NeuronCore-v3 or newer)" if value == 32 else ""))
    for what, start, extent in (("row", row0, rows), ("column", col0, cols)):
        if start % extent or not 0 <= start <= 128 - extent:
            fail(instr, f"tile_position {what} {start} must be a multiple of the {what} size {extent} with the "
                 f"tile inside the 128x128 array")
    return rows, cols


def _bool_arg(instr: str, param: str, value: Any, allow_none: bool = False) -> bool | None:
    if value is None and allow_none:
        return None
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (int, np.integer)) and value in (0, 1):
        return bool(value)
    raise TypeError(f"{instr}: {param} must be True or False{' or None' if allow_none else ''}, got {value!r}")


_BLAS_THREADS: Any = False  # openblas_set_num_threads_local of NumPy's OpenBLAS, None if unavailable


def _blas_local_threads() -> Any:
    global _BLAS_THREADS
    if _BLAS_THREADS is False:
        _BLAS_THREADS = None
        try:
            import ctypes
            import glob
            import os

            folder = os.path.join(os.path.dirname(np.__file__), os.pardir, "numpy.libs")
            for path in glob.glob(os.path.join(folder, "*openblas*")):
                setter = getattr(ctypes.CDLL(path), "openblas_set_num_threads_local", None)
                if setter is not None:
                    setter.restype, setter.argtypes = ctypes.c_int, [ctypes.c_int]
                    _BLAS_THREADS = setter
                    break
        except OSError:  # pragma: no cover - another BLAS build
            _BLAS_THREADS = None
    return _BLAS_THREADS


def sgemm(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``a @ b`` in float32 on one BLAS thread.

    A matmul tile is small (at most 128 x 128 x 8192): waking OpenBLAS's thread pool for
    each one, between other NumPy work, costs several times the product itself, so the
    calling thread is switched to single-threaded BLAS for the call (thread-local, restored).
    """
    setter = _blas_local_threads()
    if setter is None:
        return np.matmul(a, b, dtype=np.float32)
    previous = setter(1)
    try:
        return np.matmul(a, b, dtype=np.float32)
    finally:
        setter(previous)


def _write_bits(dst: NkiTensor, bits: np.ndarray) -> None:
    """Store raw bit patterns (same itemsize as dst's storage) and mark them written."""
    if dst.widened:
        fail("nc_matmul", f"is_transpose=True moves raw bits, but dst {dst.name!r} is held as float32 because "
             "NKI_PRECISE_FP=0: run bit-exact transposes with NKI_PRECISE_FP=1 (the default)")
    shape = dst._data.shape
    dst._data[...] = np.ascontiguousarray(bits).view(dst._data.dtype).reshape(shape)
    dst._mask[...] = np.iinfo(dst._mask.dtype).max


@dataclass(frozen=True)
class MatmulShape:
    """The sizes one matmul multiplies: ``[contraction, m] x [contraction, n] -> [m, n]``."""

    contraction: int
    m: int  # stationary free size: dst partitions
    n: int  # moving free size: dst free size


def matmul_operands(instr: str, dst: Any, stationary: Any, moving: Any) -> tuple[NkiTensor, NkiTensor, NkiTensor]:
    """The three TensorE operands, in the buffers TensorE reads (SBUF) and writes (PSUM)."""
    te = Engine.TENSOR
    stationary = engine_operand(instr, "stationary", stationary, te)
    moving = engine_operand(instr, "moving", moving, te)
    dst = engine_operand(instr, "dst", dst, te)
    for role, t in (("stationary", stationary), ("moving", moving)):
        buffer_rule(instr, role, t, Buffer.sbuf, "TensorE reads its inputs only from SBUF: copy it into SBUF "
                     "with nisa.tensor_copy first")
    buffer_rule(instr, "dst", dst, Buffer.psum, "TensorE writes only to PSUM: allocate dst with buffer=nl.psum "
                 "and copy the result out with nisa.tensor_copy")
    return dst, stationary, moving


def _check_input_dtypes(instr: str, sd: str, md: str, version: int) -> None:
    """Stationary and moving dtypes TensorE takes on this NeuronCore version, and their legal pairings."""
    allowed = _MATMUL_INPUTS | (frozenset(("float8_e4m3fn",)) if version >= 4 else frozenset())
    for role, dname in (("stationary", sd), ("moving", md)):
        if dname not in allowed:
            extra = " (float8_e4m3fn needs NeuronCore-v4, trn3)" if dname == "float8_e4m3fn" else ""
            if resolve(dname).is_packed_mx:
                extra = " (packed MX tiles are multiplied by nisa.nc_matmul_mx)"
            fail(instr, f"{role} dtype {dname} is not a TensorE input type on NeuronCore-v{version}; use one of "
                 f"{', '.join(sorted(allowed))}{extra}")
    if {sd, md} == {"float8_e4m3", "float8_e4m3fn"}:
        fail(instr, "stationary and moving mix float8_e4m3 (legacy) and float8_e4m3fn (OCP); the two e4m3 "
             "variants cannot be mixed in one matmul: convert one of them")
    if (sd in _FP32ISH) != (md in _FP32ISH):
        fail(instr, f"stationary is {sd} and moving is {md}; if one input is float32/tfloat32 the other must be "
             "float32/tfloat32 too: cast the other input")


def _double_row_shape(instr: str, target: str, version: int, stationary: NkiTensor, moving: NkiTensor,
                      transpose: bool, cols: int) -> MatmulShape:
    """``perf_mode=double_row``'s legality; its contraction is ``[P, 2, F]``: twice the partitions."""
    sd, md = stationary.dtype.name, moving.dtype.name
    if version < 3:
        fail(instr, f"perf_mode=double_row needs NeuronCore-v3 or newer (trn2/trn3); target "
             f"{target} is NeuronCore-v{version}")
    if sd not in _FP8 or md not in _FP8:
        fail(instr, f"perf_mode=double_row takes fp8 inputs only, got stationary {sd} and moving {md}")
    if transpose:
        fail(instr, "perf_mode=double_row cannot be combined with is_transpose=True")
    if cols != 128:
        fail(instr, f"perf_mode=double_row cannot be combined with column tiling (tile_size column {cols})")
    for role, t in (("stationary", stationary), ("moving", moving)):
        if t.ndim != 3 or t.shape[1] != 2:
            fail(instr, f"perf_mode=double_row splits the contraction as [P, 2, F]: {role} must be 3-D with "
                 f"dim 1 equal to 2, got shape {list(t.shape)}")
    return MatmulShape(2 * stationary.shape[0], stationary.shape[2], moving.shape[2])


def check_sizes(instr: str, version: int, stationary: NkiTensor, moving: NkiTensor, dst: NkiTensor,
                 shape: MatmulShape, rows: int, cols: int) -> None:
    """Partition, stationary, moving and dst sizes within TensorE's array and one matmul's PSUM."""
    partitions = stationary.shape[0]
    if moving.shape[0] != partitions:
        fail(instr, f"stationary has {partitions} partitions and moving {moving.shape[0]}; the contraction runs over "
             "the partition axis of both inputs (layout LC#1), so their partition sizes must be equal")
    if partitions > rows:
        fail(instr, f"contraction (partition) size is {partitions}, above the tile row size {rows}"
             if rows < 128 else f"contraction (partition) size is {partitions}, above TensorE's 128 rows")
    if shape.m > cols:
        limit = "nl.tile_size.gemm_stationary_fmax" if cols == 128 else "the tile_size column size"
        fail(instr, f"stationary free size is {shape.m}, above TensorE's limit of {cols} ({limit}); split the "
             "stationary tile")
    dd = dst.dtype.name
    if version >= 4:
        n_limit = 8192 if dd == "bfloat16" else 4096
        why = f"8 PSUM banks of {'bf16' if dd == 'bfloat16' else 'fp32'} on NeuronCore-v4"
    else:
        n_limit, why = 512, f"one PSUM bank of fp32, nl.tile_size.gemm_moving_fmax, on NeuronCore-v{version}"
    if shape.n > n_limit:
        fail(instr, f"moving free size is {shape.n}, above TensorE's limit of {n_limit} ({why}); split the moving "
             "tile")
    if dst.shape[0] != shape.m or dst.free_size != shape.n:
        fail(instr, f"dst has shape {list(dst.shape)} but must be [stationary free, moving free] = "
             f"[{shape.m}, {shape.n}]")


def _check_dst_dtype(instr: str, version: int, transpose_mode: bool, accumulate: bool | None, sd: str,
                     dst: NkiTensor) -> None:
    """dst's dtype: the input's for a pass-through transpose, else fp32 PSUM (or bf16 on v4)."""
    dd = dst.dtype.name
    if transpose_mode:
        if accumulate:
            fail(instr, "is_transpose=True cannot accumulate (accumulate=True): a transpose overwrites dst")
        if sd in _FP8:
            if dst.dtype.itemsize != 2:
                fail(instr, f"is_transpose=True on {sd} input writes 16-bit PSUM elements; dst is {dd}")
        elif dd != sd:
            fail(instr, f"is_transpose=True writes the input's dtype: dst must be {sd}, got {dd}")
    elif dd != "float32" and not (version >= 4 and dd == "bfloat16"):
        fail(instr, f"dst dtype is {dd}; TensorE writes float32 PSUM on NeuronCore-v{version}"
             + (" (bfloat16 is also allowed on NeuronCore-v4)" if version < 4 else " or bfloat16"))


def _transpose_through(instr: str, dst: NkiTensor, stationary: NkiTensor, moving: NkiTensor,
                       shape: MatmulShape) -> None:
    """``is_transpose=True``: stationary's bits, transposed, pass through TensorE against an identity."""
    s_raw = read_values(stationary, instr)
    m_raw = read_values(moving, instr)
    k = shape.contraction
    identity = m_raw.astype(np.float32).reshape(k, shape.n)
    if shape.n != k or not np.array_equal(identity, np.eye(k, dtype=np.float32)):
        fail(instr, f"is_transpose=True passes stationary through TensorE against an identity: moving must be "
             f"the {k}x{k} identity matrix, got shape {list(moving.shape)} with other values")
    bits = s_raw.reshape(k, shape.m).T
    if stationary.dtype.name in _FP8:
        bits = bits.view(np.uint8).astype(np.uint16)
    _write_bits(dst, bits)


def _product(instr: str, stationary: NkiTensor, moving: NkiTensor, shape: MatmulShape) -> np.ndarray:
    """``stationary.T @ moving`` in fp32 (tfloat32 inputs rounded first), as ``[m, n]``."""
    a = read_values(stationary, instr).astype(np.float32).reshape(shape.contraction, shape.m)
    b = read_values(moving, instr).astype(np.float32).reshape(shape.contraction, shape.n)
    if stationary.dtype.name == "tfloat32":
        a = round_tf32(a)
    if moving.dtype.name == "tfloat32":
        b = round_tf32(b)
    return sgemm(a.T, b)


def _resolve_accumulate(instr: str, version: int, dst: NkiTensor, accumulate: bool | None,
                        shape: MatmulShape) -> tuple[bool | None, np.ndarray | None]:
    """Whether the product adds to dst: True, False, or None with the ``[m, n]`` elements that add.

    ``accumulate=True`` must continue a matmul group on every element; None infers it
    per element from the written-mask (an open group accumulates).
    """
    mask = dst._mask
    full, open_, _closed = written_marks(mask)
    if accumulate is True:
        if not mask.all():
            missing = int(mask.size - np.count_nonzero(mask))
            fail(instr, f"accumulate=True onto {missing} PSUM elements of {dst.name!r} that were never written "
                 "(undefined behaviour on hardware): start the accumulation group with accumulate=False")
        if version < 4 and (mask == full).any():
            fail(instr, f"accumulate=True onto PSUM {dst.name!r} last written by a non-matmul instruction "
                 f"(memset/tensor_copy...): undefined behaviour on NeuronCore-v{version}; start the "
                 "accumulation with accumulate=False instead of initialising PSUM")
        return True, None
    if accumulate is None:
        group = mask == open_
        if group.all():
            return True, None
        if group.any():
            return None, group.reshape(shape.m, shape.n)
    return False, None


def matmul_values(instr: str, run: Any, version: int, dst: NkiTensor, stationary: NkiTensor, moving: NkiTensor,
                  shape: MatmulShape, transpose_mode: bool, accumulate: bool | None,
                  product_of: Callable[[], np.ndarray] | None = None) -> tuple[bool | None, list]:
    """Compute dst (unless the run is shape-only); returns the resolved ``accumulate`` and the tiles read.

    ``product_of`` gives the ``[m, n]`` fp32 product (default: ``stationary.T @ moving``), so
    ``nc_matmul_mx`` shares the PSUM accumulation rules with ``nc_matmul``."""
    mask = dst._mask
    open_ = written_marks(mask)[1]
    reads = [stationary, moving]
    if not run.compute_values:  # shape-only run: validate and record, skip the arithmetic
        resolved = (not transpose_mode) and (accumulate if accumulate is not None else bool((mask == open_).all()))
        if resolved:
            reads.append(dst)
    elif transpose_mode:
        _transpose_through(instr, dst, stationary, moving, shape)
        resolved = False
    else:
        product = product_of() if product_of is not None else _product(instr, stationary, moving, shape)
        resolved, where = _resolve_accumulate(instr, version, dst, accumulate, shape)
        if resolved is not False:
            previous = dst._data.astype(np.float32).reshape(shape.m, shape.n)
            product = previous + product if where is None else np.where(where, previous + product, product)
            reads.append(dst)
        store_values(dst, product)
    mask[...] = open_
    return resolved, reads


def nc_matmul(dst: NkiTensor, stationary: NkiTensor, moving: NkiTensor, is_stationary_onezero: bool = False,
              is_moving_onezero: bool = False, is_transpose: bool = False, accumulate: bool | None = None,
              tile_position: Sequence[int] = (), tile_size: Sequence[int] = (),
              perf_mode: matmul_perf_mode = matmul_perf_mode.none, name: str | None = None) -> NkiInstruction:
    """``dst = stationary.T @ moving`` on TensorE, accumulating in fp32 PSUM (facts 4.1, rules 3, 4, 12)."""
    instr = "nc_matmul"
    run, version = run_and_version()
    dst, stationary, moving = matmul_operands(instr, dst, stationary, moving)
    perf = PerfMode.none if perf_mode is None else as_enum(instr, "perf_mode", perf_mode, PerfMode, _PERF_ALIASES)
    accumulate = _bool_arg(instr, "accumulate", accumulate, allow_none=True)
    transpose = bool(_bool_arg(instr, "is_transpose", is_transpose))
    _check_input_dtypes(instr, stationary.dtype.name, moving.dtype.name, version)
    rows, cols = tiling(instr, tile_position, tile_size, version)
    if perf is PerfMode.double_row:
        shape = _double_row_shape(instr, run.target.name, version, stationary, moving, transpose, cols)
    else:
        shape = MatmulShape(stationary.shape[0], stationary.free_size, moving.free_size)
    check_sizes(instr, version, stationary, moving, dst, shape, rows, cols)
    transpose_mode = transpose and version >= 3
    _check_dst_dtype(instr, version, transpose_mode, accumulate, stationary.dtype.name, dst)
    if version < 4:
        _check_bank(instr, dst, version)
    resolved, reads = matmul_values(instr, run, version, dst, stationary, moving, shape, transpose_mode, accumulate)
    flops = 0 if transpose else 2 * shape.contraction * shape.m * shape.n
    return record(run, instr, Engine.TENSOR, reads, [dst], flops=flops, name=name, op="matmul",
                  stationary_free=shape.m, moving_free=shape.n, contraction=shape.contraction, perf_mode=perf.value,
                  is_transpose=transpose, accumulate=resolved, accumulate_requested=accumulate,
                  tile_position=tuple(tile_position or ()), tile_size=tuple(tile_size or ()),
                  is_stationary_onezero=bool(is_stationary_onezero), is_moving_onezero=bool(is_moving_onezero))


def _nc_matmul_legacy(stationary: NkiTensor, moving: NkiTensor, *, is_stationary_onezero: bool = False,
                      is_moving_onezero: bool = False, is_transpose: bool = False, tile_position: Any = (),
                      tile_size: Any = (), mask: Any = None, perf_mode: Any = None, dtype: Any = None,
                      name: str | None = None) -> NkiTensor:
    """Legacy ``psum = nisa.nc_matmul(stationary, moving)``: a fresh fp32 PSUM result tile."""
    instr = "nc_matmul"
    _run, version = run_and_version()
    stationary = as_tensor(instr, "stationary", stationary)
    moving = as_tensor(instr, "moving", moving)
    perf = PerfMode.none if perf_mode is None else as_enum(instr, "perf_mode", perf_mode, PerfMode, _PERF_ALIASES)
    if perf is PerfMode.double_row and stationary.ndim == 3 and moving.ndim == 3:
        m_size, n_size = stationary.shape[2], moving.shape[2]
    else:
        m_size, n_size = stationary.free_size, moving.free_size
    if dtype is not None:
        out_dtype = resolve(dtype)
    elif is_transpose and version >= 3:
        out_dtype = resolve("bfloat16") if stationary.dtype.name in _FP8 else stationary.dtype
    else:
        out_dtype = resolve("float32")
    out = new_tile((m_size, n_size), out_dtype, Buffer.psum, "matmul_psum")
    dst, stat, mov = out, stationary, moving
    if mask is not None and mask is not True:
        if stationary.ndim != 2 or moving.ndim != 2:
            fail(instr, "a legacy mask on nc_matmul is simulated for 2-D stationary and moving tiles only")
        # stationary [K, M] x moving [K, N] -> [M, N]: each bound is matched to K, M or N by its variable
        counts = mapped_mask_counts(instr, mask, {"K": stationary.shape[0], "M": m_size, "N": n_size},
                                    (("stationary", stationary, ("K", "M")), ("moving", moving, ("K", "N"))))
        if 0 in counts.values():
            return out
        k, m, n = counts["K"], counts["M"], counts["N"]
        dst, stat, mov = out[0:m, 0:n], stationary[0:k, 0:m], moving[0:k, 0:n]
    handle = nc_matmul(dst, stat, mov, is_stationary_onezero=is_stationary_onezero,
                       is_moving_onezero=is_moving_onezero, is_transpose=is_transpose, tile_position=tile_position,
                       tile_size=tile_size, perf_mode=perf, name=name)
    _LEGACY_MATMUL.last = (weakref.ref(out), handle.instruction)
    return out


nc_matmul = instruction("nc_matmul", {Engine.TENSOR: F.matmul},
                        legacy=_nc_matmul_legacy,
                        tensors=("dst", "stationary", "moving"))(nc_matmul)


def accumulate_matmul_result(target: NkiTensor, value: NkiTensor, starts_group: bool | None = None,
                             overwrite: bool = False) -> bool:
    """Fold the legacy ``psum[...] += nisa.nc_matmul(a, b)`` (or ``+= nl.matmul``) into the matmul.

    When ``value`` is the PSUM result of the program's newest instruction, an
    ``nc_matmul``, that matmul is re-targeted to write ``target``, as the legacy
    compiler fused it: it accumulates (``target += value`` in fp32) when a matmul
    group is open on ``target``, and overwrites it (``accumulate=False``, the first
    matmul of a group; language decision 5) when ``target`` is uninitialised or
    zeroed (``starts_group``; None infers it: never written, or holding zeros).
    Returns False (nothing done) otherwise, so the caller falls back to an
    ordinary element-wise add. ``overwrite`` (the legacy ``psum[...] = nisa.nc_matmul(a, b)``)
    starts a new group whatever ``target`` holds: the matmul writes ``target`` directly, as
    the legacy compiler placed a matmul's output in the PSUM tile it was assigned to.
    """
    found = _foldable_matmul(target, value, overwrite)
    if found is None:
        return False
    instruction, run, version = found
    instr = "nc_matmul"
    target = engine_operand(instr, "dst", target, Engine.TENSOR)
    _check_accumulation_target(instr, target, version)
    open_ = written_marks(target._mask)[1]
    continuing = bool((target._mask == open_).all()) and not overwrite
    if not continuing and not _starts_group(run, target, starts_group, overwrite):
        return False
    _fold_into(instr, instruction, target, value, continuing)
    _LEGACY_MATMUL.last = None
    return True


def _foldable_matmul(target: Any, value: Any, overwrite: bool) -> tuple[Instruction, Any, int] | None:
    """(instruction, run, version) of the newest legacy ``nc_matmul`` when ``value`` is its result, still
    the program's newest instruction, and shaped to write PSUM ``target`` instead; else None."""
    if not isinstance(value, NkiTensor) or not isinstance(target, NkiTensor):
        return None
    last = getattr(_LEGACY_MATMUL, "last", None)
    if last is None or last[0]() is not value or target._alloc.buffer is not Buffer.psum:
        return None
    instruction = last[1]
    run, version = run_and_version()
    newest = next((i for i in reversed(run.instructions) if i.program == instruction.program), None)
    if newest is not instruction or target.shape[0] != value.shape[0] or target.free_size != value.free_size \
            or instruction.writes[0].shape != tuple(value.shape):
        return None
    if overwrite and (target.dtype != value.dtype or target.dtype.name != "float32"
                      or instruction.attrs.get("is_transpose")):
        return None  # a pass-through or cast result: assigned by a copy, as before
    return instruction, run, version


def _check_accumulation_target(instr: str, target: NkiTensor, version: int) -> None:
    """A PSUM accumulation target is fp32 (or bf16 on v4) and, on v2/v3, inside one PSUM bank."""
    if target.dtype.name != "float32" and not (version >= 4 and target.dtype.name == "bfloat16"):
        fail(instr, f"accumulating a matmul into {target.name!r} of dtype {target.dtype.name}; PSUM accumulation "
             "targets must be float32" + (" or bfloat16" if version >= 4 else ""))
    if version < 4:
        _check_bank(instr, target, version)


def _starts_group(run: Any, target: NkiTensor, starts_group: bool | None, overwrite: bool) -> bool:
    """Whether the matmul starts a new group on ``target``: always for ``overwrite``; else as given, or
    (None) when ``target`` was never written or holds only zeros."""
    if overwrite:
        return True
    if starts_group is None:
        mask = target._mask
        return not mask.any() or (run.compute_values and bool(mask.all()) and not np.any(target._data))
    return starts_group


def _fold_into(instr: str, instruction: Instruction, target: NkiTensor, value: NkiTensor, continuing: bool) -> None:
    """Re-target the recorded matmul to write ``target`` (adding to it when the group continues)."""
    mask = target._mask
    product = value._data.astype(np.float32).reshape(target.shape[0], -1)
    if continuing:
        product = target.read(instr).astype(np.float32).reshape(product.shape) + product
    store_values(target, product)
    mask[...] = written_marks(mask)[1]
    if continuing:
        instruction.reads = instruction.reads + (target.operand(),)
    instruction.writes = (target.operand(),) + instruction.writes
    run_and_version()[0].records.update_attrs(instruction, accumulate=continuing, accumulate_requested=None,
                                              legacy_accumulate=True)


def nc_transpose(dst: NkiTensor, data: NkiTensor, engine: engine = engine.unknown,
                 name: str | None = None) -> NkiInstruction:
    """2-D partition<->free transpose on TensorE (<=128x128, SBUF->PSUM) or VectorE (<=32x32) (facts 4.1)."""
    instr = "nc_transpose"
    run, version = run_and_version()
    dst = as_tensor(instr, "dst", dst)
    data = as_tensor(instr, "data", data)
    requested = as_enum(instr, "engine", engine, EngineKind)
    chosen = requested
    if chosen is EngineKind.unknown:
        chosen = EngineKind.tensor if (data._alloc.buffer is Buffer.sbuf and dst._alloc.buffer is Buffer.psum) \
            else EngineKind.vector
    if chosen not in (EngineKind.tensor, EngineKind.vector):
        fail(instr, f"nc_transpose runs on TensorE or VectorE, not {requested.name}")
    eng = ENGINE_NAME[chosen]
    data = engine_operand(instr, "data", data, eng)
    dst = engine_operand(instr, "dst", dst, eng)
    partitions, free = data.shape[0], data.free_size
    if dst.shape[0] != free or dst.free_size != partitions:
        fail(instr, f"dst has shape {list(dst.shape)} but the transpose of data [{partitions}, {free}] (free axes "
             f"flattened) is [{free}, {partitions}]")
    if dst.dtype.name != data.dtype.name:
        fail(instr, f"dst dtype {dst.dtype.name} differs from data dtype {data.dtype.name}; a transpose keeps the "
             "dtype: cast with nisa.tensor_copy afterwards")
    if chosen is EngineKind.tensor:
        buffer_rule(instr, "data", data, Buffer.sbuf, "TensorE reads only SBUF")
        buffer_rule(instr, "dst", dst, Buffer.psum, "TensorE writes only PSUM (allocate dst with buffer=nl.psum)")
        if free > 128:
            fail(instr, f"data is [{partitions}, {free}]; TensorE transposes at most [128, 128]: split the free "
                 "dimension")
        if version < 4:
            _check_bank(instr, dst, version)
    elif partitions > 32 or free > 32:
        fail(instr, f"data is [{partitions}, {free}]; VectorE transposes at most [32, 32]: use "
             "engine=nisa.engine.tensor (SBUF -> PSUM) for larger tiles")
    raw = raw_values(data, instr)
    out = raw.T
    if chosen is EngineKind.tensor and version == 2 and data.dtype.is_float:
        # v2 has no transpose mode: data.T @ I, where 0 * Inf/NaN poisons every other output of the column.
        values = raw.astype(np.float32)
        bad = ~np.isfinite(values)
        if bad.any():
            others = bad.sum(axis=0)[None, :] - bad
            out = np.where((others > 0).T, np.float32(np.nan), values.T)
    store_values(dst, out)
    if chosen is EngineKind.tensor:
        dst._mask[...] = written_marks(dst._mask)[1]
    return record(run, instr, eng, [data], [dst], name=name, engine_requested=requested.name,
                  partitions=partitions, free=free)


def _nc_transpose_legacy(data: NkiTensor, *, mask: Any = None, dtype: Any = None, engine: Any = None,
                         name: str | None = None) -> NkiTensor:
    instr = "nc_transpose"
    data = as_tensor(instr, "data", data)
    requested = as_enum(instr, "engine", engine, EngineKind)
    partitions, free = data.shape[0], data.free_size
    chosen = requested
    if chosen is EngineKind.unknown:
        small = partitions <= 32 and free <= 32
        chosen = EngineKind.vector if small or data._alloc.buffer is Buffer.psum else EngineKind.tensor
    buffer = Buffer.psum if chosen is EngineKind.tensor else Buffer.sbuf
    out = new_tile((free, partitions), data.dtype, buffer, "transpose")
    dst, src = out, data
    if mask is not None and mask is not True:
        if data.ndim != 2:
            fail(instr, "a legacy mask on nc_transpose is simulated for 2-D data only")
        # data [P, F] -> [F, P]: a bound on the variable indexing data's partitions cuts the result's free axis
        counts = mapped_mask_counts(instr, mask, {"P": partitions, "F": free}, (("data", data, ("P", "F")),))
        if 0 in counts.values():
            return out
        p, f = counts["P"], counts["F"]
        dst, src = out[0:f, 0:p], data[0:p, 0:f]
    nc_transpose(dst, src, engine=chosen, name=name)
    return cast_legacy_result(out, dtype, "transpose_cast")


nc_transpose = instruction("nc_transpose", {Engine.TENSOR: F.tensor_engine_transpose,
                            Engine.VECTOR: F.vector_n},
                           legacy=_nc_transpose_legacy,
                           tensors=("dst", "data"))(nc_transpose)
