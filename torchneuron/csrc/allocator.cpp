// Implements c10::DeviceAllocator for PrivateUse1 ("neuron"), a pinned host
// allocator, and the CPU-allocator router used by the op fallback.
// Checked against torch 2.13.0.
//
// Device memory is host memory with TorchNeuron's caching-allocator rules
// (trainium-facts.md, "TorchNeuron"): requests < 1 MiB come from the small
// pool and >= 1 MiB from the large pool; requests < 16 MiB are rounded up to
// size classes (minimum 256 B). Each device has a capacity (its HBM); going
// over it first empties the cache, then raises torch.OutOfMemoryError.
#include "core.h"

#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/alloc_cpu.h>
#include <c10/util/Exception.h>

#include <array>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <unordered_map>
#include <vector>

namespace torchneuron {
namespace {

using c10::CachingDeviceAllocator::DeviceStats;
using c10::CachingAllocator::StatType;

constexpr size_t kMinBlock = 256;
constexpr size_t kSmallLimit = size_t(1) << 20;  // 1 MiB: small/large pool
constexpr size_t kClassLimit = size_t(16) << 20;  // 16 MiB: size classes end
constexpr size_t kLargeRound = size_t(2) << 20;  // >= 16 MiB: 2 MiB steps

// Every block is preceded by a header (one alignment unit) holding its Block*,
// so memory can also be freed from its data pointer alone (free_routed).
struct Block {
  void* base;  // what posix_memalign returned
  void* ptr;  // base + header
  size_t size;  // rounded size
  size_t requested;
  c10::DeviceIndex device;
  bool small;
};

struct DeviceState {
  std::mutex mutex;
  size_t capacity = 0;
  DeviceStats stats;
  std::unordered_map<size_t, std::vector<Block*>> cached;  // by rounded size
};

// Indexed by device; fixed size so lookups need no lock.
std::array<DeviceState, kMaxDevices> g_devices;

// Live segments, for device-from-pointer queries.
std::mutex g_segments_mutex;
std::map<uintptr_t, std::pair<size_t, c10::DeviceIndex>> g_segments;

thread_local c10::DeviceIndex t_routed_device = -1;

// Size classes: powers of two up to 1 KiB, then 4 classes per power of two
// up to 16 MiB, then 2 MiB steps.
size_t round_size(size_t n) {
  if (n <= kMinBlock) {
    return kMinBlock;
  }
  if (n >= kClassLimit) {
    return (n + kLargeRound - 1) / kLargeRound * kLargeRound;
  }
  size_t pow2 = kMinBlock;
  while (pow2 < n) {
    pow2 <<= 1;
  }
  if (pow2 <= 1024) {
    return pow2;
  }
  size_t step = pow2 / 8;  // classes at 5/8, 6/8, 7/8, 8/8 of pow2
  return (n + step - 1) / step * step;
}

DeviceState& state(c10::DeviceIndex device) {
  check_device_index(device);
  return g_devices[device];
}

template <typename F>
void for_pools(bool small, F f) {
  f(static_cast<size_t>(StatType::AGGREGATE));
  f(static_cast<size_t>(small ? StatType::SMALL_POOL : StatType::LARGE_POOL));
}

std::string format_bytes(size_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024.0 && u < 4) {
    v /= 1024.0;
    ++u;
  }
  char buf[64];
  snprintf(buf, sizeof(buf), u == 0 ? "%.0f %s" : "%.2f %s", v, units[u]);
  return buf;
}

// Applies f to every per-pool statistic of a device.
template <typename F>
void for_each_stat(DeviceStats& stats, F f) {
  for (auto* array :
       {&stats.allocation, &stats.segment, &stats.active, &stats.inactive_split,
        &stats.allocated_bytes, &stats.reserved_bytes, &stats.active_bytes,
        &stats.inactive_split_bytes, &stats.requested_bytes}) {
    for (auto& stat : *array) {
      f(stat);
    }
  }
}

// Caller holds s.mutex.
void release_cached(DeviceState& s) {
  for (auto& entry : s.cached) {
    for (Block* b : entry.second) {
      for_pools(b->small, [&](size_t i) {
        s.stats.segment[i].decrease(1);
        s.stats.reserved_bytes[i].decrease(b->size);
      });
      s.stats.num_device_free += 1;
      {
        std::lock_guard<std::mutex> lock(g_segments_mutex);
        g_segments.erase(reinterpret_cast<uintptr_t>(b->ptr));
      }
      std::free(b->base);
      delete b;
    }
  }
  s.cached.clear();
}

std::string summary_locked(c10::DeviceIndex device, DeviceState& s) {
  const auto agg = static_cast<size_t>(StatType::AGGREGATE);
  size_t allocated = s.stats.allocated_bytes[agg].current;
  size_t reserved = s.stats.reserved_bytes[agg].current;
  return "neuron:" + std::to_string(device) + " has a total capacity of " +
      format_bytes(s.capacity) + " of which " +
      format_bytes(s.capacity - std::min(s.capacity, reserved)) +
      " is free. Of the reserved memory " + format_bytes(allocated) +
      " is allocated by PyTorch, and " + format_bytes(reserved - allocated) +
      " is reserved by PyTorch but unallocated";
}

void free_block(void* ctx) {
  auto* b = static_cast<Block*>(ctx);
  DeviceState& s = g_devices[b->device];
  std::lock_guard<std::mutex> lock(s.mutex);
  for_pools(b->small, [&](size_t i) {
    s.stats.allocation[i].decrease(1);
    s.stats.allocated_bytes[i].decrease(b->size);
    s.stats.active[i].decrease(1);
    s.stats.active_bytes[i].decrease(b->size);
    s.stats.requested_bytes[i].decrease(b->requested);
  });
  s.cached[b->size].push_back(b);
}

Block* take_cached(DeviceState& s, size_t size) {
  auto it = s.cached.find(size);
  if (it == s.cached.end() || it->second.empty()) {
    return nullptr;
  }
  Block* b = it->second.back();
  it->second.pop_back();
  return b;
}

Block* new_segment(c10::DeviceIndex device, DeviceState& s, size_t size, size_t n) {
  const auto agg = static_cast<size_t>(StatType::AGGREGATE);
  if (s.stats.reserved_bytes[agg].current + size > s.capacity &&
      !s.cached.empty()) {
    s.stats.num_alloc_retries += 1;
    release_cached(s);
  }
  if (s.stats.reserved_bytes[agg].current + size > s.capacity) {
    s.stats.num_ooms += 1;
    TORCH_CHECK_WITH(
        OutOfMemoryError, false,
        "Neuron out of memory. Tried to allocate ", format_bytes(n), ". ",
        summary_locked(device, s),
        ". Free tensors you no longer need, use a smaller batch, or raise the "
        "limit with torch.neuron.set_per_process_memory_fraction() (the device's "
        "HBM is the ceiling; NEURON_LOGICAL_NC_CONFIG=2 gives larger devices).");
  }
  void* base = nullptr;
  size_t alignment = size >= kSmallLimit ? 4096 : 64;
  if (posix_memalign(&base, alignment, size + alignment) != 0 || base == nullptr) {
    s.stats.num_ooms += 1;
    TORCH_CHECK_WITH(
        OutOfMemoryError, false, "Neuron out of memory. Tried to allocate ",
        format_bytes(n), " on neuron:", static_cast<int>(device),
        " but the host could not provide the memory backing the device. ",
        summary_locked(device, s));
  }
  for_pools(size < kSmallLimit, [&](size_t i) {
    s.stats.segment[i].increase(1);
    s.stats.reserved_bytes[i].increase(size);
  });
  s.stats.num_device_alloc += 1;
  void* p = static_cast<char*>(base) + alignment;
  {
    std::lock_guard<std::mutex> lock(g_segments_mutex);
    g_segments[reinterpret_cast<uintptr_t>(p)] = {size, device};
  }
  auto* b = new Block{base, p, size, n, device, size < kSmallLimit};
  static_cast<Block**>(p)[-1] = b;
  return b;
}

// Frees a routed allocation given only its data pointer (DataPtr context ==
// data, which raw_allocate() requires).
void free_routed(void* data) {
  free_block(static_cast<Block**>(data)[-1]);
}

}  // namespace

c10::DataPtr allocate_on(c10::DeviceIndex device, size_t n) {
  c10::Device dev(kNeuron, device);
  if (n == 0) {
    check_device_index(device);
    return c10::DataPtr(nullptr, nullptr, &free_block, dev);
  }
  check_not_in_bad_fork();
  DeviceState& s = state(device);
  size_t size = round_size(n);
  std::lock_guard<std::mutex> lock(s.mutex);
  Block* b = take_cached(s, size);
  if (b == nullptr) {
    b = new_segment(device, s, size, n);
  }
  b->requested = n;
  for_pools(b->small, [&](size_t i) {
    s.stats.allocation[i].increase(1);
    s.stats.allocated_bytes[i].increase(size);
    s.stats.active[i].increase(1);
    s.stats.active_bytes[i].increase(size);
    s.stats.requested_bytes[i].increase(n);
  });
  return c10::DataPtr(b->ptr, b, &free_block, dev);
}

bool is_neuron_data_ptr(const c10::DataPtr& ptr) {
  return ptr.get_deleter() == &free_block || ptr.get_deleter() == &free_routed;
}

void set_capacity(c10::DeviceIndex device, size_t bytes) {
  DeviceState& s = state(device);
  std::lock_guard<std::mutex> lock(s.mutex);
  s.capacity = bytes;
}

size_t capacity(c10::DeviceIndex device) {
  DeviceState& s = state(device);
  std::lock_guard<std::mutex> lock(s.mutex);
  return s.capacity;
}

std::string memory_summary_line(c10::DeviceIndex device) {
  DeviceState& s = state(device);
  std::lock_guard<std::mutex> lock(s.mutex);
  return summary_locked(device, s);
}

c10::DeviceIndex device_of_pointer(const void* ptr) {
  auto p = reinterpret_cast<uintptr_t>(ptr);
  std::lock_guard<std::mutex> lock(g_segments_mutex);
  auto it = g_segments.upper_bound(p);
  if (it == g_segments.begin()) {
    return -1;
  }
  --it;
  return p < it->first + it->second.first ? it->second.second : -1;
}

// ---- the device allocator -------------------------------------------------

struct NeuronDeviceAllocator final : public c10::DeviceAllocator {
  // Allocates on the routed device if any, else the current device.
  c10::DataPtr allocate(size_t n) override {
    auto device = t_routed_device >= 0 ? t_routed_device : current_device();
    return allocate_on(device, n);
  }

  c10::DeleterFnPtr raw_deleter() const override {
    return nullptr;
  }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    std::memcpy(dest, src, count);
  }

  bool initialized() override {
    return device_count() > 0;
  }

  // Releases cached blocks of every device, as torch.cuda.empty_cache does.
  void emptyCache(c10::MempoolId_t /*mempool_id*/) override {
    for (auto& s : g_devices) {
      std::lock_guard<std::mutex> lock(s.mutex);
      release_cached(s);
    }
  }

  // Work is synchronous, so no cross-stream reuse hazard exists.
  void recordStream(const c10::DataPtr&, c10::Stream) override {}

  DeviceStats getDeviceStats(c10::DeviceIndex device) override {
    DeviceState& s = state(device);
    std::lock_guard<std::mutex> lock(s.mutex);
    return s.stats;
  }

  void resetAccumulatedStats(c10::DeviceIndex device) override {
    DeviceState& s = state(device);
    std::lock_guard<std::mutex> lock(s.mutex);
    for_each_stat(s.stats, [](c10::CachingAllocator::Stat& st) { st.reset_accumulated(); });
    s.stats.num_alloc_retries = 0;
    s.stats.num_ooms = 0;
    s.stats.num_device_alloc = 0;
    s.stats.num_device_free = 0;
  }

  void resetPeakStats(c10::DeviceIndex device) override {
    DeviceState& s = state(device);
    std::lock_guard<std::mutex> lock(s.mutex);
    for_each_stat(s.stats, [](c10::CachingAllocator::Stat& st) { st.reset_peak(); });
  }

  // (free, total): free is capacity minus reserved memory.
  std::pair<size_t, size_t> getMemoryInfo(c10::DeviceIndex device) override {
    DeviceState& s = state(device);
    std::lock_guard<std::mutex> lock(s.mutex);
    const auto agg = static_cast<size_t>(StatType::AGGREGATE);
    size_t reserved = s.stats.reserved_bytes[agg].current;
    return {s.capacity - std::min(s.capacity, reserved), s.capacity};
  }
};

NeuronDeviceAllocator g_device_allocator;

c10::DeviceAllocator* device_allocator() {
  return &g_device_allocator;
}

// ---- pinned host memory -----------------------------------------------------

namespace {

std::mutex g_pinned_mutex;
std::map<uintptr_t, size_t> g_pinned;

void free_pinned(void* ptr) {
  {
    std::lock_guard<std::mutex> lock(g_pinned_mutex);
    g_pinned.erase(reinterpret_cast<uintptr_t>(ptr));
  }
  c10::free_cpu(ptr);
}

struct PinnedAllocator final : public c10::Allocator {
  c10::DataPtr allocate(size_t n) override {
    void* p = n == 0 ? nullptr : c10::alloc_cpu(n);
    if (p != nullptr) {
      std::lock_guard<std::mutex> lock(g_pinned_mutex);
      g_pinned[reinterpret_cast<uintptr_t>(p)] = n;
    }
    return c10::DataPtr(p, p, &free_pinned, c10::Device(c10::kCPU));
  }
  c10::DeleterFnPtr raw_deleter() const override {
    return &free_pinned;
  }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    std::memcpy(dest, src, count);
  }
};

PinnedAllocator g_pinned_allocator;

}  // namespace

c10::Allocator* pinned_allocator() {
  return &g_pinned_allocator;
}

bool is_pinned(const void* ptr) {
  auto p = reinterpret_cast<uintptr_t>(ptr);
  std::lock_guard<std::mutex> lock(g_pinned_mutex);
  auto it = g_pinned.upper_bound(p);
  if (it == g_pinned.begin()) {
    return false;
  }
  --it;
  return p < it->first + it->second;
}

// ---- routing CPU allocations into device memory ----------------------------

namespace {

c10::DeleterFnPtr g_original_raw_deleter = nullptr;

// raw_allocate() frees with raw_deleter(), for memory of either origin.
void free_any(void* data) {
  if (device_of_pointer(data) >= 0) {
    free_routed(data);
  } else {
    g_original_raw_deleter(data);
  }
}

struct RoutingCpuAllocator final : public c10::Allocator {
  c10::Allocator* original = nullptr;

  c10::DataPtr allocate(size_t n) override {
    if (t_routed_device < 0) {
      return original->allocate(n);
    }
    auto ptr = allocate_on(t_routed_device, n);
    if (ptr.get() == nullptr) {
      return c10::DataPtr(nullptr, c10::Device(c10::kCPU));
    }
    ptr.release_context();  // the Block stays reachable through its header
    return c10::DataPtr(ptr.get(), ptr.get(), &free_routed, c10::Device(c10::kCPU));
  }
  c10::DeleterFnPtr raw_deleter() const override {
    return g_original_raw_deleter ? &free_any : nullptr;
  }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    std::memcpy(dest, src, count);
  }
};

RoutingCpuAllocator g_router;

}  // namespace

RouteAllocations::RouteAllocations(c10::DeviceIndex device)
    : previous_(t_routed_device) {
  t_routed_device = device;
}

RouteAllocations::~RouteAllocations() {
  t_routed_device = previous_;
}

c10::DeviceIndex routed_device() {
  return t_routed_device;
}

c10::Allocator* routing_cpu_allocator() {
  return &g_router;
}

void install_routing_cpu_allocator() {
  if (c10::GetCPUAllocator() == &g_router) {
    return;
  }
  g_router.original = c10::GetCPUAllocator();
  g_original_raw_deleter = g_router.original->raw_deleter();
  c10::SetCPUAllocator(&g_router, /*priority=*/10);
  TORCH_CHECK(
      c10::GetCPUAllocator() == &g_router,
      "torchneuron could not install its CPU allocator router: another "
      "allocator with a higher priority is registered for CPU.");
}

// ==== Global Registration ====
REGISTER_ALLOCATOR(c10::DeviceType::PrivateUse1, &g_device_allocator);

}  // namespace torchneuron
