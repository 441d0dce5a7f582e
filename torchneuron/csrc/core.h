// Shared declarations of torchneuron's C++ core.
// Checked against torch 2.13.0 (CPU build).
#pragma once

#include <ATen/ATen.h>
#include <c10/core/CachingDeviceAllocator.h>
#include <c10/core/Stream.h>
#include <c10/util/SmallVector.h>

#include <atomic>
#include <string>
#include <utility>
#include <vector>

namespace c10 {
class OperatorHandle;
}
namespace pybind11 {
class module_;
class str;
}

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
// The modelled device clock of the thread's current stream on `device`.
void advance_current_stream(c10::DeviceIndex device, double seconds);
double current_stream_clock(c10::DeviceIndex device);
// Event.elapsed_time: modelled device time (true, default) or host time.
void set_modeled_event_time(bool modeled);

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
// The boxed fallback: runs `op` from `stack` with its CPU kernel on device memory.
void neuron_fallback(const c10::OperatorHandle& op, c10::DispatchKeySet keys,
                     std::vector<c10::IValue>* stack);
// Sends ops that have a CPU kernel and a composite default kernel to the CPU
// kernel; returns how many were routed.
int64_t route_composite_ops_to_cpu_kernels();
// The NotImplementedError text for sparse layouts, which neuron does not support.
std::string sparse_unsupported(c10::Layout layout);
// Raises CUDA's "Expected all tensors to be on the same device" error.
[[noreturn]] void device_mismatch(c10::Device a, c10::Device b);
// CPU tensor over the same memory as a neuron tensor (no copy).
at::Tensor cpu_alias(const at::Tensor& neuron_tensor);
// Neuron tensor on `device` that takes over the memory of a fresh CPU result.
at::Tensor adopt_cpu_result(const at::Tensor& cpu_result, c10::DeviceIndex device);

// ---- op accounting (metrics.cpp) ----
// The dtypes of an op's tensor arguments (first 7) packed into one integer.
struct DtypeKey {
  uint64_t bits = 0;
  c10::SmallVector<c10::ScalarType, 7> dtypes;
  void add(c10::ScalarType t);
};
// One (op, dtypes) pair: where real Trainium runs it, and how often it ran.
struct OpRecord {
  std::string op;  // "aten::add.Tensor"
  std::vector<c10::ScalarType> dtypes;
  bool fallback = false;  // real Trainium runs it on the CPU
  std::string reason;  // why, for the user
  uint64_t generation = 0;
  std::atomic<uint64_t> calls{0};
  std::atomic<uint64_t> bytes_in{0};  // fallbacks: bytes a real device would send to the host
  std::atomic<uint64_t> bytes_out{0};  // ... and receive back
  std::atomic<uint64_t> modeled_ns{0};  // modelled Trainium time of all calls
  bool matmul_family = false;  // runs on TensorE (auto-cast "matmult" applies)
};
// The record of `op` with these dtypes; the first call per pair asks Python.
OpRecord& op_record(const c10::OperatorHandle& op, const DtypeKey& key);
bool strict_fallback();
void count_host_sync();
void count_copy(bool to_device, size_t bytes);
void bind_metrics(pybind11::module_& m);
// torch's own name of a dtype ("float32"), which the Python hardware model speaks.
pybind11::str dtype_name(c10::ScalarType t);

// Counts an op run by its own kernel (not the fallback) and, in strict mode,
// refuses it if real Trainium runs it on the CPU; call before running it.
OpRecord& account_kernel(const c10::OperatorHandle& op, c10::ArrayRef<c10::IValue> inputs);

// ---- modelled device time (costing.cpp) ----
// Charges an op's modelled Trainium time to the current stream of `device`.
// `inputs` are the op's arguments as the caller passed them, `outputs` its
// results; the cost is asked of Python once per op, dtypes and shapes.
void charge_op(const c10::OperatorHandle& op, OpRecord& record, c10::DeviceIndex device,
               c10::ArrayRef<c10::IValue> inputs, c10::ArrayRef<c10::IValue> outputs);
// Charges a host<->device copy of `bytes` to the current stream of `device`.
void charge_transfer(c10::DeviceIndex device, size_t bytes);
void bind_costing(pybind11::module_& m);

// ---- opt-in Trainium numerics (numerics.cpp) ----
bool numerics_active();  // any switch on (cheap check for the hot path)
// Rounds an op's FP32 inputs on the stack for auto-cast (not its (a!) ones).
void numerics_before(const OpRecord& record, c10::ArrayRef<bool> is_write,
                     std::vector<c10::IValue>& stack, size_t begin);
// Rounds (auto-cast) or wraps (int64 as int32) what an op wrote, in place.
void numerics_after(const OpRecord& record, c10::ArrayRef<at::Tensor> written);
// Stochastic FP32->BF16 rounding of a copy; false if it does not apply.
bool stochastic_round_copy(at::Tensor& cpu_dst, const at::Tensor& cpu_src, c10::DeviceIndex device);
void wrap_int64_copy(at::Tensor& cpu_dst);
void bind_numerics(pybind11::module_& m);

}  // namespace torchneuron
