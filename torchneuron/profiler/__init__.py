"""Observing what a program does on the neuron device: metrics now, traces later."""

from torchneuron.profiler import metrics

__all__ = ["metrics"]
