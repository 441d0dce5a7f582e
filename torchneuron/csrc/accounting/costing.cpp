// Modelled Trainium time of each op the fallback runs, and of copies. The
// cost of one op with given dtypes, shapes and non-tensor arguments is asked
// of Python's cost model (torchneuron/device/cost.py) once and cached; each
// call then adds it to the current stream's modelled clock (guard.cpp) and
// counts it. A copy within a device is costed the same way; a copy that
// leaves a device is a DMA fixed cost plus its bytes over the link it
// crosses (host link, or between devices), with rates set from Python.
// Checked against torch 2.13.0.
//
// Hot-path cost: hashing the argument shapes and one probe of a thread-local cache.
// Memory: bounded (kCostCacheCapacity combinations, then a flush).
#include "../core.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/utils/pybind.h>

#include <array>
#include <atomic>
#include <deque>
#include <map>
#include <mutex>

namespace torchneuron {
namespace {

using c10::IValue;

// One (op, dtypes, shapes, arguments) combination.
struct CostEntry {
  double seconds = 0;  // modelled, for the configured target
  double flops = 0;
  uint64_t bytes = 0;  // HBM bytes read and written
  const char* name = nullptr;  // for events: the op record's name
  const char* engine = nullptr;  // the engine that bounds it, for events
  WorkKind kind = WorkKind::kOp;
  std::atomic<uint64_t> calls{0};
  py::object description;  // (op, args, outputs, cpu_fallback): lets Python re-cost it
};

std::atomic<bool> g_costing{true};
// Copies that leave a device: a DMA fixed cost plus bytes over a link.
std::atomic<double> g_transfer_fixed_seconds{0};
std::atomic<double> g_host_link_bytes_per_second{0};
// Between devices: within one chip, or from chip to chip; g_chip_of says which.
std::atomic<double> g_same_chip_bytes_per_second{0};
std::atomic<double> g_cross_chip_bytes_per_second{0};
std::array<std::atomic<int>, kMaxDevices> g_chip_of{};
std::atomic<uint64_t> g_generation{1};
// Lock order: the GIL, then g_cost_mutex (a miss calls into Python).
std::mutex g_cost_mutex;
// The cache is bounded: a program that keeps meeting new shapes (a server
// with variable sequence lengths) would otherwise grow without end. When it
// holds kCostCacheCapacity combinations it is emptied (a flush): the entries
// retire, every thread's cache of them goes stale (g_generation), and each
// combination still in use is costed again on its next call. Retired entries
// are freed at the flush after, long after any thread could still be
// charging one. Per-op totals (OpRecord) are unaffected; estimate() pins the
// cache while it runs, since it re-costs every combination it saw.
constexpr size_t kCostCacheCapacity = 1 << 13;
std::atomic<size_t> g_capacity{kCostCacheCapacity};
int g_pins = 0;  // estimate() calls in progress; no flush while > 0
uint64_t g_flushes = 0;
// Stable addresses. Leaked on purpose: the entries hold Python objects, which
// must not be released after Python exits. Both are swapped under the lock.
std::deque<CostEntry>* g_entries = new std::deque<CostEntry>();
std::deque<CostEntry>* g_retired = new std::deque<CostEntry>();
// Keyed by owner (an op's record, or kDeviceCopy) and a hash of the arguments.
std::map<std::pair<const void*, uint64_t>, CostEntry*> g_index;
py::object* g_cost_oracle = nullptr;  // leaked on purpose, as metrics.cpp's oracle
const char kDeviceCopy = 0;  // the owner of copies within a device

void hash_sizes(uint64_t& h, c10::IntArrayRef sizes) {
  hash_mix(h, 0x7e45 + sizes.size());
  for (int64_t s : sizes) {
    hash_mix(h, static_cast<uint64_t>(s));
  }
}

void hash_tensor(uint64_t& h, const at::Tensor& t) {
  if (!t.defined()) {
    hash_mix(h, 1);
    return;
  }
  if (C10_UNLIKELY(t.is_nested())) {  // no sizes(): the dense shape describe() gives it
    hash_sizes(h, nested_cost_sizes(t));
  } else {
    hash_sizes(h, t.sizes());
  }
  hash_mix(h, static_cast<uint64_t>(t.scalar_type()) << 1 | t.is_contiguous());
}

// The common kinds first: this runs for every argument of every op.
void hash_value(uint64_t& h, const IValue& v) {
  if (v.isTensor()) {
    hash_tensor(h, v.toTensor());
  } else if (v.isInt()) {
    hash_cost_int(h, v.toInt());
  } else if (v.isDouble()) {
    hash_cost_float(h);
  } else if (v.isBool()) {
    hash_cost_bool(h, v.toBool());
  } else if (v.isNone()) {
    hash_cost_none(h);
  } else if (v.isList()) {  // lists of tensors, ints and bools too
    hash_cost_list(h);
    for (const IValue& e : v.toListRef()) {
      hash_value(h, e);
    }
  }
}

py::object describe(const IValue& v) {
  if (v.isTensor()) {
    const at::Tensor& t = v.toTensor();
    if (!t.defined()) {
      return py::none();
    }
    // A nested tensor is described by a dense shape of the same elements.
    std::vector<int64_t> sizes;
    if (t.is_nested()) {
      const auto nested = nested_cost_sizes(t);
      sizes.assign(nested.begin(), nested.end());
    } else {
      sizes = t.sizes().vec();
    }
    return py::make_tuple("tensor", py::tuple(py::cast(sizes)),
                          dtype_name(t.scalar_type()), t.is_contiguous());
  }
  if (v.isTensorList() || v.isList()) {
    py::list out;
    for (const IValue& e : v.toListRef()) {
      out.append(describe(e));
    }
    return out;
  }
  if (v.isInt()) return py::int_(v.toInt());
  if (v.isDouble()) return py::float_(v.toDouble());
  if (v.isBool()) return py::bool_(v.toBool());
  if (v.isIntList()) return py::tuple(py::cast(v.toIntVector()));
  if (v.isBoolList()) {
    py::list out;
    for (bool b : v.toBoolList()) {
      out.append(py::bool_(b));
    }
    return out;
  }
  if (v.isString()) return py::str(v.toStringRef());
  return py::none();
}

// Retires every entry (see kCostCacheCapacity); holds the GIL and g_cost_mutex.
void flush_locked() {
  delete g_retired;  // drops Python objects: the GIL is held
  g_retired = g_entries;
  g_entries = new std::deque<CostEntry>();
  g_index.clear();
  g_generation.fetch_add(1);
  ++g_flushes;
}

// The entry of (owner, key), asking Python for its cost on the first call;
// `describe` gives (op, args, outputs, cpu_fallback) and runs with the GIL held.
template <typename Describe>
CostEntry& lookup_slow(const void* owner, uint64_t key, Describe& describe) {
  py::gil_scoped_acquire gil;
  std::lock_guard<std::mutex> lock(g_cost_mutex);
  auto it = g_index.find({owner, key});
  if (it != g_index.end()) {
    return *it->second;
  }
  py::tuple description = describe();
  double seconds = 0, flops = 0;
  uint64_t bytes = 0;
  const char* engine = nullptr;
  try {
    // (seconds, flops, bytes, engine or "")
    py::tuple cost = (*g_cost_oracle)(*description);
    seconds = cost[0].template cast<double>();
    flops = cost[1].template cast<double>();
    bytes = cost[2].template cast<uint64_t>();
    const std::string engine_name = cost[3].template cast<std::string>();
    engine = engine_name.empty() ? nullptr : intern_name(engine_name);
  } catch (py::error_already_set& e) {
    throw std::runtime_error(std::string("torchneuron's cost model failed on ") +
                             py::str(description[0]).template cast<std::string>() + ": " + e.what());
  }
  if (g_entries->size() >= g_capacity.load(std::memory_order_relaxed) && g_pins == 0) {
    flush_locked();
  }
  CostEntry& entry = g_entries->emplace_back();
  entry.seconds = seconds;
  entry.flops = flops;
  entry.bytes = bytes;
  entry.engine = engine;
  entry.name = intern_name(py::str(description[0]).template cast<std::string>());
  entry.kind = description[3].template cast<bool>() ? WorkKind::kCpuFallback
      : owner == &kDeviceCopy                      ? WorkKind::kCopy
                                                   : WorkKind::kOp;
  entry.description = std::move(description);
  g_index[{owner, key}] = &entry;
  return entry;
}

thread_local ThreadCache<CostEntry> t_entries;

// The entry of (owner, key): one probe of a thread-local cache on a hit.
template <typename Describe>
CostEntry& entry_for(const void* owner, uint64_t key, Describe&& describe) {
  return t_entries.get(owner, key, g_generation.load(std::memory_order_relaxed),
                       [&]() -> CostEntry& { return lookup_slow(owner, key, describe); });
}

// One piece of work on the current stream of `device`: `seconds` are added to it if
// `costed` (else the work takes no modelled time), and it is recorded as an event
// while a recorder is open. Every charge goes through here.
void charge_work(WorkKind kind, const char* name, c10::DeviceIndex device, double seconds,
                 bool costed, uint64_t bytes, double flops, const char* engine) {
  const double start =
      costed ? advance_current_stream(device, seconds) : current_stream_clock(device);
  if (C10_UNLIKELY(recording_events())) {
    record_event(kind, name, device, start, costed ? seconds : 0, bytes, flops, engine);
  }
}

// Counts one call of `entry` and adds its time to the current stream of `device`.
void charge(CostEntry& entry, c10::DeviceIndex device) {
  entry.calls.fetch_add(1, std::memory_order_relaxed);
  charge_work(entry.kind, entry.name, device, entry.seconds, /*costed=*/true, entry.bytes,
              entry.flops, entry.engine);
}

// With the cost model off an op still ran: recorded with no modelled time.
void record_uncosted(const OpRecord& record, c10::DeviceIndex device) {
  charge_work(record.fallback ? WorkKind::kCpuFallback : WorkKind::kOp, record.op.c_str(), device,
              0, /*costed=*/false, 0, 0, nullptr);
}

// One call of an op: its modelled time added to its record and to the stream.
void charge_op_entry(OpRecord& record, c10::DeviceIndex device, CostEntry& entry) {
  record.modeled_ns.fetch_add(static_cast<uint64_t>(entry.seconds * 1e9), std::memory_order_relaxed);
  charge(entry, device);
}

bool costing() {
  return g_costing.load(std::memory_order_relaxed) && g_cost_oracle != nullptr;
}

py::tuple describe_op(const c10::OperatorHandle& op, const OpRecord& record,
                      c10::ArrayRef<IValue> inputs, c10::ArrayRef<IValue> outputs) {
  py::dict args;
  const auto& arguments = op.schema().arguments();
  for (size_t i = 0; i < inputs.size() && i < arguments.size(); ++i) {
    args[py::str(arguments[i].name())] = describe(inputs[i]);
  }
  py::list outs;
  for (const IValue& v : outputs) {
    outs.append(describe(v));
  }
  return py::make_tuple(record.op, args, outs, record.fallback);
}

// Copies that leave a device, by the link they cross, for estimate() to
// re-cost per target: [host->device, device->host, same chip, cross chip].
struct TransferCount {
  std::atomic<uint64_t> copies{0};
  std::atomic<uint64_t> bytes{0};
};
enum TransferKind { kToDevice, kToHost, kSameChip, kCrossChip, kTransferKinds };
std::array<TransferCount, kTransferKinds> g_transfers;
constexpr std::array<const char*, kTransferKinds> kTransferNames{
    "host_to_device", "device_to_host", "device_to_device_same_chip", "device_to_device_cross_chip"};

void count_transfer(TransferKind kind, size_t bytes) {
  g_transfers[kind].copies.fetch_add(1, std::memory_order_relaxed);
  g_transfers[kind].bytes.fetch_add(bytes, std::memory_order_relaxed);
}

// A DMA that leaves a device: its fixed cost plus the bytes at the link's rate.
double dma_seconds(size_t bytes, const std::atomic<double>& link_bytes_per_second) {
  return g_transfer_fixed_seconds.load(std::memory_order_relaxed) +
      bytes / link_bytes_per_second.load(std::memory_order_relaxed);
}

}  // namespace

void charge_op(const c10::OperatorHandle& op, OpRecord& record, c10::DeviceIndex device,
               c10::ArrayRef<IValue> inputs, c10::ArrayRef<IValue> outputs) {
  if (!costing()) {
    record_uncosted(record, device);
    return;
  }
  uint64_t key = kHashSeed;
  for (const IValue& v : inputs) {
    hash_value(key, v);
  }
  charge_op_entry(record, device,
                  entry_for(&record, key, [&] { return describe_op(op, record, inputs, outputs); }));
}

void charge_op_keyed(
    const c10::OperatorHandle& op, OpRecord& record, c10::DeviceIndex device, uint64_t key,
    c10::function_ref<std::pair<std::vector<IValue>, std::vector<IValue>>()> describe) {
  if (!costing()) {
    record_uncosted(record, device);
    return;
  }
  charge_op_entry(record, device, entry_for(&record, key, [&] {
    auto [inputs, outputs] = describe();
    return describe_op(op, record, inputs, outputs);
  }));
}

void hash_cost_tensor(uint64_t& h, const at::Tensor& t) {
  hash_tensor(h, t);
}

void charge_transfer(c10::DeviceIndex device, size_t bytes, bool to_device) {
  count_transfer(to_device ? kToDevice : kToHost, bytes);
  const bool costed = g_costing.load(std::memory_order_relaxed) &&
      g_host_link_bytes_per_second.load(std::memory_order_relaxed) > 0;
  charge_work(WorkKind::kCopy, to_device ? "copy host -> device" : "copy device -> host", device,
              costed ? dma_seconds(bytes, g_host_link_bytes_per_second) : 0, costed, bytes, 0,
              "DMA");
}

void charge_device_copy(const at::Tensor& src, const at::Tensor& dst, OpRecord* record) {
  const c10::DeviceIndex from = src.device().index(), to = dst.device().index();
  if (from != to) {
    const bool same_chip = g_chip_of[from].load(std::memory_order_relaxed) ==
        g_chip_of[to].load(std::memory_order_relaxed);
    count_transfer(same_chip ? kSameChip : kCrossChip, src.nbytes());
    const auto& link = same_chip ? g_same_chip_bytes_per_second : g_cross_chip_bytes_per_second;
    double start = std::max(current_stream_clock(from), current_stream_clock(to)), seconds = 0;
    if (costing() && link.load(std::memory_order_relaxed) > 0) {  // 0 until Python sets the rates
      seconds = dma_seconds(src.nbytes(), link);
      start = advance_current_streams_together(from, to, seconds);
    }
    if (C10_UNLIKELY(recording_events())) {
      const char* name = same_chip ? "copy device -> device (same chip)"
                                   : "copy device -> device (chip to chip)";
      record_event(WorkKind::kCopy, name, from, start, seconds, src.nbytes(), 0, "DMA");
      record_event(WorkKind::kCopy, name, to, start, seconds, src.nbytes(), 0, "DMA");
    }
    return;
  }
  TORCH_INTERNAL_ASSERT(record != nullptr, "a copy within a device needs its record");
  if (!costing()) {
    charge_work(record->fallback ? WorkKind::kCpuFallback : WorkKind::kCopy, "aten::_copy_from",
                to, 0, /*costed=*/false, src.nbytes() + dst.nbytes(), 0, nullptr);
    return;
  }
  // Within a device the cost model prices it as the op _copy_from(src, dst) where
  // its record placed it: an HBM read and write, or a VectorE pass when the dtype
  // changes; a CPU fallback's transfers for a dtype Trainium lacks.
  uint64_t key = kHashSeed;
  hash_mix(key, reinterpret_cast<uintptr_t>(record));  // a new decision is a new entry
  hash_tensor(key, src);
  hash_tensor(key, dst);
  charge_op_entry(*record, to, entry_for(&kDeviceCopy, key, [&] {
    py::dict args;
    args["self"] = describe(IValue(src));
    args["dst"] = describe(IValue(dst));
    py::list outputs;
    outputs.append(describe(IValue(dst)));
    return py::make_tuple("aten::_copy_from", args, outputs, record->fallback);
  }));
}

namespace {

void set_cost_oracle(py::object oracle) {
  py::gil_scoped_acquire gil;
  std::lock_guard<std::mutex> lock(g_cost_mutex);
  if (g_cost_oracle == nullptr) {
    g_cost_oracle = new py::object();
  }
  *g_cost_oracle = std::move(oracle);
  flush_locked();  // costs of another target or model
}

py::list cost_entries() {
  std::lock_guard<std::mutex> lock(g_cost_mutex);
  py::list out;
  for (const auto& [key, entry] : g_index) {
    uint64_t calls = entry->calls.load();
    if (calls > 0) {
      out.append(py::make_tuple(entry->description, calls, entry->seconds));
    }
  }
  return out;
}

void reset_cost_counts() {
  std::lock_guard<std::mutex> lock(g_cost_mutex);
  for (auto& entry : *g_entries) {
    entry.calls = 0;
  }
  for (TransferCount& t : g_transfers) {
    t.copies = 0;
    t.bytes = 0;
  }
}

// ---- compiled kernels (torchneuron/device/kernel_costs.py) ----
// Code generated by torch.compile registers each fused kernel in a slot (its
// modelled seconds on the configured target) and charges the slot after each
// run: a call from Python per kernel run, so it is a METH_FASTCALL function
// (no pybind11 argument conversion). Slots are set and charged from Python
// with the GIL held; a deque keeps their addresses stable as slots are added.
struct KernelSlot {
  double seconds = 0;
  double flops = 0;
  uint64_t bytes = 0;
  const char* name = "compiled kernel";
  std::atomic<uint64_t> calls{0};
};
std::deque<KernelSlot>& g_kernels = *new std::deque<KernelSlot>();  // leaked: outlives Python

void set_kernel_cost(int64_t slot, double seconds, double flops, uint64_t bytes,
                     const std::string& name) {
  TORCH_CHECK_INDEX(slot >= 0 && static_cast<size_t>(slot) <= g_kernels.size(),
                    "compiled-kernel slots are added in order: got slot ", slot, " with ",
                    g_kernels.size(), " registered");
  if (static_cast<size_t>(slot) == g_kernels.size()) {
    g_kernels.emplace_back();
  }
  KernelSlot& kernel = g_kernels[slot];
  kernel.seconds = seconds;
  kernel.flops = flops;
  kernel.bytes = bytes;
  if (!name.empty()) {
    kernel.name = intern_name(name);
  }
}

// ---- named device work that does not run through the op path ----
// NKI kernels and collectives: calls and modelled totals per (kind, name).
struct WorkTotals {
  uint64_t calls = 0;
  double seconds = 0;
  double flops = 0;
  uint64_t bytes = 0;
  uint64_t instructions = 0;  // NKI kernels: instructions issued
};
std::mutex g_work_mutex;
std::map<std::pair<int, std::string>, WorkTotals> g_work;

void record_work(int kind, const std::string& name, int device, double seconds, double flops,
                 uint64_t bytes, uint64_t instructions, const std::string& engine) {
  TORCH_CHECK_VALUE(kind == static_cast<int>(WorkKind::kNkiKernel) ||
                        kind == static_cast<int>(WorkKind::kCollective),
                    "_record_work records NKI kernels and collectives, got kind ", kind);
  TORCH_CHECK_VALUE(seconds >= 0, "modelled seconds must be non-negative, got ", seconds);
  // device -1: run on CPU tensors (an NKI kernel on the host), counted but on no stream.
  if (device < -1 || device >= device_count()) {
    check_device_index(static_cast<c10::DeviceIndex>(device));  // raises the invalid-index error
  }
  const auto index = static_cast<c10::DeviceIndex>(device);
  const bool costed = g_costing.load(std::memory_order_relaxed) && index >= 0;
  if (index >= 0) {
    charge_work(static_cast<WorkKind>(kind), intern_name(name), index, seconds, costed, bytes,
                flops, engine.empty() ? nullptr : intern_name(engine));
  }
  {
    std::lock_guard<std::mutex> lock(g_work_mutex);
    WorkTotals& totals = g_work[{kind, name}];
    totals.calls += 1;
    totals.seconds += costed ? seconds : 0;
    totals.flops += flops;
    totals.bytes += bytes;
    totals.instructions += instructions;
  }
}

// _charge_kernel(slot, device): one run of the kernel in `slot` on `device`.
PyObject* charge_kernel(PyObject* /*module*/, PyObject* const* args, Py_ssize_t nargs) {
  HANDLE_TH_ERRORS
  TORCH_CHECK_TYPE(nargs == 2, "_charge_kernel(slot, device) takes 2 arguments, got ", nargs);
  const long slot = PyLong_AsLong(args[0]);
  const long device = PyLong_AsLong(args[1]);
  if ((slot == -1 || device == -1) && PyErr_Occurred()) {
    throw python_error();
  }
  TORCH_CHECK_INDEX(slot >= 0 && static_cast<size_t>(slot) < g_kernels.size(),
                    "no compiled kernel is registered in slot ", slot);
  if (device < 0 || device >= device_count()) {
    check_device_index(-1);  // raises the invalid-index error
  }
  KernelSlot& kernel = g_kernels[slot];
  kernel.calls.fetch_add(1, std::memory_order_relaxed);
  charge_work(WorkKind::kCompiledKernel, kernel.name, static_cast<c10::DeviceIndex>(device),
              kernel.seconds, g_costing.load(std::memory_order_relaxed), kernel.bytes, kernel.flops,
              nullptr);
  Py_RETURN_NONE;
  END_HANDLE_TH_ERRORS
}

PyMethodDef g_costing_methods[] = {
    {"_charge_kernel", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(
         &charge_kernel)), METH_FASTCALL,
     "_charge_kernel(slot, device): counts one run of the compiled kernel in `slot` and adds "
     "its modelled seconds to the thread's current stream of `device`."},
    {nullptr, nullptr, 0, nullptr}};

}  // namespace

void bind_costing(py::module_& m) {
  if (PyModule_AddFunctions(m.ptr(), g_costing_methods) != 0) {
    throw py::error_already_set();
  }
  m.def("_set_kernel_cost", &set_kernel_cost,
        "Sets compiled-kernel `slot`'s modelled seconds, FLOPs, bytes and name "
        "(slot == count adds one).");
  m.def("_record_work", &record_work,
        "_record_work(kind, name, device, seconds, flops, bytes, instructions, engine): one NKI kernel "
        "(kind 3) or collective (kind 4) run on `device`: counted, its modelled seconds added "
        "to the thread's current stream (cost model on) and recorded as an event.");
  m.def("_work_totals", []() {
    std::lock_guard<std::mutex> lock(g_work_mutex);
    py::list out;
    for (const auto& [key, t] : g_work) {
      out.append(py::make_tuple(work_kind_name(static_cast<WorkKind>(key.first)), key.second,
                                t.calls, t.seconds, t.flops, t.bytes, t.instructions));
    }
    return out;
  }, "[(kind, name, calls, modelled seconds, flops, bytes, instructions)] of NKI kernels and "
     "collectives since the last reset.");
  m.def("_kernel_calls", []() {
    std::vector<uint64_t> calls;
    calls.reserve(g_kernels.size());
    for (const KernelSlot& k : g_kernels) {
      calls.push_back(k.calls.load(std::memory_order_relaxed));
    }
    return calls;
  }, "Runs of each compiled-kernel slot since the last reset.");
  m.def("_reset_kernel_calls", []() {
    for (KernelSlot& k : g_kernels) {
      k.calls.store(0, std::memory_order_relaxed);
    }
  }, "Zeroes the compiled-kernel run counts.");
  m.def("_set_cost_oracle", &set_cost_oracle,
        "Sets fn(op, args: dict, outputs: list, cpu_fallback: bool) -> modelled seconds.");
  m.def("_set_transfer_model", [](double fixed_seconds, double host_link, double same_chip,
                                  double cross_chip, const std::vector<int>& chip_of_device) {
    TORCH_CHECK(chip_of_device.size() <= kMaxDevices, "more devices than torchneuron supports");
    g_transfer_fixed_seconds = fixed_seconds;
    g_host_link_bytes_per_second = host_link;
    g_same_chip_bytes_per_second = same_chip;
    g_cross_chip_bytes_per_second = cross_chip;
    for (size_t i = 0; i < chip_of_device.size(); ++i) {
      g_chip_of[i] = chip_of_device[i];
    }
  }, "Modelled copies that leave a device: fixed seconds per copy, then bytes/s over the host "
     "link, between two devices of a chip and between chips; the chip of each device.");
  m.def("_set_costing", [](bool on) { g_costing.store(on); },
        "Turns the modelled device time on or off.");
  m.def("_set_modeled_event_time", &set_modeled_event_time,
        "Event.elapsed_time: modelled device time (True) or host time (False).");
  m.def("_cost_entries", &cost_entries,
        "[(description, calls, seconds)] of each op/shape combination run since the last reset.");
  m.def("_pin_cost_cache", [](bool pin) {
    std::lock_guard<std::mutex> lock(g_cost_mutex);
    TORCH_CHECK(pin || g_pins > 0, "_pin_cost_cache(False) without a matching pin");
    g_pins += pin ? 1 : -1;
  }, "While pinned (estimate() runs), the per-combination cost cache is never flushed.");
  m.def("_cost_cache_stats", []() {
    std::lock_guard<std::mutex> lock(g_cost_mutex);
    return py::make_tuple(g_entries->size(), g_capacity.load(), g_flushes);
  }, "(combinations cached, capacity, flushes since start) of the cost cache.");
  m.def("_set_cost_cache_capacity", [](int64_t capacity) {
    TORCH_CHECK_VALUE(capacity > 0, "the cost cache capacity must be positive, got ", capacity);
    g_capacity = static_cast<size_t>(capacity);
  }, "Sets how many combinations the cost cache holds before it is flushed (tests).");
  m.def("_reset_cost_counts", []() {
    reset_cost_counts();
    std::lock_guard<std::mutex> lock(g_work_mutex);
    g_work.clear();
  },
        "Zeroes the per-combination call counts and the transfer counts.");
  m.def("_transfer_counts", []() {
    py::list counts;
    for (int kind = 0; kind < kTransferKinds; ++kind) {
      counts.append(py::make_tuple(kTransferNames[kind], g_transfers[kind].copies.load(),
                                   g_transfers[kind].bytes.load()));
    }
    return counts;
  }, "(link, copies, bytes) of the copies that left a device since the last reset.");
  m.def("_stream_clock", [](int device) { return current_stream_clock(device); },
        "Modelled seconds on the thread's current stream of `device`.");
}

}  // namespace torchneuron
