"""Debugging switches: where a NaN came from (:func:`detect_nonfinite`).

The sync debug mode is ``torch.neuron.set_sync_debug_mode`` (as ``torch.cuda``'s), and
``torchneuron check script.py`` (:mod:`torchneuron.check`) reports a whole run.
"""

from torchneuron.debug.nonfinite import NonFiniteError, detect_nonfinite, tensor_stats

__all__ = ["NonFiniteError", "detect_nonfinite", "tensor_stats"]
