"""Dtypes, buffers and ``tile_size`` of ``nl``: the NKI dtype objects (and their legacy
``fp32``-style aliases), the memory-region constants and predicates, ``NKIObject`` and
the ``nl.tile_size`` hardware limits of the current target."""

from __future__ import annotations

from typing import Any

import ml_dtypes

from torchneuron.nki import context
from torchneuron.nki import dtypes as _dtypes
from torchneuron.nki.memory import Buffer
from torchneuron.nki.language._base_ops import _buffer, _dtype


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
