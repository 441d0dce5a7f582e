"""``torchneuron.estimate``: how long a piece of PyTorch code would take on Trainium.

Runs the function once on the neuron device (results are CPU's, as always),
records every op it ran with its shapes and every copy that left a device
(host <-> device, device <-> device), then costs them with the roofline model
of :mod:`torchneuron.hardware.cost` and the DMA links for each requested chip:
modelled time per op and in total, FLOPs, achieved FLOP/s and model FLOPs
utilisation (MFU) against the logical core's dense BF16 TensorE peak, and the
peak device memory the run needed.

    est = torchneuron.estimate(train_step, batch)
    print(est)                       # a table per target
    est.targets["trn2"].seconds      # modelled seconds on one Trn2 logical core
"""

from __future__ import annotations

import io
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from torchneuron.device import accounting, cost, kernel_costs
from torchneuron.hardware.collectives import bus_factor, parse_work_name
from torchneuron.hardware.fused import fused_kernel_cost

__all__ = ["OpEstimate", "TargetEstimate", "Estimate", "estimate"]


@dataclass(frozen=True)
class OpEstimate:
    """One ATen op's share of the modelled time on one target."""

    op: str
    calls: int
    seconds: float
    flops: float
    cpu_fallback: bool
    # Why the time is not re-costed for this target, if it is not (an NKI kernel is traced,
    # and costed, for the configured chip only).
    note: str = ""
    # Collectives: the bytes moved over the row's calls (nccom-test's size, summed) and the bus
    # bandwidth they ran at (nccom-test's busbw: bytes / time x the algorithm's bus factor).
    # The row's name says the collective, the algorithm and the group size.
    nbytes: int = 0
    busbw: float = 0.0


@dataclass(frozen=True)
class TargetEstimate:
    target: str  # chip name, e.g. "trn2"
    lnc: int
    seconds: float
    flops: float
    peak_flops_per_second: float  # dense BF16 TensorE peak of one logical core
    ops: list[OpEstimate] = field(default_factory=list)

    @property
    def flops_per_second(self) -> float:
        return self.flops / self.seconds if self.seconds else 0.0

    @property
    def mfu(self) -> float:
        """Model FLOPs utilisation: achieved FLOP/s over the BF16 TensorE peak."""
        return self.flops_per_second / self.peak_flops_per_second


@dataclass(frozen=True)
class Estimate:
    result: Any  # what the function returned
    targets: dict[str, TargetEstimate]
    peak_memory_bytes: int  # the most device memory allocated at once, over devices

    def __str__(self) -> str:
        from rich.console import Console
        from rich.table import Table

        console = Console(width=120, record=True, file=io.StringIO())  # rendered to text only
        summary = Table(title=f"torchneuron.estimate (peak device memory {self.peak_memory_bytes / 2**20:.1f} MiB)")
        for column in ("target", "modelled time", "GFLOP", "TFLOP/s", "MFU"):
            summary.add_column(column)
        for t in self.targets.values():
            summary.add_row(f"{t.target} LNC={t.lnc}", f"{t.seconds * 1e3:.3f} ms", f"{t.flops / 1e9:.3f}",
                            f"{t.flops_per_second / 1e12:.2f}", f"{t.mfu:.1%}")
        console.print(summary)
        first = next(iter(self.targets.values()), None)
        if first is not None:
            ops = Table(title=f"time by op on {first.target} (top 10)")
            for column in ("op", "calls", "time", "share", "GFLOP", "CPU fallback"):
                ops.add_column(column)
            for o in first.ops[:10]:
                ops.add_row(o.op, str(o.calls), f"{o.seconds * 1e6:.1f} us",
                            f"{o.seconds / first.seconds:.1%}" if first.seconds else "-",
                            f"{o.flops / 1e9:.3f}", "yes" if o.cpu_fallback else "")
            console.print(ops)
            collectives = [o for o in first.ops if o.nbytes]
            if collectives:
                table = Table(title=f"collectives on {first.target}")
                for column in ("collective (algorithm, group)", "calls", "bytes", "time", "busbw"):
                    table.add_column(column)
                for o in collectives:
                    table.add_row(o.op.removeprefix("collective: "), str(o.calls), f"{o.nbytes:,}",
                                  f"{o.seconds * 1e6:.1f} us", f"{o.busbw / 1e9:.1f} GB/s")
                console.print(table)
        return console.export_text()


def cost_on(added: accounting.Snapshot, name: str | None = None, lnc: int | None = None) -> TargetEstimate:
    """The work ``added`` (a snapshot difference), costed on target chip ``name`` (at ``lnc``,
    or the chip's default)."""
    target = cost.target(name, lnc)
    configured = cost.target()
    per_op: dict[str, list] = defaultdict(lambda: [0, 0.0, 0.0, False, "", 0, 0.0])
    for (op, args, outputs, fallback), calls, _ in added.cost_entries.values():
        c = cost.op_cost(op, args, outputs, fallback, on=target)
        row = per_op[op]
        row[0] += calls
        row[1] += c.seconds * calls
        row[2] += c.flops * calls
        row[3] = fallback
    works = kernel_costs.works()
    for slot, calls in enumerate(added.kernel_calls):  # fused kernels of compiled graphs
        if calls > 0 and slot < len(works):
            c = fused_kernel_cost(works[slot], target)
            row = per_op["compiled fused kernels"]
            row[0] += calls
            row[1] += c.seconds * calls
            row[2] += c.flops * calls
    for link, (copies, nbytes) in added.transfers.items():  # copies that leave a device: DMAs
        if copies:
            row = per_op[cost.TRANSFER_LABELS[link]]
            row[0] += copies
            row[1] += cost.transfer_seconds(link, copies, nbytes, target)
    for work in added.work.values():  # NKI kernels and collectives, as recorded
        row = per_op[f"{work.kind.replace('_', ' ')}: {work.name}"]
        row[0] += work.calls
        row[1] += work.modeled_seconds
        row[2] += work.flops
        if (target.chip.name, target.lnc) != (configured.chip.name, configured.lnc):
            row[4] = (f"as recorded on {configured.chip.name} LNC={configured.lnc}: "
                      "its cost is modelled where it ran")
        described = parse_work_name(work.name) if work.kind == "collective" else None
        if described is not None:
            row[5] += work.bytes
            row[6] = row[5] / row[1] * bus_factor(described[0], described[2]) if row[1] > 0 else 0.0
    ops = sorted((OpEstimate(op, *row) for op, row in per_op.items()), key=lambda o: -o.seconds)
    return TargetEstimate(
        target=target.chip.name, lnc=target.lnc,
        seconds=sum(o.seconds for o in ops), flops=sum(o.flops for o in ops),
        peak_flops_per_second=target.tensor_flops_per_second("bfloat16"), ops=ops)


def estimate(fn: Callable[..., Any], *args: Any, targets: Sequence[str] = ("trn2", "trn3"),
             **kwargs: Any) -> Estimate:
    """Runs ``fn(*args, **kwargs)`` once and models its time on each target chip.

    A view of the accounting record: what ``fn`` added to it (every op with its
    shapes, compiled kernel, copy, NKI kernel and collective), re-costed per
    target. Counters the program reads elsewhere (metrics) are left as they are.
    Only work on neuron tensors is modelled; host-side Python time is not (on
    real hardware it overlaps with the device's asynchronous queue).
    """
    if not targets:
        raise ValueError("estimate() needs at least one target chip, e.g. targets=('trn2',)")
    devices = range(torch.neuron.device_count())
    torch.neuron.synchronize()
    for d in devices:
        torch.neuron.reset_peak_memory_stats(d)
    with accounting.pinned_cost_cache():  # every combination fn meets is re-costed per target below
        before = accounting.snapshot()
        result = fn(*args, **kwargs)
        torch.neuron.synchronize()
        added = accounting.snapshot().since(before)
    peak = max((torch.neuron.max_memory_allocated(d) for d in devices), default=0)
    per_target = {}
    for name in targets:
        t = cost_on(added, name)
        per_target[t.target] = t
    return Estimate(result=result, targets=per_target, peak_memory_bytes=peak)
