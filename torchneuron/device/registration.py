"""Makes PrivateUse1 the ``neuron`` device: name, ``torch.neuron``, tensor methods.

Uses only public torch.utils hooks (checked on torch 2.13.0), except the FakeTensor
convolution rule that ``fake_conv`` registers (see there).
"""

from __future__ import annotations

import torch

_registered = False


def register() -> None:
    """Registers the backend once per process (safe to call again)."""
    global _registered
    if _registered:
        return
    import torchneuron.device as neuron_module
    from torchneuron.device import _core, cost, fake_conv, fallback, kernel_costs, numerics

    _core.configure_devices()
    fallback.configure()
    cost.configure()
    kernel_costs.configure()
    numerics.configure()
    if torch._C._get_privateuse1_backend_name() != "neuron":
        torch.utils.rename_privateuse1_backend("neuron")
    torch._register_device_module("neuron", neuron_module)
    torch.utils.generate_methods_for_privateuse1_backend(
        for_tensor=True, for_module=True, for_packed_sequence=True, for_storage=True
    )
    torch.set_autocast_dtype("neuron", torch.bfloat16)
    fake_conv.register()  # FakeTensor predicts the strides neuron's convolution produces
    _registered = True
