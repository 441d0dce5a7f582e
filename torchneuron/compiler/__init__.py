"""``torch.compile(backend="neuron")``: Dynamo -> AOTAutograd -> Neuron passes -> Inductor C++.

Importing this package registers the neuron device with Dynamo and Inductor
(so plain ``torch.compile(model)`` on neuron tensors works too); PyTorch
imports it through the ``torch_dynamo_backends`` entry point the first time
``backend="neuron"`` is asked for.
"""

from torchneuron.compiler import inductor_device
from torchneuron.compiler.backend import NeuronCompileWarning, StaticShapeGraph, neuron_backend
from torchneuron.compiler.cache import cache_dir
from torchneuron.compiler.diagnostics import UnsafeCacheError

inductor_device.register()

__all__ = ["neuron_backend", "NeuronCompileWarning", "StaticShapeGraph", "UnsafeCacheError", "cache_dir"]
