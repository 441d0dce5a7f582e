"""Neuron FX passes over the ATen graphs AOTAutograd hands the backend.

- :func:`check_legality`: which nodes real Trainium would run on the host CPU
  (the hardware model's :func:`~torchneuron.hardware.placement`, per op and
  dtype, as the eager device decides). They are left out of the generated
  kernels and run through the device's op path, where they are counted as
  CPU fallbacks; in strict mode (``TORCHNEURON_CPU_FALLBACK=0``) compiling
  fails, naming the op, its dtypes and the user's source line.
- :func:`apply_numerics`: the opt-in numerics switches in compiled code, by the
  rules eager ops follow (device/numerics.py): ``--auto-cast`` rounding around
  matmul-family (or all) FP32 ops; stochastic rounding of every BF16 result an op
  computes (the op computed in FP32 from widened operands, as eager does) and of
  FP32->BF16 conversions; INT64 wraparound at 32 bits of every int64 result. Nodes
  that run on the host CPU are left to the device's op path, which applies the
  same rules to them.
"""

from __future__ import annotations

import contextlib
import operator
import re
from collections.abc import Callable, Collection
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
    # probability equal to the discarded fraction (as the eager kernels do).
    dropped = numerics.BF16_DROPPED_BITS
    shape = list(x.meta["val"].shape)
    bits = e.call(aten.view.dtype, x, torch.int32)
    noise = e.call(aten.randint.low, 0, 1 << dropped, shape, dtype=torch.int32, device=x.meta["val"].device)
    truncated = e.call(aten.bitwise_and.Scalar, e.call(aten.add.Tensor, bits, noise), ~((1 << dropped) - 1))
    rounded = e.call(aten.where.self, _isfinite(e, x),
                     e.call(aten.view.dtype, truncated, torch.float32), x)
    return e.call(prims.convert_element_type.default, rounded, torch.bfloat16)


def _wrap_int64(e: _Emitter, x: fx.Node) -> fx.Node:
    half = 1 << (numerics.INT64_STORED_BITS - 1)
    shifted = e.call(aten.add.Scalar, x, half)
    low = e.call(aten.bitwise_and.Scalar, shifted, (1 << numerics.INT64_STORED_BITS) - 1)
    return e.call(aten.sub.Scalar, low, half)


def _arguments(node: fx.Node) -> list[tuple[str, object]]:
    """(schema name, value) of each argument the node passes."""
    schema = node.target._schema.arguments
    named = [(a.name, v) for a, v in zip(schema, node.args)]
    return named + list(node.kwargs.items())


def _tensor_dtypes(value: object) -> list[torch.dtype]:
    if isinstance(value, fx.Node):
        value = value.meta.get("val")
    if isinstance(value, torch.Tensor):
        return [value.dtype]
    if isinstance(value, (list, tuple)):
        return [d for v in value for d in _tensor_dtypes(v)]
    return []


def _bf16_results(node: fx.Node) -> list[int] | None:
    """Positions of the node's BF16 results (None: a single tensor result, which is BF16)."""
    val = node.meta.get("val")
    if isinstance(val, torch.Tensor):
        return None if val.dtype == torch.bfloat16 else []
    if isinstance(val, (list, tuple)):
        return [i for i, v in enumerate(val) if isinstance(v, torch.Tensor) and v.dtype == torch.bfloat16]
    return []


def _conversion_source(node: fx.Node) -> object:
    """What a conversion reads: ``src`` of copy, else its first argument."""
    return dict(_arguments(node)).get("src", node.args[0] if node.args else None)


def _rounds_bf16_here(node: fx.Node) -> bool:
    """Whether stochastic rounding rewrites this node (device/numerics' rule, per node)."""
    if not numerics.rounds_bf16(node.target) or _bf16_results(node) == []:
        return False
    arguments = _arguments(node)
    dtype = next((v for name, v in arguments if name == "dtype" and isinstance(v, torch.dtype)), None)
    if _base_name(node) in numerics.CONVERSION_OPS:
        return numerics.rounds_bf16_result(node.target, _tensor_dtypes(_conversion_source(node)), dtype)
    if node.target._schema.is_mutable:
        return False  # functionalized graphs compute out of place; copy_ is a conversion
    operands = [d for name, v in arguments if name != "dtype" for d in _tensor_dtypes(v)]
    return numerics.rounds_bf16_result(node.target, operands, dtype)


def _round_conversion_source(e: _Emitter, node: fx.Node) -> None:
    """A conversion to BF16 from FP32 converts its source rounded stochastically (exact)."""
    source = _conversion_source(node)
    with node.graph.inserting_before(node):
        rounded = _stochastic_bf16(e, source)
    e.take_created()
    node.replace_input_with(source, rounded)


def _widened(value: object) -> object:
    return torch.float32 if value is torch.bfloat16 else value


def _widened_value(node: fx.Node, positions: list[int] | None) -> object:
    """The node's fake result when run on its (widened) arguments; None if the op refuses
    them or does not then give FP32 where it gave BF16."""
    values = fx.node.map_arg((node.args, node.kwargs), lambda n: n.meta["val"])
    try:
        val = node.target(*values[0], **values[1])
    except (RuntimeError, TypeError, ValueError):
        return None
    results = [val] if positions is None else [val[i] for i in positions] if isinstance(val, (list, tuple)) else []
    return val if results and all(isinstance(r, torch.Tensor) and r.dtype == torch.float32 for r in results) else None


def _compute_in_fp32_then_round(e: _Emitter, node: fx.Node) -> bool:
    """Rewrites a node with BF16 results as the engines compute it: in FP32 from its
    BF16 operands widened (exact) and ``dtype=bfloat16`` asked as float32, then each
    BF16 result rounded stochastically. False (graph unchanged) for an op that cannot
    compute its BF16 results in FP32."""
    graph = node.graph
    positions = _bf16_results(node)
    old_args, old_kwargs = node.args, node.kwargs
    for arg in {a for a in node.all_input_nodes if _is_tensor_of(a, torch.bfloat16)}:
        with graph.inserting_before(node):
            wide = e.call(prims.convert_element_type.default, arg, torch.float32)
        node.replace_input_with(arg, wide)
    node.args = tuple(_widened(a) for a in node.args)
    node.kwargs = {k: _widened(v) for k, v in node.kwargs.items()}
    with e.fake_mode or contextlib.nullcontext():
        val = _widened_value(node, positions)
    widening = e.take_created()
    if val is None:
        node.args, node.kwargs = old_args, old_kwargs
        for created in widening:
            graph.erase_node(created)
        return False
    node.meta["val"] = val
    if positions is None:  # one tensor result
        with graph.inserting_before(node.next):
            rounded = _stochastic_bf16(e, node)
        _replace_uses_after(node, rounded, e.take_created())
        return True
    for user in list(node.users):  # a tuple: its elements are read by getitem
        if user.target is operator.getitem:
            user.meta["val"] = node.meta["val"][user.args[1]]
        if user.target is operator.getitem and user.args[1] in positions:
            with graph.inserting_before(user.next):
                rounded = _stochastic_bf16(e, user)
            _replace_uses_after(user, rounded, e.take_created())
    return True


def _base_name(node: fx.Node) -> str:
    return node.target._schema.name.split("::")[-1]


def _is_tensor_of(node: object, dtype: torch.dtype) -> bool:
    return isinstance(node, fx.Node) and isinstance(node.meta.get("val"), torch.Tensor) \
        and node.meta["val"].dtype == dtype


def _replace_uses_after(node: fx.Node, replacement: fx.Node, skip: set[fx.Node]) -> None:
    node.replace_all_uses_with(replacement, delete_user_cb=lambda user: user not in skip)


def apply_numerics(gm: fx.GraphModule, settings: numerics.Numerics | None = None,
                   host_nodes: Collection[fx.Node] = ()) -> int:
    """Rewrites ``gm`` for the numerics switches that are on; returns the nodes changed.
    ``host_nodes`` run through the device's op path (CPU fallbacks), which applies the
    switches itself: they are left alone here."""
    settings = settings or numerics.current()
    graph, e, changed = gm.graph, _Emitter(gm.graph), 0
    skip = set(host_nodes)
    for node in list(graph.nodes):
        if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload) \
                or node in skip:
            continue
        base = _base_name(node)
        if settings.stochastic_rounding and _rounds_bf16_here(node):
            if base in numerics.CONVERSION_OPS:
                _round_conversion_source(e, node)
            elif not _compute_in_fp32_then_round(e, node):
                continue  # left as it is: its BF16 results rounded to nearest
            changed += 1
            continue
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
        if settings.int64_as_int32 and numerics.wraps_int64(node.target) and _is_tensor_of(node, torch.int64):
            with graph.inserting_before(node.next):
                wrapped = _wrap_int64(e, node)
            _replace_uses_after(node, wrapped, e.take_created())
            changed += 1
    if changed:
        graph.lint()
        gm.recompile()
    return changed
