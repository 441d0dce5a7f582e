"""Neuron FX passes over the ATen graphs AOTAutograd hands the backend.

- :func:`check_legality`: which nodes real Trainium would run on the host CPU
  (the hardware model's :func:`~torchneuron.hardware.placement`, per op and
  dtype, as the eager device decides). They are left out of the generated
  kernels and run through the device's op path, where they are counted as
  CPU fallbacks; in strict mode (``TORCHNEURON_CPU_FALLBACK=0``) compiling
  fails, naming the op, its dtypes and the user's source line.
- :func:`apply_numerics`: the opt-in numerics switches in compiled code, as in
  eager: ``--auto-cast`` rounding around matmul-family (or all) FP32 ops,
  stochastic rounding of FP32->BF16 conversions, INT64 wraparound at 32 bits.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.fx as fx

from torchneuron import config
from torchneuron.device import _core, numerics
from torchneuron.hardware import placement

aten = torch.ops.aten
prims = torch.ops.prims


class NeuronStrictFallbackError(NotImplementedError):
    """Strict mode refused to compile a graph with an op real Trainium runs on the CPU."""


@dataclass(frozen=True)
class IllegalNode:
    """A graph node real Trainium runs on the host CPU."""

    node: fx.Node
    op: str  # "aten::linalg_inv_ex"
    dtypes: tuple[str, ...]
    reason: str

    @property
    def source_line(self) -> str:
        return source_line(self.node)


def op_name(target: torch._ops.OpOverload) -> str:
    """ATen's ``namespace::name.overload`` spelling, as the eager device reports ops."""
    schema = target._schema
    return f"{schema.name}.{schema.overload_name}" if schema.overload_name else schema.name


def source_line(node: fx.Node) -> str:
    """The user's source line a node came from (the last frame of its stack trace)."""
    trace = node.meta.get("stack_trace") or ""
    frames = re.findall(r'File "([^"]+)", line (\d+), in (\S+)\n\s*(.*)', trace)
    if not frames:
        return "<unknown source line>"
    filename, line, function, code = frames[-1]
    return f'{filename}:{line} in {function}: {code.strip()}'


def _dtype_name(value: object) -> str | None:
    if isinstance(value, torch.Tensor):
        return str(value.dtype).removeprefix("torch.")
    return None


def node_dtypes(node: fx.Node) -> tuple[str, ...]:
    """Dtypes of a node's tensor operands in schema order, then of its results."""
    names: list[str] = []

    def add(value: object) -> None:
        if isinstance(value, fx.Node):
            add(value.meta.get("val"))
        elif isinstance(value, (list, tuple)):
            for v in value:
                add(v)
        else:
            name = _dtype_name(value)
            if name is not None and (not names or names[-1] != name):
                names.append(name)

    for arg in (*node.args, *node.kwargs.values()):
        add(arg)
    add(node.meta.get("val"))
    return tuple(names)


def check_legality(gm: fx.GraphModule) -> list[IllegalNode]:
    """Nodes that would fall back to CPU; raises ``NotImplementedError`` in strict mode."""
    chip = _core.topology().chip.name
    native_int64 = config.get_flag("TORCHNEURON_NATIVE_INT64")
    illegal = []
    for node in gm.graph.nodes:
        if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
            continue
        name, dtypes = op_name(node.target), node_dtypes(node)
        where = placement(name, dtypes, target=chip, native_int64=native_int64)
        if not where.on_device:
            illegal.append(IllegalNode(node, name, dtypes, where.reason))
    if illegal and not config.get_flag("TORCHNEURON_CPU_FALLBACK"):
        first = illegal[0]
        raise NeuronStrictFallbackError(
            f"torch.compile(backend='neuron'): {first.op} with dtypes ({', '.join(first.dtypes)}) "
            f"would run on the host CPU on real Trainium ({first.reason}), at {first.source_line}. "
            f"Strict mode (TORCHNEURON_CPU_FALLBACK=0) refuses CPU fallbacks; change that code or "
            f"set TORCHNEURON_CPU_FALLBACK=1 to run it on the CPU, counted."
            + (f" {len(illegal) - 1} more such node(s) in this graph." if len(illegal) > 1 else "")
        )
    return illegal


# --- numerics ----------------------------------------------------------------

_CAST_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp8_e4m3": torch.float8_e4m3fn}

class _Emitter:
    """Inserts ATen calls at the graph's insertion point, computing their fake values
    (in the graph's fake mode) so later passes and Inductor see shapes and dtypes."""

    def __init__(self, graph: fx.Graph) -> None:
        self.graph = graph
        self.created: list[fx.Node] = []
        self.fake_mode = next((n.meta["val"].fake_mode for n in graph.nodes
                               if hasattr(n.meta.get("val"), "fake_mode")), None)

    def call(self, target: Callable, *args: object, **kwargs: object) -> fx.Node:
        node = self.graph.call_function(target, args, kwargs)
        values = [a.meta["val"] if isinstance(a, fx.Node) else a for a in args]
        with self.fake_mode or contextlib.nullcontext():
            node.meta["val"] = target(*values, **kwargs)
        self.created.append(node)
        return node

    def take_created(self) -> set[fx.Node]:
        created, self.created = set(self.created), []
        return created


def _isfinite(e: _Emitter, x: fx.Node) -> fx.Node:
    # |x| < inf, which Inductor lowers directly (aten.isfinite would need decomposing).
    return e.call(aten.lt.Scalar, e.call(aten.abs.default, x), float("inf"))


def _round_to_cast_type(e: _Emitter, x: fx.Node, cast_type: str) -> fx.Node:
    if cast_type == "tf32":
        # Round to nearest even at TF32's 10-bit mantissa, on the FP32 bits.
        bits = e.call(aten.view.dtype, x, torch.int32)
        lsb = e.call(aten.bitwise_and.Scalar, e.call(aten.bitwise_right_shift.Tensor_Scalar, bits, 13), 1)
        rounded = e.call(aten.bitwise_and.Scalar, e.call(aten.add.Tensor, bits, e.call(aten.add.Scalar, lsb, 0xFFF)),
                         ~0x1FFF)
        as_float = e.call(aten.view.dtype, rounded, torch.float32)
        return e.call(aten.where.self, _isfinite(e, x), as_float, x)
    narrow = e.call(prims.convert_element_type.default, x, _CAST_DTYPES[cast_type])
    return e.call(prims.convert_element_type.default, narrow, torch.float32)


def _stochastic_bf16(e: _Emitter, x: fx.Node) -> fx.Node:
    # Uniform noise below BF16's last mantissa bit, then truncation, rounds up with
    # probability equal to the discarded fraction (as the eager copy kernel does).
    shape = list(x.meta["val"].shape)
    bits = e.call(aten.view.dtype, x, torch.int32)
    noise = e.call(aten.randint.low, 0, 1 << 16, shape, dtype=torch.int32, device=x.meta["val"].device)
    truncated = e.call(aten.bitwise_and.Scalar, e.call(aten.add.Tensor, bits, noise), ~0xFFFF)
    rounded = e.call(aten.where.self, _isfinite(e, x),
                     e.call(aten.view.dtype, truncated, torch.float32), x)
    return e.call(prims.convert_element_type.default, rounded, torch.bfloat16)


def _wrap_int64(e: _Emitter, x: fx.Node) -> fx.Node:
    shifted = e.call(aten.add.Scalar, x, 1 << 31)
    low = e.call(aten.bitwise_and.Scalar, shifted, (1 << 32) - 1)
    return e.call(aten.sub.Scalar, low, 1 << 31)


def _base_name(node: fx.Node) -> str:
    return node.target._schema.name.split("::")[-1]


def _is_tensor_of(node: object, dtype: torch.dtype) -> bool:
    return isinstance(node, fx.Node) and isinstance(node.meta.get("val"), torch.Tensor) \
        and node.meta["val"].dtype == dtype


def _replace_uses_after(node: fx.Node, replacement: fx.Node, skip: set[fx.Node]) -> None:
    node.replace_all_uses_with(replacement, delete_user_cb=lambda user: user not in skip)


def apply_numerics(gm: fx.GraphModule, settings: numerics.Numerics | None = None) -> int:
    """Rewrites ``gm`` for the numerics switches that are on; returns the nodes changed."""
    settings = settings or numerics.current()
    graph, e, changed = gm.graph, _Emitter(gm.graph), 0
    for node in list(graph.nodes):
        if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
            continue
        base = _base_name(node)
        if numerics.autocasts(base, settings):
            for arg in {a for a in node.all_input_nodes if _is_tensor_of(a, torch.float32)}:
                with graph.inserting_before(node):
                    rounded = _round_to_cast_type(e, arg, settings.auto_cast_type)
                e.take_created()
                node.replace_input_with(arg, rounded)
                changed += 1
            if _is_tensor_of(node, torch.float32):
                with graph.inserting_before(node.next):
                    rounded = _round_to_cast_type(e, node, settings.auto_cast_type)
                _replace_uses_after(node, rounded, e.take_created())
                changed += 1
        if settings.stochastic_rounding and base in ("convert_element_type", "_to_copy") \
                and _is_tensor_of(node, torch.bfloat16) and _is_tensor_of(node.args[0], torch.float32):
            with graph.inserting_before(node.next):
                rounded = _stochastic_bf16(e, node.args[0])
            e.take_created()
            node.replace_all_uses_with(rounded)
            graph.erase_node(node)
            changed += 1
            continue
        if settings.int64_as_int32 and base not in numerics.PASSTHROUGH_OPS and _is_tensor_of(node, torch.int64):
            with graph.inserting_before(node.next):
                wrapped = _wrap_int64(e, node)
            _replace_uses_after(node, wrapped, e.take_created())
            changed += 1
    if changed:
        graph.lint()
        gm.recompile()
    return changed
