"""One planned rank: runs the user's script dataless as that rank of a simulated job and
writes what it saw (steps, memory, collectives, reads) to a JSON file.

    python -m torchneuron.plan.worker RESULT.json STEPS [-m MODULE | SCRIPT] [ARGS...]

``{rank}`` in RESULT.json is replaced by the rank's number: under ``torchrun`` (without a
simulated world) each real rank writes its own file, measured exactly as a planned one.

The parent (:mod:`torchneuron.plan.planner`) sets the rank's environment
(:meth:`torchneuron.plan.world.World.environment`) before this interpreter starts, so the
instance type, LNC, dataless execution and the simulated world are in force when the device
registers. Whatever the script does (``sys.exit``, an exception, running out of device
memory) ends up in the file; ``STEPS`` > 0 stops the script after that many optimizer steps.
"""

from __future__ import annotations

import json
import os
import runpy
import sys
import time
from typing import Any

SCHEMA = "torchneuron-plan-rank/1"


def _meshes() -> list[dict[str, Any]]:
    return list(_seen_meshes)


_seen_meshes: list[dict[str, Any]] = []


def _watch_device_meshes() -> None:
    """Notes each ``init_device_mesh`` call's shape and dimension names (the job's layout)."""
    from torch.distributed import device_mesh

    original = device_mesh.init_device_mesh

    def init_device_mesh(device_type: str, mesh_shape: tuple[int, ...], *args: Any, **kwargs: Any) -> Any:
        mesh = original(device_type, mesh_shape, *args, **kwargs)
        names = kwargs.get("mesh_dim_names") or (args[0] if args else None)
        _seen_meshes.append({"shape": [int(s) for s in mesh_shape],
                             "names": list(names) if names else None})
        return mesh

    device_mesh.init_device_mesh = init_device_mesh


def run(result_path: str, steps: int, module: str | None, script: str | None, args: list[str]) -> None:
    import torch

    import torchneuron  # noqa: F401 (registers the device; dataless is on from the setting)
    from torchneuron.device import accounting, dataless, dataless_files
    from torchneuron.profiler.outcome import StopAfterSteps, exit_outcome, failure_outcome
    from torchneuron.plan import simulated
    from torchneuron.plan.inference import ForwardTracker
    from torchneuron.plan.steps import StepTracker
    from torchneuron.plan.trace import step_trace_events
    from torchneuron.plan.world import World  # noqa: F401

    from torchneuron import config

    if config.get_flag("TORCHNEURON_SIMULATED_WORLD"):
        simulated.install()  # else a real rank (under torchrun): measured the same way
    _watch_device_meshes()
    from torchneuron.plan import pipeline_watch

    pipeline_watch.install()

    from torchneuron.distributed import local_device

    device = local_device()  # neuron:LOCAL_RANK, or neuron:0 when the rank sees its own core only
    local_rank = device.index if device is not None else 0
    torch.neuron.set_device(local_rank)
    accounting.reset()
    dataless.reset()
    tracker = StepTracker(local_rank)
    forwards = ForwardTracker(local_rank)

    def stop_when_done(*_: Any) -> None:
        if steps and len(tracker.steps) >= steps:
            raise StopAfterSteps()

    from torch.optim.optimizer import register_optimizer_step_post_hook

    outcome: dict[str, Any] = {"status": "completed"}
    torch.neuron.memory._record_memory_history("state", context="state", stacks="python")
    started = time.perf_counter()
    with accounting.pinned_cost_cache():
        tracker.install()
        forwards.install()
        stopper = register_optimizer_step_post_hook(stop_when_done)  # after the tracker's hook
        try:
            if module is not None:
                sys.argv = [module, *args]
                runpy.run_module(module, run_name="__main__", alter_sys=True)
            else:
                sys.argv = [script, *args]
                sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
                runpy.run_path(script, run_name="__main__")
        except StopAfterSteps:
            outcome = {"status": "stopped", "detail": f"stopped after {steps} optimizer steps"}
        except SystemExit as e:
            outcome = exit_outcome(e.code) or outcome
        except BaseException as e:  # noqa: BLE001 (the script's failure is the plan's subject)
            outcome = failure_outcome(e, traceback_chars=6000)
        finally:
            stopper.remove()
            tracker.remove()
            forwards.remove()
            torch.neuron.memory._record_memory_history(None)
        trained = bool(tracker.steps)
        if not tracker.steps and outcome["status"] != "failed":
            tracker.close_step()  # no optimizer: the whole script is one step (inference)
    result = {
        "schema": SCHEMA,
        "rank": config.value("RANK") or 0,
        "world_size": config.value("WORLD_SIZE") or 1,
        "device": local_rank,
        "capacity_bytes": torch.neuron.get_device_properties(local_rank).total_memory,
        "outcome": outcome,
        "steps": [s.as_dict() for s in tracker.steps],
        "peak_reserved_bytes": torch.neuron.max_memory_reserved(local_rank),
        "device_meshes": _meshes(),
        "pipeline": pipeline_watch.summary(),
        "inference": forwards.summary() if not trained else None,
        "data_reads": [vars(r) | {"shape": list(r.shape)} for r in dataless.reads()],
        "data_dependent_shapes": [vars(s) for s in dataless.data_dependent_shapes()],
        "skipped_writes": [vars(w) for w in dataless_files.skipped_writes()],
        "object_collectives": [{"function": f, "site": site, "calls": n}
                               for f, site, n in simulated.object_collectives()],
        "collectives": [{"name": w.name, "calls": w.calls, "seconds": w.modeled_seconds, "bytes": w.bytes}
                        for w in accounting.work_totals(accounting.WorkKind.COLLECTIVE)],
        "trace": step_trace_events(tracker.last_step_events, config.value("RANK") or 0),
        "settings": config.environ(),  # every torchneuron setting in force in this rank
        "host_seconds": time.perf_counter() - started,
        "host_peak_rss_bytes": _peak_rss(),
    }
    result_path = result_path.replace("{rank}", str(result["rank"]))
    tmp = result_path + ".part"
    with open(tmp, "w") as f:
        json.dump(result, f)
    os.replace(tmp, result_path)


def _peak_rss() -> int:
    """This process's peak resident memory: the kernel's high-water mark of its own address space
    (``VmHWM``). Not ``getrusage``'s ``ru_maxrss``, which Linux carries across ``execve`` from the
    forked parent, so a worker started by a large process reported the parent's size."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # no procfs: Linux's figure, in KiB


def main(argv: list[str]) -> int:
    result_path, steps, rest = argv[0], int(argv[1]), argv[2:]
    if rest[:1] == ["-m"]:
        run(result_path, steps, rest[1], None, rest[2:])
    else:
        run(result_path, steps, None, rest[0], rest[1:])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
