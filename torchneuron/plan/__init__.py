"""Full-scale planning on dataless runs: ``torchneuron plan``.

The user's script runs unmodified, dataless (:mod:`torchneuron.device.dataless`), as a
representative rank of a job of many instances (:mod:`.world`, :mod:`.simulated`); what the
record saw of its steps (:mod:`.steps`) gives each configuration's step time and its parts,
tokens/s, MFU and memory at the peak (:mod:`.planner`), and a sweep over the script's
arguments (:mod:`.sweep`) ranks configurations (:mod:`.report`).
"""

from __future__ import annotations

from torchneuron.plan.planner import Configuration, ConfigurationPlan, plan_configurations
from torchneuron.plan.sweep import parse_sweep, substitutions
from torchneuron.plan.world import World

__all__ = ["Configuration", "ConfigurationPlan", "World", "plan", "plan_configurations", "parse_sweep",
           "substitutions"]


def plan(command: list[str], *, instances: list[str] | None = None, nodes: list[int] | None = None,
         lnc: int | None = None, nproc_per_node: int | None = None, sweep: str | None = None, env: dict[str, str] | None = None,
         steps: int = 0, jobs: int | None = None, tokens_per_step: int | None = None) -> list[ConfigurationPlan]:
    """Plans ``command`` (``["train.py", "--tp", "{tp}"]`` or ``["-m", "module", ...]``) on every
    instance type and instance count given, for every combination of the sweep."""
    if not command:
        raise ValueError("torchneuron plan needs a script to run: torchneuron plan [options] -- train.py [args]")
    target, args = (command[:2], command[2:]) if command[0] == "-m" else (command[:1], command[1:])
    if target[0] != "-m":
        import os

        if not os.path.isfile(target[0]):
            raise FileNotFoundError(f"no script {target[0]!r} to plan")
    worlds = [World(instance, n, lnc, nproc_per_node) for instance in (instances or ["trn2.48xlarge"]) for n in (nodes or [1])]
    configurations = [Configuration.of(world, target, s) for world in worlds
                      for s in substitutions(parse_sweep(sweep), args, env or {})]
    return plan_configurations(configurations, steps=steps, jobs=jobs, tokens_per_step=tokens_per_step)
