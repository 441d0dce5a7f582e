// Implements c10::DeviceAllocator for PrivateUse1 ("neuron"), a pinned host
// allocator, and the CPU-allocator router used by the op fallback.
// Checked against torch 2.13.0.
//
// Device memory is host memory with TorchNeuron's caching-allocator rules
// (trainium-facts.md, "TorchNeuron"): requests < 1 MiB come from the small
// pool and >= 1 MiB from the large pool; requests < 16 MiB are rounded up to
// size classes (minimum 256 B). Each device has a capacity (its HBM); going
// over it first empties the cache, then raises torch.OutOfMemoryError naming
// what fills the device.
//
// Memory history (torch.cuda.memory._record_memory_history's model): off by
// default, one atomic load on the allocation and free paths when off. When on,
// each block keeps the stack that allocated it (torch::CapturedTraceback, as
// CUDA's caching allocator), each device a ring buffer of alloc/free/segment/
// OOM events, and memory_snapshot() returns both in PyTorch's snapshot format.
// Every allocation and free is also reported to torch.profiler
// (c10::reportMemoryUsageToProfiler, as CUDA's allocator does).
//
// Dataless execution (dataless.cpp) runs the same caching rules on the same
// sizes, but its blocks hold no values: blocks of the large pool are mapped
// without reserving host memory (MAP_NORESERVE; only the header's page is
// touched), and each storage that holds no values is marked by its DataPtr's
// deleter (free_dataless_block for blocks allocated so, free_valueless for
// storages that held values until an op wrote them dataless), so that reading
// one outside dataless execution raises instead of returning stale bytes.
#include <Python.h>  // first, as Python asks: the GIL around symbolizing stacks

#include "../core.h"

#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/alloc_cpu.h>
#include <c10/util/Exception.h>
#include <torch/csrc/profiler/combined_traceback.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <unordered_map>
#include <vector>

#include <sys/mman.h>

namespace torchneuron {
namespace {

using c10::CachingDeviceAllocator::DeviceStats;
using c10::CachingAllocator::StatType;

constexpr size_t kMinBlock = 256;
constexpr size_t kSmallLimit = size_t(1) << 20;  // 1 MiB: small/large pool
constexpr size_t kClassLimit = size_t(16) << 20;  // 16 MiB: size classes end
constexpr size_t kLargeRound = size_t(2) << 20;  // >= 16 MiB: 2 MiB steps

// ---- memory history: what _record_memory_history asked for ----------------

// How much stack to keep, as CUDA's RecordContext: NEVER < STATE (stacks of
// live blocks) < ALLOC (also on alloc events) < ALL (also on free events).
enum class RecordContext : int { NEVER = 0, STATE = 1, ALLOC = 2, ALL = 3 };

// Trace actions, named as in PyTorch's snapshot format (kActionNames).
enum Action : uint8_t {
  kAlloc, kFreeRequested, kFreeCompleted, kSegmentAlloc, kSegmentFree, kOom, kSnapshot,
  kNumActions
};
constexpr std::array<const char*, kNumActions> kActionNames = {
    "alloc", "free_requested", "free_completed", "segment_alloc", "segment_free", "oom",
    "snapshot"};

using Context = std::shared_ptr<c10::GatheredContext>;

// One published setting; immutable, so the allocation path reads it with one
// atomic load and no lock. Each change publishes a new one; old ones are kept
// (a few bytes per _record_memory_history call) since a thread may still read them.
struct HistoryConfig {
  bool trace = false;  // enabled == "all": keep the event ring buffer
  RecordContext context = RecordContext::NEVER;
  bool cpp = false;  // stacks == "all": C++ frames too
  size_t max_entries = 1;
  uint32_t skip = 0;  // bit per Action not to record
};
std::atomic<const HistoryConfig*> g_history{nullptr};  // nullptr: history off

struct TraceEntry {
  Action action;
  uintptr_t addr;  // for kOom: the device's free bytes
  size_t size;
  int64_t time_us;
  Context context;
};

// Every block is preceded by a header (one alignment unit) holding its Block*,
// so memory can also be freed from its data pointer alone (free_routed).
// Each block is its own segment (blocks are never split or merged).
struct Block {
  void* base;  // what posix_memalign (or mmap, if `mapped`) returned
  void* ptr;  // base + header
  size_t size;  // rounded size
  size_t requested;
  c10::DeviceIndex device;
  bool small;
  bool mapped = false;  // a dataless segment: mmap'ed without reserving host memory
  bool live = false;  // held by a tensor (else cached)
  // While held by a storage without values: the value every element is known to have
  // (a fill, a finite check), or NaN when unknown.
  double known_value = std::numeric_limits<double>::quiet_NaN();
  Context context;  // stack of the live allocation, if history records stacks
  Context segment_context;  // stack of the allocation that created the segment
};

struct DeviceState {
  std::mutex mutex;
  size_t capacity = 0;
  DeviceStats stats;
  std::unordered_map<size_t, std::vector<Block*>> cached;  // by rounded size
  // Event ring buffer (history "all"); allocated on first use and never freed,
  // as CUDA's: its stacks may refer to Python objects gone at exit.
  std::vector<TraceEntry>* trace = nullptr;
  size_t trace_next = 0;  // oldest entry once the buffer is full
};

// Indexed by device; fixed size so lookups need no lock.
std::array<DeviceState, kMaxDevices> g_devices;

// Live segments, for device-from-pointer queries.
std::mutex g_segments_mutex;
std::map<uintptr_t, std::pair<size_t, c10::DeviceIndex>> g_segments;

thread_local c10::DeviceIndex t_routed_device = -1;

// ---- peaks without a kernel's scratch memory (RouteAllocations) -------------

// The statistics whose peaks a routed kernel call's scratch memory must not raise.
constexpr size_t kPeakStats = 5;
constexpr size_t kPools = static_cast<size_t>(StatType::NUM_TYPES);

// One RouteAllocations guard: the peaks before its first routed allocation.
struct RoutedCall {  // trivial: thread_local without an initialisation guard
  bool marked;
  c10::DeviceIndex device;
  uint64_t frees;  // t_frees at the mark
  int64_t peaks[kPeakStats][kPools];
};
constexpr int kMaxRoutedCalls = 8;  // nesting deeper than this keeps CPU's peaks
thread_local RoutedCall t_routed_calls[kMaxRoutedCalls];
thread_local int t_routed_depth = 0;
thread_local bool t_routing_now = false;  // inside RoutingCpuAllocator::allocate
thread_local uint64_t t_frees = 0;  // frees by this thread

template <typename F>
void for_peak_stats(DeviceStats& stats, F f) {
  size_t k = 0;
  for (auto* array : {&stats.allocation, &stats.active, &stats.allocated_bytes,
                      &stats.active_bytes, &stats.requested_bytes}) {
    for (size_t pool = 0; pool < kPools; ++pool) {
      f(k, pool, (*array)[pool]);
    }
    ++k;
  }
}

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

// ---- memory history: recording ---------------------------------------------

int64_t now_us() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// The stack of the calling thread, if `h` records stacks at `level`. Called
// before taking a device lock: gathering Python frames takes the GIL, and a
// thread holding the GIL may be waiting for that device lock.
Context gather_context(const HistoryConfig* h, RecordContext level) {
  if (h == nullptr || h->context < level) {
    return nullptr;
  }
  return torch::CapturedTraceback::gather(/*python=*/true, /*script=*/true, /*cpp=*/h->cpp);
}

// Appends an event to the device's ring buffer if `h` keeps them. Caller holds s.mutex.
void record_trace(DeviceState& s, const HistoryConfig* h, Action action, uintptr_t addr,
                  size_t size, Context context) {
  if (h == nullptr || !h->trace || ((h->skip >> action) & 1u) != 0) {
    return;
  }
  if (s.trace == nullptr) {
    s.trace = new std::vector<TraceEntry>();
  }
  TraceEntry entry{action, addr, size, now_us(), std::move(context)};
  if (s.trace->size() < h->max_entries) {
    s.trace->push_back(std::move(entry));
  } else {
    (*s.trace)[s.trace_next] = std::move(entry);
    s.trace_next = (s.trace_next + 1) % s.trace->size();
  }
}

// The device's events, oldest first. Caller holds s.mutex.
std::vector<TraceEntry> trace_in_order(const DeviceState& s) {
  std::vector<TraceEntry> out;
  if (s.trace != nullptr) {
    out.reserve(s.trace->size());
    std::rotate_copy(s.trace->begin(), s.trace->begin() + s.trace_next, s.trace->end(),
                     std::back_inserter(out));
  }
  return out;
}

// ---- the caching allocator -------------------------------------------------

// Page before a mapped segment's data, holding the header.
constexpr size_t kMappedHeader = 4096;

void release_segment_memory(const Block& b) {
  if (b.mapped) {
    munmap(b.base, b.size + kMappedHeader);
  } else {
    std::free(b.base);
  }
}

// Memory for a new segment of `size` bytes whose data starts `alignment` bytes in.
// Dataless large segments are mapped without reserving host memory: their pages
// are never touched (but the header's), so they cost address space only.
void* segment_memory(size_t size, size_t& alignment, bool& mapped) {
  mapped = dataless_active() && size >= kSmallLimit;
  if (mapped) {
    alignment = kMappedHeader;
    void* base = mmap(nullptr, size + kMappedHeader, PROT_READ | PROT_WRITE,
                      MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    return base == MAP_FAILED ? nullptr : base;
  }
  void* base = nullptr;
  return posix_memalign(&base, alignment, size + alignment) == 0 ? base : nullptr;
}

// Caller holds s.mutex. `context`: the stack of the caller (empty_cache, or the
// allocation that needed the room), for the segment_free events.
void release_cached(DeviceState& s, const HistoryConfig* h, const Context& context) {
  for (auto& entry : s.cached) {
    for (Block* b : entry.second) {
      for_pools(b->small, [&](size_t i) {
        s.stats.segment[i].decrease(1);
        s.stats.reserved_bytes[i].decrease(b->size);
      });
      s.stats.num_device_free += 1;
      record_trace(s, h, kSegmentFree, reinterpret_cast<uintptr_t>(b->ptr), b->size,
                   context ? context : b->segment_context);
      {
        std::lock_guard<std::mutex> lock(g_segments_mutex);
        g_segments.erase(reinterpret_cast<uintptr_t>(b->ptr));
      }
      release_segment_memory(*b);
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
  ++t_frees;
  auto* b = static_cast<Block*>(ctx);
  DeviceState& s = g_devices[b->device];
  const HistoryConfig* h = g_history.load(std::memory_order_acquire);
  const Context context = h ? gather_context(h, RecordContext::ALL) : nullptr;
  // Read before the block goes back to the cache, where another thread may free it.
  void* const ptr = b->ptr;
  const auto size = static_cast<int64_t>(b->size);
  const c10::Device dev(kNeuron, b->device);
  size_t allocated, reserved;
  {
    std::lock_guard<std::mutex> lock(s.mutex);
    for_pools(b->small, [&](size_t i) {
      s.stats.allocation[i].decrease(1);
      s.stats.allocated_bytes[i].decrease(b->size);
      s.stats.active[i].decrease(1);
      s.stats.active_bytes[i].decrease(b->size);
      s.stats.requested_bytes[i].decrease(b->requested);
    });
    b->live = false;
    if (h != nullptr) {
      // Work is synchronous: the free completes as it is requested.
      const auto addr = reinterpret_cast<uintptr_t>(b->ptr);
      const Context& stack = context ? context : b->context;
      record_trace(s, h, kFreeRequested, addr, b->requested, stack);
      record_trace(s, h, kFreeCompleted, addr, b->requested, stack);
    }
    b->context.reset();  // a cached block has no owner; its segment keeps segment_context
    s.cached[b->size].push_back(b);
    const auto agg = static_cast<size_t>(StatType::AGGREGATE);
    allocated = s.stats.allocated_bytes[agg].current;
    reserved = s.stats.reserved_bytes[agg].current;
  }
  c10::reportMemoryUsageToProfiler(ptr, -size, allocated, reserved, dev);
  if (recording_events()) {  // the trace's memory counter (events.cpp)
    record_memory_event(dev.index(), allocated);
  }
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

// ---- what fills the device, for the OOM message ----------------------------

// What an OOM message needs, collected under the device lock so that the
// stacks can be symbolized (which takes the GIL) after it is released.
struct OomReport {
  std::string head;  // what failed and the device's totals
  size_t live_blocks = 0;
  size_t live_bytes = 0;
  // (block size, allocation stack or null) of the largest live blocks, largest first.
  std::vector<std::pair<size_t, Context>> largest;
  bool history_on = false;
};

// At most this many live blocks are symbolized for an OOM message (the largest).
constexpr size_t kOomBlocksSymbolized = 4096;

// Caller holds s.mutex.
void collect_live_blocks(c10::DeviceIndex device, OomReport& report) {
  {
    std::lock_guard<std::mutex> lock(g_segments_mutex);
    for (const auto& seg : g_segments) {
      if (seg.second.second != device) {
        continue;
      }
      const Block* b = reinterpret_cast<Block* const*>(seg.first)[-1];
      if (b->live) {
        report.live_blocks += 1;
        report.live_bytes += b->size;
        report.largest.emplace_back(b->size, b->context);
      }
    }
  }
  std::stable_sort(report.largest.begin(), report.largest.end(),
                   [](const auto& a, const auto& b) { return a.first > b.first; });
  if (report.largest.size() > kOomBlocksSymbolized) {
    report.largest.resize(kOomBlocksSymbolized);
  }
}

// Symbolized frames of each traceback (innermost first). Takes the GIL for the
// Python frames, so any thread may call it, but never under a device lock.
std::vector<std::vector<torch::unwind::Frame>> symbolize_contexts(
    const std::vector<torch::CapturedTraceback*>& tracebacks) {
  std::vector<std::vector<torch::unwind::Frame>> out(tracebacks.size());
  if (tracebacks.empty() || !Py_IsInitialized()) {
    return out;
  }
  torch::SymbolizedTracebacks symbolized;
  {
    const PyGILState_STATE gil = PyGILState_Ensure();
    try {
      symbolized = torch::symbolize(tracebacks);
    } catch (...) {
      PyGILState_Release(gil);
      throw;
    }
    PyGILState_Release(gil);
  }
  for (size_t i = 0; i < tracebacks.size(); ++i) {
    for (uint64_t frame : symbolized.tracebacks.at(i)) {
      out[i].push_back(symbolized.all_frames.at(frame));
    }
  }
  return out;
}

torch::CapturedTraceback* traceback_of(const Context& context) {
  return context ? torch::getCapturedTracebackFromContext(context) : nullptr;
}

// Directories whose frames are library code (torch's, torchneuron's), set by
// record_memory_history; an allocation's call site is its innermost Python
// frame outside them.
std::mutex g_library_dirs_mutex;
std::vector<std::string> g_library_dirs;

bool is_python_frame(const torch::unwind::Frame& f) {
  const std::string& name = f.filename;
  return name.size() > 3 && name.compare(name.size() - 3, 3, ".py") == 0;
}

std::string call_site(const std::vector<torch::unwind::Frame>& frames,
                      const std::vector<std::string>& library_dirs) {
  const torch::unwind::Frame* innermost_python = nullptr;
  for (const auto& f : frames) {
    if (!is_python_frame(f)) {
      continue;
    }
    if (innermost_python == nullptr) {
      innermost_python = &f;
    }
    const bool library = std::any_of(library_dirs.begin(), library_dirs.end(),
        [&](const std::string& dir) { return f.filename.rfind(dir, 0) == 0; });
    if (!library) {
      innermost_python = &f;
      break;
    }
  }
  if (innermost_python == nullptr) {
    return "(no Python frame)";
  }
  return innermost_python->filename + ":" + std::to_string(innermost_python->lineno) +
      " in " + innermost_python->funcname;
}

constexpr size_t kOomLargestListed = 5;
constexpr size_t kOomSitesListed = 5;

std::string oom_message(const OomReport& report, c10::DeviceIndex device) {
  std::string msg = report.head + ".\n";
  const std::string where = "neuron:" + std::to_string(device);
  if (report.live_blocks == 0) {
    msg += "No live tensors on " + where + ".\n";
  } else {
    msg += "Live blocks on " + where + ": " + std::to_string(report.live_blocks) + " using " +
        format_bytes(report.live_bytes) + "; largest: ";
    for (size_t i = 0; i < std::min(kOomLargestListed, report.largest.size()); ++i) {
      msg += (i ? ", " : "") + format_bytes(report.largest[i].first);
    }
    msg += ".\n";
  }
  if (report.history_on && !report.largest.empty()) {
    std::vector<torch::CapturedTraceback*> tracebacks;
    for (const auto& block : report.largest) {
      if (block.second) {
        tracebacks.push_back(traceback_of(block.second));
      }
    }
    std::vector<std::vector<torch::unwind::Frame>> frames;
    try {
      frames = symbolize_contexts(tracebacks);
    } catch (const std::exception&) {
      frames.assign(tracebacks.size(), {});  // the OOM is reported even if symbols fail
    }
    std::vector<std::string> library_dirs;
    {
      std::lock_guard<std::mutex> lock(g_library_dirs_mutex);
      library_dirs = g_library_dirs;
    }
    // (bytes, blocks) per call site; blocks allocated while recording was off
    // share one line.
    std::map<std::string, std::pair<size_t, size_t>> sites;
    size_t next = 0;
    for (const auto& block : report.largest) {
      std::string site = block.second
          ? call_site(frames.at(next++), library_dirs)
          : std::string("(allocated before _record_memory_history)");
      auto& total = sites[site];
      total.first += block.first;
      total.second += 1;
    }
    std::vector<std::pair<std::string, std::pair<size_t, size_t>>> ranked(sites.begin(),
                                                                          sites.end());
    std::stable_sort(ranked.begin(), ranked.end(), [](const auto& a, const auto& b) {
      return a.second.first > b.second.first;
    });
    msg += "Live memory by Python call site (most bytes first";
    if (report.largest.size() < report.live_blocks) {
      msg += ", of the " + std::to_string(report.largest.size()) + " largest blocks";
    }
    msg += "):\n";
    for (size_t i = 0; i < std::min(kOomSitesListed, ranked.size()); ++i) {
      const auto& [site, total] = ranked[i];
      msg += "  " + format_bytes(total.first) + " in " + std::to_string(total.second) +
          (total.second == 1 ? " block" : " blocks") + " at " + site + "\n";
    }
  } else if (!report.history_on) {
    msg += "Allocation sites are not recorded: call "
           "torch.neuron.memory._record_memory_history() before the allocations to see them "
           "here, and torch.neuron.memory._dump_snapshot(path) to view them with "
           "torch.cuda._memory_viz.\n";
  }
  msg += "Free tensors you no longer need, use a smaller batch, or raise the limit with "
         "torch.neuron.set_per_process_memory_fraction() (the device's HBM is the ceiling; "
         "NEURON_LOGICAL_NC_CONFIG=2 gives larger devices).";
  return msg;
}

// A new segment (block) of `size` bytes for a request of `n`, or nullptr with
// `oom` filled if the device's capacity (or the host) cannot provide it.
// Caller holds s.mutex.
Block* new_segment(c10::DeviceIndex device, DeviceState& s, size_t size, size_t n,
                   const HistoryConfig* h, const Context& context, OomReport& oom) {
  const auto agg = static_cast<size_t>(StatType::AGGREGATE);
  if (s.stats.reserved_bytes[agg].current + size > s.capacity &&
      !s.cached.empty()) {
    s.stats.num_alloc_retries += 1;
    release_cached(s, h, context);
  }
  void* base = nullptr;
  size_t alignment = size >= kSmallLimit ? 4096 : 64;
  bool mapped = false;
  const bool over_capacity = s.stats.reserved_bytes[agg].current + size > s.capacity;
  if (!over_capacity) {
    base = segment_memory(size, alignment, mapped);
  }
  if (over_capacity || base == nullptr) {
    s.stats.num_ooms += 1;
    const size_t reserved = s.stats.reserved_bytes[agg].current;
    record_trace(s, h, kOom, s.capacity - std::min(s.capacity, reserved), n, context);
    oom.head = "Neuron out of memory. Tried to allocate " + format_bytes(n) +
        (over_capacity ? ". "
                       : " on neuron:" + std::to_string(device) +
                    " but the host could not provide the memory backing the device. ") +
        summary_locked(device, s);
    oom.history_on = h != nullptr && h->context != RecordContext::NEVER;
    collect_live_blocks(device, oom);
    return nullptr;
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
  b->mapped = mapped;
  static_cast<Block**>(p)[-1] = b;
  b->segment_context = context;
  record_trace(s, h, kSegmentAlloc, reinterpret_cast<uintptr_t>(p), size,
               h && h->context >= RecordContext::ALLOC ? context : nullptr);
  return b;
}

// Frees a routed allocation given only its data pointer (DataPtr context ==
// data, which raw_allocate() requires).
void free_routed(void* data) {
  free_block(static_cast<Block**>(data)[-1]);
}

// ---- storages without values (dataless execution) ---------------------------

constexpr double kUnknown = std::numeric_limits<double>::quiet_NaN();

// A block allocated under dataless execution (context: the Block).
void free_dataless_block(void* ctx) {
  g_storages_without_values.fetch_sub(1, std::memory_order_relaxed);
  free_block(ctx);
}

// A storage that held values until dataless execution wrote it: what it held.
struct Overwritten {
  c10::DataPtr original;
  double known_value = kUnknown;
};

void free_overwritten(void* ctx) {
  g_storages_without_values.fetch_sub(1, std::memory_order_relaxed);
  delete static_cast<Overwritten*>(ctx);
}

}  // namespace

std::atomic<int64_t> g_storages_without_values{0};

bool holds_values(const c10::StorageImpl& storage) {
  const auto deleter = storage.data_ptr().get_deleter();
  return deleter != &free_dataless_block && deleter != &free_overwritten;
}

double* known_value(c10::StorageImpl& storage) {
  const c10::DataPtr& data = storage.data_ptr();
  if (data.get_deleter() == &free_dataless_block) {
    return &static_cast<Block*>(data.get_context())->known_value;
  }
  if (data.get_deleter() == &free_overwritten) {
    return &static_cast<Overwritten*>(data.get_context())->known_value;
  }
  return nullptr;
}

void mark_without_values(c10::StorageImpl& storage) {
  if (double* value = known_value(storage)) {
    *value = kUnknown;
    return;
  }
  if (storage.data_ptr().get() == nullptr) {
    return;  // no bytes: nothing to hold
  }
  void* data = storage.mutable_data_ptr().get();
  const c10::Device device = storage.data_ptr().device();
  auto* overwritten = new Overwritten();
  overwritten->original =
      storage.set_data_ptr(c10::DataPtr(data, overwritten, &free_overwritten, device));
  g_storages_without_values.fetch_add(1, std::memory_order_relaxed);
}

c10::DataPtr allocate_on(c10::DeviceIndex device, size_t n) {
  c10::Device dev(kNeuron, device);
  if (n == 0) {
    check_device_index(device);
    return c10::DataPtr(nullptr, nullptr, &free_block, dev);
  }
  check_not_in_bad_fork();
  DeviceState& s = state(device);
  size_t size = round_size(n);
  const HistoryConfig* h = g_history.load(std::memory_order_acquire);
  const Context context = h ? gather_context(h, RecordContext::STATE) : nullptr;
  Block* b;
  size_t allocated, reserved;
  OomReport oom;
  {
    std::lock_guard<std::mutex> lock(s.mutex);
    b = take_cached(s, size);
    if (b == nullptr) {
      b = new_segment(device, s, size, n, h, context, oom);
    }
    if (b != nullptr) {
      if (t_routing_now && t_routed_depth > 0 && t_routed_depth <= kMaxRoutedCalls) {
        RoutedCall& call = t_routed_calls[t_routed_depth - 1];
        if (!call.marked) {  // the peaks before the kernel's first allocation
          call.marked = true;
          call.device = device;
          call.frees = t_frees;
          for_peak_stats(s.stats, [&](size_t k, size_t pool, const auto& stat) {
            call.peaks[k][pool] = stat.peak;
          });
        }
      }
      b->requested = n;
      b->live = true;
      for_pools(b->small, [&](size_t i) {
        s.stats.allocation[i].increase(1);
        s.stats.allocated_bytes[i].increase(size);
        s.stats.active[i].increase(1);
        s.stats.active_bytes[i].increase(size);
        s.stats.requested_bytes[i].increase(n);
      });
      if (h != nullptr) {
        b->context = context;
        record_trace(s, h, kAlloc, reinterpret_cast<uintptr_t>(b->ptr), n,
                     h->context >= RecordContext::ALLOC ? context : nullptr);
      }
      const auto agg = static_cast<size_t>(StatType::AGGREGATE);
      allocated = s.stats.allocated_bytes[agg].current;
      reserved = s.stats.reserved_bytes[agg].current;
    }
  }
  // The message is built outside the lock: naming call sites takes the GIL.
  TORCH_CHECK_WITH(OutOfMemoryError, b != nullptr, oom_message(oom, device));
  c10::reportMemoryUsageToProfiler(b->ptr, static_cast<int64_t>(size), allocated, reserved, dev);
  if (recording_events()) {  // the trace's memory counter (events.cpp)
    record_memory_event(device, allocated);
  }
  if (dataless_active()) {
    b->known_value = kUnknown;
    g_storages_without_values.fetch_add(1, std::memory_order_relaxed);
    return c10::DataPtr(b->ptr, b, &free_dataless_block, dev);
  }
  return c10::DataPtr(b->ptr, b, &free_block, dev);
}

bool is_neuron_data_ptr(const c10::DataPtr& ptr) {
  const auto deleter = ptr.get_deleter();
  if (deleter == &free_overwritten) {
    return is_neuron_data_ptr(static_cast<const Overwritten*>(ptr.get_context())->original);
  }
  return deleter == &free_block || deleter == &free_routed || deleter == &free_dataless_block;
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

size_t allocated_bytes(c10::DeviceIndex device) {
  DeviceState& s = state(device);
  std::lock_guard<std::mutex> lock(s.mutex);
  return s.stats.allocated_bytes[static_cast<size_t>(StatType::AGGREGATE)].current;
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

// ---- memory history: the settings and the snapshot --------------------------

void record_memory_history(const std::optional<std::string>& enabled,
                           const std::optional<std::string>& context, const std::string& stacks,
                           size_t max_entries, bool clear_history,
                           const std::vector<std::string>& skip_actions,
                           const std::vector<std::string>& library_dirs) {
  TORCH_CHECK(!enabled || *enabled == "state" || *enabled == "all",
              "expected enabled to be 'state', 'all', or None, got '", *enabled, "'");
  TORCH_CHECK(!context || *context == "state" || *context == "alloc" || *context == "all",
              "expected context to be 'state', 'alloc', 'all', or None, got '", *context, "'");
  TORCH_CHECK(stacks == "python" || stacks == "all",
              "expected stacks to be 'python' or 'all', got '", stacks, "'");
  const HistoryConfig* config = nullptr;
  if (enabled) {
    auto* c = new HistoryConfig();
    c->trace = *enabled == "all";
    c->context = !context ? RecordContext::NEVER
        : *context == "state" ? RecordContext::STATE
        : *context == "alloc" ? RecordContext::ALLOC
                              : RecordContext::ALL;
    c->cpp = stacks == "all";
    c->max_entries = std::max<size_t>(1, max_entries);
    for (const auto& name : skip_actions) {
      auto it = std::find(kActionNames.begin(), kActionNames.end(), name);
      TORCH_CHECK(it != kActionNames.end(), "skip_actions: unknown action '", name,
                  "'; valid actions are alloc, free_requested, free_completed, segment_alloc, "
                  "segment_free, oom, snapshot");
      c->skip |= 1u << (it - kActionNames.begin());
    }
    if (c->cpp && c->context != RecordContext::NEVER) {
      torch::unwind::unwind();  // warm up C++ stack unwinding, as CUDA does
    }
    config = c;
  }
  {
    std::lock_guard<std::mutex> lock(g_library_dirs_mutex);
    g_library_dirs = library_dirs;
  }
  g_history.store(config, std::memory_order_release);
  // Turning history off drops the events, as CUDA does; a smaller max_entries
  // keeps the newest ones.
  for (auto& s : g_devices) {
    std::lock_guard<std::mutex> lock(s.mutex);
    if (s.trace == nullptr) {
      continue;
    }
    if (config == nullptr || clear_history) {
      s.trace->clear();
      s.trace_next = 0;
    } else if (s.trace->size() > config->max_entries) {
      std::vector<TraceEntry> kept = trace_in_order(s);
      kept.erase(kept.begin(), kept.end() - static_cast<ptrdiff_t>(config->max_entries));
      *s.trace = std::move(kept);
      s.trace_next = 0;
    } else if (s.trace->size() < config->max_entries && s.trace_next != 0) {
      *s.trace = trace_in_order(s);  // room to grow again: append at the end
      s.trace_next = 0;
    }
  }
}

namespace {

c10::Dict<c10::IValue, c10::IValue> new_dict() {
  return c10::Dict<c10::IValue, c10::IValue>(c10::AnyType::get(), c10::AnyType::get());
}

c10::List<c10::IValue> new_list() {
  return c10::List<c10::IValue>(c10::AnyType::get());
}

// One segment (a block and its memory) as memory_snapshot reports it.
struct SegmentView {
  c10::DeviceIndex device;
  uintptr_t address;
  size_t size;
  size_t requested;
  bool live;
  bool small;
  Context context;
  Context segment_context;
};

}  // namespace

c10::IValue memory_snapshot(bool include_traces) {
  std::vector<SegmentView> segments;
  std::vector<std::vector<TraceEntry>> traces(static_cast<size_t>(device_count()));
  for (c10::DeviceIndex d = 0; d < device_count(); ++d) {
    DeviceState& s = g_devices[d];
    std::lock_guard<std::mutex> lock(s.mutex);
    size_t active = 0;
    {
      std::lock_guard<std::mutex> seg_lock(g_segments_mutex);
      for (const auto& seg : g_segments) {
        if (seg.second.second != d) {
          continue;
        }
        const Block* b = reinterpret_cast<Block* const*>(seg.first)[-1];
        segments.push_back(SegmentView{d, seg.first, b->size, b->requested, b->live, b->small,
                                       b->context, b->segment_context});
        active += b->live ? b->size : 0;
      }
    }
    // As CUDA, the snapshot is an event of each device in use (its total active bytes).
    const bool in_use = (s.trace != nullptr && !s.trace->empty()) ||
        (!segments.empty() && segments.back().device == d);
    if (in_use) {
      record_trace(s, g_history.load(std::memory_order_acquire), kSnapshot, 0, active, nullptr);
    }
    if (include_traces) {
      traces[d] = trace_in_order(s);
    }
  }
  // Symbolize every stack in one batch (frames shared between stacks are
  // looked up once), after the device locks are released.
  std::vector<torch::CapturedTraceback*> tracebacks;
  auto want = [&](const Context& c) {
    if (c) {
      tracebacks.push_back(traceback_of(c));
    }
  };
  for (const auto& seg : segments) {
    want(seg.segment_context);
    want(seg.live ? seg.context : nullptr);
  }
  for (const auto& trace : traces) {
    for (const auto& e : trace) {
      want(e.context);
    }
  }
  const auto symbolized = symbolize_contexts(tracebacks);
  size_t next = 0;
  auto frames_of = [&](const Context& c) {
    auto list = new_list();
    if (c) {
      for (const auto& f : symbolized.at(next)) {
        auto frame = new_dict();
        frame.insert("filename", f.filename);
        frame.insert("name", f.funcname);
        frame.insert("line", static_cast<int64_t>(f.lineno));
        list.push_back(frame);
      }
      ++next;
    }
    return list;
  };

  auto segment_list = new_list();
  for (const auto& seg : segments) {
    auto segment = new_dict();
    const auto address = static_cast<int64_t>(seg.address);
    const auto size = static_cast<int64_t>(seg.size);
    const auto live_size = seg.live ? size : int64_t(0);
    const auto requested = seg.live ? static_cast<int64_t>(seg.requested) : int64_t(0);
    segment.insert("device", static_cast<int64_t>(seg.device));
    segment.insert("address", address);
    segment.insert("total_size", size);
    segment.insert("allocated_size", live_size);
    segment.insert("active_size", live_size);
    segment.insert("requested_size", requested);
    segment.insert("stream", int64_t(0));  // the allocator is not stream-ordered
    segment.insert("segment_type", seg.small ? "small" : "large");
    segment.insert("segment_pool_id", c10::ivalue::Tuple::create(int64_t(0), int64_t(0)));
    segment.insert("is_expandable", false);
    segment.insert("frames", frames_of(seg.segment_context));
    auto block = new_dict();
    block.insert("address", address);
    block.insert("size", size);
    block.insert("requested_size", requested);
    block.insert("state", seg.live ? "active_allocated" : "inactive");
    block.insert("frames", frames_of(seg.live ? seg.context : nullptr));
    auto blocks = new_list();
    blocks.push_back(block);
    segment.insert("blocks", blocks);
    segment_list.push_back(segment);
  }
  auto trace_list = new_list();
  for (const auto& trace : traces) {
    auto device_trace = new_list();
    for (const auto& e : trace) {
      auto entry = new_dict();
      entry.insert("action", kActionNames[e.action]);
      entry.insert(e.action == kOom ? "device_free" : "addr", static_cast<int64_t>(e.addr));
      entry.insert("size", static_cast<int64_t>(e.size));
      entry.insert("stream", int64_t(0));
      entry.insert("time_us", e.time_us);
      entry.insert("frames", frames_of(e.context));
      device_trace.push_back(entry);
    }
    trace_list.push_back(device_trace);
  }
  auto result = new_dict();
  result.insert("segments", segment_list);
  result.insert("device_traces", trace_list);
  return result;
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
    const HistoryConfig* h = g_history.load(std::memory_order_acquire);
    const Context context = h ? gather_context(h, RecordContext::ALL) : nullptr;
    for (auto& s : g_devices) {
      std::lock_guard<std::mutex> lock(s.mutex);
      release_cached(s, h, context);
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
    t_routing_now = true;
    c10::DataPtr ptr;
    try {
      ptr = allocate_on(t_routed_device, n);
    } catch (...) {
      t_routing_now = false;
      throw;
    }
    t_routing_now = false;
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
  if (t_routed_depth < kMaxRoutedCalls) {
    t_routed_calls[t_routed_depth].marked = false;
  }
  ++t_routed_depth;
}

RouteAllocations::~RouteAllocations() {
  --t_routed_depth;
  if (t_routed_depth < kMaxRoutedCalls) {
    const RoutedCall& call = t_routed_calls[t_routed_depth];
    if (call.marked && call.frees != t_frees) {  // scratch memory came and went
      DeviceState& s = g_devices[call.device];
      std::lock_guard<std::mutex> lock(s.mutex);
      for_peak_stats(s.stats, [&](size_t k, size_t pool, auto& stat) {
        stat.peak = std::max(call.peaks[k][pool], stat.current);
      });
    }
  }
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
