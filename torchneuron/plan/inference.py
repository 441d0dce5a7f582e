"""An inference script's latency, as the record saw it: time to first token, time per output token.

Each call of the outermost module (a model's ``forward``, which ``generate()`` calls once
for the prompt and once per new token) is noted with where the device's timeline was when it
started (:func:`torchneuron.distributed.comm_stream.device_clock`) and the shape of its first
positional tensor argument (global module hooks see no keyword arguments). From them:

- ``ttft_seconds``: from the first call's start to the second's: the prompt's forward
  (prefill) and the first token's sampling;
- ``tpot_seconds``: the median interval between later calls (each a decode step and its
  sampling); the last call is timed to the end of the run;
- ``kv_cache_bytes_after_prefill``: the tensors Hugging Face ``Cache`` objects hold on this
  device when the first decode step starts (0 without one; a growing cache then gains
  ``kv_cache_bytes_after_prefill / prompt length`` per token, a static one is full already).

Host-side time is not modelled (as for training steps): these are device times.
"""

from __future__ import annotations

import gc
import statistics
from typing import Any

import torch

from torchneuron.distributed.comm_stream import device_clock

__all__ = ["ForwardTracker"]


def _first_tensor_shape(args: tuple, kwargs: dict) -> list[int]:
    for value in (*args, *kwargs.values()):
        if isinstance(value, torch.Tensor):
            return list(value.shape)
    return []


def _tensors_in(value: Any, seen: set[int], depth: int = 0) -> list[torch.Tensor]:
    if depth > 4 or id(value) in seen:
        return []
    seen.add(id(value))
    if isinstance(value, torch.Tensor):
        return [value]
    items: Any = ()
    if isinstance(value, dict):
        items = value.values()
    elif isinstance(value, (list, tuple)):
        items = value
    elif hasattr(value, "__dict__") and not isinstance(value, type):
        items = vars(value).values()
    return [t for item in items for t in _tensors_in(item, seen, depth + 1)]


def kv_cache_bytes(device: int) -> int:
    """Bytes of the tensors held by live Hugging Face caches on ``neuron:device``."""
    try:
        from transformers.cache_utils import Cache
    except ImportError:
        return 0
    storages: dict[int, int] = {}
    for obj in gc.get_objects():
        # type(), not isinstance(): a dead weak proxy raises ReferenceError when asked its class
        if issubclass(type(obj), Cache):
            for t in _tensors_in(obj, set()):
                if t.device.type == "neuron" and t.device.index == device and t.numel():
                    storage = t.untyped_storage()
                    storages[storage.data_ptr()] = storage.nbytes()
    return sum(storages.values())


class ForwardTracker:
    """Notes each outermost module call on ``device`` (install before the script runs)."""

    def __init__(self, device: int) -> None:
        self.device = device
        self.calls: list[dict[str, Any]] = []
        self._depth = 0
        self._handles: list[Any] = []
        self.kv_after_prefill = 0

    def install(self) -> None:
        modules = torch.nn.modules.module
        self._handles = [modules.register_module_forward_pre_hook(self._before),
                         modules.register_module_forward_hook(self._after, always_call=True)]

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def _before(self, module: Any, args: tuple) -> None:
        if self._depth == 0:
            if len(self.calls) == 1:
                self.kv_after_prefill = kv_cache_bytes(self.device)
            self.calls.append({"module": type(module).__name__, "start": device_clock(self.device),
                               "input_shape": _first_tensor_shape(args, {})})
        self._depth += 1

    def _after(self, module: Any, args: tuple, output: Any) -> None:
        self._depth = max(0, self._depth - 1)

    def summary(self) -> dict[str, Any] | None:
        """TTFT, TPOT and the KV cache, if the script called a model more than once."""
        if len(self.calls) < 2:
            return None
        starts = [c["start"] for c in self.calls] + [device_clock(self.device)]
        intervals = [b - a for a, b in zip(starts, starts[1:])]
        decode = intervals[1:]
        return {"calls": len(self.calls), "module": self.calls[0]["module"],
                "prompt_shape": self.calls[0]["input_shape"],
                "ttft_seconds": intervals[0], "tpot_seconds": statistics.median(decode) if decode else None,
                "decode_steps": len(decode), "kv_cache_bytes_after_prefill": self.kv_after_prefill}
