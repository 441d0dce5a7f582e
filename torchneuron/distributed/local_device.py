"""Which neuron device a rank uses: torchrun's ``LOCAL_RANK``, as CUDA users set it.

Two launch conventions give the same result (docs/distributed.md):

- every process sees all logical cores and rank ``r`` on a host uses ``neuron:r``;
- each process is given its own core with ``NEURON_RT_VISIBLE_CORES=$LOCAL_RANK``
  (TorchNeuron's convention), so it sees one device, ``neuron:0``.
"""

from __future__ import annotations

import torch

from torchneuron import config


def local_device() -> torch.device | None:
    """``neuron:<LOCAL_RANK>`` (or ``neuron:0`` if the process sees one core); None without LOCAL_RANK.

    Raises:
        ValueError: a bad ``LOCAL_RANK``, or one with no device (naming the visible cores).
    """
    local_rank = config.value("LOCAL_RANK")
    if local_rank is None:
        return None
    count = torch.neuron.device_count()
    if count == 1:
        return torch.device("neuron", 0)
    if local_rank >= count:
        visible = config.get("NEURON_RT_VISIBLE_CORES")
        raise ValueError(
            f"LOCAL_RANK={local_rank} has no neuron device: this process sees {count} "
            f"(NEURON_RT_VISIBLE_CORES={visible!r}); start at most {count} processes per host "
            f"(torchrun --nproc-per-node {count}), or give each process its core with "
            f"NEURON_RT_VISIBLE_CORES=$LOCAL_RANK")
    return torch.device("neuron", local_rank)


def select_local_device() -> None:
    """Makes :func:`local_device` current when the default process group is created.

    A device the program selected itself (anything but the initial ``neuron:0``) wins.
    """
    device = local_device()
    if device is not None and torch.accelerator.current_device_index() == 0:
        torch.accelerator.set_device_index(device.index)
