"""How fast planning is, and what it costs the host, for the issue's full-scale job.

1. One configuration of a Llama-3-70B-shaped training job (80 layers, d 8192, GQA 64/8,
   ffn 28672, vocab 128k, seq 8192, full activation checkpointing) on 4 x trn2.48xlarge
   (256 ranks), TP=8 and FSDP2 over the rest: planning wall time (target < 60 s on the 2-core
   machine) and the planning worker's peak host RSS (target < 2 GB).
2. A 12-configuration sweep of that job (tp = 2, 4, 8; seq = 4096, 8192; ac = none, full),
   workers in parallel: wall time (target < 10 min).
3. Baseline in the same run: one small training step dataless against the same step with
   values, host time, interleaved rounds (the dataless run's host overhead or saving).

    python benchmarks/plan.py [--skip-sweep]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "..", "examples", "planning", "llama_fsdp_tp.py")
LLAMA_70B = ["--layers", "80", "--dim", "8192", "--ffn", "28672", "--heads", "64", "--kv", "8",
             "--vocab", "128256", "--batch", "1"]


def plan_once() -> None:
    from torchneuron.plan import plan

    started = time.perf_counter()
    (result,) = plan([SCRIPT, "--tp", "8", "--seq", "8192", "--ac", "full", *LLAMA_70B], nodes=[4])
    wall = time.perf_counter() - started
    rss = result.rank.get("host_peak_rss_bytes", 0)
    print(f"70B job, 4 x trn2.48xlarge, TP=8: planned in {wall:.1f} s (target < 60 s: "
          f"{'met' if wall < 60 else 'MISS'}); worker peak RSS {rss / 1e9:.2f} GB (target < 2 GB: "
          f"{'met' if rss < 2e9 else 'MISS'}); fits: {result.fits}; status: {result.status}")


def sweep() -> None:
    from torchneuron.plan import plan

    started = time.perf_counter()
    plans = plan([SCRIPT, "--tp", "{tp}", "--seq", "{seq}", "--ac", "{ac}", *LLAMA_70B], nodes=[4],
                 sweep="tp=2,4,8 seq=4096,8192 ac=none,full")
    wall = time.perf_counter() - started
    fitting = [p for p in plans if p.fits]
    print(f"12-configuration sweep: {wall:.1f} s (target < 600 s: {'met' if wall < 600 else 'MISS'}); "
          f"{len(fitting)} of {len(plans)} fit")
    for p in sorted(fitting, key=lambda p: -p.tokens_per_second):
        step = p.steady_step
        print(f"  {p.configuration.label():40s} step {step['seconds'] * 1e3:9.1f} ms  "
              f"{p.tokens_per_second:10,.0f} tokens/s  MFU {step['mfu']:.1%}  peak {p.peak_bytes / 2**30:.1f} GiB")


_STEP = """
import sys, time, torch, torchneuron
from transformers import LlamaConfig, LlamaForCausalLM
cfg = LlamaConfig(vocab_size=1024, hidden_size=256, intermediate_size=1024, num_hidden_layers=4,
                  num_attention_heads=8, num_key_value_heads=4)
dataless = sys.argv[1] == "1"
ctx = torchneuron.dataless() if dataless else __import__("contextlib").nullcontext()
with ctx:
    model = LlamaForCausalLM(cfg).to("neuron")
    opt = torch.optim.AdamW(model.parameters())
    ids = torch.randint(0, 1024, (4, 256)).to("neuron")
    model(input_ids=ids, labels=ids).loss.backward(); opt.step(); opt.zero_grad()  # warm-up
    start = time.perf_counter()
    for _ in range(3):
        model(input_ids=ids, labels=ids).loss.backward(); opt.step(); opt.zero_grad()
    print((time.perf_counter() - start) / 3)
"""


def baseline(rounds: int = 5) -> None:
    times = {"normal": [], "dataless": []}
    for r in range(rounds):
        order = ("normal", "dataless") if r % 2 == 0 else ("dataless", "normal")
        for mode in order:
            out = subprocess.run([sys.executable, "-c", _STEP, "1" if mode == "dataless" else "0"],
                                 capture_output=True, text=True, check=True)
            times[mode].append(float(out.stdout.strip().splitlines()[-1]))
    normal, dataless = statistics.median(times["normal"]), statistics.median(times["dataless"])
    print(f"small Llama step, host time: normal {normal * 1e3:.1f} ms, dataless {dataless * 1e3:.1f} ms "
          f"(dataless / normal = {dataless / normal:.2f}x, median of {rounds} interleaved rounds)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--skip-sweep", action="store_true")
    args = parser.parse_args()
    plan_once()
    if not args.skip_sweep:
        sweep()
    baseline()


if __name__ == "__main__":
    main()
