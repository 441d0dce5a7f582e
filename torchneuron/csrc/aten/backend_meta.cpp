// Backend metadata of neuron tensors: there is none, and saying so.
// Checked against torch 2.13.0.
//
// A PrivateUse1 backend may keep metadata on its tensors (a BackendMeta on the
// TensorImpl) and register functions that torch.save / torch.load and
// torch._utils.get/set_tensor_metadata call to read and restore it. Trainium's
// tensors carry none, so neuron keeps none; without a registration PyTorch
// would silently drop metadata set on a neuron tensor. The registration here
// reports nothing when read and refuses to store anything but PyTorch's own
// conj/neg bits (which PyTorch handles before calling it). The TensorImpl's
// BackendMeta slot itself holds the tensor's reusable CPU alias
// (alias_cache.cpp): internal, never serialized, not copied by detach.
#include "../core.h"

#include <torch/csrc/jit/serialization/pickler_helper.h>

#include <sstream>

namespace torchneuron {
namespace {

void get_backend_meta(const at::Tensor&, std::unordered_map<std::string, bool>&) {}

void set_backend_meta(const at::Tensor& t, std::unordered_map<std::string, bool>& metadata) {
  if (metadata.empty()) {
    return;
  }
  std::ostringstream keys;
  for (const auto& [key, value] : metadata) {
    keys << (keys.tellp() > 0 ? ", " : "") << "'" << key << "'";
  }
  TORCH_CHECK(false, "neuron tensors keep no backend metadata (Trainium tensors have none), so ",
              "metadata {", keys.str(), "} cannot be stored on a ", t.device(), " tensor. ",
              "Keep such metadata beside the tensor (e.g. in a dict saved with it).");
}

const bool registered = [] {
  torch::jit::TensorBackendMetaRegistry(kNeuron, &get_backend_meta, &set_backend_meta);
  return true;
}();

}  // namespace
}  // namespace torchneuron
