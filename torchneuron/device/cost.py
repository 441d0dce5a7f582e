"""Modelled Trainium time of the ops running on neuron, as the C++ side asks.

The C++ fallback describes each new (op, dtypes, shapes, arguments)
combination once -- ``args`` maps the schema's argument names to values, with
tensors as ``("tensor", sizes, dtype, contiguous)`` -- and caches the seconds
this module returns; every call then advances its stream's modelled clock
(``Event.elapsed_time`` reads it). The formulas are
:mod:`torchneuron.hardware.cost`'s roofline, for the modelled chip and LNC.
Ops real Trainium runs on the host are charged their transfers instead.

Copies are charged too: within a device as the cost model's ``_to_copy`` (an
HBM read and write; a VectorE pass if the dtype changes), and between host and
device, or between two devices, as one DMA: its fixed cost plus the bytes over
the link crossed (:func:`device_link_bytes_per_second`).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterator
from typing import Any

from torchneuron import _C
from torchneuron import config
from torchneuron.device import _core
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


# How costing.cpp describes a copy within one device: _copy_from(self=src, dst).
_DEVICE_COPY = "aten::_copy_from"


def device_link_bytes_per_second(on: hw_cost.CostTarget, *, cross_chip: bool) -> float:
    """Rate of a copy between two logical cores (trainium-facts.md, Chips).

    The copy is a DMA from one core's HBM to the other's: it runs at the slower of
    a logical core's DMA engines (16 engines x B/ns x LNC) and its HBM share (the
    read and the write hit different cores' HBM, so each moves the bytes once).
    Between chips it also crosses the chip-to-chip interconnect (NeuronLink); the
    facts give one figure per chip, assumed all available to the copy.
    """
    rate = min(on.chip.dma_bytes_per_second_per_core * on.lnc, on.hbm_bytes_per_second)
    return min(rate, on.chip.chip_link_bytes_per_second) if cross_chip else rate


def device_copy_seconds(nbytes: int, on: hw_cost.CostTarget, *, cross_chip: bool) -> float:
    """Modelled time of copying ``nbytes`` between two devices: one DMA fixed cost
    plus the bytes at :func:`device_link_bytes_per_second`."""
    return hw_cost.dma_seconds(1, nbytes, device_link_bytes_per_second(on, cross_chip=cross_chip))


# The links C++ counts copies on (_C._transfer_counts), with the label estimate() shows.
TRANSFER_LABELS = {
    "host_to_device": "copies host -> device",
    "device_to_host": "copies device -> host",
    "device_to_device_same_chip": "copies device -> device (same chip)",
    "device_to_device_cross_chip": "copies device -> device (chip to chip)",
}


def transfer_seconds(link: str, copies: int, nbytes: int, on: hw_cost.CostTarget | None = None) -> float:
    """Modelled time of ``copies`` DMAs moving ``nbytes`` in all over ``link`` (a key of
    :data:`TRANSFER_LABELS`): the DMA fixed cost each, plus the bytes at the link's rate,
    as the C++ side charges them to the streams."""
    on = on or target()
    if link in ("host_to_device", "device_to_host"):
        rate = on.host_link_bytes_per_second
    elif link in ("device_to_device_same_chip", "device_to_device_cross_chip"):
        rate = device_link_bytes_per_second(on, cross_chip=link.endswith("cross_chip"))
    else:
        raise ValueError(f"unknown link {link!r}; expected one of {sorted(TRANSFER_LABELS)}")
    return hw_cost.dma_seconds(copies, nbytes, rate)


def op_cost(op: str, args: dict[str, Any], outputs: list[Any], cpu_fallback: bool,
            on: hw_cost.CostTarget | None = None) -> hw_cost.OpCost:
    """The modelled cost of one op call described as the C++ side describes it.

    ``cpu_fallback`` is the record's placement, decided once per (op, dtypes) for the
    configured chip (:func:`torchneuron.device.fallback.decide`): on that chip the cost
    model takes it as is. On another chip (``estimate``'s targets) an op the record runs
    on the device is placed again for that chip. A copy within a device is the op
    ``aten::_copy_from`` to the record, priced with ``_to_copy``'s formula.
    """
    configured = target()
    on = on or configured
    on_device = None if on != configured else not cpu_fallback
    if op == _DEVICE_COPY:  # the copy reads src and writes dst: _to_copy's formula
        op, args = "aten::_to_copy", {"self": args["self"]}
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
                               out_dtypes=out_dtypes, on_device=on_device, **scalars)
    except (ValueError, TypeError, KeyError):
        # No formula fits (an op the model does not know): charge it as data movement.
        return hw_cost.op_cost("aten::cat", shapes or out_shapes, dtypes or out_dtypes, on,
                               out_shapes=out_shapes, out_dtypes=out_dtypes, on_device=on_device)


def charge(op: str, args: dict[str, Any], outputs: list[Any], cpu_fallback: bool) -> tuple[float, float, int, str]:
    """Called by C++ once per combination: (modelled seconds, FLOPs, HBM bytes, bounding
    engine or "") on the configured target, as each call's record and event carry them."""
    c = op_cost(op, args, outputs, cpu_fallback)
    return c.seconds, float(c.flops), int(c.bytes_read + c.bytes_written), str(c.engine or "")


# The variables configure() reads: a change re-applies them (config.on_change).
SETTINGS = ("TORCHNEURON_COST_MODEL", "TORCHNEURON_EVENT_TIME")


def configure() -> None:
    """Installs the cost model and the event clock from the environment."""
    event_time = config.value("TORCHNEURON_EVENT_TIME")
    costing = config.get_flag("TORCHNEURON_COST_MODEL")
    target.cache_clear()
    _C._set_costing(costing)
    _C._set_modeled_event_time(costing and event_time == "modeled")
    _C._set_cost_oracle(charge)
    on = target()
    _C._set_transfer_model(hw_cost.DMA_FIXED_SECONDS, on.host_link_bytes_per_second,
                           device_link_bytes_per_second(on, cross_chip=False),
                           device_link_bytes_per_second(on, cross_chip=True),
                           [d.chip_index for d in _core.topology().devices])
