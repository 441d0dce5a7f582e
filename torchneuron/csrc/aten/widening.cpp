// Ops CUDA runs in dtypes CPU's kernels refuse. Libraries take CUDA's code
// path on every device that is not the CPU (transformers' MoE layers call
// torch.histc on int32 expert ids unless the device is cpu/mps), so neuron
// accepts what CUDA accepts, with CUDA's result dtype, instead of failing in
// the CPU kernel the fallback would run.
//
// Which ops: PyTorch's OpInfo database, each op's CUDA dtypes against its CPU
// dtypes (tests/device/test_cuda_dtypes.py re-derives the list and runs each
// entry). FFT and complex32 entries are left out: real Trainium runs those on
// the host CPU (hardware/support.py), i.e. with CPU's kernels and CPU's errors.
// Ops that exist only on CUDA (_flash_attention_forward, ...) have no CPU
// kernel to widen; neuron takes CPU's paths (overrides.cpp).
//
// How: the op's CPU kernel runs on copies widened to a dtype it accepts where
// that is exact (half/bfloat16 -> float32 with one rounding of the result, as
// CUDA's float accumulation does; bool -> uint8 or int64), then results are
// narrowed to CUDA's result dtype. Integer histc follows CUDA's kernel exactly
// (integer bounds and bin arithmetic), computed with integer ops. The op is
// counted and charged under the caller's dtypes, as the fallback counts ops;
// every other dtype goes to the fallback unchanged.
// Checked against torch 2.13.0.
#include "../core.h"

#include <ATen/Dispatch.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <ATen/native/Resize.h>
#include <torch/library.h>

#include <array>

namespace torchneuron {
namespace {

using at::Tensor;
using c10::IValue;

const c10::DispatchKeySet kCpuKeys(c10::DispatchKey::CPU);
const c10::DispatchKeySet kNeuronKeys(c10::DispatchKey::PrivateUse1);

// One widening: a call whose first tensor argument has a dtype in `from`
// computes in `compute`; results go back to the caller's dtype unless
// `keep_computed` (CUDA's trace of a bool matrix is an int64 sum).
struct Widening {
  std::array<c10::ScalarType, 2> from;
  c10::ScalarType compute;
  bool keep_computed;

  bool widens(c10::ScalarType t) const {
    return t == from[0] || t == from[1];
  }
};

// CPU has no half/bfloat16 kernel; CUDA's accumulates in float and rounds once.
constexpr Widening kHalfAndBFloat16{{at::kHalf, at::kBFloat16}, at::kFloat, false};
// rrelu_with_noise: CPU has bfloat16 but no half.
constexpr Widening kHalf{{at::kHalf, at::kHalf}, at::kFloat, false};
// abs of a bool is the identity, computed as uint8.
constexpr Widening kBoolAsByte{{at::kBool, at::kBool}, at::kByte, false};
// trace of a bool matrix: CUDA sums the diagonal, which promotes to int64.
constexpr Widening kBoolAsLong{{at::kBool, at::kBool}, at::kLong, true};

bool is_optional_generator(const c10::Argument& arg) {
  const auto& type = arg.type();
  return type->kind() == c10::TypeKind::OptionalType &&
      type->castRaw<c10::OptionalType>()->getElementType()->kind() == c10::TypeKind::GeneratorType;
}

// The argument a return writes (out=, in-place), or -1 for a fresh result.
int written_argument(const c10::FunctionSchema& schema, const c10::Argument& ret) {
  const auto* info = ret.alias_info();
  if (info == nullptr || !info->isWrite()) {
    return -1;
  }
  const auto& args = schema.arguments();
  for (size_t i = 0; i < args.size(); ++i) {
    const auto* a = args[i].alias_info();
    if (a != nullptr && a->isWrite() && a->beforeSets() == info->beforeSets()) {
      return static_cast<int>(i);
    }
  }
  return -1;
}

// The dtype of the first defined tensor argument (the op's `self`/`input`).
std::optional<c10::ScalarType> first_dtype(const torch::jit::Stack& stack, size_t begin) {
  for (size_t i = begin; i < stack.size(); ++i) {
    if (stack[i].isTensor() && stack[i].toTensor().defined()) {
      return stack[i].toTensor().scalar_type();
    }
  }
  return std::nullopt;
}

bool holds_tensor(c10::ArrayRef<IValue> list) {
  for (const IValue& e : list) {
    if (e.isTensor()) {
      return true;
    }
  }
  return false;
}

// Whether this call is one to widen: `self` has a refused dtype, every
// written argument has the same dtype (so each has a widened stand-in), and
// all tensors are on one neuron device (CPU 0-dim tensors allowed, as the
// fallback allows them). Anything else is the fallback's, errors included.
bool takes_widened_path(const Widening& w, const c10::FunctionSchema& schema,
                        const torch::jit::Stack& stack, size_t begin, c10::DeviceIndex& device) {
  const auto dtype = first_dtype(stack, begin);
  if (!dtype || !w.widens(*dtype)) {
    return false;
  }
  const auto& args = schema.arguments();
  device = -1;
  for (size_t i = 0; i < args.size(); ++i) {
    const IValue& v = stack[begin + i];
    if (!v.isTensor()) {
      if (v.isTensorList() || (v.isList() && holds_tensor(v.toListRef()))) {
        return false;  // no widened op takes tensor lists
      }
      continue;
    }
    const Tensor& t = v.toTensor();
    if (!t.defined()) {
      continue;
    }
    const bool written = args[i].alias_info() && args[i].alias_info()->isWrite();
    if (written && t.scalar_type() != *dtype) {
      return false;
    }
    if (t.device().type() == kNeuron) {
      if (device != -1 && device != t.device().index()) {
        return false;
      }
      device = t.device().index();
    } else if (!(t.device().is_cpu() && t.dim() == 0 && !written)) {
      return false;
    }
  }
  return device != -1;
}

// A widened result back in the caller's dtype: rounded once, stochastically
// when NEURON_RT_STOCHASTIC_ROUNDING_EN asks for BF16 results so.
Tensor narrow(OpNumerics& numerics, const Tensor& t, c10::ScalarType dtype) {
  if (t.scalar_type() == dtype) {
    return t;
  }
  if (dtype == at::kBFloat16 && numerics.mode == OpNumerics::Mode::kStochastic) {
    return numerics_result(numerics, t);
  }
  return t.to(dtype);
}

// Copies a stand-in's values (and size, if the kernel resized it) into the
// caller's neuron tensor.
void write_into(const Tensor& neuron, const Tensor& values) {
  if (neuron.sizes() != values.sizes()) {
    at::native::resize_output(neuron, values.sizes());
  }
  cpu_alias(neuron).copy_(values);
}

void run_widened(const Widening& w, const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const auto& schema = op.schema();
  const auto& args = schema.arguments();
  const size_t begin = stack->size() - args.size();
  c10::DeviceIndex device = -1;
  if (!takes_widened_path(w, schema, *stack, begin, device)) {
    neuron_fallback(op, kNeuronKeys, stack);
    return;
  }
  const c10::ScalarType dtype = *first_dtype(*stack, begin);
  const std::vector<IValue> originals(stack->begin() + begin, stack->end());
  OpRecord& record = account_kernel(op, originals);
  RouteAllocations route(device);

  c10::SmallVector<Tensor, 4> operands;  // CPU aliases, for the numerics switches
  c10::SmallVector<std::pair<Tensor, Tensor>, 2> stand_ins;  // (caller's tensor, widened copy)
  for (size_t i = 0; i < args.size(); ++i) {
    IValue& slot = (*stack)[begin + i];
    if (slot.isNone() && is_optional_generator(args[i])) {
      slot = cpu_view_of(default_generator(device));
    } else if (slot.isGenerator()) {
      slot = cpu_view_of(slot.toGenerator());
    } else if (slot.isTensor() && slot.toTensor().defined()) {
      const Tensor& t = slot.toTensor();
      if (t.device().type() != kNeuron) {
        continue;  // a CPU scalar tensor, as CUDA accepts
      }
      Tensor alias = cpu_alias(t);
      operands.push_back(alias);
      if (t.scalar_type() == dtype) {
        alias = alias.to(w.compute);
        if (args[i].alias_info() && args[i].alias_info()->isWrite()) {
          stand_ins.emplace_back(t, alias);
        }
      }
      slot = alias;
    }
  }
  OpNumerics numerics = kernel_numerics(record, operands, device);
  op.redispatchBoxed(kCpuKeys, stack);

  const c10::ScalarType result_dtype = w.keep_computed ? w.compute : dtype;
  for (const auto& [neuron, widened] : stand_ins) {
    write_into(neuron, narrow(numerics, widened, dtype));
  }
  const auto& returns = schema.returns();
  const size_t out_begin = stack->size() - returns.size();
  for (size_t r = 0; r < returns.size(); ++r) {
    IValue& slot = (*stack)[out_begin + r];
    const int arg = written_argument(schema, returns[r]);
    if (arg >= 0) {
      slot = originals[arg];
    } else if (slot.isTensor() && slot.toTensor().defined()) {
      const Tensor& t = slot.toTensor();
      const bool widened = t.scalar_type() == w.compute && w.compute != dtype;
      slot = adopt_cpu_result(widened ? narrow(numerics, t, result_dtype) : t, device);
    }
  }
  charge_op(op, record, device, originals,
            c10::ArrayRef<IValue>(stack->data() + out_begin, returns.size()));
}

template <const Widening& W>
void widened_kernel(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack) {
  if (C10_UNLIKELY(dataless_active())) {
    dataless_fallback(op, keys, stack);
    return;
  }
  run_widened(W, op, stack);
}

// ---- histc on integers: CUDA's kernel --------------------------------------
// CUDA converts min and max to int64 (truncating), then to the input's type;
// min == max takes the data's range, an empty range widens by one each way.
// A value in [min, max] lands in bin (x - min) * bins / (max - min), in int64
// arithmetic, the last bin closed. Counts have the input's dtype.

std::pair<int64_t, int64_t> cuda_histc_range(const Tensor& self, const c10::Scalar& min,
                                             const c10::Scalar& max) {
  const int64_t lo = min.to<int64_t>(), hi = max.to<int64_t>();
  std::pair<int64_t, int64_t> range;
  AT_DISPATCH_INTEGRAL_TYPES(self.scalar_type(), "histc", [&] {
    scalar_t minvalue = static_cast<scalar_t>(lo), maxvalue = static_cast<scalar_t>(hi);
    if (lo == hi && self.numel() > 0) {
      minvalue = self.min().item<scalar_t>();
      maxvalue = self.max().item<scalar_t>();
    }
    if (minvalue == maxvalue) {
      minvalue = static_cast<scalar_t>(minvalue - 1);
      maxvalue = static_cast<scalar_t>(maxvalue + 1);
    }
    TORCH_CHECK(minvalue < maxvalue, "max must be larger than min");
    range = {static_cast<int64_t>(minvalue), static_cast<int64_t>(maxvalue)};
  });
  return range;
}

// Counts on CPU (in device memory under RouteAllocations) of a CPU alias.
Tensor cuda_histc_counts(const Tensor& self, int64_t bins, const c10::Scalar& min,
                         const c10::Scalar& max) {
  TORCH_CHECK(bins > 0, "bins must be > 0");
  const auto [lo, hi] = cuda_histc_range(self, min, max);
  const Tensor x = self.reshape({-1}).to(at::kLong);
  const Tensor inside = x.ge(lo).logical_and_(x.le(hi));
  Tensor bin = x.sub(lo).mul_(bins).div_(hi - lo, "trunc").clamp_max_(bins - 1);
  bin.masked_fill_(inside.logical_not(), bins);  // outside: one extra bin, dropped below
  return at::bincount(bin, std::nullopt, bins + 1).narrow(0, 0, bins).to(self.scalar_type());
}

bool is_integral_histc(const Tensor& self) {
  return c10::isIntegralType(self.scalar_type(), /*includeBool=*/false) &&
      self.scalar_type() != at::kUInt16 && self.scalar_type() != at::kUInt32 &&
      self.scalar_type() != at::kUInt64;
}

c10::OperatorHandle histc_op(const char* overload) {
  return c10::Dispatcher::singleton().findSchemaOrThrow("aten::histc", overload);
}

Tensor histc(const Tensor& self, int64_t bins, const c10::Scalar& min, const c10::Scalar& max) {
  static const auto op = histc_op("");
  if (!is_integral_histc(self) || dataless_active()) {
    torch::jit::Stack stack;
    torch::jit::push(stack, self, bins, min, max);
    neuron_fallback(op, kNeuronKeys, &stack);
    return stack.back().toTensor();
  }
  const c10::DeviceIndex device = self.device().index();
  const std::array<IValue, 4> args{self, bins, min, max};
  OpRecord& record = account_kernel(op, args);
  RouteAllocations route(device);
  Tensor out = adopt_cpu_result(cuda_histc_counts(cpu_alias(self), bins, min, max), device);
  charge_op(op, record, device, args, {IValue(out)});
  return out;
}

Tensor& histc_out(const Tensor& self, int64_t bins, const c10::Scalar& min,
                  const c10::Scalar& max, Tensor& out) {
  static const auto op = histc_op("out");
  if (!is_integral_histc(self) || out.device() != self.device() || dataless_active()) {
    torch::jit::Stack stack;
    torch::jit::push(stack, self, bins, min, max, out);
    neuron_fallback(op, kNeuronKeys, &stack);
    return out;
  }
  const c10::DeviceIndex device = self.device().index();
  const std::array<IValue, 5> args{self, bins, min, max, out};
  OpRecord& record = account_kernel(op, args);
  RouteAllocations route(device);
  // As CUDA's histc.out: compute, resize out, copy (converting to out's dtype).
  write_into(out, cuda_histc_counts(cpu_alias(self), bins, min, max));
  charge_op(op, record, device, args, {IValue(out)});
  return out;
}

}  // namespace

// ==== Global Registration ====
// Registered before the device initialises, so route_composite_ops_to_cpu_kernels
// (fallback.cpp) leaves these ops to these kernels.
TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("histc", histc);
  m.impl("histc.out", histc_out);
  for (const char* name :
       {"avg_pool3d", "avg_pool3d.out", "avg_pool3d_backward", "avg_pool3d_backward.grad_input",
        "_upsample_bilinear2d_aa", "_upsample_bilinear2d_aa.out",
        "_upsample_bilinear2d_aa_backward", "_upsample_bilinear2d_aa_backward.grad_input",
        "multi_margin_loss", "multi_margin_loss.out", "multi_margin_loss_backward",
        "multi_margin_loss_backward.grad_input", "multilabel_margin_loss_forward",
        "multilabel_margin_loss_forward.output", "multilabel_margin_loss_backward",
        "multilabel_margin_loss_backward.grad_input"}) {
    m.impl(name, torch::CppFunction::makeFromBoxedFunction<&widened_kernel<kHalfAndBFloat16>>());
  }
  for (const char* name : {"rrelu_with_noise", "rrelu_with_noise.out", "rrelu_with_noise_"}) {
    m.impl(name, torch::CppFunction::makeFromBoxedFunction<&widened_kernel<kHalf>>());
  }
  m.impl("abs.out", torch::CppFunction::makeFromBoxedFunction<&widened_kernel<kBoolAsByte>>());
  m.impl("trace", torch::CppFunction::makeFromBoxedFunction<&widened_kernel<kBoolAsLong>>());
}

}  // namespace torchneuron
