// Shared declarations of torchneuron's C++ core.
// Checked against torch 2.13.0 (CPU build).
#pragma once

#include <ATen/ATen.h>
#include <ATen/core/boxing/KernelFunction.h>
#include <c10/core/CachingDeviceAllocator.h>
#include <c10/core/Stream.h>
#include <c10/util/FunctionRef.h>
#include <c10/util/SmallVector.h>

#include <atomic>
#include <string>
#include <string_view>
#include <unordered_map>
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
struct DtypeKey;
struct OpRecord;
// Device indices are below this (checked when the devices are set up).
constexpr int kMaxDevices = 128;

// ---- per-thread caches ----
// Cache keys are 64-bit FNV-1a style hashes: start from kHashSeed, mix in each part.
constexpr uint64_t kHashSeed = 0xcbf29ce484222325ULL;
inline void hash_mix(uint64_t& h, uint64_t v) {
  h = (h ^ v) * 0x100000001b3ULL;
}

// A per-thread cache of the answers of a slower, locked lookup, keyed by an
// owner address (an op's schema, an op record) and 64 bits. A hit costs one
// probe of a direct-mapped array; an array miss tries a hash map of every
// key the thread has seen, then asks `slow`, which must return an object
// that lives as long as the process. Declare one thread_local per cache at
// namespace scope: the type is trivial, so it needs no initialisation guard.
// Answers of an older `generation` (bumped when cached answers are dropped)
// are misses.
template <typename T>
class ThreadCache {
 public:
  template <typename Slow>
  T& get(const void* owner, uint64_t bits, uint64_t generation, Slow&& slow) {
    Slot& slot = slots_[index(owner, bits)];
    if (slot.owner == owner && slot.bits == bits && slot.generation == generation) {
      return *slot.value;
    }
    T& value = miss(owner, bits, generation, slow);
    slot = Slot{owner, bits, generation, &value};
    return value;
  }

 private:
  static constexpr int kSlotBits = 8;
  struct Slot {  // no member initialisers: they would make the cache non-trivial
    const void* owner;
    uint64_t bits;
    uint64_t generation;
    T* value;
  };
  using Key = std::pair<const void*, uint64_t>;
  struct KeyHash {
    size_t operator()(const Key& k) const {
      return std::hash<const void*>()(k.first) ^ (k.second * 0x9E3779B97F4A7C15ULL);
    }
  };

  static size_t index(const void* owner, uint64_t bits) {
    const uint64_t h = ((reinterpret_cast<uintptr_t>(owner) >> 4) ^ bits) * 0x9E3779B97F4A7C15ULL;
    return h >> (64 - kSlotBits);
  }

  // Out of line, and one per T: the map of what this thread has seen, emptied
  // when it reaches kMaxSeen keys (a server seeing ever new shapes stays bounded).
  static constexpr size_t kMaxSeen = 1 << 14;
  static T& miss(const void* owner, uint64_t bits, uint64_t generation,
                 c10::function_ref<T&()> slow) {
    thread_local std::unordered_map<Key, T*, KeyHash> seen;
    thread_local uint64_t seen_generation = 0;
    if (seen_generation != generation || seen.size() >= kMaxSeen) {
      seen.clear();
      seen_generation = generation;
    }
    T*& value = seen[{owner, bits}];
    if (value == nullptr) {
      value = &slow();
    }
    return *value;
  }

  Slot slots_[1 << kSlotBits];
};

// ---- devices (guard.cpp) ----
// Number of logical NeuronCores the process sees; set once from Python.
c10::DeviceIndex device_count() noexcept;
void set_device_count(c10::DeviceIndex count);
c10::DeviceIndex current_device();
void set_current_device(c10::DeviceIndex index);
// Raises a RuntimeError naming the visible range if `index` is invalid.
void check_device_index(c10::DeviceIndex index);
// Raises CUDA's RuntimeError in a child forked after the parent used the
// device: its tensors cannot be read, written or allocated there (as CUDA's).
void check_not_in_bad_fork();
// The modelled device clock of the thread's current stream on `device`:
// advancing it returns where the work started on it.
double advance_current_stream(c10::DeviceIndex device, double seconds);
double current_stream_clock(c10::DeviceIndex device);
c10::StreamId current_stream_id(c10::DeviceIndex device);
// Work that joins the current streams of devices `a` and `b` (a copy between
// them): both wait for each other, then both advance by `seconds`; returns
// where it started.
double advance_current_streams_together(c10::DeviceIndex a, c10::DeviceIndex b, double seconds);
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
// Bytes held by live tensors on `device` (torch.neuron.memory_allocated).
size_t allocated_bytes(c10::DeviceIndex device);
// Device owning `ptr` (any byte inside a live segment), or -1.
c10::DeviceIndex device_of_pointer(const void* ptr);
c10::Allocator* pinned_allocator();
bool is_pinned(const void* ptr);

// While a RouteAllocations guard is alive on a thread, CPU allocations made
// by that thread come from the neuron allocator of `device`. This is how CPU
// kernels run by the fallback write their results straight into device memory.
// The scratch memory a CPU kernel allocates and frees inside the guard (a
// wrapped Python scalar, a sort's buffers) has no counterpart on Trainium: when
// the guard ends, the device's peak statistics are set back to what they were or
// to what is live then (inputs and results), whichever is higher, so peaks are
// what the device would reach (and what dataless execution, which runs no CPU
// kernel, reaches).
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

// ---- dataless execution (dataless.cpp; storages in allocator.cpp) ----
// While on (process-wide; nested switches count), neuron ops run only their shape
// logic (Meta kernels): results get their sizes, strides, aliasing and device
// memory accounting as in a normal run, and every op is counted and charged alike,
// but no bytes are read or written.
extern std::atomic<int> g_dataless_depth;
inline bool dataless_active() {
  return g_dataless_depth.load(std::memory_order_relaxed) > 0;
}
// The boxed fallback's dataless path: runs `op`'s Meta kernel on meta stand-ins of
// the neuron arguments, then gives the results neuron storages without values.
void dataless_fallback(const c10::OperatorHandle& op, c10::DispatchKeySet keys,
                       std::vector<c10::IValue>* stack);
// An op's own kernel (convolution, dropout...) called while dataless execution is
// on: the dataless fallback through the op's boxed form.
template <typename Sig, typename... Args>
decltype(auto) call_dataless(const c10::OperatorHandle& op, Args&&... args) {
  static const c10::BoxedKernel kernel = c10::BoxedKernel::makeFromFunction<&dataless_fallback>();
  return c10::impl::BoxedKernelWrapper<Sig>::call(
      kernel, op, c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), std::forward<Args>(args)...);
}
// For own kernels under dataless execution: a meta tensor with `t`'s metadata (its
// own meta storage of `t`'s storage size), and a fresh neuron tensor without values
// with a meta result's metadata.
at::Tensor meta_alias(const at::Tensor& t);
at::Tensor adopt_meta_result(const at::Tensor& meta, c10::DeviceIndex device);
// Storages whose bytes mean nothing: made or last written under dataless execution.
// Their count lets the op path skip the check while there are none (one relaxed load).
extern std::atomic<int64_t> g_storages_without_values;
bool holds_values(const c10::StorageImpl& storage);
// The value every element of a storage without values is known to have (a fill, a
// finite check: dataless values are assumed finite), NaN if unknown; nullptr if the
// storage holds values.
double* known_value(c10::StorageImpl& storage);
// An op of dataless execution wrote the storage: its bytes no longer mean anything.
void mark_without_values(c10::StorageImpl& storage);
// Outside dataless execution, reading a tensor whose storage holds no values raises
// (RuntimeError naming `what`); a no-op while there are no such storages.
void check_holds_values(const at::Tensor& t, const char* what);
// A dataless read of a value the run never computed (.item(), a copy to the host):
// asks Python (which notes the call site) for the placeholder.
c10::Scalar dataless_scalar(const at::Tensor& t, const char* what);
void fill_dataless_read(at::Tensor& cpu_dst, const at::Tensor& neuron_src);
void bind_dataless(pybind11::module_& m);

// ---- generators (generator.cpp) ----
const at::Generator& default_generator(c10::DeviceIndex device);
at::Generator new_generator(c10::DeviceIndex device);
// The CPU generator a CPU kernel may consume in place of a neuron generator.
at::Generator cpu_view_of(const at::Generator& neuron_generator);

// ---- op execution (fallback.cpp, ops.cpp) ----
// What running an op needs from its schema, worked out once per op.
struct OpInfo {
  c10::SmallVector<bool, 8> arg_is_write;  // argument annotated (a!)
  c10::SmallVector<bool, 8> arg_is_generator;  // Generator? argument
  c10::SmallVector<int, 4> return_arg;  // argument a return aliases, or -1
  c10::SmallVector<bool, 4> return_is_write;
  bool returns_view = false;  // a return aliases an argument it does not write
  int fresh_returns = 0;  // returns that alias no argument
  uint8_t cuda_device_check = 0;  // how CUDA's kernel checks devices (cuda_device_check())
};
// The schema's OpInfo, worked out once per process.
const OpInfo& op_info(const c10::FunctionSchema& schema);
// Counts one call of `op` with these operand dtypes (the boxed fallback's key); for an
// op real Trainium runs on the CPU also the bytes it would send to the host (and sets
// *counted_fallback), or refuses it in strict mode before anything ran.
OpRecord& account_op(const c10::OperatorHandle& op, const DtypeKey& dtypes,
                     c10::ArrayRef<c10::IValue> originals, bool* counted_fallback);
// Bytes of the neuron tensors in an argument or result.
size_t neuron_bytes(const c10::IValue& v);
// A neuron tensor over `storage` (a neuron storage) with the metadata of `like`. Views
// get their version counter from ADInplaceOrView above the backend.
at::Tensor neuron_tensor_over(c10::Storage storage, const at::Tensor& like);
// Runs autograd's backward of this thread's neuron work on this thread (see fallback.cpp).
void run_backward_on_calling_thread();
// The boxed fallback: runs `op` from `stack` with its CPU kernel on device memory.
void neuron_fallback(const c10::OperatorHandle& op, c10::DispatchKeySet keys,
                     std::vector<c10::IValue>* stack);
// Sends ops that have a CPU kernel and a composite default kernel to the CPU
// kernel; returns how many were routed.
int64_t route_composite_ops_to_cpu_kernels();
// The NotImplementedError text for sparse layouts, which neuron does not support.
std::string sparse_unsupported(c10::Layout layout);
// How CUDA checks this op's devices beyond what convert_tensor allows (device_checks.cpp):
// 0 not at all; 1 PyTorch's generated check (the op list comes from torch's
// native_functions.yaml); 2+ one argument must be on self's device.
uint8_t cuda_device_check(const c10::FunctionSchema& schema);
// That check over one call's arguments (CPU 0-dim tensors are no exception): for 1, the
// out= arguments, then the positional tensors, must all be on the first one's device.
void check_devices_as_cuda(const c10::FunctionSchema& schema, uint8_t check,
                           c10::ArrayRef<c10::IValue> args);
// Raises CUDA's "Expected all tensors to be on the same device" error.
[[noreturn]] void device_mismatch(c10::Device a, c10::Device b);
// Joins a neuron argument's device to an op's (-1: none yet); a second
// neuron device raises CUDA's device-mismatch error.
inline void join_device(c10::DeviceIndex& op_device, c10::Device argument) {
  if (op_device == -1) {
    op_device = argument.index();
  } else if (op_device != argument.index()) {
    device_mismatch(c10::Device(kNeuron, op_device), argument);
  }
}
// CPU tensor over the same memory as a neuron tensor (no copy).
at::Tensor cpu_alias(const at::Tensor& neuron_tensor);
// The same, but it does not keep the neuron storage alive: whoever hands it out keeps the
// neuron tensor alive while it is used (the c10d kernels, until the collective finished).
at::Tensor cpu_view_borrowed(const at::Tensor& neuron_tensor);
// The CPU aliases of one op call's neuron tensors: one CPU storage per neuron
// storage and one CPU tensor per neuron tensor, so the CPU kernel sees
// aliasing exactly as it would on CPU (is_same, is_set_to, and the memory
// overlap checks of out=, in-place and copy_ all compare storages).
//
// The CPU tensor objects are reused across calls (alias_cache.cpp): making
// and freeing two TensorImpls per argument was a third of a small op's cost.
// The CPU storages are made per call, so overlap is still seen per call.
class CpuAliases {
 public:
  CpuAliases() = default;
  CpuAliases(const CpuAliases&) = delete;
  CpuAliases& operator=(const CpuAliases&) = delete;
  ~CpuAliases();
  // The CPU alias of a (defined) neuron tensor, made on first request.
  const at::Tensor& of(const at::Tensor& neuron);
  // Calls `fn(neuron_storage, cpu_storage)` for each storage aliased so far.
  template <typename Fn>
  void for_each_storage(Fn&& fn) const {
    for (const auto& [neuron, cpu] : storages_) {
      fn(neuron, cpu);
    }
  }

 private:
  struct Alias {
    const c10::TensorImpl* neuron;
    at::Tensor cpu;
    c10::BackendMeta* cache;  // the neuron tensor's alias cache it was borrowed from, or null
  };
  c10::SmallVector<Alias, 6> tensors_;
  c10::SmallVector<std::pair<c10::StorageImpl*, c10::Storage>, 4> storages_;
};
// A new CPU tensor over `cpu_storage` with the view metadata of neuron tensor `t`.
at::Tensor cpu_tensor_over(c10::Storage cpu_storage, const at::Tensor& t);
// A CPU storage over a neuron storage's bytes, holding a reference to it.
c10::Storage cpu_storage_over(c10::StorageImpl* storage);
// An idle cached alias storage lets go of its reference to the neuron storage (whose
// tensor keeps it alive), so the storage's use count is what it is on CUDA: autograd
// accumulates gradients in place only into storages nothing else holds.
void make_idle(c10::StorageImpl& cpu);
// Takes the reference back if `cpu` is an idle storage over `storage`'s current bytes.
bool rearm_if_over(c10::StorageImpl& cpu, c10::StorageImpl* storage);
// Whether `cpu` is a CPU storage over `storage`'s current bytes (made by
// cpu_storage_over, and the neuron storage not resized or emptied since).
bool is_cpu_storage_over(const c10::StorageImpl& cpu, const c10::StorageImpl* storage);
// `t`'s cached CPU alias with `t`'s view metadata when the cache is free, else
// undefined; `*cache` then names the cache to give it back to with
// return_cached_alias. Its storage is `call_storage` when the call already has
// one for `t`'s storage, else the cache's own (renewed if stale).
at::Tensor borrow_cached_alias(const at::Tensor& t, const c10::Storage* call_storage,
                               c10::BackendMeta** cache);
// Gives a borrowed alias back unless something else kept a reference to it, in
// which case the cache forgets it.
void return_cached_alias(c10::BackendMeta* cache, at::Tensor& alias);
// Forgets `t`'s cached alias (and with it the CPU storage it keeps over `t`'s
// old storage): for set_, which gives `t` another storage.
void forget_cached_alias(const at::Tensor& t);
// Neuron tensor on `device` that takes over the memory of a fresh CPU result.
// Moving in a result nothing else holds lets its TensorImpl itself become the
// neuron tensor (no second TensorImpl per call).
at::Tensor adopt_cpu_result(at::Tensor cpu_result, c10::DeviceIndex device);
// torch.empty_strided(size, stride, dtype=dtype, device=neuron:<device>) without
// the dispatcher: what the registered empty_strided kernel runs (ops.cpp), also
// bound for compiled code (module.cpp). `device` must be a valid index.
at::Tensor empty_strided_on(c10::DeviceIndex device, c10::IntArrayRef size,
                            c10::IntArrayRef stride, c10::ScalarType dtype);

// ---- nested tensors (nested.cpp) ----
// A neuron nested tensor over `storage` (a neuron storage) with the metadata
// of the CPU nested tensor `like`; the metadata stays on the host, as CUDA's.
at::Tensor make_neuron_nested(c10::Storage storage, const at::Tensor& like);
// The dense shape the cost model sees for a nested tensor: (rows, last dim)
// when the last dim is regular, else (elements,).
c10::SmallVector<int64_t, 2> nested_cost_sizes(const at::Tensor& nested);

// ---- the per-call record of device work (events.cpp) ----
// What one event is: the kinds a trace shows on a device's tracks.
// kMemory is not device work: a sample of a device's allocated bytes (in `bytes`) after
// an allocation or free, taken while a recorder is open (the trace's memory counter).
enum class WorkKind : uint8_t {
  kOp, kCopy, kCompiledKernel, kNkiKernel, kCollective, kHostSync, kCpuFallback, kMemory
};
struct WorkEvent {
  const char* name;  // an op record's name or an interned string: lives as long as the process
  const char* engine;  // "TensorE", ... or nullptr
  const char* site;  // the issuing Python line (TORCH_NEURONX_ENABLE_STACK_TRACE), interned, or nullptr
  int64_t host_ns;  // the profiler's clock when the host issued the work
  double device_start;  // the stream's modelled clock where the work started (s)
  double seconds;  // its modelled duration
  double flops;
  uint64_t bytes;
  uint64_t correlation;  // the host op's profiler correlation id, or 0
  c10::StreamId stream;
  int32_t thread;  // the issuing host thread (OS id)
  c10::DeviceIndex device;
  WorkKind kind;
};
// How many recorders (profiler sessions, accounting.recording() blocks) are open.
extern std::atomic<int> g_event_recorders;
// The op path's only cost while no profiler records: one relaxed load.
inline bool recording_events() {
  return g_event_recorders.load(std::memory_order_relaxed) > 0;
}
void record_event(WorkKind kind, const char* name, c10::DeviceIndex device, double device_start,
                  double seconds, uint64_t bytes, double flops, const char* engine);
// A device's allocated bytes changed (allocator.cpp calls it while recording_events()).
void record_memory_event(c10::DeviceIndex device, uint64_t allocated);
const char* intern_name(std::string_view name);
const char* work_kind_name(WorkKind kind);
int64_t event_clock_ns();
// The calling host thread's OS id, as events record it (WorkEvent::thread).
int32_t host_thread_id();
void push_correlation(uint64_t id);
void pop_correlation();
// A recorder opens and closes around what it records; recorders are independent (a
// profiler session and an accounting.recording() block may overlap). open returns a
// mark; close returns the events since it (and how many were dropped past the
// record's capacity meanwhile); the buffer empties when the last recorder closes.
struct RecordingMark {
  uint64_t first = 0;  // sequence number of the first event after the mark
  uint64_t dropped = 0;
};
RecordingMark open_recording();
std::vector<WorkEvent> close_recording(const RecordingMark& mark, uint64_t* dropped);
void bind_events(pybind11::module_& m);
void bind_profiler(pybind11::module_& m);

// ---- op accounting (metrics.cpp) ----
// The dtypes of an op's tensor arguments (first 7) packed into one integer.
struct DtypeKey {
  uint64_t bits = 0;
  c10::SmallVector<c10::ScalarType, 7> dtypes;
  void add(c10::ScalarType t);
};
// Adds a defined tensor's dtype to the op's key. A list's tensors count once
// per run of equal dtypes (foreach lists); Python numbers wrapped as tensors
// are immediates, not operands.
void add_operand_dtype(DtypeKey& key, const at::Tensor& t, bool in_list);
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
  // Fallback calls made by PyTorch's own internals that compute on the host by
  // design (GradScaler's float64 reciprocal): run, never refused, not the program's.
  std::atomic<uint64_t> internal_calls{0};
  // The numerics rule word (device/numerics.record_rules): bit 0 --auto-cast matmult
  // rounds the op, bit 1 --auto-cast all does, bit 2 stochastic rounding applies.
  uint8_t numerics_rule = 0;
};
// The record of `op` with these dtypes; the first call per pair asks Python.
OpRecord& op_record(const c10::OperatorHandle& op, const DtypeKey& key);
// Tells Python's observer about one call of an op real Trainium runs on the
// host (it notes the call site and warns once per op); true if the call comes
// from a PyTorch internal that computes on the host by design.
bool observe_fallback_call(const OpRecord& record);
bool strict_fallback();
// A host read that waits for `device` (.item(), a copy to the host): counted and recorded.
void count_host_sync(c10::DeviceIndex device);
void bind_metrics(pybind11::module_& m);
// torch's own name of a dtype ("float32"), which the Python hardware model speaks.
pybind11::str dtype_name(c10::ScalarType t);

// Counts an op run by its own kernel (not the fallback) and, in strict mode,
// refuses it if real Trainium runs it on the CPU; call before running it.
OpRecord& account_kernel(const c10::OperatorHandle& op, c10::ArrayRef<c10::IValue> inputs);
// Counts a copy between two tensors on one neuron device as the op
// aten::_copy_from(src, dst), placed by its dtypes like any op: a cast to a dtype
// Trainium lacks (x.double()) is a CPU fallback, counted, warned and refused in
// strict mode as one. Call before copying.
OpRecord& account_device_copy(const at::Tensor& src, const at::Tensor& dst);

// ---- modelled device time (costing.cpp) ----
// Charges an op's modelled Trainium time to the current stream of `device`.
// `inputs` are the op's arguments as the caller passed them, `outputs` its
// results; the cost is asked of Python once per op, dtypes and shapes.
void charge_op(const c10::OperatorHandle& op, OpRecord& record, c10::DeviceIndex device,
               c10::ArrayRef<c10::IValue> inputs, c10::ArrayRef<c10::IValue> outputs);
// An op's cost key: from kHashSeed, each argument in schema order, hashed by
// these parts (charge_op hashes boxed arguments with them, fastpath.cpp
// unboxed ones, so both find the same entry). Float arguments (learning
// rates, scales) do not change an op's cost and change every step in
// optimizers: they stay out of the key.
void hash_cost_tensor(uint64_t& h, const at::Tensor& t);  // sizes, dtype, contiguity; undefined too
inline void hash_cost_int(uint64_t& h, int64_t v) {
  hash_mix(h, static_cast<uint64_t>(v));
}
inline void hash_cost_float(uint64_t& h) {
  hash_mix(h, 0xd0b1e);
}
inline void hash_cost_bool(uint64_t& h, bool v) {
  hash_mix(h, v ? 3 : 2);
}
inline void hash_cost_none(uint64_t& h) {
  hash_mix(h, 0x404e);
}
inline void hash_cost_list(uint64_t& h) {  // then each element
  hash_mix(h, 0x1157);
}
inline void hash_cost_scalar(uint64_t& h, const c10::Scalar& v) {  // as its boxed IValue
  if (v.isFloatingPoint()) {
    hash_cost_float(h);
  } else if (v.isBoolean()) {
    hash_cost_bool(h, v.toBool());
  } else if (v.isIntegral(/*includeBool=*/false)) {
    hash_cost_int(h, v.toLong());
  }  // complex: not part of the key
}
// charge_op for a caller that built the cost key itself; `describe` gives the
// arguments and results, on a cache miss only.
void charge_op_keyed(
    const c10::OperatorHandle& op, OpRecord& record, c10::DeviceIndex device, uint64_t key,
    c10::function_ref<std::pair<std::vector<c10::IValue>, std::vector<c10::IValue>>()> describe);
// A host<->device copy of `bytes`: counted on its link, charged to the
// current stream of `device` (cost model on) and recorded.
void charge_transfer(c10::DeviceIndex device, size_t bytes, bool to_device);
// Charges a copy between neuron tensors: on one device an HBM copy (the cost
// model's data-movement formula), between devices a DMA over the interconnect.
// `record` is account_device_copy's for a copy within one device (placement and
// totals), unused between devices.
void charge_device_copy(const at::Tensor& src, const at::Tensor& dst, OpRecord* record);
void bind_costing(pybind11::module_& m);

// ---- opt-in Trainium numerics (numerics.cpp) ----
bool numerics_active();  // any switch on (cheap check for the hot path)

// What the numerics switches do to one op call, from before its kernel runs
// to after. Auto-cast: FP32 operands are rounded to the cast type and FP32
// results rounded again. Stochastic: the op computes in FP32 (BF16 operands
// widened, BF16 (a!) arguments replaced by FP32 stand-ins) and its BF16
// results are rounded stochastically, as an engine writing BF16 does.
struct OpNumerics {
  enum class Mode : uint8_t { kNone, kAutocast, kStochastic };
  Mode mode = Mode::kNone;
  c10::DeviceIndex device = -1;
  uint32_t bf16_returns = 0;  // stochastic: results CPU returns as BF16, a bit per return
  // BF16 operands and their FP32 copies; a tensor passed twice is widened once.
  c10::SmallVector<std::pair<at::Tensor, at::Tensor>, 4> widened;
  // BF16 (a!) arguments and the FP32 stand-ins the kernel writes instead.
  c10::SmallVector<std::pair<at::Tensor, at::Tensor>, 2> stand_ins;
};

// The fallback's: applies the switches to the op's arguments on the stack
// (converted to CPU aliases), then to what the kernel wrote: `written` the
// CPU aliases of its (a!) arguments, its results on top of the stack.
OpNumerics numerics_before(const c10::OperatorHandle& op, const OpRecord& record,
                           const OpInfo& info, c10::DeviceIndex device,
                           std::vector<c10::IValue>& stack, size_t begin);
void numerics_after(OpNumerics& numerics, const OpInfo& info, c10::ArrayRef<at::Tensor> written,
                    std::vector<c10::IValue>& stack);

// Own kernels (convolution, in-place addr) see CPU aliases, not a stack; the
// record says whether --auto-cast applies to it. Each result has the dtype of
// the operands.
OpNumerics kernel_numerics(const OpRecord& record, c10::ArrayRef<at::Tensor> operands,
                           c10::DeviceIndex device);
at::Tensor numerics_operand(OpNumerics& numerics, const at::Tensor& cpu);  // as the engine reads it
at::Tensor numerics_result(OpNumerics& numerics, const at::Tensor& cpu);  // as the engine writes it

// Stochastic FP32->BF16 rounding of a copy; false if it does not apply.
bool stochastic_round_copy(at::Tensor& cpu_dst, const at::Tensor& cpu_src, c10::DeviceIndex device);
void wrap_int64_copy(at::Tensor& cpu_dst);
void bind_numerics(pybind11::module_& m);

}  // namespace torchneuron
