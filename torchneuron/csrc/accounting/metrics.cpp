// Op accounting for the fallback: where real Trainium would run each op
// (asked of Python's hardware model once per op and dtypes, then cached
// here), how often each ran, and the host<->device traffic and host syncs.
// Checked against torch 2.13.0.
//
// Cost on the hot path: a dtype key built while the fallback converts the
// arguments, one probe of a thread-local cache, and relaxed atomic adds.
#include "../core.h"
#include "sync_debug.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/csrc/utils/pybind.h>
#include <torch/csrc/DynamicTypes.h>

#include <atomic>
#include <deque>
#include <map>
#include <mutex>

namespace torchneuron {
namespace {

std::atomic<uint64_t> g_host_syncs{0};
// Sync debug mode: whether a watcher is installed, and the watcher (leaked on purpose,
// as the oracle). Python installs one while a mode is set or a report listens.
std::atomic<bool> g_sync_watch{false};
py::object* g_sync_watcher = nullptr;
std::atomic<bool> g_strict{false};
// Bumped when decisions are dropped; thread-local caches of older generations are stale.
std::atomic<uint64_t> g_generation{1};

// Lock order: the GIL, then g_records_mutex (a miss calls into Python).
std::mutex g_records_mutex;
std::deque<OpRecord> g_records;  // stable addresses
std::map<std::pair<std::string, uint64_t>, OpRecord*> g_record_index;
py::object* g_oracle = nullptr;  // leaked on purpose: outlives interpreter teardown order
py::object* g_fallback_observer = nullptr;  // likewise

std::string op_name(const c10::OperatorHandle& op) {
  const auto& name = op.operator_name();
  return name.overload_name.empty() ? name.name : name.name + "." + name.overload_name;
}

// Asks the Python oracle; caller holds the GIL and g_records_mutex.
void decide(OpRecord& record) {
  if (g_oracle == nullptr) {
    return;  // no hardware model registered: everything counts as on device
  }
  py::tuple dtypes(record.dtypes.size());
  for (size_t i = 0; i < record.dtypes.size(); ++i) {
    dtypes[i] = dtype_name(record.dtypes[i]);
  }
  py::tuple answer = (*g_oracle)(record.op, dtypes);
  record.fallback = answer[0].cast<bool>();
  record.reason = answer[1].cast<std::string>();
  record.numerics_rule = answer[2].cast<uint8_t>();
}

OpRecord* lookup_slow(const c10::OperatorHandle& op, const DtypeKey& key) {
  py::gil_scoped_acquire gil;
  std::lock_guard<std::mutex> lock(g_records_mutex);
  std::string name = op_name(op);
  auto it = g_record_index.find({name, key.bits});
  if (it != g_record_index.end()) {
    return it->second;
  }
  OpRecord& record = g_records.emplace_back();
  record.generation = g_generation.load();
  record.op = std::move(name);
  record.dtypes.assign(key.dtypes.begin(), key.dtypes.end());
  try {
    decide(record);
  } catch (py::error_already_set& e) {
    g_records.pop_back();
    throw std::runtime_error(std::string("torchneuron's placement oracle failed: ") + e.what());
  }
  g_record_index[{record.op, key.bits}] = &record;
  return &record;
}

thread_local ThreadCache<OpRecord> t_records;  // keyed by (schema, dtypes)

}  // namespace

py::str dtype_name(c10::ScalarType t) {
  auto dtype = py::reinterpret_borrow<py::object>(reinterpret_cast<PyObject*>(torch::getTHPDtype(t)));
  return py::str(dtype).attr("removeprefix")("torch.");
}

void DtypeKey::add(c10::ScalarType t) {
  if (dtypes.size() < 7) {
    bits |= static_cast<uint64_t>(static_cast<uint8_t>(t) + 1) << (8 * dtypes.size());
    dtypes.push_back(t);
  }
}

OpRecord& op_record(const c10::OperatorHandle& op, const DtypeKey& key) {
  return t_records.get(&op.schema(), key.bits, g_generation.load(std::memory_order_relaxed),
                       [&]() -> OpRecord& { return *lookup_slow(op, key); });
}

bool observe_fallback_call(const OpRecord& record) {
  py::gil_scoped_acquire gil;
  if (g_fallback_observer == nullptr) {
    return false;
  }
  py::tuple dtypes(record.dtypes.size());
  for (size_t i = 0; i < record.dtypes.size(); ++i) {
    dtypes[i] = dtype_name(record.dtypes[i]);
  }
  return (*g_fallback_observer)(record.op, dtypes, record.reason).cast<bool>();
}

bool strict_fallback() {
  return g_strict.load(std::memory_order_relaxed);
}

void count_host_sync(c10::DeviceIndex device) {
  g_host_syncs.fetch_add(1, std::memory_order_relaxed);
  if (C10_UNLIKELY(recording_events())) {
    record_event(WorkKind::kHostSync, "host sync", device, current_stream_clock(device), 0, 0, 0,
                 nullptr);
  }
}

void check_host_sync(c10::DeviceIndex device, const char* kind, size_t nbytes) {
  if (C10_LIKELY(!g_sync_watch.load(std::memory_order_relaxed))) {
    return;
  }
  py::gil_scoped_acquire gil;
  if (g_sync_watcher == nullptr || g_sync_watcher->is_none()) {
    return;
  }
  (*g_sync_watcher)(static_cast<int>(device), kind, nbytes);  // may raise: propagates to Python
}

void set_sync_watcher(py::object watcher) {
  py::gil_scoped_acquire gil;
  if (g_sync_watcher == nullptr) {
    g_sync_watcher = new py::object();
  }
  const bool on = !watcher.is_none();
  *g_sync_watcher = std::move(watcher);
  g_sync_watch.store(on);
}

// ---- Python interface (bound in module.cpp) ----

void set_placement_oracle(py::object oracle) {
  py::gil_scoped_acquire gil;
  std::lock_guard<std::mutex> lock(g_records_mutex);
  if (g_oracle == nullptr) {
    g_oracle = new py::object();
  }
  *g_oracle = std::move(oracle);
  // Decisions of the old oracle no longer hold. Their records stay allocated
  // (other threads' caches may still point at them until they see the new
  // generation) but are no longer listed.
  g_record_index.clear();
  g_generation.fetch_add(1);
}

void set_fallback_observer(py::object observer) {
  py::gil_scoped_acquire gil;
  if (g_fallback_observer == nullptr) {
    g_fallback_observer = new py::object();
  }
  *g_fallback_observer = std::move(observer);
}

void set_strict_fallback(bool strict) {
  g_strict.store(strict);
}

py::list op_stats() {
  std::lock_guard<std::mutex> lock(g_records_mutex);
  py::list out;
  const uint64_t generation = g_generation.load();
  for (const OpRecord& r : g_records) {
    if (r.generation != generation) {
      continue;
    }
    py::tuple dtypes(r.dtypes.size());
    for (size_t i = 0; i < r.dtypes.size(); ++i) {
      dtypes[i] = dtype_name(r.dtypes[i]);
    }
    out.append(py::make_tuple(r.op, dtypes, r.fallback, r.reason, r.calls.load(),
                              r.bytes_in.load(), r.bytes_out.load(), r.modeled_ns.load() * 1e-9,
                              r.internal_calls.load()));
  }
  return out;
}

void reset_stats() {
  std::lock_guard<std::mutex> lock(g_records_mutex);
  for (OpRecord& r : g_records) {
    r.calls = 0;
    r.bytes_in = 0;
    r.bytes_out = 0;
    r.modeled_ns = 0;
    r.internal_calls = 0;
  }
  g_host_syncs = 0;
}

}  // namespace torchneuron

namespace torchneuron {

void bind_metrics(py::module_& m) {
  m.def("_set_placement_oracle", &set_placement_oracle,
        "Sets fn(op: str, dtypes: tuple[str, ...]) -> (cpu_fallback: bool, reason: str, numerics_rule: int).");
  m.def("_set_fallback_observer", &set_fallback_observer,
        "Sets fn(op, dtypes, reason) -> bool, called on each CPU-fallback call; True marks a "
        "PyTorch internal computing on the host by design.");
  m.def("_set_strict_fallback", &set_strict_fallback,
        "If True, ops real Trainium runs on CPU raise NotImplementedError.");
  m.def("_op_stats", &op_stats,
        "[(op, dtypes, cpu_fallback, reason, calls, bytes_in, bytes_out, modeled_seconds, "
        "internal_calls)] since the last reset.");
  m.def("_host_syncs", []() { return g_host_syncs.load(); },
        "Host syncs (.item(), reads to the host) since the last reset.");
  m.def("_set_sync_watcher", &set_sync_watcher,
        "Sets fn(device: int, kind: str, nbytes: int), called before each host synchronisation "
        "(kinds: copy_to_host, item, synchronize, stream_synchronize); None removes it.");
  m.def("_reset_stats", &reset_stats, "Zeroes the counters; placement decisions stay cached.");
}

}  // namespace torchneuron
