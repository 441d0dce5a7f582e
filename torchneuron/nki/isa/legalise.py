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

Decisions (which instructions the legacy compiler chose is not published): the
inserted PSUM copy runs on VectorE (``tensor_copy``), the engine the language's own
``nl.copy`` uses; the integer partition broadcast is one DMA.
"""

from __future__ import annotations

from torchneuron.nki import context
from torchneuron.nki.isa.core import new_tile, warn_once
from torchneuron.nki.memory import Buffer
from torchneuron.nki.tensor import NkiTensor

__all__ = ["LegacyLegalisationNote", "note_legacy_legalisation", "psum_operand_to_sbuf"]


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
