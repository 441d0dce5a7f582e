"""TorchNeuron names torchneuron cannot back: each raises a clear ``NotImplementedError``.

They exist (rather than being absent) so code written for TorchNeuron fails at
the call with a pointer to what torchneuron offers instead of an ``AttributeError``.
"""

from __future__ import annotations

from typing import Any, NoReturn

__all__ = ["NeuronProfiler", "get_dynamo_metrics"]


class NeuronProfiler:
    """TorchNeuron's device profiler (Neuron Explorer traces from the Neuron runtime)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise NotImplementedError(
            "torch_neuronx.NeuronProfiler is not supported by torchneuron: there is no Neuron runtime "
            "to profile. Use torch.profiler for host traces, torchneuron.estimate(fn) for modelled "
            "Trainium time and torchneuron.metrics.report() for ops, CPU fallbacks and transfers.")


def get_dynamo_metrics() -> NoReturn:
    """TorchNeuron's per-graph compile records (a list of compilation-metric objects)."""
    raise NotImplementedError(
        "torch_neuronx.get_dynamo_metrics() is not supported by torchneuron: it keeps totals, not "
        "TorchNeuron's per-graph records. Use torch.neuron.compile_metrics() (a dict of totals).")
