"""Calling NKI kernels with torch tensors: zero-copy in, zero-copy out, modelled time charged.

``neuron`` tensors live in host memory, so a kernel's HBM arguments are NumPy
views of the tensors' own memory (writes land in them, as on the device), and
HBM tensors the kernel allocates (its outputs) are allocated as ``neuron``
tensors on the arguments' device and handed back as they are: no copy. The
modelled latency of the run (engine-level cost model) is added to the device's
current stream, so ``torch.neuron.Event`` timing and the profiler see kernels
like any other device work. CPU tensors work the same way on the CPU.
"""

from __future__ import annotations

import ctypes
import threading
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from torchneuron.device import accounting, dataless
from torchneuron.nki.dtypes import NkiDType, resolve
from torchneuron.nki.instruction import Engine
from torchneuron.nki.memory import Allocation, Buffer, fill_uninitialized
from torchneuron.nki.tensor import NkiTensor

__all__ = ["call", "host_view", "torch_dtype", "KernelStats", "kernel_stats", "reset_kernel_stats"]

# NKI dtypes without a torch dtype travel as their raw bits.
_TORCH_DTYPES: dict[str, torch.dtype] = {
    "bool_": torch.bool, "int8": torch.int8, "int16": torch.int16, "int32": torch.int32,
    "int64": torch.int64, "uint8": torch.uint8, "uint16": torch.uint16, "uint32": torch.uint32,
    "uint64": torch.uint64, "float16": torch.float16, "float32": torch.float32,
    "bfloat16": torch.bfloat16, "tfloat32": torch.float32, "float8_e4m3": torch.uint8,
    "float8_e5m2": torch.float8_e5m2, "float8_e4m3fn": torch.float8_e4m3fn,
    "float8_e8m0fnu": torch.float8_e8m0fnu,
}


def torch_dtype(dtype: NkiDType) -> torch.dtype:
    """The torch dtype holding an NKI dtype (IEEE-style ``float8_e4m3`` has none: its bits as uint8)."""
    return _TORCH_DTYPES[dtype.name]


def host_view(tensor: torch.Tensor, dtype: NkiDType | None = None) -> np.ndarray:
    """A NumPy view (no copy) of a CPU or ``neuron`` tensor's memory, with its strides.

    The view keeps ``tensor`` alive (its buffer object holds it), so device memory is
    freed only when no view of it is left: a view can never outlive the memory it reads.
    """
    dtype = dtype or resolve(tensor.dtype)
    if tensor.numel() == 0:
        return np.empty(tuple(tensor.shape), dtype=dtype.storage)
    if any(s < 0 for s in tensor.stride()):
        raise ValueError("NKI kernels take tensors with non-negative strides; call .contiguous() first")
    itemsize = tensor.element_size()
    span = 1 + sum((size - 1) * stride for size, stride in zip(tensor.shape, tensor.stride()))
    raw = (ctypes.c_char * (span * itemsize)).from_address(tensor.data_ptr())
    raw.owner = tensor  # np.frombuffer keeps ``raw`` as the base of every view
    flat = np.frombuffer(raw, dtype=np.uint8).view(dtype.storage)
    return np.lib.stride_tricks.as_strided(flat, tuple(tensor.shape), [s * itemsize for s in tensor.stride()])


@dataclass
class KernelStats:
    """Calls and modelled device time of one kernel, for reports."""

    name: str
    calls: int = 0
    modeled_seconds: float = 0.0
    instructions: int = 0


_baseline_lock = threading.Lock()
_baseline: dict[str, KernelStats] = {}  # the record's NKI totals at the last reset_kernel_stats()


def _totals() -> dict[str, KernelStats]:
    return {w.name: KernelStats(w.name, w.calls, w.modeled_seconds, w.instructions)
            for w in accounting.work_totals(accounting.WorkKind.NKI_KERNEL)}


def kernel_stats() -> list[KernelStats]:
    """NKI kernels called on torch tensors since the last reset, most modelled time first
    (a view of the accounting record)."""
    with _baseline_lock:
        out = []
        for name, now in _totals().items():
            old = _baseline.get(name, KernelStats(name))
            if now.calls < old.calls:  # the record was reset since: count from zero
                old = KernelStats(name)
            if now.calls > old.calls:
                out.append(KernelStats(name, now.calls - old.calls, now.modeled_seconds - old.modeled_seconds,
                                       now.instructions - old.instructions))
    return sorted(out, key=lambda s: -s.modeled_seconds)


def reset_kernel_stats() -> None:
    """Starts :func:`kernel_stats` afresh (the record itself is reset by ``metrics.reset()``)."""
    with _baseline_lock:
        _baseline.clear()
        _baseline.update(_totals())


def _device_of(args: tuple, kwargs: dict, kernel_name: str) -> torch.device:
    devices = {v.device for v in list(args) + list(kwargs.values()) if isinstance(v, torch.Tensor)}
    if len(devices) > 1:
        names = ", ".join(sorted(str(d) for d in devices))
        raise RuntimeError(f"Expected all tensors to be on the same device, but NKI kernel {kernel_name!r} "
                           f"got tensors on {names}")
    device = devices.pop()
    if device.type not in ("neuron", "cpu"):
        raise RuntimeError(f"NKI kernel {kernel_name!r} takes neuron (or CPU) tensors, got {device}")
    return device


class _HbmFactory:
    """Allocates the kernel's HBM tensors as torch tensors on ``device``, and remembers them until the
    call has turned the kernel's outputs into torch tensors (then :func:`call` drops them).
    Without ``values`` (dataless execution) the tensors hold none and the kernel runs shapes only."""

    def __init__(self, device: torch.device, values: bool = True) -> None:
        self.device = device
        self.values = values
        self.tensors: dict[int, torch.Tensor] = {}

    def __call__(self, buffer: Buffer, shape: tuple[int, ...], dtype: Any, name: str) -> Allocation:
        nki_dtype = resolve(dtype)
        tensor = torch.empty(shape, dtype=torch_dtype(nki_dtype), device=self.device)
        if not self.values:
            self.tensors[(alloc := Allocation.create(buffer, tuple(shape), nki_dtype, name, fill=False)).id] = tensor
            return alloc
        data = host_view(tensor, nki_dtype)
        data[...] = fill_uninitialized(shape, nki_dtype)
        alloc = Allocation.create(buffer, tuple(shape), nki_dtype, name, initial=data)
        alloc.written[...] = 0
        self.tensors[alloc.id] = tensor
        return alloc


def _wrap_argument(value: Any, name: str, values: bool = True) -> Any:
    if not isinstance(value, torch.Tensor):
        return value
    nki_dtype = resolve(value.dtype)
    if not values:  # dataless: the kernel's shapes only; what it writes is noted in `written`
        return NkiTensor(Allocation.create(Buffer.shared_hbm, tuple(value.shape), nki_dtype, name, fill=False))
    alloc = Allocation.create(Buffer.shared_hbm, tuple(value.shape), nki_dtype, name,
                              initial=host_view(value.detach(), nki_dtype))
    return NkiTensor(alloc)


def _unwrap_output(value: Any, factory: _HbmFactory, inputs: dict[int, torch.Tensor]) -> Any:
    if isinstance(value, (tuple, list)):
        return type(value)(_unwrap_output(v, factory, inputs) for v in value)
    if not isinstance(value, NkiTensor):
        return value
    owner = factory.tensors.get(value._alloc.id, inputs.get(value._alloc.id))
    if owner is None:
        raise RuntimeError(f"kernel output {value.name!r} is not an HBM tensor the kernel allocated")
    itemsize = value.values().itemsize
    return owner.as_strided(value.shape, tuple(s // itemsize for s in value.values().strides),
                            owner.storage_offset() + value.offset)


def call(launch: Any, args: tuple, kwargs: dict) -> Any:
    """Run ``launch`` (a kernel and its grid) on torch tensors; torch tensors out."""
    name = launch.kernel.name
    device = _device_of(args, kwargs, name)
    if torch.is_grad_enabled() and any(isinstance(v, torch.Tensor) and v.requires_grad
                                       for v in list(args) + list(kwargs.values())):
        warnings.warn(f"NKI kernel {name!r} is not differentiable: its outputs do not require grad. "
                      "Register it with torchneuron.nki.torch_op(..., backward=...) to train through it.",
                      stacklevel=3)
    run = launch.new_run()
    # Dataless execution: the simulator runs shapes only (its checks, its instruction log and so
    # its cost are those of a run with values), on no bytes; once per signature.
    values = not (device.type == "neuron" and dataless.is_active())
    key = None
    if not values:
        run.compute_values = False
        run.uninitialized = "ignore"
        key = _signature(launch, run, args, kwargs)
        cached = _shape_only_runs.get(key) if key is not None else None
        if cached is not None:
            return _replay(cached, device, name, list(args) + list(kwargs.values()))
    factory = _HbmFactory(device, values)
    run.hbm_factory = factory
    wrapped_args = [_wrap_argument(v, f"arg{i}", values) for i, v in enumerate(args)]
    wrapped_kwargs = {k: _wrap_argument(v, k, values) for k, v in kwargs.items()}
    inputs = {w._alloc.id: t for w, t in zip(wrapped_args + list(wrapped_kwargs.values()),
                                            list(args) + list(kwargs.values())) if isinstance(w, NkiTensor)}
    try:
        with torch.no_grad():
            outputs = launch.run_tensors(run, wrapped_args, wrapped_kwargs)
            result = _unwrap_output(outputs, factory, inputs)
        allocated = list(factory.tensors.values())  # in allocation order
    finally:
        factory.tensors.clear()  # scratch HBM is freed once nothing of the finished run refers to it
    written: list[int] = []
    if not values:
        given = [t for t in list(args) + list(kwargs.values()) if isinstance(t, torch.Tensor)]
        tensor_wrapped = [w for w in wrapped_args + list(wrapped_kwargs.values()) if isinstance(w, NkiTensor)]
        for i, (wrapped, tensor) in enumerate(zip(tensor_wrapped, given)):
            if wrapped._alloc.written.any():
                written.append(i)
                dataless.STATE.written(tensor)  # the kernel wrote it: no values any more
    charged = _charge(run, device, name)
    if key is not None:
        if len(_shape_only_runs) >= _SHAPE_ONLY_RUNS_KEPT:
            _shape_only_runs.clear()
        _shape_only_runs[key] = _ShapeOnlyRun(
            allocations=tuple((tuple(t.shape), t.dtype) for t in allocated),
            outputs=_describe(result, allocated, [t for t in list(args) + list(kwargs.values())
                                                  if isinstance(t, torch.Tensor)]),
            written=tuple(written), charged=charged)
    return result


def _charge(run: Any, device: torch.device, name: str) -> tuple[float, float, int, int, str]:
    """Records the run in the accounting record: its modelled latency on the device's
    current stream, its FLOPs, DMA bytes and instruction count; returns them."""
    from torchneuron.nki import cost

    kernel_cost = cost.estimate(run, timeline=False)  # totals only: no event per instruction
    # The engine that bounds the kernel (busiest), by the chip's name: its trace row.
    busy = kernel_cost.engine_busy_ns
    busiest = max(busy, key=busy.get) if busy else None
    charged = (kernel_cost.latency_seconds, float(kernel_cost.flops), int(kernel_cost.dma_bytes),
               len(run.instructions), Engine.title(busiest) if busiest else "")
    _record(charged, device, name)
    return charged


def _record(charged: tuple[float, float, int, int, str], device: torch.device, name: str) -> None:
    index = -1  # CPU tensors: counted, on no device stream
    if device.type == "neuron":
        index = device.index if device.index is not None else torch.neuron.current_device()
    seconds, flops, nbytes, instructions, engine = charged
    accounting.record_work(accounting.WorkKind.NKI_KERNEL, name, index, seconds, flops=flops,
                           nbytes=nbytes, instructions=instructions, engine=engine)


# ---- dataless execution: one shape-only run per kernel signature ----------------------
# A kernel's instruction stream depends on its launch, its target and its arguments' shapes,
# dtypes and Python values, not on the tensors' values: under dataless execution the first
# call of a signature runs the simulator (shapes only), later ones reuse what it produced (the
# HBM tensors it allocated, in order; how its outputs view them or the inputs; which inputs it
# wrote; its charge). A model planned with an NKI kernel in each of its 80 layers simulates it once.

@dataclass(frozen=True)
class _ShapeOnlyRun:
    allocations: tuple[tuple[tuple[int, ...], torch.dtype], ...]
    outputs: Any  # the result's structure, with _Leaf leaves
    written: tuple[int, ...]  # indices (args then kwargs) of the tensors the kernel wrote
    charged: tuple[float, float, int, int, str]


@dataclass(frozen=True)
class _Leaf:
    """One output of a shape-only run: a view of an HBM tensor it allocated or of an argument
    (``owner`` "alloc" / "input" and its index), or a Python value."""

    owner: str
    index: int = 0
    shape: tuple[int, ...] = ()
    stride: tuple[int, ...] = ()
    offset: int = 0
    value: Any = None


_shape_only_runs: dict[tuple, _ShapeOnlyRun] = {}
_SHAPE_ONLY_RUNS_KEPT = 4096


def _signature(launch: Any, run: Any, args: tuple, kwargs: dict) -> tuple | None:
    """The cache key of a call, or None if an argument is neither a tensor nor hashable."""
    def part(v: Any) -> Any:
        if isinstance(v, torch.Tensor):
            return ("tensor", tuple(v.shape), v.stride(), v.dtype, v.device)
        try:
            hash(v)
        except TypeError:
            raise LookupError from None
        return ("value", type(v).__name__, v)
    try:
        return (id(launch.kernel), launch.kernel.fn, launch.grid, run.lnc, run.target.name, run.precise_fp,
                run.legacy, tuple(part(v) for v in args), tuple((k, part(v)) for k, v in sorted(kwargs.items())))
    except LookupError:
        return None


def _describe(value: Any, allocated: list[torch.Tensor], inputs: list[torch.Tensor]) -> Any:
    if isinstance(value, (tuple, list)):
        return type(value)(_describe(v, allocated, inputs) for v in value)
    if not isinstance(value, torch.Tensor):
        return _Leaf("value", value=value)
    for kind, owners in (("alloc", allocated), ("input", inputs)):
        for i, owner in enumerate(owners):
            if owner.untyped_storage().data_ptr() == value.untyped_storage().data_ptr():
                return _Leaf(kind, i, tuple(value.shape), value.stride(), value.storage_offset())
    raise RuntimeError("an NKI kernel output is neither an HBM tensor it allocated nor an argument")


def _rebuild(spec: Any, allocated: list[torch.Tensor], inputs: list[torch.Tensor]) -> Any:
    if isinstance(spec, (tuple, list)):
        return type(spec)(_rebuild(s, allocated, inputs) for s in spec)
    if spec.owner == "value":
        return spec.value
    owner = (allocated if spec.owner == "alloc" else inputs)[spec.index]
    return owner.as_strided(spec.shape, spec.stride, spec.offset)


def _replay(cached: _ShapeOnlyRun, device: torch.device, name: str, tensors: list[Any]) -> Any:
    allocated = [torch.empty(shape, dtype=dtype, device=device) for shape, dtype in cached.allocations]
    inputs = [t for t in tensors if isinstance(t, torch.Tensor)]
    result = _rebuild(cached.outputs, allocated, inputs)
    del allocated  # scratch HBM is freed, as after a simulated run
    for i in cached.written:
        dataless.STATE.written(inputs[i])
    _record(cached.charged, device, name)
    return result
