"""Observing what a program does on the neuron device: metrics and modelled time."""

from torchneuron.profiler import metrics
from torchneuron.profiler.estimate import Estimate, estimate

__all__ = ["metrics", "estimate", "Estimate"]
