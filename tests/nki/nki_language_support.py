"""Helpers shared by the nki.language test files: run a kernel on the simulator, list its opcodes."""

from __future__ import annotations

import torchneuron.nki as nki


def run(fn, *args, target="trn2", **kwargs):
    """``fn`` (jitted here unless it is a kernel already) simulated on ``target``: (its
    outputs, the kernel's run record)."""
    kernel = fn if isinstance(fn, nki.Kernel) else nki.jit(fn)
    out = nki.simulate(kernel, target=target, **kwargs)(*args)
    return out, kernel.last_run


def opcodes(run_record):
    """The opcodes of a run's instructions, in program order."""
    return [i.opcode for i in run_record.instructions]
