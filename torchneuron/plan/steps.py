"""A rank's training steps as the record saw them: time and its parts, FLOPs, tokens, memory.

A step ends at each optimizer step (``torch.optim``'s global step hook, which every
optimizer and FSDP2's sharded ones call). For each step, from what the run added to the
accounting record (:func:`torchneuron.profiler.estimate.cost_on`) and the device's clocks:

- ``seconds``: how far the device's timeline moved (the later of the compute stream and
  the collective stream, :func:`torchneuron.distributed.comm_stream.device_clock`);
- ``compute_seconds``: the modelled time of ops, compiled kernels, NKI kernels and copies;
- ``collective_seconds``: the modelled time of the collectives;
- ``exposed_collective_seconds``: the part of the step the compute does not explain,
  i.e. communication the program did not overlap (``seconds - compute_seconds``, at least 0);
- ``flops`` and ``mfu`` against the chip's dense BF16 peak of one logical core;
- ``tokens``: the indices the step's largest embedding looked up (a language model's tokens
  on this rank; 0 when there is none);
- ``peak_bytes`` and what fills the device at the peak by category: parameters, optimizer
  state and buffers as measured when backward starts, gradients when the optimizer steps,
  and the rest of the peak as "activations and other tensors" (activations, FSDP's
  unsharded parameters, temporaries).

Host-side time (Python, the framework) is not modelled: on real hardware it overlaps the
device's asynchronous queue unless the host is the bottleneck.
"""

from __future__ import annotations

import gc
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook

from torchneuron.device import accounting, oom
from torchneuron.distributed.comm_stream import device_clock
from torchneuron.profiler.estimate import cost_on

__all__ = ["Step", "StepTracker"]

_PERSISTENT = (oom.PARAMETERS, oom.OPTIMIZER_STATE, oom.BUFFERS)


@dataclass
class Step:
    """One training step of one rank (seconds are modelled Trainium time)."""

    index: int
    seconds: float
    compute_seconds: float
    collective_seconds: float
    exposed_collective_seconds: float
    flops: float
    mfu: float
    tokens: int
    peak_bytes: int
    memory_at_peak: dict[str, int] = field(default_factory=dict)  # category -> bytes

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _numel(described: Any) -> int:
    count = 1
    for size in described[1]:  # ("tensor", sizes, dtype, contiguous)
        count *= int(size)
    return count


def _tokens(added: accounting.Snapshot) -> int:
    """Indices the largest embedding table (by rows) looked up in ``added``: its backward's
    (training), else its forward's, which on neuron is an ``index_select`` of rows."""
    backward: dict[int, int] = {}
    forward: dict[int, int] = {}
    for (op, args, _outputs, _fallback), calls, _ in added.cost_entries.values():
        if op == "aten::embedding_dense_backward" and isinstance(args.get("indices"), tuple):
            rows = int(args.get("num_weights", 0))
            backward[rows] = backward.get(rows, 0) + _numel(args["indices"]) * calls
        elif (op == "aten::index_select" and args.get("dim") == 0 and isinstance(args.get("self"), tuple)
              and len(args["self"][1]) == 2 and isinstance(args.get("index"), tuple)):
            rows = int(args["self"][1][0])
            forward[rows] = forward.get(rows, 0) + _numel(args["index"]) * calls
    table = backward or forward
    return table[max(table)] if table else 0


class StepTracker:
    """Cuts the run into optimizer steps on ``device`` (install before the script runs)."""

    def __init__(self, device: int) -> None:
        self.device = device
        self.steps: list[Step] = []
        self._clock = device_clock(device)
        self._before = accounting.snapshot()
        self._persistent: dict[str, int] = {}
        self._hooks: list[Any] = []
        self._recorder = accounting.Recorder()
        self.last_step_events: list[accounting.Event] = []  # the device work of the last step
        torch.neuron.reset_peak_memory_stats(device)

    def install(self) -> None:
        self._hooks.append(register_optimizer_step_post_hook(self._on_step))
        # Backward is when activations are saved and gradients not yet made: the model's
        # persistent tensors are measured then (Tensor.backward and autograd.backward).
        self._backward = torch.Tensor.backward
        tracker = self

        def backward(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            tracker._measure_persistent()
            return tracker._backward(tensor, *args, **kwargs)

        torch.Tensor.backward = backward

    def remove(self) -> None:
        self._recorder.close(events=False)
        for hook in self._hooks:
            hook.remove()
        self._hooks.clear()
        if hasattr(self, "_backward"):
            torch.Tensor.backward = self._backward

    def _measure_persistent(self) -> None:
        if self._persistent:
            return  # the model's persistent tensors are measured once per step
        gc.collect()
        breakdown = oom.memory_breakdown(self.device)
        self._persistent = {name: breakdown.bytes_of(name) for name in _PERSISTENT}

    def _on_step(self, *_: Any) -> None:
        self.close_step()

    def close_step(self) -> None:
        """Ends the current step (the optimizer stepped, or the script ended after work)."""
        clock = device_clock(self.device)
        added = accounting.snapshot().since(self._before)
        estimate = cost_on(added)
        collective = sum(o.seconds for o in estimate.ops if o.op.startswith("collective:"))
        compute = estimate.seconds - collective
        seconds = max(clock - self._clock, 0.0)
        peak = torch.neuron.max_memory_allocated(self.device)
        gradients = oom.memory_breakdown(self.device).bytes_of(oom.GRADIENTS)
        if not self._persistent:
            self._measure_persistent()
        memory = {**self._persistent, oom.GRADIENTS: gradients}
        memory[oom.ACTIVATIONS] = max(0, peak - sum(memory.values()))
        peak_flops = estimate.peak_flops_per_second
        self.steps.append(Step(
            index=len(self.steps) + 1, seconds=seconds, compute_seconds=compute,
            collective_seconds=collective, exposed_collective_seconds=max(0.0, seconds - compute),
            flops=estimate.flops, mfu=estimate.flops / (seconds * peak_flops) if seconds and peak_flops else 0.0,
            tokens=_tokens(added), peak_bytes=peak, memory_at_peak=memory))
        self.last_step_events = self._recorder.close()
        self._recorder = accounting.Recorder()
        self._clock, self._before, self._persistent = clock, accounting.snapshot(), {}
        torch.neuron.reset_peak_memory_stats(self.device)
