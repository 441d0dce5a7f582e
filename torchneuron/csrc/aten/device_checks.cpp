// CUDA's device check for the ops whose CUDA kernel has one. Checked against torch 2.13.0.
//
// PyTorch's code generator puts a check in front of each CUDA kernel whose op does not
// say `device_check: NoCheck` in native_functions.yaml: the out= arguments, then the
// positional tensor arguments (lists included), must all be on the device of the first
// defined one. A CPU 0-dim tensor is no exception: `x.index_select(0, torch.tensor(1))`
// and `torch.clamp(x, min=torch.tensor(0.))` fail on CUDA. The ops marked NoCheck leave
// devices to their kernels, which accept CPU scalars (TensorIterator) and CPU indices
// (`index`, `index_put_`); the fallback's per-argument rule (fallback.cpp) covers those.
// The op list is generated from torch's own native_functions.yaml
// (scripts/gen_cuda_device_checks.py).
#include "../core.h"

#include <ATen/core/function_schema.h>

#include <iterator>
#include <optional>
#include <string>
#include <unordered_set>

namespace torchneuron {
namespace {

const std::unordered_set<std::string>& checked_ops() {
  static const auto& names = *new std::unordered_set<std::string>{
#include "cuda_device_checks.inc"
  };
  return names;
}

struct CommonDevice {
  std::optional<c10::Device> device;
  const c10::FunctionSchema& schema;

  void check(const at::Tensor& t, const c10::Argument& arg) {
    if (!t.defined()) {
      return;
    }
    if (!device) {
      device = t.device();
      return;
    }
    if (C10_UNLIKELY(*device != t.device())) {
      const c10::Device target = device->is_cpu() ? t.device() : *device;
      TORCH_CHECK(false,
                  "Expected all tensors to be on the same device, but got ", arg.name(), " is on ",
                  t.device(), ", different from other tensors on ", *device,
                  " (when checking argument in method ", schema.operator_name(),
                  "). This op takes no CPU tensor, not even a 0-dim one, as on CUDA: move it with "
                  ".to(\"", target, "\") first.");
    }
  }

  void check(const c10::IValue& v, const c10::Argument& arg) {
    if (v.isTensor()) {
      check(v.toTensor(), arg);
    } else if (v.isTensorList()) {
      for (const at::Tensor& t : v.toTensorList()) {
        check(t, arg);
      }
    } else if (v.isList()) {  // Tensor?[]
      for (const c10::IValue& e : v.toListRef()) {
        if (e.isTensor()) {
          check(e.toTensor(), arg);
        }
      }
    }
  }
};

// NoCheck ops whose CUDA kernel still wants one argument on self's device, CPU scalar
// or not: index_fill_ builds a TensorIterator over self and the (restrided) index, which
// accepts no CPU operand there (ATen's own index_fill_ raises this on a neuron self with
// a CPU index); masked_fill_'s CUDA kernel checks the mask. Their value argument may
// still be a CPU 0-dim tensor (it is read with .item()).
struct SameAsSelf {
  const char* op;
  const char* arg;
  bool tensor_iterator;  // TensorIterator's message; otherwise masked_fill_'s own
};
constexpr SameAsSelf kSameAsSelf[] = {
    {"index_fill_.int_Scalar", "index", true},
    {"index_fill_.int_Tensor", "index", true},
    {"masked_fill_.Scalar", "mask", false},
    {"masked_fill_.Tensor", "mask", false},
};

std::string overload_key(const c10::FunctionSchema& schema) {
  const auto& name = schema.operator_name();
  if (name.name.rfind("aten::", 0) != 0) {
    return {};
  }
  std::string key = name.name.substr(6);
  if (!name.overload_name.empty()) {
    key += "." + name.overload_name;
  }
  return key;
}

void check_same_as_self(const c10::FunctionSchema& schema, c10::ArrayRef<c10::IValue> args,
                        const SameAsSelf& rule) {
  const auto self_index = schema.argumentIndexWithName("self");
  const auto arg_index = schema.argumentIndexWithName(rule.arg);
  if (!self_index || !arg_index || *self_index >= args.size() || *arg_index >= args.size() ||
      !args[*self_index].isTensor() || !args[*arg_index].isTensor()) {
    return;
  }
  const at::Tensor& self = args[*self_index].toTensor();
  const at::Tensor& other = args[*arg_index].toTensor();
  if (!self.defined() || !other.defined() || self.device() == other.device()) {
    return;
  }
  if (rule.tensor_iterator) {
    device_mismatch(self.device(), other.device());
  }
  TORCH_CHECK(false, "expected self and ", rule.arg, " to be on the same device, but got ",
              rule.arg, " on ", other.device(), " and self on ", self.device(),
              ". Move the ", rule.arg, " with .to(", self.device(), ") first, as CUDA requires.");
}

}  // namespace

uint8_t cuda_device_check(const c10::FunctionSchema& schema) {
  const std::string key = overload_key(schema);
  if (key.empty()) {
    return 0;
  }
  for (size_t i = 0; i < std::size(kSameAsSelf); ++i) {
    if (key == kSameAsSelf[i].op) {
      return static_cast<uint8_t>(2 + i);
    }
  }
  return checked_ops().count(key) > 0 ? 1 : 0;
}

void check_devices_as_cuda(const c10::FunctionSchema& schema, uint8_t check,
                           c10::ArrayRef<c10::IValue> args) {
  if (check >= 2) {
    check_same_as_self(schema, args, kSameAsSelf[check - 2]);
    return;
  }
  const auto& formals = schema.arguments();
  CommonDevice common{std::nullopt, schema};
  for (size_t i = 0; i < formals.size() && i < args.size(); ++i) {  // out= first, as CUDA
    if (formals[i].is_out()) {
      common.check(args[i], formals[i]);
    }
  }
  for (size_t i = 0; i < formals.size() && i < args.size(); ++i) {
    if (!formals[i].kwarg_only()) {
      common.check(args[i], formals[i]);
    }
  }
}

}  // namespace torchneuron
