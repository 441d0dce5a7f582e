// Shared declarations of torchneuron's C++ core.
// Checked against torch 2.13.0 (CPU build).
#pragma once

#include <ATen/ATen.h>
#include <c10/core/CachingDeviceAllocator.h>
#include <c10/core/Stream.h>

#include <string>
#include <utility>

namespace torchneuron {

constexpr c10::DeviceType kNeuron = c10::DeviceType::PrivateUse1;

// ---- devices (guard.cpp) ----
// Number of logical NeuronCores the process sees; set once from Python.
c10::DeviceIndex device_count() noexcept;
void set_device_count(c10::DeviceIndex count);
c10::DeviceIndex current_device();
void set_current_device(c10::DeviceIndex index);
// Raises a RuntimeError naming the visible range if `index` is invalid.
void check_device_index(c10::DeviceIndex index);

// ---- allocator (allocator.cpp) ----
c10::DeviceAllocator* device_allocator();
// Allocates on `device` (PrivateUse1 DataPtr). Throws c10::OutOfMemoryError.
c10::DataPtr allocate_on(c10::DeviceIndex device, size_t nbytes);
// True if the DataPtr was produced by the neuron allocator.
bool is_neuron_data_ptr(const c10::DataPtr& ptr);
void set_capacity(c10::DeviceIndex device, size_t bytes);
size_t capacity(c10::DeviceIndex device);
std::string memory_summary_line(c10::DeviceIndex device);
// Device owning `ptr` (any byte inside a live segment), or -1.
c10::DeviceIndex device_of_pointer(const void* ptr);
c10::Allocator* pinned_allocator();
bool is_pinned(const void* ptr);

// While a RouteAllocations guard is alive on a thread, CPU allocations made
// by that thread come from the neuron allocator of `device`. This is how CPU
// kernels run by the fallback write their results straight into device memory.
class RouteAllocations {
 public:
  explicit RouteAllocations(c10::DeviceIndex device);
  ~RouteAllocations();
  RouteAllocations(const RouteAllocations&) = delete;
  RouteAllocations& operator=(const RouteAllocations&) = delete;

 private:
  c10::DeviceIndex previous_;
};
c10::DeviceIndex routed_device();
c10::Allocator* routing_cpu_allocator();
void install_routing_cpu_allocator();

// ---- generators (generator.cpp) ----
const at::Generator& default_generator(c10::DeviceIndex device);
at::Generator new_generator(c10::DeviceIndex device);
// The CPU generator a CPU kernel may consume in place of a neuron generator.
at::Generator cpu_view_of(const at::Generator& neuron_generator);

// ---- op execution (fallback.cpp, ops.cpp) ----
// Sends ops that have a CPU kernel and a composite default kernel to the CPU
// kernel; returns how many were routed.
int64_t route_composite_ops_to_cpu_kernels();
// Raises CUDA's "Expected all tensors to be on the same device" error.
[[noreturn]] void device_mismatch(c10::Device a, c10::Device b);
// CPU tensor over the same memory as a neuron tensor (no copy).
at::Tensor cpu_alias(const at::Tensor& neuron_tensor);
// Neuron tensor on `device` that takes over the memory of a fresh CPU result.
at::Tensor adopt_cpu_result(const at::Tensor& cpu_result, c10::DeviceIndex device);

}  // namespace torchneuron
