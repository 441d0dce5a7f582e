"""A plan's report: a terminal table (rich), a JSON file with a stable schema, an HTML page.

JSON schema ``torchneuron-plan/1`` (docs/planning.md describes every field)::

    {"schema": "torchneuron-plan/1",
     "configurations": [  # best first: fitting ones by tokens/s (or step time), then the rest
        {"configuration": {"label", "instance", "nodes", "lnc", "world_size", "values", "command", "env"},
         "status": "completed" | "stopped" | "failed", "fits": bool, "represents": str,
         "step": {"seconds", "compute_seconds", "collective_seconds", "exposed_collective_seconds",
                  "flops", "mfu", "tokens", "peak_bytes", "memory_at_peak": {category: bytes}},
         "tokens_per_step", "tokens_per_second", "peak_bytes", "capacity_bytes",
         "out_of_memory": null | {...}, "notes": [...], "rank": {the worker's result}}]}
"""

from __future__ import annotations

import base64
import html
import io
import json
from typing import Any

from rich.console import Console
from rich.table import Table

from torchneuron.plan.planner import ConfigurationPlan

__all__ = ["SCHEMA", "ranked", "to_json", "print_table", "write_html"]

SCHEMA = "torchneuron-plan/1"
GiB = 2**30


def ranked(plans: list[ConfigurationPlan]) -> list[ConfigurationPlan]:
    """Fitting configurations first, fastest first (tokens/s, else step time), then the rest."""
    def key(p: ConfigurationPlan) -> tuple:
        step = p.steady_step
        seconds = step["seconds"] if step else float("inf")
        return (not p.fits, -p.tokens_per_second, seconds)
    return sorted(plans, key=key)


def to_json(plans: list[ConfigurationPlan]) -> dict[str, Any]:
    return {"schema": SCHEMA, "configurations": [p.as_dict() for p in ranked(plans)]}


def _without_traces(document: dict[str, Any]) -> dict[str, Any]:
    """The JSON shown on the page: trace events are in their own files."""
    for c in document["configurations"]:
        for r in [c["rank"], *c.get("stage_ranks", [])]:
            r.pop("trace", None)
    return document


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.3f}"


def _why_not(p: ConfigurationPlan) -> str:
    oom = p.out_of_memory
    outcome = p.rank.get("outcome", {})
    if oom is not None:
        first = str(outcome.get("exception", "")).splitlines()[0] if outcome.get("exception") else ""
        breakdown = oom.get("breakdown") or {}
        return (f"out of memory at {outcome.get('site', '?')}: {first} Largest: "
                f"{breakdown.get('largest', '?')}; {breakdown.get('hint', '')}")
    if outcome.get("status") == "failed":
        return f"{outcome.get('exception_type')}: {str(outcome.get('exception', ''))[:200]} at {outcome.get('site', '')}"
    if p.peak_bytes > p.capacity_bytes:
        return f"peak {p.peak_bytes / GiB:.2f} GiB > {p.capacity_bytes / GiB:.2f} GiB"
    return ""


def print_table(console: Console, plans: list[ConfigurationPlan]) -> None:
    table = Table(title="torchneuron plan (modelled Trainium time per step, representative rank)")
    for column in ("configuration", "ranks", "step ms", "compute ms", "collectives ms", "exposed ms",
                   "tokens/s", "MFU", "peak GiB / capacity", "fits"):
        table.add_column(column, justify="left" if column == "configuration" else "right")
    for p in ranked(plans):
        step = p.steady_step
        table.add_row(
            p.configuration.label(), str(p.configuration.world.world_size),
            _ms(step["seconds"]) if step else "-", _ms(step["compute_seconds"]) if step else "-",
            _ms(step["collective_seconds"]) if step else "-",
            _ms(step["exposed_collective_seconds"]) if step else "-",
            f"{p.tokens_per_second:,.0f}" if p.tokens_per_second else "-",
            f"{step['mfu']:.1%}" if step else "-",
            f"{p.peak_bytes / GiB:.2f} / {p.capacity_bytes / GiB:.0f}",
            "yes" if p.fits else "[bold red]no[/bold red]")
    console.print(table)
    for p in ranked(plans):
        reason = _why_not(p)
        if reason:
            console.print(f"[bold]{p.configuration.label()}[/bold]: {reason}", highlight=False)
        inference = p.rank.get("inference")
        if inference:
            tpot = inference["tpot_seconds"]
            console.print(f"  inference: TTFT {inference['ttft_seconds'] * 1e3:.3f} ms, TPOT "
                          f"{'-' if tpot is None else f'{tpot * 1e3:.3f} ms'} over {inference['decode_steps']} "
                          f"decode steps, KV cache after prefill "
                          f"{inference['kv_cache_bytes_after_prefill'] / 2**20:.1f} MiB", highlight=False)
        reads = p.rank.get("data_reads") or []
        if reads:
            sites = ", ".join(f"{r['site']} ({r['what']}, {r['calls']}x)" for r in reads[:3])
            console.print(f"  values the plan never computed were read (placeholders returned) at {sites}",
                          highlight=False)
        from torchneuron.device.oom import format_bytes

        writes = p.rank.get("skipped_writes") or []
        if writes:
            saves = ", ".join(f"{w['what']} of {w['path']} at {w['site']} ({format_bytes(w['bytes'])})"
                              for w in writes[:3])
            console.print(f"  checkpoints not written (a plan holds no values): {saves}", highlight=False)
        console.print(f"  {p.represents}", highlight=False, style="dim")


def _figure_png(plans: list[ConfigurationPlan]) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ordered = ranked(plans)
    labels = [p.configuration.label() for p in ordered]
    fig, (memory, time) = plt.subplots(1, 2, figsize=(13, 0.6 * len(ordered) + 2.5))
    left = [0.0] * len(ordered)
    categories = sorted({c for p in ordered if p.steady_step for c in p.steady_step["memory_at_peak"]})
    for category in categories:
        widths = [(p.steady_step["memory_at_peak"].get(category, 0) / GiB) if p.steady_step else 0 for p in ordered]
        memory.barh(labels, widths, left=left, label=category)
        left = [a + b for a, b in zip(left, widths)]
    for i, p in enumerate(ordered):
        memory.plot([p.capacity_bytes / GiB] * 2, [i - 0.4, i + 0.4], color="black")
    memory.set_xlabel("GiB at the step's peak (black: the device's HBM)")
    memory.legend(fontsize=7)
    left = [0.0] * len(ordered)
    for part, key in (("compute", "compute_seconds"), ("exposed collectives", "exposed_collective_seconds")):
        widths = [(p.steady_step[key] * 1e3 if p.steady_step else 0) for p in ordered]
        time.barh(labels, widths, left=left, label=part)
        left = [a + b for a, b in zip(left, widths)]
    time.set_xlabel("modelled ms per step")
    time.set_yticklabels([])
    time.legend(fontsize=7)
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=90)
    plt.close(fig)
    return base64.b64encode(buffer.getvalue()).decode()


def write_traces(html_path: str, plans: list[ConfigurationPlan]) -> list[tuple[str, str]]:
    """One Perfetto-readable trace per configuration (every representative rank's last step):
    ``<html>.<n>.trace.json`` beside the page; (label, file name) of each written."""
    from torchneuron.plan.trace import trace_document

    written = []
    base = html_path[:-5] if html_path.endswith(".html") else html_path
    for n, p in enumerate(ranked(plans)):
        events = [e for r in (p.stage_ranks or [p.rank]) for e in (r.get("trace") or [])]
        if not events:
            continue
        path = f"{base}.{n}.trace.json"
        with open(path, "w") as f:
            json.dump(trace_document(events), f)
        written.append((p.configuration.label(), path))
    return written


def write_html(path: str, plans: list[ConfigurationPlan]) -> None:
    """A self-contained page: the table, the plots, and the JSON behind them; each configuration's
    planned step as a trace file beside it (open in https://ui.perfetto.dev)."""
    import os

    traces = write_traces(path, plans)
    links = "".join(f'<li>{html.escape(label)}: <a href="{html.escape(os.path.basename(file))}">'
                    f"{html.escape(os.path.basename(file))}</a></li>" for label, file in traces)
    rows = []
    for p in ranked(plans):
        step = p.steady_step or {}
        rows.append("<tr>" + "".join(f"<td>{html.escape(str(v))}</td>" for v in (
            p.configuration.label(), p.configuration.world.world_size, _ms(step.get("seconds")),
            _ms(step.get("compute_seconds")), _ms(step.get("exposed_collective_seconds")),
            f"{p.tokens_per_second:,.0f}", f"{step.get('mfu', 0):.1%}",
            f"{p.peak_bytes / GiB:.2f} / {p.capacity_bytes / GiB:.0f}", "yes" if p.fits else "no",
            _why_not(p))) + "</tr>")
    page = f"""<!doctype html><html><head><meta charset="utf-8"><title>torchneuron plan</title>
<style>body{{font-family:sans-serif;margin:2em}}td,th{{border:1px solid #ccc;padding:4px 8px}}
table{{border-collapse:collapse}}pre{{background:#f6f6f6;padding:1em;overflow:auto;max-height:30em}}</style>
</head><body><h1>torchneuron plan</h1>
<p>Modelled Trainium time per training step of the representative rank (dataless run of the script).</p>
<table><tr><th>configuration</th><th>ranks</th><th>step ms</th><th>compute ms</th><th>exposed collectives ms</th>
<th>tokens/s</th><th>MFU</th><th>peak GiB / capacity</th><th>fits</th><th>why not</th></tr>{''.join(rows)}</table>
<h2>Traces of one planned step (open in https://ui.perfetto.dev)</h2><ul>{links}</ul>
<h2>Memory at the peak and step time</h2><img alt="memory and time per configuration"
src="data:image/png;base64,{_figure_png(plans)}">
<h2>JSON</h2><pre>{html.escape(json.dumps(_without_traces(to_json(plans)), indent=1)[:200000])}</pre></body></html>"""
    with open(path, "w") as f:
        f.write(page)
