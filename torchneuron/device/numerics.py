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

This module is the one statement of these rules: which ops each switch touches
(:func:`autocasts`, :func:`rounds_bf16`, :func:`wraps_int64`, :func:`rounds_bf16_result`)
and the formats' figures (:data:`BF16_DROPPED_BITS`, :data:`INT64_STORED_BITS`). The
eager op path (csrc/aten/numerics.cpp) keeps per op record the bits :func:`record_rules`
computes and receives the figures from :func:`configure`; the compiler's numerics pass
(compiler/passes.py) asks the same functions per graph node. C++ and the pass only apply
them. The rules and assumptions are in docs/hardware-model.md, "Numerics switches".
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache

import torch

from torchneuron import _C, config
from torchneuron.hardware import runs_on_tensor_engine
from torchneuron.hardware.engines import VIEWS
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


# Ops that move or make data without computing on it (and the effect tokens compiled graphs
# thread through ops with side effects): never auto-cast.
PASSTHROUGH_OPS = VIEWS | frozenset({"clone", "_to_copy", "convert_element_type", "full", "zeros", "ones",
                                     "copy", "copy_", "_copy_from", "_make_token", "_sink_tokens"})  # fmt: skip


def autocasts(op: str, settings: Numerics | None = None) -> bool:
    """Whether ``--auto-cast`` rounds ``op``'s FP32 operands and results: under ``all``
    every op that computes, under ``matmult`` what TensorE runs. The one rule: eager ops
    (asked once per op record) and compiled graphs (per node) both use it."""
    settings = settings or current()
    base = parse_op_name(op).base
    if settings.auto_cast == "none" or base in PASSTHROUGH_OPS:
        return False
    return settings.auto_cast == "all" or runs_on_tensor_engine(base)


# --- stochastic rounding and the int64 wrap -----------------------------------

# FP32 -> BF16 keeps FP32's top 16 bits (sign, 8-bit exponent, 7-bit mantissa): stochastic
# rounding adds uniform noise below the kept bits, then drops them.
BF16_DROPPED_BITS = 16
# INT64 computed as INT32: int64 values keep their low 32 bits, sign-extended.
INT64_STORED_BITS = 32

# Conversions write a BF16 result by rounding their source: stochastically only from FP32
# (as an engine's FP32 -> BF16 write); from other dtypes they convert as CPU does.
CONVERSION_OPS = frozenset({"_to_copy", "convert_element_type", "copy", "_copy_from",
                            "_copy_from_and_resize", "clone", "to"})
# Ops that allocate without writing values: nothing to round.
ALLOCATION_OPS = frozenset({"empty", "empty_strided", "empty_like", "new_empty",
                            "new_empty_strided", "empty_permuted"})

# Factories of random samples without a Generator argument (compiled graphs hold them;
# eager reaches their Generator-taking in-place forms, uniform_, normal_, random_).
RANDOM_FACTORIES = frozenset({"rand", "randn", "randint", "randperm", "rand_like", "randn_like",
                              "randint_like"})

# Bits of an op record's rule word (C++ keeps them per op and dtypes, in OpRecord's
# numerics_rule byte): the two --auto-cast scopes, then stochastic rounding.
RULE_AUTOCAST_MATMULT = 1 << 0
RULE_AUTOCAST_ALL = 1 << 1
RULE_ROUNDS_BF16 = 1 << 2


@lru_cache(maxsize=4096)
def op_overload(op: str) -> torch._ops.OpOverload | None:
    """The OpOverload named ``namespace::name[.overload]`` (None if not registered)."""
    parsed = parse_op_name(op)
    try:
        packet = getattr(getattr(torch.ops, parsed.namespace), parsed.name)
        return getattr(packet, parsed.overload or "default")
    except (AttributeError, RuntimeError):
        return None


def _is_view(overload: torch._ops.OpOverload) -> bool:
    # A return aliasing an argument it does not write: a view, which computes nothing.
    return any(r.alias_info is not None and not r.alias_info.is_write
               for r in overload._schema.returns)


def _samples_random(overload: torch._ops.OpOverload) -> bool:
    # Random samplers draw BF16 samples for BF16 (random_'s range is the dtype's): not
    # rounded from FP32 arithmetic. A Generator argument tells, or being a random factory
    # (torch's nondeterministic_seeded tag also marks dropout, RNNs and attention, which
    # compute on their inputs: it is not the rule).
    return parse_op_name(overload.name()).base in RANDOM_FACTORIES or any(
        "Generator" in str(a.type) for a in overload._schema.arguments)


def rounds_bf16(op: str | torch._ops.OpOverload, on_device: bool = True) -> bool:
    """Whether stochastic rounding applies to ``op``'s BF16 results: every op that
    computes on the device. Views, random samplers, allocations and ops real Trainium
    runs on the host CPU (``on_device=False``) are left alone. Which results of such
    an op are rounded, by dtype, is :func:`rounds_bf16_result`."""
    overload = op_overload(op) if isinstance(op, str) else op
    if not on_device:
        return False
    if overload is None:
        return True  # not registered with torch: an op that computes, as far as we know
    base = parse_op_name(overload.name()).base
    return not (_is_view(overload) or _samples_random(overload) or base in ALLOCATION_OPS)


def rounds_bf16_result(op: str | torch._ops.OpOverload, operand_dtypes: Iterable[torch.dtype],
                       dtype_argument: torch.dtype | None) -> bool:
    """Whether an op that :func:`rounds_bf16` computes a BF16 result of its in FP32 and
    rounds it stochastically: a conversion when its source is FP32; any other op when it
    reads a BF16 operand or is asked for ``dtype=torch.bfloat16``. (The caller knows the
    result is BF16.)"""
    name = op if isinstance(op, str) else op.name()
    operand_dtypes = set(operand_dtypes)
    if parse_op_name(name).base in CONVERSION_OPS:
        return operand_dtypes == {torch.float32}
    return torch.bfloat16 in operand_dtypes or dtype_argument == torch.bfloat16


def wraps_int64(op: str | torch._ops.OpOverload) -> bool:
    """Whether ``TORCHNEURON_INT64_AS_INT32`` wraps ``op``'s int64 results: every op that
    writes int64 data on the device (creation ops, conversions and CPU fallbacks
    included, as their results land in device memory) -- all but views, whose data is
    already wrapped (wrapping them again changes nothing)."""
    overload = op_overload(op) if isinstance(op, str) else op
    return overload is None or not _is_view(overload)


def record_rules(op: str, on_device: bool) -> int:
    """The rule word the C++ op record keeps for ``op`` (asked once per op and dtypes,
    whatever the current settings): :func:`autocast_scopes` and :func:`rounds_bf16`.
    Ops real Trainium runs on the host CPU get none: CPU numerics."""
    if not on_device:
        return 0
    return autocast_scopes(op) | (RULE_ROUNDS_BF16 if rounds_bf16(op) else 0)


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
    _C._set_numerics(_SCOPES[n.auto_cast], n.auto_cast_type, n.stochastic_rounding, n.int64_as_int32,
                     BF16_DROPPED_BITS, INT64_STORED_BITS)
    return n
