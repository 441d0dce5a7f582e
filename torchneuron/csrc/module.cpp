// Python bindings of the C++ core: `torchneuron._C`. Thin by design: the
// torch.neuron API lives in Python (torchneuron/device/).
// Checked against torch 2.13.0.
#include "core.h"

#include <torch/csrc/Event.h>
#include <torch/csrc/Generator.h>
#include <torch/csrc/utils/device_lazy_init.h>
#include <torch/extension.h>

namespace torchneuron {
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
  m.def("_is_device_memory", &is_device_memory,
        "True if the tensor's bytes live in its neuron device's memory.");
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
  bind_metrics(m);
  bind_costing(m);
  bind_numerics(m);
  m.def("_is_in_bad_fork", []() {
    return torch::utils::is_device_in_bad_fork(kNeuron);
  });
}
