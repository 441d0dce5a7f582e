"""What the hardware model costs in eager mode: neuron with the cost model on vs off.

Every op on neuron is counted (CPU-fallback accounting, always on) and, with
the cost model on (``TORCHNEURON_COST_MODEL=1``, the default), also charged its
modelled Trainium time. This times the eager_overhead.py cases three ways in
one process, interleaved -- CPU, neuron with the cost model off, neuron with it
on -- and prints the ratio the model adds (target: at most 1.10x).

    python benchmarks/model_overhead.py [--quick]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
import eager_overhead as eo  # noqa: E402  (shares the cases and the timing loop)

from torchneuron import _C  # noqa: E402

TARGET = 1.10


def _with_costing(run, on: bool):
    def call():
        _C._set_costing(on)
        try:
            return run()
        finally:
            _C._set_costing(True)
    return call


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    rounds, sample_ns = (9, 2e6) if args.quick else (25, 5e6)
    print("| case | CPU (us) | neuron, model off (us) | neuron, model on (us) | on/off | target |")
    print("|---|---:|---:|---:|---:|---:|")
    worst = 0.0
    for case in eo.CASES:
        if "16M" in case.name:
            continue  # memory-bound: the per-op model cost is invisible there
        runs = eo.check(case)
        timed = {"cpu": runs["cpu"], "off": _with_costing(runs["neuron"], False),
                 "on": _with_costing(runs["neuron"], True)}
        med = eo.measure(timed, rounds, sample_ns)
        ratio = med["on"] / med["off"]
        worst = max(worst, ratio)
        print(f"| {case.name} | {med['cpu']:.1f} | {med['off']:.1f} | {med['on']:.1f} | "
              f"{ratio:.2f}x | <= {TARGET:.2f}x {'PASS' if ratio <= TARGET else 'MISS'} |")
    return 0 if worst <= TARGET else 1


if __name__ == "__main__":
    sys.exit(main())
