// The per-call record of device work: one event per op, copy, compiled
// kernel, NKI kernel, collective, host sync and CPU fallback, with its
// modelled start and duration on its stream's clock. Only a profiler session
// (profiler.cpp) or torchneuron.profiler turns recording on; while it is off,
// the op path pays one relaxed atomic load (recording_events()).
// Checked against torch 2.13.0.
#include "../core.h"

#include <c10/util/ApproximateClock.h>
#include <torch/csrc/utils/pybind.h>

#include <sys/syscall.h>
#include <unistd.h>

#include <mutex>
#include <string_view>
#include <unordered_set>

namespace torchneuron {

std::atomic<bool> g_recording_events{false};

namespace {

// Events are appended under a lock: recording is a profiling mode, where
// torch's own profiler already costs microseconds per op.
std::mutex g_events_mutex;
std::vector<WorkEvent> g_events;
uint64_t g_dropped = 0;  // events past the capacity, counted so reports can say so
constexpr size_t kMaxEvents = 4u << 20;

// Kineto pushes the correlation id of the host op being run on its thread.
thread_local c10::SmallVector<uint64_t, 4> t_correlation;

// Names of events that do not come from an op record (NKI kernels,
// collectives, compiled kernels): interned so events can point at them.
std::mutex g_names_mutex;
auto& g_names = *new std::unordered_set<std::string>();  // leaked: events outlive exit order

constexpr const char* kKindNames[] = {"op", "copy", "compiled_kernel", "nki_kernel",
                                      "collective", "host_sync", "cpu_fallback"};

}  // namespace

const char* intern_name(std::string_view name) {
  std::lock_guard<std::mutex> lock(g_names_mutex);
  return g_names.emplace(name).first->c_str();
}

const char* work_kind_name(WorkKind kind) {
  return kKindNames[static_cast<int>(kind)];
}

int64_t event_clock_ns() {
  return c10::getTime();
}

void push_correlation(uint64_t id) {
  t_correlation.push_back(id);
}

void pop_correlation() {
  if (!t_correlation.empty()) {
    t_correlation.pop_back();
  }
}

void record_event(WorkKind kind, const char* name, c10::DeviceIndex device, double device_start,
                  double seconds, uint64_t bytes, double flops, const char* engine) {
  WorkEvent e;
  e.name = name;
  e.engine = engine;
  e.host_ns = event_clock_ns();
  e.device_start = device_start;
  e.seconds = seconds;
  e.flops = flops;
  e.bytes = bytes;
  e.correlation = t_correlation.empty() ? 0 : t_correlation.back();
  e.stream = device >= 0 ? current_stream_id(device) : 0;
  thread_local const int32_t t_thread = static_cast<int32_t>(syscall(SYS_gettid));
  e.thread = t_thread;
  e.device = device;
  e.kind = kind;
  std::lock_guard<std::mutex> lock(g_events_mutex);
  if (g_events.size() < kMaxEvents) {
    g_events.push_back(e);
  } else {
    ++g_dropped;
  }
}

std::vector<WorkEvent> take_events(uint64_t* dropped) {
  std::lock_guard<std::mutex> lock(g_events_mutex);
  std::vector<WorkEvent> out;
  out.swap(g_events);
  if (dropped != nullptr) {
    *dropped = g_dropped;
  }
  g_dropped = 0;
  return out;
}

size_t event_count() {
  std::lock_guard<std::mutex> lock(g_events_mutex);
  return g_events.size();
}

std::vector<WorkEvent> events_since(size_t first) {
  std::lock_guard<std::mutex> lock(g_events_mutex);
  if (first >= g_events.size()) {
    return {};
  }
  return std::vector<WorkEvent>(g_events.begin() + first, g_events.end());
}

void bind_events(py::module_& m) {
  m.def("_set_event_recording", [](bool on) { g_recording_events.store(on); },
        "Records one event per device work item while on (profilers turn it on).");
  m.def("_event_recording", []() { return recording_events(); });
  m.def("_take_events", []() {
    uint64_t dropped = 0;
    std::vector<WorkEvent> events = take_events(&dropped);
    py::list out;
    for (const WorkEvent& e : events) {
      out.append(py::make_tuple(work_kind_name(e.kind), e.name ? e.name : "", e.device,
                                e.stream, e.device_start, e.seconds, e.host_ns, e.bytes,
                                e.flops, e.engine ? e.engine : "", e.correlation));
    }
    return py::make_tuple(out, dropped);
  }, "([(kind, name, device, stream, device_start_s, seconds, host_ns, bytes, flops, engine, "
     "correlation)], dropped) recorded since the last take; empties the record.");
  m.def("_event_clock_ns", &event_clock_ns, "The profiler's clock (c10::getTime), in ns.");
}

}  // namespace torchneuron
