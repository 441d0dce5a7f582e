// The boxed fallback for PrivateUse1 ("neuron"): every ATen op without a
// neuron kernel runs its CPU kernel on the neuron tensors' own memory.
// Checked against torch 2.13.0.
//
// How one op runs:
//  1. Each neuron argument becomes a CPU tensor over the same bytes
//     (cpu_alias); neuron generators become their CPU generator, a neuron
//     `device=` becomes cpu. Devices are checked as CUDA checks them.
//  2. The CPU kernel runs with CPU allocations routed to the op's device
//     (RouteAllocations), so fresh results land in device memory.
//  3. Results go back per the schema's alias annotations: in-place and out=
//     results are the caller's tensors (resized if the kernel resized them),
//     views are views of the argument's neuron storage, and fresh results
//     take over their memory without a copy (adopt_cpu_result).
#include "../core.h"
#include "alias_cache.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/AutogradState.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/InferenceMode.h>
#include <c10/util/SmallVector.h>
#include <torch/library.h>

#include <array>
#include <cstring>
#include <mutex>
#include <optional>
#include <sstream>
#include <typeinfo>
#include <unordered_map>

namespace torchneuron {
namespace {

using c10::IValue;

const c10::DispatchKeySet kCpuKeys(c10::DispatchKey::CPU);

// Two deleters with the same body and distinct identities: the first marks a
// CPU alias of a neuron storage, the second a neuron storage borrowing a CPU
// result's memory. noipa keeps GCC from folding them into one function.
[[gnu::noipa]] void release_storage(void* ctx) {
  c10::raw::intrusive_ptr::decref(static_cast<c10::StorageImpl*>(ctx));
}

[[gnu::noipa]] void release_cpu_storage(void* ctx) {
  c10::raw::intrusive_ptr::decref(static_cast<c10::StorageImpl*>(ctx));
}

// The deleter of an idle cached CPU alias storage (alias_cache.cpp): it holds no
// reference to the neuron storage, whose tensor keeps it alive.
[[gnu::noipa]] void idle_storage(void*) {}

at::Tensor make_neuron_tensor(c10::Storage storage, const at::Tensor& like) {
  return neuron_tensor_over(std::move(storage), like);
}

// One neuron argument and the CPU alias the kernel saw.
struct Converted {
  at::Tensor neuron;
  at::Tensor cpu;
};

struct CallState {
  // Before `aliases`, so destroyed after it: the neuron arguments (whose alias
  // caches lent the aliases) outlive the loans even when these are their last holders.
  c10::SmallVector<IValue, 6> originals;  // arguments before conversion
  CpuAliases aliases;  // destroyed after everything else that holds an alias
  c10::DeviceIndex device = -1;
  DtypeKey dtypes;  // of the tensor arguments and any dtype= argument
  c10::SmallVector<Converted, 4> mutated;  // arguments annotated (a!)
  bool counted_fallback = false;  // a CPU fallback of the program's (not a PyTorch internal's)
};

// A neuron argument's CPU alias. CPU tensors pass through where CUDA accepts
// them: 0-dim tensors (scalars) and indices, and only as inputs; an output
// (`is_write`) on the CPU is a device mismatch, as on CUDA. The ops whose CUDA
// kernel checks devices (check_devices_as_cuda) refuse CPU scalars before this.
at::Tensor convert_tensor(
    const at::Tensor& t, CallState& call, bool cpu_allowed, bool is_write,
    bool in_list = false) {
  if (!t.defined()) {
    return t;
  }
  add_operand_dtype(call.dtypes, t, in_list);
  const auto device = t.device();
  if (device.type() == kNeuron) {
    join_device(call.device, device);
    return call.aliases.of(t);
  }
  if (device.is_cpu() && !is_write && (cpu_allowed || t.dim() == 0)) {
    return t;
  }
  device_mismatch(c10::Device(kNeuron, call.device == -1 ? 0 : call.device), device);
}

bool is_optional_generator(const c10::Argument& arg) {
  const auto& type = arg.type();
  if (type->kind() != c10::TypeKind::OptionalType) {
    return false;
  }
  return type->castRaw<c10::OptionalType>()->getElementType()->kind() ==
      c10::TypeKind::GeneratorType;
}

IValue convert_argument(
    const IValue& v, const c10::Argument& arg, bool is_write, CallState& call) {
  if (v.isTensor()) {
    return convert_tensor(v.toTensor(), call, false, is_write);
  }
  if (v.isTensorList()) {
    auto list = v.toTensorList();
    c10::List<at::Tensor> out;
    out.reserve(list.size());
    for (const at::Tensor& t : list) {
      out.push_back(convert_tensor(t, call, false, is_write, /*in_list=*/true));
    }
    return out;
  }
  if (v.isList()) {  // e.g. Tensor?[] indices: CPU index tensors are fine.
    auto list = v.toList();
    if (list.size() == 0) {
      return v;
    }
    c10::impl::GenericList out(list.elementType());
    out.reserve(list.size());
    for (const IValue& e : list) {
      out.push_back(
          e.isTensor() ? IValue(convert_tensor(e.toTensor(), call, true, is_write, true)) : e);
    }
    return out;
  }
  if (v.isDevice() && v.toDevice().type() == kNeuron) {
    auto index = v.toDevice().index();
    if (call.device == -1 && index >= 0) {
      call.device = index;
    }
    return c10::Device(c10::kCPU);
  }
  if (v.isGenerator()) {
    return cpu_view_of(v.toGenerator());
  }
  if (v.isInt() && arg.name() == "dtype") {
    call.dtypes.add(static_cast<c10::ScalarType>(v.toInt()));
  }
  return v;
}

}  // namespace

size_t neuron_bytes(const IValue& v) {
  size_t n = 0;
  auto add = [&](const at::Tensor& t) {
    if (t.defined() && t.device().type() == kNeuron) {
      n += t.nbytes();
    }
  };
  if (v.isTensor()) {
    add(v.toTensor());
  } else if (v.isTensorList()) {
    for (const at::Tensor& t : v.toTensorList()) {
      add(t);
    }
  }
  return n;
}

OpRecord& account_op(const c10::OperatorHandle& op, const DtypeKey& dtypes,
                     c10::ArrayRef<IValue> originals, bool* counted_fallback) {
  OpRecord& record = op_record(op, dtypes);
  if (record.fallback) {
    if (observe_fallback_call(record)) {
      record.internal_calls.fetch_add(1, std::memory_order_relaxed);
      return record;
    }
    *counted_fallback = true;
    TORCH_CHECK_NOT_IMPLEMENTED(
        !strict_fallback(), record.reason,
        ". TORCHNEURON_CPU_FALLBACK=0 turns such CPU fallbacks into errors; unset it to let "
        "them run (on real Trainium they run on the host CPU, with transfers each way).");
    size_t bytes = 0;
    for (const IValue& v : originals) {
      bytes += neuron_bytes(v);
    }
    record.bytes_in.fetch_add(bytes, std::memory_order_relaxed);
  }
  record.calls.fetch_add(1, std::memory_order_relaxed);
  return record;
}

namespace {

OpRecord& account(const c10::OperatorHandle& op, CallState& call) {
  return account_op(op, call.dtypes, call.originals, &call.counted_fallback);
}

// Gives a neuron storage the memory its CPU alias storage got when the kernel
// resized it (out= resizing); a no-op for storages the kernel left alone.
void write_back_storage(c10::StorageImpl* neuron_storage, const c10::Storage& cpu) {
  auto* cpu_storage = cpu.unsafeGetStorageImpl();
  if (cpu_storage->data() == neuron_storage->data() &&
      cpu_storage->nbytes() == neuron_storage->nbytes()) {
    return;
  }
  const c10::Device device = neuron_storage->device();
  c10::DataPtr fresh = cpu_storage->set_data_ptr(c10::DataPtr(nullptr, c10::Device(c10::kCPU)));
  TORCH_INTERNAL_ASSERT(
      is_neuron_data_ptr(fresh), "out= storage was resized outside device memory");
  fresh.unsafe_set_device(device);
  neuron_storage->set_data_ptr_noswap(std::move(fresh));
  neuron_storage->set_nbytes(cpu_storage->nbytes());
}

// Copies what a CPU kernel did to an (a!) argument's sizes, strides and
// offset back to the neuron tensor (its memory moved with its storage).
void write_back(const Converted& c) {
  auto* impl = c.neuron.unsafeGetTensorImpl();
  if (c.neuron.sizes() != c.cpu.sizes() || c.neuron.strides() != c.cpu.strides() ||
      c.neuron.storage_offset() != c.cpu.storage_offset()) {
    impl->set_sizes_and_strides(c.cpu.sizes(), c.cpu.strides(), c.cpu.storage_offset());
  }
}

// The argument index whose alias set a return shares, or -1.
int aliased_argument(const c10::FunctionSchema& schema, const c10::Argument& ret) {
  const auto* info = ret.alias_info();
  if (info == nullptr) {
    return -1;
  }
  const auto& args = schema.arguments();
  for (size_t i = 0; i < args.size(); ++i) {
    const auto* a = args[i].alias_info();
    if (a == nullptr) {
      continue;
    }
    for (const auto& set : info->beforeSets()) {
      if (a->beforeSets().count(set)) {
        return static_cast<int>(i);
      }
    }
  }
  return -1;
}

OpInfo analyse(const c10::FunctionSchema& schema) {
  OpInfo info;
  for (const auto& arg : schema.arguments()) {
    info.arg_is_write.push_back(arg.alias_info() && arg.alias_info()->isWrite());
    info.arg_is_generator.push_back(is_optional_generator(arg));
  }
  for (const auto& ret : schema.returns()) {
    info.return_arg.push_back(aliased_argument(schema, ret));
    info.return_is_write.push_back(ret.alias_info() && ret.alias_info()->isWrite());
    const bool view = info.return_arg.back() >= 0 && !info.return_is_write.back();
    info.returns_view = info.returns_view || view;
    info.fresh_returns += info.return_arg.back() < 0;
  }
  info.cuda_device_check = cuda_device_check(schema);
  return info;
}

// Schemas live as long as their operator registration. Analysed once per
// process; each thread then finds its answer in its own cache, without a lock.
thread_local ThreadCache<const OpInfo> t_op_infos;

}  // namespace

const OpInfo& op_info(const c10::FunctionSchema& schema) {
  return t_op_infos.get(&schema, 0, 1, [&]() -> const OpInfo& {
    static std::mutex mutex;
    static auto& analysed = *new std::unordered_map<const c10::FunctionSchema*, OpInfo>();
    std::lock_guard<std::mutex> lock(mutex);
    auto it = analysed.find(&schema);
    if (it == analysed.end()) {
      it = analysed.emplace(&schema, analyse(schema)).first;  // node-based: stable addresses
    }
    return it->second;
  });
}

namespace {

at::Tensor return_tensor(
    at::Tensor cpu_result, const IValue& original, bool is_write,
    c10::DeviceIndex device) {
  if (!cpu_result.defined()) {
    return cpu_result;
  }
  if (original.isTensor()) {
    const at::Tensor& arg = original.toTensor();
    if (arg.defined() && arg.device().type() == kNeuron) {
      if (is_write) {
        return arg;  // in-place / out=: already written back (write_back)
      }
      if (cpu_result.storage().data() == arg.storage().data()) {
        return make_neuron_tensor(arg.storage(), cpu_result);
      }
    }
  }
  return adopt_cpu_result(std::move(cpu_result), device);
}

IValue return_value(
    IValue v, const IValue* original, bool is_write, CallState& call) {
  static const IValue none;
  const IValue& orig = original ? *original : none;
  if (v.isTensor()) {
    return return_tensor(std::move(v).toTensor(), orig, is_write, call.device);
  }
  if (v.isTensorList()) {
    auto list = v.toTensorList();
    c10::List<at::Tensor> out;
    out.reserve(list.size());
    if (orig.isTensorList() && orig.toTensorList().size() == list.size()) {
      auto olist = orig.toTensorList();
      for (size_t i = 0; i < list.size(); ++i) {
        out.push_back(return_tensor(list[i], IValue(olist.get(i)), is_write, call.device));
      }
    } else {
      for (const at::Tensor& t : list) {
        out.push_back(return_tensor(t, orig, is_write, call.device));
      }
    }
    return out;
  }
  return v;
}

}  // namespace

void add_operand_dtype(DtypeKey& key, const at::Tensor& t, bool in_list) {
  const bool repeat = in_list && !key.dtypes.empty() && key.dtypes.back() == t.scalar_type();
  if (!repeat && !t.unsafeGetTensorImpl()->is_wrapped_number()) {
    key.add(t.scalar_type());
  }
}

// The autograd engine gives every accelerator a worker thread and runs the
// backward of its ops there, so a GPU can be fed while the caller waits. The
// neuron device computes on the host, so that thread would only move the work
// to another core, away from the caches the forward pass warmed (an MLP train
// step measured 1.2x slower than CPU that way, 1.0x without). So the first
// neuron op on a thread turns autograd multithreading off for that thread,
// and backward runs on the calling thread as it does for CPU tensors (and
// backward hooks run there, where a debugger can stop in them). Users may
// turn it back on with torch.autograd.set_multithreading_enabled(True).
// The thread counts as claimed only once this switched multithreading off:
// an op that finds it off already may run inside a scope that turns it back
// on at its exit (AOTAutograd compiles under set_multithreading_enabled(False),
// and Inductor runs ops on real constants there), so a graph compiled before
// any eager neuron op would otherwise leave its backward on PyTorch's worker.
void run_backward_on_calling_thread() {
  static thread_local bool claimed = false;
  if (!claimed) {
    auto& state = c10::AutogradState::get_tls_state();
    if (state.get_multithreading_enabled()) {
      state.set_multithreading_enabled(false);
      claimed = true;
    }
  }
}

OpRecord& account_kernel(const c10::OperatorHandle& op, c10::ArrayRef<IValue> inputs) {
  CallState call;
  for (const IValue& v : inputs) {
    call.originals.push_back(v);
    if (v.isTensor() && v.toTensor().defined()) {
      add_operand_dtype(call.dtypes, v.toTensor(), /*in_list=*/false);
    }
  }
  return account(op, call);
}

OpRecord& account_device_copy(const at::Tensor& src, const at::Tensor& dst) {
  static const auto op = c10::Dispatcher::singleton().findSchemaOrThrow("aten::_copy_from", "");
  CallState call;
  call.originals.push_back(src);  // what a fallback would send to the host: the source only
  add_operand_dtype(call.dtypes, src, /*in_list=*/false);
  add_operand_dtype(call.dtypes, dst, /*in_list=*/false);
  OpRecord& record = account(op, call);
  if (call.counted_fallback) {
    record.bytes_out.fetch_add(dst.nbytes(), std::memory_order_relaxed);
  }
  return record;
}

void neuron_fallback(
    const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack) {
  {
    const auto& schema = op.schema();
    const uint8_t check = op_info(schema).cuda_device_check;
    if (check != 0) {  // before anything ran, dataless too
      const size_t n = schema.arguments().size();
      check_devices_as_cuda(schema, check,
                            c10::ArrayRef<c10::IValue>(stack->data() + stack->size() - n, n));
    }
  }
  if (C10_UNLIKELY(dataless_active())) {
    dataless_fallback(op, keys, stack);
    return;
  }
  check_not_in_bad_fork();
  run_backward_on_calling_thread();
  const auto& schema = op.schema();
  const OpInfo& info = op_info(schema);
  const auto& args = schema.arguments();
  const size_t num_args = args.size();
  const size_t begin = stack->size() - num_args;

  CallState call;
  call.originals.reserve(num_args);
  int pending_generator = -1;
  std::optional<AliasLending> lending(std::in_place);  // only while converting
  for (size_t i = 0; i < num_args; ++i) {
    IValue& slot = (*stack)[begin + i];
    call.originals.push_back(slot);
    if (slot.isNone()) {
      if (info.arg_is_generator[i]) {
        pending_generator = static_cast<int>(i);
      }
      continue;
    }
    slot = convert_argument(slot, args[i], info.arg_is_write[i], call);
    if (info.arg_is_write[i]) {
      const IValue& orig = call.originals.back();
      if (orig.isTensor() && orig.toTensor().device().type() == kNeuron) {
        call.mutated.push_back({orig.toTensor(), slot.toTensor()});
      } else if (orig.isTensorList()) {
        auto olist = orig.toTensorList();
        auto clist = slot.toTensorList();
        for (size_t j = 0; j < olist.size(); ++j) {
          call.mutated.push_back({olist.get(j), clist.get(j)});
        }
      }
    }
  }
  lending.reset();
  if (call.device == -1) {
    call.device = current_device();
  }
  if (pending_generator >= 0) {
    (*stack)[begin + pending_generator] = cpu_view_of(default_generator(call.device));
  }
  OpRecord& record = account(op, call);

  std::optional<OpNumerics> numerics;  // off unless a switch is on: one relaxed load
  if (numerics_active()) {
    numerics = numerics_before(op, record, info, call.device, *stack, begin);
  }
  {
    RouteAllocations route(call.device);
    op.redispatchBoxed(kCpuKeys, stack);
    if (numerics) {  // in the route: resized (a!) arguments must stay device memory
      c10::SmallVector<at::Tensor, 4> written;
      for (const Converted& c : call.mutated) {
        written.push_back(c.cpu);
      }
      numerics_after(*numerics, info, written, *stack);
    }
  }

  if (!call.mutated.empty()) {
    call.aliases.for_each_storage(write_back_storage);
    for (const Converted& c : call.mutated) {
      if (c.neuron.device().type() == kNeuron) {
        write_back(c);
      }
    }
  }
  const size_t num_returns = info.return_arg.size();
  const size_t out_begin = stack->size() - num_returns;
  for (size_t r = 0; r < num_returns; ++r) {
    IValue& slot = (*stack)[out_begin + r];
    const int arg = info.return_arg[r];
    const IValue* original = arg >= 0 ? &call.originals[arg] : nullptr;
    slot = return_value(std::move(slot), original, info.return_is_write[r], call);
    if (call.counted_fallback) {
      record.bytes_out.fetch_add(neuron_bytes(slot), std::memory_order_relaxed);
    }
  }
  charge_op(op, record, call.device, call.originals,
            c10::ArrayRef<IValue>(stack->data() + out_begin, num_returns));
}


at::Tensor neuron_tensor_over(c10::Storage storage, const at::Tensor& like) {
  if (like.is_nested()) {  // a nested result: its metadata is not sizes and strides
    return make_neuron_nested(std::move(storage), like);
  }
  at::Tensor out = at::detail::make_tensor<c10::TensorImpl>(
      std::move(storage), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), like.dtype());
  out.unsafeGetTensorImpl()->set_sizes_and_strides(
      like.sizes(), like.strides(), like.storage_offset());
  out._set_neg(like.is_neg());
  out._set_conj(like.is_conj());
  return out;
}

void device_mismatch(c10::Device a, c10::Device b) {
  TORCH_CHECK(
      false,
      "Expected all tensors to be on the same device, but found at least two "
      "devices, ", a, " and ", b, "!");
}

namespace {

// CPU storage objects of finished calls, emptied, for the next calls on this
// thread: making and freeing one per argument was ~300 instructions a call.
std::vector<c10::intrusive_ptr<c10::StorageImpl>>& spare_cpu_storages() {
  thread_local std::vector<c10::intrusive_ptr<c10::StorageImpl>> spares;
  return spares;
}

}  // namespace

// A CPU storage over a neuron storage's bytes, keeping it alive.
c10::Storage cpu_storage_over(c10::StorageImpl* storage) {
  c10::raw::intrusive_ptr::incref(storage);
  c10::DataPtr data(
      storage->mutable_data(), storage, &release_storage, c10::Device(c10::kCPU));
  auto& spares = spare_cpu_storages();
  if (!spares.empty()) {
    c10::intrusive_ptr<c10::StorageImpl> reused = std::move(spares.back());
    spares.pop_back();
    reused->set_data_ptr_noswap(std::move(data));
    reused->set_nbytes(storage->nbytes());
    return c10::Storage(std::move(reused));
  }
  return c10::Storage(c10::make_intrusive<c10::StorageImpl>(
      c10::StorageImpl::use_byte_size_t(), storage->nbytes(), std::move(data),
      routing_cpu_allocator(), /*resizable=*/true));
}

void make_idle(c10::StorageImpl& cpu) {
  c10::DataPtr& data = cpu.mutable_data_ptr();
  if (data.compare_exchange_deleter(&release_storage, &idle_storage)) {
    c10::raw::intrusive_ptr::decref(static_cast<c10::StorageImpl*>(data.get_context()));
  }
}

bool rearm_if_over(c10::StorageImpl& cpu, c10::StorageImpl* storage) {
  c10::DataPtr& data = cpu.mutable_data_ptr();
  if (data.get_deleter() != &idle_storage || data.get_context() != storage ||
      data.get() != storage->data() || cpu.nbytes() != storage->nbytes()) {
    return false;
  }
  c10::raw::intrusive_ptr::incref(storage);
  data.compare_exchange_deleter(&idle_storage, &release_storage);
  return true;
}

bool is_cpu_storage_over(const c10::StorageImpl& cpu, const c10::StorageImpl* storage) {
  const c10::DataPtr& data = cpu.data_ptr();
  return data.get_deleter() == &release_storage && data.get_context() == storage &&
      data.get() == storage->data() && cpu.nbytes() == storage->nbytes();
}

namespace {

// Empties a call's CPU storage (letting go of the neuron storage) and keeps the
// object for reuse, unless anything else still holds it or changed its memory.
void retire_cpu_storage(c10::Storage& cpu) {
  c10::StorageImpl* impl = cpu.unsafeGetStorageImpl();
  auto& spares = spare_cpu_storages();
  if (impl == nullptr || spares.size() >= 8 || cpu.use_count() != 1 ||
      impl->data_ptr().get_deleter() != &release_storage || !impl->resizable() ||
      impl->allocator() != routing_cpu_allocator()) {
    return;  // dropped with the call, as any storage
  }
  impl->set_data_ptr_noswap(c10::DataPtr(nullptr, c10::Device(c10::kCPU)));
  impl->set_nbytes(0);
  spares.push_back(c10::intrusive_ptr<c10::StorageImpl>::reclaim_copy(impl));
}

}  // namespace

namespace {
[[gnu::noipa]] void borrowed_storage(void*) {}
}  // namespace

at::Tensor cpu_view_borrowed(const at::Tensor& t) {
  check_holds_values(t, "reading it on the host");
  c10::StorageImpl* storage = t.storage().unsafeGetStorageImpl();
  c10::DataPtr data(storage->mutable_data(), nullptr, &borrowed_storage, c10::Device(c10::kCPU));
  return cpu_tensor_over(c10::Storage(c10::make_intrusive<c10::StorageImpl>(
                             c10::StorageImpl::use_byte_size_t(), storage->nbytes(), std::move(data),
                             /*allocator=*/nullptr, /*resizable=*/false)),
                         t);
}

at::Tensor cpu_alias(const at::Tensor& t) {
  check_holds_values(t, "reading it on the host");
  TORCH_CHECK(t.numel() == 0 || (t.has_storage() && t.storage().data() != nullptr),
              "This neuron tensor (shape ", t.sizes(), ") has no device memory behind it (a tensor "
              "subclass's wrapper, or a storage resized to 0 bytes): read its local tensor instead");
  return cpu_tensor_over(cpu_storage_over(t.storage().unsafeGetStorageImpl()), t);
}

const at::Tensor& CpuAliases::of(const at::Tensor& t) {
  check_holds_values(t, "running a neuron op on it");
  const c10::TensorImpl* impl = t.unsafeGetTensorImpl();
  for (const Alias& seen : tensors_) {
    if (seen.neuron == impl) {
      return seen.cpu;
    }
  }
  c10::StorageImpl* storage = t.storage().unsafeGetStorageImpl();
  const c10::Storage* cpu_storage = nullptr;
  for (const auto& [seen, cpu] : storages_) {
    if (seen == storage) {
      cpu_storage = &cpu;
      break;
    }
  }
  c10::BackendMeta* cache = nullptr;
  at::Tensor alias = borrow_cached_alias(t, cpu_storage, &cache);
  if (alias.defined()) {
    if (cpu_storage == nullptr) {  // the first lender's storage is the call's
      storages_.emplace_back(storage, alias.storage());
    }
  } else {
    if (cpu_storage == nullptr) {
      storages_.emplace_back(storage, cpu_storage_over(storage));
      cpu_storage = &storages_.back().second;
    }
    alias = cpu_tensor_over(*cpu_storage, t);
  }
  tensors_.push_back(Alias{impl, std::move(alias), cache});
  return tensors_.back().cpu;
}

CpuAliases::~CpuAliases() {
  for (Alias& alias : tensors_) {
    if (alias.cache == nullptr) {
      alias.cpu = at::Tensor();  // uncached aliases let go of their storages first
    }
  }
  for (auto& [neuron, cpu] : storages_) {
    retire_cpu_storage(cpu);
  }
  storages_.clear();  // so that a cached alias may be its storage's only holder
  for (Alias& alias : tensors_) {
    if (alias.cache != nullptr) {
      return_cached_alias(alias.cache, alias.cpu);
    }
  }
  tensors_.clear();
}

// Whether a fresh CPU result's TensorImpl can itself become the neuron tensor:
// nothing else holds it (or watches it through a weak reference), and it is the
// plain dense TensorImpl a CPU kernel makes, with only the dispatch keys such a
// tensor is born with (which depend on inference mode) plus the neg/conj bits.
// Checked on torch 2.13 (TensorImpl::_change_backend_component_keys and
// set_storage_keep_dtype are public members).
bool can_become_neuron(const at::Tensor& cpu) {
  static const std::array<c10::DispatchKeySet, 2> born_with = [] {
    auto keys_of_fresh_cpu_tensor = [] {
      return at::detail::make_tensor<c10::TensorImpl>(
                 c10::Storage(c10::Storage::use_byte_size_t(), 0, c10::GetCPUAllocator()),
                 c10::DispatchKeySet(c10::DispatchKey::CPU), caffe2::TypeMeta::Make<float>())
          .key_set();
    };
    std::array<c10::DispatchKeySet, 2> keys;
    keys[0] = keys_of_fresh_cpu_tensor();
    c10::InferenceMode inference;
    keys[1] = keys_of_fresh_cpu_tensor();
    return keys;
  }();
  static const c10::DispatchKeySet view_bits{c10::DispatchKey::Negative, c10::DispatchKey::Conjugate};
  const auto& ptr = cpu.getIntrusivePtr();
  c10::TensorImpl* impl = ptr.get();
  return ptr.use_count() == 1 && ptr.weak_use_count() == 1 && typeid(*impl) == typeid(c10::TensorImpl) &&
         impl->autograd_meta() == nullptr && !impl->is_wrapped_number() &&
         impl->get_backend_meta() == nullptr &&
         (impl->key_set() - view_bits) == born_with[impl->is_inference() ? 1 : 0];
}

at::Tensor adopt_cpu_result(at::Tensor cpu, c10::DeviceIndex device) {
  TORCH_CHECK_NOT_IMPLEMENTED(cpu.layout() == c10::kStrided, sparse_unsupported(cpu.layout()));
  TORCH_INTERNAL_ASSERT(
      cpu.storage().data() != nullptr || cpu.storage().nbytes() == 0,
      "torchneuron: a CPU kernel returned a tensor of ", cpu.storage().nbytes(),
      " bytes without memory (a ZeroTensor?); the op needs a neuron kernel");
  auto* storage = cpu.storage().unsafeGetStorageImpl();
  const c10::Device target(kNeuron, device);
  if (storage->data_ptr().get_deleter() == &release_storage) {
    // A view of a neuron argument the schema did not announce: keep aliasing.
    auto* neuron = static_cast<c10::StorageImpl*>(storage->data_ptr().get_context());
    return make_neuron_tensor(
        c10::Storage(c10::intrusive_ptr<c10::StorageImpl>::reclaim_copy(neuron)), cpu);
  }
  if (is_neuron_data_ptr(storage->data_ptr()) && c10::raw::intrusive_ptr::use_count(storage) == 1) {
    // Fresh device memory owned by this result alone: its storage becomes the
    // neuron storage (the CPU result, its only other holder, is dropped next).
    storage->mutable_data_ptr().unsafe_set_device(target);
    storage->set_allocator(device_allocator());
    if (can_become_neuron(cpu)) {  // and the result's TensorImpl the neuron tensor
      c10::TensorImpl* impl = cpu.unsafeGetTensorImpl();
      impl->set_storage_keep_dtype(impl->storage());  // device_opt_ follows the storage
      impl->_change_backend_component_keys(target);
      return cpu;
    }
    return make_neuron_tensor(
        c10::Storage(c10::intrusive_ptr<c10::StorageImpl>::reclaim_copy(storage)), cpu);
  }
  c10::DataPtr data;
  if (is_neuron_data_ptr(storage->data_ptr())) {
    // Device memory shared with other results: keep the CPU storage alive.
    c10::raw::intrusive_ptr::incref(storage);
    data = c10::DataPtr(storage->mutable_data(), storage, &release_cpu_storage, target);
  } else {
    // Memory that did not come from the device (e.g. a cached constant).
    data = allocate_on(device, storage->nbytes());
    if (storage->nbytes() > 0) {
      std::memcpy(data.get(), storage->data(), storage->nbytes());
    }
  }
  auto neuron_storage = c10::make_intrusive<c10::StorageImpl>(
      c10::StorageImpl::use_byte_size_t(), storage->nbytes(), std::move(data),
      device_allocator(), /*resizable=*/true);
  return make_neuron_tensor(c10::Storage(std::move(neuron_storage)), cpu);
}

// Ops with both a CPU kernel and a composite "default backend" kernel would
// run the composite on PrivateUse1. For structured ops that composite runs
// the meta function, allocates and calls the out= variant (two TensorIterator
// builds per op); for a few others (native_layer_norm, native_group_norm...)
// it is a different algorithm whose rounding differs from CPU's. The same
// holds for the two ops with a CPU kernel and a CompositeImplicitAutograd
// formula (mish_backward, native_channel_shuffle): CUDA has its own kernel
// for them, neuron would get the formula. Routing all of them to the CPU
// kernel gives CPU's exact results at CPU cost.
int64_t route_composite_ops_to_cpu_kernels() {
  static torch::Library* library = new torch::Library(
      torch::Library::IMPL, "aten", c10::DispatchKey::PrivateUse1, __FILE__, __LINE__);
  static int64_t count = -1;
  if (count >= 0) {
    return count;
  }
  count = 0;
  auto& dispatcher = c10::Dispatcher::singleton();
  for (const auto& name : dispatcher.getAllOpNames()) {
    auto op = dispatcher.findOp(name);
    if (!op || name.name.rfind("aten::", 0) != 0 ||
        op->hasKernelForDispatchKey(c10::DispatchKey::PrivateUse1)) {
      continue;
    }
    const bool cpu_kernel_and_composite =
        op->hasKernelForDispatchKey(c10::DispatchKey::CPU) &&
        (op->hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutogradNonFunctional) ||
         op->hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutograd) ||
         op->hasKernelForDispatchKey(c10::DispatchKey::CompositeImplicitAutograd));
    // Foreach ops (the default multi-tensor path of torch.optim on neuron) have
    // no CPU kernel, only a composite that runs one op per tensor: N dispatches,
    // each through this fallback. Routed here, the composite runs once on the
    // CPU aliases of all N tensors (its per-tensor ops are then CPU ops): one
    // dispatch per list, the same arithmetic. Autograd formulas sit above.
    const bool foreach_composite = name.name.rfind("aten::_foreach_", 0) == 0 &&
        !op->hasKernelForDispatchKey(c10::DispatchKey::CPU) &&
        op->hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutograd);
    if (!cpu_kernel_and_composite && !foreach_composite) {
      continue;
    }
    std::string qualified = name.name.substr(6);
    if (!name.overload_name.empty()) {
      qualified += "." + name.overload_name;
    }
    library->impl(
        qualified.c_str(), torch::CppFunction::makeFromBoxedFunction<&neuron_fallback>());
    ++count;
  }
  // Composites that refuse devices other than CPU/CUDA/XPU by name; run on the
  // CPU aliases they pass. (out= ops: no autograd formula is bypassed.)
  for (const char* name : {"mode.values"}) {
    library->impl(name, torch::CppFunction::makeFromBoxedFunction<&neuron_fallback>());
    ++count;
  }
  return count;
}

std::string sparse_unsupported(c10::Layout layout) {
  std::ostringstream message;
  message << "Tensors with layout " << layout << " are not supported on the neuron device: "
          << "Trainium has no sparse kernels (TorchNeuron runs sparse ops on the CPU). Keep "
          << "sparse tensors on the CPU, or convert them with .to_dense() before moving them "
          << "to neuron.";
  return message.str();
}

namespace {

// Sparse neuron tensors can be built from parts (a CSR tensor's .to("neuron")
// does), but no op runs on them: each raises the error above, naming the op.
void reject_sparse(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack*) {
  const auto layout = keys.has(c10::DispatchKey::SparsePrivateUse1) ? c10::kSparse : c10::kSparseCsr;
  TORCH_CHECK_NOT_IMPLEMENTED(false, op.schema().name(), ": ", sparse_unsupported(layout));
}

}  // namespace

// ==== Global Registration ====
TORCH_LIBRARY_IMPL(_, PrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&neuron_fallback>());
}

TORCH_LIBRARY_IMPL(_, SparsePrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&reject_sparse>());
}

TORCH_LIBRARY_IMPL(_, SparseCsrPrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&reject_sparse>());
}

}  // namespace torchneuron
