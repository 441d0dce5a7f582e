"""``nki.isa`` (``nisa``): the NKI instruction set, executed by the simulator.

Every function checks the hardware rules of nki-api-facts.md sections 4 and 6 for the
run's target (``context.current().target``: trn1/trn2/trn3 = NeuronCore v2/v3/v4),
computes its result with NumPy on whole tiles (engines compute in fp32; bit-vector ops
and GpSimd int32 arithmetic on integers; TensorE accumulates in fp32 PSUM), writes it
through ``dst.write()`` (which rounds into ``dst``'s dtype) and records exactly one
:class:`~torchneuron.nki.instruction.Instruction` for the cost model.

Call styles
-----------
Current NKI (0.2+) is **dst-first**: ``nisa.tensor_tensor(dst=c, data1=a, data2=b,
op=nl.add)`` writes ``c`` and returns an :class:`NkiInstruction` handle (whose
``.depends_on(*producers)`` adds scheduling edges, recorded as
``attrs["depends_on"] = [instruction indices]``). Legacy ``neuronxcc.nki`` calls return
their result instead: ``c = nisa.tensor_tensor(a, b, np.add)``,
``psum = nisa.nc_matmul(stat, mov)``, ``nisa.activation(op=nl.exp, data=x, ...)``.

**Detection rule.** A call is current-style when ``dst`` is passed by keyword, or when its
arguments bind to the current signature with every tensor-only parameter (``dst`` and the
required input tiles, e.g. ``data1``/``data2`` of tensor_tensor) bound to an
:class:`NkiTensor` and every required parameter present. Anything else is a legacy call:
it is bound to the legacy signature (nki-api-facts.md section 10), a result tile is
allocated (SBUF; PSUM for ``nc_matmul`` and TensorE ``nc_transpose``) with the legacy
``dtype=`` (default: the input dtype, or the promoted dtype of two inputs) and the legacy
``mask=`` restricts the instruction to the leading rows/columns it allows. Legacy-only
keywords (``mask=``, ``dtype=``) route a call with ``dst`` to the legacy path too.
:func:`accumulate_matmul_result` folds the legacy ``psum[...] += nisa.nc_matmul(a, b)`` into
the matmul itself (it then accumulates into ``psum``), as the legacy compiler did.

Masks: a :class:`~torchneuron.nki.indexing.MaskExpr` whose every bound is a prefix bound
on an index variable (``i_p < n``, ``k * 128 + i_f < n``); each term bounds the tile
dimension its index was broadcast to (``nl.arange(n)[:, None]`` is dim 0,
``nl.mgrid`` position k is dim k). The instruction then runs on the leading sub-tile
(inputs sliced alike); other masks raise ``NkiValidationError``.

Engine choice when ``engine=nisa.engine.unknown`` (facts 4.3-4.7; our decision where the
compiler's heuristic is unpublished):

* ``tensor_tensor``: GpSimd for ``nl.power`` and for arithmetic on all-int32/uint32
  operands with nothing in PSUM; VectorE otherwise (always VectorE for bit-vector ops).
* ``tensor_scalar``: GpSimd when an op is ``rsqrt`` and nothing is in PSUM (the documented
  precise path of ``nl.rsqrt``); VectorE otherwise. Never ScalarE unless requested.
* ``tensor_copy``, ``memset``: VectorE.
* ``nc_transpose``: TensorE when ``data`` is in SBUF and ``dst`` in PSUM, else VectorE
  (legacy calls: VectorE for tiles up to 32x32 or PSUM input, else TensorE).

Decisions where the facts are silent (for docs/nki.md)
------------------------------------------------------
1. **PSUM accumulation groups** are tracked per element through the written-mask: a
   TensorE write marks a location "matmul group open"; any non-matmul write (memset,
   tensor_copy, activation...) marks it "initialised by a non-matmul instruction"; a read
   by a non-TensorE instruction closes the group. ``accumulate=None`` accumulates where a
   group is open and overwrites elsewhere (so a PSUM tile reused across output tiles
   restarts its group after it is copied out). ``accumulate=True`` on a never-written
   location, and (v2/v3) on a location last written by a non-matmul instruction, raises
   (UB on hardware, facts 4.1 / rule 12). ``is_transpose=True`` never accumulates.
2. ``is_transpose=True`` on v3+ is a bit-exact pass-through: ``moving`` must be an
   identity matrix and ``dst`` has the input's dtype (2-byte types), or a 2-byte dtype
   holding the zero-extended bits for fp8 input. On v2 it is an ordinary fp32 matmul.
   TensorE ``nc_transpose`` on v2 emulates the identity matmul: a NaN/Inf anywhere in a
   column of ``data`` turns the rest of that output row into NaN.
3. Transposes (``is_transpose``, ``nc_transpose``) record ``flops=0``.
4. ScalarE ``tensor_scalar`` op pairs are restricted to (multiply, add), (multiply, -),
   (add, -) on v2 and v3 (documented for trn2; trn1 assumed alike), not on v4. GpSimd
   runs ``tensor_scalar`` only when one of its ops is ``rsqrt``.
5. ``activation``'s ``reduce_op`` must be ``nl.add``; ``activation_reduce`` also accepts
   max/min on v3+ (the docs restrict only v2 to add).
6. Engine accumulator registers (128 per engine, fp32) live in the run, per physical core
   (ScalarE: activation/activation_reduce/activate2; VectorE: exponential, range_select,
   select_reduce, tensor_scalar_reduce, tensor_scalar_cumulative). They start
   uninitialised (NaN); reading lanes never reset goes through the run's
   uninitialised-read policy.
7. ScalarE activation input outside the function's valid range (facts 5) emits an
   :class:`NkiActivationRangeWarning` (function, range, observed min/max; once per kernel
   line and function) and computes the exact function (hardware output is invalid there;
   AWS's ``sin`` cubic extrapolation is not reproduced: its polynomial is unpublished).
8. ``dma_copy`` rejects PSUM on either side (the facts list HBM<->SBUF, HBM->HBM and
   SBUF->SBUF). Shapes may differ when element counts match: data is copied in row-major
   order. Legacy clipped HBM views copy only their valid box.
9. GpSimd integer ``tensor_tensor``: exact int64 arithmetic wrapped to the dst dtype;
   ``divide``/``mod`` truncate toward zero (C semantics).
10. ``tensor_scalar`` operand tiles are not required to be float32 (docs say they must
    be; kernels commonly pass bf16 vectors and engines cast anyway).
11. ``tensor_tensor_scan`` runs a loop over the free dimension (each step vectorised over
    partitions); ``tensor_scalar_cumulative`` uses ufunc accumulation (sequential fp32),
    and ``subtract`` an alternating-sum closed form.
12. RNG: each run starts every engine's generator from a fixed seed (core index), so
    runs are deterministic; ``set_rng_seed`` reseeds VectorE with the seed's 32 bits.
    ``dropout`` draws U[0,1) per element and keeps values whose draw is >= ``prob``.
13. ``local_gather`` follows AWS's NumPy reference: indices are element offsets within
    each partition's flattened free dims, read per 16-partition core in partition-major
    (Fortran) order; out-of-range indices raise.
14. ``nc_find_index8`` pairs duplicate vals with successive occurrences; ``nc_match_replace8``
    processes vals from 7 down to 0 (facts / AWS docstrings); not-found slots hold all
    ones (unsigned) or -1 (signed).
15. ``tensor_partition_reduce`` writes a one-partition ``dst`` with ``data``'s free size.
16. Not simulated (clear error): ``sendrecv``/``core_barrier`` (LNC programs run one after another),
    tensor indirection (``.indirect()``), ``rand_set_state``/``rand_get_state`` (XORWOW state
    layout unpublished), ``topk`` (its 16-partition snake semantics are ambiguous).
17. The NeuronCore version comes from ``ChipSpec.neuroncore_version`` (trn1 v2, trn2 v3,
    trn3 v4). ``dma_transpose`` runs on every target (``dge_mode=hwdge`` needs v3+);
    ``priority`` needs v4.
18. Legacy calls follow the current register semantics: ``activation(..., reduce_res=r)``
    with the default ``reduce_cmd=idle`` reads the registers out without reducing (AWS's
    legacy examples pass ``reduce_cmd=reset_reduce``); legacy ``range_select`` defaults
    to ``idle`` as its legacy signature did.
19. ``select_reduce`` predicates are int8/uint8/int16/uint16; ``range_select`` bounds are
    float32 (P, 1) tiles; ``nc_stream_shuffle`` mask value 255 leaves the dst partition.
20. TensorE products are computed with NumPy float32 matmul on one BLAS thread (per call,
    thread-local): a tile matmul is too small to gain from OpenBLAS's pool, and waking it
    between other NumPy work cost several times the product itself.
23. MX (``mx_ops.py``, ``nki/mx.py``, v4 only): ``quantize_mx`` follows its stub's scale formula
    (``2**(floor(log2 amax) - (E_max - 1))``, twice OCP's sample scale); a group holding NaN/Inf
    gets the NaN scale (unpublished); ``nc_matmul_mx`` refuses 96 partitions (the stub allows any
    multiple of 32; AWS's nki-library kernels say 96 is not supported) and dequantises in fp32.
21. Legacy-kernel legalisation (``isa/legalise.py``; a kernel whose file imports ``neuronxcc``,
    ``nki/dialect.py``): a PSUM operand of TensorE or GpSimd is first copied to SBUF by a
    VectorE ``tensor_copy``, an integer partition broadcast is one SBUF -> SBUF DMA, and a memset
    of a slice at a forbidden start partition is a memset at partition 0 plus one DMA; the
    legacy compiler's choice of instruction is not published. Current kernels are refused.
22. Legacy indexing by a tile of row numbers (``nki/indirect.py``) is one ``dma_copy`` recorded
    with ``indirect=True`` and ``dge_mode=swdge`` (descriptors from the index tile): its reads
    are the index tile and each distinct HBM row (the written tile for a scatter), so the cost
    model charges the bytes moved; in a shape-only run the rows are unknown and row 0 stands in.
"""

from __future__ import annotations

# The original single-module ``isa.py``'s imports, kept (mostly unused here) so the package namespace
# is exactly what it was: ``nisa.np``, ``nisa.NkiTensor``, ``nisa.NkiValidationError``... still resolve.
# ruff: noqa: F401
import builtins
import enum
import functools
import inspect
import math
import threading
import warnings
import weakref
from typing import Any, Callable, Sequence

import numpy as np

from torchneuron.nki import context
from torchneuron.nki.dtypes import NkiDType, resolve, round_tf32
from torchneuron.nki.errors import NkiUninitializedReadError, NkiValidationError, fail, kernel_location
from torchneuron.nki.indexing import AffineIndex, MaskExpr
from torchneuron.nki.instruction import Engine, Instruction
from torchneuron.nki.memory import PSUM_BANK_BYTES, Allocation, Buffer
from torchneuron.nki.ops import ALU_OPS, AluOp, ActivationFn, activation_fn, alu_op, nki_op_name
from torchneuron.nki.tensor import NkiTensor

# The instruction set, one module per concern (see each module's docstring).
from torchneuron.nki.isa.core import NkiActivationRangeWarning, NkiInstruction, masked_legacy_result
from torchneuron.nki.isa.dma_ops import dma_compute, dma_copy, dma_transpose
from torchneuron.nki.isa.enums import (
    FP32_MIN, dge_mode, dma_engine, engine, gpsimd_engine, matmul_perf_mode, nc_version, oob_mode, reduce_cmd,
    scalar_engine, tensor_engine, unknown_engine, vector_engine
)
from torchneuron.nki.isa.gpsimd_ops import (
    affine_select, iota, local_gather, nc_n_gather, nonzero_with_count, sequence_bounds, topk
)
from torchneuron.nki.isa.registers import (
    VirtualRegister, core_barrier, get_nc_sub_version, get_nc_version, register_alloc, register_load, register_move,
    register_store, sendrecv
)
from torchneuron.nki.isa.scalar_ops import activate2, activation, activation_reduce
from torchneuron.nki.isa.mx_ops import nc_matmul_mx, quantize_mx
from torchneuron.nki.isa.tensor_ops import accumulate_matmul_result, nc_matmul, nc_transpose
from torchneuron.nki.isa.vector_fused import (
    bn_aggr, bn_stats, exponential, scalar_tensor_tensor, tensor_scalar_cumulative, tensor_scalar_reduce,
    tensor_tensor_scan
)
from torchneuron.nki.isa.vector_ops import (
    memset, reciprocal, tensor_copy, tensor_copy_predicated, tensor_partition_reduce, tensor_reduce, tensor_scalar,
    tensor_tensor
)
from torchneuron.nki.isa.vector_select import (
    dropout, max8, nc_find_index8, nc_match_replace8, nc_stream_shuffle, rand2, rand_get_state,
    rand_set_state, range_select, rng, select_reduce, set_rng_seed
)

__all__ = [
    # enums and classes
    "engine", "reduce_cmd", "dge_mode", "oob_mode", "matmul_perf_mode", "nc_version", "dma_engine",
    "NkiValidationError", "NkiInstruction", "NkiActivationRangeWarning", "VirtualRegister",
    "tensor_engine", "vector_engine", "scalar_engine", "gpsimd_engine", "unknown_engine",
    "get_nc_version", "get_nc_sub_version",
    # TensorE
    "nc_matmul", "nc_transpose", "nc_matmul_mx",
    # ScalarE
    "activation", "activation_reduce", "activate2",
    # VectorE
    "tensor_tensor", "tensor_scalar", "tensor_reduce", "tensor_copy", "tensor_copy_predicated", "memset",
    "reciprocal", "exponential", "scalar_tensor_tensor", "tensor_scalar_reduce", "tensor_scalar_cumulative",
    "tensor_tensor_scan", "bn_stats", "bn_aggr", "select_reduce", "range_select", "max8", "nc_find_index8",
    "nc_match_replace8", "nc_stream_shuffle", "dropout", "rng", "rand2", "set_rng_seed",
    "rand_set_state", "rand_get_state", "quantize_mx",
    # GpSimd
    "iota", "affine_select", "local_gather", "nc_n_gather", "tensor_partition_reduce", "sequence_bounds",
    "nonzero_with_count", "topk",
    # DMA
    "dma_copy", "dma_transpose", "dma_compute",
    # registers and multi-core
    "register_alloc", "register_move", "register_load", "register_store", "core_barrier", "sendrecv",
]
