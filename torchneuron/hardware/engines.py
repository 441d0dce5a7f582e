"""The chip's vocabulary, defined once: its engines, the DMA fixed costs, and the op
families the placement rules and the cost model both speak of.

The eager cost model (:mod:`torchneuron.hardware.cost`), the placement rules
(:mod:`torchneuron.hardware.support`) and the NKI simulator's instruction records and
cost model (:mod:`torchneuron.nki`) all take these from here. Pure data, no torch.
"""

from __future__ import annotations

import enum

__all__ = [
    "Engine", "COMPUTE_ENGINES", "TRACK_ORDER", "DMA_FIXED_SECONDS", "HWDGE_FIXED_SECONDS",
    "MATMUL", "CONVOLUTION", "CONVOLUTION_BACKWARD", "ATTENTION", "RECURRENT", "TENSOR_ENGINE",
]


class Engine(enum.StrEnum):
    """A NeuronCore engine (trainium-facts.md: Engines), by the name traces show."""

    TENSOR = "TensorE"
    VECTOR = "VectorE"
    SCALAR = "ScalarE"
    GPSIMD = "GpSimd"
    DMA = "DMA"
    SYNC = "SyncE"

    @property
    def short(self) -> str:
        """The lower-case name NKI's instruction records use ("tensor", "gpsimd", ...)."""
        return self.name.lower()

    @classmethod
    def from_short(cls, short: str) -> Engine:
        """The engine NKI's instruction records name ``short`` ("tensor" -> TensorE)."""
        try:
            return cls[short.upper()]
        except (KeyError, AttributeError):
            raise ValueError(f"unknown engine {short!r}; NKI's engine names are "
                             f"{', '.join(e.short for e in cls)}") from None


# The compute engines, in the order traces and reports list them (then SyncE, then DMA).
COMPUTE_ENGINES = (Engine.TENSOR, Engine.VECTOR, Engine.SCALAR, Engine.GPSIMD)
TRACK_ORDER = (*COMPUTE_ENGINES, Engine.SYNC, Engine.DMA)


# trainium-facts.md: Engines, DMA: "about 1.3 us fixed cost per transfer";
# nki-api-facts.md 9 DMA gives the same ~1300 ns, and ~600 ns per hardware-DGE
# instruction (v3+).
DMA_FIXED_SECONDS = 1.3e-6
HWDGE_FIXED_SECONDS = 0.6e-6

# ---- op families (ATen base names) ----
# Matrix multiplies: the matmul cost formula, and TensorE.
MATMUL = frozenset({"mm", "bmm", "matmul", "linalg_matmul", "mv", "dot", "vdot", "addmm", "baddbmm",
                    "addbmm", "addmv", "_addmm_activation", "linear"})  # fmt: skip
# Convolutions (an implicit GEMM on TensorE), forward and backward.
CONVOLUTION = frozenset({"convolution", "_convolution", "convolution_overrideable", "conv1d", "conv2d",
                         "conv3d", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d"})  # fmt: skip
CONVOLUTION_BACKWARD = frozenset({"convolution_backward", "convolution_backward_overrideable"})
ATTENTION = frozenset(
    {"scaled_dot_product_attention", "_scaled_dot_product_attention_math",
     "_scaled_dot_product_flash_attention", "_scaled_dot_product_flash_attention_for_cpu",
     "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention",
     "_scaled_dot_product_fused_attention_overrideable"}
)  # fmt: skip
RECURRENT = frozenset({"lstm", "gru", "rnn_tanh", "rnn_relu"})
# What TensorE runs: matmuls (and batched dot products), convolutions forward and backward.
# Integer operands go through FP32 there (trainium-facts.md: Data types) and
# ``--auto-cast matmult`` casts exactly these.
TENSOR_ENGINE = MATMUL | CONVOLUTION | CONVOLUTION_BACKWARD | {"linalg_vecdot"}
