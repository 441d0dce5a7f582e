"""Per-op speed of neuron against CPU across PyTorch's OpInfo database.

eager_overhead.py times a few hand-picked cases; this sweeps every op in
``op_db`` to find op families that run much slower on neuron than on CPU (for
example an op whose neuron path copies, or takes a slower composite). Each op
runs its first few float32 sample inputs on both devices, interleaved, and the
script reports the median time per call and the ratio, worst first.

    python benchmarks/op_families.py [--top 30] [--filter linalg] [--threads 1]

An op is flagged when neuron takes more than ``--flag`` times CPU's time *and*
more than ``--min-extra-us`` microseconds extra per call (the fixed ~1 us
per-op overhead alone makes tiny ops look slow in ratio).
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
import time
import warnings
from collections.abc import Callable

import torch
from torch.testing._internal.common_methods_invocations import op_db
from torch.testing._internal.opinfo.core import OpInfo, SampleInput

import torchneuron  # noqa: F401  (registers neuron even with autoload off)


def _moved(sample: SampleInput, device: str) -> SampleInput:
    moved = sample.transform(lambda t: t.detach().to(device) if isinstance(t, torch.Tensor) else t)
    if "device" in moved.kwargs:
        moved.kwargs["device"] = device
    return moved


def _caller(op: OpInfo, samples: list[SampleInput]) -> Callable[[], None]:
    def call() -> None:
        for s in samples:
            op(s.input, *s.args, **s.kwargs)
    return call


def _median_us(fn: Callable[[], None], reps: int) -> float:
    times = []
    for _ in range(reps):
        start = time.perf_counter_ns()
        fn()
        times.append((time.perf_counter_ns() - start) / 1e3)
    return statistics.median(times)


def time_op(op: OpInfo, samples_per_op: int, rounds: int) -> tuple[float, float] | None:
    """(CPU us, neuron us) per call of the op's first samples, or None if it cannot run."""
    torch.manual_seed(0)
    samples = list(itertools.islice(op.sample_inputs("cpu", torch.float32), samples_per_op))
    if not samples:
        return None
    calls = {d: _caller(op, [_moved(s, d) for s in samples]) for d in ("cpu", "neuron")}
    try:
        for fn in calls.values():
            fn()
    except Exception:  # ops whose samples only error (tested by the conformance suite)
        return None
    medians: dict[str, list[float]] = {d: [] for d in calls}
    for r in range(rounds):
        for d in (("cpu", "neuron") if r % 2 == 0 else ("neuron", "cpu")):
            medians[d].append(_median_us(calls[d], 5))
    return statistics.median(medians["cpu"]), statistics.median(medians["neuron"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--top", type=int, default=25, help="rows to print, slowest ratio first")
    parser.add_argument("--filter", default="", help="only ops whose name contains this")
    parser.add_argument("--samples", type=int, default=3, help="sample inputs per op")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds per op")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--flag", type=float, default=2.0, help="flag ops slower than this ratio ...")
    parser.add_argument("--min-extra-us", type=float, default=20.0, help="... and this many us extra")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore")

    rows = []
    ops = [op for op in op_db if args.filter in op.name and torch.float32 in op.supported_dtypes("cpu")]
    for op in ops:
        timed = time_op(op, args.samples, args.rounds)
        if timed is not None:
            name = f"{op.name}.{op.variant_test_name}" if op.variant_test_name else op.name
            rows.append((name, *timed, timed[1] / max(timed[0], 1e-3)))
    rows.sort(key=lambda r: -r[3])
    flagged = [r for r in rows if r[3] > args.flag and r[2] - r[1] > args.min_extra_us]

    ratios = [r[3] for r in rows]
    print(f"{len(rows)} ops timed ({len(ops) - len(rows)} skipped: samples error on CPU); "
          f"median neuron/CPU {statistics.median(ratios):.2f}x, "
          f"{sum(r <= 1.5 for r in ratios)} ops <= 1.5x, flagged {len(flagged)}")
    print("\n| op | CPU us | neuron us | neuron/CPU | flagged |\n|---|---:|---:|---:|---|")
    for name, cpu, neuron, ratio in rows[: args.top]:
        mark = "FLAG" if (name, cpu, neuron, ratio) in flagged else ""
        print(f"| {name} | {cpu:.1f} | {neuron:.1f} | {ratio:.2f}x | {mark} |")
    return 1 if flagged else 0


if __name__ == "__main__":
    sys.exit(main())
