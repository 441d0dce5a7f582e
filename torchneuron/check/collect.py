"""Every figure of a ``torchneuron check`` report, read from the one accounting record.

A view, as ``torchneuron.metrics`` and ``torchneuron.estimate`` are: per-op
totals and fallback call sites (:mod:`torchneuron.profiler.metrics`), what the
run added to the record re-costed per chip (:mod:`torchneuron.profiler.estimate`),
transfers, compile counters and the allocator's peaks. The result is plain JSON.
"""

from __future__ import annotations

from collections import Counter, defaultdict
import sys
from typing import Any

import torch

from torchneuron import config
from torchneuron.device import accounting, cost, fallback
from torchneuron.hardware import engines, get_chip, placement
from torchneuron.profiler import metrics
from torchneuron.profiler.estimate import cost_on

SCHEMA = "torchneuron-check/1"
TARGETS = ("trn2", "trn3")

# Op families for "time by op family", by ATen base name: hardware/engines.py's, in report order.
_FAMILIES: tuple[tuple[str, frozenset[str]], ...] = (
    ("matmul", engines.MATMUL),
    ("convolution", engines.CONVOLUTION | engines.CONVOLUTION_BACKWARD),
    ("normalization", engines.NORMALIZATION),
    ("softmax/attention", engines.SOFTMAX | engines.ATTENTION),
    ("reduction", engines.REDUCTION),
    ("optimizer", engines.OPTIMIZER),
    ("copy/layout", engines.MOVEMENT | engines.VIEWS),
)


def op_family(op: str) -> str:
    """The family an op's modelled time is shown under."""
    if op.startswith("compiled"):
        return "compiled kernels"
    if op.startswith("copies"):
        return "host/device copies"
    if op.startswith(("nki kernel", "collective")):
        return op.split(":")[0]
    base = op.split("::")[-1].split(".")[0]
    if base.startswith(engines.OPTIMIZER_PREFIXES):
        return "optimizer"
    for family, names in _FAMILIES:
        if base in names:
            return family
    return "elementwise/other"


def _modelled(added: accounting.Snapshot, steps: int, lnc: int | None) -> dict[str, Any]:
    out = {}
    for name in TARGETS:
        chip_lnc = lnc if lnc in get_chip(name).supported_lnc else None
        est = cost_on(added, name, chip_lnc)
        families: dict[str, float] = defaultdict(float)
        for o in est.ops:
            families[op_family(o.op)] += o.seconds
        out[name] = {
            "lnc": est.lnc, "seconds": est.seconds, "flops": est.flops, "mfu": est.mfu,
            "seconds_per_step": est.seconds / steps if steps else None,
            "peak_flops_per_second": est.peak_flops_per_second,
            "families": dict(sorted(families.items(), key=lambda kv: -kv[1])),
            "ops": [{"op": o.op, "calls": o.calls, "seconds": o.seconds, "flops": o.flops,
                     "cpu_fallback": o.cpu_fallback} for o in est.ops[:30]],
        }
    return out


def _roofline(added: accounting.Snapshot) -> dict[str, Any]:
    """Per op on the configured chip: FLOPs, HBM bytes and modelled seconds, with the chip's
    roofs (BF16 TensorE peak and HBM bandwidth of one logical core)."""
    on = cost.target()
    rows: dict[str, list[float]] = defaultdict(lambda: [0, 0.0, 0.0, 0.0])
    for (op, args, outputs, on_host), calls, _ in added.cost_entries.values():
        if on_host:
            continue
        c = cost.op_cost(op, args, outputs, on_host, on=on)
        seconds = c.compute_seconds if c.bound == "compute" else max(c.memory_seconds, c.compute_seconds)
        row = rows[op]
        row[0] += calls
        row[1] += c.flops * calls
        row[2] += (c.bytes_read + c.bytes_written) * calls
        row[3] += (seconds + c.launch_seconds) * calls
    points = [{"op": op, "calls": int(r[0]), "flops": r[1], "bytes": r[2], "seconds": r[3]}
              for op, r in rows.items() if r[1] > 0 and r[2] > 0 and r[3] > 0]
    return {"chip": on.chip.name, "lnc": on.lnc, "points": points,
            "peak_flops_per_second": on.tensor_flops_per_second("bfloat16"),
            "hbm_bytes_per_second": on.hbm_bytes_per_second}


def _wide_dtypes(ops: list[metrics.OpCount], target: str) -> list[dict[str, Any]]:
    native_int64 = config.get_flag("TORCHNEURON_NATIVE_INT64")
    rows = []
    for c in ops:
        wide = sorted(fallback.WIDE_DTYPES.intersection(c.dtypes))
        if not wide:
            continue
        where = placement(c.op, c.dtypes, target=target, native_int64=native_int64)
        trainium = where.reason if not where.on_device else ("; ".join(where.notes) or "runs on device")
        rows.append({"op": c.op, "dtypes": list(c.dtypes), "wide": wide, "calls": c.calls,
                     "on_device": where.on_device, "trainium": trainium,
                     "call_site": c.call_site or fallback.wide_dtype_sites.get((c.op, tuple(c.dtypes)), "")})
    return rows


def _memory(timeline: list[list[int]], breakdown: dict[str, Any] | None) -> dict[str, Any]:
    devices = range(torch.neuron.device_count())
    peaks = [torch.neuron.max_memory_allocated(d) for d in devices]
    reserved = [torch.neuron.max_memory_reserved(d) for d in devices]
    peak = max(peaks, default=0)
    capacity = []
    for name in TARGETS:
        chip = get_chip(name)
        for lnc in chip.supported_lnc:
            per_device = chip.hbm_bytes_per_chip * lnc // chip.physical_cores_per_chip
            capacity.append({"chip": name, "lnc": lnc, "bytes_per_device": per_device,
                             "fits": peak <= per_device, "used_fraction": peak / per_device})
    return {"peak_allocated_bytes": peak, "peak_allocated_per_device": peaks,
            "peak_reserved_per_device": reserved, "timeline": timeline, "capacity": capacity,
            "breakdown": breakdown, "instance": _instance_sizing(peaks)}


MAX_SAMPLES = 2000  # points kept per device for the memory timeline


def memory_samples(samples: list[accounting.MemorySample], step_ns: list[int]) -> dict[str, Any]:
    """The memory timeline of the whole run: each device's allocated bytes over the device work
    items issued (ops, copies, kernels), at most :data:`MAX_SAMPLES` points per device (the
    lowest and highest of each stretch, so peaks stay), and the work item each optimizer step ended at.

    ``samples``: one per allocation and free; ``step_ns``: the event clock at each step."""
    by_device: dict[int, list[accounting.MemorySample]] = defaultdict(list)
    for s in samples:
        by_device[s.device].append(s)
    timeline = {}
    for device, rows in sorted(by_device.items()):
        stride = -(-len(rows) // (MAX_SAMPLES // 2))
        points = []
        for i in range(0, len(rows), stride):
            stretch = rows[i:i + stride]
            low = min(stretch, key=lambda s: s.allocated)
            high = max(stretch, key=lambda s: s.allocated)
            for s in sorted({id(low): low, id(high): high}.values(), key=lambda s: s.host_ns):
                points.append([s.work_items, s.allocated])
        timeline[str(device)] = points
    marks, i = [], 0
    ordered = sorted(samples, key=lambda s: s.host_ns)
    for ns in step_ns:
        while i < len(ordered) and ordered[i].host_ns <= ns:
            i += 1
        marks.append(ordered[i - 1].work_items if i else 0)
    return {"samples": timeline, "step_marks": marks}


def _instance_sizing(peaks: list[int]) -> dict[str, Any] | None:
    """The run's memory against the modelled instance's devices (chips x logical cores each):
    whether the fullest device fits one, and how many devices the devices' peaks need when
    spread evenly (a lower bound: what sharding such as FSDP2 could reach at best)."""
    topo = config.device_topology()
    if topo.instance is None:
        return None
    per_device = topo.chip.hbm_bytes_per_chip // topo.logical_cores_per_chip
    devices = topo.num_chips * topo.logical_cores_per_chip
    total = sum(peaks)
    needed = -(-total // per_device) if total else 0
    return {"name": topo.instance.name, "chip": topo.chip.name, "chips": topo.num_chips,
            "lnc": topo.lnc, "cores_per_chip": topo.logical_cores_per_chip, "devices": devices,
            "bytes_per_device": per_device, "total_bytes": per_device * devices,
            "peak_bytes_all_devices": total, "fits_one_device": max(peaks, default=0) <= per_device,
            "devices_needed_at_least": needed, "fits_instance": needed <= devices}


def _stacks(counted: list[tuple[tuple[str, ...], int]] | None) -> dict[str, Any]:
    """A call site's ``stack`` (its most frequent whole user Python stack, innermost frame
    first) and ``stacks`` (each distinct stack that reached it, with its calls, most first)."""
    counted = counted or []
    return {"stack": list(counted[0][0]) if counted else [],
            "stacks": [{"stack": list(stack), "calls": n} for stack, n in counted]}


def _fallback_row(c: metrics.OpCount) -> dict[str, Any]:
    stacks = fallback.call_site_stacks(c.op, c.dtypes)
    sites = [{"site": site, "calls": n, **_stacks(stacks.get(site))}
             for site, n in fallback.call_site_counts(c.op, c.dtypes)]
    first = c.call_site or ""
    return {"op": c.op, "dtypes": list(c.dtypes), "calls": c.calls, "reason": c.reason,
            "call_site": first, "stack": _stacks(stacks.get(first))["stack"],
            "bytes_to_host": c.bytes_to_host, "call_sites": sites}


def collect(added: accounting.Snapshot, *, outcome: dict[str, Any], steps: int,
            wall_seconds: float, syncs: Counter, sync_descriptions: dict,
            memory_timeline: list[list[int]], breakdown: dict[str, Any] | None = None,
            sync_stacks: dict[tuple[str, str], Counter] | None = None) -> dict[str, Any]:
    """The report's data: what the run ``added`` to the record, and what it did.

    ``sync_stacks`` holds, per (kind, site) of ``syncs``, the whole user Python stacks that
    reached it with their counts."""
    sync_stacks = sync_stacks or {}
    topo = config.device_topology()
    ops = metrics.ops()
    falls = [c for c in ops if c.cpu_fallback]
    moved = accounting.transfers()
    backend = sys.modules.get("torchneuron.compiler.backend")
    if backend is not None:  # graph breaks after the frame's last compiled graph
        backend.record_graph_breaks()
    modelled = _modelled(added, steps, topo.lnc)
    return {
        "schema": SCHEMA,
        "target": {"chip": topo.chip.name, "lnc": topo.lnc, "devices": torch.neuron.device_count(),
                   "instance": topo.instance.name if topo.instance else None},
        "outcome": outcome,
        "steps": steps,
        "wall_seconds": wall_seconds,
        "ops": {"calls": sum(c.calls for c in ops), "distinct": len(ops)},
        "fallbacks": [_fallback_row(c) for c in falls],
        "pytorch_internal_host_ops": sum(c.internal_calls for c in metrics.pytorch_internal_ops()),
        "wide_dtypes": _wide_dtypes(ops, topo.chip.name),
        "host_syncs": {
            "total": sum(syncs.values()),
            "by_site": [{"kind": kind, "site": site, "count": n,
                         "description": sync_descriptions[(kind, site)],
                         **_stacks(sync_stacks.get((kind, site), Counter()).most_common())}
                        for (kind, site), n in syncs.most_common()],
        },
        "transfers": {link: {"copies": c, "bytes": b} for link, (c, b) in moved.items()},
        "compile": accounting.compile_metrics(),
        "memory": _memory(memory_timeline, breakdown),
        "modelled": modelled,
        "roofline": _roofline(added),
    }
