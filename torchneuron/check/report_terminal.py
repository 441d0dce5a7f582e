"""The terminal summary of a check report (``rich``)."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from torchneuron.check.analysis import first_line, nonfinite_text, selected_modelled

GiB = 2**30
_VERDICT_STYLE = {"fails": "bold red", "runs on device": "bold green"}


def _bytes(n: float) -> str:
    for unit, size in (("TiB", 2**40), ("GiB", GiB), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:,.2f} {unit}"
    return f"{int(n)} B"


def _row(table: Table, *cells: str) -> None:
    """A row of the script's own text (op names, messages, paths): never read as markup."""
    table.add_row(*(cell if cell.startswith("[red]") else escape(cell) for cell in cells))


# Callers shown per stack, and stacks per call site, in the terminal (the JSON and HTML have all).
_CALLERS_SHOWN = 6
_STACKS_SHOWN = 3


def callers_text(stack: list[str]) -> str:
    """The caller chain of a stack, outwards from the call site's caller:
    "<- train.py:41 in step <- train.py:80 in main" ("" for a call from the top level)."""
    callers = stack[1:1 + _CALLERS_SHOWN]
    more = len(stack) - 1 - len(callers)
    return "".join(f" <- {frame}" for frame in callers) + (f" <- ({more} more)" if more > 0 else "")


def site_with_callers(site: str, calls: int | None, row: dict[str, Any]) -> str:
    """A call site (and its calls, if given), then one line per distinct caller chain that reached it
    (with its calls when there are several)."""
    lines = [site if calls is None else f"{site} (x{calls})"]
    stacks = [s for s in row.get("stacks") or [] if len(s["stack"]) > 1]
    for s in stacks[:_STACKS_SHOWN]:
        lines.append(f"  {callers_text(s['stack']).lstrip()}"
                     + (f" (x{s['calls']})" if len(row["stacks"]) > 1 else ""))
    if len(stacks) > _STACKS_SHOWN:
        lines.append(f"  ... {len(stacks) - _STACKS_SHOWN} more caller chains (JSON/HTML report)")
    return "\n".join(lines)


def sites_text(fallback: dict[str, Any]) -> str:
    """Each call site of a fallback with its calls and caller chains (the first site if unknown)."""
    sites = fallback.get("call_sites") or [{"site": fallback["call_site"], "calls": fallback["calls"]}]
    return "\n".join(site_with_callers(s["site"], s["calls"], s) for s in sites)


def _sites_table(title: str, sites: list[dict[str, Any]]) -> Table:
    """Live memory by (allocation site, category), most bytes first (15 rows; the JSON has more)."""
    table = Table(title=title)
    for column in ("bytes", "blocks", "category", "allocation site"):
        table.add_column(column, overflow="fold")
    for site in sites[:15]:
        _row(table, _bytes(site["bytes"]), str(site["blocks"]), site["category"], site["site"])
    return table


def _breakdown_table(title: str, breakdown: dict[str, Any]) -> Table:
    """Device memory by category (parameters, gradients, optimizer state, ...), largest first."""
    table = Table(title=title)
    for column in ("category", "bytes", "storages", "share of allocated"):
        table.add_column(column)
    for c in sorted(breakdown["categories"], key=lambda c: -c["bytes"]):
        if c["bytes"]:
            share = c["bytes"] / breakdown["allocated"] if breakdown["allocated"] else 0.0
            _row(table, c["name"], _bytes(c["bytes"]), str(c["storages"] or ""),
                 "" if c["name"].startswith("cached") else f"{share:.1%}")
    return table


def print_report(console: Console, data: dict[str, Any], written: dict[str, str]) -> None:
    """Verdict first, then every section with figures; then the ranked recommendations."""
    t = data["target"]
    style = _VERDICT_STYLE.get(data["verdict"].split(":", 1)[0], "bold yellow")
    console.print(f"[{style}]verdict: {data['verdict']}[/{style}]  "
                  f"({escape(' '.join(data['command']))} on {t['chip']} LNC={t['lnc']}, {data['steps']} "
                  f"optimizer steps, {data['ops']['calls']:,} ops)", highlight=False)
    outcome = data["outcome"]
    if outcome["status"] == "failed":
        console.print(f"[bold red]{outcome['exception_type']}[/bold red]: {escape(outcome['exception'])}"
                      f"{' at ' + escape(outcome['site']) if outcome.get('site') else ''}", highlight=False)
    elif outcome["status"] == "stopped":
        console.print(outcome["detail"])
    for found in (data.get("nonfinite") or {}).get("found") or []:
        console.print(f"[bold yellow]NaN/Inf[/bold yellow]: {escape(nonfinite_text(found))}",
                      highlight=False)

    cuda = data.get("cuda") or {}
    if cuda.get("findings"):
        table = Table(title=f"CUDA-only code ({len(cuda['findings'])} uses)"
                            + (": rewritten in memory by --migrate" if cuda.get("migrated") else ""))
        for column in ("where", "code", "device-generic replacement", "note", "rewritten"):
            table.add_column(column, overflow="fold")
        for f in cuda["findings"]:
            _row(table, f"{f['file']}:{f['line']}", f["code"], f["replacement"], f["note"],
                 "yes" if f["rewritten"] else "no")
        console.print(table)
    if cuda.get("runtime_mapped"):
        table = Table(title="CUDA devices at run time, run on neuron by --migrate")
        for column in ("where", "what", "calls"):
            table.add_column(column, overflow="fold")
        for r in cuda["runtime_mapped"]:
            _row(table, r["site"], r["what"], str(r["calls"]))
        console.print(table)
    if data["fallbacks"]:
        table = Table(title="CPU fallbacks (real Trainium runs these on the host)")
        for column in ("op", "dtypes", "calls", "call sites (calls)", "why"):
            table.add_column(column, overflow="fold")
        for f in data["fallbacks"]:
            _row(table, f["op"], ",".join(f["dtypes"]), str(f["calls"]), sites_text(f), f["reason"])
        console.print(table)
    if data["wide_dtypes"]:
        table = Table(title="FP64 / complex / INT64 use")
        for column in ("op", "dtypes", "calls", "first call site", "what Trainium does"):
            table.add_column(column, overflow="fold")
        for w in data["wide_dtypes"]:
            _row(table, w["op"], ",".join(w["dtypes"]), str(w["calls"]), w["call_site"], w["trainium"])
        console.print(table)
    if data.get("wide_dtype_origins"):
        table = Table(title="where the float64 / complex tensors were made (live at the end)")
        for column in ("tensor", "dtype", "bytes", "allocation site"):
            table.add_column(column, overflow="fold")
        for o in data["wide_dtype_origins"]:
            _row(table, f"{o['kind']} {o['name']}", o["dtype"], _bytes(o["bytes"]), o["site"])
        console.print(table)
    syncs = data["host_syncs"]
    table = Table(title=f"host syncs: {syncs['total']}")
    for column in ("count", "what", "call site"):
        table.add_column(column, overflow="fold")
    for s in syncs["by_site"][:15]:
        _row(table, str(s["count"]), s["description"], site_with_callers(s["site"], None, s))
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
        for kind, key in (("graph break", "graph_break_sites"), ("recompile", "recompile_sites")):
            rows = c.get(key) or []
            if rows:
                table = Table(title=f"{kind}s by call site")
                for column in ("count", "call site", "reason"):
                    table.add_column(column, overflow="fold")
                for r in rows:
                    _row(table, str(r["count"]), r["site"], first_line(r["reason"]))
                console.print(table)

    memory = data["memory"]
    table = Table(title=f"peak device memory {_bytes(memory['peak_allocated_bytes'])} against one device")
    for column in ("chip", "LNC", "HBM per device", "used", "fits"):
        table.add_column(column)
    for cap in memory["capacity"]:
        _row(table, cap["chip"], str(cap["lnc"]), _bytes(cap["bytes_per_device"]),
                      f"{cap['used_fraction']:.1%}", "yes" if cap["fits"] else "[red]no[/red]")
    console.print(table)

    sizing = memory.get("instance")
    if sizing:
        fits = ("fits one device" if sizing["fits_one_device"] else
                f"[red]needs at least {sizing['devices_needed_at_least']} devices spread evenly[/red]"
                + ("" if sizing["fits_instance"] else " [red](more than the instance has)[/red]"))
        console.print(f"instance {escape(sizing['name'])}: {sizing['chips']} {sizing['chip']} chips x "
                      f"{sizing['cores_per_chip']} logical cores (LNC={sizing['lnc']}) = {sizing['devices']} "
                      f"devices of {_bytes(sizing['bytes_per_device'])} ({_bytes(sizing['total_bytes'])}); "
                      f"peak {_bytes(memory['peak_allocated_bytes'])} per device: {fits}", highlight=False)
    if memory.get("breakdown"):
        b = memory["breakdown"]
        console.print(_breakdown_table(f"what fills neuron:{b['device']} {b['when']}", b))
        if b.get("sites"):
            console.print(_sites_table(f"neuron:{b['device']} {b['when']}: live memory by allocation site",
                                       b["sites"]))
    oom = outcome.get("out_of_memory")
    if oom:
        b = oom["breakdown"]
        console.print(_breakdown_table(f"out of memory: what filled neuron:{b['device']}", b))
        if oom.get("sites"):
            console.print(_sites_table("out of memory: live memory by allocation site and category",
                                       oom["sites"]))
        if oom.get("largest_blocks"):
            table = Table(title="out of memory: largest live blocks")
            for column in ("bytes", "category", "allocation site"):
                table.add_column(column, overflow="fold")
            for block in oom["largest_blocks"]:
                _row(table, _bytes(block["bytes"]), block["category"], block["site"])
            console.print(table)
        table = Table(title=f"the program needs about {_bytes(oom['need_bytes'])} on one device")
        for column in ("chip", "LNC", "device limit", "fits"):
            table.add_column(column)
        for f in oom["fits"]:
            _row(table, f["chip"], str(f["lnc"]), _bytes(f["limit_bytes"]),
                 ("yes" if f["fits"] else "[red]no[/red]") + (" (this run)" if f["current"] else ""))
        console.print(table)

    table = Table(title="modelled device time")
    for column in ("target", "total", "per optimizer step", "MFU"):
        table.add_column(column)
    for name, m in data["modelled"].items():
        per_step = f"{m['seconds_per_step'] * 1e3:.3f} ms" if m["seconds_per_step"] else "-"
        _row(table, f"{name} LNC={m['lnc']}", f"{m['seconds'] * 1e3:.3f} ms", per_step, f"{m['mfu']:.1%}")
    console.print(table)
    first_name, first = selected_modelled(data)
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
