"""Opt-in Trainium numerics: see their accuracy impact before running on hardware.

All are off by default, so neuron results equal CPU's. Each mirrors a real
setting (trainium-facts.md, "Data types"):

- ``NEURON_CC_FLAGS="--auto-cast matmult --auto-cast-type bf16"``: the Neuron
  compiler's FP32 auto-cast. FP32 operands of the ops TensorE runs (the matmul
  family and convolution, forward and backward: ``matmult``) or of every op
  (``all``) are rounded to the cast type (bf16, fp16, tf32 or fp8_e4m3 --
  emulated with OCP ``float8_e4m3fn``, while Trn2 FP8 is IEEE-style E4M3),
  accumulated in FP32 (TensorE accumulates in FP32 PSUM), and the result rounded
  to the cast type again. neuronx-cc auto-casts matmuls by default; torchneuron
  only when asked.
- ``NEURON_RT_STOCHASTIC_ROUNDING_EN=1``: every BF16 value an engine writes is
  rounded stochastically, seeded by the device's generator: FP32 to BF16
  conversions (``.to``, ``.bfloat16()``, copies), and the BF16 results of ops,
  which are then computed in FP32 from widened operands (in-place and ``out=``
  tensors keep their identity). Random samplers and views are left alone.
- ``TORCHNEURON_INT64_AS_INT32=1``: int64 results (and int64 data copied to the
  device) wrap around at 32 bits, as Trainium computes 64-bit integers in 32 bits
  unless native INT64 is enabled.

Ops real Trainium runs on the host CPU (counted fallbacks) are neither auto-cast
nor stochastically rounded.
The rules and assumptions are in docs/hardware-model.md, "Numerics switches".
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from torchneuron import _C
from torchneuron import config
from torchneuron.hardware import runs_on_tensor_engine
from torchneuron.hardware.opname import parse_op_name

_SCOPES = {"none": 0, "matmult": 1, "all": 2}  # config.AUTO_CAST_SCOPES, as C++ numbers them


@dataclass(frozen=True)
class Numerics:
    auto_cast: str  # none | matmult | all
    auto_cast_type: str  # bf16 | fp16 | tf32 | fp8_e4m3
    stochastic_rounding: bool
    int64_as_int32: bool


# The variables configure() reads: a change to one re-applies them (config.on_change).
SETTINGS = ("NEURON_CC_FLAGS", "NEURON_RT_STOCHASTIC_ROUNDING_EN", "TORCHNEURON_INT64_AS_INT32")


# Ops that move or make data without computing on it: never auto-cast or wrapped.
PASSTHROUGH_OPS = frozenset({"view", "_unsafe_view", "reshape", "expand", "permute", "transpose", "t",
                             "squeeze", "unsqueeze", "slice", "select", "alias", "as_strided", "detach",
                             "clone", "_to_copy", "convert_element_type", "empty", "full", "zeros",
                             "ones", "empty_strided", "copy", "copy_", "_copy_from"})  # fmt: skip


def autocasts(op: str, settings: Numerics | None = None) -> bool:
    """Whether ``--auto-cast`` rounds ``op``'s FP32 operands and results: under ``all``
    every op that computes, under ``matmult`` what TensorE runs. The one rule: eager ops
    (asked once per op record) and compiled graphs (per node) both use it."""
    settings = settings or current()
    base = parse_op_name(op).base
    if settings.auto_cast == "none" or base in PASSTHROUGH_OPS:
        return False
    return settings.auto_cast == "all" or runs_on_tensor_engine(base)


def autocast_scopes(op: str) -> int:
    """:func:`autocasts` for each scope, as the C++ op record keeps it: bit 0 set if
    ``matmult`` rounds ``op``, bit 1 if ``all`` does (decided once per op, whatever
    the current setting)."""
    off = current()
    return sum(1 << i for i, scope in enumerate(("matmult", "all"))
               if autocasts(op, dataclasses.replace(off, auto_cast=scope)))


def current() -> Numerics:
    """The numerics the settings ask for (config parses and checks NEURON_CC_FLAGS)."""
    auto_cast, cast_type = config.value("NEURON_CC_FLAGS")
    return Numerics(auto_cast, cast_type, config.get_flag("NEURON_RT_STOCHASTIC_ROUNDING_EN"),
                    config.get_flag("TORCHNEURON_INT64_AS_INT32"))


def configure() -> Numerics:
    """Applies the settings from the environment (re-run after changing them)."""
    n = current()
    _C._set_numerics(_SCOPES[n.auto_cast], n.auto_cast_type, n.stochastic_rounding, n.int64_as_int32)
    return n
