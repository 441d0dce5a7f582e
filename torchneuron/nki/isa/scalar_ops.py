"""ScalarE instructions: ``activation``, ``activation_reduce`` and ``activate2``, with the
activation-function range check and the ScalarE accumulator-register reductions.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from torchneuron.nki import context
from torchneuron.nki.cost import formulas as F
from torchneuron.nki.errors import fail
from torchneuron.nki.instruction import Engine
from torchneuron.nki.isa.accumulators import REDUCE_IDENTITY, combine_registers, reduce_res_tile, reduce_rows
from torchneuron.nki.isa.core import (
    CoreState, NkiActivationRangeWarning, NkiInstruction, alu_operator, as_enum, as_tensor, core_state,
    engine_operand, fp32_values, instruction, legacy_dtype, masked_operands, new_tile, partition_lanes, record,
    registers_read, run_and_version, same_layout, store_values, vector_operand, warn_once,
)
from torchneuron.nki.isa.enums import ReduceCmd, reduce_cmd
from torchneuron.nki.memory import Buffer
from torchneuron.nki.ops import ALU_OPS, ActivationFn, activation_fn, nki_op_name
from torchneuron.nki.tensor import NkiTensor


# ============================================================================ ScalarE


def _activation_function(instr: str, op: Any) -> ActivationFn:
    name = nki_op_name(op)
    if name == "prelu":  # activate2 applies its relu_param slope; activation has none (slope 0)
        return ActivationFn("prelu", lambda x: np.maximum(x, np.float32(0)))
    return activation_fn(op)


def _check_range(run: context.KernelRun, instr: str, fn: ActivationFn, values: np.ndarray) -> None:
    """Decision 7: ScalarE gives invalid output outside a function's valid range (facts 5)."""
    if fn.valid_range is None or not values.size:
        return
    lo, hi = fn.valid_range
    with np.errstate(invalid="ignore"):
        probe = np.abs(values) if fn.symmetric_range else values
        vmin = float(np.nanmin(probe)) if not np.isnan(probe).all() else lo
        vmax = float(np.nanmax(probe)) if not np.isnan(probe).all() else hi
    if vmin >= lo and vmax <= hi:
        return
    if fn.symmetric_range:
        span = f"+/-[{lo:g}, {hi:g}]"
        observed = f"|input| in [{vmin:g}, {vmax:g}]"
    else:
        span = f"[{lo:g}, {hi:g}]"
        observed = f"input in [{vmin:g}, {vmax:g}]"
    warn_once(run, (instr, fn.name), f"{instr}: activation function {fn.name} is valid only on {span} but got "
              f"{observed} (after scale and bias); ScalarE produces invalid output there (the simulator computes "
              f"the exact function){'; use nl.sin, which reduces the argument range' if fn.name == 'sin' else ''}",
              NkiActivationRangeWarning)


def _act_reduce(run: context.KernelRun, instr: str, state: CoreState, lanes: slice, cmd: reduce_cmd,
                reduce_name: str | None, values: np.ndarray, reduce_res: NkiTensor | None,
                writes: list[NkiTensor], partitions: int, registers: str = "act",
                init: Any = None) -> None:
    """Apply ``reduce_cmd`` to an engine's accumulator registers and read them out (facts 4.2 / 4.3)."""
    acc = state.act_acc if registers == "act" else state.dve_acc
    valid = state.act_valid if registers == "act" else state.dve_valid
    identity = REDUCE_IDENTITY.get(reduce_name or "add", 0.0)
    if cmd in (ReduceCmd.reset, ReduceCmd.reset_reduce):
        acc[lanes] = identity
        valid[lanes] = True
    elif cmd is ReduceCmd.load_reduce:
        acc[lanes] = np.broadcast_to(np.asarray(init, dtype=np.float32).reshape(-1), (partitions,))
        valid[lanes] = True
    if cmd in (ReduceCmd.reduce, ReduceCmd.reset_reduce, ReduceCmd.load_reduce):
        acc[lanes] = combine_registers(reduce_name or "add", acc[lanes], reduce_rows(reduce_name or "add", values))
    if reduce_res is not None:
        registers_read(run, instr, valid, lanes,
                       Engine.title(Engine.SCALAR if registers == "act" else Engine.VECTOR))
        store_values(reduce_res, acc[lanes].reshape(partitions, 1))
        writes.append(reduce_res)


def _activation(instr: str, dst: Any, op: Any, data: Any, bias: Any, scale: Any, reduce_op: Any,
                reduce_res: Any, cmd: Any, name: str | None, reduce_ops: tuple[str, ...],
                requested: Any = None) -> NkiInstruction:
    run, version = run_and_version()
    se = Engine.SCALAR
    fn = _activation_function(instr, op)
    data = engine_operand(instr, "data", data, se)
    dst = engine_operand(instr, "dst", dst, se)
    same_layout(instr, "data", data, "dst", dst)
    cmd = as_enum(instr, "reduce_cmd", cmd, ReduceCmd)
    if cmd is ReduceCmd.load_reduce:
        fail(instr, "reduce_cmd.load_reduce is a VectorE accumulator command; ScalarE supports idle, reset, reduce "
             "and reset_reduce")
    partitions = data.shape[0]
    reads = [data]
    x = fp32_values(data, instr)
    scale_v = vector_operand(instr, "scale", scale, partitions, se, reads)
    if isinstance(scale_v, np.ndarray) or scale_v != 1.0:
        x = x * scale_v
    bias_kind = "none"
    if bias is not None:
        if isinstance(bias, NkiTensor):
            if bias.dtype.name == "tfloat32":
                fail(instr, "bias may be any dtype except tfloat32; cast it to float32")
            bias_kind = "vector"
        else:
            if version < 3:
                fail(instr, f"bias must be a ({partitions}, 1) vector on NeuronCore-v2 (scalar bias needs "
                     "NeuronCore-v3 or newer); put the value in a tile")
            bias_kind = "scalar"
        if fn.name == "reciprocal" and version < 3:
            fail(instr, "activation(op=nl.reciprocal) does not support a bias on NeuronCore-v2")
        x = x + vector_operand(instr, "bias", bias, partitions, se, reads)
    _check_range(run, instr, fn, x)
    y = np.asarray(fn.fn(x), dtype=np.float32)
    reduce_name = None
    if reduce_op is not None:
        reduce_name = nki_op_name(reduce_op)
        if reduce_name not in reduce_ops:
            fail(instr, f"reduce_op {reduce_name} is not supported here; ScalarE reduces with "
                 f"{', '.join(reduce_ops)} on NeuronCore-v{version}")
    elif cmd in (ReduceCmd.reduce, ReduceCmd.reset_reduce):
        fail(instr, f"reduce_cmd={cmd.name} accumulates the activation: pass reduce_op=nl.add")
    res = reduce_res_tile(instr, reduce_res, partitions, se)
    writes = [dst]
    store_values(dst, y)
    state = core_state(run)
    _act_reduce(run, instr, state, partition_lanes(data), cmd, reduce_name, y, res, writes, partitions)
    attrs: dict[str, Any] = {}
    if requested is not None:
        attrs["engine_requested"] = requested
    return record(run, instr, se, reads, writes, name=name, op=fn.name, reduce_op=reduce_name,
                  reduce_cmd=cmd.name, reduce_res=res is not None, bias=bias_kind,
                  scale="vector" if isinstance(scale, NkiTensor) else "scalar", **attrs)


def activation(dst: NkiTensor, op: Any, data: NkiTensor, bias: Any = None, scale: Any = 1.0, reduce_op: Any = None,
               reduce_res: NkiTensor | None = None, reduce_cmd: reduce_cmd = reduce_cmd.idle,
               name: str | None = None) -> NkiInstruction:
    """``dst = op(data * scale + bias)`` on ScalarE, with an optional add-reduction into its registers (facts 4.2)."""
    return _activation("activation", dst, op, data, bias, scale, reduce_op, reduce_res, reduce_cmd, name, ("add",))


def _activation_legacy(op: Any, data: NkiTensor, *, bias: Any = None, scale: Any = 1.0, reduce_op: Any = None,
                       reduce_res: Any = None, reduce_cmd: Any = ReduceCmd.idle, mask: Any = None, dtype: Any = None,
                       name: str | None = None) -> NkiTensor:
    data = as_tensor("activation", "data", data)
    out = new_tile(data.shape, legacy_dtype(dtype, data), Buffer.sbuf, "activation")
    cut = masked_operands("activation", mask, out, data, bias, scale, reduce_res)
    if cut is not None:
        dst, (d, b, s, r) = cut
        activation(dst, op, d, bias=b, scale=s, reduce_op=reduce_op, reduce_res=r, reduce_cmd=reduce_cmd, name=name)
    return out


activation = instruction("activation", {Engine.SCALAR: F.scalar_activation},
                         legacy=_activation_legacy,
                         tensors=("dst", "data"))(activation)


def activation_reduce(dst: NkiTensor, op: Any, data: NkiTensor, reduce_op: Any, reduce_res: NkiTensor | None,
                      bias: Any = None, scale: Any = 1.0, name: str | None = None) -> NkiInstruction:
    """``activation`` with ``reduce_cmd=reset_reduce`` (legacy-compatible form, facts 4.2)."""
    _run, version = run_and_version()
    ops = ("add",) if version < 3 else ("add", "maximum", "minimum")
    return _activation("activation_reduce", dst, op, data, bias, scale, reduce_op, reduce_res, ReduceCmd.reset_reduce,
                       name, ops)


def _activation_reduce_legacy(op: Any, data: NkiTensor, *, reduce_op: Any, reduce_res: Any, bias: Any = None,
                              scale: Any = 1.0, mask: Any = None, dtype: Any = None,
                              name: str | None = None) -> NkiTensor:
    data = as_tensor("activation_reduce", "data", data)
    out = new_tile(data.shape, legacy_dtype(dtype, data), Buffer.sbuf, "activation")
    cut = masked_operands("activation_reduce", mask, out, data, bias, scale, reduce_res)
    if cut is not None:
        dst, (d, b, s, r) = cut
        activation_reduce(dst, op, d, reduce_op, r, bias=b, scale=s, name=name)
    return out


activation_reduce = instruction("activation_reduce", {Engine.SCALAR: F.scalar_activation},
                                legacy=_activation_reduce_legacy,
                                tensors=("dst", "data"))(activation_reduce)

_ACTIVATE2_PAIRS = {("multiply", "add"), ("multiply", "subtract"), ("multiply", "bypass"), ("add", "bypass"),
                    ("subtract", "bypass"), ("bypass", "bypass")}


@instruction("activate2", {Engine.SCALAR: F.scalar_activation},
             min_version=4,
             hint="use nisa.activation (scale/bias) instead")
def activate2(dst: NkiTensor, op: Any, data: NkiTensor, imm0: Any, imm1: Any, op0: Any, op1: Any,
              relu_param: Any = 0.0, reverse0: bool = False, reverse1: bool = False, reduce_op: Any = None,
              reduce_res: NkiTensor | None = None, reduce_cmd: reduce_cmd = reduce_cmd.idle,
              name: str | None = None) -> NkiInstruction:
    """``op((data op0 imm0) op1 imm1)`` on ScalarE with an optional register reduction (v4 only, facts 4.2)."""
    instr = "activate2"
    run, version = run_and_version()
    se = Engine.SCALAR
    fn = _activation_function(instr, op)
    data = engine_operand(instr, "data", data, se)
    dst = engine_operand(instr, "dst", dst, se)
    same_layout(instr, "data", data, "dst", dst)
    name0 = "bypass" if op0 is None else alu_operator(instr, "op0", op0).name
    name1 = "bypass" if op1 is None else alu_operator(instr, "op1", op1).name
    if (name0, name1) not in _ACTIVATE2_PAIRS:
        fail(instr, f"(op0, op1) = ({name0}, {name1}) is not supported; activate2 allows "
             f"{', '.join(f'({a}, {b})' for a, b in sorted(_ACTIVATE2_PAIRS))}")
    cmd = as_enum(instr, "reduce_cmd", reduce_cmd, ReduceCmd)
    partitions = data.shape[0]
    reads = [data]
    x = fp32_values(data, instr)
    for op_name, imm, rev, role in ((name0, imm0, reverse0, "imm0"), (name1, imm1, reverse1, "imm1")):
        if op_name == "bypass":
            continue
        value = vector_operand(instr, role, imm, partitions, se, reads)
        x = ALU_OPS[op_name].fn(value, x) if rev else ALU_OPS[op_name].fn(x, value)
    x = np.asarray(x, dtype=np.float32)
    _check_range(run, instr, fn, x)
    if fn.name == "prelu":
        slope = vector_operand(instr, "relu_param", relu_param, partitions, se, reads)
        y = np.where(x > 0, x, x * slope).astype(np.float32)
    else:
        y = np.asarray(fn.fn(x), dtype=np.float32)
    reduce_name = None
    if reduce_op is not None:
        reduce_name = nki_op_name(reduce_op)
        if reduce_name not in ("add", "maximum", "minimum", "abs_max", "abs_min"):
            fail(instr, f"reduce_op {reduce_name} is not supported; activate2 reduces with add, max, min, abs_max "
                 "or abs_min")
    elif cmd in (ReduceCmd.reduce, ReduceCmd.reset_reduce):
        fail(instr, f"reduce_cmd={cmd.name} needs a reduce_op")
    if cmd is ReduceCmd.load_reduce:
        fail(instr, "reduce_cmd.load_reduce is not a ScalarE command")
    res = reduce_res_tile(instr, reduce_res, partitions, se)
    writes = [dst]
    store_values(dst, y)
    _act_reduce(run, instr, core_state(run), partition_lanes(data), cmd, reduce_name, y, res, writes, partitions)
    return record(run, instr, se, reads, writes, name=name, op=fn.name, op0=name0, op1=name1,
                  reduce_op=reduce_name, reduce_cmd=cmd.name, reduce_res=res is not None)
