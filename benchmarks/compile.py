"""torch.compile(backend="neuron") against eager neuron and CPU Inductor, in one process.

A small Llama (transformers' LlamaForCausalLM built from a config, random
weights, no downloads) runs two workloads -- a training step (forward with
labels, backward, AdamW step, zero_grad) and an inference forward under
``torch.no_grad()`` (logits only) -- in four configurations: eager neuron,
``torch.compile(model, backend="neuron")`` on neuron, eager CPU, and
``torch.compile(model)`` on CPU (default Inductor). The compiled configurations
compile the model (its backward follows through AOTAutograd) and, for training,
the optimizer step. Every configuration starts from the same weights and tokens.

Each configuration is warmed up first: its first call (which compiles, for the
compiled ones) is timed and reported as the compile time, and the warm-up losses
(logits, for inference) of compiled neuron must match eager neuron (rtol 1e-4)
and be on device ``neuron``, so the benchmark cannot pass on wrong results.
Then timings alternate the configurations in rounds (interleaved, order reversed
every other round, so drift and noise hit all alike) and report medians, with:

* compiled neuron time over CPU Inductor     (target <= 1.1x), and
* compiled neuron's speed-up over eager neuron as a share of CPU Inductor's own
  speed-up over eager CPU (target >= 0.9x): compiled neuron runs Inductor's CPU
  kernels, so Inductor's gain on this host bounds its gain (the README's targets).

Compile cache, cold vs warm: a child process (this script, ``--child-compile``)
compiles the training step on neuron and prints its first-call time and
``torch.neuron.compile_metrics()`` as JSON. It runs twice against one fresh
``NEURON_COMPILE_CACHE_URL`` directory: the first run is cold, the second warm.
Children are separate processes because Inductor also keeps in-memory caches.
Each child also gets a fresh, empty ``TORCHINDUCTOR_CACHE_DIR`` of its own, so a
warm hit can only come from the neuron compile cache.

Cache choice in the main process: by default both ``NEURON_COMPILE_CACHE_URL``
and ``TORCHINDUCTOR_CACHE_DIR`` point at fresh temporary directories (deleted at
exit), so the compile times in the main table are cold for both neuron and CPU
Inductor, not warmed by stale files of earlier runs. ``--reuse-caches`` keeps
the environment's directories instead. (Inside one process the two compilers
can still share Inductor's in-memory caches; the child runs are the clean
cold/warm figure.) The step-time medians do not depend on this choice.

    python benchmarks/compile.py [--repeats N] [--warmup N] [--threads N] [--skip-cache-test]
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

import torchneuron

# Small Llamas. "small" (default): as eager_overhead.py's tiny Llama, a step of a few ms,
# where per-op overhead matters; "medium": one eager training step ~100 ms, compute-bound.
SIZES = {
    "small": (dict(vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256), 4, 64),
    "medium": (dict(vocab_size=1024, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256), 4, 128),
}
MODEL, BATCH, SEQ = SIZES[os.environ.get("TORCHNEURON_BENCH_SIZE", "small")]
LR = 1e-4
TARGET_VS_INDUCTOR = 1.1  # compiled neuron / CPU Inductor, at most
# (eager neuron / compiled neuron) / (eager CPU / CPU Inductor), at least: compiled neuron
# gains at least 0.9x of what Inductor gains over eager CPU on the same host
TARGET_SHARE_OF_INDUCTOR_SPEEDUP = 0.9
RTOL = 1e-4  # compiled neuron vs eager neuron, losses
LOGITS_ATOL = 1e-4  # ... and logits (with RTOL)
CHILD_MARK = "COMPILE_CHILD_RESULT "


@dataclass(frozen=True)
class Config:
    name: str
    device: str
    backend: str | None  # None: eager


CONFIGS = (
    Config("eager neuron", "neuron", None),
    Config("compiled neuron", "neuron", "neuron"),
    Config("eager CPU", "cpu", None),
    Config("CPU Inductor", "cpu", "inductor"),
)
BASELINE, COMPILED, EAGER_CPU, CPU_INDUCTOR = "eager neuron", "compiled neuron", "eager CPU", "CPU Inductor"


@dataclass
class Prepared:
    """One configuration of one workload after warm-up."""

    step: Callable[[], torch.Tensor] | None = None
    first_call_s: float = math.nan  # includes the compile, for compiled configs
    outputs: list[torch.Tensor] = field(default_factory=list)  # losses (train) or logits (infer)
    error: str | None = None  # exception type, message and traceback tail


# ---- the workloads ---------------------------------------------------------------


def _model(device: str, training: bool) -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)  # built on the CPU from one seed: the same weights on every device
    model = LlamaForCausalLM(LlamaConfig(**MODEL, attn_implementation="sdpa", use_cache=False))
    return model.to(device).train(training)


def _tokens(device: str) -> torch.Tensor:
    g = torch.Generator().manual_seed(1)
    return torch.randint(0, MODEL["vocab_size"], (BATCH, SEQ), generator=g).to(device)


def _sync(device: str) -> None:
    module = getattr(torch, device, None)
    if device != "cpu" and module is not None and hasattr(module, "synchronize"):
        module.synchronize()


def build_train(cfg: Config) -> Callable[[], torch.Tensor]:
    """Forward with labels, backward, AdamW step, zero_grad; returns the (detached) loss.
    Compiled configs compile the model and the optimizer step (as PyTorch's "compiling
    the optimizer" recipe does); backward follows the forward through AOTAutograd."""
    model = _model(cfg.device, training=True)
    forward = torch.compile(model, backend=cfg.backend) if cfg.backend else model
    opt = torch.optim.AdamW(model.parameters(), lr=LR)
    opt_step = torch.compile(opt.step, backend=cfg.backend) if cfg.backend else opt.step
    ids = _tokens(cfg.device)

    def step() -> torch.Tensor:
        loss = forward(input_ids=ids, labels=ids).loss
        loss.backward()
        opt_step()
        opt.zero_grad(set_to_none=True)
        return loss.detach()

    return step


def build_infer(cfg: Config) -> Callable[[], torch.Tensor]:
    """One forward under no_grad, eval mode; returns the logits."""
    model = _model(cfg.device, training=False)
    forward = torch.compile(model, backend=cfg.backend) if cfg.backend else model
    ids = _tokens(cfg.device)

    def step() -> torch.Tensor:
        with torch.no_grad():
            return forward(input_ids=ids).logits

    return step


WORKLOADS: dict[str, Callable[[Config], Callable[[], torch.Tensor]]] = {
    "train": build_train,
    "infer": build_infer,
}
WORKLOAD_TITLES = {
    "train": f"training step (fwd+labels, bwd, AdamW, zero_grad), batch {BATCH} x seq {SEQ}",
    "infer": f"inference forward under no_grad (logits), batch {BATCH} x seq {SEQ}",
}


# ---- warm-up, checks, timing -------------------------------------------------------


def _error_text(error: BaseException, tail: int = 25) -> str:
    lines = "".join(traceback.format_exception(error)).rstrip().splitlines()
    return "\n".join(lines[-tail:])


def prepare(workload: str, cfg: Config, warmup: int) -> Prepared:
    """Builds, runs the first call (timed: the compile) and ``warmup`` more calls."""
    prepared = Prepared()
    try:
        step = WORKLOADS[workload](cfg)
        start = time.perf_counter()
        out = step()
        _sync(cfg.device)
        prepared.first_call_s = time.perf_counter() - start
        prepared.outputs.append(out.detach().clone())
        for _ in range(warmup):
            prepared.outputs.append(step().detach().clone())
        _sync(cfg.device)
        prepared.step = step
    except Exception as error:  # noqa: BLE001  (reported, and the other configs go on)
        prepared.error = _error_text(error)
    return prepared


def _rel_diff(got: torch.Tensor, want: torch.Tensor) -> float:
    got, want = got.detach().cpu().double(), want.detach().cpu().double()
    return float(((got - want).abs() / want.abs().clamp_min(1e-12)).max())


def check(workload: str, prepared: dict[str, Prepared]) -> tuple[dict[str, str], list[str]]:
    """Per-config agreement with eager neuron (a short text), and the failed checks.

    Compiled neuron must match eager neuron (losses to rtol 1e-4, logits to rtol 1e-4 /
    atol 1e-4) and its outputs must be on ``neuron``; the CPU configs are shown only."""
    agreement: dict[str, str] = {}
    failures: list[str] = []
    base = prepared[BASELINE]
    for cfg in CONFIGS:
        p = prepared[cfg.name]
        if p.error or base.error:
            agreement[cfg.name] = "-"
            continue
        want_type = cfg.device
        if any(o.device.type != want_type for o in p.outputs):
            failures.append(f"{workload}/{cfg.name}: outputs on {p.outputs[0].device}, "
                            f"expected device '{want_type}'")
        if workload == "train":
            diffs = [_rel_diff(g, w) for g, w in zip(p.outputs, base.outputs)]
            worst = max(diffs)
            agreement[cfg.name] = f"losses rel {worst:.1e}"
            if cfg.name == COMPILED:
                for i, (g, w) in enumerate(zip(p.outputs, base.outputs)):
                    if not math.isclose(g.item(), w.item(), rel_tol=RTOL):
                        failures.append(f"train/{COMPILED}: loss of step {i + 1} is {g.item():.6f}, "
                                        f"eager neuron {w.item():.6f} (rtol {RTOL:g})")
        else:
            worst = max(float((g.cpu() - w.cpu()).abs().max()) for g, w in zip(p.outputs, base.outputs))
            agreement[cfg.name] = f"logits abs {worst:.1e}"
            if cfg.name == COMPILED:
                try:
                    torch.testing.assert_close(p.outputs[0].cpu(), base.outputs[0].cpu(),
                                               rtol=RTOL, atol=LOGITS_ATOL)
                except AssertionError as error:
                    failures.append(f"infer/{COMPILED}: logits differ from eager neuron: "
                                    + str(error).splitlines()[0])
    return agreement, failures


def measure(runs: dict[str, tuple[Callable[[], object], str]], rounds: int,
            sample_s: float) -> dict[str, float]:
    """Median milliseconds per call of each config, alternating configs each round."""
    inner = {}
    for name, (run, device) in runs.items():  # calls per sample so one sample takes ~sample_s
        start = time.perf_counter()
        run()
        _sync(device)
        inner[name] = max(1, int(sample_s / max(1e-9, time.perf_counter() - start)))
    n = min(inner.values())
    samples: dict[str, list[float]] = {name: [] for name in runs}
    names = list(runs)
    for r in range(rounds):
        for name in names if r % 2 == 0 else reversed(names):
            run, device = runs[name]
            start = time.perf_counter()
            for _ in range(n):
                run()
            _sync(device)
            samples[name].append((time.perf_counter() - start) / n * 1e3)
    return {name: statistics.median(s) for name, s in samples.items()}


# ---- the cold/warm cache children ----------------------------------------------------


def child_compile(warmup: int) -> int:
    """``--child-compile``: compiles the training step on neuron once; prints JSON."""
    torch.neuron.reset_compile_metrics()
    result: dict = {"pid": os.getpid(),
                    "neuron_cache": os.environ.get("NEURON_COMPILE_CACHE_URL"),
                    "inductor_cache": os.environ.get("TORCHINDUCTOR_CACHE_DIR")}
    try:
        step = build_train(Config(COMPILED, "neuron", "neuron"))
        start = time.perf_counter()
        loss = step()
        _sync("neuron")
        result["compile_s"] = time.perf_counter() - start
        result["loss"] = loss.item()
        result["loss_device"] = str(loss.device)
        steady = []
        for _ in range(warmup):
            start = time.perf_counter()
            step()
            _sync("neuron")
            steady.append(time.perf_counter() - start)
        result["steady_step_s"] = statistics.median(steady) if steady else None
    except Exception as error:  # noqa: BLE001
        result["error"] = _error_text(error)
    result["compile_metrics"] = torch.neuron.compile_metrics()
    from torch._dynamo.utils import counters  # Inductor's and AOTAutograd's own cache counters

    result["torch_cache_counters"] = {
        f"{group}.{name}": n for group in ("aot_autograd", "inductor") for name, n in counters[group].items()
        if "cache" in name}
    print(CHILD_MARK + json.dumps(result), flush=True)
    return 1 if "error" in result else 0


def _count_files(directory: Path) -> int:
    if not directory.exists():
        return 0
    return sum(1 for p in directory.rglob("*") if p.is_file() and not p.name.endswith(".lock"))


def run_child(label: str, neuron_cache: Path, inductor_cache: Path, threads: int, warmup: int,
              timeout: float) -> dict:
    env = dict(os.environ, NEURON_COMPILE_CACHE_URL=str(neuron_cache),
               TORCHINDUCTOR_CACHE_DIR=str(inductor_cache))
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child-compile",
           "--threads", str(threads), "--warmup", str(warmup)]
    start = time.perf_counter()
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as error:
        return {"label": label, "error": f"timed out after {timeout:.0f} s",
                "stderr_tail": _tail(error.stderr)}
    wall = time.perf_counter() - start
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(CHILD_MARK)]
    if not lines:
        return {"label": label, "wall_s": wall, "error": f"child exited {proc.returncode} "
                "without a result", "stderr_tail": _tail(proc.stderr)}
    result = json.loads(lines[-1][len(CHILD_MARK):])
    result.update(label=label, wall_s=wall, returncode=proc.returncode)
    if proc.returncode != 0 or "error" in result:
        result["stderr_tail"] = _tail(proc.stderr)
    return result


def _tail(text: str | bytes | None, lines: int = 25) -> str:
    if isinstance(text, bytes):
        text = text.decode(errors="replace")
    return "\n".join((text or "").rstrip().splitlines()[-lines:])


def cache_test(threads: int, warmup: int, timeout: float, keep: bool) -> tuple[list[dict], dict]:
    root = Path(tempfile.mkdtemp(prefix="neuron-compile-bench-"))
    neuron_cache = root / "neuron-cache"
    results, files = [], {}
    try:
        for label in ("cold", "warm"):
            inductor_cache = root / f"inductor-{label}"
            print(f"  child ({label} cache) ...", flush=True)
            results.append(run_child(label, neuron_cache, inductor_cache, threads, warmup, timeout))
            files[f"neuron cache after {label}"] = _count_files(neuron_cache)
            files[f"TORCHINDUCTOR_CACHE_DIR of {label} child"] = _count_files(inductor_cache)
            if "error" in results[-1]:
                break
    finally:
        if keep:
            print(f"  kept {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)
    return results, files


# ---- the report ---------------------------------------------------------------------


def _flag(ok: bool | None) -> str:
    return "-" if ok is None else ("[green]PASS[/]" if ok else "[red]MISS[/]")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", choices=sorted(SIZES), default=None,
                        help="model size: small (default, a few-ms step) or medium (~100 ms step)")
    parser.add_argument("--repeats", type=int, default=21, help="timed rounds per workload (default 21)")
    parser.add_argument("--warmup", type=int, default=3, help="calls after the first (compiling) one")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1)")
    parser.add_argument("--sample-ms", type=float, default=100.0,
                        help="minimum duration of one timed sample (calls are batched to reach it)")
    parser.add_argument("--workloads", default="train,infer", help="comma list of train,infer")
    parser.add_argument("--skip-cache-test", action="store_true", help="no cold/warm cache children")
    parser.add_argument("--child-timeout", type=float, default=1200.0, help="seconds per child")
    parser.add_argument("--reuse-caches", action="store_true",
                        help="keep the environment's NEURON_COMPILE_CACHE_URL / TORCHINDUCTOR_CACHE_DIR "
                             "(default: fresh temporary directories, so compiles are cold)")
    parser.add_argument("--keep-tmp", action="store_true", help="keep the temporary cache directories")
    parser.add_argument("--child-compile", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.size:  # children inherit the size through the environment
        global MODEL, BATCH, SEQ
        os.environ["TORCHNEURON_BENCH_SIZE"] = args.size
        MODEL, BATCH, SEQ = SIZES[args.size]
    torch.set_num_threads(args.threads)
    if args.child_compile:
        return child_compile(args.warmup)

    from rich.console import Console
    from rich.table import Table

    console = Console(highlight=False, width=None if sys.stdout.isatty() else 120)
    started = time.perf_counter()
    tmp_root = None
    if not args.reuse_caches:
        tmp_root = Path(tempfile.mkdtemp(prefix="neuron-compile-bench-main-"))
        os.environ["NEURON_COMPILE_CACHE_URL"] = str(tmp_root / "neuron-cache")
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(tmp_root / "inductor-cache")
    workloads = [w.strip() for w in args.workloads.split(",") if w.strip()]
    unknown = set(workloads) - set(WORKLOADS)
    if unknown:
        parser.error(f"unknown workloads {sorted(unknown)}; known: {sorted(WORKLOADS)}")

    console.print(f"{datetime.date.today()}, {platform.machine()}, {os.cpu_count()} CPUs, "
                  f"torch {torch.__version__}, torchneuron {torchneuron.__version__}, "
                  f"{torch.get_num_threads()} thread(s); Llama {MODEL['num_hidden_layers']} layers, "
                  f"hidden {MODEL['hidden_size']}, intermediate {MODEL['intermediate_size']}, "
                  f"{MODEL['num_attention_heads']} heads / {MODEL['num_key_value_heads']} kv, "
                  f"vocab {MODEL['vocab_size']}; batch {BATCH}, seq {SEQ}; "
                  f"{args.repeats} rounds, warm-up 1 + {args.warmup}")
    console.print("caches: " + ("environment's (--reuse-caches)" if args.reuse_caches else
                                "fresh temporary NEURON_COMPILE_CACHE_URL and TORCHINDUCTOR_CACHE_DIR"))

    ok = True
    errors: list[str] = []
    failures: list[str] = []
    try:
        torch.neuron.reset_compile_metrics()
        for workload in workloads:
            console.print(f"\n[bold]{workload}[/]: {WORKLOAD_TITLES[workload]}")
            prepared: dict[str, Prepared] = {}
            for cfg in CONFIGS:
                console.print(f"  warm-up {cfg.name} ...", end="")
                p = prepared[cfg.name] = prepare(workload, cfg, args.warmup)
                if p.error:
                    console.print(" [red]ERROR[/]")
                    errors.append(f"{workload}/{cfg.name}:\n{p.error}")
                else:
                    console.print(f" first call {p.first_call_s:.2f} s")
            agreement, fails = check(workload, prepared)
            failures += fails
            runs = {name: (p.step, next(c.device for c in CONFIGS if c.name == name))
                    for name, p in prepared.items() if p.step is not None}
            med = measure(runs, args.repeats, args.sample_ms / 1e3) if runs else {}
            _report(console, Table, workload, prepared, med, agreement, fails)
            ok &= _ratios_pass(med) and not fails

        metrics = torch.neuron.compile_metrics()
        console.print("\ncompile_metrics() of the main process (neuron backend): " + json.dumps(
            {k: metrics[k] for k in ("compiles", "cache_hits", "cache_misses", "compile_seconds",
                                     "graph_breaks", "recompiles", "eager_fallbacks")}))
        for key in ("graph_break_reasons", "recompile_reasons", "partitioned_ops"):
            if metrics.get(key):
                console.print(f"  {key}: {metrics[key]}")
        if metrics["eager_fallbacks"]:
            failures.append(f"{metrics['eager_fallbacks']} graph(s) fell back to eager execution: "
                            "the compiled neuron timings are not of compiled code")
            ok = False

        if not args.skip_cache_test:
            console.print("\n[bold]compile cache[/]: training step compiled on neuron in a child "
                          "process, twice, one fresh NEURON_COMPILE_CACHE_URL")
            children, files = cache_test(args.threads, args.warmup, args.child_timeout, args.keep_tmp)
            ok &= _report_cache(console, Table, children, files, errors)
    finally:
        if tmp_root is not None:
            if args.keep_tmp:
                console.print(f"kept {tmp_root}")
            else:
                shutil.rmtree(tmp_root, ignore_errors=True)

    for failure in failures:
        console.print(f"[red]CHECK FAILED[/] {failure}")
    for error in errors:
        title, _, text = error.partition("\n")
        console.print(f"\n[red]ERROR[/] {title}")
        console.print(text, markup=False)
    ok &= not errors and not failures
    console.print(f"\ntotal {time.perf_counter() - started:.0f} s; "
                  f"{'all checks and targets passed' if ok else 'some targets missed or checks failed'}")
    return 0 if ok else 1


def _ratios(med: dict[str, float]) -> tuple[float | None, float | None, float | None]:
    """(compiled neuron speed-up over eager neuron, compiled neuron / CPU Inductor, that
    speed-up as a share of CPU Inductor's over eager CPU); None where a time is missing."""
    speedup = med[BASELINE] / med[COMPILED] if BASELINE in med and COMPILED in med else None
    vs_inductor = med[COMPILED] / med[CPU_INDUCTOR] if COMPILED in med and CPU_INDUCTOR in med else None
    inductor_speedup = (med[EAGER_CPU] / med[CPU_INDUCTOR]
                        if EAGER_CPU in med and CPU_INDUCTOR in med else None)
    share = speedup / inductor_speedup if speedup is not None and inductor_speedup else None
    return speedup, vs_inductor, share


def _targets(med: dict[str, float]) -> tuple[bool | None, bool | None]:
    """Whether each README target holds (None: not measured)."""
    _, vs_inductor, share = _ratios(med)
    return (None if vs_inductor is None else vs_inductor <= TARGET_VS_INDUCTOR,
            None if share is None else share >= TARGET_SHARE_OF_INDUCTOR_SPEEDUP)


def _ratios_pass(med: dict[str, float]) -> bool:
    return all(ok is True for ok in _targets(med))


def _report(console, Table, workload: str, prepared: dict[str, Prepared], med: dict[str, float],
            agreement: dict[str, str], fails: list[str]) -> None:
    table = Table(title=f"{workload}: {WORKLOAD_TITLES[workload]}", title_justify="left")
    for col in ("config", "first call (s)", "median step (ms)", "speedup vs eager neuron",
                "agreement with eager neuron"):
        table.add_column(col, justify="left" if col.startswith(("config", "agreement")) else "right")
    for cfg in CONFIGS:
        p = prepared[cfg.name]
        if p.error:
            table.add_row(cfg.name, "[red]ERROR[/]", "-", "-", "-")
            continue
        rel = f"{med[BASELINE] / med[cfg.name]:.2f}x" if BASELINE in med and cfg.name in med else "-"
        table.add_row(cfg.name, f"{p.first_call_s:.2f}", f"{med.get(cfg.name, math.nan):.1f}", rel,
                      agreement.get(cfg.name, "-"))
    console.print(table)

    speedup, vs_inductor, share = _ratios(med)
    vs_ok, share_ok = _targets(med)
    checks = Table(title=f"{workload}: targets", title_justify="left")
    for col in ("ratio", "value", "target", "result"):
        checks.add_column(col, justify="left" if col == "ratio" else "right")
    checks.add_row("compiled neuron / CPU Inductor",
                   "-" if vs_inductor is None else f"{vs_inductor:.2f}x", f"<= {TARGET_VS_INDUCTOR:g}x",
                   _flag(vs_ok))
    checks.add_row("compiled neuron speedup over eager neuron / CPU Inductor's over eager CPU",
                   "-" if share is None else f"{share:.2f}x",
                   f">= {TARGET_SHARE_OF_INDUCTOR_SPEEDUP:g}x", _flag(share_ok))
    checks.add_row("compiled neuron speedup over eager neuron (context)",
                   "-" if speedup is None else f"{speedup:.2f}x", "-", "-")
    if "eager CPU" in med and BASELINE in med:
        checks.add_row("eager neuron / eager CPU (context)",
                       f"{med[BASELINE] / med['eager CPU']:.2f}x", "-", "-")
    if "eager CPU" in med and CPU_INDUCTOR in med:
        checks.add_row("CPU Inductor speedup over eager CPU (context)",
                       f"{med['eager CPU'] / med[CPU_INDUCTOR]:.2f}x", "-", "-")
    errored = prepared[COMPILED].error is not None or prepared[BASELINE].error is not None
    checks.add_row("compiled neuron == eager neuron, on 'neuron'",
                   "error" if errored else ("yes" if not fails else "no"), f"rtol {RTOL:g}",
                   "[red]ERROR[/]" if errored else _flag(not fails))
    console.print(checks)


def _report_cache(console, Table, children: list[dict], files: dict[str, int], errors: list[str]) -> bool:
    table = Table(title="compile cache: first call of the compiled training step, child processes",
                  title_justify="left")
    for col in ("run", "first call (s)", "steady step (s)", "child wall (s)", "compiles", "cache hits",
                "cache misses", "backend compile (s)", "loss"):
        table.add_column(col, justify="left" if col == "run" else "right")
    by_label = {}
    for child in children:
        by_label[child["label"]] = child
        if "error" in child:
            errors.append(f"cache test, {child['label']} child: {child['error']}\n"
                          f"{child.get('stderr_tail', '')}")
        m = child.get("compile_metrics") or {}
        table.add_row(child["label"], f"{child.get('compile_s', math.nan):.2f}",
                      f"{child.get('steady_step_s') or math.nan:.3f}", f"{child.get('wall_s', math.nan):.1f}",
                      str(m.get("compiles", "-")), str(m.get("cache_hits", "-")),
                      str(m.get("cache_misses", "-")), f"{m.get('compile_seconds', math.nan):.2f}",
                      f"{child['loss']:.6f}" if "loss" in child else "-")
    console.print(table)
    console.print("files: " + ", ".join(f"{k} {v}" for k, v in files.items()))
    cold, warm = by_label.get("cold"), by_label.get("warm")
    if not (cold and warm and "compile_s" in cold and "compile_s" in warm):
        return False
    m = warm.get("compile_metrics", {})
    hits, compiles = m.get("cache_hits", 0), m.get("compiles", 0)
    same_loss = math.isclose(cold["loss"], warm["loss"], rel_tol=RTOL)
    console.print(f"cold {cold['compile_s']:.2f} s, warm {warm['compile_s']:.2f} s: "
                  f"cold/warm {cold['compile_s'] / warm['compile_s']:.2f}x; warm run: {hits} of "
                  f"{compiles} graph compiles served by the cache; warm loss "
                  f"{'matches' if same_loss else '[red]differs from[/]'} cold "
                  f"({warm['loss']:.6f} vs {cold['loss']:.6f}), on {warm.get('loss_device')}")
    for child in (cold, warm):
        if child.get("torch_cache_counters"):
            console.print(f"  {child['label']} torch cache counters: {child['torch_cache_counters']}")
        for key in ("recompile_reasons", "graph_break_reasons", "partitioned_ops"):
            if child.get("compile_metrics", {}).get(key):
                console.print(f"  {child['label']} {key}: {child['compile_metrics'][key]}")
    ok = same_loss and compiles > 0 and hits == compiles and warm.get("loss_device", "").startswith("neuron")
    if not ok:
        console.print("[red]cache check failed[/]: expected every graph of the warm run to be served by "
                      "the neuron compile cache (compile_metrics cache_hits == compiles), the cold run's "
                      "loss, on neuron")
    return ok


if __name__ == "__main__":
    raise SystemExit(main())
