"""The child process of ``torchneuron check``: runs the user's script on neuron and
writes what the accounting record saw to a JSON file for the parent to report.

Run in its own interpreter so that the modelled chip and LNC (``--target``,
``--lnc``) are set before the device registers, and so that whatever the script
does (``sys.exit``, ``os.chdir``, an exception, a crash) cannot take the report
down with it: the parent reads the file, or reports the crash.

    python -m torchneuron.check.runner RAW.json STEPS [--migrate] [-m MODULE | --pytest NODE_ID | SCRIPT] [ARGS...]

With ``--migrate`` the user's files run from their migrated source
(:mod:`torchneuron.check.migrate`): CUDA calls become device-generic ones.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import runpy
import sys
import time
from collections import Counter
from typing import Any


_SITES_KEPT = 30  # (allocation site, category) rows kept with the memory breakdown


def _sample_breakdown(state: dict[str, Any], allocated: list[int], when: str) -> None:
    """Keeps what fills the fullest device, by category and by (allocation site, category),
    each time its allocated bytes grow (a scan of the Python heap: only while memory grows,
    usually the first steps)."""
    from torchneuron.device import oom

    if not allocated or max(allocated) <= state.get("breakdown_bytes", -1):
        return
    device = allocated.index(max(allocated))
    try:
        breakdown = oom.memory_breakdown(device).as_dict()
        sites = [dataclasses.asdict(s) for s in oom.memory_by_site(device)[:_SITES_KEPT]]
    except Exception:  # noqa: BLE001 (a report section, never the script's failure)
        return
    state["breakdown"] = {"when": when, **breakdown, "sites": sites}
    state["breakdown_bytes"] = max(allocated)


def _origins(script_globals: dict[str, Any]) -> list[dict[str, Any]]:
    from torchneuron.check import origins

    try:
        return origins.wide_dtype_origins(script_globals)
    except Exception:  # noqa: BLE001 (a report section, never the script's failure)
        return []


def _module_file(module: str) -> list[str]:
    """The source file ``python -m module`` runs (a package's ``__main__``), if it has one."""
    import importlib.util

    try:
        spec = importlib.util.find_spec(module)
        if spec is not None and spec.submodule_search_locations is not None:
            spec = importlib.util.find_spec(f"{module}.__main__")
    except (ImportError, ValueError):  # runpy reports a missing module as the script's failure
        return []
    return [spec.origin] if spec is not None and spec.origin else []


class PytestFailure(Exception):
    """pytest could not run the named test (not found, not collected, a usage error)."""


_PYTEST_STATUS = {4: "pytest could not find or use it (its message is above)",
                  5: "pytest collected no test from it"}


def _run_pytest(node_id: str) -> str | None:
    """Runs the one test ``node_id`` in this process; re-raises the test's own exception (so a
    failure or ``--steps`` is reported as a script's is). Returns why it was skipped, if it was.

    pytest loads the test's file and its conftest.py files, as running the test does; no other
    tests, no ini ``addopts`` (they could add test paths) and no cache plugin (nothing read or
    written under .pytest_cache)."""
    import pytest

    class Outcome:
        error: BaseException | None = None
        skipped: str | None = None

        @pytest.hookimpl(hookwrapper=True)
        def pytest_runtest_makereport(self, item, call):
            report = (yield).get_result()
            if report.failed and call.excinfo is not None and self.error is None:
                self.error = call.excinfo.value
            elif report.skipped and self.skipped is None:
                self.skipped = str(report.longrepr[-1]) if isinstance(report.longrepr, tuple) else "skipped"

    outcome = Outcome()
    status = pytest.main([node_id, "-q", "-p", "no:cacheprovider", "-o", "addopts="],
                         plugins=[outcome])
    if outcome.error is not None:
        raise outcome.error
    if status != 0:
        raise PytestFailure(f"pytest ended with status {int(status)} ({getattr(status, 'name', status)}) "
                            f"for {node_id}: {_PYTEST_STATUS.get(int(status), 'see its output above')}")
    return outcome.skipped


def run(raw_path: str, steps: int, module: str | None, script: str | None, args: list[str],
        node_id: str | None = None, migrate_cuda: bool = False) -> None:
    import torch

    from torch.optim.optimizer import register_optimizer_step_post_hook

    import torchneuron  # noqa: F401 (registers the device)
    from torchneuron import config
    from torchneuron.check import collect, migrate, run_modes
    from torchneuron.check.nonfinite_watch import NonFiniteWatch
    from torchneuron.debug import NonFiniteError
    from torchneuron.device import accounting, fallback, sync_debug
    from torchneuron.profiler.outcome import StopAfterSteps, exit_outcome, failure_outcome

    fallback.configure()  # fresh call sites and warnings
    accounting.reset()
    accounting.reset_compile_metrics()
    devices = range(torch.neuron.device_count())
    for d in devices:
        torch.neuron.reset_peak_memory_stats(d)

    syncs: Counter = Counter()
    descriptions: dict[tuple[str, str], str] = {}
    sync_stacks: dict[tuple[str, str], Counter] = {}  # (kind, site) -> {whole user stack: count}

    def on_sync(sync: sync_debug.HostSync) -> None:
        syncs[(sync.kind, sync.site)] += 1
        descriptions.setdefault((sync.kind, sync.site), sync.description)
        stacks = sync_stacks.setdefault((sync.kind, sync.site), Counter())
        if sync.stack and (sync.stack in stacks or len(stacks) < fallback.MAX_STACKS_PER_SITE):
            stacks[sync.stack] += 1

    state: dict[str, Any] = {"steps": 0, "memory_timeline": [], "breakdown": None, "origins": [],
                             "step_ns": []}
    samples: list[accounting.MemorySample] = []

    def on_step(optimizer, *_):
        state["steps"] += 1
        allocated = [torch.neuron.memory_allocated(d) for d in devices]
        state["memory_timeline"].append([state["steps"], max(allocated, default=0)])
        state["step_ns"].append(accounting.event_clock_ns())
        _sample_breakdown(state, allocated, f"after optimizer step {state['steps']}")
        if steps and state["steps"] >= steps:
            raise StopAfterSteps()

    outcome: dict[str, Any] = {"status": "completed"}
    watch = NonFiniteWatch(lambda: state["steps"])  # a loss or model output becoming NaN/Inf
    hook = register_optimizer_step_post_hook(on_step)
    started = time.perf_counter()
    cwd = os.getcwd()  # before the script can change it
    user_root = os.path.dirname(os.path.abspath(script)) if script is not None else cwd
    first_files = [os.path.abspath(script)] if script is not None else (
        [os.path.abspath(node_id.split("::")[0])] if node_id is not None else _module_file(module))
    session = migrate.Session(user_root, migrate_cuda)
    cuda_devices = run_modes.CudaDevicesOnNeuron(run_modes.user_call_site)
    # --migrate: CUDA devices chosen at run time run on neuron too (and are listed).
    cuda_at_run_time = (run_modes.cuda_names_on_neuron(cuda_devices) if migrate_cuda
                        else contextlib.nullcontext())
    # Each allocation keeps the user's Python stack (live blocks only, no event history), so
    # the memory breakdown and an out-of-memory error name the allocation sites.
    torch.neuron.memory._record_memory_history("state", context="state", stacks="python")
    # The script's tensors and modules start on neuron; with --migrate, CUDA code places its
    # own (now on neuron), and what it keeps on the CPU stays there, as on a GPU (a dataset
    # DataLoader workers read in forked processes, which cannot use the device, as CUDA's).
    torch.set_default_device(None if migrate_cuda else "neuron")
    with accounting.pinned_cost_cache():
        before = accounting.snapshot()
        try:
            # Each fallback call site and host sync keeps its whole user Python stack.
            # Device memory after each allocation and free, for the memory timeline (the work
            # items are counted, not kept).
            with accounting.recording(memory=samples, events=False), \
                    config.override(**{accounting.STACK_TRACE_SETTING: "1"}), \
                    sync_debug.listening(on_sync), fallback.noting_wide_dtype_sites(), session, run_modes.pinned_on_device(), \
                    run_modes.workers_on_the_host(), \
                    run_modes.generator_follows_device(), cuda_at_run_time, watch.watching():
                if node_id is not None:
                    script_globals = {}
                    skipped = _run_pytest(node_id)
                    if skipped:
                        outcome = {"status": "completed", "detail": f"the test was skipped: {skipped}"}
                elif module is not None:
                    sys.argv = [module, *args]
                    script_globals = runpy.run_module(module, run_name="__main__", alter_sys=True)
                else:
                    sys.argv = [script, *args]
                    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
                    script_globals = (session.run_path(script) if migrate_cuda
                                      else runpy.run_path(script, run_name="__main__"))
            if state["breakdown"] is None and node_id is None:  # no step: what the globals hold
                _sample_breakdown(state, [torch.neuron.memory_allocated(d) for d in devices],
                                  "at the end of the script")
            state["origins"] = _origins(script_globals)
            del script_globals
        except StopAfterSteps:
            state["origins"] = _origins({})
            outcome = {"status": "stopped", "detail": f"stopped after {steps} optimizer steps (--steps)"}
        except SystemExit as e:
            outcome = exit_outcome(e.code) or outcome
        except BaseException as e:  # noqa: BLE001 (the script's failure is the report's subject)
            outcome = failure_outcome(e)
            if isinstance(e, NonFiniteError):  # --detect-nonfinite stopped at the op that made it
                outcome["nonfinite_op"] = e.op
        finally:
            torch.set_default_device(None)
            hook.remove()
            torch.neuron.memory._record_memory_history(None)
        added = accounting.snapshot().since(before)
        wall = time.perf_counter() - started
        data = collect.collect(added, outcome=outcome, steps=state["steps"], wall_seconds=wall,
                               syncs=syncs, sync_descriptions=descriptions, sync_stacks=sync_stacks,
                               memory_timeline=state["memory_timeline"], breakdown=state["breakdown"])
        data["wide_dtype_origins"] = state["origins"]
        data["nonfinite"] = {"detect": bool(config.get_flag("TORCHNEURON_DETECT_NONFINITE")),
                             "found": watch.report()}
        data["memory"].update(collect.memory_samples(samples, state["step_ns"]))
    try:
        data["cuda"] = session.report(first_files, cwd)
        if migrate_cuda:
            data["cuda"]["runtime_mapped"] = [{"what": what, "site": site, "calls": n}
                                              for (what, site), n in cuda_devices.mapped.most_common()]
    except Exception as e:  # noqa: BLE001 (a report section, never the whole report)
        data["cuda"] = {"files_scanned": [], "findings": [], "migrated": migrate_cuda, "unparsed": {},
                        "not_rewritten": {}, "diff": "", "error": f"{type(e).__name__}: {e}"}
    data["command"] = (["-m", module, *args] if module is not None
                       else [node_id] if node_id is not None else [script, *args])
    tmp = raw_path + ".part"
    with open(tmp, "w") as f:
        json.dump(data, f)
    os.replace(tmp, raw_path)


def main(argv: list[str]) -> int:
    raw_path, steps = argv[0], int(argv[1])
    rest = argv[2:]
    migrate_cuda = rest[:1] == ["--migrate"]
    rest = rest[1:] if migrate_cuda else rest
    if rest[:1] == ["-m"]:
        run(raw_path, steps, rest[1], None, rest[2:], migrate_cuda=migrate_cuda)
    elif rest[:1] == ["--pytest"]:
        run(raw_path, steps, None, None, [], node_id=rest[1], migrate_cuda=migrate_cuda)
    else:
        run(raw_path, steps, None, rest[0], rest[1:], migrate_cuda=migrate_cuda)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
