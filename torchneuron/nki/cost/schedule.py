"""Scheduling of an NKI kernel run in the cost model: per-core state (``_Core``: engine and
DMA queue availability, shared ports, dependency records, no_reorder scopes), the
``_Scheduler`` that computes each instruction's earliest start from dependencies and places
it on its engine or DMA queues/engines in program order (decisions 6-10), FLOP counting,
and :func:`estimate`, which runs programs serially on one core or on two physical cores
meeting at barriers (decision 14) and summarises the result as a :class:`KernelCost`.
"""

from __future__ import annotations

import gc
import math
from collections import defaultdict
from typing import Any, Sequence

from torchneuron.hardware.specs import ChipSpec, get_chip
from torchneuron.nki.cost.constants import SYNC_OPCODES
from torchneuron.nki.cost.formulas import enum_name, is_set
from torchneuron.nki.cost.model import CostModel
from torchneuron.nki.cost.options import CostOptions
from torchneuron.nki.cost.report import KernelCost, TimelineEvent
from torchneuron.nki.cost.tracking import AllocState, BusyIntervals, dependency_box
from torchneuron.nki.instruction import Engine, Instruction


class _Core:
    """Scheduling state of one physical core."""

    def __init__(self, model: CostModel) -> None:
        self.engine_free: dict[str, float] = defaultdict(float)
        self.fence = 0.0
        self.allocs: dict[int, AllocState] = {}
        e = model.dma_engines
        self.queue_free = [[0.0] * model.options.dma_queues for _ in range(e)]
        shared = BusyIntervals()
        self.dma_busy = [shared] * e  # copy on write (see _Scheduler.commit)
        self.ports = {"sbuf": BusyIntervals(), "psum": BusyIntervals()}
        self.next_engine = 0
        self.next_queue = 0
        self.scope_end: dict[Any, float] = {}
        self.end = 0.0
        self.call_sites: dict[tuple, int] = {}

    def call_site_queue(self, ins: Instruction, queues: int) -> int:
        """Decision 17 what-if: the queue of a DMA's call site (source line, requested trigger
        engine), numbered in order of first use."""
        site = (str(ins.location), str(ins.attrs.get("engine_requested") or ins.attrs.get("engine")))
        return self.call_sites.setdefault(site, len(self.call_sites)) % queues


def _earliest_common_fit(timelines: Sequence[BusyIntervals], t: float, duration: float) -> float:
    """The earliest start at or after ``t`` where every timeline has ``duration`` free
    (each timeline's first fit, repeated until all agree)."""
    while True:
        t_next = t
        for timeline in timelines:
            t_next = timeline.fit(t_next, duration)
        if t_next == t:
            return t
        t = t_next


class _Scheduler:
    """Places instructions and sums what the summary needs as it goes; keeps each placement
    (a :class:`TimelineEvent`) only when ``timeline`` is asked for."""

    def __init__(self, model: CostModel, instructions: Sequence[Instruction], cores: int,
                 timeline: bool = True) -> None:
        self.model = model
        self.cores = [_Core(model) for _ in range(cores)]
        # End times of the instructions a depends_on edge names (only those are looked up).
        self.ends: dict[int, float] = {}
        self.awaited = _awaited(instructions)
        self.timeline = timeline
        self.events: list[TimelineEvent] = []
        self.counts: dict[str, int] = defaultdict(int)
        self.busy: dict[str, float] = defaultdict(float)  # compute engines: occupancy
        self.dma_bytes = 0
        self.written = {o.allocation for ins in instructions for o in ins.writes}
        self.dma_engine_ns = 0.0
        self.flops_by_dtype: dict[str, int] = defaultdict(int)
        self._box_memo: dict[int, tuple[list, list]] = {}

    # -- readiness ---------------------------------------------------------------------
    def _boxes(self, ins: Instruction) -> tuple[list, list]:
        """Dependency boxes of the reads and writes of ``ins`` (memoised for the last few)."""
        boxes = self._box_memo.get(ins.index)
        if boxes is None:
            if len(self._box_memo) > 8:
                self._box_memo.clear()
            boxes = self._box_memo[ins.index] = ([dependency_box(o) for o in ins.reads], [dependency_box(o) for o in ins.writes])
        return boxes

    def ready(self, core: _Core, ins: Instruction) -> float:
        """Earliest start allowed by data dependencies, explicit edges and fences."""
        t = core.fence
        engine = ins.engine
        dep = self.model.dep_ns.get(engine, 0.0)
        allocs = core.allocs
        rboxes, wboxes = self._boxes(ins)
        for o, box in zip(ins.reads, rboxes):  # RAW
            state = allocs.get(o.allocation)
            if state is None or not state.writes:
                continue
            accumulate = engine == Engine.TENSOR and o.buffer == "psum"
            for _, _, (end, wengine) in state.writes.overlapping(box):
                ready = end if (accumulate and wengine == Engine.TENSOR) else end + dep
                if ready > t:
                    t = ready
        for o, box in zip(ins.writes, wboxes):  # WAW, WAR
            state = allocs.get(o.allocation)
            if state is None:
                continue
            for _, _, (end, _) in state.writes.overlapping(box):
                if end > t:
                    t = end
            if state.reads:
                for _, _, end in state.reads.overlapping(box):
                    if end > t:
                        t = end
        attrs = ins.attrs
        if attrs:
            deps = attrs.get("depends_on")
            if deps is not None:
                for d in deps if isinstance(deps, (list, tuple, set, frozenset)) else (deps,):
                    idx = d if isinstance(d, int) else getattr(d, "index", None)
                    end = self.ends.get(idx)
                    if end is not None and end + dep > t:
                        t = end + dep
            scopes = attrs.get("no_reorder")
            if scopes is not None and scopes is not False:
                for s in scopes if isinstance(scopes, (list, tuple)) else (scopes,):
                    end = core.scope_end.get(s)
                    if end is not None and end > t:
                        t = end
        return t

    # -- placement ---------------------------------------------------------------------
    def commit(self, core_id: int, ins: Instruction, ready: float) -> TimelineEvent:
        core = self.cores[core_id]
        model = self.model
        cost = model.cost(ins)
        engine = ins.engine
        queue = None
        data_start = None
        dma_engines: tuple[int, ...] = ()
        if engine == Engine.DMA:
            n_engines = model.dma_engines
            k = cost.dma_engines
            first = core.next_engine
            dma_engines = tuple((first + i) % n_engines for i in range(k))
            core.next_engine = (first + k) % n_engines
            if model.options.dma_queue_per_call_site:
                queue = core.call_site_queue(ins, model.options.dma_queues)
            else:
                queue = core.next_queue
                core.next_queue = (queue + 1) % model.options.dma_queues
            start = ready
            for e in dma_engines:
                if core.queue_free[e][queue] > start:
                    start = core.queue_free[e][queue]
            t = start + cost.fixed_ns
            d = cost.data_ns
            busy = core.dma_busy
            # Engines with identical histories share one BusyIntervals (copy on write): a full-width
            # transfer then searches and books one interval list, not sixteen.
            first_busy = busy[dma_engines[0]]
            objs: list[BusyIntervals] = [first_busy]
            for e in dma_engines:
                b = busy[e]
                if b is not first_busy and not any(b is x for x in objs):
                    objs.append(b)
            t = _earliest_common_fit(objs, t, d)
            data_start = t
            end = t + d
            if k < n_engines:
                inside = set(dma_engines)
                for j, b in enumerate(objs):
                    if any(busy[e] is b for e in range(n_engines) if e not in inside):
                        copy = objs[j] = b.copy()
                        for e in dma_engines:
                            if busy[e] is b:
                                busy[e] = copy
            for b in objs:
                b.add(t, end)
            if len(objs) > 1 and all(objs[0].same(b) for b in objs[1:]):
                for e in dma_engines:
                    busy[e] = objs[0]
            # A queue runs its transfers in order: the next one starts when this one ends, or
            # (decision 17 what-if) when this one's fixed cost is paid.
            release = start + cost.fixed_ns if model.options.dma_queue_per_call_site else end
            for e in dma_engines:
                core.queue_free[e][queue] = release
            self.dma_engine_ns += d * k
        else:
            start = max(ready, core.engine_free[engine])
            d = cost.ns
            ports = self._ports(core, ins) if model.gen == 2 else ()
            if ports:
                start = _earliest_common_fit(ports, start, d)
                for port in ports:
                    port.add(start, start + d)
            end = start + d
            core.engine_free[engine] = end
        self._record(core, ins, end)
        if end > core.end:
            core.end = end
        flops = _flops(ins) if engine == Engine.TENSOR or ins.flops else 0
        if flops:
            self.flops_by_dtype[_flops_dtype(ins)] += flops
        event = TimelineEvent(engine, queue, core_id, ins.program, start, end, ins.opcode, ins.index,
                              ins.location, cost.formula, flops, cost.bytes, data_start, dma_engines)
        self.counts[engine] += 1
        if engine == Engine.DMA:
            self.dma_bytes += cost.bytes
        else:
            self.busy[engine] += end - start
        if self.timeline:
            self.events.append(event)
        return event

    @staticmethod
    def _ports(core: _Core, ins: Instruction) -> list[BusyIntervals]:
        """Decision 9 / facts 7: v2 shared SBUF (VectorE, GpSimd) and PSUM (VectorE, ScalarE) access."""
        engine = ins.engine
        if engine not in (Engine.VECTOR, Engine.GPSIMD, Engine.SCALAR):
            return []
        buffers = {o.buffer for o in ins.reads} | {o.buffer for o in ins.writes}
        ports = []
        if engine in (Engine.VECTOR, Engine.GPSIMD) and "sbuf" in buffers:
            ports.append(core.ports["sbuf"])
        if engine in (Engine.VECTOR, Engine.SCALAR) and "psum" in buffers:
            ports.append(core.ports["psum"])
        return ports

    def _record(self, core: _Core, ins: Instruction, end: float) -> None:
        if ins.index in self.awaited:
            self.ends[ins.index] = end
        allocs = core.allocs
        written = self.written
        engine = ins.engine
        rboxes, wboxes = self._boxes(ins)
        for o, box in zip(ins.reads, rboxes):
            if o.allocation not in written:
                continue  # never written: no hazard can involve it
            state = allocs.get(o.allocation)
            if state is None:
                state = allocs[o.allocation] = AllocState()
            if state.reads.get(box, -1.0) < end:
                state.reads.put(box, end)
        for o, box in zip(ins.writes, wboxes):
            state = allocs.get(o.allocation)
            if state is None:
                state = allocs[o.allocation] = AllocState()
            # This write ended after every overlapping earlier access (it depended on them):
            # records it fully covers are superseded.
            if state.writes.keys:
                state.writes.prune(box, None)
            if state.reads.keys:
                state.reads.prune(box, end)
            state.writes.put(box, (end, engine))
        scopes = ins.attrs.get("no_reorder") if ins.attrs else None
        if scopes is not None and scopes is not False:
            for s in scopes if isinstance(scopes, (list, tuple)) else (scopes,):
                core.scope_end[s] = end

    def run(self, core_id: int, ins: Instruction) -> TimelineEvent:
        return self.commit(core_id, ins, self.ready(self.cores[core_id], ins))


def _awaited(instructions: Sequence[Instruction]) -> set[int]:
    """Indices that ``depends_on`` edges of ``instructions`` name (decision 8)."""
    awaited: set[int] = set()
    for ins in instructions:
        deps = ins.attrs.get("depends_on") if ins.attrs else None
        if deps is not None:
            for d in deps if isinstance(deps, (list, tuple, set, frozenset)) else (deps,):
                awaited.add(d if isinstance(d, int) else getattr(d, "index", None))
    return awaited


def _flops(ins: Instruction) -> int:
    if ins.flops:
        return int(ins.flops)
    if ins.engine == Engine.TENSOR and ins.opcode in ("nc_matmul", "matmul") \
            and not is_set(ins.attrs.get("is_transpose")):
        sbuf = [o for o in ins.reads if o.buffer == "sbuf"]
        dst = ins.writes[0] if ins.writes else None
        if len(sbuf) >= 2 and dst is not None:
            k = sbuf[0].partitions * (2 if enum_name(ins.attrs.get("perf_mode")) == "double_row" else 1)
            return 2 * k * dst.partitions * dst.free_elements  # decision 15
    return 0


def _flops_dtype(ins: Instruction) -> str:
    """The input dtype whose TensorE peak applies to ``ins`` (fp32 if either input is fp32)."""
    sbuf = [o for o in ins.reads if o.buffer == "sbuf"] or list(ins.reads)
    if any(o.dtype == "float32" for o in sbuf[:2]):
        return "float32"
    return sbuf[0].dtype if sbuf else "bfloat16"


def estimate(run: Any, target: str | ChipSpec | None = None, *, lnc: int | None = None,
             grid: tuple[int, ...] | None = None, options: CostOptions | None = None,
             kernel_name: str | None = None, timeline: bool = True) -> KernelCost:
    """Model the execution of a kernel run.

    Args:
        run: a :class:`~torchneuron.nki.context.KernelRun` (its target, LNC and grid are used)
            or a sequence of :class:`Instruction` records (then ``target`` is required).
        target: chip name or :class:`ChipSpec`; overrides the run's target.
        lnc: 1, or 2 to run programs 0 and 1 on two physical cores.
        grid: the launch grid (programs); defaults to the run's.
        options: :class:`CostOptions` (e.g. another DMA figure set).
        timeline: keep every instruction's placement (``KernelCost.events``: the timeline,
            the costliest lines of the report, the Chrome trace). ``False`` sums latency,
            busy time, counts, FLOPs and bytes as the schedule goes and keeps no events: what
            accounting needs from a long kernel, without a record per instruction.
    """
    if isinstance(run, (list, tuple)):
        instructions: Sequence[Instruction] = run
        chip = target
        run_lnc, run_grid, name = 1, None, kernel_name or "kernel"
    else:
        instructions = run.instructions
        chip = target if target is not None else run.target
        run_lnc, run_grid, name = run.lnc, run.grid, kernel_name or run.kernel_name
    if chip is None:
        raise TypeError("estimate(instructions) needs target= (a chip name such as 'trn2' or a ChipSpec)")
    chip = get_chip(chip) if isinstance(chip, str) else chip
    lnc = int(lnc if lnc is not None else run_lnc or 1)
    if lnc not in (1, 2):
        raise ValueError(f"lnc must be 1 or 2, got {lnc}")
    model = CostModel(chip, options or CostOptions())
    by_program: dict[int, list[Instruction]] = defaultdict(list)
    for ins in instructions:
        by_program[ins.program].append(ins)
    for lst in by_program.values():
        lst.sort(key=lambda i: i.index)
    programs = max(math.prod(grid or run_grid or (1,)), len(by_program))
    cores = lnc if lnc > 1 else 1
    scheduler = _Scheduler(model, instructions, cores, timeline)
    collecting = gc.isenabled()
    gc.disable()  # the schedule allocates many small acyclic objects; cyclic GC passes only cost time
    try:
        if cores == 1:
            # Decision 14: legacy SPMD programs run one after another on one core.
            for program in sorted(by_program):
                core = scheduler.cores[0]
                core.fence = core.end
                for ins in by_program[program]:
                    scheduler.run(0, ins)
        else:
            _run_lnc(scheduler, by_program, cores)
    finally:
        if collecting:
            gc.enable()
    latency = max((c.end for c in scheduler.cores), default=0.0)
    busy, counts, dma_bytes = scheduler.busy, scheduler.counts, scheduler.dma_bytes
    if counts.get(Engine.DMA):
        busy[Engine.DMA] = scheduler.dma_engine_ns / model.dma_engines
    flops_by_dtype = scheduler.flops_by_dtype
    total_flops = sum(flops_by_dtype.values())
    flops_dtype = max(flops_by_dtype, key=flops_by_dtype.get) if flops_by_dtype else None
    peak = (chip.tensor_flops_per_second(flops_dtype) if flops_dtype else None) or chip.tensor_bf16_flops_per_second
    return KernelCost(
        kernel_name=name, target=chip.name, neuroncore=chip.neuroncore_version, lnc=lnc, programs=programs,
        cores=cores, latency_ns=latency, engine_busy_ns=dict(busy), instruction_counts=dict(counts),
        flops=total_flops, flops_dtype=flops_dtype, peak_flops_per_second=peak, dma_bytes=dma_bytes,
        peak_dma_bytes_per_second=model.peak_dma * 1e9, events=scheduler.events)


def _run_lnc(scheduler: _Scheduler, by_program: dict[int, list[Instruction]], cores: int) -> None:
    """Decision 14 / 7: programs on separate physical cores, meeting at core_barrier / sendrecv."""
    streams: dict[int, list[Instruction]] = {c: [] for c in range(cores)}
    for program in sorted(by_program):
        streams[program % cores].extend(by_program[program])
    position = {c: 0 for c in streams}
    while True:
        for c, lst in streams.items():
            i = position[c]
            while i < len(lst) and lst[i].opcode not in SYNC_OPCODES:
                scheduler.run(c, lst[i])
                i += 1
            position[c] = i
        waiting = [(c, streams[c][position[c]]) for c in streams if position[c] < len(streams[c])]
        if not waiting:
            return
        ready = {}
        for c, ins in waiting:
            core = scheduler.cores[c]
            t = scheduler.ready(core, ins)
            if ins.engine != Engine.DMA:
                t = max(t, core.engine_free[ins.engine])
            ready[c] = t
        common = max(ready.values())
        events = [scheduler.commit(c, ins, common) for c, ins in waiting]
        done = max(e.end_ns for e in events)  # the barrier completes when the last core arrives
        for c, _ in waiting:
            core = scheduler.cores[c]
            core.fence = max(core.fence, done)
            core.end = max(core.end, done)
            position[c] += 1
