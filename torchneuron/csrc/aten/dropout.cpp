// Dropout on the neuron generator, with CPU's results.
// Checked against torch 2.13.0.
//
// `aten::native_dropout` has no Generator argument: its CPU kernel draws the
// mask from CPU's default generator, so run by the fallback it would ignore
// torch.neuron.manual_seed, get/set_rng_state and fork_rng, and unrelated CPU
// randomness (a DataLoader shuffle) would change the masks. This kernel runs
// CPU's algorithm with the mask drawn from the device's default generator:
// the same seed gives CPU's mask and values, bit for bit.
//
// `aten::dropout` is a composite that takes the fused native_dropout path on
// every accelerator (is_fused_kernel_acceptable) and CPU's own formula on CPU.
// The two round the scale differently (input * mask * (1/(1-p)) against
// input * (mask / (1-p))), visibly so in bfloat16. Neuron results equal
// CPU's, so neuron's `dropout` runs CPU's formula, from differentiable ops
// (bernoulli_ with no generator draws from the neuron generator).
#include "../core.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

namespace torchneuron {
namespace {

using at::Tensor;

std::tuple<Tensor, Tensor> native_dropout(const Tensor& input, double p, std::optional<bool> train) {
  static const auto op = c10::Dispatcher::singleton().findSchemaOrThrow("aten::native_dropout", "");
  if (C10_UNLIKELY(dataless_active())) {
    return call_dataless<std::tuple<Tensor, Tensor>(const Tensor&, double, std::optional<bool>)>(
        op, input, p, train);
  }
  const c10::DeviceIndex device = input.device().index();
  const std::array<c10::IValue, 3> args{input, p, train};
  OpRecord& record = account_kernel(op, args);
  RouteAllocations route(device);
  const Tensor cpu = cpu_alias(input);
  Tensor output;
  Tensor mask;
  const auto bool_options = cpu.options().dtype(at::kBool);
  if (cpu.numel() == 0) {  // CPU returns the input itself; a fresh empty tensor is equivalent
    output = at::empty_like(cpu);
    mask = at::empty_like(cpu);
  } else if (!train.has_value() || *train) {
    const double p1m = 1. - p;
    const double scale = p1m == 0 ? 0. : 1. / p1m;
    mask = at::empty_like(cpu, bool_options);
    mask.bernoulli_(p1m, cpu_view_of(default_generator(device)));
    output = cpu.mul(mask).mul_(scale);
  } else {
    mask = at::ones_like(cpu, bool_options);
    output = cpu.clone();
  }
  std::tuple<Tensor, Tensor> result{adopt_cpu_result(output, device), adopt_cpu_result(mask, device)};
  charge_op(op, record, device, args,
            {c10::IValue(std::get<0>(result)), c10::IValue(std::get<1>(result))});
  return result;
}

Tensor dropout(const Tensor& input, double p, bool train) {
  TORCH_CHECK(p >= 0 && p <= 1, "dropout probability has to be between 0 and 1, but got ", p);
  if (p == 0 || !train || input.sym_numel() == 0) {
    return input;
  }
  if (p == 1) {
    return input.mul(at::zeros({}, input.options()));
  }
  // Preserving the input's strides, as CPU's _dropout_impl does: bernoulli_ fills the
  // noise in memory order, so a transposed input (attention outputs) gets CPU's mask.
  Tensor noise = at::empty_like(input);
  noise.bernoulli_(1 - p);
  noise.div_(1 - p);
  return input.mul(noise);
}

}  // namespace

// ==== Global Registration ====
TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("native_dropout", native_dropout);
}

TORCH_LIBRARY_IMPL(aten, AutogradPrivateUse1, m) {
  m.impl("dropout", dropout);
}

}  // namespace torchneuron
