"""The verdict, ranked recommendations and ``--strict`` offenders of a check report.

Pure functions of the report's data (:mod:`torchneuron.check.collect`), so the
terminal, HTML and JSON outputs say the same thing.
"""

from __future__ import annotations

from typing import Any

GiB = 2**30


def _calls(n: int) -> str:
    return f"{n} call{'s' * (n != 1)}"


def verdict(data: dict[str, Any]) -> str:
    """``fails``, ``runs with N CPU fallbacks`` or ``runs on device``."""
    if data["outcome"]["status"] == "failed":
        return "fails"
    calls = sum(f["calls"] for f in data["fallbacks"])
    if calls:
        ops = len({f["op"] for f in data["fallbacks"]})
        return f"runs with {calls} CPU fallback call{'s' * (calls != 1)} ({ops} op{'s' * (ops != 1)})"
    return "runs on device"


def repeated_syncs(data: dict[str, Any]) -> list[dict[str, Any]]:
    """Call sites that synchronised more than once: in a loop, they wait every iteration."""
    return [s for s in data["host_syncs"]["by_site"] if s["count"] > 1]


def _bytes(n: float) -> str:
    return f"{n / GiB:.2f} GiB" if n >= GiB else f"{n / 2**20:.2f} MiB"


def out_of_memory_advice(oom: dict[str, Any]) -> str:
    """What filled the device when it ran out, and where the same program would fit."""
    b = oom["breakdown"]
    largest = next(c for c in b["categories"] if c["name"] == b["largest"])
    fits = [f"{f['chip']} LNC={f['lnc']}" for f in oom["fits"] if f["fits"]]
    where = (f"it would fit one device of {', '.join(fits)}" if fits
             else "it fits no single trn2 or trn3 device: shard it across devices")
    return (f"out of device memory: the largest category is {b['largest']} ({_bytes(largest['bytes'])} "
            f"of {_bytes(b['allocated'])} allocated): {b['hint']}. The program needs about "
            f"{_bytes(oom['need_bytes'])} per device: {where}")


def recommendations(data: dict[str, Any]) -> list[dict[str, Any]]:
    """Concrete fixes, most costly first: ``{"rank", "severity", "text"}``."""
    found: list[tuple[float, str, str]] = []  # (weight, severity, text)
    outcome = data["outcome"]
    if outcome["status"] == "failed":
        found.append((1e9, "error", f"fix the {outcome['exception_type']} at "
                     f"{outcome.get('site') or 'the end of the traceback'}: {outcome['exception'][:300]}"))
    if outcome.get("out_of_memory"):
        found.append((2e9, "memory", out_of_memory_advice(outcome["out_of_memory"])))
    for f in data["fallbacks"]:
        site = f["call_site"] or "its call site"
        more = len(f.get("call_sites", [])) - 1
        if more > 0:
            site += f" (and {more} more call site{'s' * (more != 1)})"
        if any(d in ("float64", "complex64", "complex128") for d in f["dtypes"]):
            text = (f"cast the {'/'.join(sorted(set(f['dtypes'])))} tensors of {f['op']} to float32 "
                    f"(or bfloat16) at {site}: Trainium has no FP64 or complex types, so this op runs "
                    f"on the host ({_calls(f['calls'])})")
        else:
            text = (f"{f['op']} at {site} runs on the host CPU on Trainium ({_calls(f['calls'])}): "
                    f"{f['reason']}")
        found.append((1e6 + f["calls"], "fallback", text))
    for s in repeated_syncs(data):
        found.append((1e3 * s["count"], "sync",
                      f"{s['description']} at {s['site']} synchronises the host with the device "
                      f"{s['count']} times (every iteration of a loop); keep the value on the device "
                      f"or read it every N steps"))
    for w in data["wide_dtypes"]:
        if w["on_device"] and "int64" in w["wide"]:
            found.append((w["calls"], "dtype",
                          f"{w['op']} uses int64 ({_calls(w['calls'])}): {w['trainium']}; use int32 "
                          f"where values fit"))
    compile_ = data["compile"]
    if compile_["graph_breaks"]:
        reasons = "; ".join(f"{r} ({n}x)" for r, n in list(compile_["graph_break_reasons"].items())[:3])
        found.append((5e5, "compile", f"{compile_['graph_breaks']} graph break(s) split compiled "
                      f"graphs: {reasons}"))
    if compile_["recompiles"]:
        reasons = "; ".join(compile_["recompile_reasons"][:3])
        found.append((5e5, "compile", f"{compile_['recompiles']} recompile(s): {reasons}; Trainium "
                      f"compiles per input shape, so pad or bucket shapes"))
    memory = data["memory"]
    for cap in memory["capacity"]:
        if not cap["fits"]:
            found.append((2e6, "memory",
                          f"peak device memory {memory['peak_allocated_bytes'] / GiB:.2f} GiB does not "
                          f"fit one {cap['chip']} device at LNC={cap['lnc']} "
                          f"({cap['bytes_per_device'] / GiB:.0f} GiB): shard the model or shrink the batch"))
    sizing = memory.get("instance")
    if sizing and not sizing["fits_instance"]:
        found.append((3e6, "memory",
                      f"the run's device memory ({_bytes(sizing['peak_bytes_all_devices'])}) needs at least "
                      f"{sizing['devices_needed_at_least']} devices of {_bytes(sizing['bytes_per_device'])}, "
                      f"more than the {sizing['devices']} of {sizing['name']}: use a larger instance "
                      f"or several, or reduce the memory"))
    moved = data["transfers"].get("host_to_device", {"copies": 0, "bytes": 0})
    if data["steps"] and moved["copies"] > 4 * data["steps"]:
        found.append((moved["copies"], "traffic",
                      f"{moved['copies']} host-to-device copies ({moved['bytes'] / 2**20:.1f} MiB) in "
                      f"{data['steps']} steps: create tensors on the device or copy each batch once"))
    found.sort(key=lambda f: -f[0])
    return [{"rank": i + 1, "severity": sev, "text": text} for i, (_, sev, text) in enumerate(found)]


def strict_offenders(data: dict[str, Any]) -> list[str]:
    """What ``--strict`` refuses: a failure, any CPU fallback, a repeated host sync."""
    offenders = []
    if data["outcome"]["status"] == "failed":
        offenders.append(f"the script fails: {data['outcome']['exception_type']}")
    for f in data["fallbacks"]:
        more = len(f.get("call_sites", [])) - 1
        offenders.append(f"CPU fallback {f['op']} ({', '.join(f['dtypes'])}) x{f['calls']} at "
                         f"{f['call_site'] or '<unknown>'}"
                         + (f" and {more} more call site{'s' * (more != 1)}" if more > 0 else ""))
    for s in repeated_syncs(data):
        offenders.append(f"host sync x{s['count']}: {s['description']} at {s['site']}")
    return offenders


def analyse(data: dict[str, Any]) -> dict[str, Any]:
    """Adds the verdict, recommendations and strict offenders to the data (returned)."""
    data["verdict"] = verdict(data)
    data["recommendations"] = recommendations(data)
    data["strict_offenders"] = strict_offenders(data)
    return data
