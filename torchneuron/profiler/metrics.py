"""Counters of what ran on the neuron device, like torch_xla's metrics report.

Answers the questions a port to Trainium raises: which ops would leave the
device (CPU fallbacks, per op and dtype, with the first call site), how often
the program waits on the device (host syncs: ``.item()``, ``.cpu()``,
printing), and how many bytes cross between host and device each way.

    import torchneuron
    torchneuron.metrics.reset()
    ...  # run a step
    print(torchneuron.metrics.report())
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import TYPE_CHECKING

from torchneuron.device import accounting, fallback

if TYPE_CHECKING:
    from rich.table import Table

__all__ = ["OpCount", "ops", "fallbacks", "pytorch_internal_ops", "counters", "report", "reset"]


@dataclass(frozen=True)
class OpCount:
    """One ATen op with one combination of argument dtypes."""

    op: str  # e.g. "aten::add.Tensor"
    dtypes: tuple[str, ...]
    calls: int
    cpu_fallback: bool  # real Trainium runs it on the host CPU
    reason: str  # why, if cpu_fallback
    bytes_to_host: int  # fallbacks: inputs a real device would send to the host
    bytes_to_device: int  # ... and results it would receive back
    call_site: str | None  # first call site of a fallback
    modeled_seconds: float  # modelled Trainium time of all calls
    # CPU-fallback calls made by PyTorch internals that compute on the host by design
    # (device.fallback.PYTORCH_HOST_INTERNALS); not in ``calls``
    internal_calls: int = 0


def _records() -> list[OpCount]:
    return [OpCount(t.op, t.dtypes, t.calls, t.cpu_fallback, t.reason, t.bytes_to_host,
                    t.bytes_to_device, fallback.call_sites.get((t.op, t.dtypes)), t.modeled_seconds,
                    t.internal_calls)
            for t in accounting.op_totals()]


def ops() -> list[OpCount]:
    """Every (op, dtypes) the program executed through the device's op path since the
    last reset."""
    return sorted((c for c in _records() if c.calls), key=lambda c: (-c.calls, c.op))


def pytorch_internal_ops() -> list[OpCount]:
    """CPU-fallback ops run by PyTorch internals that compute on the host by design
    (GradScaler's float64 reciprocal; see ``device.fallback.PYTORCH_HOST_INTERNALS``):
    counted here, not as the program's fallbacks, and never refused by strict mode."""
    return sorted((c for c in _records() if c.internal_calls),
                  key=lambda c: (-c.internal_calls, c.op))


def fallbacks() -> list[OpCount]:
    """The ops real Trainium would run on the CPU, most frequent first."""
    return [c for c in ops() if c.cpu_fallback]


def counters() -> dict[str, int]:
    """Totals: ops executed, CPU fallbacks, host syncs, copies and bytes each way."""
    counted = ops()
    moved = accounting.transfers()
    to_device, to_host = moved["host_to_device"], moved["device_to_host"]
    return {
        "ops": sum(c.calls for c in counted),
        "cpu_fallbacks": sum(c.calls for c in counted if c.cpu_fallback),
        "pytorch_internal_host_ops": sum(c.internal_calls for c in pytorch_internal_ops()),
        "host_syncs": accounting.host_syncs(),
        "copies_to_device": to_device[0],
        "copies_to_host": to_host[0],
        "bytes_to_device": to_device[1],
        "bytes_to_host": to_host[1],
        "fallback_bytes_to_host": sum(c.bytes_to_host for c in counted),
        "fallback_bytes_to_device": sum(c.bytes_to_device for c in counted),
        "cost_cache_flushes": caches()["cost_cache_flushes"],
    }


def caches() -> dict[str, int]:
    """Sizes of the bounded host-side caches behind the hot path.

    The modelled-time cost of each (op, dtypes, shapes) combination is cached
    up to a capacity; when full, the cache is emptied and combinations still in
    use are costed again (a flush), so a program meeting ever new shapes keeps
    flat host memory. Frequent flushes mean first-sight costing dominates.
    """
    entries, capacity, flushes = accounting.cost_cache_stats()
    return {"cost_cache_entries": entries, "cost_cache_capacity": capacity,
            "cost_cache_flushes": flushes}


def reset() -> None:
    """Zeroes every counter of the record (decisions about where ops run stay cached)."""
    accounting.reset()


def _dataless_tables() -> list:
    """What dataless execution could not know: values read (placeholders returned), shapes
    that depend on values and saves not written, each at its call site (empty when none)."""
    from rich.table import Table

    from torchneuron.device import dataless, dataless_files

    def table(title: str, columns: tuple[str, ...], rows: list[tuple[str, ...]]) -> Table:
        t = Table(title=f"dataless: {title}")
        for column in columns:
            t.add_column(column, overflow="fold")
        for row in rows:
            t.add_row(*row)
        return t

    sections = [
        ("values read that were never computed (placeholders returned)",
         ("read", "call site", "shape", "dtype", "placeholder", "calls"),
         [(r.what, r.site, str(list(r.shape)), r.dtype, f"{r.placeholder:g}" + (" (known)" if r.known else ""),
           str(r.calls)) for r in dataless.reads()]),
        ("shapes that depend on values", ("op", "call site", "elements", "length used", "calls"),
         [(s.op, s.site, str(s.elements), f"{s.chosen}" + (" (hint)" if s.hinted else " (bound)"), str(s.calls))
          for s in dataless.data_dependent_shapes()]),
        ("saves not written (the values are placeholders)", ("save", "path", "call site", "bytes", "calls"),
         [(w.what, w.path, w.site, f"{w.bytes:,}", str(w.calls)) for w in dataless_files.skipped_writes()]),
    ]
    return [table(title, columns, rows) for title, columns, rows in sections if rows]


def report(top: int = 15) -> str:
    """A plain-text report: totals, CPU fallbacks, the most frequent ops, what
    ``torch.compile(backend="neuron")`` did (when it ran), and what dataless execution read or
    shaped without values (when it ran)."""
    from rich.console import Console
    from rich.table import Table

    totals = Table(title="neuron metrics", show_header=False)
    for key, value in counters().items():
        totals.add_row(key, f"{value:,}")
    falls = Table(title="CPU fallbacks (real Trainium runs these on the host)")
    for column in ("op", "dtypes", "calls", "bytes to host", "call sites (calls)", "why"):
        falls.add_column(column, overflow="fold")
    for c in fallbacks():
        sites = fallback.call_site_counts(c.op, c.dtypes)
        where = "\n".join(f"{site} ({calls})" for site, calls in sites) or c.call_site or ""
        falls.add_row(c.op, ",".join(c.dtypes), str(c.calls), f"{c.bytes_to_host:,}",
                      where, c.reason)
    freq = Table(title=f"most frequent ops (top {top})")
    for column in ("op", "dtypes", "calls"):
        freq.add_column(column)
    for c in ops()[:top]:
        freq.add_row(c.op, ",".join(c.dtypes), str(c.calls))
    tables = [totals, falls, freq]
    compiled = accounting.compile_metrics()
    if compiled["compiles"] or compiled["eager_fallbacks"]:
        compiles = Table(title="torch.compile(backend='neuron')", show_header=False)
        for key, value in compiled.items():
            if isinstance(value, dict):
                value = "; ".join(f"{k}: {v}" for k, v in value.items()) or "-"
            elif isinstance(value, list):  # reasons, or {site, reason, count} rows
                value = "; ".join(_compile_entry(v) for v in value) or "-"
            elif isinstance(value, float):
                value = f"{value:.2f}"
            compiles.add_row(key, str(value))
        tables.append(compiles)
    kernels = _nki_kernel_table()
    if kernels is not None:
        tables.append(kernels)
    tables.extend(_dataless_tables())
    console = Console(width=140, record=True, file=io.StringIO())  # rendered to text only
    for table in tables:
        console.print(table)
    return console.export_text()


def _compile_entry(entry: object) -> str:
    """One entry of a compile-metrics list: a reason, or a call site's row."""
    if isinstance(entry, dict):
        return f"{entry.get('site', '?')}: {entry.get('reason', '')} (x{entry.get('count', 1)})"
    return str(entry)


def _nki_kernel_table() -> "Table | None":
    """NKI kernels and collectives run on neuron tensors, if any."""
    stats = sorted(accounting.work_totals(), key=lambda w: -w.modeled_seconds)
    if not stats:
        return None
    from rich.table import Table

    table = Table(title="NKI kernels and collectives (modelled device time)")
    for column in ("kind", "name", "calls", "instructions/call", "modelled total", "modelled/call"):
        table.add_column(column)
    for s in stats:
        table.add_row(s.kind, s.name, str(s.calls), f"{s.instructions // max(s.calls, 1):,}",
                      f"{s.modeled_seconds * 1e6:,.1f} us", f"{s.modeled_seconds / max(s.calls, 1) * 1e6:,.1f} us")
    return table
