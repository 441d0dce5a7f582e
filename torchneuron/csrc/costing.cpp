// Modelled Trainium time of each op the fallback runs. The cost of one op
// with given dtypes, shapes and non-tensor arguments is asked of Python's
// cost model (torchneuron/device/cost.py) once and cached; each call then
// adds it to the current stream's modelled clock (guard.cpp) and counts it.
// Checked against torch 2.13.0.
//
// Hot-path cost: hashing the argument shapes and one thread-local lookup.
#include "core.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/csrc/utils/pybind.h>

#include <atomic>
#include <cstring>
#include <deque>
#include <mutex>
#include <unordered_map>

namespace torchneuron {
namespace {

using c10::IValue;

// One (op, dtypes, shapes, arguments) combination.
struct CostEntry {
  double seconds = 0;  // modelled, for the configured target
  std::atomic<uint64_t> calls{0};
  py::object description;  // (op, args, outputs, cpu_fallback): lets Python re-cost it
};

std::atomic<bool> g_costing{true};
// Host<->device copies: a fixed DMA cost plus bytes over the host link.
std::atomic<double> g_transfer_fixed_seconds{0};
std::atomic<double> g_host_link_bytes_per_second{0};
std::atomic<uint64_t> g_generation{1};
// Lock order: the GIL, then g_cost_mutex (a miss calls into Python).
std::mutex g_cost_mutex;
// Stable addresses; entries of old generations stay. Leaked on purpose: the
// entries hold Python objects, which must not be released after Python exits.
std::deque<CostEntry>& g_entries = *new std::deque<CostEntry>();
std::unordered_map<uint64_t, CostEntry*> g_index;
py::object* g_cost_oracle = nullptr;  // leaked on purpose, as metrics.cpp's oracle

inline void mix(uint64_t& h, uint64_t v) {
  h = (h ^ v) * 0x100000001b3ULL;
}

void hash_value(uint64_t& h, const IValue& v) {
  if (v.isTensor()) {
    const at::Tensor& t = v.toTensor();
    mix(h, t.defined() ? 0x7e45 + t.dim() : 1);
    if (t.defined()) {
      for (int64_t s : t.sizes()) {
        mix(h, static_cast<uint64_t>(s));
      }
      mix(h, static_cast<uint64_t>(t.scalar_type()));
      mix(h, t.is_contiguous());
    }
  } else if (v.isTensorList()) {
    for (const at::Tensor& t : v.toTensorList()) {
      hash_value(h, IValue(t));
    }
  } else if (v.isList()) {
    mix(h, 0x1157);
    for (const IValue& e : v.toListRef()) {
      hash_value(h, e);
    }
  } else if (v.isInt()) {
    mix(h, static_cast<uint64_t>(v.toInt()));
  } else if (v.isDouble()) {
    // Float arguments (learning rates, scales) do not change an op's cost and
    // change every step in optimizers: they stay out of the key.
    mix(h, 0xd0b1e);
  } else if (v.isBool()) {
    mix(h, v.toBool() ? 3 : 2);
  } else if (v.isIntList()) {
    for (int64_t x : v.toIntVector()) {
      mix(h, static_cast<uint64_t>(x));
    }
  } else if (v.isBoolList()) {
    for (bool b : v.toBoolList()) {
      mix(h, b ? 5 : 4);
    }
  } else if (v.isNone()) {
    mix(h, 0x404e);
  }
}

py::object describe(const IValue& v) {
  if (v.isTensor()) {
    const at::Tensor& t = v.toTensor();
    if (!t.defined()) {
      return py::none();
    }
    return py::make_tuple("tensor", py::tuple(py::cast(t.sizes().vec())),
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

CostEntry* lookup_slow(uint64_t key, const c10::OperatorHandle& op, const OpRecord& record,
                       c10::ArrayRef<IValue> inputs, c10::ArrayRef<IValue> outputs) {
  py::gil_scoped_acquire gil;
  std::lock_guard<std::mutex> lock(g_cost_mutex);
  auto it = g_index.find(key);
  if (it != g_index.end()) {
    return it->second;
  }
  py::dict args;
  const auto& arguments = op.schema().arguments();
  for (size_t i = 0; i < inputs.size() && i < arguments.size(); ++i) {
    args[py::str(arguments[i].name())] = describe(inputs[i]);
  }
  py::list outs;
  for (const IValue& v : outputs) {
    outs.append(describe(v));
  }
  py::tuple description = py::make_tuple(record.op, args, outs, record.fallback);
  double seconds = 0;
  try {
    seconds = (*g_cost_oracle)(*description).cast<double>();
  } catch (py::error_already_set& e) {
    throw std::runtime_error(std::string("torchneuron's cost model failed on ") + record.op +
                             ": " + e.what());
  }
  CostEntry& entry = g_entries.emplace_back();
  entry.seconds = seconds;
  entry.description = std::move(description);
  g_index[key] = &entry;
  return &entry;
}

}  // namespace

void charge_op(const c10::OperatorHandle& op, OpRecord& record, c10::DeviceIndex device,
               c10::ArrayRef<IValue> inputs, c10::ArrayRef<IValue> outputs) {
  if (!g_costing.load(std::memory_order_relaxed) || g_cost_oracle == nullptr) {
    return;
  }
  uint64_t key = reinterpret_cast<uintptr_t>(&record);
  for (const IValue& v : inputs) {
    hash_value(key, v);
  }
  static thread_local std::unordered_map<uint64_t, CostEntry*> cache;
  static thread_local uint64_t cache_generation = 0;
  const uint64_t generation = g_generation.load(std::memory_order_relaxed);
  if (cache_generation != generation) {
    cache.clear();
    cache_generation = generation;
  }
  CostEntry*& entry = cache[key];
  if (entry == nullptr) {
    entry = lookup_slow(key, op, record, inputs, outputs);
  }
  entry->calls.fetch_add(1, std::memory_order_relaxed);
  record.modeled_ns.fetch_add(static_cast<uint64_t>(entry->seconds * 1e9), std::memory_order_relaxed);
  advance_current_stream(device, entry->seconds);
}

void charge_transfer(c10::DeviceIndex device, size_t bytes) {
  const double bandwidth = g_host_link_bytes_per_second.load(std::memory_order_relaxed);
  if (!g_costing.load(std::memory_order_relaxed) || bandwidth <= 0) {
    return;
  }
  advance_current_stream(
      device, g_transfer_fixed_seconds.load(std::memory_order_relaxed) + bytes / bandwidth);
}

namespace {

void set_cost_oracle(py::object oracle) {
  py::gil_scoped_acquire gil;
  std::lock_guard<std::mutex> lock(g_cost_mutex);
  if (g_cost_oracle == nullptr) {
    g_cost_oracle = new py::object();
  }
  *g_cost_oracle = std::move(oracle);
  g_index.clear();  // costs of another target or model; entries stay allocated
  g_generation.fetch_add(1);
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
  for (auto& entry : g_entries) {
    entry.calls = 0;
  }
}

}  // namespace

void bind_costing(py::module_& m) {
  m.def("_set_cost_oracle", &set_cost_oracle,
        "Sets fn(op, args: dict, outputs: list, cpu_fallback: bool) -> modelled seconds.");
  m.def("_set_transfer_model", [](double fixed_seconds, double bytes_per_second) {
    g_transfer_fixed_seconds = fixed_seconds;
    g_host_link_bytes_per_second = bytes_per_second;
  }, "Modelled host<->device copy: fixed seconds per copy and host-link bytes/s.");
  m.def("_set_costing", [](bool on) { g_costing.store(on); },
        "Turns the modelled device time on or off.");
  m.def("_set_modeled_event_time", &set_modeled_event_time,
        "Event.elapsed_time: modelled device time (True) or host time (False).");
  m.def("_cost_entries", &cost_entries,
        "[(description, calls, seconds)] of each op/shape combination run since the last reset.");
  m.def("_reset_cost_counts", &reset_cost_counts, "Zeroes the per-combination call counts.");
  m.def("_advance_stream", [](int device, double seconds) {
    if (g_costing.load(std::memory_order_relaxed)) {
      advance_current_stream(static_cast<c10::DeviceIndex>(device), seconds);
    }
  }, "Adds modelled seconds to the thread's current stream of `device` (compiled kernels).");
  m.def("_stream_clock", [](int device) { return current_stream_clock(device); },
        "Modelled seconds on the thread's current stream of `device`.");
}

}  // namespace torchneuron
