"""Plans a job: each configuration's representative rank runs dataless in a worker process,
and the job's step time, throughput, MFU and memory follow from what it recorded.

Representative ranks: a symmetric job (data parallel, FSDP, tensor/sequence parallel) does
the same work on every rank up to which shard it holds, so rank 0 stands for all of them;
the plan says so (:attr:`ConfigurationPlan.represents`). Each worker is a fresh interpreter
(the instance type and LNC must be set before the device registers, and nothing the script
does can reach the planner); configurations run in parallel, as many at a time as ``jobs``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from torchneuron.plan.sweep import Substitution
from torchneuron.plan.world import World

__all__ = ["Configuration", "ConfigurationPlan", "plan_configurations", "WORKER_TIMEOUT_SECONDS"]

WORKER_TIMEOUT_SECONDS = 3600
_MODEL_PARALLEL_DIMS = ("tp", "pp")  # mesh dimensions whose ranks share their tokens


@dataclass(frozen=True)
class Configuration:
    """One job to plan: the world, the script's arguments and extra environment."""

    world: World
    command: tuple[str, ...]  # the script (or -m module) and its arguments
    env: tuple[tuple[str, str], ...] = ()
    values: tuple[tuple[str, str], ...] = ()  # the sweep's values, for labels

    @staticmethod
    def of(world: World, target: list[str], substitution: Substitution) -> "Configuration":
        return Configuration(world, tuple(target) + substitution.args, substitution.env, substitution.values)

    def label(self) -> str:
        values = " ".join(f"{k}={v}" for k, v in self.values)
        return f"{self.world.nodes} x {self.world.instance}" + (f", {values}" if values else "")


@dataclass
class ConfigurationPlan:
    """What planning one configuration found (seconds are modelled Trainium time)."""

    configuration: Configuration
    rank: dict[str, Any]  # rank 0's worker result (worker.SCHEMA)
    represents: str
    tokens_per_step_override: int | None = None
    notes: list[str] = field(default_factory=list)
    # Pipeline parallelism: every stage's representative (rank 0's first), and the schedule's
    # timeline (makespan, per pipeline rank busy time and bubble).
    stage_ranks: list[dict[str, Any]] = field(default_factory=list)
    pipeline: dict[str, Any] | None = None

    @property
    def status(self) -> str:
        return self.rank.get("outcome", {}).get("status", "failed")

    @property
    def out_of_memory(self) -> dict[str, Any] | None:
        return self.rank.get("outcome", {}).get("out_of_memory")

    @property
    def steady_step(self) -> dict[str, Any] | None:
        """The last step (the first also pays for model set-up and lazy state); with pipeline
        stages, the job's step: the slowest stage's own step plus its bubble."""
        steps = self.rank.get("steps") or []
        if not steps:
            return None
        if self.pipeline is None:
            return steps[-1]
        slowest = max(self.pipeline["stage_steps"], key=lambda s: s["seconds"])
        return slowest

    @property
    def peak_bytes(self) -> int:
        ranks = self.stage_ranks or [self.rank]
        return max((s["peak_bytes"] for r in ranks for s in (r.get("steps") or [])), default=0)

    @property
    def capacity_bytes(self) -> int:
        return int(self.rank.get("capacity_bytes", 0))

    @property
    def fits(self) -> bool:
        return self.out_of_memory is None and self.status != "failed" and self.peak_bytes <= self.capacity_bytes

    def _model_parallel_degree(self) -> int:
        degree = 1
        for mesh in self.rank.get("device_meshes") or []:
            names = mesh.get("names") or []
            for name, size in zip(names, mesh["shape"]):
                if name in _MODEL_PARALLEL_DIMS:
                    degree *= size
            if names:
                break  # the job's layout: the first named mesh
        return degree

    @property
    def tokens_per_step(self) -> int:
        """Tokens the whole job processes per step: the override, else this rank's tokens times
        the ranks that see other tokens (the world over its tensor- and pipeline-parallel degrees)."""
        if self.tokens_per_step_override is not None:
            return self.tokens_per_step_override
        steps = self.rank.get("steps") or []  # rank 0: the first pipeline stage, which embeds
        if not steps:
            return 0
        world = int(self.rank.get("world_size", 1))
        return steps[-1]["tokens"] * world // max(self._model_parallel_degree(), 1)

    @property
    def tokens_per_second(self) -> float:
        step = self.steady_step
        return self.tokens_per_step / step["seconds"] if step and step["seconds"] > 0 else 0.0

    def as_dict(self) -> dict[str, Any]:
        step = self.steady_step
        return {
            "configuration": {"label": self.configuration.label(), "instance": self.configuration.world.instance,
                              "nodes": self.configuration.world.nodes, "lnc": self.configuration.world.lnc,
                              "world_size": self.configuration.world.world_size,
                              "values": dict(self.configuration.values),
                              "command": list(self.configuration.command), "env": dict(self.configuration.env)},
            "status": self.status, "fits": self.fits, "represents": self.represents,
            "step": step, "tokens_per_step": self.tokens_per_step, "tokens_per_second": self.tokens_per_second,
            "peak_bytes": self.peak_bytes, "capacity_bytes": self.capacity_bytes,
            "out_of_memory": self.out_of_memory, "notes": self.notes, "rank": self.rank,
            "pipeline": self.pipeline, "inference": self.rank.get("inference"),
            "stage_ranks": [r for r in self.stage_ranks[1:]],
        }


def _run_worker(configuration: Configuration, rank: int, steps: int, directory: str) -> dict[str, Any]:
    world = configuration.world
    result_path = os.path.join(directory, f"rank{rank}-{abs(hash(configuration))}.json")
    env = {**os.environ, **world.environment(rank), **dict(configuration.env)}  # the worker's: ours, plus the rank's
    if "NEURON_RT_VISIBLE_CORES" not in world.environment(rank):
        env.pop("NEURON_RT_VISIBLE_CORES", None)  # the rank sees its instance's devices, as on the instance
    command = [sys.executable, "-m", "torchneuron.plan.worker", result_path, str(steps), *configuration.command]
    try:
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=WORKER_TIMEOUT_SECONDS)
    except subprocess.TimeoutExpired:
        return {"outcome": {"status": "failed", "exception_type": "TimeoutExpired",
                            "exception": f"planning rank {rank} took more than {WORKER_TIMEOUT_SECONDS} s"}}
    if os.path.exists(result_path):
        with open(result_path) as f:
            result = json.load(f)
        result["stdout_tail"] = done.stdout[-2000:]
        return result
    return {"outcome": {"status": "failed", "exception_type": "WorkerCrashed",
                        "exception": f"the planning worker for rank {rank} ended with status {done.returncode} "
                                     f"before writing its result; its last output:\n{done.stderr[-3000:]}"}}


def plan_configurations(configurations: list[Configuration], *, steps: int = 0, jobs: int | None = None,
                        tokens_per_step: int | None = None) -> list[ConfigurationPlan]:
    """Plans every configuration (``jobs`` at a time, default: one per core)."""
    jobs = max(1, jobs or os.cpu_count() or 1)
    with tempfile.TemporaryDirectory(prefix="torchneuron-plan-") as directory:
        with ThreadPoolExecutor(max_workers=min(jobs, len(configurations))) as pool:
            results = list(pool.map(lambda c: _run_worker(c, 0, steps, directory), configurations))
        plans = []
        for configuration, result in zip(configurations, results):
            world = configuration.world.world_size
            represents = ("rank 0 (the only rank)" if world == 1 else
                          f"rank 0 stands for ranks 0-{world - 1}: the job is taken as symmetric "
                          "(each rank does rank 0's work on its own shard)")
            plans.append(ConfigurationPlan(configuration, result, represents, tokens_per_step))
        staged = [p for p in plans if (p.rank.get("pipeline") or {}).get("num_stages", 0) > 1
                  and p.status != "failed"]
        others = [(p, r) for p in staged for r in p.rank["pipeline"]["group_ranks"][1:]]
        with ThreadPoolExecutor(max_workers=max(1, min(jobs, len(others)))) as pool:
            extra = list(pool.map(lambda pr: _run_worker(pr[0].configuration, pr[1], steps, directory), others))
        for p in staged:
            p.stage_ranks = [p.rank] + [result for (q, _), result in zip(others, extra) if q is p]
            _time_pipeline(p)
    return plans


def _time_pipeline(p: ConfigurationPlan) -> None:
    """Each stage's representative ran its own stages; the schedule's timeline adds the waiting
    (the bubble) that no single rank sees in a simulated job."""
    from torchneuron.plan.pipeline_model import simulate

    info = p.rank["pipeline"]
    failed = [r for r in p.stage_ranks if r.get("outcome", {}).get("status") == "failed"]
    if failed:
        p.rank = {**failed[0], "steps": p.rank.get("steps", [])}
        return
    durations: dict[tuple[int, str], float] = {}
    for result in p.stage_ranks:
        for key, seconds in ((result.get("pipeline") or {}).get("durations") or {}).items():
            stage, kind = key.split(":")
            durations[(int(stage), kind)] = seconds
    sends = [c for c in p.rank.get("collectives", []) if c["name"].startswith("send_recv")]
    transfer = sum(c["seconds"] for c in sends) / max(1, sum(c["calls"] for c in sends))
    # Each representative's own order of compute actions, as its first step ran them; the
    # schedule's declared order where a representative recorded none.
    order = {int(rank): actions for rank, actions in info["order"].items()}
    for pp_rank, result in enumerate(p.stage_ranks):
        executed = (result.get("pipeline") or {}).get("executed")
        if executed:
            order[pp_rank] = executed
    timeline = simulate(order, durations, info["num_stages"], transfer)
    stage_steps = []
    for pp_rank, result in enumerate(p.stage_ranks):
        steps = result.get("steps") or []
        if not steps:
            continue
        step = dict(steps[-1])
        step["bubble_seconds"] = timeline.bubble.get(pp_rank, 0.0)
        step["seconds"] = step["seconds"] + step["bubble_seconds"]
        step["exposed_collective_seconds"] = max(0.0, step["seconds"] - step["compute_seconds"]
                                                 - step["bubble_seconds"])
        if step["seconds"] > 0:
            step["mfu"] = step["mfu"] * (step["seconds"] - step["bubble_seconds"]) / step["seconds"]
        step["pipeline_rank"] = pp_rank
        stage_steps.append(step)
    p.pipeline = {"schedule": info["schedule"], "num_stages": info["num_stages"],
                  "n_microbatches": info["n_microbatches"], "makespan_seconds": timeline.makespan,
                  "busy_seconds": timeline.busy, "bubble_seconds": timeline.bubble,
                  "transfer_seconds": transfer, "durations": {f"{s}:{k}": v for (s, k), v in durations.items()},
                  "stage_steps": stage_steps, "representatives": info["group_ranks"]}
    ranks = info["group_ranks"]
    p.represents = (f"one rank per pipeline stage: ranks {', '.join(map(str, ranks))} (the pipeline group of "
                    f"rank 0); each stands for the ranks of its stage, taken as symmetric")
