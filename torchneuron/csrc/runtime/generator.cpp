// Random number generators for PrivateUse1 ("neuron"), served to PyTorch by
// the hooks (hooks.cpp). Checked against torch 2.13.0.
//
// Neuron ops run CPU kernels, and CPU kernels only accept CPU generators. A
// neuron generator therefore owns a CPU generator (torch's mt19937 engine)
// and hands it to kernels: seeding a neuron device with s gives the same
// random stream as seeding the CPU with s.
#include "../core.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/GeneratorForPrivateuseone.h>

#include <array>
#include <mutex>

namespace torchneuron {
namespace {

struct NeuronGeneratorImpl final : public c10::GeneratorImpl {
  explicit NeuronGeneratorImpl(c10::DeviceIndex device, at::Generator cpu)
      : c10::GeneratorImpl(
            c10::Device(kNeuron, device),
            c10::DispatchKeySet(c10::DispatchKey::PrivateUse1)),
        cpu_(std::move(cpu)) {}

  void set_current_seed(uint64_t seed) override {
    std::lock_guard<std::mutex> lock(cpu_.mutex());
    cpu_.set_current_seed(seed);
  }
  void set_offset(uint64_t offset) override {
    std::lock_guard<std::mutex> lock(cpu_.mutex());
    cpu_.set_offset(offset);
  }
  uint64_t get_offset() const override {
    return cpu_.get_offset();
  }
  uint64_t current_seed() const override {
    return cpu_.current_seed();
  }
  uint64_t seed() override {
    std::lock_guard<std::mutex> lock(cpu_.mutex());
    return cpu_.seed();
  }
  void set_state(const c10::TensorImpl& new_state) override {
    std::lock_guard<std::mutex> lock(cpu_.mutex());
    cpu_.unsafeGetGeneratorImpl()->set_state(new_state);
  }
  c10::intrusive_ptr<c10::TensorImpl> get_state() const override {
    std::lock_guard<std::mutex> lock(cpu_.mutex());
    return cpu_.unsafeGetGeneratorImpl()->get_state();
  }
  NeuronGeneratorImpl* clone_impl() const override {
    std::lock_guard<std::mutex> lock(cpu_.mutex());
    return new NeuronGeneratorImpl(device_.index(), cpu_.clone());
  }

  mutable at::Generator cpu_;
};

std::once_flag g_default_once[kMaxDevices];
std::array<at::Generator, kMaxDevices> g_defaults;

}  // namespace

const at::Generator& default_generator(c10::DeviceIndex device) {
  if (device == -1) {
    device = current_device();
  }
  check_device_index(device);
  std::call_once(g_default_once[device], [device] {
    g_defaults[device] = at::make_generator<NeuronGeneratorImpl>(
        device, at::make_generator<at::CPUGeneratorImpl>(c10::default_rng_seed_val));
  });
  return g_defaults[device];
}

at::Generator new_generator(c10::DeviceIndex device) {
  if (device == -1) {
    device = current_device();
  }
  check_device_index(device);
  return at::make_generator<NeuronGeneratorImpl>(
      device, at::make_generator<at::CPUGeneratorImpl>(c10::default_rng_seed_val));
}

at::Generator cpu_view_of(const at::Generator& generator) {
  auto* impl = dynamic_cast<NeuronGeneratorImpl*>(generator.unsafeGetGeneratorImpl());
  TORCH_CHECK(
      impl != nullptr,
      "Expected a neuron generator but got a generator on ", generator.device(),
      "; create it with torch.Generator(device='neuron').");
  return impl->cpu_;
}

}  // namespace torchneuron
