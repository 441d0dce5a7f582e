"""``torch.distributed`` on ``neuron``: the ``neuron`` process-group backend.

:func:`register` runs on ``import torch`` (through torchneuron's autoload) and only
registers the backend's name, which is cheap: ``torch.distributed.distributed_c10d``
is already imported by ``import torch``. Everything else (the c10d kernels for
neuron tensors, the modelled collective time) is installed when the first neuron
process group is created.

Transport: each neuron process group carries its tensors on a gloo (TCP) process
group over the tensors' host memory, without copies (a neuron tensor's storage is
host memory; see :mod:`torchneuron.distributed.kernels`).
"""

from __future__ import annotations

from torchneuron.distributed.backend import BACKEND_NAME, register
from torchneuron.distributed.charging import charge_collective
from torchneuron.distributed.local_device import local_device

__all__ = [
    "BACKEND_NAME",
    "register",
    "charge_collective",
    "local_device",
]
