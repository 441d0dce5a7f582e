"""Results of the NKI cost model: :class:`TimelineEvent` (one instruction placed on its engine
or DMA queue) and :class:`KernelCost` (latency, per-engine busy time and utilisation, FLOPs
and HFU, DMA bytes and MBU, the sorted timeline, the costliest kernel lines, a rich text
report table and the Chrome trace hook into :mod:`torchneuron.profiler.nki_trace`).
"""

from __future__ import annotations

import io
import os
from dataclasses import dataclass, field
from typing import Any

from torchneuron.nki.cost.constants import TRACK_POSITION
from torchneuron.nki.errors import SourceLocation


@dataclass(slots=True)
class TimelineEvent:
    """One instruction placed on its engine (DMA: on a queue of the core's DMA engines)."""

    engine: str
    queue: int | None  # DMA queue index; None for compute engines
    core: int  # physical core
    program: int
    start_ns: float
    end_ns: float
    opcode: str
    index: int  # Instruction.index
    source_location: SourceLocation | None  # Instruction.location
    formula: str
    flops: int = 0
    bytes: int = 0
    data_start_ns: float | None = None  # DMA: when its bytes start moving
    dma_engines: tuple[int, ...] = ()

    @property
    def duration_ns(self) -> float:
        return self.end_ns - self.start_ns

    @property
    def location(self) -> str | None:
        """``"kernel.py:12 in fn"``, or None for records without a location."""
        return str(self.source_location) if self.source_location is not None else None

    @property
    def source(self) -> str:
        """The kernel source line that issued the instruction."""
        return getattr(self.source_location, "line", "") or ""

    @property
    def track(self) -> str:
        return f"dma queue {self.queue}" if self.queue is not None else self.engine


@dataclass
class KernelCost:
    """The modelled execution of one kernel run (times in nanoseconds)."""

    kernel_name: str
    target: str  # chip name
    neuroncore: str  # "v2", "v3", "v4"
    lnc: int
    programs: int
    cores: int  # physical cores used
    latency_ns: float
    engine_busy_ns: dict[str, float]
    instruction_counts: dict[str, int]
    flops: int
    flops_dtype: str | None
    peak_flops_per_second: float  # TensorE peak of one physical core for flops_dtype
    dma_bytes: int
    peak_dma_bytes_per_second: float  # per physical core
    events: list[TimelineEvent] = field(default_factory=list, repr=False)

    @property
    def latency_seconds(self) -> float:
        return self.latency_ns * 1e-9

    @property
    def latency_us(self) -> float:
        return self.latency_ns * 1e-3

    @property
    def hfu(self) -> float:
        """Hardware FLOPs utilisation: FLOPs / (latency x TensorE peak x physical cores) (facts 9)."""
        denominator = self.latency_seconds * self.peak_flops_per_second * self.cores
        return self.flops / denominator if denominator > 0 else 0.0

    @property
    def mbu(self) -> float:
        """Memory-bound utilisation: DMA bytes / (latency x peak DMA bandwidth x physical cores)."""
        denominator = self.latency_seconds * self.peak_dma_bytes_per_second * self.cores
        return self.dma_bytes / denominator if denominator > 0 else 0.0

    def utilisation(self, engine: str) -> float:
        """Busy time of ``engine`` over latency x physical cores (DMA: share of engine-time moving bytes)."""
        denominator = self.latency_ns * self.cores
        return self.engine_busy_ns.get(engine, 0.0) / denominator if denominator > 0 else 0.0

    utilization = utilisation

    def timeline(self) -> list[TimelineEvent]:
        """Every instruction with its engine (DMA queue), start and end, in start order."""
        return sorted(self.events, key=lambda e: (e.start_ns, e.index))

    def top_instructions(self, n: int = 10) -> list[dict[str, Any]]:
        """Kernel lines by modelled engine time (instructions of one line and opcode summed)."""
        groups: dict[tuple, dict[str, Any]] = {}
        for e in self.events:
            key = (e.location, e.opcode, e.engine)
            g = groups.get(key)
            if g is None:
                g = groups[key] = {"location": e.location, "source": e.source, "opcode": e.opcode,
                                   "engine": e.engine, "count": 0, "total_ns": 0.0, "formula": e.formula}
            g["count"] += 1
            g["total_ns"] += e.duration_ns
        return sorted(groups.values(), key=lambda g: -g["total_ns"])[:n]

    def table(self, top: int = 10) -> str:
        """A text report: latency, utilisation per engine, HFU/MBU and the costliest kernel lines."""
        from rich.console import Console
        from rich.markup import escape
        from rich.table import Table

        console = Console(width=140, record=True, file=io.StringIO())  # rendered to text only
        title = (f"NKI kernel {self.kernel_name!r} on {self.target} (NeuronCore-{self.neuroncore}), "
                 f"LNC={self.lnc}, {self.programs} program(s)")
        summary = Table(title=escape(title), show_header=False)
        summary.add_row("modelled latency", f"{self.latency_us:,.3f} us")
        summary.add_row("instructions", f"{sum(self.instruction_counts.values()):,}")
        summary.add_row("FLOPs", f"{self.flops:,}" + (f" ({self.flops_dtype})" if self.flops_dtype else ""))
        summary.add_row("HFU", f"{self.hfu:.2%} of {self.peak_flops_per_second * self.cores / 1e12:.2f} TFLOPS")
        summary.add_row("DMA bytes", f"{self.dma_bytes:,}")
        summary.add_row("MBU", f"{self.mbu:.2%} of {self.peak_dma_bytes_per_second * self.cores / 1e9:.1f} GB/s")
        console.print(summary)
        engines = Table(title="engines")
        for column in ("engine", "instructions", "busy", "utilisation"):
            engines.add_column(column, justify="right" if column != "engine" else "left")
        for engine in sorted(set(self.engine_busy_ns) | set(self.instruction_counts), key=_engine_order):
            engines.add_row(engine, f"{self.instruction_counts.get(engine, 0):,}",
                            f"{self.engine_busy_ns.get(engine, 0.0) / 1e3:,.3f} us",
                            f"{self.utilisation(engine):.1%}")
        console.print(engines)
        rows = self.top_instructions(top)
        if rows:
            lines = Table(title=f"top {len(rows)} kernel lines by engine time")
            for column in ("location", "opcode", "engine", "count", "time", "formula", "source"):
                lines.add_column(column, overflow="fold")
            for r in rows:
                lines.add_row(escape(r["location"] or "-"), escape(r["opcode"]), r["engine"], f"{r['count']:,}",
                              f"{r['total_ns'] / 1e3:,.3f} us", escape(r["formula"]), escape(r["source"] or ""))
            console.print(lines)
        return console.export_text()

    def __str__(self) -> str:
        return self.table()

    def to_chrome_trace(self, path: str | os.PathLike | None = None) -> dict:
        """The timeline as Chrome trace JSON (chrome://tracing, Perfetto); written to ``path`` if given."""
        from torchneuron.profiler.nki_trace import chrome_trace, write_chrome_trace

        if path is None:
            return chrome_trace(self)
        return write_chrome_trace(self, path)


def _engine_order(engine: str) -> tuple[int, str]:
    return (TRACK_POSITION.get(engine, len(TRACK_POSITION)), engine)
