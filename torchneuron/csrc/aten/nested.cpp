// Nested tensors (torch.nested, strided layout) on neuron.
// Checked against torch 2.13.0.
//
// A nested tensor is a NestedTensorImpl: one storage (the buffer) plus three
// host tensors of metadata (each component's sizes, strides and offset into
// the buffer). On neuron the buffer is device memory and the metadata stays
// on the host, as CUDA keeps it. Its dispatch key is NestedTensorPrivateUse1
// (the NestedTensor functionality on the PrivateUse1 backend), for which
// PyTorch registers no kernels; its NestedTensorCPU kernels are generic
// code over the buffer and the metadata. So an op on neuron nested tensors
// runs CPU's nested kernel, as the dense fallback does for dense ops:
//  1. Each neuron argument becomes a CPU tensor over the same bytes; a
//     nested one keeps its metadata. Arguments that share a neuron storage
//     share one CPU storage, so a kernel sees their aliasing.
//  2. The NestedTensorCPU kernel runs with CPU allocations routed to the
//     device (RouteAllocations), so fresh buffers land in device memory.
//  3. Results come back as the dense fallback's do (adopt_cpu_result, which
//     builds nested results with make_neuron_nested): in-place results are
//     the caller's tensors, views alias the argument's neuron storage, fresh
//     results take over their device memory.
// Copies between host and device (_to_copy, copy_) are copies of buffers
// through the dense copy, so they are counted and charged as transfers.
#include "../core.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/NestedTensorImpl.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include <mutex>
#include <optional>

namespace torchneuron {
namespace {

using at::native::get_nested_tensor_impl;
using at::native::NestedTensorImpl;
using c10::IValue;

const c10::DispatchKeySet kCpuKeys(c10::DispatchKey::CPU);
// Where the nested kernels of CPU are: NestedTensorCPU, with CPU for dense arguments.
const c10::DispatchKeySet kNestedCpuKeys =
    c10::DispatchKeySet(c10::DispatchKey::NestedTensorCPU) | kCpuKeys;

// A 1-D tensor of `keys` over a whole storage: the buffer a NestedTensorImpl is built from.
at::Tensor whole_storage(c10::Storage storage, c10::DispatchKeySet keys, caffe2::TypeMeta dtype) {
  const int64_t numel = static_cast<int64_t>(storage.nbytes() / dtype.itemsize());
  at::Tensor buffer = at::detail::make_tensor<c10::TensorImpl>(std::move(storage), keys, dtype);
  buffer.unsafeGetTensorImpl()->set_sizes_contiguous({numel});
  return buffer;
}

// Metadata a CPU kernel made while allocations were routed is in device
// memory; nested metadata lives on the host (as for CUDA), so it moves there.
at::Tensor on_host(const at::Tensor& metadata) {
  if (metadata.defined() && is_neuron_data_ptr(metadata.storage().data_ptr())) {
    return metadata.clone();  // callers run outside RouteAllocations
  }
  return metadata;
}

// What one op call converted, for mapping results back.
struct NestedCall {
  c10::DeviceIndex device = -1;  // of the neuron arguments
  c10::DeviceIndex target = -1;  // of a device= argument naming a neuron device
  // One CPU storage per neuron storage the op sees.
  c10::SmallVector<std::pair<const c10::StorageImpl*, c10::Storage>, 4> storages;
  // (neuron argument, its CPU stand-in): in-place results map back to the argument.
  // Nested metadata cannot change in place, and no nested op has a dense out=
  // argument, so no argument needs its metadata written back.
  c10::SmallVector<std::pair<at::Tensor, at::Tensor>, 4> converted;
  bool host_tensors_allowed = false;  // ops whose metadata arguments are host tensors
};

const c10::Storage& cpu_storage_for(const at::Tensor& t, NestedCall& call) {
  const c10::StorageImpl* impl = t.storage().unsafeGetStorageImpl();
  for (const auto& [neuron, cpu] : call.storages) {
    if (neuron == impl) {
      return cpu;
    }
  }
  // cpu_alias of a tensor over the whole storage: a CPU storage over its bytes.
  at::Tensor whole = whole_storage(t.storage(), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                   caffe2::TypeMeta::Make<uint8_t>());
  call.storages.emplace_back(impl, cpu_alias(whole).storage());
  return call.storages.back().second;
}

at::Tensor convert(const at::Tensor& t, NestedCall& call) {
  if (!t.defined()) {
    return t;
  }
  if (t.device().type() != kNeuron) {
    if (t.is_cpu() && (call.host_tensors_allowed || (!t.is_nested() && t.dim() == 0))) {
      return t;  // CPU scalars are accepted, as on CUDA
    }
    device_mismatch(c10::Device(kNeuron, call.device == -1 ? 0 : call.device), t.device());
  }
  if (call.device == -1) {
    call.device = t.device().index();
  } else if (call.device != t.device().index()) {
    device_mismatch(c10::Device(kNeuron, call.device), t.device());
  }
  for (const auto& [neuron, cpu] : call.converted) {
    if (neuron.unsafeGetTensorImpl() == t.unsafeGetTensorImpl()) {
      return cpu;
    }
  }
  const c10::Storage& storage = cpu_storage_for(t, call);
  at::Tensor cpu;
  if (t.is_nested()) {
    const NestedTensorImpl* nt = get_nested_tensor_impl(t);
    cpu = at::detail::make_tensor<NestedTensorImpl>(
        whole_storage(storage, kCpuKeys, t.dtype()), nt->get_nested_sizes(),
        nt->get_nested_strides(), nt->get_storage_offsets());
  } else {
    cpu = at::detail::make_tensor<c10::TensorImpl>(c10::Storage(storage), kCpuKeys, t.dtype());
    cpu.unsafeGetTensorImpl()->set_sizes_and_strides(t.sizes(), t.strides(), t.storage_offset());
    cpu._set_neg(t.is_neg());
    cpu._set_conj(t.is_conj());
  }
  call.converted.emplace_back(t, cpu);
  return cpu;
}

IValue convert_value(const IValue& v, NestedCall& call) {
  if (v.isTensor()) {
    return convert(v.toTensor(), call);
  }
  if (v.isTensorList()) {
    c10::List<at::Tensor> out;
    for (const at::Tensor& t : v.toTensorList()) {
      out.push_back(convert(t, call));
    }
    return out;
  }
  if (v.isList() && v.toListRef().size() > 0) {  // Tensor?[]
    c10::impl::GenericList out(v.toList().elementType());
    for (const IValue& e : v.toListRef()) {
      out.push_back(e.isTensor() ? IValue(convert(e.toTensor(), call)) : e);
    }
    return out;
  }
  if (v.isDevice() && v.toDevice().type() == kNeuron) {  // where the results go
    call.target = v.toDevice().has_index() ? v.toDevice().index() : current_device();
    check_device_index(call.target);
    return c10::Device(c10::kCPU);
  }
  if (v.isGenerator()) {
    return cpu_view_of(v.toGenerator());
  }
  return v;
}

bool is_optional_generator(const c10::Argument& arg) {
  const auto& type = arg.type();
  return type->kind() == c10::TypeKind::OptionalType &&
      type->castRaw<c10::OptionalType>()->getElementType()->kind() == c10::TypeKind::GeneratorType;
}

// A device= argument naming the host: the op's results are host tensors.
bool targets_host(c10::ArrayRef<IValue> args) {
  for (const IValue& v : args) {
    if (v.isDevice() && v.toDevice().is_cpu()) {
      return true;
    }
  }
  return false;
}

// Ops whose results are nested metadata, which CUDA returns as host tensors.
bool returns_host_metadata(const c10::OperatorHandle& op) {
  const std::string& name = op.schema().name();
  return name == "aten::_nested_tensor_size" || name == "aten::_nested_tensor_strides" ||
      name == "aten::_nested_tensor_storage_offsets";
}

at::Tensor result_tensor(const at::Tensor& cpu, const NestedCall& call, bool on_device) {
  if (!cpu.defined()) {
    return cpu;
  }
  for (const auto& [neuron, converted] : call.converted) {
    if (converted.unsafeGetTensorImpl() == cpu.unsafeGetTensorImpl()) {
      return neuron;  // in-place / out=: the caller's tensor
    }
  }
  bool aliases_argument = false;
  for (const auto& [neuron, storage] : call.storages) {
    aliases_argument = aliases_argument || cpu.storage().is_alias_of(storage);
  }
  if (!on_device && !aliases_argument) {
    return cpu;  // a host result (a copy to the host, or metadata)
  }
  return adopt_cpu_result(cpu, call.target);
}

IValue result_value(IValue v, const NestedCall& call, bool on_device) {
  if (v.isTensor()) {
    return result_tensor(v.toTensor(), call, on_device);
  }
  if (v.isTensorList()) {
    c10::List<at::Tensor> out;
    for (const at::Tensor& t : v.toTensorList()) {
      out.push_back(result_tensor(t, call, on_device));
    }
    return out;
  }
  return v;
}

// While alive, the CPU default generator draws the stream of neuron `device`'s
// default generator, which then continues from where the draw left it. For
// the nested kernels that draw with no Generator argument (native_dropout):
// CPU's kernel takes the CPU default generator, and device randomness must
// come from the device's generator (its seed, state and fork_rng). Another
// thread drawing from the CPU default generator meanwhile would draw from the
// device's stream: nested dropout is the only user.
class DeviceStreamOnCpuDefault {
 public:
  explicit DeviceStreamOnCpuDefault(c10::DeviceIndex device)
      : cpu_(at::detail::getDefaultCPUGenerator()), device_(cpu_view_of(default_generator(device))) {
    std::scoped_lock lock(cpu_.mutex(), device_.mutex());
    saved_ = cpu_.get_state();
    cpu_.set_state(device_.get_state());
  }
  ~DeviceStreamOnCpuDefault() {
    std::scoped_lock lock(cpu_.mutex(), device_.mutex());
    device_.set_state(cpu_.get_state());
    cpu_.set_state(saved_);
  }
  DeviceStreamOnCpuDefault(const DeviceStreamOnCpuDefault&) = delete;
  DeviceStreamOnCpuDefault& operator=(const DeviceStreamOnCpuDefault&) = delete;

 private:
  at::Generator cpu_;
  at::Generator device_;
  at::Tensor saved_;
};

bool draws_from_cpu_default(const c10::OperatorHandle& op) {
  return op.schema().name() == "aten::native_dropout";
}

// Runs `op` from `stack` with its kernel for `cpu_keys` on CPU stand-ins of
// the neuron arguments, then maps the results back. Counted and charged
// like any op of the device.
void run_on_cpu(const c10::OperatorHandle& op, c10::DispatchKeySet cpu_keys,
                torch::jit::Stack* stack, bool host_tensors_allowed) {
  TORCH_CHECK_NOT_IMPLEMENTED(
      !dataless_active(), op.schema().name(), ": nested tensors (torch.strided layout) are not "
      "supported under dataless execution (torchneuron.dataless); use layout=torch.jagged or "
      "dense tensors, or run this part without dataless execution.");
  const auto& args = op.schema().arguments();
  const size_t begin = stack->size() - args.size();
  const c10::SmallVector<IValue, 8> originals(stack->begin() + begin, stack->end());
  NestedCall call;
  call.host_tensors_allowed = host_tensors_allowed;
  int pending_generator = -1;
  for (size_t i = 0; i < args.size(); ++i) {
    IValue& slot = (*stack)[begin + i];
    if (slot.isNone() && is_optional_generator(args[i])) {
      pending_generator = static_cast<int>(i);
    } else {
      slot = convert_value(slot, call);
    }
  }
  if (call.device == -1) {
    call.device = current_device();
  }
  if (call.target == -1) {
    call.target = call.device;
  }
  if (pending_generator >= 0) {  // device randomness comes from the device's generator
    (*stack)[begin + pending_generator] = cpu_view_of(default_generator(call.device));
  }
  OpRecord& record = account_kernel(op, originals);
  const bool on_device = !targets_host(originals) && !returns_host_metadata(op);
  if (on_device) {
    RouteAllocations route(call.target);
    std::optional<DeviceStreamOnCpuDefault> device_stream;
    if (draws_from_cpu_default(op)) {
      device_stream.emplace(call.device);
    }
    op.redispatchBoxed(cpu_keys, stack);
  } else {
    op.redispatchBoxed(cpu_keys, stack);
  }
  const size_t num_returns = op.schema().returns().size();
  const size_t out_begin = stack->size() - num_returns;
  for (size_t r = out_begin; r < stack->size(); ++r) {
    (*stack)[r] = result_value(std::move((*stack)[r]), call, on_device);
  }
  charge_op(op, record, call.target, originals,
            c10::ArrayRef<IValue>(stack->data() + out_begin, num_returns));
}

// The boxed fallback of NestedTensorPrivateUse1: CPU's nested kernel.
void nested_fallback(const c10::OperatorHandle& op, c10::DispatchKeySet, torch::jit::Stack* stack) {
  TORCH_CHECK_NOT_IMPLEMENTED(
      op.hasKernelForDispatchKey(c10::DispatchKey::NestedTensorCPU),
      "Could not run '", op.schema().name(), "' with nested tensors on the neuron device: nested "
      "tensors (torch.strided layout) on neuron run PyTorch's NestedTensorCPU kernels, and "
      "PyTorch has none for this op. Use layout=torch.jagged, or run it on dense tensors "
      "(nested.to_padded_tensor(...), nested.unbind()).");
  run_on_cpu(op, kNestedCpuKeys, stack, /*host_tensors_allowed=*/false);
}

// Dense ops that build nested tensors from a neuron buffer and host metadata
// (device_check: NoCheck in PyTorch; CUDA accepts host metadata too).
void host_metadata_op(const c10::OperatorHandle& op, c10::DispatchKeySet, torch::jit::Stack* stack) {
  run_on_cpu(op, kCpuKeys, stack, /*host_tensors_allowed=*/true);
}

const NestedTensorImpl* nested_impl(const at::Tensor& t, const char* op) {
  TORCH_CHECK(t.is_nested(), op, ": expected a nested tensor, got a ", t.toString());
  return get_nested_tensor_impl(t);
}

// Copies of nested tensors copy their buffers with the dense copy (ops.cpp),
// which counts and charges host<->device traffic and copies between devices.
at::Tensor& nested_copy_(at::Tensor& self, const at::Tensor& src, bool non_blocking) {
  const NestedTensorImpl* dst = nested_impl(self, "copy_");
  const NestedTensorImpl* from = nested_impl(src, "copy_");
  TORCH_CHECK(at::equal(dst->get_nested_sizes(), from->get_nested_sizes()),
              "copy_ only supports tensors that are the same size for Nested implementations");
  dst->get_buffer().copy_(from->get_buffer(), non_blocking);
  return self;
}

// .to(device, dtype) of a nested tensor (reached with a neuron source, or a
// host source and a neuron target): an empty nested tensor like `self` on the
// target, then one copy of the buffer.
at::Tensor nested_to_copy(const at::Tensor& self, std::optional<c10::ScalarType> dtype,
                          std::optional<c10::Layout> layout, std::optional<c10::Device> device,
                          std::optional<bool> pin_memory, bool non_blocking,
                          std::optional<c10::MemoryFormat> memory_format) {
  TORCH_CHECK(!layout.has_value() || *layout == self.layout(),
              "to(options) doesn't support converting to a different layout, but got self.layout "
              "being ", self.layout(), " and options.layout set as ", *layout);
  const c10::Device target = device.value_or(self.device());
  at::Tensor out = at::empty_like(self, dtype, layout, target, pin_memory, memory_format);
  nested_copy_(out, self, non_blocking);
  return out;
}

}  // namespace

at::Tensor make_neuron_nested(c10::Storage storage, const at::Tensor& like) {
  const NestedTensorImpl* cpu = get_nested_tensor_impl(like);
  return at::detail::make_tensor<NestedTensorImpl>(
      whole_storage(std::move(storage), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                    like.dtype()),
      on_host(cpu->get_nested_sizes()), on_host(cpu->get_nested_strides()),
      on_host(cpu->get_storage_offsets()));
}

c10::SmallVector<int64_t, 2> nested_cost_sizes(const at::Tensor& t) {
  const NestedTensorImpl* nt = get_nested_tensor_impl(t);
  const int64_t numel = t.numel();
  const std::optional<int64_t> last = t.dim() > 1 ? nt->opt_size(t.dim() - 1) : std::nullopt;
  if (last.has_value() && *last > 0) {
    return {numel / *last, *last};
  }
  return {numel};
}

// ==== Global Registration ====
TORCH_LIBRARY_IMPL(_, NestedTensorPrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&nested_fallback>());
}

// Every other op with a NestedTensorCPU kernel gets the fallback as its own
// kernel: for ops that also have a CompositeImplicitAutograd kernel (matmul,
// linear, ...) the composite entry would otherwise take precedence over the
// backend fallback, and the dense composite cannot handle nested tensors,
// while CPU runs its nested kernel. PyTorch's ops are all registered when
// this library loads.
TORCH_LIBRARY_IMPL(aten, NestedTensorPrivateUse1, m) {
  m.impl("copy_", nested_copy_);
  m.impl("_to_copy", nested_to_copy);
  auto& dispatcher = c10::Dispatcher::singleton();
  for (const auto& name : dispatcher.getAllOpNames()) {
    auto op = dispatcher.findOp(name);
    if (name.name.rfind("aten::", 0) != 0 || !op ||
        !op->hasKernelForDispatchKey(c10::DispatchKey::NestedTensorCPU) ||
        op->hasKernelForDispatchKey(c10::DispatchKey::NestedTensorPrivateUse1)) {
      continue;
    }
    std::string qualified = name.name.substr(6);
    if (!name.overload_name.empty()) {
      qualified += "." + name.overload_name;
    }
    m.impl(qualified.c_str(), torch::CppFunction::makeFromBoxedFunction<&nested_fallback>());
  }
}

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  for (const char* name : {"_nested_view_from_buffer", "_nested_view_from_buffer_copy",
                           "_nested_from_padded"}) {
    m.impl(name, torch::CppFunction::makeFromBoxedFunction<&host_metadata_op>());
  }
}

}  // namespace torchneuron
