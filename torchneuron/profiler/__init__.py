"""Observing what a program does on the neuron device: metrics, modelled time and traces."""

from torchneuron.profiler import metrics
from torchneuron.profiler.estimate import Estimate, estimate
from torchneuron.profiler.session import profile

__all__ = ["metrics", "estimate", "Estimate", "profile"]
