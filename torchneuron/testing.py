"""Helpers for tests of code that runs on neuron: proving the device did the work.

A test that only compares values cannot tell a neuron result from one a silent
CPU fallback produced. :func:`is_on_neuron` checks where a tensor's bytes live,
and :func:`run_python` runs a snippet in a fresh interpreter (for behaviour fixed
at start-up, such as environment variables read when the device registers).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import torch

from torchneuron import _C

__all__ = ["is_on_neuron", "run_python"]

# Variables that configure the device at start-up; a child process starts from
# the defaults unless a test sets them.
_DEVICE_ENV = ("NEURON_PLATFORM_TARGET_OVERRIDE", "NEURON_LOGICAL_NC_CONFIG", "NEURON_RT_VISIBLE_CORES",
               "TORCHNEURON_INSTANCE", "TORCH_DEVICE_BACKEND_AUTOLOAD")


def is_on_neuron(t: torch.Tensor, index: int | None = None) -> bool:
    """True if ``t`` is a neuron tensor (of device ``index``, if given) whose bytes are
    in that device's memory, not a CPU tensor or a view of host memory."""
    if t.device.type != "neuron" or (index is not None and t.device.index != index):
        return False
    return t.numel() == 0 or _C._is_device_memory(t)


def run_python(code: str, env: dict[str, str | None] | None = None,
               timeout: float = 120) -> subprocess.CompletedProcess:
    """Runs ``code`` (dedented) in a fresh interpreter with the device's start-up
    variables cleared; ``env`` entries are then added (``None`` removes one)."""
    full_env = {k: v for k, v in os.environ.items() if k not in _DEVICE_ENV}
    for key, value in (env or {}).items():
        if value is None:
            full_env.pop(key, None)
        else:
            full_env[key] = value
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=full_env,
                          capture_output=True, text=True, timeout=timeout)
