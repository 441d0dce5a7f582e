// Implements at::PrivateUse1HooksInterface for "neuron": availability,
// generators, pinned host memory and device-from-pointer.
// Checked against torch 2.13.0.
#include "../core.h"

#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <c10/core/StorageImpl.h>

#include <cstring>

namespace torchneuron {
namespace {

bool g_initialized = false;

struct NeuronHooks final : public at::PrivateUse1HooksInterface {
  bool isBuilt() const override {
    return true;
  }

  // Derived from the same count the guard reports.
  bool isAvailable() const override {
    return device_count() > 0;
  }

  void init() const override {
    g_initialized = true;
  }

  const at::Generator& getDefaultGenerator(c10::DeviceIndex device_index)
      const override {
    return default_generator(device_index);
  }

  at::Generator getNewGenerator(c10::DeviceIndex device_index) const override {
    return new_generator(device_index);
  }

  at::Device getDeviceFromPtr(void* data) const override {
    auto index = device_of_pointer(data);
    TORCH_CHECK(
        index >= 0, "The pointer ", data,
        " does not point into memory owned by a neuron device.");
    return at::Device(kNeuron, index);
  }

  bool isPinnedPtr(const void* data) const override {
    return is_pinned(data);
  }

  at::Allocator* getPinnedMemoryAllocator() const override {
    return pinned_allocator();
  }

  bool hasPrimaryContext(c10::DeviceIndex device_index) const override {
    return g_initialized;
  }

  c10::DeviceIndex deviceCount() const override {
    return device_count();
  }

  void setCurrentDevice(c10::DeviceIndex device) const override {
    set_current_device(device);
  }

  c10::DeviceIndex getCurrentDevice() const override {
    return current_device();
  }

  c10::DeviceIndex exchangeDevice(c10::DeviceIndex device) const override {
    auto old = current_device();
    set_current_device(device);
    return old;
  }

  c10::DeviceIndex maybeExchangeDevice(c10::DeviceIndex device) const override {
    return exchangeDevice(device);
  }

  // Backs UntypedStorage.resize_() on neuron: new device memory, old bytes
  // copied, the rest left uninitialised (as on CUDA). Dataless execution copies
  // nothing: the storage then holds no values.
  void resizePrivateUse1Bytes(const c10::Storage& storage, size_t newsize)
      const override {
    auto* impl = storage.unsafeGetStorageImpl();
    TORCH_CHECK(impl->resizable(), "Trying to resize storage that is not resizable");
    auto device = impl->device().index();
    c10::DataPtr fresh = allocate_on(device, newsize);  // without values under dataless execution
    size_t keep = std::min(newsize, impl->nbytes());
    const bool kept_values = holds_values(*impl);
    if (keep > 0 && kept_values && !dataless_active()) {
      std::memcpy(fresh.get(), impl->data(), keep);
    }
    impl->set_data_ptr_noswap(std::move(fresh));
    impl->set_nbytes(newsize);
    if (keep > 0 && !kept_values) {
      mark_without_values(*impl);  // the kept bytes were never values
    }
  }
};

NeuronHooks g_hooks;

// ==== Global Registration ====
struct RegisterHooks {
  RegisterHooks() {
    at::RegisterPrivateUse1HooksInterface(&g_hooks);
  }
};
RegisterHooks g_register_hooks;

}  // namespace
}  // namespace torchneuron
