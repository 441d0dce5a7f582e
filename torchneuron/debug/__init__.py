"""Debugging switches: where a NaN came from (:func:`detect_nonfinite`), what fills a
device (:func:`memory_breakdown`, also appended to every neuron out-of-memory error).

The sync debug mode is ``torch.neuron.set_sync_debug_mode`` (as ``torch.cuda``'s), and
``torchneuron check script.py`` (:mod:`torchneuron.check`) reports a whole run.
"""

from torchneuron.debug.nonfinite import NonFiniteError, detect_nonfinite, tensor_stats
from torchneuron.device.oom import MemoryBreakdown, memory_breakdown, what_would_fit

__all__ = ["MemoryBreakdown", "NonFiniteError", "detect_nonfinite", "memory_breakdown", "tensor_stats",
           "what_would_fit"]
