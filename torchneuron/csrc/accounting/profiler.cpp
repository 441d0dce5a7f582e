// torch.profiler on neuron: the device timeline of the modelled Trainium.
//
// Two PyTorch interfaces, both registered at load:
// - Kineto's PrivateUse1 activity profiler (REGISTER_PRIVATEUSE1_PROFILER):
//   while a torch.profiler session with ProfilerActivity.PrivateUse1 runs, the
//   record of device work (events.cpp) is on; when it stops, every event
//   becomes a device activity (an op, compiled or NKI kernel, fallback or
//   collective a kernel; a copy a memcpy) on its device's track, one track per
//   stream, lasting its modelled time and linked to the host op that issued
//   it, so prof.key_averages() has device time and the Chrome trace draws the
//   device beside the host. Each stream is drawn as rows, one per engine the
//   model names for its work ("neuron:0 stream 0 TensorE", ... VectorE, DMA,
//   a collective's link), right under the stream's own row, which holds work
//   with no engine (host syncs): every event is on exactly one row, so device
//   time is counted once, and a stream's rows together are its timeline.
//   A device's collectives share one row, "neuron:0 collectives", below its
//   streams; its allocated bytes are a counter track, "neuron:0 memory" (Trace
//   Event Format "C" events: one per allocation and free, from the allocator).
//   With TORCH_NEURONX_ENABLE_STACK_TRACE each event's args name its call site.
//   A record_function range (torch.profiler.record_function, a user scope) is
//   drawn on each stream row it issued work to, from its first device event's
//   start to its last one's end (Kineto's gpu_user_annotation, as CUDA draws
//   them; PyTorch keeps these out of device-time sums).
// - The legacy profiler's device stubs (torch.autograd.profiler.profile(
//   use_device="neuron")): events on the modelled stream clock.
//
// Placement on the trace: a device runs its stream's work in order, starting
// each item when the host has issued it and the previous one is done (an
// asynchronous queue), so an item starts at max(issue time, end of previous).
// Checked against torch 2.13.0 (Kineto as shipped in its CPU wheel).

// Kineto's activity header formats metadata with fmt, whose compiled part
// libtorch does not export: use fmt header-only in this file.
#define FMT_HEADER_ONLY
#include <fmt/format.h>

#include "../core.h"

#include <kineto/GenericTraceActivity.h>
#include <kineto/IActivityProfiler.h>
#include <kineto/libkineto.h>
#include <torch/csrc/profiler/orchestration/observer.h>
#include <torch/csrc/profiler/standalone/privateuse1_profiler.h>
#include <torch/csrc/profiler/stubs/base.h>
#include <torch/csrc/utils/pybind.h>

#include <ATen/record_function.h>

#include <unistd.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <set>

namespace torchneuron {
namespace {

using libkineto::ActivityType;

ActivityType activity_type(WorkKind kind) {
  switch (kind) {
    case WorkKind::kCopy:
      return ActivityType::GPU_MEMCPY;
    case WorkKind::kHostSync:
      return ActivityType::CUDA_SYNC;  // a device-side sync marker: Kineto's only such type
    default:
      return ActivityType::CONCURRENT_KERNEL;
  }
}

// An op's device work is named for the device ("aten::mm" runs as "neuron::mm"), so
// key_averages() keeps it apart from the host op of the same name, as CUDA's kernels are.
std::string device_name(const WorkEvent& e) {
  std::string name = e.name != nullptr ? e.name : "";
  if ((e.kind == WorkKind::kOp || e.kind == WorkKind::kCpuFallback) && name.rfind("aten::", 0) == 0) {
    name = "neuron::" + name.substr(6);
  }
  return name;
}

// Trace ids of a device's stream tracks: the stream id, kept positive.
int32_t resource_of(c10::StreamId stream) {
  return static_cast<int32_t>(stream & 0x7fffffff);
}

// The rows a session draws: per (device, stream), the stream's own row and one
// row per engine seen on it; per device, one row of its collectives (whatever
// stream issued them: they occupy the links, not an engine). Engine rows get
// ids above any stream's (Kineto's tids; unique per device) and sort right
// after their stream's row; the collectives row sorts after every stream.
class Rows {
 public:
  int32_t of(int device, c10::StreamId stream, WorkKind kind, const char* engine) {
    if (kind == WorkKind::kCollective) {
      collectives_.insert(device);
      return kCollectivesRow;
    }
    auto& engines = streams_[{device, stream}];
    if (engine == nullptr) {
      return resource_of(stream);
    }
    auto [it, added] = engines.emplace(engine, 0);
    if (added) {
      it->second = kFirstEngineRow + next_++;
    }
    return it->second;
  }

  std::vector<libkineto::ResourceInfo> infos() const {
    std::vector<libkineto::ResourceInfo> out;
    for (const auto& [key, engines] : streams_) {
      const auto& [device, stream] = key;
      const std::string name = "neuron:" + std::to_string(device) + " stream " + std::to_string(stream);
      const int64_t sort = static_cast<int64_t>(resource_of(stream)) << 8;
      out.push_back(libkineto::ResourceInfo{resource_of(stream), sort, device, name});
      int64_t slot = 1;  // engines in name order under the stream's row
      for (const auto& [engine, id] : engines) {
        out.push_back(libkineto::ResourceInfo{id, sort + slot++, device, name + " " + engine});
      }
    }
    for (int device : collectives_) {
      out.push_back(libkineto::ResourceInfo{kCollectivesRow, int64_t{1} << 40, device,
                                            "neuron:" + std::to_string(device) + " collectives"});
    }
    return out;
  }

 private:
  static constexpr int32_t kFirstEngineRow = 0x40000000;
  static constexpr int32_t kCollectivesRow = kFirstEngineRow - 1;  // above any stream id
  std::map<std::pair<int, c10::StreamId>, std::map<std::string, int32_t>> streams_;
  std::set<int> collectives_;
  int32_t next_ = 0;
};

// Kineto writes metadata strings as they are: a path's backslashes and quotes would
// break the JSON.
std::string json_safe(std::string text) {
  for (char& c : text) {
    if (c == '\\') {
      c = '/';
    } else if (c == '"') {
      c = '\'';
    } else if (static_cast<unsigned char>(c) < 0x20) {
      c = ' ';
    }
  }
  return text;
}

// A "\n"-separated stack as a JSON array of strings (each made JSON-safe).
std::string python_stack_json(const std::string& stack) {
  std::string out = "[";
  size_t start = 0;
  while (start <= stack.size()) {
    const size_t end = std::min(stack.find('\n', start), stack.size());
    out += (start ? ", \"" : "\"") + json_safe(stack.substr(start, end - start)) + "\"";
    start = end + 1;
  }
  return out + "]";
}

bool legacy_profiler_active() {
  try {
    return torch::profiler::impl::getProfilerConfig().state ==
        torch::profiler::impl::ProfilerState::KINETO_PRIVATEUSE1_FALLBACK;
  } catch (const std::exception&) {
    return false;  // no profiler enabled on this thread
  }
}

// ---- record_function ranges, for the device timeline ----
// A user scope's host span and thread, closed while a session records.
struct UserRange {
  std::string name;
  int32_t thread;
  int64_t start_ns;
  int64_t end_ns;
};

struct RangeStart final : at::ObserverContext {
  int64_t ns = 0;
};

struct Ranges {
  std::mutex mutex;
  std::vector<UserRange> closed;
  int sessions = 0;  // open sessions; the callback is registered while there are any
  at::CallbackHandle callback = 0;
};

Ranges& ranges() {
  static Ranges* r = new Ranges();  // used by callbacks until exit: never destroyed
  return *r;
}

std::unique_ptr<at::ObserverContext> range_enter(const at::RecordFunction&) {
  auto start = std::make_unique<RangeStart>();
  start->ns = event_clock_ns();
  return start;
}

void range_exit(const at::RecordFunction& fn, at::ObserverContext* context) {
  if (context == nullptr) {
    return;
  }
  UserRange range{fn.name(), host_thread_id(), static_cast<RangeStart*>(context)->ns, event_clock_ns()};
  Ranges& r = ranges();
  std::lock_guard<std::mutex> lock(r.mutex);
  if (r.sessions > 0) {
    r.closed.push_back(std::move(range));
  }
}

// A session's view of user scopes starts: watch them (global: any thread's).
void open_ranges() {
  Ranges& r = ranges();
  std::lock_guard<std::mutex> lock(r.mutex);
  if (r.sessions++ == 0) {
    r.closed.clear();
    r.callback = at::addGlobalCallback(
        at::RecordFunctionCallback(&range_enter, &range_exit).scopes({at::RecordScope::USER_SCOPE}));
  }
}

// The ranges that began at or after `since_ns`; the last session out stops watching.
std::vector<UserRange> close_ranges(int64_t since_ns) {
  Ranges& r = ranges();
  std::lock_guard<std::mutex> lock(r.mutex);
  std::vector<UserRange> out;
  for (const UserRange& range : r.closed) {
    if (range.start_ns >= since_ns) {
      out.push_back(range);
    }
  }
  if (--r.sessions == 0) {
    at::removeCallback(r.callback);
    r.callback = 0;
    r.closed.clear();
  }
  return out;
}

class Session final : public libkineto::IActivityProfilerSession {
 public:
  ~Session() override {
    if (open_) {  // a session dropped without stop(): recording must not stay on
      close_recording(mark_, nullptr);
      close_ranges(start_ns_);
    }
  }

  void start() override {
    // The legacy profiler (use_device="neuron") times ops with the stubs below; Kineto
    // may still hand it this session, which must then stay empty (no double count).
    if (legacy_profiler_active()) {
      return;
    }
    mark_ = open_recording();  // work issued before the session is not part of it
    open_ = true;
    // The memory counter starts at what each device holds now.
    for (c10::DeviceIndex d = 0; d < device_count(); ++d) {
      record_memory_event(d, allocated_bytes(d));
    }
    start_ns_ = event_clock_ns();
    open_ranges();
    status_ = libkineto::TraceStatus::RECORDING;
  }

  void stop() override {
    if (!open_) {  // never started (the legacy profiler's session)
      return;
    }
    open_ = false;
    uint64_t dropped = 0;
    events_ = close_recording(mark_, &dropped);
    end_ns_ = event_clock_ns();
    ranges_ = close_ranges(start_ns_);
    if (dropped > 0) {
      errors_.push_back("torchneuron: " + std::to_string(dropped) +
                        " device events past the record's capacity were dropped");
    }
    status_ = libkineto::TraceStatus::PROCESSING;
  }

  std::vector<std::string> errors() override {
    return errors_;
  }

  void processTrace(libkineto::ActivityLogger& logger) override {
    processTrace(logger, [](int32_t) -> const libkineto::ITraceActivity* { return nullptr; },
                 start_ns_, end_ns_);
  }

  void processTrace(libkineto::ActivityLogger& logger,
                    libkineto::getLinkedActivityCallback linked_activity, int64_t start_time,
                    int64_t end_time) override {
    buffer_ = std::make_unique<libkineto::CpuTraceBuffer>();
    buffer_->span = libkineto::TraceSpan(start_ns_, end_ns_, "neuron");
    buffer_->gpuOpCount = static_cast<int>(events_.size());
    std::map<std::pair<int, c10::StreamId>, int64_t> busy_until;  // per (device, stream)
    std::vector<Placed> placed;  // where each device event was drawn, for the ranges
    placed.reserve(events_.size());
    for (const WorkEvent& e : events_) {
      if (e.device < 0) {
        continue;
      }
      if (e.kind == WorkKind::kMemory) {
        log_memory_sample(e, logger);
        continue;
      }
      const auto track = std::make_pair(static_cast<int>(e.device), e.stream);
      int64_t& free_at = busy_until[track];
      const int64_t duration = static_cast<int64_t>(e.seconds * 1e9 + 0.5);
      const int64_t begin = std::max(e.host_ns, free_at);
      free_at = begin + duration;
      placed.push_back(Placed{&e, begin, begin + duration});
      buffer_->emplace_activity(buffer_->span, activity_type(e.kind), device_name(e));
      libkineto::GenericTraceActivity& a = *buffer_->activities.back();
      a.startTime = begin;
      a.endTime = begin + duration;
      a.device = e.device;
      a.resource = rows_.of(e.device, e.stream, e.kind, e.engine);
      a.id = static_cast<int32_t>(e.correlation);
      if (e.correlation != 0) {
        a.linked = linked_activity(static_cast<int32_t>(e.correlation));
      }
      a.addMetadataQuoted("kind", work_kind_name(e.kind));
      a.addMetadata("device", static_cast<int>(e.device));
      a.addMetadata("stream", e.stream);
      a.addMetadata("modeled start us", e.device_start * 1e6);
      a.addMetadata("modeled us", e.seconds * 1e6);
      if (e.engine != nullptr) {
        a.addMetadataQuoted("engine", e.engine);
      }
      if (e.flops > 0) {
        a.addMetadata("flops", e.flops);
      }
      if (e.bytes > 0) {
        a.addMetadata("bytes", e.bytes);
      }
      if (e.correlation != 0) {
        a.addMetadata("correlation", e.correlation);
      }
      if (e.site != nullptr) {  // the user frames of the Python stack, innermost first
        const std::string stack = e.site;
        a.addMetadataQuoted("call site", json_safe(stack.substr(0, stack.find('\n'))));
        a.addMetadata("python stack", python_stack_json(stack));
      }
      if (e.correlation != 0) {  // the host side: a launch inside the issuing op, with a flow arrow
        a.flow.id = static_cast<uint32_t>(e.correlation);
        a.flow.type = libkineto::kLinkAsyncCpuGpu;
        a.flow.start = false;
        buffer_->emplace_activity(buffer_->span, ActivityType::PRIVATEUSE1_RUNTIME,
                                  e.kind == WorkKind::kCopy ? "neuronMemcpy" : "neuronLaunch");
        libkineto::GenericTraceActivity& launch = *buffer_->activities.back();
        launch.startTime = e.host_ns;
        launch.endTime = e.host_ns;
        launch.device = pid_;
        launch.resource = e.thread;
        launch.threadId = e.thread;
        launch.id = static_cast<int32_t>(e.correlation);
        launch.linked = a.linked;
        launch.flow.id = static_cast<uint32_t>(e.correlation);
        launch.flow.type = libkineto::kLinkAsyncCpuGpu;
        launch.flow.start = true;
        launch.log(logger);
      }
      a.log(logger);
    }
    log_ranges(placed, logger);
    status_ = libkineto::TraceStatus::READY;
  }

  // A device event as drawn: its stream row's span.
  struct Placed {
    const WorkEvent* event;
    int64_t begin;
    int64_t end;
  };

  // Each record_function range on every stream it issued work to: the work its thread
  // issued inside the range, from the first item's start to the last one's end.
  void log_ranges(std::vector<Placed>& placed, libkineto::ActivityLogger& logger) {
    if (ranges_.empty()) {
      return;
    }
    auto issued = [](const Placed& p) { return std::make_pair(p.event->thread, p.event->host_ns); };
    std::sort(placed.begin(), placed.end(),
              [&](const Placed& a, const Placed& b) { return issued(a) < issued(b); });
    for (const UserRange& range : ranges_) {
      std::map<std::pair<int, c10::StreamId>, std::pair<int64_t, int64_t>> spans;
      auto it = std::lower_bound(placed.begin(), placed.end(), std::make_pair(range.thread, range.start_ns),
                                 [&](const Placed& p, const std::pair<int32_t, int64_t>& key) {
                                   return issued(p) < key;
                                 });
      for (; it != placed.end() && issued(*it) <= std::make_pair(range.thread, range.end_ns); ++it) {
        const WorkEvent& e = *it->event;
        if (e.kind == WorkKind::kCollective) {
          continue;  // on the device's collectives row, not a stream's
        }
        auto [span, added] = spans.try_emplace({static_cast<int>(e.device), e.stream}, it->begin, it->end);
        if (!added) {
          span->second.first = std::min(span->second.first, it->begin);
          span->second.second = std::max(span->second.second, it->end);
        }
      }
      for (const auto& [track, span] : spans) {
        buffer_->emplace_activity(buffer_->span, ActivityType::GPU_USER_ANNOTATION, range.name);
        libkineto::GenericTraceActivity& a = *buffer_->activities.back();
        a.startTime = span.first;
        a.endTime = span.second;
        a.device = track.first;
        a.resource = rows_.of(track.first, track.second, WorkKind::kOp, nullptr);
        a.addMetadataQuoted("kind", "user_annotation");
        a.addMetadata("device", track.first);
        a.addMetadata("stream", track.second);
        a.log(logger);
      }
    }
  }

  // One point of a device's memory counter ("ph": "C", drawn as a counter track by
  // Perfetto and chrome://tracing): its allocated bytes when the host allocated or freed.
  void log_memory_sample(const WorkEvent& e, libkineto::ActivityLogger& logger) {
    buffer_->emplace_activity(buffer_->span, ActivityType::MTIA_COUNTERS,
                              "neuron:" + std::to_string(e.device) + " memory");
    libkineto::GenericTraceActivity& c = *buffer_->activities.back();
    c.startTime = std::max(e.host_ns, start_ns_);
    c.endTime = c.startTime;
    c.device = e.device;
    c.resource = 0;
    c.addCounterValue("allocated", static_cast<double>(e.bytes));
    c.addMetadata("hidden", 1);  // a point of the graph, not an event: kept out of key_averages()
    c.log(logger);
  }

  std::unique_ptr<libkineto::DeviceInfo> getDeviceInfo() override {
    return nullptr;  // one session covers every neuron device; their tracks are named by id
  }

  std::vector<libkineto::ResourceInfo> getResourceInfos() override {
    return rows_.infos();
  }

  std::unique_ptr<libkineto::CpuTraceBuffer> getTraceBuffer() override {
    return std::move(buffer_);  // Kineto keeps the activities it was given alive
  }

  void pushCorrelationId(uint64_t id) override {
    push_correlation(id);
  }

  void popCorrelationId() override {
    pop_correlation();
  }

  std::string getDeviceProperties() override {
    return "";
  }

 private:
  RecordingMark mark_;
  bool open_ = false;
  std::vector<WorkEvent> events_;
  std::vector<UserRange> ranges_;
  Rows rows_;
  std::unique_ptr<libkineto::CpuTraceBuffer> buffer_;
  std::vector<std::string> errors_;
  int64_t start_ns_ = 0;
  int64_t end_ns_ = 0;
  int32_t pid_ = static_cast<int32_t>(getpid());
};

class NeuronActivityProfiler final : public libkineto::IActivityProfiler {
 public:
  const std::string& name() const override {
    return name_;
  }

  const std::set<ActivityType>& availableActivities() const override {
    return activities_;
  }

  std::unique_ptr<libkineto::IActivityProfilerSession> configure(
      const std::set<ActivityType>& activity_types, const libkineto::Config&) override {
    // torch asks for PrivateUse1 runtime activities when ProfilerActivity.PrivateUse1 is
    // requested; a CPU-only session (the legacy profiler's) gets no device tracks.
    const bool wanted = activity_types.count(ActivityType::PRIVATEUSE1_RUNTIME) > 0;
    return wanted ? std::make_unique<Session>() : nullptr;
  }

  std::unique_ptr<libkineto::IActivityProfilerSession> configure(
      int64_t, int64_t, const std::set<ActivityType>& activity_types,
      const libkineto::Config& config) override {
    return configure(activity_types, config);
  }

 private:
  std::string name_{"neuron"};
  std::set<ActivityType> activities_{
      ActivityType::CONCURRENT_KERNEL, ActivityType::GPU_MEMCPY, ActivityType::CUDA_SYNC,
      ActivityType::PRIVATEUSE1_RUNTIME, ActivityType::PRIVATEUSE1_DRIVER};
};

REGISTER_PRIVATEUSE1_PROFILER(NeuronActivityProfiler);

// ---- the legacy profiler's device stubs ----
// An event is the stream's modelled clock when it was recorded.
struct StubEvent {
  double modeled_seconds;
};

struct LegacyProfilerStubs final : public torch::profiler::impl::ProfilerStubs {
  void record(c10::DeviceIndex* device, torch::profiler::impl::ProfilerVoidEventStub* event,
              int64_t* cpu_ns) const override {
    const c10::DeviceIndex index = current_device();
    if (device != nullptr) {
      *device = index;
    }
    if (event != nullptr) {
      *event = std::make_shared<StubEvent>(StubEvent{current_stream_clock(index)});
    }
    if (cpu_ns != nullptr) {
      *cpu_ns = c10::getTime();
    }
  }

  // Microseconds of modelled device time between two records.
  float elapsed(const torch::profiler::impl::ProfilerVoidEventStub* a,
                const torch::profiler::impl::ProfilerVoidEventStub* b) const override {
    const auto* first = static_cast<const StubEvent*>(a->get());
    const auto* second = static_cast<const StubEvent*>(b->get());
    return static_cast<float>((second->modeled_seconds - first->modeled_seconds) * 1e6);
  }

  void mark(const char*) const override {}
  void rangePush(const char*) const override {}
  void rangePop() const override {}

  bool enabled() const override {
    return true;
  }

  void onEachDevice(std::function<void(int)> op) const override {
    for (c10::DeviceIndex d = 0; d < device_count(); ++d) {
      op(d);
    }
  }

  void synchronize() const override {}  // work is synchronous on the host
};

struct RegisterLegacyStubs {
  RegisterLegacyStubs() {
    static LegacyProfilerStubs stubs;
    torch::profiler::impl::registerPrivateUse1Methods(&stubs);
  }
};
RegisterLegacyStubs g_register_legacy_stubs;

}  // namespace

void bind_profiler(py::module_& m) {
  m.def("_kineto_profiler_registered", []() {
    return torch::profiler::impl::PrivateUse1ProfilerRegistry::instance().hasFactory();
  }, "Whether neuron's Kineto activity profiler is registered (torch.profiler device tracks).");
}

}  // namespace torchneuron
