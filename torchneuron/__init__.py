"""torchneuron: PyTorch's ``neuron`` device as a software Trainium.

Importing this package (which PyTorch does by itself on ``import torch``,
through the ``torch.backends`` entry point) registers the device.
"""

from __future__ import annotations

__version__ = "0.1.0"


def _autoload() -> None:
    """Entry point PyTorch calls on ``import torch``; importing did the work.

    Defined before ``import torch`` below: when this package is imported
    first, that import runs PyTorch's autoload, which looks this name up on
    the partially initialised package.
    """


import torch  # noqa: E402

from torchneuron.device.registration import register as _register  # noqa: E402

_register()


def _inductor_attribute(name: str):
    """Inductor looks up the device's code generators on ``torch.neuron`` on first use."""
    from torchneuron.compiler.inductor_device import inductor_attribute

    return inductor_attribute(name)


for _name in ("Scheduling", "PythonWrapperCodegen", "CppWrapperCodegen", "WrapperFxCodegen"):
    torch.neuron.lazy_attributes[_name] = lambda _name=_name: _inductor_attribute(_name)

from torchneuron.profiler import estimate, metrics  # noqa: E402
from torchneuron.device.dataless import dataless  # noqa: E402
from torchneuron.distributed import register as _register_distributed  # noqa: E402

_register_distributed()  # the `neuron` c10d backend's name only; its kernels load with the first group


def _detect_nonfinite_from_setting() -> None:
    """TORCHNEURON_DETECT_NONFINITE=1 turns the NaN/Inf check on (imported only then)."""
    from torchneuron import config

    try:
        on = config.get_flag("TORCHNEURON_DETECT_NONFINITE")
    except ValueError:
        return  # reported with the other device settings at registration
    if on:
        from torchneuron.debug import nonfinite

        nonfinite.enable_from_setting()


_detect_nonfinite_from_setting()
