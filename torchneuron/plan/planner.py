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
    rank: dict[str, Any]  # the representative rank's worker result (worker.SCHEMA)
    represents: str
    tokens_per_step_override: int | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def status(self) -> str:
        return self.rank.get("outcome", {}).get("status", "failed")

    @property
    def out_of_memory(self) -> dict[str, Any] | None:
        return self.rank.get("outcome", {}).get("out_of_memory")

    @property
    def steady_step(self) -> dict[str, Any] | None:
        """The last step (the first also pays for model set-up and lazy state)."""
        steps = self.rank.get("steps") or []
        return steps[-1] if steps else None

    @property
    def peak_bytes(self) -> int:
        steps = self.rank.get("steps") or []
        return max((s["peak_bytes"] for s in steps), default=0)

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
        step = self.steady_step
        if step is None:
            return 0
        world = int(self.rank.get("world_size", 1))
        return step["tokens"] * world // max(self._model_parallel_degree(), 1)

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
        }


def _run_worker(configuration: Configuration, rank: int, steps: int, directory: str) -> dict[str, Any]:
    world = configuration.world
    result_path = os.path.join(directory, f"rank{rank}-{abs(hash(configuration))}.json")
    env = {**os.environ, **world.environment(rank), **dict(configuration.env)}
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
    return plans
