"""The terminal summary of a check report (``rich``)."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

GiB = 2**30
_VERDICT_STYLE = {"fails": "bold red", "runs on device": "bold green"}


def _bytes(n: float) -> str:
    for unit, size in (("GiB", GiB), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:,.2f} {unit}"
    return f"{int(n)} B"


def _row(table: Table, *cells: str) -> None:
    """A row of the script's own text (op names, messages, paths): never read as markup."""
    table.add_row(*(cell if cell.startswith("[red]") else escape(cell) for cell in cells))


def print_report(console: Console, data: dict[str, Any], written: dict[str, str]) -> None:
    """Verdict first, then every section with figures; then the ranked recommendations."""
    t = data["target"]
    style = _VERDICT_STYLE.get(data["verdict"], "bold yellow")
    console.print(f"[{style}]verdict: {data['verdict']}[/{style}]  "
                  f"({escape(' '.join(data['command']))} on {t['chip']} LNC={t['lnc']}, {data['steps']} "
                  f"optimizer steps, {data['ops']['calls']:,} ops)", highlight=False)
    outcome = data["outcome"]
    if outcome["status"] == "failed":
        console.print(f"[bold red]{outcome['exception_type']}[/bold red]: {escape(outcome['exception'])}"
                      f"{' at ' + escape(outcome['site']) if outcome.get('site') else ''}", highlight=False)
    elif outcome["status"] == "stopped":
        console.print(outcome["detail"])

    if data["fallbacks"]:
        table = Table(title="CPU fallbacks (real Trainium runs these on the host)")
        for column in ("op", "dtypes", "calls", "first call site", "why"):
            table.add_column(column, overflow="fold")
        for f in data["fallbacks"]:
            _row(table, f["op"], ",".join(f["dtypes"]), str(f["calls"]), f["call_site"], f["reason"])
        console.print(table)
    if data["wide_dtypes"]:
        table = Table(title="FP64 / complex / INT64 use")
        for column in ("op", "dtypes", "calls", "what Trainium does"):
            table.add_column(column, overflow="fold")
        for w in data["wide_dtypes"]:
            _row(table, w["op"], ",".join(w["dtypes"]), str(w["calls"]), w["trainium"])
        console.print(table)
    syncs = data["host_syncs"]
    table = Table(title=f"host syncs: {syncs['total']}")
    for column in ("count", "what", "call site"):
        table.add_column(column, overflow="fold")
    for s in syncs["by_site"][:15]:
        _row(table, str(s["count"]), s["description"], s["site"])
    console.print(table)

    table = Table(title="host <-> device traffic", show_header=True)
    for column in ("link", "copies", "bytes"):
        table.add_column(column)
    for link, moved in data["transfers"].items():
        _row(table, link, f"{moved['copies']:,}", _bytes(moved["bytes"]))
    console.print(table)

    c = data["compile"]
    if c["compiles"] or c["graph_breaks"] or c["recompiles"]:
        console.print(f"torch.compile: {c['compiles']} graphs, {c['graph_breaks']} graph breaks, "
                      f"{c['recompiles']} recompiles", highlight=False)

    memory = data["memory"]
    table = Table(title=f"peak device memory {_bytes(memory['peak_allocated_bytes'])} against one device")
    for column in ("chip", "LNC", "HBM per device", "used", "fits"):
        table.add_column(column)
    for cap in memory["capacity"]:
        _row(table, cap["chip"], str(cap["lnc"]), _bytes(cap["bytes_per_device"]),
                      f"{cap['used_fraction']:.1%}", "yes" if cap["fits"] else "[red]no[/red]")
    console.print(table)

    table = Table(title="modelled device time")
    for column in ("target", "total", "per optimizer step", "MFU"):
        table.add_column(column)
    for name, m in data["modelled"].items():
        per_step = f"{m['seconds_per_step'] * 1e3:.3f} ms" if m["seconds_per_step"] else "-"
        _row(table, f"{name} LNC={m['lnc']}", f"{m['seconds'] * 1e3:.3f} ms", per_step, f"{m['mfu']:.1%}")
    console.print(table)
    first_name, first = next(iter(data["modelled"].items()))
    table = Table(title=f"top ops by modelled time on {first_name}")
    for column in ("op", "calls", "time", "share"):
        table.add_column(column)
    for o in first["ops"][:10]:
        share = o["seconds"] / first["seconds"] if first["seconds"] else 0.0
        _row(table, o["op"], str(o["calls"]), f"{o['seconds'] * 1e6:,.1f} us", f"{share:.1%}")
    console.print(table)

    if data["recommendations"]:
        console.print("[bold]recommendations[/bold]")
        for r in data["recommendations"]:
            console.print(f"  {r['rank']}. {escape('[' + r['severity'] + ']')} {escape(r['text'])}",
                          highlight=False)
    for kind, path in written.items():
        console.print(f"{kind} report: {path}", highlight=False)
