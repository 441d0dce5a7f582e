"""What torch.profiler costs an eager train step on neuron, against the same step unprofiled.

Each round times K steps unprofiled, then K steps inside a running
``torch.profiler.profile(activities=[CPU, PrivateUse1])`` session (started
before and stopped after the timed steps, so the one-off start and trace
processing are not in the step time), alternating the order every round;
medians per step are reported. The same is done on CPU as a baseline: the
part of the overhead that is PyTorch's own profiler. Target: a neuron train
step profiled at most 2x its unprofiled time (issue 14).

The legacy profiler (``torch.autograd.profiler.profile(use_device="neuron")``,
which once cost 55x) is timed the same way; its baseline is the same profiler
on CPU (``use_device=None``), so its row shows what neuron adds to PyTorch's own
legacy overhead.

Cost left behind (issue 29): a 64x64 add timed before, during and after a session
in the same fresh process, each round a new interpreter (the order is the point,
so rounds alternate the device instead); medians of the after/before ratio per
device. Target: neuron's "after" equals its "before" (ratio within the CPU
baseline's own after/before noise, and at most 1.05x).

    python benchmarks/profiler_overhead.py [--rounds N] [--steps K] [--after-rounds R]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

import torch
from torch import nn
from torch.profiler import ProfilerActivity, profile

import torchneuron  # noqa: F401  (registers the device)

TARGET = 2.0


def _step_fn(device: str):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 256), nn.ReLU(),
                          nn.Linear(256, 10)).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(64, 256, device=device)
    y = torch.randint(0, 10, (64,), device=device)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()

    return step


def _time(step, k: int) -> float:
    start = time.perf_counter_ns()
    for _ in range(k):
        step()
    return (time.perf_counter_ns() - start) / k / 1e3


def _session(device: str, legacy: bool):
    """A new profiling session for ``device``: torch.profiler's, or the legacy profiler's."""
    if legacy:
        return torch.autograd.profiler.profile(use_device="neuron" if device == "neuron" else None)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.PrivateUse1] if device == "neuron" else [])
    return profile(activities=activities)


def _profiled(step, k: int, device: str, legacy: bool) -> float:
    with _session(device, legacy):
        elapsed = _time(step, k)
    return elapsed


def measure(device: str, rounds: int, k: int, legacy: bool = False) -> tuple[float, float]:
    step = _step_fn(device)
    for _ in range(3):
        step()
    _profiled(step, 2, device, legacy)  # the first session initialises the profiler
    plain, profiled = [], []
    for r in range(rounds):
        if r % 2 == 0:
            plain.append(_time(step, k))
            profiled.append(_profiled(step, k, device, legacy))
        else:
            profiled.append(_profiled(step, k, device, legacy))
            plain.append(_time(step, k))
    return statistics.median(plain), statistics.median(profiled)


AFTER_TARGET = 1.05
_AFTER_PROBE = r"""
import statistics, sys, time, torch
from torch.profiler import ProfilerActivity, profile
import torchneuron  # noqa: F401
device = sys.argv[1]
torch.set_num_threads(1)
a, b = (torch.randn(64, 64, device=device) for _ in range(2))

def add_ns(n=2000, reps=7):
    times = []
    for _ in range(reps):
        start = time.perf_counter_ns()
        for _ in range(n):
            a + b
        times.append((time.perf_counter_ns() - start) / n)
    return statistics.median(times)

add_ns()
before = add_ns()
activities = [ProfilerActivity.CPU] + ([ProfilerActivity.PrivateUse1] if device == "neuron" else [])
with profile(activities=activities):
    during = add_ns()
after = add_ns()
print(before, during, after)
"""


def after_session(rounds: int) -> dict[str, list[tuple[float, float, float]]]:
    """(before, during, after) ns per 64x64 add, one fresh process per device and round."""
    found: dict[str, list[tuple[float, float, float]]] = {"cpu": [], "neuron": []}
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [os.getcwd(), os.environ.get("PYTHONPATH")]))}
    for r in range(rounds):
        for device in (("cpu", "neuron") if r % 2 == 0 else ("neuron", "cpu")):
            out = subprocess.run([sys.executable, "-c", _AFTER_PROBE, device], capture_output=True, text=True,
                                 check=True, env=env).stdout.split()
            found[device].append(tuple(float(x) for x in out[-3:]))
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1)")
    parser.add_argument("--after-rounds", type=int, default=7, help="fresh processes per device for the "
                        "before/during/after measurement (0: skip it)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, MLP 256-512-256-10 AdamW train step, batch 64, "
          f"{args.rounds} rounds x {args.steps} steps, {args.threads} thread(s)")
    print(f"{'profiler':9} {'device':8} {'plain us':>10} {'profiled us':>12} {'ratio':>7}  target")
    for legacy in (False, True):
        ratios = {}
        for device in ("cpu", "neuron"):
            plain, profiled = measure(device, args.rounds, args.steps, legacy)
            ratios[device] = ratio = profiled / plain
            if device == "cpu":
                verdict = ""
            elif legacy:
                verdict = f"{ratio / ratios['cpu']:.2f}x CPU's legacy overhead"
            else:
                verdict = f"<= {TARGET:.1f}x {'PASS' if ratio <= TARGET else 'MISS'}"
            name = "legacy" if legacy else "torch"
            print(f"{name:9} {device:8} {plain:10.1f} {profiled:12.1f} {ratio:6.2f}x  {verdict}")
    if args.after_rounds:
        print(f"\nafter a session: 64x64 add, ns, medians of {args.after_rounds} fresh processes per device")
        print(f"{'device':8} {'before':>8} {'during':>8} {'after':>8} {'after/before':>13}  target")
        found = after_session(args.after_rounds)
        cpu_ratio = statistics.median(a / b for b, _, a in found["cpu"])
        for device, rows in found.items():
            before, during, after = (statistics.median(x[i] for x in rows) for i in range(3))
            ratio = statistics.median(a / b for b, _, a in rows)
            verdict = "" if device == "cpu" else (
                f"<= max({AFTER_TARGET:.2f}x, CPU's {cpu_ratio:.2f}x) "
                f"{'PASS' if ratio <= max(AFTER_TARGET, cpu_ratio) else 'MISS'}")
            print(f"{device:8} {before:8.0f} {during:8.0f} {after:8.0f} {ratio:12.2f}x  {verdict}")


if __name__ == "__main__":
    main()
