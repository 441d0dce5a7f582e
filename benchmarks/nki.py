"""NKI simulator speed and cost-model accuracy against AWS's published matmul tutorial figures.

    python benchmarks/nki.py [--repeat 3] [--skip-sim] [--skip-levels] [--levels-shape K M N]

a. **Simulator wall time.** The tutorial's basic tiled kernel (``matmul_tiled`` of
   ``examples/nki/matmul.py``) on bf16 ``lhsT [K=2048, M=1024]`` and ``rhs [K=2048,
   N=1024]`` (a 1024 x 1024 x 2048 product, result ``[1024, 1024]``), simulated with
   values on trn2: best and median of ``--repeat`` warm runs, the number of instructions
   simulated, and the ratio to a plain NumPy fp32 matmul of the same shapes timed in
   the same process (the baseline). The target for this machine is under 2 s.
b. **Modelled utilisation of the four optimisation levels** at the tutorial's shape
   (``[4096, 8192] x [8192, 8192]`` bf16: ``lhsT [8192, 4096]``, ``rhs [8192, 8192]``),
   on trn1 and trn2, next to the tutorial's published Trn1 figures
   (trainium-facts.md, "Published figures"). The kernels run shape-only
   (``compute_values=False``: instructions are validated and recorded, arithmetic and
   data movement skipped) when the simulator honours it, which is probed first;
   otherwise they run with values at a smaller shape, and the report says so. Each
   level is simulated once (on trn1) and its instruction log costed for both targets:
   the log does not depend on the target for these kernels (same tile sizes, and trn1
   has the smaller SBUF, so its capacity check covers trn2).

Wall times are printed, never asserted. HFU = 2*M*N*K / (latency x TensorE peak),
as the tutorial defines it.
"""

from __future__ import annotations

import argparse
import importlib.util
import pathlib
import statistics
import sys
import time
from typing import Any

import ml_dtypes
import numpy as np
from rich.console import Console
from rich.table import Table

import torchneuron.nki as nki
import torchneuron.nki.language as nl
import torchneuron.nki.typing as nt
from torchneuron.nki import benchmarking
from torchneuron.nki.cost import CostOptions

ROOT = pathlib.Path(__file__).resolve().parents[1]
TUTORIAL_SHAPE = (8192, 4096, 8192)  # K, M, N: [4096, 8192] x [8192, 8192]
FALLBACK_SHAPE = (2048, 2048, 2048)  # with values, if shape-only runs are not supported
SIM_SHAPE = (2048, 1024, 1024)  # part a: K, M, N
WHAT_IF_QUEUES = (1, 2)  # sensitivity: DMA queues per engine in use (the model's default is all 16)
PER_SITE = CostOptions(dma_queue_per_call_site=True)  # what-if (decision 17): a DMA queue per call site
# trainium-facts.md, "Published figures": NKI matmul tutorial, Trn1, bf16, [4096,8192] x [8192,8192]
PUBLISHED_TRN1 = {  # level: (latency ms, HFU %)
    "tiled": (51.80, 10.98),
    "hoisted loads": (42.96, 13.24),
    "blocked": (22.07, 26.51),
    "fully optimized": (6.97, 85.24),
}

console = Console(width=160)


def _load_matmul_examples() -> Any:
    spec = importlib.util.spec_from_file_location("nki_example_matmul", ROOT / "examples" / "nki" / "matmul.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _timed(fn: Any) -> tuple[float, Any]:
    start = time.perf_counter()
    result = fn()
    return time.perf_counter() - start, result


# ------------------------------------------------------------------------------------- part a
def simulator_wall_time(mm: Any, repeat: int) -> None:
    K, M, N = SIM_SHAPE
    rng = np.random.default_rng(0)
    lhsT = rng.standard_normal((K, M)).astype(ml_dtypes.bfloat16)
    rhs = rng.standard_normal((K, N)).astype(ml_dtypes.bfloat16)

    def simulate() -> tuple[Any, Any]:
        return benchmarking.run_kernel(mm.matmul_tiled, (lhsT, rhs), {}, target="trn2")

    cold, (out, run) = _timed(simulate)
    warm = [_timed(simulate)[0] for _ in range(repeat)]
    a32, b32 = lhsT.astype(np.float32), rhs.astype(np.float32)
    _timed(lambda: a32.T @ b32)
    numpy_times = [_timed(lambda: a32.T @ b32)[0] for _ in range(repeat)]
    ref = a32.T @ b32
    error = float(np.abs(out.astype(np.float32) - ref).max() / np.abs(ref).max())
    placeholders = (nt.tensor[[K, M], nl.bfloat16], nt.tensor[[K, N], nl.bfloat16])
    with np.errstate(all="ignore"):  # shape-only: instructions that still compute see unset storage
        shape_only = min(_timed(lambda: benchmarking.run_kernel(mm.matmul_tiled, placeholders, {}, target="trn2",
                                                                 compute_values=False))[0] for _ in range(repeat))
    cost_time, cost = _timed(lambda: nki.estimate(run))

    counts: dict[str, int] = {}
    for ins in run.instructions:
        counts[ins.opcode] = counts.get(ins.opcode, 0) + 1
    best, median, base = min(warm), statistics.median(warm), min(numpy_times)
    table = Table(title=f"a. simulator wall time: matmul_tiled, bf16 lhsT [K={K}, M={M}] x rhs [K={K}, N={N}] "
                        f"-> [{M}, {N}], target trn2")
    table.add_column("measure")
    table.add_column("value", justify="right")
    table.add_row("simulate with values, best of %d warm runs" % repeat, f"{best:.3f} s")
    table.add_row("  median warm / first (cold) run", f"{median:.3f} s / {cold:.3f} s")
    table.add_row("instructions simulated", f"{len(run.instructions):,} ("
                  + ", ".join(f"{n} {op}" for op, n in sorted(counts.items(), key=lambda kv: -kv[1])) + ")")
    table.add_row("simulator time per instruction", f"{best / len(run.instructions) * 1e6:.0f} us")
    table.add_row("NumPy fp32 matmul (its BLAS threads), same shapes, best of %d" % repeat, f"{base * 1e3:.1f} ms")
    table.add_row("simulator / NumPy", f"{best / base:.1f}x")
    table.add_row("shape-only run (compute_values=False), best", f"{shape_only:.3f} s")
    table.add_row("cost model (nki.estimate of the run)", f"{cost_time:.3f} s")
    table.add_row("max error vs NumPy fp32 (relative to max |ref|)", f"{error:.2e}")
    table.add_row("modelled latency on trn2 / HFU", f"{cost.latency_us:,.1f} us / {cost.hfu:.1%}")
    table.add_row("target: under 2 s", "met" if best < 2.0 else "NOT met")
    console.print(table)


# ------------------------------------------------------------------------------------- part b
def shape_only_supported(mm: Any) -> bool:
    """Does a ``compute_values=False`` run skip the arithmetic? (Its output is then not the product.)"""
    rng = np.random.default_rng(1)
    lhsT = rng.standard_normal((128, 128)).astype(ml_dtypes.bfloat16)
    rhs = rng.standard_normal((128, 512)).astype(ml_dtypes.bfloat16)
    with np.errstate(all="ignore"):
        out, _ = benchmarking.run_kernel(mm.matmul_tiled, (lhsT, rhs), {}, target="trn1", compute_values=False)
    ref = (lhsT.astype(np.float32).T @ rhs.astype(np.float32)).astype(ml_dtypes.bfloat16)
    return not np.array_equal(np.asarray(out), ref)


def _load_tiles(run: Any, cost: Any) -> dict[int, tuple[int, float, int]]:
    """HBM -> SBUF loads of a level by bytes: {bytes: (count, modelled trn1 engine ns each, bytes per partition)}."""
    from torchneuron.nki.cost import instruction_cost

    tiles: dict[int, tuple[int, float, int]] = {}
    for ins in run.instructions:
        if ins.engine != "dma" or not ins.writes or ins.writes[0].buffer != "sbuf":
            continue
        nbytes = ins.writes[0].bytes
        count, ns, bpp = tiles.get(nbytes, (0, 0.0, 0))
        if not count:
            ns, bpp = instruction_cost(ins, "trn1").data_ns, ins.writes[0].bytes_per_partition
        tiles[nbytes] = (count + 1, ns, bpp)
    return tiles


def _per_load_evidence(rows: list) -> None:
    """What the published latencies imply each tutorial tile load costs, next to the models.

    Levels 1 and 2 differ only by the lhsT loads hoisted out of the n loop, so their latency
    difference over the extra loads is one lhsT load's marginal cost; levels 2 and 3 (DMA-bound,
    the same two tiles in different numbers) give both tiles' costs from two equations.
    """
    by_level = {name: loads for name, *_, loads in rows}
    names = list(PUBLISHED_TRN1)
    tiles = sorted({b for loads in by_level.values() for b in loads if b <= 128 * 1024})
    if len(tiles) != 2 or any(b not in by_level[n] for b in tiles for n in names[:3]):
        return
    small, big = tiles
    pub = {n: PUBLISHED_TRN1[n][0] * 1e6 for n in names}
    n = {lv: {b: by_level[lv][b][0] for b in tiles} for lv in names[:3]}
    marginal_small = (pub[names[0]] - pub[names[1]]) / (n[names[0]][small] - n[names[1]][small])
    a, b_, c, d = n[names[1]][big], n[names[1]][small], n[names[2]][big], n[names[2]][small]
    det = a * d - b_ * c
    big_ns = (pub[names[1]] * d - b_ * pub[names[2]]) / det
    small_ns = (a * pub[names[2]] - c * pub[names[1]]) / det
    table = Table(title="per-load cost of the tutorial's two tiles (trn1): implied by the published latencies vs "
                        "the models")
    for column in ("tile", "bytes / partition", "published: levels 1-2 marginal", "published: levels 2-3 solve",
                   "default: engine time (curve)", "per call site: issue interval"):
        table.add_column(column, justify="left" if column == "tile" else "right")
    from torchneuron.nki.cost import dma_efficiency
    from torchneuron.nki.cost.constants import DMA_FIXED_NS

    for tile, implied in ((small, small_ns), (big, big_ns)):
        _, engine_ns, bpp = by_level[names[1]][tile]
        table.add_row(f"{tile // 1024} KiB", f"{bpp:,} B", f"{marginal_small:,.0f} ns" if tile == small else "",
                      f"{implied:,.0f} ns", f"{engine_ns:,.0f} ns", f"{max(DMA_FIXED_NS, engine_ns * dma_efficiency(bpp)):,.0f} ns")
    console.print(table)
    console.print("The published latencies charge the small tile ~1/4-1/2 of the big one (about proportional to "
                  "bytes, ~100-114 GB/s); the published curve charges both about the same engine time (its "
                  "throughput doubles with the bytes from 64 B to 1 KiB per partition), hence the default's tiled "
                  "level is slow. A queue per call site runs the two tiles' loads side by side, one per 1.3 us each.")


def matmul_levels(mm: Any, shape: tuple[int, int, int] | None, what_if: bool) -> None:
    shape_only = shape_only_supported(mm)
    if shape is None:
        shape = TUTORIAL_SHAPE if shape_only else FALLBACK_SHAPE
    K, M, N = shape
    mode = "shape-only (compute_values=False)" if shape_only else "with values"
    console.print(f"\n[bold]b. matmul optimisation levels[/bold]: lhsT [K={K}, M={M}], rhs [K={K}, N={N}] bf16 "
                  f"({'the tutorial shape' if shape == TUTORIAL_SHAPE else 'NOT the tutorial shape'}), run {mode}.")
    if not shape_only:
        console.print("[yellow]isa does not honour KernelRun.compute_values (a shape-only run still computed the "
                      "product): running with values at a smaller shape.[/yellow]")
    rows = []
    for name, kernel in mm.LEVELS.items():
        if shape_only:
            args = (nt.tensor[[K, M], nl.bfloat16], nt.tensor[[K, N], nl.bfloat16])
        else:
            args = (np.zeros((K, M), ml_dtypes.bfloat16), np.zeros((K, N), ml_dtypes.bfloat16))
        with np.errstate(all="ignore"):  # shape-only: instructions that still compute see unset storage
            sim_s, (_, run) = _timed(lambda: benchmarking.run_kernel(kernel, args, {}, target="trn1",
                                                                      compute_values=shape_only))
        cost_s, costs = _timed(lambda: {t: nki.estimate(run, target=t) for t in ("trn1", "trn2")})
        if what_if:
            for queues in WHAT_IF_QUEUES:
                costs[f"q{queues}"] = nki.estimate(run, target="trn1", options=CostOptions(dma_queues=queues))
            costs["site"] = nki.estimate(run, target="trn1", options=PER_SITE)
            costs["site trn2"] = nki.estimate(run, target="trn2", options=PER_SITE)
        dmas = sum(1 for ins in run.instructions if ins.engine == "dma")
        loads = _load_tiles(run, costs["trn1"])
        rows.append((name, costs, len(run.instructions), dmas, sim_s, cost_s, loads))
        count = len(run.instructions)
        kernel.last_run = run = None  # free the run's HBM tensors before the next level
        console.print(f"  {name}: {count:,} instructions simulated in {sim_s:.1f} s, "
                      f"costed on trn1 and trn2 in {cost_s:.1f} s")

    scaled = shape != TUTORIAL_SHAPE
    table = Table(title="modelled vs published (Trn1 tutorial figures); error = (model - published) / published")
    for column in ("level", "trn1 model", "trn1 HFU", "published", "published HFU", "latency error", "HFU error",
                   "trn2 model", "trn2 HFU"):
        table.add_column(column, justify="left" if column == "level" else "right")
    for name, costs, *_ in rows:
        c1, c2 = costs["trn1"], costs["trn2"]
        pub_ms, pub_hfu = PUBLISHED_TRN1[name]
        t1_ms = c1.latency_seconds * 1e3
        table.add_row(name, f"{t1_ms:.2f} ms", f"{c1.hfu:.2%}", f"{pub_ms:.2f} ms", f"{pub_hfu:.2f}%",
                      "n/a (other shape)" if scaled else f"{(t1_ms - pub_ms) / pub_ms:+.1%}",
                      f"{(c1.hfu * 100 - pub_hfu) / pub_hfu:+.1%}", f"{c2.latency_seconds * 1e3:.2f} ms",
                      f"{c2.hfu:.2%}")
    console.print(table)

    # Where the time goes (trn1): levels 1-3 are DMA-bound in the model; published latency per DMA
    # shows how much slower the hardware's DMAs were for the same transfers.
    diag = Table(title="trn1 diagnostics: engine busy share of the modelled latency; latency per DMA instruction; "
                       "DMA bytes / latency")
    for column in ("level", "instructions", "DMAs", "DMA bytes", "TensorE busy", "DMA busy", "MBU",
                   "model ns/DMA", "published ns/DMA", "model GB/s", "published GB/s"):
        diag.add_column(column, justify="left" if column == "level" else "right")
    for name, costs, count, dmas, *_ in rows:
        c1 = costs["trn1"]
        pub_ms = PUBLISHED_TRN1[name][0]
        diag.add_row(name, f"{count:,}", f"{dmas:,}", f"{c1.dma_bytes / 2**20:,.0f} MiB",
                     f"{c1.utilisation('tensor'):.1%}", f"{c1.utilisation('dma'):.1%}", f"{c1.mbu:.1%}",
                     f"{c1.latency_ns / dmas:,.0f}", "n/a" if scaled else f"{pub_ms * 1e6 / dmas:,.0f}",
                     f"{c1.dma_bytes / c1.latency_ns:,.0f}",
                     "n/a" if scaled else f"{c1.dma_bytes / (pub_ms * 1e6):,.0f}")
    console.print(diag)
    if not scaled:
        _per_load_evidence(rows)

    if what_if:
        alt = Table(title="what-ifs (trn1 unless marked): the same logs costed with other DMA queue behaviour. "
                          "q=1, q=2: CostOptions(dma_queues=q), transfers round-robin over q queues, a queue runs "
                          "them in order, each paying its 1.3 us fixed cost. per call site: CostOptions("
                          "dma_queue_per_call_site=True), decision 17: one queue per load/store call site, a queue "
                          "starts one transfer per fixed cost, no efficiency curve (one queue's issue rate "
                          "reproduces the published curve). Which queues a compiled kernel uses is not published; "
                          "the default is 16 round-robin queues with the published curve.")
        alt.add_column("level")
        for queues in WHAT_IF_QUEUES:
            alt.add_column(f"q={queues}", justify="right")
        alt.add_column("default (16)", justify="right")
        alt.add_column("per call site", justify="right")
        alt.add_column("per call site, trn2", justify="right")
        alt.add_column("published", justify="right")
        for name, costs, *_ in rows:
            pub_ms = PUBLISHED_TRN1[name][0]
            cells = []
            for key in [f"q{q}" for q in WHAT_IF_QUEUES] + ["trn1", "site", "site trn2"]:
                ms = costs[key].latency_seconds * 1e3
                cells.append(f"{ms:.2f} ms" + ("" if scaled else f" ({(ms - pub_ms) / pub_ms:+.0%})"))
            alt.add_row(name, *cells, f"{pub_ms:.2f} ms")
        console.print(alt)

    published = [PUBLISHED_TRN1[name][0] for name, *_ in rows]
    for target in ("trn1", "trn2"):
        model = [costs[target].latency_ns for _, costs, *_ in rows]
        ok = all(a > b for a, b in zip(model, model[1:]))
        verdict = "[green]matches[/green]" if ok else "[red]does NOT match[/red]"
        steps = ", ".join(f"{a / b:.2f}x" for a, b in zip(model, model[1:]))
        console.print(f"ordering on {target}: {verdict} the published one (each level faster than the previous); "
                      f"modelled speedups level to level {steps}")
    console.print("published speedups level to level "
                  + ", ".join(f"{a / b:.2f}x" for a, b in zip(published, published[1:])))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=3, help="timed repetitions of part a")
    parser.add_argument("--skip-sim", action="store_true", help="skip part a (simulator wall time)")
    parser.add_argument("--skip-levels", action="store_true", help="skip part b (matmul levels)")
    parser.add_argument("--levels-shape", type=int, nargs=3, metavar=("K", "M", "N"),
                        help="shape of part b (default: the tutorial's 8192 4096 8192)")
    parser.add_argument("--no-what-if", action="store_true",
                        help=f"skip the trn1 re-costing with CostOptions(dma_queues=q), q in {WHAT_IF_QUEUES}")
    args = parser.parse_args()
    mm = _load_matmul_examples()
    start = time.perf_counter()
    if not args.skip_sim:
        simulator_wall_time(mm, args.repeat)
    if not args.skip_levels:
        matmul_levels(mm, tuple(args.levels_shape) if args.levels_shape else None, not args.no_what_if)
    console.print(f"\ntotal benchmark time {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    sys.exit(main())
