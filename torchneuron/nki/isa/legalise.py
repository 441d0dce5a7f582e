"""The copies the legacy NKI compiler inserted where a Beta 1 kernel broke an engine rule.

AWS's legacy (``neuronxcc.nki``) kernels feed a PSUM tile straight to TensorE
(``nl.matmul(x, nl.transpose(y))``) or to GpSimd (``affine_select`` on a matmul
result); TensorE reads only SBUF and GpSimd cannot reach PSUM (nki-api-facts.md:
6 rule 3), and the legacy toolchain made such kernels legal by copying the tile to
SBUF first (issue 17). Current NKI refuses them, and so does torchneuron for a
current-API kernel; for a legacy kernel (:mod:`torchneuron.nki.dialect`) the copy
is issued here as a real instruction, so it is simulated, checked for capacity and
costed like any other, with a one-time note per kernel line.

An integer tile broadcast across partitions (``nl.broadcast_to`` of a ``[1, F]`` int32
tile) is the other legalisation: TensorE's ones-matmul broadcast takes floats, so
``nl.broadcast_to`` issues one bit-exact SBUF -> SBUF DMA repeating partition 0.

A ``memset`` of a slice that starts at a partition the start-partition rule forbids
(``t[100:128]``; nki-api-facts.md 6 rule 6) is the third: the legacy NeuronCore-v2 guide says
this rule "is currently handled by the tensor allocator in Neuron Compiler during NKI kernel
compilation", so a legacy kernel never met it; no engine operand can start there, so the
constant is set in a fresh tile at partition 0 and one SBUF -> SBUF DMA (which has no
start-partition rule) moves it into place.

Decisions (which instructions the legacy compiler chose is not published): the
inserted PSUM copy runs on VectorE (``tensor_copy``), the engine the language's own
``nl.copy`` uses; the integer partition broadcast is one DMA; the misplaced memset is a
memset at partition 0 plus one DMA.
"""

from __future__ import annotations

from torchneuron.nki import context
from torchneuron.nki.isa.core import allowed_starts, new_tile, warn_once
from torchneuron.nki.memory import Buffer
from torchneuron.nki.tensor import NkiTensor

__all__ = ["LegacyLegalisationNote", "note_legacy_legalisation", "psum_operand_to_sbuf", "misplaced_start",
           "memset_through_dma"]


class LegacyLegalisationNote(UserWarning):
    """A legacy kernel relied on a copy the legacy NKI compiler inserted; torchneuron inserted it too."""


def note_legacy_legalisation(instr: str, what: str) -> None:
    """Warn once per kernel line that a legacy-compiler legalisation was applied."""
    warn_once(context.current(), ("legalise", instr, what), f"{instr}: {what}", LegacyLegalisationNote)


def psum_operand_to_sbuf(instr: str, role: str, tile: NkiTensor, engine_title: str) -> NkiTensor:
    """An SBUF copy of the PSUM operand ``tile`` (VectorE ``tensor_copy``), noted once per kernel line."""
    from torchneuron.nki.isa.vector_ops import tensor_copy

    run = context.current()
    copy = new_tile(tile.shape, tile.dtype, Buffer.sbuf, f"{tile.name}.sbuf")
    tensor_copy(dst=copy, src=tile)
    warn_once(run, ("legalise", instr, role),
              f"nisa.{instr}: {role} {tile.name!r} is in PSUM, which {engine_title} cannot read; legacy NKI's "
              "compiler inserted a copy to SBUF, so torchneuron inserted and costed one (VectorE tensor_copy). "
              "Current NKI refuses this: copy the tile to SBUF yourself (nl.copy / nisa.tensor_copy)",
              LegacyLegalisationNote)
    return copy


def misplaced_start(tile: object) -> bool:
    """True in a legacy kernel for an on-chip tile whose start partition breaks the start-partition rule."""
    if not isinstance(tile, NkiTensor) or not tile.on_chip or not context.current().legacy:
        return False
    return tile.start_partition not in allowed_starts(tile.shape[0] if tile.shape else 1)


def memset_through_dma(dst: NkiTensor, value: object, engine: object, name: str | None) -> object:
    """The legacy ``memset`` of ``dst`` (misplaced start): a memset at partition 0, then one DMA into place."""
    from torchneuron.nki.isa.dma_ops import dma_copy
    from torchneuron.nki.isa.vector_ops import memset

    staged = new_tile(dst.shape, dst.dtype, dst.buffer, f"{dst.name}.memset")
    memset(staged, value, engine=engine, name=name)
    handle = dma_copy(dst=dst, src=staged)
    note_legacy_legalisation("memset", f"dst {dst.name!r} starts at partition {dst.start_partition}, where no engine "
                             f"operand of {dst.shape[0]} partitions may start; legacy NKI's compiler placed tiles so "
                             "this never reached the hardware, so torchneuron set the value at partition 0 and "
                             "issued one SBUF -> SBUF DMA into place. Current NKI refuses this")
    return handle
