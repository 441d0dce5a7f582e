"""What a neuron device is: name, memory and engine figures from the hardware model."""

from __future__ import annotations

import dataclasses

from torchneuron.device._core import Device, device_index, topology

__all__ = ["get_device_capability", "get_device_name", "get_device_properties"]


@dataclasses.dataclass(frozen=True)
class _NeuronDeviceProperties:
    """Properties of one logical NeuronCore (``torch.neuron.get_device_properties``).

    ``name`` is the chip family as TorchNeuron reports it (``trn1``, ``trn1n``, ``inf2``,
    ``trn2``, ``trn2u``, ``trn3``, ``trn3u``): torchtitan picks Trainium's peak FLOPS by it.
    ``chip`` is the chip's product name (``Trainium2``).
    """

    name: str
    chip: str
    total_memory: int
    neuroncore_version: str
    logical_nc_config: int
    physical_core_count: int
    chip_index: int
    core_id: int
    sbuf_bytes: int | None
    tensor_bf16_flops_per_second: float | None
    tensor_fp32_flops_per_second: float | None
    major: int
    minor: int

    def __repr__(self) -> str:
        return (
            f"_NeuronDeviceProperties(name='{self.name}', chip='{self.chip}', "
            f"neuroncore_version='{self.neuroncore_version}', "
            f"total_memory={self.total_memory // 2**20}MB, logical_nc_config={self.logical_nc_config}, "
            f"physical_core_count={self.physical_core_count}, chip_index={self.chip_index}, "
            f"core_id={self.core_id})"
        )


def get_device_properties(device: Device = None) -> _NeuronDeviceProperties:
    r"""Return the properties of a device.

    Args:
        device (torch.device or int or str, optional): the current device if ``None``.
    """
    topo = topology()
    logical = topo.devices[device_index(device)]
    version = topo.chip.neuroncore_version  # e.g. "v3"
    return _NeuronDeviceProperties(
        name=topo.family,
        chip=logical.name,
        total_memory=logical.hbm_bytes,
        neuroncore_version=version,
        logical_nc_config=topo.lnc,
        physical_core_count=len(logical.physical_cores),
        chip_index=logical.chip_index,
        core_id=logical.core_id,
        sbuf_bytes=logical.sbuf_bytes,
        tensor_bf16_flops_per_second=logical.tensor_bf16_flops_per_second,
        tensor_fp32_flops_per_second=logical.tensor_fp32_flops_per_second,
        major=int(version.lstrip("v")),
        minor=0,
    )


def get_device_name(device: Device = None) -> str:
    r"""Return the name of a device, e.g. ``"neuron trn2 (Trainium2, NeuronCore-v3)"``.

    It contains ``neuron``, as TorchNeuron's does: torchtitan's peak-FLOPS lookup finds
    Trainium by that word, then reads the family from ``get_device_properties().name``.
    """
    props = get_device_properties(device)
    return f"neuron {props.name} ({props.chip}, NeuronCore-{props.neuroncore_version})"


def get_device_capability(device: Device = None) -> tuple[int, int]:
    r"""Return ``(major, minor)``: the NeuronCore generation (v3 -> ``(3, 0)``)."""
    props = get_device_properties(device)
    return props.major, props.minor
