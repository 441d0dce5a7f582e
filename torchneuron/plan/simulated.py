"""One rank of a simulated job, in this process: what torchrun and the other ranks would provide.

A planned run executes the user's script unmodified as one rank of a job of many
(:mod:`torchneuron.plan.world` sets ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK`` and the rest
as torchrun does). The ranks it stands for do not exist, so:

- the ``env://`` rendezvous gives every process group an in-process store (no peer is
  waited for); neuron groups then get PyTorch's fake backend and charge each collective
  its modelled time on the job's topology (``TORCHNEURON_SIMULATED_WORLD``,
  :mod:`torchneuron.distributed.backend`);
- object collectives (``all_gather_object``, ``broadcast_object_list``...), which pickle
  Python objects into tensors whose values a dataless run never has, take the job to be
  symmetric: every rank holds what this rank holds. Each such call is noted
  (:func:`object_collectives`) because a program whose ranks differ there is planned as if
  they did not;
- ``monitored_barrier`` (gloo's) returns at once, and gloo groups get the simulated backend
  too (their CPU collectives complete at once, values unchanged; a real gloo group would wait
  for peers that never start);
- distributed checkpoint (DCP) gathers every rank's save plan with ``gather_object``; the
  symmetric answer repeats rank 0's shards, which covers no tensor whole, so DCP's check that
  the plans cover every tensor is skipped. Nothing is written to disk and a load reads only
  metadata (:mod:`torchneuron.device.dataless_files`: no file holds placeholders);
- a pipeline stage's metadata exchange with its neighbour stages (which run in other
  planning workers): the forward inputs it would receive are the ``input_args`` it was given,
  and the gradients it would receive have its own outputs' shapes.

Private torch API used (checked on torch 2.13.0): ``torch.distributed.rendezvous.
_rendezvous_handlers`` (replacing a registered scheme has no public call), and
``torch.distributed.pipelining``'s stage ``_recv_meta``, ``_user_meta``,
``_stage_meta`` and ``_utils._StageForwardMeta`` / ``_StageBackwardMeta`` / ``_derive_grad_metas``
(the stage's metadata inference has no public hook), and
``torch.distributed.checkpoint.default_planner._validate_global_plan`` and
``torch.distributed.distributed_c10d.BackendConfig`` (the device-to-backend map of a group).
"""

from __future__ import annotations

import copy
import sys
import threading
from collections import Counter
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import importlib

import torch.distributed as dist
from torch.distributed import distributed_c10d

from torchneuron.device import accounting

__all__ = ["install", "object_collectives"]

_lock = threading.Lock()
_calls: Counter = Counter()  # (function, call site) -> calls
_installed = False


def _note(function: str) -> None:
    stack = accounting.user_stack(sys._getframe(2), limit=1)
    with _lock:
        _calls[(function, stack[0] if stack else "<unknown>")] += 1


def object_collectives() -> list[tuple[str, str, int]]:
    """(function, call site, calls) of the object collectives answered symmetrically."""
    with _lock:
        return [(f, site, n) for (f, site), n in _calls.most_common()]


def _env_rendezvous(url: str, timeout: timedelta = timedelta(minutes=30), **kwargs: Any) -> Iterator[tuple]:
    """``env://`` without peers: this rank's number and the job's size, an in-process store."""
    from torchneuron import config

    del url, timeout, kwargs
    yield dist.HashStore(), config.value("RANK") or 0, config.value("WORLD_SIZE") or 1


def _all_gather_object(object_list: list, obj: Any, group: Any = None) -> None:
    _note("all_gather_object")
    object_list[:] = [copy.deepcopy(obj) for _ in object_list]


def _gather_object(obj: Any, object_gather_list: list | None = None, dst: int | None = None,
                   group: Any = None, group_dst: int | None = None) -> None:
    _note("gather_object")
    if object_gather_list is not None:
        object_gather_list[:] = [copy.deepcopy(obj) for _ in object_gather_list]


def _broadcast_object_list(object_list: list, src: int | None = None, group: Any = None,
                           device: Any = None, group_src: int | None = None) -> None:
    _note("broadcast_object_list")  # this rank's objects stand for the source's


def _scatter_object_list(scatter_object_output_list: list, scatter_object_input_list: list | None = None,
                         src: int | None = None, group: Any = None, group_src: int | None = None) -> None:
    _note("scatter_object_list")
    if scatter_object_input_list:
        rank = dist.get_rank(group) if group is not None else dist.get_rank()
        scatter_object_output_list[0] = copy.deepcopy(scatter_object_input_list[rank % len(scatter_object_input_list)])


def _recv_object_list(object_list: list, src: int | None = None, group: Any = None, device: Any = None,
                      group_src: int | None = None, *args: Any, **kwargs: Any) -> int:
    _note("recv_object_list")
    raise NotImplementedError(
        "recv_object_list in a planned job: the sending rank does not exist here, so its objects are "
        "unknown. A pipeline stage receives its input shapes this way when it infers them: give "
        "PipelineStage(..., input_args=..., output_args=...) example tensors (meta tensors will do) "
        "so that no shape is received at run time")


def _send_object_list(object_list: list, dst: int | None = None, group: Any = None, device: Any = None,
                      group_dst: int | None = None, *args: Any, **kwargs: Any) -> None:
    _note("send_object_list")


def _monitored_barrier(group: Any = None, timeout: Any = None, wait_all_ranks: bool = False) -> None:
    _note("monitored_barrier")


def _stage_recv_meta(stage: Any, src_stage: int) -> Any:
    """What a planned pipeline stage would receive from stage ``src_stage`` (see the module doc)."""
    from torch.distributed.pipelining import _utils

    if src_stage < stage.stage_index:
        inputs = getattr(stage._user_meta, "inputs", None)
        if not inputs:
            raise NotImplementedError(
                f"pipeline stage {stage.stage_index} of a planned job receives its input shapes from stage "
                f"{src_stage}, which runs in another planning worker: give PipelineStage(..., input_args=...) "
                "example tensors (meta tensors will do) for every stage after the first")
        return _utils._StageForwardMeta(forward_metas=inputs)
    outputs = stage._stage_meta.outputs
    return _utils._StageBackwardMeta(backward_metas=_utils._derive_grad_metas(outputs))


_REPLACEMENTS = {
    "all_gather_object": _all_gather_object,
    "gather_object": _gather_object,
    "broadcast_object_list": _broadcast_object_list,
    "scatter_object_list": _scatter_object_list,
    "monitored_barrier": _monitored_barrier,
    "send_object_list": _send_object_list,
    "recv_object_list": _recv_object_list,
}


def _route_gloo_to_the_simulated_backend() -> None:
    """Gloo groups (``new_group(backend="gloo")``, the ``cpu:gloo`` half of
    ``"cpu:gloo,neuron:neuron"``, DeviceMesh groups made from it) get the simulated backend: a
    gloo group would wait for peers that are never started, until its 30-minute timeout. Their
    CPU collectives complete at once and leave the values as they are (the job is symmetric:
    each rank holds what this one holds), and cost nothing (host-side traffic is not modelled)."""
    from torchneuron.distributed.backend import BACKEND_NAME

    config_class = distributed_c10d.BackendConfig
    original = config_class.__init__
    if getattr(original, "__torchneuron_simulated__", False):
        return

    def __init__(self: Any, backend: Any) -> None:
        original(self, backend)
        self.device_backend_map = {device: dist.Backend(BACKEND_NAME) if name == dist.Backend.GLOO else name
                                   for device, name in self.device_backend_map.items()}

    __init__.__torchneuron_simulated__ = True
    config_class.__init__ = __init__


def install() -> None:
    """Makes this process one rank of a simulated job (once; the process is a planning worker)."""
    global _installed
    if _installed:
        return
    # The module (torch.distributed re-exports a function of the same name).
    importlib.import_module("torch.distributed.rendezvous")._rendezvous_handlers["env"] = _env_rendezvous
    for name, replacement in _REPLACEMENTS.items():
        setattr(dist, name, replacement)
        setattr(distributed_c10d, name, replacement)
    from torch.distributed.checkpoint import default_planner
    from torch.distributed.pipelining import stage

    default_planner._validate_global_plan = lambda global_plan, metadata: []  # see the module doc
    _route_gloo_to_the_simulated_backend()

    for cls in vars(stage).values():  # the classes that define it (PipelineStage in torch 2.13.0)
        if isinstance(cls, type) and "_recv_meta" in vars(cls):
            cls._recv_meta = _stage_recv_meta
    _installed = True
