// Python bindings of the C++ core: `torchneuron._C`. Thin by design: the
// torch.neuron API lives in Python (torchneuron/device/).
// Checked against torch 2.13.0.
#include "core.h"

#include <torch/csrc/Dtype.h>
#include <torch/csrc/Event.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/Generator.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/jit/python/pybind_utils.h>
#include <torch/csrc/utils/device_lazy_init.h>
#include <torch/extension.h>

namespace torchneuron {

// Memory history (allocator.cpp). Declared here, not in core.h: only these
// bindings use them.
void record_memory_history(const std::optional<std::string>& enabled,
                           const std::optional<std::string>& context, const std::string& stacks,
                           size_t max_entries, bool clear_history,
                           const std::vector<std::string>& skip_actions,
                           const std::vector<std::string>& library_dirs);
c10::IValue memory_snapshot(bool include_traces);

namespace {

void init_devices(const std::vector<int64_t>& capacities) {
  TORCH_CHECK(!capacities.empty() && capacities.size() < kMaxDevices,
      "torchneuron needs between 1 and ", kMaxDevices - 1, " devices, got ", capacities.size());
  set_device_count(static_cast<c10::DeviceIndex>(capacities.size()));
  for (size_t i = 0; i < capacities.size(); ++i) {
    set_capacity(static_cast<c10::DeviceIndex>(i), static_cast<size_t>(capacities[i]));
  }
  install_routing_cpu_allocator();
  route_composite_ops_to_cpu_kernels();
}

bool is_device_memory(const at::Tensor& t) {
  return t.device().type() == kNeuron &&
      device_of_pointer(t.storage().data()) == t.device().index();
}

// ---- the allocation fast path of compiled code ----------------------------
// Inductor's generated Python allocates every buffer; for CPU and CUDA it calls
// torch._C._dynamo.guards._empty_strided_<device>, which skips the Python arg
// parser and the dispatcher. This is neuron's equivalent: the same tensor as
// torch.empty_strided(size, stride, dtype=dtype, device="neuron:<device>") from
// the same allocator (empty_strided_on, which the registered kernel runs), so
// it counts in memory statistics and raises torch.OutOfMemoryError alike.

// A tuple or list of ints (or objects with __index__).
void parse_ints(PyObject* obj, const char* what, c10::SmallVector<int64_t, 8>& out) {
  const bool is_tuple = PyTuple_Check(obj);
  TORCH_CHECK_TYPE(is_tuple || PyList_Check(obj), "_empty_strided_neuron(): ", what,
                   " must be a tuple of ints, not ", Py_TYPE(obj)->tp_name);
  const Py_ssize_t n = is_tuple ? PyTuple_GET_SIZE(obj) : PyList_GET_SIZE(obj);
  out.resize(n);
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject* item = is_tuple ? PyTuple_GET_ITEM(obj, i) : PyList_GET_ITEM(obj, i);
    int64_t value;
    if (PyLong_CheckExact(item)) {
      value = PyLong_AsLongLong(item);
    } else {
      THPObjectPtr index(PyNumber_Index(item));
      if (!index) {
        throw python_error();
      }
      value = PyLong_AsLongLong(index.get());
    }
    if (value == -1 && PyErr_Occurred()) {
      throw python_error();
    }
    out[i] = value;
  }
}

// Whether this process initialized the device through PyTorch's lazy init
// (the GIL guards it); a forked child re-checks, so it fails as eager would.
bool g_lazy_init_done = false;

// _empty_strided_neuron(size, stride, dtype, device=current) -> Tensor
PyObject* empty_strided_neuron(PyObject* /*module*/, PyObject* const* args, Py_ssize_t nargs) {
  HANDLE_TH_ERRORS
  TORCH_CHECK_TYPE(nargs == 3 || nargs == 4,
                   "_empty_strided_neuron(size, stride, dtype, device=None) takes 3 or 4 "
                   "arguments, got ", nargs);
  c10::SmallVector<int64_t, 8> size, stride;
  parse_ints(args[0], "size", size);
  parse_ints(args[1], "stride", stride);
  TORCH_CHECK_TYPE(THPDtype_Check(args[2]), "_empty_strided_neuron(): dtype must be a "
                   "torch.dtype, not ", Py_TYPE(args[2])->tp_name);
  const c10::ScalarType dtype = reinterpret_cast<THPDtype*>(args[2])->scalar_type;
  TORCH_CHECK(size.size() == stride.size(), "mismatch in length of strides and shape");
  if (!g_lazy_init_done || torch::utils::is_device_in_bad_fork(kNeuron)) {
    torch::utils::device_lazy_init(kNeuron);
    g_lazy_init_done = true;
  }
  c10::DeviceIndex device;
  if (nargs == 4 && args[3] != Py_None) {
    const long index = PyLong_AsLong(args[3]);
    if (index == -1 && PyErr_Occurred()) {
      throw python_error();
    }
    // Out of DeviceIndex's range: -1 makes check_device_index raise its error.
    device = index >= 0 && index < kMaxDevices ? static_cast<c10::DeviceIndex>(index) : -1;
    check_device_index(device);
  } else {
    device = current_device();
  }
  return THPVariable_Wrap(empty_strided_on(device, size, stride, dtype));
  END_HANDLE_TH_ERRORS
}

PyMethodDef g_fast_methods[] = {
    {"_empty_strided_neuron", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(
         &empty_strided_neuron)), METH_FASTCALL,
     "_empty_strided_neuron(size, stride, dtype, device=None): torch.empty_strided on neuron "
     "(the current device if None) without the dispatcher, for compiled code."},
    {nullptr, nullptr, 0, nullptr}};

// The factor of a PREMUL_SUM ReduceOp as c10d's ops pass it to a kernel: a TorchScript
// object (`torch.classes.c10d.ReduceOp`) whose only method is `op()` (torch 2.13.0); the
// factor lives in its supplement (`PreMulSumSupplement`, c10d/Types.hpp), which NCCL reads
// the same way. Python's `ReduceOp.factor` exists only on the pybind11 ReduceOp, which the
// kernels never see. Returns a float, or the factor tensor when it was made from one.
py::object premul_sum_factor(const py::object& boxed) {
  const auto type = torch::getCustomClass("__torch__.torch.classes.c10d.ReduceOp");
  TORCH_CHECK(type, "premul_sum_factor: torch registered no c10d.ReduceOp class");
  const auto op = torch::jit::toIValue(boxed, type).toCustomClass<c10d::ReduceOp>();
  TORCH_CHECK(op->op_ == c10d::ReduceOp::PREMUL_SUM,
              "premul_sum_factor: expected a PREMUL_SUM ReduceOp, got op ", static_cast<int>(op->op_));
  const auto* supplement = static_cast<const c10d::PreMulSumSupplement*>(op->supplement_.get());
  TORCH_CHECK(supplement != nullptr,
              "premul_sum_factor: this PREMUL_SUM has no factor; make it with "
              "torch.distributed._make_nccl_premul_sum(factor)");
  if (supplement->tensor_factor.defined()) {
    return py::reinterpret_steal<py::object>(THPVariable_Wrap(supplement->tensor_factor));
  }
  return py::float_(supplement->double_factor);
}

}  // namespace
}  // namespace torchneuron

PYBIND11_MODULE(_C, m) {
  using namespace torchneuron;
  m.doc() = "torchneuron's C++ core: guard, hooks, allocator and op fallback.";
  m.def("_init_devices", &init_devices,
        "Sets the device count and each device's memory capacity in bytes.");
  m.def("_device_count", []() { return static_cast<int>(device_count()); });
  m.def("_current_device", []() { return static_cast<int>(current_device()); });
  m.def("_check_device_index", [](int index) { check_device_index(index); },
        "Raises RuntimeError naming the visible devices if `index` is not one.");
  m.def("_set_device", [](int index) { set_current_device(index); });
  m.def("_set_capacity", [](int device, int64_t bytes) { set_capacity(device, bytes); });
  m.def("_capacity", [](int device) { return static_cast<int64_t>(capacity(device)); });
  m.def("_memory_summary_line", [](int device) { return memory_summary_line(device); });
  m.def("_record_memory_history", &record_memory_history,
        "Sets what the allocator records: torch.cuda.memory._record_memory_history's "
        "enabled, context, stacks, max_entries, clear_history and skip_actions, and the "
        "library directories an OOM message skips to name a call site.");
  m.def("_memory_snapshot", [](bool include_traces) {
    return torch::jit::toPyObject(memory_snapshot(include_traces));
  }, "The allocator's segments and event traces in PyTorch's snapshot format.");
  m.def("_is_device_memory", &is_device_memory,
        "True if the tensor's bytes live in its neuron device's memory.");
  m.def("_cpu_alias", [](const at::Tensor& t) {
    TORCH_CHECK_TYPE(t.device().type() == kNeuron,
        "_cpu_alias expects a neuron tensor, got a tensor on ", t.device());
    return cpu_alias(t);
  }, "A CPU tensor over the same memory as a neuron tensor (no copy; keeps it alive).");
  m.def("_cpu_view_borrowed", [](const at::Tensor& t) {
    TORCH_CHECK_TYPE(t.device().type() == kNeuron,
        "_cpu_view_borrowed expects a neuron tensor, got a tensor on ", t.device());
    return cpu_view_borrowed(t);
  }, "A CPU tensor over a neuron tensor's memory that does not keep that memory alive.");
  m.def("_register_fork_handler", []() {
    torch::utils::register_fork_handler_for_device_init(kNeuron);
  });
  m.def("_default_generator", [](int device) {
    return py::reinterpret_steal<py::object>(
        THPGenerator_initDefaultGenerator(default_generator(device)));
  }, "The Python torch.Generator of a device's default generator.");
  m.def("_elapsed_time", [](py::handle start, py::handle end) {
    TORCH_CHECK_TYPE(THPEvent_Check(start.ptr()) && THPEvent_Check(end.ptr()),
        "elapsed_time expects two torch.Event objects");
    auto* a = reinterpret_cast<THPEvent*>(start.ptr());
    auto* b = reinterpret_cast<THPEvent*>(end.ptr());
    try {
      return a->event.elapsedTime(b->event);
    } catch (const c10::Error& e) {
      throw std::runtime_error(e.what_without_backtrace());  // RuntimeError, as CUDA
    }
  }, "Milliseconds between two recorded events (torch.Event subclasses too).");
  if (PyModule_AddFunctions(m.ptr(), g_fast_methods) != 0) {
    throw py::error_already_set();
  }
  bind_metrics(m);
  bind_costing(m);
  bind_events(m);
  bind_profiler(m);
  bind_numerics(m);
  bind_dataless(m);
  m.def("_premul_sum_factor", &premul_sum_factor,
        "The factor of c10d's boxed PREMUL_SUM ReduceOp (a float, or its tensor)");
  m.def("_is_in_bad_fork", []() {
    return torch::utils::is_device_in_bad_fork(kNeuron);
  });
}
