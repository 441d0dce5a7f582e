"""Engine accumulator registers shared by the ScalarE and VectorE instructions (decision 6 of
:mod:`torchneuron.nki.isa`): the reduction ops and their identities, ``reduce_cmd``
handling, the ``reduce_res`` read-out tile and VectorE's accumulate-and-read-out step.
One module, so the instruction modules that use them import it rather than each other.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from torchneuron.nki import context
from torchneuron.nki.errors import fail
from torchneuron.nki.instruction import Engine
from torchneuron.nki.isa.core import (
    CoreState, as_enum, core_state, engine_operand, partition_lanes, registers_read, store_values,
)
from torchneuron.nki.isa.enums import ReduceCmd, reduce_cmd
from torchneuron.nki.tensor import NkiTensor

REDUCE_IDENTITY = {"add": 0.0, "maximum": -np.inf, "minimum": np.inf, "multiply": 1.0,
                    "abs_max": 0.0, "abs_min": np.inf}
_REDUCE_2 = {"add": np.add, "maximum": np.maximum, "minimum": np.minimum, "multiply": np.multiply}


def reduce_rows(op_name: str, values: np.ndarray) -> np.ndarray:
    """Free-dim reduction of (P, F) fp32 values with one of the register ops."""
    if op_name == "abs_max":
        idx = np.abs(values).argmax(axis=1)
        return values[np.arange(values.shape[0]), idx]
    if op_name == "abs_min":
        idx = np.abs(values).argmin(axis=1)
        return values[np.arange(values.shape[0]), idx]
    return _REDUCE_2[op_name].reduce(values, axis=1).astype(np.float32)


def combine_registers(op_name: str, reg: np.ndarray, values: np.ndarray) -> np.ndarray:
    if op_name == "abs_max":
        return np.where(np.abs(values) > np.abs(reg), values, reg)
    if op_name == "abs_min":
        return np.where(np.abs(values) < np.abs(reg), values, reg)
    return _REDUCE_2[op_name](reg, values).astype(np.float32)


def reduce_res_tile(instr: str, reduce_res: Any, partitions: int, eng: str) -> NkiTensor | None:
    if reduce_res is None:
        return None
    t = engine_operand(instr, "reduce_res", reduce_res, eng)
    if t.shape[0] != partitions or t.free_size != 1:
        fail(instr, f"reduce_res must be a ({partitions}, 1) tile (one register value per partition), got shape "
             f"{list(t.shape)}")
    return t


def reduce_cmd_arg(instr: str, value: Any, allowed: tuple[reduce_cmd, ...]) -> reduce_cmd:
    cmd = as_enum(instr, "reduce_cmd", value, ReduceCmd)
    if cmd not in allowed:
        fail(instr, f"reduce_cmd={cmd.name} is not supported; use one of {', '.join(c.name for c in allowed)}")
    return cmd


def dve_readout(run: context.KernelRun, instr: str, state: CoreState, lanes: slice, reduce_res: NkiTensor | None,
                 writes: list[NkiTensor], partitions: int, negate: bool = False) -> None:
    if reduce_res is None:
        return
    registers_read(run, instr, state.dve_valid, lanes, Engine.title(Engine.VECTOR))
    values = state.dve_acc[lanes].reshape(partitions, 1)
    store_values(reduce_res, -values if negate else values)
    writes.append(reduce_res)


def dve_reduce(state: CoreState, lanes: slice, cmd: reduce_cmd, op_name: str, values: np.ndarray,
                init: Any = None) -> None:
    """VectorE accumulators (shared by exponential, range_select, select_reduce, tensor_scalar_reduce...)."""
    if cmd is ReduceCmd.idle:
        return
    if cmd in (ReduceCmd.reset, ReduceCmd.reset_reduce):
        state.dve_acc[lanes] = REDUCE_IDENTITY[op_name]
        state.dve_valid[lanes] = True
    elif cmd is ReduceCmd.load_reduce:
        state.dve_acc[lanes] = np.broadcast_to(np.asarray(init, dtype=np.float32).reshape(-1),
                                               (lanes.stop - lanes.start,))
        state.dve_valid[lanes] = True
    if cmd is not ReduceCmd.reset:
        state.dve_acc[lanes] = combine_registers(op_name, state.dve_acc[lanes], reduce_rows(op_name, values))


def dve_write(run: context.KernelRun, instr: str, dst: NkiTensor, values: np.ndarray, lanes_of: NkiTensor,
               cmd: reduce_cmd, op_name: str, reduce_res: NkiTensor | None, partitions: int, init: Any = None,
               negate: bool = False) -> list[NkiTensor]:
    """Stores an instruction's result in ``dst``, folds it into the VectorE accumulators of
    ``lanes_of``'s partitions as ``cmd`` says and, given ``reduce_res``, reads them out
    into it; returns the tiles written."""
    store_values(dst, values)
    state = core_state(run)
    lanes = partition_lanes(lanes_of)
    dve_reduce(state, lanes, cmd, op_name, values, init)
    writes = [dst]
    dve_readout(run, instr, state, lanes, reduce_res, writes, partitions, negate=negate)
    return writes
