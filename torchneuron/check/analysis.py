"""The verdict, ranked recommendations and ``--strict`` offenders of a check report.

Pure functions of the report's data (:mod:`torchneuron.check.collect`), so the
terminal, HTML and JSON outputs say the same thing.
"""

from __future__ import annotations

from typing import Any

GiB = 2**30


def _calls(n: int) -> str:
    return f"{n} call{'s' * (n != 1)}"


def nonfinite_text(found: dict[str, Any]) -> str:
    """A loss or output that became NaN/Inf: what, when and where."""
    what = "the loss" if found["kind"] == "loss" else f"the output of {found['module'] or 'a module'}"
    counts = " and ".join(f"{found[k]} {'NaN' if k == 'nan' else 'Inf'}"
                          for k in ("nan", "inf") if found.get(k))
    steps = found["step"]
    return (f"{what} became NaN/Inf ({counts} in {found['dtype']}{found['shape']}) after "
            f"{steps} optimizer step{'s' * (steps != 1)} at {found['site']}")


def verdict(data: dict[str, Any]) -> str:
    """``fails``, ``runs with N CPU fallbacks`` or ``runs on device``; a NaN/Inf is named:
    the op that first made it (``--detect-nonfinite``), or the loss or model output that
    became one (without it)."""
    outcome = data["outcome"]
    if outcome["status"] == "failed":
        if outcome.get("nonfinite_op"):
            return (f"fails: {outcome['nonfinite_op']} made the first NaN/Inf"
                    + (f" at {outcome['site']}" if outcome.get("site") else ""))
        return "fails"
    calls = sum(f["calls"] for f in data["fallbacks"])
    if calls:
        ops = len({f["op"] for f in data["fallbacks"]})
        text = f"runs with {calls} CPU fallback call{'s' * (calls != 1)} ({ops} op{'s' * (ops != 1)})"
    else:
        text = "runs on device"
    found = (data.get("nonfinite") or {}).get("found") or []
    if found:
        text += f", but {nonfinite_text(found[0])}: rerun with --detect-nonfinite to name the op that made it"
    return text


def selected_modelled(data: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """The modelled figures of the chip the run targeted (``--target``), as (name, figures)."""
    name = data["target"]["chip"]
    if name in data["modelled"]:
        return name, data["modelled"][name]
    return next(iter(data["modelled"].items()))


def first_line(reason: str) -> str:
    """Dynamo's reasons run to several lines (explanation, hint, a link): the first names it."""
    return reason.strip().splitlines()[0] if reason.strip() else reason


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
    sites = oom.get("sites") or []
    held = (f"; the site holding the most is {sites[0]['site']} ({_bytes(sites[0]['bytes'])} of "
            f"{sites[0]['category']})" if sites else "")
    return (f"out of device memory: the largest category is {b['largest']} ({_bytes(largest['bytes'])} "
            f"of {_bytes(b['allocated'])} allocated{held}): {b['hint']}. The program needs about "
            f"{_bytes(oom['need_bytes'])} per device: {where}")


def cuda_advice(findings: list[dict[str, Any]]) -> str:
    """CUDA-only uses of one kind with one replacement: what, where, and the device-generic
    spelling or what to do."""
    f = findings[0]
    sites = ", ".join(f"{g['file']}:{g['line']}" for g in findings[:8])
    if len(findings) > 8:
        sites += f" and {len(findings) - 8} more"
    text = f"`{f['code']}` is CUDA-only ({f['kind']}) at {sites}"
    if f["replacement"]:
        text += f": use `{f['replacement']}`"
    if f["note"]:
        text += f" ({f['note']})" if f["replacement"] else f": {f['note']}"
    rewritten = sum(g["rewritten"] for g in findings)
    return text + (f" [{rewritten} rewritten by --migrate]" if rewritten else "")


def runtime_cuda_advice(row: dict[str, Any]) -> str:
    """A CUDA device that reached a tensor at run time (``--migrate`` ran it on neuron)."""
    return (f"a CUDA device reached {row['what']} at {row['site']} ({row['calls']} call"
            f"{'s' * (row['calls'] != 1)}) at run time, from outside the source (the command line, "
            f"a config file, a library): --migrate ran it on neuron; pass the device as "
            f"torch.accelerator.current_accelerator() (or 'neuron') instead")


def _cuda_recommendations(data: dict[str, Any]) -> list[tuple[float, str, str]]:
    cuda = data.get("cuda") or {}
    findings = cuda.get("findings", [])
    at_run_time = [(4e6 + 0.5, "cuda", runtime_cuda_advice(r)) for r in cuda.get("runtime_mapped", [])[:8]]
    if not findings:
        return at_run_time
    groups: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for f in findings:  # one recommendation per kind of use and replacement, in source order
        key = (f["kind"], f["replacement"] if f["kind"] != ".cuda()" else ".cuda()", f["note"])
        groups.setdefault(key, []).append(f)
    failed = data["outcome"]["status"] == "failed"
    weight = 1.5e9 if failed and not cuda.get("migrated") else 4e6
    found = [(weight + len(groups) - i, "cuda", cuda_advice(g)) for i, g in enumerate(groups.values())]
    rewritable = sum(1 for f in findings if f["replacement"])
    if cuda.get("diff_path"):
        summary = (f"{sum(f['rewritten'] for f in findings)} of {len(findings)} CUDA-only uses ran on "
                   f"neuron from their device-generic rewrite (--migrate); review it and apply it: "
                   f"git apply {cuda['diff_path']}")
    elif not cuda.get("migrated"):
        summary = (f"{len(findings)} CUDA-only uses ({rewritable} with an automatic rewrite): run "
                   f"`torchneuron check --migrate ...` to run them on neuron unedited and get the "
                   f"rewrite as a diff")
    else:
        summary = f"{len(findings)} CUDA-only uses have no automatic rewrite: see each below"
    found.append((weight + len(groups) + 1, "cuda", summary))
    return found + at_run_time


def _sync_advice(s: dict[str, Any]) -> str:
    """What to do about a call site that synchronised more than once: a loop, or (when its
    stacks show each call came from a different caller) a helper several callers share."""
    stacks = s.get("stacks") or []
    if len(stacks) > 1 and all(p["calls"] == 1 for p in stacks) and len(stacks) == s["count"]:
        callers = ", ".join(p["stack"][1] for p in stacks if len(p["stack"]) > 1)
        return (f"{s['description']} at {s['site']} synchronises the host with the device "
                f"{s['count']} times, once from each of {len(stacks)} callers ({callers}); keep the "
                f"value on the device where the callers can")
    return (f"{s['description']} at {s['site']} synchronises the host with the device "
            f"{s['count']} times (every iteration of a loop); keep the value on the device "
            f"or read it every N steps")


_FORKED_WORKER = "Cannot re-initialize Neuron in forked subprocess"
_FORKED_WORKER_ADVICE = (
    "a DataLoader worker process (forked) used a neuron tensor, which a forked process cannot "
    "(as with CUDA): check puts tensors made without a device on neuron, datasets included; make "
    "the dataset's tensors with device='cpu' (as they are when the script runs on a GPU) and move "
    "each batch to the device, or use num_workers=0")


def _origin_recommendations(data: dict[str, Any]) -> list[tuple[float, str, str]]:
    """The float64/complex tensors the script made, at the lines that made them: ranked above
    every host fallback of the ops that read them (fixing the origin fixes those)."""
    origins = data.get("wide_dtype_origins") or []
    wide_calls = sum(f["calls"] for f in data["fallbacks"]
                     if any(d == "float64" or d.startswith("complex") for d in f["dtypes"]))
    found = []
    for i, o in enumerate(origins):
        what = f"this {o['dtype']} {o['kind']} `{o['name']}` ({o['bytes']:,} bytes)"
        if o["dtype"] == "float64":
            text = f"cast {what} to float32 at {o['site']}"
        else:
            text = f"carry {what} as real and imaginary float32 parts (torch.view_as_real) at {o['site']}"
        text += (f": Trainium has no {o['dtype']} type, so every op that reads it runs on the host "
                 f"(float64/complex ops ran on the host {wide_calls} time{'s' * (wide_calls != 1)} in this run)")
        found.append((1e6 + wide_calls + len(origins) - i, "fallback", text))
    return found


def recommendations(data: dict[str, Any]) -> list[dict[str, Any]]:
    """Concrete fixes, most costly first: ``{"rank", "severity", "text"}``."""
    found: list[tuple[float, str, str]] = []  # (weight, severity, text)
    outcome = data["outcome"]
    if outcome["status"] == "failed":
        found.append((1e9, "error", f"fix the {outcome['exception_type']} at "
                     f"{outcome.get('site') or 'the end of the traceback'}: {outcome['exception'][:300]}"))
    if outcome["status"] == "failed" and _FORKED_WORKER in outcome.get("exception", ""):
        found.append((1.2e9, "error", _FORKED_WORKER_ADVICE))
    if outcome.get("out_of_memory"):
        found.append((2e9, "memory", out_of_memory_advice(outcome["out_of_memory"])))
    found += _cuda_recommendations(data)
    found += _origin_recommendations(data)
    for f in data["fallbacks"]:
        site = f["call_site"] or "its call site"
        more = len(f.get("call_sites", [])) - 1
        if more > 0:
            site += f" (and {more} more call site{'s' * (more != 1)})"
        complex_ = sorted({d for d in f["dtypes"] if d.startswith("complex")})
        if complex_:
            text = (f"{f['op']} on {'/'.join(complex_)} tensors at {site} runs on the host: Trainium "
                    f"has no complex types ({_calls(f['calls'])}); carry real and imaginary parts as "
                    f"float32 (torch.view_as_real) or keep this math on the CPU")
        elif "float64" in f["dtypes"]:
            text = (f"cast the {'/'.join(sorted(set(f['dtypes'])))} tensors of {f['op']} to float32 "
                    f"(or bfloat16) at {site}: Trainium has no FP64 or complex types, so this op runs "
                    f"on the host ({_calls(f['calls'])})")
        else:
            text = (f"{f['op']} at {site} runs on the host CPU on Trainium ({_calls(f['calls'])}): "
                    f"{f['reason']}")
        found.append((1e6 + f["calls"], "fallback", text))
    for s in repeated_syncs(data):
        found.append((1e3 * s["count"], "sync", _sync_advice(s)))
    for w in data["wide_dtypes"]:
        if w["on_device"] and "int64" in w["wide"]:
            found.append((w["calls"], "dtype",
                          f"{w['op']} uses int64 ({_calls(w['calls'])}): {w['trainium']}; use int32 "
                          f"where values fit"))
    compile_ = data["compile"]
    if compile_["graph_breaks"]:
        sites = compile_.get("graph_break_sites") or []
        if sites:
            reasons = "; ".join(f"{first_line(r['reason'])} ({r['count']}x at {r['site']})" for r in sites[:3])
        else:
            reasons = "; ".join(f"{first_line(r)} ({n}x)"
                                for r, n in list(compile_["graph_break_reasons"].items())[:3])
        found.append((5e5, "compile", f"{compile_['graph_breaks']} graph break(s) split compiled "
                      f"graphs: {reasons}"))
    if compile_["recompiles"]:
        sites = compile_.get("recompile_sites") or []
        if sites:
            reasons = "; ".join(f"{first_line(r['reason'])} (compiled frame {r['site']})" for r in sites[:3])
        else:
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
    found.sort(key=lambda f: -f[0])  # stable: equal weights keep their order
    return [{"rank": i + 1, "severity": sev, "text": text} for i, (_, sev, text) in enumerate(found)]


def strict_offenders(data: dict[str, Any]) -> list[str]:
    """What ``--strict`` refuses: a failure, CUDA-only code, any CPU fallback, a repeated host sync."""
    offenders = []
    if data["outcome"]["status"] == "failed":
        offenders.append(f"the script fails: {data['outcome']['exception_type']}")
    for f in (data.get("cuda") or {}).get("findings", []):
        offenders.append(f"CUDA-only code at {f['file']}:{f['line']}: {f['code']}")
    for r in (data.get("cuda") or {}).get("runtime_mapped", []):
        offenders.append(f"a CUDA device at run time at {r['site']}: {r['what']} x{r['calls']}")
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
