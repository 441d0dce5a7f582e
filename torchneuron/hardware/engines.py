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
    "VIEWS", "MOVEMENT", "FACTORIES", "NORMALIZATION", "SOFTMAX", "REDUCTION", "OPTIMIZER",
    "OPTIMIZER_PREFIXES",
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
     "_scaled_dot_product_fused_attention_overrideable",
     "flex_attention"}  # torchneuron::flex_attention: FlexAttention as one fused op (device/flex_attention.py)
)  # fmt: skip
RECURRENT = frozenset({"lstm", "gru", "rnn_tanh", "rnn_relu"})
# What TensorE runs: matmuls (and batched dot products), convolutions forward and backward.
# Integer operands go through FP32 there (trainium-facts.md: Data types) and
# ``--auto-cast matmult`` casts exactly these.
TENSOR_ENGINE = MATMUL | CONVOLUTION | CONVOLUTION_BACKWARD | {"linalg_vecdot"}

# Ops that only re-describe memory (views) or allocate it: no data moves, no time.
VIEWS = frozenset(
    {
        "view", "_unsafe_view", "reshape", "_reshape_alias", "as_strided", "transpose", "t",
        "permute", "expand", "expand_as", "squeeze", "unsqueeze", "slice", "select", "alias",
        "detach", "narrow", "unfold", "diagonal", "split", "split_with_sizes", "chunk", "unbind",
        "view_as", "view_as_real", "view_as_complex", "movedim", "swapaxes", "swapdims",
        "flatten", "unflatten", "lift_fresh", "real", "imag", "_conj", "_neg_view", "empty",
        "empty_like", "empty_strided", "set", "resize", "_resize_output",
    }
)  # fmt: skip
# Ops that move data without computing on it: the HBM read-and-write formula.
MOVEMENT = frozenset(
    {
        "copy", "clone", "_copy_from", "_copy_from_and_resize", "contiguous", "cat", "stack",
        "index_select", "gather", "scatter", "index", "_unsafe_index", "index_put",
        "_index_put_impl", "embedding", "flip", "roll", "repeat", "constant_pad_nd",
        "masked_scatter", "take", "slice_scatter", "select_scatter", "diagonal_scatter",
        "as_strided_scatter", "_local_scalar_dense", "narrow_copy", "expand_copy",
        "permute_copy", "_to_copy", "transpose_copy", "t_copy", "view_copy", "unsqueeze_copy", "squeeze_copy",
    }
)  # fmt: skip
# Ops that make data (constants and random draws): a write of their results.
FACTORIES = frozenset(
    {"zeros", "ones", "full", "zeros_like", "ones_like", "full_like", "arange", "linspace",
     "fill", "zero", "scalar_tensor", "rand", "randn", "rand_like", "randn_like", "uniform",
     "normal", "bernoulli", "random", "randint", "eye"}
)  # fmt: skip

# Families the check report groups modelled time by (beside the ones above).
NORMALIZATION = frozenset({"native_layer_norm", "native_layer_norm_backward", "native_batch_norm",
                           "native_batch_norm_backward", "_native_batch_norm_legit",
                           "_native_batch_norm_legit_no_training", "_fused_rms_norm",
                           "_fused_rms_norm_backward", "native_group_norm",
                           "native_group_norm_backward"})  # fmt: skip
SOFTMAX = frozenset({"_softmax", "_log_softmax", "_softmax_backward_data", "_log_softmax_backward_data"})
REDUCTION = frozenset({"sum", "mean", "amax", "amin", "max", "min", "argmax", "argmin", "norm",
                       "linalg_vector_norm", "var_mean", "std", "var", "std_mean", "prod", "all",
                       "any", "logsumexp", "cumsum", "cumprod"})  # fmt: skip
# Optimizer updates: the fused and foreach kernels (foreach ops by prefix).
OPTIMIZER = frozenset({"_fused_adam", "_fused_adamw", "_fused_sgd", "_fused_adagrad"})
OPTIMIZER_PREFIXES = ("_foreach_",)
