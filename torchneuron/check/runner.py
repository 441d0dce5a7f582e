"""The child process of ``torchneuron check``: runs the user's script on neuron and
writes what the accounting record saw to a JSON file for the parent to report.

Run in its own interpreter so that the modelled chip and LNC (``--target``,
``--lnc``) are set before the device registers, and so that whatever the script
does (``sys.exit``, ``os.chdir``, an exception, a crash) cannot take the report
down with it: the parent reads the file, or reports the crash.

    python -m torchneuron.check.runner RAW.json STEPS [-m MODULE | SCRIPT] [ARGS...]
"""

from __future__ import annotations

import json
import os
import runpy
import sys
import time
import traceback
from collections import Counter
from typing import Any


class StopAfterSteps(BaseException):
    """Raised by the optimizer-step hook after ``--steps`` steps (a BaseException, so the
    script's own ``except Exception`` does not swallow it)."""


def _user_site(tb_frames: list[traceback.FrameSummary]) -> str:
    import torch

    import torchneuron

    skip = (os.path.dirname(torch.__file__), os.path.dirname(torchneuron.__file__),
            os.path.dirname(os.__file__))
    for frame in reversed(tb_frames):
        if not frame.filename.startswith(skip):
            return f"{frame.filename}:{frame.lineno} in {frame.name}"
    return "<unknown>"


def run(raw_path: str, steps: int, module: str | None, script: str | None, args: list[str]) -> None:
    import torch

    from torch.optim.optimizer import register_optimizer_step_post_hook

    import torchneuron  # noqa: F401 (registers the device)
    from torchneuron.check import collect
    from torchneuron.device import accounting, fallback, sync_debug

    fallback.configure()  # fresh call sites and warnings
    accounting.reset()
    accounting.reset_compile_metrics()
    devices = range(torch.neuron.device_count())
    for d in devices:
        torch.neuron.reset_peak_memory_stats(d)

    syncs: Counter = Counter()
    descriptions: dict[tuple[str, str], str] = {}

    def on_sync(sync: sync_debug.HostSync) -> None:
        syncs[(sync.kind, sync.site)] += 1
        descriptions.setdefault((sync.kind, sync.site), sync.description)

    state: dict[str, Any] = {"steps": 0, "memory_timeline": []}

    def on_step(optimizer, *_):
        state["steps"] += 1
        state["memory_timeline"].append(
            [state["steps"], max((torch.neuron.memory_allocated(d) for d in devices), default=0)])
        if steps and state["steps"] >= steps:
            raise StopAfterSteps()

    outcome: dict[str, Any] = {"status": "completed"}
    hook = register_optimizer_step_post_hook(on_step)
    started = time.perf_counter()
    torch.set_default_device("neuron")  # the script's tensors and modules start on neuron
    with accounting.pinned_cost_cache():
        before = accounting.snapshot()
        try:
            with sync_debug.listening(on_sync):
                if module is not None:
                    sys.argv = [module, *args]
                    runpy.run_module(module, run_name="__main__", alter_sys=True)
                else:
                    sys.argv = [script, *args]
                    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
                    runpy.run_path(script, run_name="__main__")
        except StopAfterSteps:
            outcome = {"status": "stopped", "detail": f"stopped after {steps} optimizer steps (--steps)"}
        except SystemExit as e:
            if e.code not in (None, 0):
                outcome = {"status": "failed", "exception_type": "SystemExit",
                           "exception": f"the script exited with status {e.code!r}", "site": "",
                           "traceback": ""}
        except BaseException as e:  # noqa: BLE001 (the script's failure is the report's subject)
            frames = traceback.extract_tb(e.__traceback__)
            outcome = {"status": "failed", "exception_type": type(e).__name__,
                       "exception": str(e).strip()[:4000], "site": _user_site(frames),
                       "traceback": "".join(traceback.format_exception(e))[-8000:]}
        finally:
            torch.set_default_device(None)
            hook.remove()
        added = accounting.snapshot().since(before)
        wall = time.perf_counter() - started
        data = collect.collect(added, outcome=outcome, steps=state["steps"], wall_seconds=wall,
                               syncs=syncs, sync_descriptions=descriptions,
                               memory_timeline=state["memory_timeline"])
    data["command"] = ["-m", module, *args] if module is not None else [script, *args]
    tmp = raw_path + ".part"
    with open(tmp, "w") as f:
        json.dump(data, f)
    os.replace(tmp, raw_path)


def main(argv: list[str]) -> int:
    raw_path, steps = argv[0], int(argv[1])
    rest = argv[2:]
    if rest[:1] == ["-m"]:
        run(raw_path, steps, rest[1], None, rest[2:])
    else:
        run(raw_path, steps, None, rest[0], rest[1:])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
