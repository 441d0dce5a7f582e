// Implements c10::impl::DeviceGuardImplInterface for PrivateUse1 ("neuron"):
// current device per thread, streams, events and synchronization.
// Checked against torch 2.13.0.
//
// Work on a neuron stream runs synchronously on the host, so every stream is
// always idle: synchronize/query return at once and an event is complete as
// soon as it is recorded. Each stream also keeps a modelled device clock (the
// Trainium time of the ops issued to it, from costing.cpp); events record
// both clocks and elapsed_time reports the modelled one unless host timing
// is selected.
#include "../core.h"
#include "../accounting/sync_debug.h"

#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/csrc/utils/device_lazy_init.h>

#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

namespace torchneuron {
namespace {

std::atomic<c10::DeviceIndex> g_device_count{0};
thread_local c10::DeviceIndex t_current_device = 0;

std::mutex g_stream_mutex;
std::vector<c10::StreamId> g_next_stream_id;  // per device

struct NeuronEvent {
  c10::DeviceIndex device = -1;
  c10::StreamId stream = 0;
  bool timing = false;
  bool recorded = false;
  std::chrono::steady_clock::time_point when;
  double modeled_seconds = 0;  // the stream's modelled clock when recorded
};

// The modelled device clock of one (device, stream), in seconds. Every op
// advances one, so it is a lone atomic: threads sharing a stream add to it
// without a lock. Clocks are created on first use and never freed, so a
// thread may keep a clock's address for as long as the stream is current.
struct StreamClock {
  std::atomic<double> seconds{0};
};

// Guards creating clocks; reading or advancing one takes no lock.
std::mutex g_clock_mutex;
// Leaked on purpose: threads may still hold clock addresses at exit.
auto& g_stream_clocks =
    *new std::map<std::pair<c10::DeviceIndex, c10::StreamId>, std::unique_ptr<StreamClock>>();
std::atomic<bool> g_modeled_event_time{true};

StreamClock& clock_of(c10::DeviceIndex device, c10::StreamId stream) {
  std::lock_guard<std::mutex> lock(g_clock_mutex);
  auto& clock = g_stream_clocks[{device, stream}];
  if (!clock) {
    clock = std::make_unique<StreamClock>();
  }
  return *clock;
}

// A thread's current stream of one device and, once looked up, its clock.
// No member initialisers: a thread_local array of these is zero-initialised
// (the default stream, clock not looked up yet) and needs no init guard.
struct CurrentStream {
  c10::StreamId id;
  StreamClock* clock;
};
thread_local CurrentStream t_current_streams[kMaxDevices];

CurrentStream& current_stream_slot(c10::DeviceIndex index) {
  TORCH_CHECK(index >= 0 && index < kMaxDevices, "invalid neuron device index ",
              static_cast<int>(index));
  return t_current_streams[index];
}

StreamClock& current_clock(c10::DeviceIndex device) {
  CurrentStream& current = current_stream_slot(device);
  if (current.clock == nullptr) {
    current.clock = &clock_of(device, current.id);
  }
  return *current.clock;
}

// std::atomic<double> has no fetch_add before C++20. Returns the clock before.
double add_seconds(std::atomic<double>& clock, double seconds) {
  double old = clock.load(std::memory_order_relaxed);
  while (!clock.compare_exchange_weak(old, old + seconds, std::memory_order_relaxed)) {
  }
  return old;
}

// The clock cannot be earlier than `seconds` (a wait on another stream's work).
void raise_to(std::atomic<double>& clock, double seconds) {
  double old = clock.load(std::memory_order_relaxed);
  while (old < seconds && !clock.compare_exchange_weak(old, seconds, std::memory_order_relaxed)) {
  }
}

c10::Stream make_stream(c10::DeviceIndex index, c10::StreamId id) {
  return c10::Stream(c10::Stream::UNSAFE, c10::Device(kNeuron, index), id);
}

}  // namespace

double advance_current_stream(c10::DeviceIndex device, double seconds) {
  return add_seconds(current_clock(device).seconds, seconds);
}

c10::StreamId current_stream_id(c10::DeviceIndex device) {
  return current_stream_slot(device).id;
}

double current_stream_clock(c10::DeviceIndex device) {
  return current_clock(device).seconds.load(std::memory_order_relaxed);
}

// As CUDA does for a copy between devices: the current streams of both wait
// for each other, the copy runs, and both are done when it is.
double advance_current_streams_together(c10::DeviceIndex a, c10::DeviceIndex b, double seconds) {
  std::atomic<double>& first = current_clock(a).seconds;
  std::atomic<double>& second = current_clock(b).seconds;
  const double start =
      std::max(first.load(std::memory_order_relaxed), second.load(std::memory_order_relaxed));
  raise_to(first, start + seconds);
  raise_to(second, start + seconds);
  return start;
}

void set_modeled_event_time(bool modeled) {
  g_modeled_event_time.store(modeled);
}

c10::DeviceIndex device_count() noexcept {
  return g_device_count.load();
}

void set_device_count(c10::DeviceIndex count) {
  std::lock_guard<std::mutex> lock(g_stream_mutex);
  g_device_count.store(count);
  g_next_stream_id.assign(count, 1);
}

void check_device_index(c10::DeviceIndex index) {
  auto count = device_count();
  TORCH_CHECK(
      index >= 0 && index < count,
      "Invalid device index neuron:", static_cast<int>(index), ": ",
      static_cast<int>(count), " neuron devices are visible (neuron:0 to neuron:",
      static_cast<int>(count) - 1,
      "). NEURON_RT_VISIBLE_CORES and NEURON_LOGICAL_NC_CONFIG set the count.");
}

void check_not_in_bad_fork() {
  TORCH_CHECK(
      !torch::utils::is_device_in_bad_fork(kNeuron),
      "Cannot use Neuron in a forked subprocess: the parent process used the device before "
      "fork(), so its tensors and memory are not usable here (as with CUDA). To use Neuron "
      "with multiprocessing, you must use the 'spawn' start method "
      "(multiprocessing.set_start_method('spawn') or torch.multiprocessing.spawn).");
}

c10::DeviceIndex current_device() {
  return t_current_device;
}

void set_current_device(c10::DeviceIndex index) {
  check_device_index(index);
  t_current_device = index;
}

struct NeuronGuardImpl final : public c10::impl::DeviceGuardImplInterface {
  NeuronGuardImpl() = default;
  explicit NeuronGuardImpl(c10::DeviceType t) {
    TORCH_INTERNAL_ASSERT(t == kNeuron);
  }

  c10::DeviceType type() const override {
    return kNeuron;
  }

  // Sets the device and returns the previous one.
  c10::Device exchangeDevice(c10::Device d) const override {
    auto old = getDevice();
    if (old.index() != d.index()) {
      setDevice(d);
    }
    return old;
  }

  c10::Device getDevice() const override {
    return c10::Device(kNeuron, current_device());
  }

  void setDevice(c10::Device d) const override {
    TORCH_CHECK(d.is_privateuseone(), "Expected a neuron device, got ", d);
    set_current_device(d.index());
  }

  // Must not throw: used by guard destructors.
  void uncheckedSetDevice(c10::Device d) const noexcept override {
    if (d.index() >= 0 && d.index() < device_count()) {
      t_current_device = d.index();
    }
  }

  // A device without an index ("neuron", index -1) means the current device,
  // as on CUDA: torch.Stream(device="neuron") and friends arrive here with -1.
  static c10::DeviceIndex index_or_current(c10::Device d) {
    if (d.index() == -1) {
      return current_device();
    }
    check_device_index(d.index());
    return d.index();
  }

  c10::Stream getStream(c10::Device d) const override {
    const c10::DeviceIndex index = index_or_current(d);
    return make_stream(index, current_stream_slot(index).id);
  }

  c10::Stream getDefaultStream(c10::Device d) const override {
    return make_stream(index_or_current(d), 0);
  }

  c10::Stream getStreamFromGlobalPool(c10::Device d, bool /*high_priority*/)
      const override {
    return getNewStream(d, 0);
  }

  c10::Stream getNewStream(c10::Device d, int /*priority*/) const override {
    const c10::DeviceIndex index = index_or_current(d);
    std::lock_guard<std::mutex> lock(g_stream_mutex);
    return make_stream(index, g_next_stream_id[index]++);
  }

  // Sets the thread's current stream of the stream's device; returns the old.
  c10::Stream exchangeStream(c10::Stream s) const override {
    CurrentStream& slot = current_stream_slot(s.device_index());
    auto old = make_stream(s.device_index(), slot.id);
    if (slot.id != s.id()) {
      slot = CurrentStream{s.id(), nullptr};  // its clock is looked up on first use
    }
    return old;
  }

  c10::DeviceIndex deviceCount() const noexcept override {
    return device_count();
  }

  // Every dtype works on neuron (unsupported ones are computed on the host,
  // as TorchNeuron's CPU fallback does).
  c10::DeviceCapability getDeviceCapability(c10::Device d) const override {
    index_or_current(d);
    return c10::DeviceCapability();
  }

  // Events ------------------------------------------------------------------
  void record(
      void** event,
      const c10::Stream& stream,
      const c10::DeviceIndex device_index,
      const c10::EventFlag flag) const override {
    TORCH_CHECK(
        device_index == -1 || device_index == stream.device_index(),
        "Event device index ", static_cast<int>(device_index),
        " does not match recording stream's device index ",
        static_cast<int>(stream.device_index()), ".");
    auto* e = static_cast<NeuronEvent*>(*event);
    if (e == nullptr) {
      e = new NeuronEvent();
      e->timing = flag == c10::EventFlag::BACKEND_DEFAULT;
      *event = e;
    }
    e->device = stream.device_index();
    e->stream = stream.id();
    e->recorded = true;
    e->when = std::chrono::steady_clock::now();
    e->modeled_seconds = clock_of(e->device, e->stream).seconds.load(std::memory_order_relaxed);
  }

  // The stream waits for the event: on the host that wait is already over
  // (work is synchronous); on the modelled clock the stream cannot run ahead
  // of the event's time.
  void block(void* event, const c10::Stream& stream) const override {
    auto* e = static_cast<NeuronEvent*>(event);
    if (e == nullptr || !e->recorded) {
      return;
    }
    raise_to(clock_of(stream.device_index(), stream.id()).seconds, e->modeled_seconds);
  }

  bool queryEvent(void* event) const override {
    return true;
  }

  void destroyEvent(void* event, const c10::DeviceIndex /*device_index*/)
      const noexcept override {
    delete static_cast<NeuronEvent*>(event);
  }

  void synchronizeEvent(void* event) const override {}

  double elapsedTime(
      void* start, void* end, const c10::DeviceIndex device_index)
      const override {
    auto* a = static_cast<NeuronEvent*>(start);
    auto* b = static_cast<NeuronEvent*>(end);
    TORCH_CHECK(
        a != nullptr && b != nullptr && a->recorded && b->recorded,
        "Both events must be recorded before calculating elapsed time.");
    TORCH_CHECK(
        a->timing && b->timing,
        "Both events must be created with argument 'enable_timing=True'.");
    if (g_modeled_event_time.load(std::memory_order_relaxed)) {
      return (b->modeled_seconds - a->modeled_seconds) * 1e3;
    }
    std::chrono::duration<double, std::milli> ms = b->when - a->when;
    return ms.count();
  }

  // Streams -----------------------------------------------------------------
  bool queryStream(const c10::Stream& /*stream*/) const override {
    return true;
  }

  void synchronizeStream(const c10::Stream& stream) const override {
    check_host_sync(stream.device_index(), kSyncStream, 0);  // sync debug mode
  }

  void synchronizeDevice(const c10::DeviceIndex device_index) const override {
    if (device_index != -1) {
      check_device_index(device_index);
    }
    check_host_sync(device_index, kSyncDevice, 0);  // sync debug mode
  }

  void recordDataPtrOnStream(const c10::DataPtr&, const c10::Stream&)
      const override {}
};

// ==== Global Registration ====
C10_REGISTER_GUARD_IMPL(PrivateUse1, NeuronGuardImpl);

}  // namespace torchneuron
