"""The neuron device as Inductor and Dynamo see it.

Neuron tensors live in host memory, so Inductor's C++/OpenMP code generator
can compile fused kernels that read and write them in place: we register the
CPU scheduling for ``neuron`` (``register_backend_for_device``) with a wrapper
that calls the kernels as CPU kernels and charges each one its modelled
Trainium time on the device's stream clock. Dynamo gets a
:class:`NeuronInterface` (device, streams, events, properties) for ``neuron``.

This is the one module that touches Inductor's and Dynamo's device
extension points (``torch._inductor.codegen.common``,
``torch._dynamo.device_interface``); checked against torch 2.13.0.
"""

from __future__ import annotations

import threading
from typing import Any

import torch
from torch._dynamo import device_interface as dynamo_devices
from torch._inductor import config as inductor_config
from torch._inductor.codegen import cpp, cpp_wrapper_cpu, wrapper
from torch._inductor.codegen.common import (
    DeviceOpOverrides,
    register_backend_for_device,
    register_device_op_overrides,
)
from torch._inductor.utils import get_fused_kernel_name
from torch._inductor.virtualized import V

from torchneuron.compiler import flex_attention_lowering, kernel_cost

DEVICE = "neuron"
# Names in generated code: kernel registration (at module load), per-run charge,
# and buffer allocation (the C++ fast path, as CPU's ``empty_strided_cpu``).
_REGISTER, _CHARGE, _EMPTY = "_neuron_kernel", "_neuron_charge", "empty_strided_neuron"
_REGISTER_DYNAMIC = "_neuron_kernel_at"
# Dataless execution's switch, read before each fused kernel (``.on``: skip it) and to mark
# what a skipped kernel would have written (``.written(*tensors)``).
_DATALESS = "_neuron_dataless"


# Inductor settings that make lowering choose for neuron what it chooses for CPU where the
# choice is made by device type and keyed to the C++ backend's code quality. aten.cat:
# on CPU always a ConcatKernel (copies into the output), because pointwise_cat (every
# output element loads from each input under a mask, and the inputs' computations fuse
# in) "observed negative performance impact on CPU" (torch 2.13.0 lowering.py: cat); for
# other devices only within these input counts. At 0, neuron's cat is CPU's.
CPU_LOWERING_CHOICES = {"max_complex_pointwise_cat_inputs": 0, "max_pointwise_cat_inputs": 0}


class NeuronInterface(dynamo_devices.DeviceInterface):
    """Dynamo's and Inductor's runtime view of ``torch.neuron``."""

    device = torch.neuron.device
    Event = torch.neuron.Event
    Stream = torch.neuron.Stream

    class Worker:
        # Inductor sizes its C++ kernels (threads, reduction splits) from these: the
        # kernels run on the host CPU, so the host's properties are the right ones.
        @staticmethod
        def set_device(device: int) -> None:
            torch.neuron.set_device(device)

        @staticmethod
        def current_device() -> int:
            return torch.neuron.current_device()

        @staticmethod
        def get_device_properties(device: Any = None) -> Any:
            return dynamo_devices.CpuInterface.Worker.get_device_properties(device)

    current_device = staticmethod(torch.neuron.current_device)
    set_device = staticmethod(torch.neuron.set_device)
    device_count = staticmethod(torch.neuron.device_count)
    is_available = staticmethod(torch.neuron.is_available)
    synchronize = staticmethod(torch.neuron.synchronize)
    current_stream = staticmethod(torch.neuron.current_stream)
    set_stream = staticmethod(torch.neuron.set_stream)
    stream = staticmethod(torch.neuron.stream)
    memory_allocated = staticmethod(torch.neuron.memory_allocated)

    @staticmethod
    def exchange_device(device: int) -> int:
        previous = torch.neuron.current_device()
        if device >= 0 and device != previous:
            torch.neuron.set_device(device)
        return previous

    maybe_exchange_device = exchange_device

    @staticmethod
    def get_raw_stream(device_idx: int) -> int:
        return 0

    @staticmethod
    def is_bf16_supported(including_emulation: bool = False) -> bool:
        return True

    @staticmethod
    def get_compute_capability(device: Any = None) -> str:
        return ""


class NeuronDeviceOpOverrides(DeviceOpOverrides):
    """Lines Inductor writes into generated code for device and stream handling."""

    def import_get_raw_stream_as(self, name: str) -> str:
        return f"def {name}(_):\n    return 0\n"

    def cpp_kernel_type(self) -> str:
        return "void*"

    def set_device(self, device_idx: int) -> str:
        return f"torch.neuron.set_device({device_idx})"

    def synchronize(self) -> str:
        return "torch.neuron.synchronize()"

    def device_guard(self, device_idx: int) -> str:
        return f"torch.neuron.device({device_idx})"


class _NeuronWrapper:
    """What the Python wrappers of a graph and of its subgraphs (control flow) do for neuron.

    Kernels are called as CPU kernels on the tensors' host memory. Buffers are allocated
    with ``empty_strided_neuron(size, stride, dtype, index)``
    (``torchneuron.device._core.empty_strided_neuron``): the tensor ``empty_strided(size, stride,
    device='neuron:<index>', dtype=dtype)`` gives, from the same allocator (memory
    statistics, capacity, OOM), without the Python arg parser and the dispatcher. Inductor
    does the same for CPU, CUDA, XPU and MTIA (``PythonWrapperCodegen.make_allocation`` in
    torch 2.13.0)."""

    def _generate_kernel_call_helper(self, kernel_name: str, call_args: Any, *, device: Any = None,
                                     **kwargs: Any) -> None:
        device = device or V.graph.get_current_device_or_throw()
        if device.type == DEVICE and not kwargs.get("triton", True):
            # A neuron kernel is a C++ kernel called on the tensors' memory; under dataless
            # execution it is not called (its charge, the next line, still counts it).
            self.writeline(f"{_DATALESS}.on or {self.wrap_kernel_call(kernel_name, call_args)}")
            return
        if device.type == DEVICE:
            device = torch.device("cpu")
        super()._generate_kernel_call_helper(kernel_name, call_args, device=device, **kwargs)

    def generate_fallback_kernel(self, node: Any) -> None:
        # FlexAttention's extern call: its subgraphs register when the module loads (cache hits too)
        lines = flex_attention_lowering.header_lines(node)
        if lines:
            root = self
            while isinstance(root, wrapper.SubgraphPythonWrapperCodegen):
                root = root.parent_wrapper
            written = root.__dict__.setdefault("_neuron_flex_lines", set())
            for line in lines:
                if not written:
                    root.header.writeline(flex_attention_lowering.HEADER_IMPORT)
                if line not in written:
                    written.add(line)
                    root.header.writeline(line)
        super().generate_fallback_kernel(node)

    def _neuron_fast_allocation(self) -> bool:
        # The name is imported by the module's header, which the root wrapper writes.
        root = self
        while isinstance(root, wrapper.SubgraphPythonWrapperCodegen):
            root = root.parent_wrapper
        return isinstance(root, NeuronWrapperCodegen)

    def make_allocation(self, name: str, device: torch.device, dtype: torch.dtype, shape: Any,
                        stride: Any, allocation_shape: Any = None, is_pinned: bool = False) -> str:
        if (device.type != DEVICE or inductor_config.test_configs.track_memory_lifecycle
                or not self._neuron_fast_allocation()):
            return super().make_allocation(name, device, dtype, shape, stride, allocation_shape,
                                           is_pinned)
        if allocation_shape is None:
            allocation_shape = shape
        shape_code = self.codegen_python_shape_tuple(shape)
        allocation_code = self.codegen_python_shape_tuple(allocation_shape)
        stride_code = self.codegen_python_shape_tuple(stride)
        index = "" if device.index is None else f", {device.index}"
        out = f"{name} = {_EMPTY}({allocation_code}, {stride_code}, {dtype}{index})"
        if shape_code != allocation_code:
            out += f".as_strided({shape_code}, {stride_code})"
        return out


class NeuronWrapperCodegen(_NeuronWrapper, wrapper.PythonWrapperCodegen):
    """Python wrapper of a neuron graph: writes the module's header (imports, kernels)."""

    @staticmethod
    def create(is_subgraph: bool, subgraph_name: str | None, parent_wrapper: Any,
               partition_signatures: Any = None) -> wrapper.PythonWrapperCodegen:
        if is_subgraph:
            return NeuronSubgraphWrapperCodegen(subgraph_name, parent_wrapper, partition_signatures)
        return NeuronWrapperCodegen()

    def write_args(self, input_names: list[str]) -> None:
        super().write_args(input_names)
        # The kernels read the inputs' memory: none may hold no values outside dataless execution.
        self.prefix.writeline(f"{_DATALESS}.check_inputs({', '.join(input_names)})")

    def write_header(self) -> None:
        super().write_header()
        self.imports.writeline(
            f"from torchneuron.device.kernel_costs import register as {_REGISTER}, charge as {_CHARGE}, "
            f"register_dynamic as {_REGISTER_DYNAMIC}")
        self.imports.writeline(f"from torchneuron.device._core import empty_strided_neuron as {_EMPTY}")
        self.imports.writeline(f"from torchneuron.device.dataless import STATE as {_DATALESS}")


class NeuronSubgraphWrapperCodegen(_NeuronWrapper, wrapper.SubgraphPythonWrapperCodegen):
    """A subgraph's wrapper (control flow): written into its parent's module."""


class NeuronCppWrapperCodegen(cpp_wrapper_cpu.CppWrapperCpu):
    """C++ wrapper (``cpp_wrapper=True``): CPU headers; kernels are not charged modelled time."""

    @staticmethod
    def create(is_subgraph: bool, subgraph_name: str | None, parent_wrapper: Any,
               partition_signatures: Any = None) -> cpp_wrapper_cpu.CppWrapperCpu:
        return NeuronCppWrapperCodegen()

    @staticmethod
    def get_device_include_path(device: str) -> str:
        return cpp_wrapper_cpu.CppWrapperCpu.get_device_include_path("cpu" if device == DEVICE else device)


class NeuronScheduling(cpp.CppScheduling):
    """Inductor's C++ scheduling, plus a modelled-time charge after each fused kernel.

    The kernel's work is written into the generated module, which registers it
    when it loads (from the compile cache too); each run then charges its slot.
    """

    def codegen_node(self, node: Any) -> None:
        super().codegen_node(node)
        if V.graph.cpp_wrapper:
            return
        wrapper_code = V.graph.wrapper_code
        work, symbolic_elements = kernel_cost.work_of(node)
        name = "cpp_" + get_fused_kernel_name(node.get_nodes(), inductor_config.cpp.descriptive_names)
        arguments = (f"{work.elements}, {work.vector_ops}, {work.scalar_ops}, {work.reductions}, "
                     f"{work.bytes_read}, {work.bytes_written}, {work.dtypes!r}, {name!r}")
        device = node.get_device()
        index = device.index if device is not None and device.index is not None else 0
        # Graph inputs the kernel writes in place (an optimizer's parameters): a dataless run
        # leaves them without values, as an eager op writing them would.
        written_inputs = sorted({dep.name for dep in node.read_writes.writes
                                 if dep.name in V.graph.graph_inputs})
        if written_inputs:
            wrapper_code.writeline(f"{_DATALESS}.on and {_DATALESS}.written({', '.join(written_inputs)})")
        if symbolic_elements is not None:  # dynamic shapes: costed per run at its element count
            elements = wrapper_code.codegen_python_sizevar(symbolic_elements)
            wrapper_code.writeline(f"{_CHARGE}({_REGISTER_DYNAMIC}({elements}, {arguments}), {index})")
            return
        # Slots are numbered per module: subgraphs (control flow) share their root's.
        root = wrapper_code
        while isinstance(root, wrapper.SubgraphPythonWrapperCodegen):
            root = root.parent_wrapper
        slot = f"_neuron_k{getattr(root, '_neuron_kernels', 0)}"
        root._neuron_kernels = getattr(root, "_neuron_kernels", 0) + 1
        wrapper_code.header.writeline(f"{slot} = {_REGISTER}({arguments})")
        wrapper_code.writeline(f"{_CHARGE}({slot}, {index})")


def _treat_neuron_as_cpu_in_scheduler() -> None:
    """Inductor asks ``node.is_cpu()`` / ``ir.is_cpu(x)`` to choose C++-kernel paths
    (loop reindexing, fusion rules); neuron's kernels are those C++ kernels, so the
    answer must be yes for neuron too. Patches torch 2.13.0's two predicates, the
    backend lookup, the device guard and the pad lowering's cat rewrite."""
    from torch._inductor import ir, scheduler

    def node_is_cpu(self: Any) -> bool:
        device = self.get_device()
        return device is not None and device.type in ("cpu", DEVICE)

    def is_cpu(x: Any) -> bool:
        return ir.get_device_type(x) in ("cpu", DEVICE)

    scheduler.BaseSchedulerNode.is_cpu = node_is_cpu
    ir.is_cpu = is_cpu

    # Which code generator ("cpp" for CPU) a device's kernels use; modules import it by name.
    import importlib

    from torch._inductor import utils

    original = utils.get_current_backend

    def get_current_backend(device_type: str | None = None) -> str:
        if not device_type:
            device_type = V.graph.get_current_device_or_throw().type
        return original("cpu" if device_type == DEVICE else device_type)

    for module in ("torch._inductor.utils", "torch._inductor.codegen.common", "torch._inductor.scheduler",
                   "torch._inductor.kernel.mm_common"):
        importlib.import_module(module).get_current_backend = get_current_backend

    # Generated code enters ``torch.neuron.device(i)`` around a device's kernels, so its
    # buffer allocations land on that device (neuron:1...), as on CUDA.
    original_need_guard = scheduler.device_need_guard
    scheduler.device_need_guard = lambda device: device == DEVICE or original_need_guard(device)

    # constant_pad_nd: a right pad becomes cat([x, fill]) except on CPU, whose cat is a
    # ConcatKernel (an extra kernel for the fill); neuron's is too (CPU_LOWERING_CHOICES),
    # so it keeps CPU's masked pointwise pad. constant_pad_nd looks the helper up by name.
    from torch._inductor import lowering

    original_pad_as_cat = lowering._pad_as_cat

    def pad_as_cat(x: Any, padding: Any, fill_value: Any) -> Any:
        device = x.get_device()
        if device is not None and device.type == DEVICE:
            return None
        return original_pad_as_cat(x, padding, fill_value)

    lowering._pad_as_cat = pad_as_cat


_registered = False
_lock = threading.Lock()


def register() -> None:
    """Registers neuron with Dynamo and Inductor (idempotent, thread-safe)."""
    global _registered
    with _lock:
        if _registered:
            return
        dynamo_devices.register_interface_for_device(DEVICE, NeuronInterface)
        for index in range(torch.neuron.device_count()):
            dynamo_devices.register_interface_for_device(f"{DEVICE}:{index}", NeuronInterface)
        register_device_op_overrides(DEVICE, NeuronDeviceOpOverrides())
        register_backend_for_device(DEVICE, NeuronScheduling, NeuronWrapperCodegen, NeuronCppWrapperCodegen)
        _treat_neuron_as_cpu_in_scheduler()
        flex_attention_lowering.install()
        _registered = True


def inductor_attribute(name: str) -> Any:
    """``torch.neuron.<name>`` for the names Inductor looks up there on first use."""
    register()
    if name == "WrapperFxCodegen":
        from torch._inductor.codegen.wrapper_fxir import WrapperFxCodegen

        return WrapperFxCodegen
    return {
        "Scheduling": NeuronScheduling,
        "PythonWrapperCodegen": NeuronWrapperCodegen,
        "CppWrapperCodegen": NeuronCppWrapperCodegen,
    }[name]
