"""``_set_pg_timeout`` applied to neuron groups.

Why: torch 2.13.0's ``torch.distributed.distributed_c10d._set_pg_timeout`` (private; the
only way to change a group's timeout after it is made, and torchtitan calls it after its
first step) looks for a gloo or NCCL backend on the ``cpu`` and ``cuda`` devices only, so
on a neuron group it warned "Set timeout is now only supported for either nccl or gloo"
and changed nothing. The neuron backend *is* a ``ProcessGroupGloo`` (:mod:`backend`), so
the wrapper installed here sets its default timeout, as torch does for gloo, and the
timeout the group's progress record names in its errors and the watchdog's limit with it.
"""

from __future__ import annotations

import datetime
import functools
import warnings
from collections.abc import Callable

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

_NEURON = torch.device("neuron")
_installed = False


def install() -> None:
    """Wraps ``distributed_c10d._set_pg_timeout`` once per process (when a neuron group is made)."""
    global _installed
    if _installed:
        return
    if not torch.__version__.startswith("2.13."):
        warnings.warn(f"torchneuron applies _set_pg_timeout to neuron groups as torch 2.13 defines it; "
                      f"torch {torch.__version__} may differ", stacklevel=2)
    c10d._set_pg_timeout = _wrap(c10d._set_pg_timeout)
    _installed = True


def _wrap(original: Callable[..., None]) -> Callable[..., None]:
    @functools.wraps(original)
    def _set_pg_timeout(timeout: datetime.timedelta, group: dist.ProcessGroup | None = None) -> None:
        target = c10d._get_default_group() if group is None else group
        backend = neuron_backend(target) if isinstance(target, dist.ProcessGroup) else None
        if backend is None:
            return original(timeout, group)
        with warnings.catch_warnings():  # torch's, for the neuron backend it does not look at
            warnings.filterwarnings("ignore", message="Set timeout is now only supported")
            original(timeout, group)  # a cpu:gloo backend of the same group, and torch's checks
        apply(target, backend, timeout)
        return None

    return _set_pg_timeout


def neuron_backend(group: dist.ProcessGroup) -> dist.ProcessGroupGloo | None:
    """The group's neuron backend (a ``ProcessGroupGloo``), or None if it has none."""
    if _NEURON not in group._device_types:
        return None
    backend = group._get_backend(_NEURON)
    return backend if isinstance(backend, dist.ProcessGroupGloo) else None


def apply(group: dist.ProcessGroup, backend: dist.ProcessGroupGloo, timeout: datetime.timedelta) -> None:
    """Makes ``timeout`` the group's: gloo's default for its collectives, the progress
    record's (its errors name it) and, unless set on its own, the watchdog's limit."""
    from torchneuron import config
    from torchneuron.distributed import watchdog
    from torchneuron.distributed.progress import progress_of

    backend._set_default_timeout(timeout)
    progress = progress_of(group)
    if progress is not None:
        progress.timeout = timeout
        if config.value("TORCHNEURON_COLLECTIVE_WATCHDOG_SECONDS") is None:
            watchdog.watch(group.group_name, timeout.total_seconds())
