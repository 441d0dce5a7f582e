"""What-if for the NKI DMA calibration (docs/nki.md, "DMA calibration"): the matmul tutorial's
four levels with the published DMA efficiency curve charged to a DMA *ring* instead of the engine.

    python benchmarks/nki_dma_rings.py [--levels-shape K M N]

AWS's runtime documentation says "DMA engines process descriptors from up to 16 DMA rings in
HBM using a round-robin arbitration scheme. Arbitration transitions between rings only at
packet boundaries" (aws-neuron-sdk ``neuron-runtime/explore/compute-comm-overlap.rst``), so
transfers on different rings of one engine interleave. The published efficiency curve was
measured on one stream of transfers, so it cannot say whether its per-transfer floor (~850 ns
per engine on NeuronCore-v3 below 2 KiB per partition) occupies the engine or only the ring.
This script costs the tutorial's levels (trn1, shape-only runs) with the floor on the ring:

* a transfer waits for its ring (transfers of one ring run in order), then occupies the ring for
  ``bytes / (rate x curve efficiency)`` (the published curve, as in the default model) and each of
  its engines only for ``bytes / rate`` (the table rate), shared by all rings;
* rings are taken per trigger engine and direction (loads / stores: the published queue naming,
  ``qSyncIO0``) or per call site (one ring per ``nl.load`` line: no published source).

Its numbers are quoted in docs/nki.md; the default model is not changed by them (neither
assignment meets +-25% on every level). It uses the scheduler's internals (``_Scheduler``), so
it lives here, not in the package.
"""

from __future__ import annotations

import argparse
import importlib.util
import pathlib
import sys
from typing import Any

import numpy as np

import torchneuron.nki as nki
import torchneuron.nki.language as nl
import torchneuron.nki.typing as nt
from torchneuron.nki import benchmarking
from torchneuron.nki.cost import schedule
from torchneuron.nki.cost.model import CostModel
from torchneuron.nki.cost.options import CostOptions
from torchneuron.nki.cost.report import TimelineEvent
from torchneuron.nki.instruction import Engine, Instruction

ROOT = pathlib.Path(__file__).resolve().parents[1]
TUTORIAL_SHAPE = (8192, 4096, 8192)  # K, M, N: [4096, 8192] x [8192, 8192]
PUBLISHED_TRN1_MS = {"tiled": 51.80, "hoisted loads": 42.96, "blocked": 22.07, "fully optimized": 6.97}


class RingScheduler(schedule._Scheduler):
    """The default scheduler, with DMA transfers placed on rings (module docstring)."""

    per_call_site = False

    def __init__(self, model: CostModel, instructions: Any, cores: int) -> None:
        super().__init__(model, instructions, cores)
        # the same transfers without the curve (decision 17's option sets efficiency 1): bytes / rate
        self.bytes_model = CostModel(model.chip, CostOptions(dma_queue_per_call_site=True))
        self.ring_free: dict[tuple, list[float]] = {}

    def ring(self, ins: Instruction) -> tuple:
        if self.per_call_site:
            return str(ins.location), str(ins.attrs.get("engine_requested"))
        loads = any(o.buffer not in ("sbuf", "psum") for o in ins.reads)
        return str(ins.attrs.get("engine_requested") or "sync"), "in" if loads else "out"

    def commit(self, core_id: int, ins: Instruction, ready: float) -> TimelineEvent:
        if ins.engine != Engine.DMA:
            return super().commit(core_id, ins, ready)
        core, model = self.cores[core_id], self.model
        cost = model.cost(ins)
        data_ns = self.bytes_model.cost(ins).data_ns
        n, k = model.dma_engines, cost.dma_engines
        engines = tuple((core.next_engine + i) % n for i in range(k))
        core.next_engine = (core.next_engine + k) % n
        ring = self.ring(ins)
        ring_free = self.ring_free.setdefault((core_id, ring), [0.0] * n)
        start = max([ready + cost.fixed_ns] + [ring_free[e] for e in engines])
        timelines = []
        for e in engines:
            if not any(core.dma_busy[e] is t for t in timelines):
                timelines.append(core.dma_busy[e])
        if k < n:  # engines outside this transfer keep their own (shared) history
            for j, shared in enumerate(timelines):
                if any(core.dma_busy[e] is shared for e in range(n) if e not in engines):
                    timelines[j] = shared.copy()
                    for e in engines:
                        if core.dma_busy[e] is shared:
                            core.dma_busy[e] = timelines[j]
        data_start = schedule._earliest_common_fit(timelines, start, data_ns)
        for t in timelines:
            t.add(data_start, data_start + data_ns)
        end = max(start + cost.data_ns, data_start + data_ns)
        for e in engines:
            ring_free[e] = end
        self.dma_engine_ns += data_ns * k
        self._record(core, ins, end)
        core.end = max(core.end, end)
        event = TimelineEvent(Engine.DMA, None, core_id, ins.program, ready, end, ins.opcode, ins.index,
                              ins.location, cost.formula + " (ring what-if)", 0, cost.bytes, data_start, engines)
        self.events.append(event)
        return event


def ring_estimate(run: Any, per_call_site: bool) -> float:
    """Modelled trn1 latency (ms) of ``run`` with the ring what-if."""
    original = schedule._Scheduler
    RingScheduler.per_call_site = per_call_site
    schedule._Scheduler = RingScheduler
    try:
        return nki.estimate(run, target="trn1").latency_seconds * 1e3
    finally:
        schedule._Scheduler = original


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--levels-shape", type=int, nargs=3, metavar=("K", "M", "N"), default=TUTORIAL_SHAPE)
    K, M, N = parser.parse_args().levels_shape
    spec = importlib.util.spec_from_file_location("nki_example_matmul", ROOT / "examples" / "nki" / "matmul.py")
    mm = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mm)
    tutorial = (K, M, N) == TUTORIAL_SHAPE
    print(f"trn1, lhsT [{K}, {M}] x rhs [{K}, {N}] bf16, shape-only runs; error against the published latency"
          + ("" if tutorial else " (n/a: not the tutorial shape)"))
    print(f"{'level':<16} {'default':>16} {'ring per trigger':>18} {'ring per call site':>20} {'published':>10}")
    for name, kernel in mm.LEVELS.items():
        args = (nt.tensor[[K, M], nl.bfloat16], nt.tensor[[K, N], nl.bfloat16])
        with np.errstate(all="ignore"):  # shape-only: instructions that still compute see unset storage
            _, run = benchmarking.run_kernel(kernel, args, {}, target="trn1", compute_values=False)
        times = (nki.estimate(run, target="trn1").latency_seconds * 1e3, ring_estimate(run, False),
                 ring_estimate(run, True))
        kernel.last_run = run = None  # free the run before the next level
        published = PUBLISHED_TRN1_MS[name]
        cells = [f"{t:.2f} ms" + (f" ({(t - published) / published:+.0%})" if tutorial else "") for t in times]
        print(f"{name:<16} {cells[0]:>16} {cells[1]:>18} {cells[2]:>20} {published:>7.2f} ms", flush=True)


if __name__ == "__main__":
    sys.exit(main())
