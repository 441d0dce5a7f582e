"""The self-contained HTML check report: one file, no network, plots drawn by
matplotlib (Agg) and embedded as base64 PNG images."""

from __future__ import annotations

import base64
import html
import io
import json
from typing import Any

from torchneuron.check.analysis import first_line, selected_modelled

MARKER = "torchneuron-check-report"  # in every report: check may overwrite its own reports only


def _png(fig) -> str:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=100, bbox_inches="tight")
    import matplotlib.pyplot as plt

    plt.close(fig)
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def _plots(data: dict[str, Any]) -> dict[str, tuple[str, str]]:
    """{element id: (title, base64 PNG)} for each plot the data supports."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plots = {}
    name, first = selected_modelled(data)
    families = first["families"] or {"(no device work)": 0.0}
    fig, ax = plt.subplots(figsize=(7, 3.2))
    ax.barh(list(families)[::-1], [v * 1e6 for v in list(families.values())[::-1]], color="#3b7dd8")
    ax.set_xlabel(f"modelled time on {name} LNC={first['lnc']} (us)")
    plots["plot-families"] = ("Modelled time by op family", _png(fig))

    fig, ax = plt.subplots(figsize=(7, 4))
    roof = data["roofline"]
    points, peak, bandwidth = roof["points"], roof["peak_flops_per_second"], roof["hbm_bytes_per_second"]
    intensity = [p["flops"] / p["bytes"] for p in points]
    if points:
        achieved = [p["flops"] / p["seconds"] for p in points]
        ax.scatter(intensity, achieved, s=18, color="#d8553b", label="ops (modelled)")
        for p, x, y in sorted(zip(points, intensity, achieved), key=lambda t: -t[0]["seconds"])[:5]:
            ax.annotate(p["op"].removeprefix("aten::"), (x, y), fontsize=7)
    xs = [min(intensity + [0.01]) / 2, max(intensity + [1e4]) * 2]
    ridge = peak / bandwidth
    ax.plot([xs[0], ridge, xs[1]], [xs[0] * bandwidth, peak, peak], color="gray", linestyle="--",
            label=f"roof: HBM {bandwidth / 1e9:.0f} GB/s, BF16 peak {peak / 1e12:.0f} TFLOP/s")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP / HBM byte)")
    ax.set_ylabel("modelled FLOP/s")
    ax.legend(fontsize=7)
    plots["plot-roofline"] = (f"Roofline of ops ({roof['chip']} LNC={roof['lnc']})", _png(fig))

    plots["plot-memory"] = _memory_plot(data["memory"], plt)

    fig, ax = plt.subplots(figsize=(7, 3))
    sites = [(f"{f['op']} @ {s['site'].split('/')[-1]}", s["calls"]) for f in data["fallbacks"]
             for s in (f.get("call_sites") or [{"site": f["call_site"], "calls": f["calls"]}])][:25]
    if sites:
        ax.barh([s[0] for s in sites][::-1], [s[1] for s in sites][::-1], color="#d89b3b")
    else:
        ax.text(0.5, 0.5, "no CPU fallbacks", ha="center", va="center")
    ax.set_xlabel("CPU fallback calls")
    plots["plot-fallbacks"] = ("CPU fallbacks by call site", _png(fig))
    return plots


def _memory_plot(memory: dict[str, Any], plt) -> tuple[str, str]:
    """Allocated bytes of each device over the run's device work items (every allocation and
    free), with the optimizer steps marked; the per-step timeline when there are no samples."""
    fig, ax = plt.subplots(figsize=(7, 3))
    samples = memory.get("samples") or {}
    for device, points in list(samples.items())[:8]:
        ax.step([p[0] for p in points], [p[1] / 2**20 for p in points], where="post",
                label=f"neuron:{device}")
    if samples:
        for i, mark in enumerate(memory.get("step_marks") or []):
            ax.axvline(mark, color="#aaaaaa", linewidth=0.6, label="optimizer step" if i == 0 else None)
        ax.set_xlabel("device work items issued (ops, copies, kernels)")
        title = "Device memory over the run"
    else:
        timeline = memory["timeline"]
        if timeline:
            ax.plot([t[0] for t in timeline], [t[1] / 2**20 for t in timeline], marker="o", color="#3bb36b")
        ax.set_xlabel("optimizer step")
        title = "Device memory after each optimizer step"
    ax.axhline(memory["peak_allocated_bytes"] / 2**20, color="gray", linestyle="--", label="peak")
    ax.set_ylabel("allocated (MiB)")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=7)
    return title, _png(fig)


class _Html(str):
    """A table cell already rendered as HTML (everything else is escaped)."""


def _cell(value: Any) -> str:
    return value if isinstance(value, _Html) else html.escape(str(value))


def _table(rows: list[dict[str, Any]], columns: list[str]) -> str:
    if not rows:
        return "<p>none</p>"
    head = "".join(f"<th>{html.escape(c)}</th>" for c in columns)
    body = "".join("<tr>" + "".join(f"<td>{_cell(r.get(c, ''))}</td>" for c in columns)
                   + "</tr>" for r in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _stack_details(label: str, row: dict[str, Any]) -> str:
    """A call site as a collapsible element: ``label`` (the site and its calls), opening onto
    each whole user Python stack that reached it, innermost frame first."""
    stacks = row.get("stacks") or []
    if not stacks:
        return f"<div class='site'>{html.escape(label)}</div>"
    paths = "".join(
        "<ol class='stack'>" + "".join(f"<li>{html.escape(frame)}</li>" for frame in s["stack"])
        + "</ol>" + (f"<p class='stack-calls'>{s['calls']} call{'s' * (s['calls'] != 1)} "
                     f"by this stack</p>" if len(stacks) > 1 else "")
        for s in stacks)
    return (f"<details class='site'><summary>{html.escape(label)} ({len(stacks)} Python "
            f"stack{'s' * (len(stacks) != 1)})</summary>{paths}</details>")


def render(data: dict[str, Any]) -> str:
    """The whole report as one HTML document."""
    parts = [f"<!DOCTYPE html><html><head><meta charset='utf-8'><meta name='generator' "
             f"content='{MARKER}'><title>torchneuron check</title><style>"
             "body{font-family:sans-serif;margin:2em;max-width:1000px}table{border-collapse:collapse;"
             "margin:0.5em 0}td,th{border:1px solid #ccc;padding:2px 6px;font-size:13px;text-align:left}"
             "h2{margin-top:1.5em}.verdict{font-size:1.4em;font-weight:bold}"
             "ol.stack{margin:0.2em 0 0.4em 1.2em;padding:0;font-family:monospace;font-size:12px}"
             ".stack-calls{margin:0 0 0.4em 0;font-size:12px;color:#555}"
             "summary{cursor:pointer}</style></head><body>",
             "<h1>torchneuron check</h1>",
             f"<p class='verdict' id='verdict'>verdict: {html.escape(data['verdict'])}</p>",
             f"<p>{html.escape(' '.join(data['command']))} on {html.escape(data['target']['chip'])} "
             f"LNC={data['target']['lnc']}, {data['steps']} optimizer steps</p>"]
    if data["outcome"]["status"] == "failed":
        parts.append(f"<pre id='failure'>{html.escape(data['outcome'].get('traceback') or data['outcome']['exception'])}</pre>")
    parts.append("<h2>Recommendations</h2><ol>" + "".join(
        f"<li>[{html.escape(r['severity'])}] {html.escape(r['text'])}</li>" for r in data["recommendations"])
        + "</ol>")
    for element, (title, png) in _plots(data).items():
        parts.append(f"<h2>{html.escape(title)}</h2><img id='{element}' alt='{html.escape(title)}' "
                     f"src='data:image/png;base64,{png}'>")
    cuda = data.get("cuda") or {}
    if cuda.get("findings"):
        rows = [{**f, "where": f"{f['file']}:{f['line']}"} for f in cuda["findings"]]
        parts.append("<h2 id='cuda'>CUDA-only code</h2>"
                     + _table(rows, ["where", "code", "replacement", "note", "rewritten"]))
    if cuda.get("runtime_mapped"):
        parts.append("<h2 id='cuda-runtime'>CUDA devices at run time, run on neuron by --migrate</h2>"
                     + _table(cuda["runtime_mapped"], ["site", "what", "calls"]))
    fallback_rows = [{**f, "call_sites": _Html("".join(_stack_details(f"{s['site']} (x{s['calls']})", s)
                                                       for s in f.get("call_sites", [])))}
                     for f in data["fallbacks"]]
    parts.append("<h2>CPU fallbacks</h2>" + _table(fallback_rows, ["op", "dtypes", "calls", "call_sites", "reason"]))
    parts.append("<h2>FP64 / complex / INT64</h2>" + _table(data["wide_dtypes"],
                                                            ["op", "dtypes", "calls", "call_site", "trainium"]))
    if data.get("wide_dtype_origins"):
        parts.append("<h3 id='wide-dtype-origins'>Where the float64 / complex tensors were made</h3>"
                     + _table(data["wide_dtype_origins"], ["kind", "name", "dtype", "bytes", "site"]))
    parts.append(f"<h2>Host syncs ({data['host_syncs']['total']})</h2>"
                 + _table([{**s, "site": _Html(_stack_details(s["site"], s))}
                           for s in data["host_syncs"]["by_site"]], ["count", "description", "site"]))
    compile_ = data["compile"]
    if compile_["compiles"] or compile_["graph_breaks"] or compile_["recompiles"]:
        parts.append(f"<h2 id='compile'>torch.compile: {compile_['compiles']} graphs, "
                     f"{compile_['graph_breaks']} graph breaks, {compile_['recompiles']} recompiles</h2>")
        for kind, key in (("Graph breaks", "graph_break_sites"), ("Recompiles", "recompile_sites")):
            rows = [{**r, "reason": first_line(r["reason"])} for r in compile_.get(key) or []]
            if rows:
                parts.append(f"<h3 id='{key.replace('_', '-')}'>{kind} by call site</h3>"
                             + _table(rows, ["count", "site", "reason"]))
    parts.append("<h2>Memory against capacity</h2>" + _table(data["memory"]["capacity"],
                 ["chip", "lnc", "bytes_per_device", "used_fraction", "fits"]))
    sizing = data["memory"].get("instance")
    if sizing:
        parts.append(f"<h2 id='instance'>Instance {html.escape(sizing['name'])}</h2>" + _table(
            [sizing], ["chips", "cores_per_chip", "devices", "bytes_per_device", "total_bytes",
                       "fits_one_device", "devices_needed_at_least", "fits_instance"]))
    breakdown = data["memory"].get("breakdown")
    if breakdown:
        parts.append(f"<h2 id='breakdown'>What fills neuron:{breakdown['device']} "
                     f"{html.escape(breakdown['when'])}</h2>"
                     + _table(breakdown["categories"], ["name", "bytes", "storages"])
                     + ("<h3 id='breakdown-sites'>By allocation site and category</h3>"
                        + _table(breakdown["sites"], ["bytes", "blocks", "category", "site"])
                        if breakdown.get("sites") else ""))
    oom = data["outcome"].get("out_of_memory")
    if oom:
        parts.append(f"<h2 id='out-of-memory'>Out of memory: what filled neuron:{oom['breakdown']['device']}"
                     f"</h2>" + _table(oom["breakdown"]["categories"], ["name", "bytes", "storages"])
                     + ("<h3 id='out-of-memory-sites'>By allocation site and category</h3>"
                        + _table(oom["sites"], ["bytes", "blocks", "category", "site"]) if oom.get("sites") else "")
                     + ("<h3 id='out-of-memory-blocks'>Largest live blocks</h3>"
                        + _table(oom["largest_blocks"], ["bytes", "category", "site"])
                        if oom.get("largest_blocks") else "")
                     + f"<p>The program needs about {oom['need_bytes']:,} bytes on one device:</p>"
                     + _table(oom["fits"], ["chip", "lnc", "limit_bytes", "fits", "current"]))
    parts.append("<h2>Modelled time</h2>" + _table(
        [{"target": k, **{c: v[c] for c in ("lnc", "seconds", "seconds_per_step", "mfu")}}
         for k, v in data["modelled"].items()], ["target", "lnc", "seconds", "seconds_per_step", "mfu"]))
    parts.append("<h2>All figures (JSON)</h2><pre id='data'>"
                 + html.escape(json.dumps(data, indent=1)[:200_000]) + "</pre></body></html>")
    return "".join(parts)
