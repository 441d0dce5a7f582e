"""``nki.language`` (``nl``): tile-level helpers that lower onto ``nki.isa`` instructions.

Kernels import this module as ``nl`` (``import torchneuron.nki.language as nl``).
Every ``nl`` function allocates its result tile and issues the ISA instructions a
compiler would emit for it (nki-api-facts.md: 3, "built on top of nki.isa"); it
never computes values itself and never records an instruction of its own, so
the simulator's checks and the cost model see exactly the ISA instruction stream.
Current NKI (0.6/0.7) is the primary dialect; legacy ``neuronxcc.nki`` idioms of
nki-api-facts.md section 10 are accepted too (masks, ``nl.par_dim`` block dims,
``mgrid``/``arange`` indices, ``psum += nl.matmul(...)``, SPMD grids).

Modules (each imports at its top; later ones build on earlier ones, never the reverse):
:mod:`.core` (shared helpers: argument normalisers, instruction issue and retargeting,
legacy block dims and masks), :mod:`.memory` (dtypes, buffers, ``tile_size``,
creation), :mod:`.movement` (load/store/copy/matmul/transpose), :mod:`.compute`
(element-wise, reductions, selection), :mod:`.control` (loops, programs,
``no_reorder``), :mod:`.legacy` (``t[...] = x`` / ``+=`` hooks, removed APIs,
``nl.compiler``) and :mod:`.constants` (``nki.language.constants``). This package
re-exports their public ``nl`` names.

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
   temporary (no other Python reference: its CPython reference count is
   compared with that of a fresh object sent down the same call path at that
   moment, since interpreter hooks such as Dynamo's change the count), its
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
   An affine index running past the end of an HBM tensor is legal only when the
   mask keeps the access inside the tensor; otherwise the DMA fails "out of bounds"
   (``NkiTensor.__getitem__`` bounds-checks every other index form at once).
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
13. **Reduction axes** may be any free dims: non-trailing ones (``nl.sum(t,
    axis=[2, 4])`` in AWS's average-pool tutorial) reduce over a permuted free-dim
    access pattern with one ``tensor_reduce``, as the ISA's trailing-axes rule allows
    (legacy ``mask=`` with non-trailing axes is refused).
14. **Legacy index roles** (``torchneuron/nki/affine_view.py``): an ``nl.arange``
    broadcast to axis k (``[:, None]``, ``nl.mgrid``) is axis k of the accessed tile
    wherever it appears, so ``out[i_f, i_p]`` is a transposing DMA,
    ``t[i_p, i_f2 * n + i_f1]`` splits a dim, and ``idx[i_p]`` of a 1-D tensor is a
    ``[P, 1]`` tile; an on-chip index that moves the partition dim is refused.
15. A ``@nki.jit`` kernel called inside a kernel is inlined into the caller's run (a
    warning says to drop the decorator); a ``@nki.jit`` dst-first ISA call given
    ``dtype=`` keeps dst's dtype (warned when they differ).
16. A legacy kernel's manual allocators (``nki.compiler.sbuf.mod_alloc(...)`` called from a file
    that imports ``neuronxcc``) are automatic placement with a warning: every block keeps its own
    storage and live range, so a kernel correct on hardware computes the same values, but the
    manual addresses, their reuse and the kernel's own capacity plan are not checked.
17. ``t[h]`` of a block tensor with two block dims is the block tensor of block row ``h`` (the
    same tiles); an HBM dim summing several legacy variables may run past the end along its
    outermost variable under a ``mask=`` (AWS's contributed max-pool).
"""

from __future__ import annotations

from torchneuron.nki.dtypes import DTYPES as _DTYPES
from torchneuron.nki.indexing import arange, ds, mgrid
from torchneuron.nki.language.compute import (
    abs, abs_max, abs_min, add, all, arctan, average, bitwise_and, bitwise_or, bitwise_xor, broadcast_to, bypass,
    ceil, cos, divide, dropout, equal, erf, erf_dx, exp, expand_dims, floor, fmod, gather_flattened, gelu,
    gelu_apprx_sigmoid, gelu_apprx_sigmoid_dx, gelu_apprx_tanh, gelu_dx, greater, greater_equal, identity, invert,
    left_shift, less, less_equal, log, logical_and, logical_not, logical_or, logical_xor, max, maximum, mean, min,
    minimum, mish, mod, multiply, negative, not_equal, power, prelu, prod, reciprocal, relu, right_shift, rms_norm,
    rsqrt, sigmoid, sign, silu, silu_dx, sin, softmax, softplus, sqrt, square, subtract, sum, tan, tanh, trunc, var,
    where,
)
from torchneuron.nki.language.control import (
    GridDim, affine_range, device_print, dynamic_range, fori_loop, nc, no_reorder, num_programs, program_id,
    program_ndim, sequential_range, spmd_dim, static_range, while_loop,
)
from torchneuron.nki.language.core import BlockTensor, ParDim, par_dim
from torchneuron.nki.language.legacy import all_reduce, atomic_rmw, compiler, loop_reduce
from torchneuron.nki.language.memory import (
    MemoryRegion, NKIObject, bf16, bfloat16, bfp16, bool_, empty_like, finfo, float16, float32, float4_e2m1fn_x4,
    float8_e4m3, float8_e4m3fn, float8_e4m3fn_x4, float8_e5m2, float8_e5m2_x4, float8_e8m0fnu, fp16, fp32, full, hbm, int16, int32, int64, int8, is_hbm, is_on_chip,
    is_psum, is_sbuf, ndarray, ones, ones_like, private_hbm, psum, rand, random_seed, sbuf, shared_constant,
    shared_hbm, shared_identity_matrix, tfloat32, tile_size, uint16, uint32, uint64, uint8, zeros, zeros_like,
)
from torchneuron.nki.language.movement import copy, load, load_transpose2d, matmul, static_cast, store, transpose
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
__all__ += [name for name in _DTYPES] + ["fp32", "fp16", "bf16", "bfp16"]
