"""Manual placement ``nl.ndarray(..., address=(partition, offset))`` (torchneuron/nki/memory.py): the offset is
in **bytes** within each partition, as AWS's allocators compute it (NKI library SbufManager: ``addr += 512 * 2``
after a (128, 512) bf16 tile; the 0.2.0 migration guide: a PSUM tensor in bank 3 at ``3 * 2048``), PSUM
allocations start on a 2 KiB bank boundary, and placement, overlap and capacity agree with those bytes."""

from __future__ import annotations

import numpy as np
import pytest

import torchneuron.nki.isa as nisa
import torchneuron.nki.language as nl
from torchneuron.nki import NkiValidationError
from nki_language_support import run

KiB = 1024


def hold(*tiles):
    for tile in tiles:
        nisa.memset(dst=tile, value=0 if tile.dtype.is_integer else 0.0)


def test_sbuf_byte_offsets_of_a_stack_allocator_do_not_overlap():
    # SbufManager-style: each tile starts where the previous one's bytes end
    def kernel():
        buf1 = nl.ndarray((128, 512), nl.bfloat16, buffer=nl.sbuf, address=(0, 0))
        buf2 = nl.ndarray((128, 256), nl.bfloat16, buffer=nl.sbuf, address=(0, 512 * 2))
        buf3 = nl.ndarray((128, 256), nl.float32, buffer=nl.sbuf, address=(0, 512 * 2 + 256 * 2))
        hold(buf1, buf2, buf3)
        hold(buf1, buf2, buf3)
        return buf1.address, buf2.address, buf3.address

    kernel_out = {}

    def wrapped():
        kernel_out["addr"] = kernel()

    run(wrapped)
    assert kernel_out["addr"] == ((0, 0), (0, 1024), (0, 1536))


def test_sbuf_overlap_in_bytes_is_detected():
    # 256 fp32 elements = 1024 B: a second tile at byte 512 overlaps the first
    def overlap():
        a = nl.ndarray((128, 256), nl.float32, address=(0, 0))
        b = nl.ndarray((128, 256), nl.float32, address=(0, 512))
        hold(a, b, a)

    with pytest.raises(NkiValidationError, match=r"overlaps live tensor.*"):
        run(overlap)

    def partitions_apart():  # the same bytes of other partitions do not overlap
        a = nl.ndarray((64, 256), nl.float32, address=(0, 0))
        b = nl.ndarray((64, 256), nl.float32, address=(64, 0))
        hold(a, b, a)

    run(partitions_apart)


def test_sbuf_offset_counts_bytes_against_capacity():
    def fits():  # 64 bf16 elements = 128 B end exactly at the per-partition limit
        t = nl.ndarray((128, 64), nl.bfloat16, address=(0, nl.tile_size.sbuf_fmax_bytes - 128))
        hold(t)

    run(fits)

    def past_the_end():
        nl.ndarray((128, 64), nl.bfloat16, address=(0, nl.tile_size.sbuf_fmax_bytes - 64))

    with pytest.raises(NkiValidationError, match=r"at free offset \d+ B"):
        run(past_the_end)


def test_psum_bank_addresses_are_bytes():
    seen = {}

    def kernel():
        tiles = [nl.ndarray((128, 512), nl.float32, buffer=nl.psum, address=(0, b * 2048)) for b in range(8)]
        hold(*tiles)
        hold(*tiles)
        seen["banks"] = [t._alloc.banks for t in tiles]

    run(kernel)
    assert seen["banks"] == [(b,) for b in range(8)]

    def inside_a_bank():  # 512 B into bank 0: not a bank boundary
        nl.ndarray((128, 128), nl.float32, buffer=nl.psum, address=(0, 512))

    with pytest.raises(NkiValidationError, match="bank boundary"):
        run(inside_a_bank)

    def bf16_two_banks():  # (128, 1024) bf16 = 2 KiB: one bank, bank 3 at 3 * 2048 (migration guide example)
        t = nl.ndarray((128, 1024), nl.bfloat16, buffer=nl.psum, address=(0, 3 * 2048))
        hold(t)
        seen["bf16"] = t._alloc.banks

    run(bf16_two_banks)
    assert seen["bf16"] == (3,)

    def past_last_bank():
        nl.ndarray((128, 512), nl.float32, buffer=nl.psum, address=(0, 8 * 2048))

    with pytest.raises(NkiValidationError, match="out of range"):
        run(past_last_bank)


def test_manual_psum_bank_is_not_refused_because_an_automatic_tile_sat_there():
    # An automatically placed PSUM tile takes a bank the compiler would choose; a manual tile later given that
    # bank must not collide with it: the compiler places automatic tiles around the manual ones.
    def kernel():
        auto = nl.ndarray((128, 512), nl.float32, buffer=nl.psum)
        nisa.memset(dst=auto, value=0.0)
        manual = nl.ndarray((128, 512), nl.float32, buffer=nl.psum, address=(0, 0))
        hold(manual, auto)

    run(kernel)

    def two_manual_same_bank():
        a = nl.ndarray((128, 512), nl.float32, buffer=nl.psum, address=(0, 2048))
        b = nl.ndarray((128, 256), nl.float32, buffer=nl.psum, address=(0, 2048))
        hold(a, b, a)

    with pytest.raises(NkiValidationError, match="address="):
        run(two_manual_same_bank)


def test_manual_and_automatic_sbuf_share_capacity():
    def kernel():
        limit = nl.tile_size.sbuf_fmax_bytes
        big = nl.ndarray((128, limit // 8), nl.float32, address=(0, 0))  # half of each partition by hand
        autos = [nl.ndarray((128, limit // 32), nl.float32) for _ in range(5)]  # 5/8 more: does not fit
        hold(big, *autos)
        hold(big, *autos)

    with pytest.raises(NkiValidationError, match="SBUF capacity exceeded"):
        run(kernel)
