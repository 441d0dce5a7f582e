"""Which logical NeuronCores a process sees, and what each one is worth.

A *logical* NeuronCore (the unit ``torch.neuron`` calls a device, and the unit
distributed training shards over) is ``lnc`` adjacent physical cores of one
chip. It owns ``1 / logical_cores_per_chip`` of that chip's HBM and ``lnc``
times a physical core's SBUF, TensorE throughput and DMA bandwidth
(trainium-facts.md: Chips table, note below it).

Inputs mirror the environment variables a Neuron user already sets; this module
never reads ``os.environ`` itself: :func:`topology_from_env` takes the mapping.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from torchneuron.hardware.specs import (ChipSpec, InstanceSpec, INSTANCES, get_chip, get_instance,
                                        target_family)

__all__ = [
    "LogicalDevice",
    "Topology",
    "resolve_topology",
    "topology_from_env",
    "TARGET_ENV",
    "LNC_ENV",
    "VISIBLE_CORES_ENV",
    "INSTANCE_ENV",
    "DEFAULT_INSTANCE",
]

TARGET_ENV = "NEURON_PLATFORM_TARGET_OVERRIDE"
LNC_ENV = "NEURON_LOGICAL_NC_CONFIG"
VISIBLE_CORES_ENV = "NEURON_RT_VISIBLE_CORES"
INSTANCE_ENV = "TORCHNEURON_INSTANCE"

# With nothing set we model the smallest Trn2 machine (trainium-facts.md: Instances).
DEFAULT_INSTANCE = "trn2.3xlarge"


@dataclass(frozen=True, kw_only=True)
class LogicalDevice:
    """One ``neuron:<index>`` device. Throughput figures are already scaled by LNC."""

    index: int
    core_id: int
    chip_index: int
    physical_cores: tuple[int, ...]
    name: str
    hbm_bytes: int
    sbuf_bytes: int
    dma_bytes_per_second: float
    tensor_fp32_flops_per_second: float
    tensor_bf16_flops_per_second: float
    tensor_fp8_flops_per_second: float | None
    tensor_mx_flops_per_second: float | None


@dataclass(frozen=True, kw_only=True)
class Topology:
    """The chips behind this process and the logical devices it may use."""

    chip: ChipSpec
    instance: InstanceSpec | None
    lnc: int
    num_chips: int
    devices: tuple[LogicalDevice, ...]
    # torch.neuron.get_device_properties().name, as TorchNeuron names it (torchtitan reads it):
    # the instance's family (trn1, trn1n, trn2, trn2u, trn3u), else the target's (trn1, inf2, ...)
    family: str

    @property
    def device_count(self) -> int:
        """Number of visible logical devices (what ``torch.neuron.device_count()`` reports)."""
        return len(self.devices)

    @property
    def total_hbm_bytes(self) -> int:
        """HBM of the visible devices only; hidden cores' memory is not ours to allocate."""
        return sum(device.hbm_bytes for device in self.devices)

    @property
    def logical_cores_per_chip(self) -> int:
        return self.chip.physical_cores_per_chip // self.lnc


def resolve_topology(
    *,
    target: str | None = None,
    lnc: int | str | None = None,
    visible_cores: str | None = None,
    instance: str | None = None,
) -> Topology:
    """Build the device topology the runtime would expose.

    Args:
        target: chip, as ``NEURON_PLATFORM_TARGET_OVERRIDE`` spells it (``trn2``,
            ``gen3``, ...). ``None`` means the instance's chip, or ``trn2``.
        lnc: physical cores per logical core, as ``NEURON_LOGICAL_NC_CONFIG``
            (1 or 2, int or string). ``None`` means the chip's default.
        visible_cores: ``NEURON_RT_VISIBLE_CORES`` syntax, e.g. ``"0-3,6"``.
            ``None`` means every logical core.
        instance: instance type such as ``"trn2.48xlarge"``; sets chip and chip
            count. ``None`` means one chip (``trn2.3xlarge`` if ``target`` is
            also ``None``).

    Raises:
        ValueError: naming the environment variable whose value is invalid.
    """
    chip, inst = _resolve_chip(target, instance)
    num_chips = inst.num_chips if inst is not None else 1
    lnc_value = _parse_lnc(lnc, chip)
    per_chip = chip.physical_cores_per_chip // lnc_value
    total = per_chip * num_chips
    if visible_cores is None:
        core_ids = list(range(total))
    else:
        core_ids = _parse_visible_cores(visible_cores, total, _describe(chip, num_chips, lnc_value))
    devices = tuple(
        _logical_device(chip, lnc_value, index, core_id) for index, core_id in enumerate(core_ids)
    )
    family = inst.family if inst is not None else target_family(target or chip.name)
    return Topology(chip=chip, instance=inst, lnc=lnc_value, num_chips=num_chips, devices=devices,
                    family=family)


def topology_from_env(environ: Mapping[str, str]) -> Topology:
    """:func:`resolve_topology` from environment variables; empty values count as unset.

    The caller passes ``environ`` (usually ``os.environ``) so tests and config
    overrides never have to mutate the real process environment.
    """

    def get(key: str) -> str | None:
        value = environ.get(key)
        return value if value is not None and value.strip() else None

    return resolve_topology(
        target=get(TARGET_ENV),
        lnc=get(LNC_ENV),
        visible_cores=get(VISIBLE_CORES_ENV),
        instance=get(INSTANCE_ENV),
    )


def _resolve_chip(target: str | None, instance: str | None) -> tuple[ChipSpec, InstanceSpec | None]:
    if target is None and instance is None:
        instance = DEFAULT_INSTANCE
    # get_chip's error already names NEURON_PLATFORM_TARGET_OVERRIDE and the valid spellings.
    chip = get_chip(target) if target is not None else None
    if instance is None:
        return chip, None
    try:
        inst = get_instance(instance)
    except ValueError:
        raise ValueError(
            f"{INSTANCE_ENV}={instance!r} is not a known instance type; "
            f"known: {', '.join(INSTANCES)}"
        ) from None
    if chip is not None and chip.name != inst.chip:
        raise ValueError(
            f"{TARGET_ENV}={target!r} ({chip.name}) conflicts with {INSTANCE_ENV}={instance!r}, "
            f"which carries {inst.chip} chips; unset one of them or make them agree"
        )
    return get_chip(inst.chip), inst


def _parse_lnc(lnc: int | str | None, chip: ChipSpec) -> int:
    if lnc is None:
        return chip.default_lnc
    value = None
    if isinstance(lnc, int) and not isinstance(lnc, bool):
        value = lnc
    elif isinstance(lnc, str) and lnc.strip() in ("1", "2"):
        value = int(lnc.strip())
    if value not in chip.supported_lnc:
        supported = " or ".join(str(v) for v in chip.supported_lnc)
        raise ValueError(
            f"{LNC_ENV}={lnc!r} is not supported on {chip.name} ({chip.marketing_name}); "
            f"use {supported}"
        )
    return value


# One comma-separated item: "3" or "0-3", spaces allowed around numbers and the dash.
_CORE_RANGE = re.compile(r"\s*([0-9]+)\s*(?:-\s*([0-9]+)\s*)?")


def _parse_visible_cores(spec: str, total: int, context: str) -> list[int]:
    """Parse ``NEURON_RT_VISIBLE_CORES`` into ascending logical core ids."""

    def fail(reason: str) -> ValueError:
        return ValueError(
            f"{VISIBLE_CORES_ENV}={spec!r} is invalid: {reason}; valid logical core ids are "
            f"0-{total - 1} ({context}), written like '2', '0-1', '0,2' or '0-3,6'"
        )

    if not isinstance(spec, str) or not spec.strip():
        raise fail("it is empty")
    seen: set[int] = set()
    for item in spec.split(","):
        if not item.strip():
            raise fail("an item between commas is empty")
        match = _CORE_RANGE.fullmatch(item)
        if match is None:
            raise fail(f"cannot parse {item.strip()!r}")
        first = int(match.group(1))
        last = int(match.group(2)) if match.group(2) is not None else first
        if last < first:
            raise fail(f"range {first}-{last} is descending")
        if last >= total:
            raise fail(f"core {last} is out of range")
        for core in range(first, last + 1):
            if core in seen:
                raise fail(f"core {core} is listed twice")
            seen.add(core)
    return sorted(seen)


def _describe(chip: ChipSpec, num_chips: int, lnc: int) -> str:
    per_chip = chip.physical_cores_per_chip // lnc
    return f"{num_chips} x {chip.name} chip(s) x {per_chip} logical cores at LNC={lnc}"


def _logical_device(chip: ChipSpec, lnc: int, index: int, core_id: int) -> LogicalDevice:
    # Logical core k of a chip spans physical cores [k*lnc, (k+1)*lnc): adjacent
    # pairing is our assumption, the facts sheet does not say which cores pair up.
    per_chip = chip.physical_cores_per_chip // lnc
    chip_index, local = divmod(core_id, per_chip)
    return LogicalDevice(
        index=index,
        core_id=core_id,
        chip_index=chip_index,
        physical_cores=tuple(range(local * lnc, (local + 1) * lnc)),
        name=chip.marketing_name,
        hbm_bytes=chip.hbm_bytes_per_chip // per_chip,
        sbuf_bytes=chip.sbuf_bytes_per_core * lnc,
        dma_bytes_per_second=chip.dma_bytes_per_second_per_core * lnc,
        tensor_fp32_flops_per_second=chip.tensor_fp32_flops_per_second * lnc,
        tensor_bf16_flops_per_second=chip.tensor_bf16_flops_per_second * lnc,
        tensor_fp8_flops_per_second=_scale(chip.tensor_fp8_flops_per_second, lnc),
        tensor_mx_flops_per_second=_scale(chip.tensor_mx_flops_per_second, lnc),
    )


def _scale(figure: float | None, lnc: int) -> float | None:
    return None if figure is None else figure * lnc
