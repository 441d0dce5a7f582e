// The ops a PrivateUse1 backend must implement itself (creation, views,
// metadata changes, copies, scalar reads); everything else goes through the
// boxed fallback (fallback.cpp). Checked against torch 2.13.0.
#include "../core.h"
#include "../accounting/sync_debug.h"

#include <ATen/EmptyTensor.h>
#include <ATen/ExpandUtils.h>
#include <ATen/native/Resize.h>
#include <ATen/native/TensorFactories.h>
#include <ATen/ops/as_strided_native.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <ATen/ops/resize_native.h>
#include <ATen/ops/set_native.h>
#include <ATen/ops/view_native.h>
#include <torch/library.h>

#include <array>
#include <cmath>
#include <limits>
#include <memory>
#include <mutex>

namespace torchneuron {
namespace {

const c10::DispatchKeySet kNeuronKeys(c10::DispatchKey::PrivateUse1);

c10::DeviceIndex index_of(std::optional<c10::Device> device) {
  if (device.has_value() && device->has_index()) {
    check_device_index(device->index());
    return device->index();
  }
  return current_device();
}

at::Tensor empty_memory_format(
    c10::IntArrayRef size, std::optional<c10::ScalarType> dtype,
    std::optional<c10::Layout> layout, std::optional<c10::Device> device,
    std::optional<bool> pin_memory,
    std::optional<c10::MemoryFormat> memory_format) {
  RouteAllocations route(index_of(device));
  return at::detail::empty_generic(
      size, device_allocator(), kNeuronKeys,
      c10::dtype_or_default(dtype), memory_format);
}

at::Tensor empty_strided(
    c10::IntArrayRef size, c10::IntArrayRef stride,
    std::optional<c10::ScalarType> dtype, std::optional<c10::Layout> layout,
    std::optional<c10::Device> device, std::optional<bool> pin_memory) {
  return empty_strided_on(index_of(device), size, stride, c10::dtype_or_default(dtype));
}

// Dataless resize_: the new sizes and, if they need more bytes, a larger storage
// without values (CPU's resize_ would copy the old bytes).
const at::Tensor& resize_without_values(
    const at::Tensor& self, c10::IntArrayRef size,
    std::optional<c10::MemoryFormat> memory_format) {
  TORCH_CHECK(memory_format != c10::MemoryFormat::Preserve,
              "Unsupported memory format ", c10::MemoryFormat::Preserve);
  auto* impl = self.unsafeGetTensorImpl();
  if (self.sizes() != size) {
    impl->set_sizes_contiguous(size);
  }
  if (memory_format.has_value()) {
    impl->empty_tensor_restride(*memory_format);
  }
  const size_t needed = at::detail::computeStorageNbytes(
      self.sizes(), self.strides(), self.itemsize(), self.storage_offset());
  c10::StorageImpl* storage = self.storage().unsafeGetStorageImpl();
  if (needed > storage->nbytes()) {
    TORCH_CHECK(storage->resizable(), "Trying to resize storage that is not resizable");
    storage->set_data_ptr_noswap(allocate_on(self.device().index(), needed));
    storage->set_nbytes(needed);
  }
  mark_without_values(*storage);
  return self;
}

const at::Tensor& resize_(
    const at::Tensor& self, c10::IntArrayRef size,
    std::optional<c10::MemoryFormat> memory_format) {
  if (C10_UNLIKELY(dataless_active())) {
    return resize_without_values(self, size, memory_format);
  }
  RouteAllocations route(self.device().index());
  return at::native::resize_(self, size, memory_format);
}

at::Tensor& set_storage(
    at::Tensor& self, c10::Storage source, int64_t storage_offset,
    c10::IntArrayRef size, c10::IntArrayRef stride) {
  RouteAllocations route(self.device().index());
  forget_cached_alias(self);  // its CPU storage is over the old storage
  return at::native::set_storage_cpu_(self, std::move(source), storage_offset, size, stride);
}

// set_() with no source: an empty storage on the tensor's device.
at::Tensor& set_empty(at::Tensor& self) {
  c10::Storage storage(
      c10::Storage::use_byte_size_t(), 0,
      allocate_on(self.device().index(), 0), device_allocator(), true);
  return set_storage(self, std::move(storage), 0, {0}, {});
}

void copy_values(const at::Tensor& self, const at::Tensor& dst, bool src_neuron,
                 bool dst_neuron) {
  CpuAliases aliases;  // one CPU storage for both sides if they share one: overlap is checked
  at::Tensor cpu_dst = dst_neuron ? aliases.of(dst) : dst;
  at::Tensor cpu_src = src_neuron ? aliases.of(self) : self;
  RouteAllocations route(dst_neuron ? dst.device().index() : self.device().index());
  if (!dst_neuron || !stochastic_round_copy(cpu_dst, cpu_src, dst.device().index())) {
    cpu_dst.copy_(cpu_src);
  }
  if (dst_neuron) {
    wrap_int64_copy(cpu_dst);  // int64 stored as int32 on the device, if modelled
  }
}

// A dataless copy moves no bytes: a neuron destination holds no values afterwards
// (or the source's known value, if it is copied whole), a host destination gets the
// placeholder of the values never computed. Shapes are checked as copy_ checks them.
void copy_without_values(const at::Tensor& self, const at::Tensor& dst, bool src_neuron,
                         bool dst_neuron) {
  // copy_'s broadcast rule, with TensorIterator's wording
  const auto shape = at::infer_size_dimvector(dst.sizes(), self.sizes());
  TORCH_CHECK(c10::IntArrayRef(shape) == dst.sizes(), "output with shape ", dst.sizes(),
              " doesn't match the broadcast shape ", c10::IntArrayRef(shape));
  if (!dst_neuron) {
    at::Tensor host = dst;
    if (holds_values(*self.storage().unsafeGetStorageImpl())) {
      CpuAliases aliases;
      host.copy_(aliases.of(self));  // real values read inside dataless execution
    } else {
      fill_dataless_read(host, self);
    }
    return;
  }
  c10::StorageImpl* storage = dst.storage().unsafeGetStorageImpl();
  const double* src_value = src_neuron && self.has_storage()
      ? known_value(*self.storage().unsafeGetStorageImpl()) : nullptr;
  const double value = src_value != nullptr ? *src_value : std::numeric_limits<double>::quiet_NaN();
  mark_without_values(*storage);
  if (!std::isnan(value) && dst.storage_offset() == 0 && dst.is_non_overlapping_and_dense() &&
      static_cast<size_t>(dst.numel()) * dst.itemsize() == storage->nbytes()) {
    *known_value(*storage) = value;
  }
}

// Copies between cpu and neuron or between neuron devices, any layout and
// dtype: both sides are seen as CPU tensors and CPU's copy_ does the work.
// Each copy is charged its modelled time (costing.cpp).
at::Tensor copy_from(const at::Tensor& self, const at::Tensor& dst, bool non_blocking) {
  const bool dst_neuron = dst.device().type() == kNeuron;
  const bool src_neuron = self.device().type() == kNeuron;
  TORCH_CHECK(
      (dst_neuron || dst.is_cpu()) && (src_neuron || self.is_cpu()),
      "Copy between ", self.device(), " and ", dst.device(),
      " is not supported by the neuron backend; copy through the CPU.");
  check_not_in_bad_fork();
  if (src_neuron && !dst_neuron) {  // reading to the host syncs: sync debug mode first
    check_host_sync(self.device().index(), kSyncCopyToHost, self.nbytes());
  }
  const bool within_device = src_neuron && dst_neuron && self.device() == dst.device();
  OpRecord* record = within_device ? &account_device_copy(self, dst) : nullptr;
  if (C10_UNLIKELY(dataless_active())) {
    copy_without_values(self, dst, src_neuron, dst_neuron);
  } else {
    copy_values(self, dst, src_neuron, dst_neuron);
  }
  if (dst_neuron && src_neuron) {
    charge_device_copy(self, dst, record);
  } else {  // host<->device traffic; reading to the host syncs
    charge_transfer(dst_neuron ? dst.device().index() : self.device().index(), self.nbytes(),
                    /*to_device=*/dst_neuron);
    if (!dst_neuron) {
      count_host_sync(self.device().index());
    }
  }
  return dst;
}  // one CPU storage for both sides if they share one: overlap is checked

at::Tensor copy_from_and_resize(const at::Tensor& self, const at::Tensor& dst) {
  at::native::resize_output(dst, self.sizes());
  return copy_from(self, dst, false);
}

c10::Scalar local_scalar_dense(const at::Tensor& self) {
  check_not_in_bad_fork();
  check_host_sync(self.device().index(), kSyncItem, self.element_size());
  // .item(), and printing, wait for the device on real hardware, then read it back.
  count_host_sync(self.device().index());
  charge_transfer(self.device().index(), self.element_size(), /*to_device=*/false);
  if (C10_UNLIKELY(dataless_active()) && !holds_values(*self.storage().unsafeGetStorageImpl())) {
    return dataless_scalar(self, "item");
  }
  return at::_local_scalar_dense(cpu_alias(self));
}

// Streams are synchronous, so a tensor never needs to outlive work on one.
void record_stream(at::Tensor& self, c10::Stream stream) {}

// Whether `from`'s TensorImpl may be shallow-copied into `self`'s, i.e.
// whether `param.data = t` can keep the Parameter object. c10 allows it only
// between dense tensors of its built-in backends (CPU, CUDA, ...), so without
// this nn.Module.to("neuron") would make new Parameter objects, untying
// shared weights (GPT-2's embedding and output layer) where CUDA keeps them.
// Dense strided neuron tensors are as compatible with each other and with
// dense CPU tensors as CUDA's are (OpenReg overrides this op the same way).
bool has_compatible_shallow_copy_type(const at::Tensor& self, const at::Tensor& from) {
  auto dense_here = [](const at::Tensor& t) {
    return t.layout() == c10::kStrided && t.key_set().has(c10::DispatchKey::Dense) &&
        (t.device().type() == kNeuron || t.device().type() == c10::kCPU) &&
        !t.is_quantized();
  };
  return self.unsafeGetTensorImpl()->has_compatible_shallow_copy_type(from.key_set()) ||
      (dense_here(self) && dense_here(from));
}

// A ZeroTensor on neuron (autograd makes these for zero gradients, e.g. of
// sgn): no memory, only the ZeroTensor key, as CUDA's kernel builds it. The
// CPU kernel's result could not be adopted: it has a size but no bytes.
at::Tensor efficientzerotensor(
    c10::IntArrayRef size, std::optional<c10::ScalarType> dtype,
    std::optional<c10::Layout> layout, std::optional<c10::Device> device,
    std::optional<bool> pin_memory) {
  const c10::DeviceIndex index = index_of(device);
  // One allocator per device, alive as long as the storages that point at it.
  static std::array<std::unique_ptr<at::native::ZeroTensorAllocator>, kMaxDevices> allocators;
  static std::mutex mutex;
  at::native::ZeroTensorAllocator* allocator;
  {
    std::lock_guard<std::mutex> lock(mutex);
    auto& slot = allocators[index];
    if (!slot) {
      slot = std::make_unique<at::native::ZeroTensorAllocator>(c10::Device(kNeuron, index));
    }
    allocator = slot.get();
  }
  return at::detail::empty_generic(
      size, allocator, kNeuronKeys | c10::DispatchKeySet(c10::DispatchKey::ZeroTensor),
      c10::dtype_or_default(dtype), std::nullopt);
}

}  // namespace

at::Tensor empty_strided_on(c10::DeviceIndex device, c10::IntArrayRef size,
                            c10::IntArrayRef stride, c10::ScalarType dtype) {
  RouteAllocations route(device);
  return at::detail::empty_strided_generic(size, stride, device_allocator(), kNeuronKeys, dtype);
}

// ==== Global Registration ====
TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("_efficientzerotensor", efficientzerotensor);
  m.impl("_has_compatible_shallow_copy_type", has_compatible_shallow_copy_type);
  m.impl("empty.memory_format", empty_memory_format);
  m.impl("empty_strided", empty_strided);
  m.impl("as_strided", at::native::as_strided_tensorimpl);
  m.impl("view", at::native::view);
  m.impl("_reshape_alias", at::native::_reshape_alias);
  m.impl("resize_", resize_);
  m.impl("set_.source_Storage_storage_offset", set_storage);
  m.impl("set_.source_Storage", at::native::set_);
  m.impl("set_.source_Tensor", at::native::set_tensor_);
  m.impl("set_", set_empty);
  m.impl("_copy_from", copy_from);
  m.impl("_copy_from_and_resize", copy_from_and_resize);
  m.impl("_local_scalar_dense", local_scalar_dense);
  m.impl("record_stream", record_stream);
}

// Copies resolve conjugate/negative bits themselves (CPU's copy_ does it on
// the aliases), so the Conjugate/Negative fallbacks must let them through:
// their materialising clone would call _copy_from again, forever.
TORCH_LIBRARY_IMPL(aten, Conjugate, m) {
  m.impl("_copy_from", torch::CppFunction::makeFallthrough());
  m.impl("_copy_from_and_resize", torch::CppFunction::makeFallthrough());
}

TORCH_LIBRARY_IMPL(aten, Negative, m) {
  m.impl("_copy_from", torch::CppFunction::makeFallthrough());
  m.impl("_copy_from_and_resize", torch::CppFunction::makeFallthrough());
}

}  // namespace torchneuron
