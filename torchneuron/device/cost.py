"""Modelled Trainium time of the ops running on neuron, as the C++ side asks.

The C++ fallback describes each new (op, dtypes, shapes, arguments)
combination once -- ``args`` maps the schema's argument names to values, with
tensors as ``("tensor", sizes, dtype, contiguous)`` -- and caches the seconds
this module returns; every call then advances its stream's modelled clock
(``Event.elapsed_time`` reads it). The formulas are
:mod:`torchneuron.hardware.cost`'s roofline, for the modelled chip and LNC.
Ops real Trainium runs on the host are charged their transfers instead.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterator
from typing import Any

from torchneuron import _C
from torchneuron.device import _core, config
from torchneuron.hardware import cost as hw_cost
from torchneuron.hardware.dtypes import TORCH_DTYPE_ITEMSIZE

def _tensors(value: Any) -> Iterator[tuple]:
    if isinstance(value, tuple) and value and value[0] == "tensor":
        yield value
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _tensors(v)


def _nbytes(t: tuple) -> int:
    _, sizes, dtype, _ = t
    return math.prod(sizes) * TORCH_DTYPE_ITEMSIZE[dtype]


@functools.lru_cache(maxsize=8)
def target(name: str | None = None, lnc: int | None = None) -> hw_cost.CostTarget:
    """The cost target: the modelled topology's chip and LNC unless named."""
    if name is None:
        return hw_cost.target_from_topology(_core.topology())
    return hw_cost.cost_target(name, lnc)


def op_cost(op: str, args: dict[str, Any], outputs: list[Any], cpu_fallback: bool,
            on: hw_cost.CostTarget | None = None) -> hw_cost.OpCost:
    """The modelled cost of one op call described as the C++ side describes it."""
    on = on or target()
    inputs = [t for v in args.values() for t in _tensors(v)]
    results = [t for t in _tensors(outputs)]
    if cpu_fallback:
        return hw_cost.fallback_cost(op, sum(map(_nbytes, inputs)), sum(map(_nbytes, results)),
                                     len(inputs) + len(results), on)
    shapes, dtypes = [t[1] for t in inputs], [t[2] for t in inputs]
    out_shapes, out_dtypes = [t[1] for t in results], [t[2] for t in results]
    scalars = {k: v for k, v in args.items() if not any(True for _ in _tensors(v))}
    try:
        return hw_cost.op_cost(op, shapes, dtypes, on, out_shapes=out_shapes,
                               out_dtypes=out_dtypes, **scalars)
    except (ValueError, TypeError, KeyError):
        # No formula fits (an op the model does not know): charge it as data movement.
        return hw_cost.op_cost("aten::cat", shapes or out_shapes, dtypes or out_dtypes, on,
                               out_shapes=out_shapes, out_dtypes=out_dtypes)


def seconds(op: str, args: dict[str, Any], outputs: list[Any], cpu_fallback: bool) -> float:
    """Called by C++ once per combination: modelled seconds on the configured target."""
    return op_cost(op, args, outputs, cpu_fallback).seconds


def configure() -> None:
    """Installs the cost model and the event clock from the environment."""
    event_time = config.get("TORCHNEURON_EVENT_TIME")
    if event_time not in ("modeled", "host"):
        raise ValueError(f"TORCHNEURON_EVENT_TIME={event_time!r} is not valid: use 'modeled' "
                         "(Trainium time from the cost model) or 'host' (wall-clock time)")
    costing = config.get_flag("TORCHNEURON_COST_MODEL")
    target.cache_clear()
    _C._set_costing(costing)
    _C._set_modeled_event_time(costing and event_time == "modeled")
    _C._set_cost_oracle(seconds)
    _C._set_transfer_model(hw_cost.DMA_FIXED_SECONDS, target().host_link_bytes_per_second)
