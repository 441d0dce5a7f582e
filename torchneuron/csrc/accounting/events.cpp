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

#include <cstring>
#include <mutex>
#include <string_view>
#include <unordered_set>

namespace torchneuron {

std::atomic<int> g_event_recorders{0};

namespace {

// Events are appended under a lock: recording is a profiling mode, where
// torch's own profiler already costs microseconds per op.
std::mutex g_events_mutex;
std::vector<WorkEvent> g_events;
uint64_t g_base = 0;  // sequence number of g_events[0]
uint64_t g_dropped = 0;  // events past the capacity, counted so reports can say so
// About 80 MB of events; a run past it keeps its first events and says how many it lost.
constexpr size_t kMaxEvents = 1u << 20;

// Kineto pushes the correlation id of the host op being run on its thread.
thread_local c10::SmallVector<uint64_t, 4> t_correlation;

// Names of events that do not come from an op record (NKI kernels,
// collectives, compiled kernels): interned so events can point at them.
std::mutex g_names_mutex;
auto& g_names = *new std::unordered_set<std::string>();  // leaked: events outlive exit order

constexpr const char* kKindNames[] = {"op", "copy", "compiled_kernel", "nki_kernel",
                                      "collective", "host_sync", "cpu_fallback", "memory"};

// TORCH_NEURONX_ENABLE_STACK_TRACE (torchneuron/config.py): each event names the Python
// line that issued it. Read only by record_event, which runs only while recording.
std::atomic<bool> g_call_sites{false};
// Files under these directories (torch's and torchneuron's packages) are library
// frames: an event's call site is the innermost frame outside them.
std::mutex g_library_dirs_mutex;
std::vector<std::string> g_library_dirs;

bool is_library_file(const char* file) {
  std::lock_guard<std::mutex> lock(g_library_dirs_mutex);
  for (const std::string& dir : g_library_dirs) {
    if (std::strncmp(file, dir.c_str(), dir.size()) == 0) {
      return true;
    }
  }
  return false;
}

// The user frames of the calling thread's Python stack, innermost first, one
// "file:line in function" per line (at most kMaxStackFrames), interned: the first line is
// the op's call site, the whole is its Python stack (TorchNeuron's "per-op Python
// stacks"). nullptr when the thread runs no Python (autograd's device thread runs
// backward ops) or every frame is a library's. Ops run with the GIL released (torch's
// bindings drop it): it is taken back, as torch's CapturedTraceback does for memory
// history; the thread's frames are still there. Checked on CPython 3.11.
constexpr int kMaxStackFrames = 64;

const char* python_call_site() {
  if (!Py_IsInitialized() || _Py_IsFinalizing()) {
    return nullptr;
  }
  py::gil_scoped_acquire gil;
  PyFrameObject* frame = PyEval_GetFrame();  // borrowed
  Py_XINCREF(frame);
  std::string stack;
  int frames = 0;
  while (frame != nullptr && frames < kMaxStackFrames) {
    PyCodeObject* code = PyFrame_GetCode(frame);  // new reference
    const char* file = PyUnicode_AsUTF8(code->co_filename);
    if (file != nullptr && !is_library_file(file)) {
      const char* function = PyUnicode_AsUTF8(code->co_name);
      stack += (frames++ ? "\n" : "") + std::string(file) + ":" +
          std::to_string(PyFrame_GetLineNumber(frame)) + " in " + (function != nullptr ? function : "?");
    }
    Py_DECREF(code);
    PyFrameObject* back = PyFrame_GetBack(frame);  // new reference
    Py_DECREF(frame);
    frame = back;
  }
  Py_XDECREF(frame);
  PyErr_Clear();  // a name that is not UTF-8 leaves an error set: that frame is skipped
  return frames ? intern_name(stack) : nullptr;
}

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

int32_t host_thread_id() {
  thread_local const int32_t t_thread = static_cast<int32_t>(syscall(SYS_gettid));
  return t_thread;
}

void push_correlation(uint64_t id) {
  t_correlation.push_back(id);
}

void pop_correlation() {
  if (!t_correlation.empty()) {
    t_correlation.pop_back();
  }
}

namespace {
void append_event(const WorkEvent& e) {
  std::lock_guard<std::mutex> lock(g_events_mutex);
  if (g_events.size() < kMaxEvents) {
    g_events.push_back(e);
  } else {
    ++g_dropped;
  }
}
}  // namespace

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
  e.thread = host_thread_id();
  e.device = device;
  e.kind = kind;
  e.site = g_call_sites.load(std::memory_order_relaxed) ? python_call_site() : nullptr;
  append_event(e);
}

void record_memory_event(c10::DeviceIndex device, uint64_t allocated) {
  WorkEvent e{};
  e.name = "memory";
  e.host_ns = event_clock_ns();
  e.bytes = allocated;
  e.device = device;
  e.kind = WorkKind::kMemory;
  append_event(e);
}

RecordingMark open_recording() {
  std::lock_guard<std::mutex> lock(g_events_mutex);
  g_event_recorders.fetch_add(1);
  return RecordingMark{g_base + g_events.size(), g_dropped};
}

std::vector<WorkEvent> close_recording(const RecordingMark& mark, uint64_t* dropped) {
  std::lock_guard<std::mutex> lock(g_events_mutex);
  const size_t from = mark.first > g_base ? std::min<size_t>(mark.first - g_base, g_events.size()) : 0;
  std::vector<WorkEvent> out(g_events.begin() + from, g_events.end());
  if (dropped != nullptr) {
    *dropped = g_dropped - mark.dropped;
  }
  if (g_event_recorders.fetch_sub(1) == 1) {  // the last recorder: start afresh
    g_base += g_events.size();
    g_events.clear();
    g_events.shrink_to_fit();
    g_dropped = 0;
  }
  return out;
}

void bind_events(py::module_& m) {
  m.def("_open_recording", []() {
    const RecordingMark mark = open_recording();
    return py::make_tuple(mark.first, mark.dropped);
  }, "Opens a recorder: one event per device work item until it is closed; returns its mark.");
  m.def("_close_recording", [](const py::tuple& mark) {
    uint64_t dropped = 0;
    std::vector<WorkEvent> events = close_recording(
        RecordingMark{mark[0].cast<uint64_t>(), mark[1].cast<uint64_t>()}, &dropped);
    py::list out;
    for (const WorkEvent& e : events) {
      out.append(py::make_tuple(work_kind_name(e.kind), e.name ? e.name : "", e.device,
                                e.stream, e.device_start, e.seconds, e.host_ns, e.bytes,
                                e.flops, e.engine ? e.engine : "", e.correlation,
                                e.site ? e.site : ""));
    }
    return py::make_tuple(out, dropped);
  }, "Closes a recorder: ([(kind, name, device, stream, device_start_s, seconds, host_ns, "
     "bytes, flops, engine, correlation, Python stack: call site first, one frame a line)] "
     "since its mark, events dropped meanwhile).");
  m.def("_event_recording", []() { return recording_events(); });
  m.def("_set_call_sites", [](bool on, const std::vector<std::string>& library_dirs) {
    {
      std::lock_guard<std::mutex> lock(g_library_dirs_mutex);
      g_library_dirs = library_dirs;
    }
    g_call_sites.store(on, std::memory_order_relaxed);
  }, "Whether events name their Python call site, skipping frames under library_dirs "
     "(TORCH_NEURONX_ENABLE_STACK_TRACE).");
  m.def("_event_clock_ns", &event_clock_ns, "The profiler's clock (c10::getTime), in ns.");
}

}  // namespace torchneuron
