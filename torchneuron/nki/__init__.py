"""``torchneuron.nki``: the Neuron Kernel Interface on the simulated Trainium.

Kernels import it under its own name or AWS's: importing this package installs
:mod:`torchneuron.nki.aliases`, so ``import nki.language as nl`` and
``import neuronxcc.nki.isa as nisa`` give these same modules (unless a real
Neuron SDK is installed, which always wins)::

    import torchneuron.nki as nki                 # or: import nki / neuronxcc.nki
    import torchneuron.nki.language as nl         # or: import nki.language as nl
    import torchneuron.nki.isa as nisa            # or: import nki.isa as nisa
    import torchneuron.nki.typing as nt           # or: import nki.typing as nt

``nki.isa`` is imported on first use, so importing the package stays light and
``isa`` may import ``language`` without a cycle.
"""

from __future__ import annotations

import importlib
from typing import Any

from torchneuron.nki import aliases, dtype, language, typing
from torchneuron.nki.errors import NkiInstructionLimitError, NkiUninitializedReadError, NkiValidationError
from torchneuron.nki.kernel import Kernel, baremetal, cpu_simulate, jit, simulate, simulate_kernel, trace
from torchneuron.nki import compiler  # legacy nki.compiler: hint decorators, removed allocators

from torchneuron.nki.benchmarking import benchmark, estimate, profile
from torchneuron.nki.bridge import kernel_stats, reset_kernel_stats
from torchneuron.nki.torch_op import torch_op

__all__ = [
    "jit", "simulate", "cpu_simulate", "simulate_kernel", "baremetal", "trace", "Kernel", "language", "isa",
    "typing", "dtype", "compiler",
    "NkiValidationError", "NkiUninitializedReadError", "NkiInstructionLimitError", "benchmark", "profile",
    "estimate", "torch_op", "kernel_stats", "reset_kernel_stats",
]

_LAZY_SUBMODULES = ("isa",)

aliases.install()


def __getattr__(name: str) -> Any:
    if name in _LAZY_SUBMODULES:
        module = importlib.import_module(f"{__name__}.{name}")
        globals()[name] = module
        return module
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
