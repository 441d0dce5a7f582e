"""Every environment variable torchneuron reads, declared once.

No other module reads ``os.environ``: they call :func:`get` or :func:`environ`,
and tests change settings in-process with :func:`override`.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import os
from collections.abc import Iterator, Mapping


@dataclasses.dataclass(frozen=True, kw_only=True)
class EnvVar:
    name: str
    default: str | None
    doc: str


ENV_VARS: dict[str, EnvVar] = {
    v.name: v
    for v in (
        EnvVar(
            name="NEURON_PLATFORM_TARGET_OVERRIDE",
            default=None,
            doc="Chip to model: trn1|inf2|gen2, trn2|gen3 or trn3|gen4 (default trn2).",
        ),
        EnvVar(
            name="NEURON_LOGICAL_NC_CONFIG",
            default=None,
            doc="Physical cores per logical device: 1 or 2 (default 2 on Trn2/Trn3).",
        ),
        EnvVar(
            name="NEURON_RT_VISIBLE_CORES",
            default=None,
            doc="Logical cores this process sees, e.g. '0-1', '2', '0,2'; renumbered from 0.",
        ),
        EnvVar(
            name="TORCHNEURON_INSTANCE",
            default=None,
            doc="Instance type to model, e.g. trn2.3xlarge (default) or trn2.48xlarge.",
        ),
        EnvVar(
            name="TORCHNEURON_CPU_FALLBACK",
            default="1",
            doc="1: ops real Trainium runs on the CPU run, counted, with a warning per op; "
                "0: they raise NotImplementedError (strict mode, for CI).",
        ),
        EnvVar(
            name="TORCHNEURON_COST_MODEL",
            default="1",
            doc="1: charge each op its modelled Trainium time on its stream's device clock; "
                "0: no modelled time (events then measure host time).",
        ),
        EnvVar(
            name="TORCHNEURON_EVENT_TIME",
            default="modeled",
            doc="What Event.elapsed_time measures: 'modeled' Trainium time or 'host' time.",
        ),
        EnvVar(
            name="NEURON_CC_FLAGS",
            default="",
            doc="Neuron compiler flags; torchneuron honours --auto-cast {none,matmult,all} and "
                "--auto-cast-type {bf16,fp16,tf32,fp8_e4m3} (off unless given, unlike neuronx-cc).",
        ),
        EnvVar(
            name="NEURON_RT_STOCHASTIC_ROUNDING_EN",
            default="0",
            doc="1: FP32 to BF16 conversions on neuron round stochastically, as the hardware can.",
        ),
        EnvVar(
            name="TORCHNEURON_INT64_AS_INT32",
            default="0",
            doc="1: int64 results wrap around at 32 bits, as Trainium computes int64 in int32.",
        ),
        EnvVar(
            name="TORCHNEURON_NATIVE_INT64",
            default="0",
            doc="1: model Trn2/Trn3 native INT64 (a compiler flag on real hardware); "
                "0: int64 is computed as int32.",
        ),
        EnvVar(
            name="TORCH_NEURONX_DISABLE_FALLBACK_EXECUTION",
            default="1",
            doc="1: a torch.compile(backend='neuron') failure raises; 0: the graph runs eagerly "
                "instead, with a warning.",
        ),
        EnvVar(
            name="TORCH_NEURONX_DEBUG_DIR",
            default=None,
            doc="Directory where torch.compile(backend='neuron') writes each graph after the "
                "Neuron passes, with the ops left to the CPU (off when unset).",
        ),
        EnvVar(
            name="NEURON_COMPILE_CACHE_URL",
            default=None,
            doc="Directory of the persistent compile cache (default: torchneuron/compile under "
                "the user cache directory, $XDG_CACHE_HOME or ~/.cache).",
        ),
        EnvVar(
            name="XDG_CACHE_HOME",
            default=None,
            doc="The user cache directory (freedesktop convention); the compile cache lives under it.",
        ),
        EnvVar(
            name="TORCHNEURON_COMPILE_CACHE_KEY_FILE",
            default=None,
            doc="This user's secret key (mode 0600, made on first use) that seals compile cache "
                "entries (default: torchneuron/compile-cache.key under $XDG_CONFIG_HOME or ~/.config).",
        ),
        EnvVar(
            name="TORCHNEURON_COMPILE_CACHE_ALLOW_SHARED",
            default="0",
            doc="1: use a compile cache directory that others can write to or that you do not own "
                "(entries are still verified with your key); 0: refuse it.",
        ),
        EnvVar(
            name="XDG_CONFIG_HOME",
            default=None,
            doc="The user configuration directory (freedesktop convention); holds the compile cache key.",
        ),
        EnvVar(
            name="ATEN_CPU_CAPABILITY",
            default=None,
            doc="PyTorch's CPU vector ISA override (read by PyTorch); part of the compile cache key.",
        ),
    )
}

_overrides: contextvars.ContextVar[Mapping[str, str | None]] = contextvars.ContextVar(
    "torchneuron_config_overrides", default={}
)


def get(name: str) -> str | None:
    """The value of a declared variable (override, then environment, then default)."""
    if name not in ENV_VARS:
        raise KeyError(f"{name} is not a torchneuron setting; known: {sorted(ENV_VARS)}")
    overrides = _overrides.get()
    if name in overrides:
        return overrides[name]
    value = os.environ.get(name)
    return ENV_VARS[name].default if value in (None, "") else value


def get_flag(name: str) -> bool:
    """A 0/1 setting as a bool; any other value is an error naming the variable."""
    value = get(name)
    if value not in ("0", "1"):
        raise ValueError(f"{name}={value!r} is not valid: use 1 (on) or 0 (off)")
    return value == "1"


def environ() -> dict[str, str]:
    """All declared variables that are set, as a mapping."""
    values = {name: get(name) for name in ENV_VARS}
    return {k: v for k, v in values.items() if v is not None}


@contextlib.contextmanager
def override(**values: str | None) -> Iterator[None]:
    """Temporarily sets variables in this thread/context (None unsets one)."""
    unknown = set(values) - set(ENV_VARS)
    if unknown:
        raise KeyError(f"Unknown torchneuron settings {sorted(unknown)}; known: {sorted(ENV_VARS)}")
    token = _overrides.set({**_overrides.get(), **values})
    try:
        yield
    finally:
        _overrides.reset(token)
