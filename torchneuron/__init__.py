"""torchneuron: PyTorch's ``neuron`` device as a software Trainium.

Importing this package (which PyTorch does by itself on ``import torch``,
through the ``torch.backends`` entry point) registers the device.
"""

from __future__ import annotations

import torch

from torchneuron.device.registration import register as _register

_register()

__version__ = "0.1.0"


def _autoload() -> None:
    """Entry point PyTorch calls on ``import torch``; importing did the work."""
