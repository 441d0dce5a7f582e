// Sync debug mode (torch.neuron.set_sync_debug_mode): before each host
// synchronisation (a read to the host, .item(), a device or stream
// synchronize) the core calls Python's watcher, which warns, raises or notes
// the user's call site. Off, it costs one relaxed atomic load.
// In its own header so that core.h (included by every source) is untouched.
#pragma once

#include <c10/core/Device.h>

#include <cstddef>

namespace torchneuron {

// Kinds of host synchronisation, named to Python by these strings.
inline constexpr const char* kSyncCopyToHost = "copy_to_host";
inline constexpr const char* kSyncItem = "item";
inline constexpr const char* kSyncDevice = "synchronize";
inline constexpr const char* kSyncStream = "stream_synchronize";

// Called before the synchronisation does anything: with a watcher installed it
// runs the watcher, whose exception (sync debug mode "error") propagates to
// the caller with nothing changed.
void check_host_sync(c10::DeviceIndex device, const char* kind, size_t nbytes);

}  // namespace torchneuron
