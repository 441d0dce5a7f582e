"""``torch_neuronx``: the module name AWS TorchNeuron ships, backed by torchneuron.

Hugging Face ``transformers`` and ``accelerate`` decide that a machine has
Neuron devices by finding a module named ``torch_neuronx`` (then use
``torch.neuron``); without it ``Trainer`` silently trains on the CPU. This
package makes them find it, and offers TorchNeuron's top-level names where
torchneuron has the behaviour: the device, stream and memory functions (those of
``torch.neuron``), op tracking (from ``torchneuron.metrics``) and NKI custom ops
(on ``torchneuron.nki``'s simulator). Names torchneuron cannot back raise
``NotImplementedError``; docs/torch_neuronx.md lists all of them.

``import torch`` already registers the device (PyTorch autoloads torchneuron);
importing this package also works with ``TORCH_DEVICE_BACKEND_AUTOLOAD=0``.
"""

from __future__ import annotations

import torch

import torchneuron  # registers `neuron` when autoload is off

__version__ = torchneuron.__version__

neuron = torch.neuron  # TorchNeuron's device module, as ``torch_neuronx.neuron``

from torch.neuron import (  # noqa: E402
    Event,
    Stream,
    StreamContext,
    current_device,
    current_stream,
    default_stream,
    device,
    device_count,
    empty_cache,
    get_device_properties,
    max_memory_allocated,
    max_memory_reserved,
    memory_allocated,
    memory_reserved,
    memory_stats,
    memory_summary,
    reset_accumulated_memory_stats,
    reset_peak_memory_stats,
    set_device,
    set_stream,
    stream,
    synchronize,
)
from torch.neuron import is_initialized as is_neuron_runtime_initialized  # noqa: E402
from torch.neuron import reset_compile_metrics as reset_dynamo_metrics  # noqa: E402

from torch_neuronx.nki_ops import nki_op, wrap_nki  # noqa: E402
from torch_neuronx.op_tracking import clear_op_tracking, get_executed_ops, get_fallback_ops  # noqa: E402
from torch_neuronx.unsupported import NeuronProfiler, get_dynamo_metrics  # noqa: E402

__all__ = [
    "neuron", "Event", "Stream", "StreamContext", "current_device", "current_stream", "default_stream",
    "device", "device_count", "empty_cache", "get_device_properties",
    "is_neuron_runtime_initialized", "max_memory_allocated", "max_memory_reserved", "memory_allocated",
    "memory_reserved", "memory_stats", "memory_summary", "reset_accumulated_memory_stats",
    "reset_peak_memory_stats", "set_device", "set_stream", "stream", "synchronize",
    "get_executed_ops", "get_fallback_ops", "clear_op_tracking", "nki_op", "wrap_nki",
    "reset_dynamo_metrics", "get_dynamo_metrics", "NeuronProfiler",
]
