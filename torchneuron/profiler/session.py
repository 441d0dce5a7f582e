"""``torchneuron.profiler.profile``: ``torch.profiler.profile`` with the neuron device on.

The device timeline comes from the neuron activity profiler registered with
PyTorch's own profiler (Kineto), so ``torch.profiler.profile`` from an unmodified
script already shows it when asked for ``ProfilerActivity.PrivateUse1``. This
class only fills in what a user would otherwise have to know: by default it
records the host (CPU) and the neuron device. Everything else -- ``schedule``
(wait, warmup, active, repeat, skip_first), ``step()``, ``on_trace_ready``
(e.g. ``torch.profiler.tensorboard_trace_handler``), ``key_averages()``,
``export_chrome_trace()`` -- is PyTorch's, unchanged: each active cycle is its
own device recording, so a trace holds the device work of its active steps only.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch.profiler
from torch.profiler import (
    ProfilerAction,
    ProfilerActivity,
    record_function,
    schedule,
    tensorboard_trace_handler,
)

__all__ = ["DEFAULT_ACTIVITIES", "ProfilerAction", "ProfilerActivity", "profile", "record_function",
           "schedule", "tensorboard_trace_handler"]

# The host timeline and the neuron device's modelled timeline.
DEFAULT_ACTIVITIES = (ProfilerActivity.CPU, ProfilerActivity.PrivateUse1)


class profile(torch.profiler.profile):
    """``torch.profiler.profile`` recording the host and the neuron device by default.

    Takes every argument ``torch.profiler.profile`` takes (keyword-only here), e.g.::

        with torchneuron.profiler.profile(
                schedule=torch.profiler.schedule(wait=1, warmup=1, active=2, repeat=1),
                on_trace_ready=torch.profiler.tensorboard_trace_handler("./log")) as prof:
            for batch in loader:
                train_step(batch)
                prof.step()
    """

    def __init__(self, *, activities: Iterable[ProfilerActivity] | None = None,
                 schedule: Callable[[int], ProfilerAction] | None = None,
                 on_trace_ready: Callable[[torch.profiler.profile], Any] | None = None,
                 **kwargs: Any) -> None:
        if activities is None:
            activities = DEFAULT_ACTIVITIES
        if schedule is not None and not callable(schedule):
            raise TypeError(f"profile(schedule={schedule!r}): schedule must be a callable from the step "
                            "number to a ProfilerAction, e.g. torch.profiler.schedule(wait=1, warmup=1, "
                            "active=2)")
        if on_trace_ready is not None and not callable(on_trace_ready):
            raise TypeError(f"profile(on_trace_ready={on_trace_ready!r}): on_trace_ready must be a "
                            "callable taking the profiler, e.g. "
                            "torch.profiler.tensorboard_trace_handler('./log')")
        super().__init__(activities=list(activities), schedule=schedule,
                         on_trace_ready=on_trace_ready, **kwargs)
        self._records_allocation_sites = False

    def start(self) -> None:
        """Starts profiling; with ``profile_memory=True`` and ``with_stack=True`` the allocator
        also keeps each live block's Python stack until :meth:`stop` (unless memory history
        already records), so an out-of-memory error while profiling names allocation sites."""
        from torchneuron.device import memory_history

        if getattr(self, "profile_memory", False) and getattr(self, "with_stack", False) \
                and not memory_history.is_recording():
            torch.neuron.memory._record_memory_history("state", context="state", stacks="python")
            self._records_allocation_sites = True
        super().start()

    def stop(self) -> None:
        try:
            super().stop()
        finally:
            if self._records_allocation_sites:
                self._records_allocation_sites = False
                torch.neuron.memory._record_memory_history(None)
