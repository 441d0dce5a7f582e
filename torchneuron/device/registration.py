"""Makes PrivateUse1 the ``neuron`` device: name, ``torch.neuron``, tensor methods.

Uses public torch.utils hooks (checked on torch 2.13.0), plus two private hooks,
each isolated in its module: the FakeTensor convolution layout rule (``fake_conv``)
and the formatter that reads a printed tensor to the host (``printing``).
"""

from __future__ import annotations

import warnings

import torch

_registered = False


def _configure_cost() -> None:
    from torchneuron.device import cost, kernel_costs

    cost.configure()
    kernel_costs.configure()


def register() -> None:
    """Registers the backend once per process (safe to call again)."""
    global _registered
    if _registered:
        return
    import torchneuron.device as neuron_module
    from torchneuron import config
    from torchneuron.device import (_core, accounting, cost, dataless, fake_conv, fallback, flex_attention,
                                    kernel_costs, numerics, oom, printing, rng_replay, sync_debug)

    # This runs inside `import torch` (autoload), so a bad setting must not make torch itself
    # unusable: it is reported here, and a bad device setting leaves the device registered
    # without devices, raising the error on first use. Checked in Python before C++ sees one.
    later = config.problems("compile") + config.problems("nki") + config.problems("distributed")
    if later:
        warnings.warn("torchneuron: bad settings, an error when used:\n" + "\n".join(later),
                      stacklevel=2)
    try:
        config.check("device")
    except ValueError as error:
        _core.mark_unavailable(error)
        warnings.warn(f"torchneuron: the neuron device is unavailable because of a bad setting; "
                      f"`import torch` goes on without it:\n{error}", stacklevel=2)
    else:
        _core.configure_devices()
        fallback.configure()
        cost.configure()
        kernel_costs.configure()
        numerics.configure()
        sync_debug.configure()
        accounting.configure_call_sites()
        dataless.install()
        dataless.configure()
        # Later changes (config.override, config.set_value) reach the C++ core by themselves.
        config.on_change(fallback.SETTINGS, fallback.configure)
        config.on_change(cost.SETTINGS, _configure_cost)
        config.on_change(numerics.SETTINGS, numerics.configure)
        config.on_change((sync_debug.SETTING,), sync_debug.configure)
        config.on_change((accounting.STACK_TRACE_SETTING,), accounting.configure_call_sites)
        config.on_change((dataless.SETTING,), dataless.configure)
    printing.install()
    oom.install()  # out-of-memory errors say what fills the device
    if torch._C._get_privateuse1_backend_name() != "neuron":
        torch.utils.rename_privateuse1_backend("neuron")
    torch._register_device_module("neuron", neuron_module)
    torch.utils.generate_methods_for_privateuse1_backend(
        for_tensor=True, for_module=True, for_packed_sequence=True, for_storage=True
    )
    torch.set_autocast_dtype("neuron", torch.bfloat16)
    fake_conv.register()  # FakeTensor predicts the strides neuron's convolution produces
    rng_replay.install()  # compiled checkpointed regions replay random ops on the neuron generator
    flex_attention.install()  # FlexAttention forward and backward on neuron, one fused op
    _registered = True
