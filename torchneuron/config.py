"""Every environment variable torchneuron reads, declared, parsed and checked once.

No other module reads ``os.environ``: they call :func:`get`, :func:`get_flag`,
:func:`value` or :func:`device_topology`, and tests change settings in-process
with :func:`override`. Values are checked here, in Python, before the C++ core
sees them; a bad value is a ``ValueError`` naming the variable, the value and
the accepted forms -- never a process exit. This module imports no torch (and
:mod:`torchneuron.hardware` only inside a function), so it loads on its own.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import os
import shlex
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torchneuron.hardware import Topology

# (variable name, raw value) -> parsed value; raises ValueError naming the variable.
Parser = Callable[[str, str], object]


def parse_flag(name: str, raw: str) -> bool:
    """A boolean setting: 1 or true, 0 or false (any case); anything else is an error."""
    word = raw.strip().lower()
    if word in ("1", "true", "0", "false"):
        return word in ("1", "true")
    raise ValueError(f"{name}={raw!r} is not valid: use 1 (or true) for on, or 0 (or false) for off")


def choice(meanings: Mapping[str, str]) -> Parser:
    """A parser accepting the keys of ``meanings`` (any case); its error explains each."""

    def parse(name: str, raw: str) -> str:
        word = raw.strip().lower()
        if word in meanings:
            return word
        options = " or ".join(f"{k!r} ({v})" for k, v in meanings.items())
        raise ValueError(f"{name}={raw!r} is not valid: use {options}")

    return parse


def parse_positive_int(name: str, raw: str) -> int:
    """A count: a positive integer (underscores allowed, as in Python literals)."""
    text = raw.strip().replace("_", "")
    if text.isdigit() and int(text) >= 1:
        return int(text)
    raise ValueError(f"{name}={raw!r} is not valid: use a positive integer")


def parse_microseconds(name: str, raw: str) -> float:
    """A duration in microseconds: a non-negative number."""
    try:
        value = float(raw.strip())
    except ValueError:
        value = -1.0
    if value >= 0 and value != float("inf"):
        return value
    raise ValueError(f"{name}={raw!r} is not valid: use a non-negative number of microseconds, e.g. 50")


def parse_index(name: str, raw: str) -> int:
    """An index: a non-negative integer."""
    text = raw.strip()
    if text.isdigit():
        return int(text)
    raise ValueError(f"{name}={raw!r} is not valid: use a non-negative integer")


AUTO_CAST_SCOPES = ("none", "matmult", "all")
AUTO_CAST_TYPES = ("bf16", "fp16", "tf32", "fp8_e4m3")
_CC_DEFAULTS = {"--auto-cast": "none", "--auto-cast-type": "bf16"}  # the flags read
_CC_FORMS = ("torchneuron reads --auto-cast {none,matmult,all} and --auto-cast-type "
             "{bf16,fp16,tf32,fp8_e4m3}, written in full as '--flag value' or '--flag=value'; "
             "other compiler flags are ignored")


def parse_cc_flags(name: str, raw: str) -> tuple[str, str]:
    """(auto_cast, auto_cast_type) from Neuron compiler flags.

    A small hand parser, not argparse: argparse exits the process on some errors
    (an ambiguous abbreviation such as ``--auto`` on Python 3.11, whatever
    ``exit_on_error`` says), and a setting must never do that. Abbreviations of
    the two flags are refused rather than guessed.
    """

    def bad(reason: str) -> ValueError:
        return ValueError(f"{name}={raw!r}: {reason}; {_CC_FORMS}")

    try:
        tokens = shlex.split(raw)
    except ValueError as e:  # unbalanced quotes
        raise bad(f"it does not split into words ({e})") from None
    found = dict(_CC_DEFAULTS)
    i = 0
    while i < len(tokens):
        flag, has_value, inline = tokens[i].partition("=")
        i += 1
        if flag in found:
            if has_value:
                found[flag] = inline
            elif i < len(tokens) and not tokens[i].startswith("-"):
                found[flag] = tokens[i]
                i += 1
            else:
                raise bad(f"{flag} needs a value")
        elif len(flag) > 2 and flag.startswith("--") and any(f.startswith(flag) for f in found):
            meant = " or ".join(f for f in found if f.startswith(flag))
            raise bad(f"{flag!r} abbreviates {meant}: write the flag in full")
    scope, cast_type = found["--auto-cast"], found["--auto-cast-type"]
    if scope not in AUTO_CAST_SCOPES:
        raise ValueError(f"{name}={raw!r}: --auto-cast {scope!r} is not valid; "
                         f"use one of {', '.join(AUTO_CAST_SCOPES)}")
    if cast_type not in AUTO_CAST_TYPES:
        raise ValueError(f"{name}={raw!r}: --auto-cast-type {cast_type!r} is not valid; "
                         f"use one of {', '.join(AUTO_CAST_TYPES)}")
    return scope, cast_type


@dataclasses.dataclass(frozen=True, kw_only=True)
class EnvVar:
    name: str
    default: str | None
    doc: str
    # Checks and converts a set value. None: free text (a path), or checked with the
    # other topology variables by device_topology().
    parse: Parser | None = None
    # Who reads it: "device" settings are applied when the device registers (a bad one
    # leaves the process without neuron devices); "compile", "nki" and "distributed"
    # ones when used.
    area: str = "device"


ENV_VARS: dict[str, EnvVar] = {
    v.name: v
    for v in (
        EnvVar(
            name="NEURON_PLATFORM_TARGET_OVERRIDE",
            default=None,
            doc="Chip to model: trn1|inf2|gen2, trn2|gen3 or trn3|gen4 (default trn2); "
                "also the NKI simulator's target.",
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
            doc="Instance type to model: trn2.3xlarge (default), trn2.48xlarge, trn2u.48xlarge, or for comparing "
                "generations trn1.2xlarge, trn1.32xlarge, trn1n.32xlarge, and a Trn3 UltraServer as one unit: "
                "trn3-ultraserver-gen1 (64 chips), trn3-ultraserver-gen2 (144 chips).",
        ),
        EnvVar(
            name="TORCHNEURON_CPU_FALLBACK",
            default="1",
            doc="1: ops real Trainium runs on the CPU run, counted, with a warning per op; "
                "0: they raise NotImplementedError (strict mode, for CI).",
            parse=parse_flag,
        ),
        EnvVar(
            name="TORCHNEURON_COST_MODEL",
            default="1",
            doc="1: charge each op its modelled Trainium time on its stream's device clock; "
                "0: no modelled time (events then measure host time).",
            parse=parse_flag,
        ),
        EnvVar(
            name="TORCHNEURON_EVENT_TIME",
            default="modeled",
            doc="What Event.elapsed_time measures: 'modeled' Trainium time or 'host' time.",
            parse=choice({"modeled": "Trainium time from the cost model",
                          "host": "wall-clock time"}),
        ),
        EnvVar(
            name="NEURON_CC_FLAGS",
            default="",
            doc="Neuron compiler flags; torchneuron honours --auto-cast {none,matmult,all} and "
                "--auto-cast-type {bf16,fp16,tf32,fp8_e4m3} (off unless given, unlike neuronx-cc).",
            parse=parse_cc_flags,
        ),
        EnvVar(
            name="NEURON_RT_STOCHASTIC_ROUNDING_EN",
            default="0",
            doc="1: FP32 to BF16 conversions on neuron round stochastically, as the hardware can.",
            parse=parse_flag,
        ),
        EnvVar(
            name="TORCHNEURON_INT64_AS_INT32",
            default="0",
            doc="1: int64 results wrap around at 32 bits, as Trainium computes int64 in int32.",
            parse=parse_flag,
        ),
        EnvVar(
            name="TORCHNEURON_NATIVE_INT64",
            default="0",
            doc="1: model Trn2/Trn3 native INT64 (a compiler flag on real hardware); "
                "0: int64 is computed as int32.",
            parse=parse_flag,
        ),
        EnvVar(
            name="TORCHNEURON_SYNC_DEBUG",
            default="default",
            doc="What a host synchronisation (.item(), .cpu(), .tolist(), printing, nonzero, "
                "torch.neuron.synchronize) does, as torch.cuda.set_sync_debug_mode: "
                "default (0) nothing, warn (1) a warning at the caller's line, error (2) a "
                "RuntimeError; torch.neuron.set_sync_debug_mode sets it.",
            parse=choice({"default": "or 0: nothing", "warn": "or 1: a UserWarning",
                          "error": "or 2: a RuntimeError", "0": "default", "1": "warn",
                          "2": "error"}),
        ),
        EnvVar(
            name="NEURON_LAUNCH_BLOCKING",
            default="0",
            doc="TorchNeuron's synchronous execution for debugging (trainium-facts.md: TorchNeuron "
                "names and switches); accepted, and always in effect here: each op has run when "
                "its call returns.",
            parse=parse_flag,
        ),
        EnvVar(
            name="TORCHNEURON_DATALESS",
            default="0",
            doc="1: dataless execution for the whole process: neuron ops compute shapes, memory "
                "and modelled time but no values (as torchneuron.dataless()); reads of values "
                "(.item(), printing, .cpu()) return placeholders and are listed. 0: off.",
            parse=parse_flag,
        ),
        EnvVar(
            name="TORCHNEURON_DETECT_NONFINITE",
            default="0",
            doc="1: every eager neuron op's floating-point outputs are checked, and the first "
                "NaN or Inf raises naming the op, its Python stack and its inputs' statistics "
                "(as torchneuron.debug.detect_nonfinite()); 0: off, at no cost.",
            parse=parse_flag,
        ),
        EnvVar(
            name="TORCH_NEURONX_ENABLE_STACK_TRACE",
            default="0",
            doc="1: each piece of device work a profiler records keeps its Python stack (the frames "
                "outside torch and torchneuron, innermost first), shown as 'call site' (the innermost) "
                "and 'python stack' in torch.profiler traces, and each CPU-fallback call site keeps "
                "the whole stacks that reached it (torchneuron check turns it on for its run and "
                "shows them); 0: off, costing the op path nothing.",
            parse=parse_flag,
        ),
        EnvVar(
            name="TORCH_NEURONX_DISABLE_FALLBACK_EXECUTION",
            default="1",
            doc="1: a torch.compile(backend='neuron') failure raises; 0: the graph runs eagerly "
                "instead, with a warning.",
            parse=parse_flag,
            area="compile",
        ),
        EnvVar(
            name="TORCH_NEURONX_DEBUG_DIR",
            default=None,
            doc="Directory where torch.compile(backend='neuron') writes each graph after the "
                "Neuron passes, with the ops left to the CPU (off when unset).",
            area="compile",
        ),
        EnvVar(
            name="NEURON_COMPILE_CACHE_URL",
            default=None,
            doc="Directory of the persistent compile cache (default: torchneuron/compile under "
                "the user cache directory, $XDG_CACHE_HOME or ~/.cache).",
            area="compile",
        ),
        EnvVar(
            name="XDG_CACHE_HOME",
            default=None,
            doc="The user cache directory (freedesktop convention); the compile cache lives under it.",
            area="compile",
        ),
        EnvVar(
            name="TORCHNEURON_COMPILE_CACHE_KEY_FILE",
            default=None,
            doc="This user's secret key (mode 0600, made on first use) that seals compile cache "
                "entries (default: torchneuron/compile-cache.key under $XDG_CONFIG_HOME or ~/.config).",
            area="compile",
        ),
        EnvVar(
            name="TORCHNEURON_COMPILE_CACHE_ALLOW_SHARED",
            default="0",
            doc="1: use a compile cache directory that others can write to or that you do not own "
                "(entries are still verified with your key); 0: refuse it.",
            parse=parse_flag,
            area="compile",
        ),
        EnvVar(
            name="XDG_CONFIG_HOME",
            default=None,
            doc="The user configuration directory (freedesktop convention); holds the compile cache key.",
            area="compile",
        ),
        EnvVar(
            name="ATEN_CPU_CAPABILITY",
            default=None,
            doc="PyTorch's CPU vector ISA override (read by PyTorch); part of the compile cache key.",
            area="compile",
        ),
        EnvVar(
            name="TORCHNEURON_NKI_UNINITIALIZED",
            default="warn",
            doc="What an NKI kernel reading never-written memory does: warn, error or ignore "
                "(a kernel's uninitialized= argument takes precedence).",
            parse=choice({"warn": "a warning per kernel line", "error": "an error",
                          "ignore": "nothing"}),
            area="nki",
        ),
        EnvVar(
            name="TORCHNEURON_NKI_MAX_INSTRUCTIONS",
            default="1000000",
            doc="Instructions one NKI kernel launch may issue on the simulator before it is stopped "
                "with an error naming the kernel's loop (a positive integer).",
            parse=parse_positive_int,
            area="nki",
        ),
        EnvVar(
            name="NKI_PRECISE_FP",
            default="1",
            doc="1: NKI simulator tiles of bf16/fp16/fp8 hold values rounded to their dtype, as hardware "
                "does; 0: on-chip tiles of those dtypes hold fp32 values (AWS's legacy widened storage, "
                "to tell algorithm bugs from precision loss).",
            parse=parse_flag,
            area="nki",
        ),
        EnvVar(
            name="NKI_DMA_TRANSPOSE_AS_PE_TRANSPOSE",
            default="0",
            doc="1: NKI kernels on trn2/trn3 have 7 usable PSUM banks (bank 7 is reserved for "
                "nc_transpose); 0: 8.",
            parse=parse_flag,
            area="nki",
        ),
        EnvVar(
            name="LOCAL_RANK",
            default=None,
            doc="Set by torchrun: this process's rank on its host. The neuron process group "
                "makes neuron:LOCAL_RANK the current device (neuron:0 when NEURON_RT_VISIBLE_CORES "
                "gives the process one core).",
            parse=parse_index,
            area="distributed",
        ),
        EnvVar(
            name="RANK",
            default=None,
            doc="Set by torchrun (and by `torchneuron plan` for a planned rank): this process's "
                "global rank.",
            parse=parse_index,
            area="distributed",
        ),
        EnvVar(
            name="WORLD_SIZE",
            default=None,
            doc="Set by torchrun (and by `torchneuron plan`): how many ranks the job has.",
            parse=parse_positive_int,
            area="distributed",
        ),
        EnvVar(
            name="LOCAL_WORLD_SIZE",
            default=None,
            doc="Set by torchrun: processes per host. Places ranks on instances and chips for "
                "the modelled collective time (default: all ranks on one instance).",
            parse=parse_positive_int,
            area="distributed",
        ),
        EnvVar(
            name="TORCHNEURON_SIMULATED_WORLD",
            default="0",
            doc="1: this process is one rank of a simulated job (set by `torchneuron plan`): neuron "
                "process groups move no data, their collectives complete at once and are charged "
                "their modelled time on the job's topology; use with TORCHNEURON_DATALESS=1.",
            parse=parse_flag,
            area="distributed",
        ),
        EnvVar(
            name="TORCHNEURON_COLLECTIVE_LAUNCH_US",
            default="0",
            doc="Microseconds each collective pays before its first step (the Neuron runtime's "
                "trigger of a collective core, semaphores, DMA descriptors), added to the modelled "
                "time. AWS publishes no figure (docs/planning.md), so the default is 0; calibrate "
                "it from your own nccom-test run, or sweep it (torchneuron plan --env ...).",
            parse=parse_microseconds,
            area="distributed",
        ),
        EnvVar(
            name="TORCHNEURON_COLLECTIVE_TRACE_SIZE",
            default="256",
            doc="Collectives (and sends/receives) each rank's flight recorder keeps, newest last "
                "(torchneuron.distributed.flight_recorder; like TORCH_NCCL_TRACE_BUFFER_SIZE).",
            parse=parse_positive_int,
            area="distributed",
        ),
        EnvVar(
            name="TORCHNEURON_COLLECTIVE_TRACE_DIR",
            default=None,
            doc="Directory where a rank writes its flight recorder (JSON, torchneuron_trace_rank<R>.json) "
                "when a collective fails or the watchdog finds one stuck (default: not written).",
            area="distributed",
        ),
        EnvVar(
            name="TORCHNEURON_COLLECTIVE_WATCHDOG_SECONDS",
            default=None,
            doc="Seconds after which the watchdog reports a collective still running (a warning and "
                "a flight-recorder dump; the process keeps running). Default: the group's timeout; "
                "0 turns the watchdog off.",
            parse=parse_index,
            area="distributed",
        ),
    )
}

_TOPOLOGY_VARS = ("TORCHNEURON_INSTANCE", "NEURON_PLATFORM_TARGET_OVERRIDE",
                  "NEURON_LOGICAL_NC_CONFIG", "NEURON_RT_VISIBLE_CORES")  # device_topology's key order

# PyTorch stores device counts and indices as c10::DeviceIndex, an int8_t, so one
# process has at most 127 devices of a type (csrc/core.h kMaxDevices is 128 and
# csrc/module.cpp init_devices checks the count is below it).
MAX_DEVICES = 127

_overrides: contextvars.ContextVar[Mapping[str, str | None]] = contextvars.ContextVar(
    "torchneuron_config_overrides", default={}
)


def _declared(name: str) -> EnvVar:
    if name not in ENV_VARS:
        raise KeyError(f"{name} is not a torchneuron setting; known: {sorted(ENV_VARS)}")
    return ENV_VARS[name]


# Each declared name as os.environ stores it (bytes on POSIX), made on first read.
_env_keys: dict[str, object] = {}


def _environment(name: str) -> str | None:
    """``os.environ.get(name)``, read in ~0.1 us instead of ~0.7 us for an unset name.

    Why: collectives read settings at every call, and ``os.environ.get`` of an unset name
    raises and catches a ``KeyError`` inside ``Mapping.get``. ``os._Environ`` keeps its
    entries in the dict ``_data`` (keys and values encoded with its ``encodekey`` and
    ``decodevalue``), which every write through ``os.environ`` (``monkeypatch.setenv``,
    ``os.environ[...] =``, ``pop``, ``update``) changes, so reading it sees exactly what
    ``os.environ.get`` sees. That layout is CPython's private one (unchanged since 3.2,
    checked on 3.11); anything else in ``os.environ`` is read through ``get``.
    """
    env = os.environ
    if type(env) is not _STANDARD_ENVIRON:  # replaced by someone: its own get
        return env.get(name)
    key = _env_keys.get(name)
    if key is None:
        key = _env_keys[name] = env.encodekey(name)
    raw = env._data.get(key)
    return None if raw is None else env.decodevalue(raw)


_STANDARD_ENVIRON = os._Environ


def _raw(name: str, overrides: Mapping[str, str | None]) -> str | None:
    """The raw value of declared ``name`` under ``overrides`` (the current context's)."""
    value = overrides[name] if name in overrides else _environment(name)
    return ENV_VARS[name].default if value is None or value == "" else value


def get(name: str) -> str | None:
    """The raw value of a declared variable: override, then environment, then default.

    An empty value, or an override of None, counts as unset (the default).
    """
    _declared(name)
    return _raw(name, _overrides.get())


# (name, raw text) -> parsed value: parsers are pure, and collectives read some settings
# at every call. Bad values are not kept (they raise at every read).
_parsed: dict[tuple[str, str], object] = {}
_PARSED_KEPT = 256


def value(name: str) -> object:
    """The parsed value of a declared variable (raw text for variables without a parser).

    Raises:
        ValueError: naming the variable, its value and the accepted forms.
    """
    var = _declared(name)
    raw = _raw(name, _overrides.get())
    if raw is None or var.parse is None:
        return raw
    key = (name, raw)
    try:
        return _parsed[key]
    except KeyError:
        pass
    parsed = var.parse(name, raw)
    if len(_parsed) >= _PARSED_KEPT:
        _parsed.clear()
    _parsed[key] = parsed
    return parsed


def get_flag(name: str) -> bool:
    """A boolean setting; any value but 1/true/0/false is an error naming the variable."""
    if _declared(name).parse is not parse_flag:
        raise TypeError(f"{name} is not a boolean setting")
    return bool(value(name))


def environ() -> dict[str, str]:
    """All declared variables that are set, as a mapping."""
    values = {name: get(name) for name in ENV_VARS}
    return {k: v for k, v in values.items() if v is not None}


# The last topology resolved, keyed by the raw values of _TOPOLOGY_VARS: every collective
# charges its modelled time with it, and resolving it again read every setting (~0.1 ms).
# Keyed by the values, not invalidated by hooks, so a change by any route (override,
# set_value, the environment itself) is seen at the next call.
_topology_cache: tuple[tuple[str | None, ...], Topology] | None = None


def device_topology() -> Topology:
    """The devices the topology variables select, checked against PyTorch's device limit.

    Raises:
        ValueError: naming the variables at fault and how to fix them.
    """
    global _topology_cache
    overrides = _overrides.get()
    key = (_raw("TORCHNEURON_INSTANCE", overrides), _raw("NEURON_PLATFORM_TARGET_OVERRIDE", overrides),
           _raw("NEURON_LOGICAL_NC_CONFIG", overrides), _raw("NEURON_RT_VISIBLE_CORES", overrides))
    cached = _topology_cache
    if cached is not None and cached[0] == key:
        return cached[1]
    from torchneuron.hardware import topology_from_env  # pure Python, no torch

    topology = topology_from_env({n: v for n, v in zip(_TOPOLOGY_VARS, key) if v is not None})
    if topology.device_count > MAX_DEVICES:
        settings = ", ".join(f"{n}={get(n)!r}" for n in _TOPOLOGY_VARS if get(n) is not None)
        raise ValueError(
            f"{settings or 'the default settings'} give {topology.device_count} neuron devices "
            f"({topology.num_chips} {topology.chip.name} chip(s) x {topology.logical_cores_per_chip} "
            f"logical cores at LNC={topology.lnc}), but PyTorch numbers a process's devices with "
            f"c10::DeviceIndex (int8), so torchneuron supports at most {MAX_DEVICES}: set "
            f"NEURON_RT_VISIBLE_CORES to the cores this process uses (e.g. "
            f"NEURON_RT_VISIBLE_CORES=0-63, one process per group of cores as on hardware)"
            + (", or NEURON_LOGICAL_NC_CONFIG=2" if topology.lnc == 1 else "")
        )
    _topology_cache = (key, topology)
    return topology


def problems(area: str | None = None) -> list[str]:
    """What is wrong with the settings (of ``area``, or all), one message per problem."""
    found = []
    for name, var in ENV_VARS.items():
        if var.parse is not None and area in (None, var.area):
            try:
                value(name)
            except ValueError as e:
                found.append(str(e))
    if area in (None, "device"):
        try:
            device_topology()
        except ValueError as e:
            found.append(str(e))
    return found


def check(area: str | None = None) -> None:
    """Raises one ValueError listing every problem with the settings (of ``area``)."""
    found = problems(area)
    if found:
        raise ValueError("\n".join(found))


@contextlib.contextmanager
def override(**values: str | None) -> Iterator[None]:
    """Temporarily sets variables in this thread/context (None unsets one).

    Values are text, as in the environment, and are checked when read.
    """
    unknown = set(values) - set(ENV_VARS)
    if unknown:
        raise KeyError(f"Unknown torchneuron settings {sorted(unknown)}; known: {sorted(ENV_VARS)}")
    for name, v in values.items():
        if v is not None and not isinstance(v, str):
            raise TypeError(f"override({name}={v!r}): settings are text, as in the environment "
                            f"(e.g. '1'), or None to unset")
    token = _overrides.set({**_overrides.get(), **values})
    try:
        _apply(values)
    except BaseException:
        _overrides.reset(token)
        _apply(values)  # the previous values reach C++ again
        raise
    try:
        yield
    finally:
        _overrides.reset(token)
        _apply(values)


# What the C++ core holds of the settings (the cost model, strict fallback, numerics
# switches): each holder registers how to re-read its variables, and every change made
# through :func:`override` or :func:`set_value` reaches it at once. The core's copy is
# process-wide, so an override in one thread applies to all while it lasts.
_appliers: list[tuple[frozenset[str], Callable[[], None]]] = []


def on_change(names: Iterator[str] | tuple[str, ...] | list[str], apply: Callable[[], None]) -> None:
    """Registers ``apply`` to run whenever one of ``names`` changes."""
    names = frozenset(names)
    for name in names:
        _declared(name)
    _appliers.append((names, apply))


def _apply(changed: Mapping[str, object]) -> None:
    for names, apply in _appliers:
        if names.intersection(changed):
            apply()


def set_value(name: str, raw: str | None) -> None:
    """Sets a variable for the rest of the process (None unsets it), as if exported
    before start, and applies it. Raises ValueError, leaving the old value, if it is bad."""
    var = _declared(name)
    if raw is not None and not isinstance(raw, str):
        raise TypeError(f"set_value({name!r}, {raw!r}): settings are text, as in the environment")
    old = os.environ.get(name)
    if raw is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = raw
    try:
        if var.parse is not None:
            value(name)
        _apply({name: raw})
    except BaseException:
        if old is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = old
        _apply({name: old})
        raise
