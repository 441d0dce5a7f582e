// Opt-in Trainium numerics, applied by the fallback and the copy kernel to
// the CPU aliases of an op's tensors. All are off by default, so results
// equal CPU's unless a user asks to see the hardware's effects:
//  - auto-cast: the Neuron compiler's --auto-cast {matmult,all} with
//    --auto-cast-type {bf16,fp16,tf32,fp8_e4m3}: FP32 inputs of matmul-family
//    ops (or of all ops) are rounded to the cast type, the FP32 accumulation
//    is kept (TensorE accumulates in FP32 PSUM) and results are rounded again;
//  - stochastic rounding (NEURON_RT_STOCHASTIC_ROUNDING_EN=1) of FP32 to BF16
//    conversions;
//  - INT64 computed as INT32: int64 results wrap around at 32 bits.
// Checked against torch 2.13.0.
#include "core.h"

#include <torch/csrc/utils/pybind.h>

#include <atomic>

namespace torchneuron {
namespace {

std::atomic<int> g_autocast_scope{0};  // 0 none, 1 matmult, 2 all
std::atomic<c10::ScalarType> g_autocast_type{c10::ScalarType::BFloat16};
std::atomic<bool> g_tf32{false};  // the cast type is TF32 (no torch dtype)
std::atomic<bool> g_stochastic_rounding{false};
std::atomic<bool> g_int64_wrap{false};
std::atomic<bool> g_any{false};

void refresh_any() {
  g_any = g_autocast_scope.load() != 0 || g_stochastic_rounding.load() || g_int64_wrap.load();
}

// FP32 values rounded (to nearest even) to TF32's 10-bit mantissa.
at::Tensor round_to_tf32(const at::Tensor& t) {
  at::Tensor bits = t.contiguous().view(at::kInt);
  at::Tensor lsb = bits.bitwise_right_shift(13).bitwise_and(1);
  at::Tensor rounded = bits.add(lsb.add(0xFFF)).bitwise_and(~0x1FFF).view(at::kFloat);
  return at::where(t.isfinite(), rounded, t);
}

// FP32 values rounded to the auto-cast type, still as FP32.
at::Tensor round_for_autocast(const at::Tensor& t) {
  if (g_tf32.load()) {
    return round_to_tf32(t);
  }
  return t.to(g_autocast_type.load()).to(at::kFloat);
}

bool autocasts(const OpRecord& record) {
  const int scope = g_autocast_scope.load(std::memory_order_relaxed);
  return scope == 2 || (scope == 1 && record.matmul_family);
}

void wrap_int64_(at::Tensor& t) {
  constexpr int64_t half = int64_t(1) << 31;
  t.add_(half).bitwise_and_((int64_t(1) << 32) - 1).sub_(half);
}

}  // namespace

bool numerics_active() {
  return g_any.load(std::memory_order_relaxed);
}

void numerics_before(const OpRecord& record, c10::ArrayRef<bool> is_write,
                     torch::jit::Stack& stack, size_t begin) {
  if (!autocasts(record)) {
    return;
  }
  for (size_t i = 0; i < is_write.size(); ++i) {
    c10::IValue& slot = stack[begin + i];
    if (!is_write[i] && slot.isTensor() && slot.toTensor().scalar_type() == at::kFloat) {
      slot = round_for_autocast(slot.toTensor());
    }
  }
}

void numerics_after(const OpRecord& record, c10::ArrayRef<at::Tensor> written) {
  const bool cast = autocasts(record);
  const bool wrap = g_int64_wrap.load(std::memory_order_relaxed);
  for (at::Tensor t : written) {
    if (!t.defined()) {
      continue;
    }
    if (cast && t.scalar_type() == at::kFloat) {
      t.copy_(round_for_autocast(t));
    } else if (wrap && t.scalar_type() == at::kLong) {
      wrap_int64_(t);
    }
  }
}

bool stochastic_round_copy(at::Tensor& cpu_dst, const at::Tensor& cpu_src, c10::DeviceIndex device) {
  if (!g_stochastic_rounding.load(std::memory_order_relaxed) ||
      cpu_dst.scalar_type() != at::kBFloat16 || cpu_src.scalar_type() != at::kFloat) {
    return false;
  }
  // Adding uniform noise below BF16's last mantissa bit, then truncating,
  // rounds up with probability equal to the discarded fraction.
  at::Tensor src = cpu_src.expand(cpu_dst.sizes()).contiguous();
  at::Tensor noise = at::randint(0, 1 << 16, src.sizes(), cpu_view_of(default_generator(device)),
                                 at::TensorOptions().dtype(at::kInt));
  at::Tensor bits = src.view(at::kInt).add(noise).bitwise_and(~0xFFFF).view(at::kFloat);
  cpu_dst.copy_(at::where(src.isfinite(), bits, src));
  return true;
}

void wrap_int64_copy(at::Tensor& cpu_dst) {
  if (g_int64_wrap.load(std::memory_order_relaxed) && cpu_dst.scalar_type() == at::kLong) {
    wrap_int64_(cpu_dst);
  }
}

void bind_numerics(py::module_& m) {
  m.def("_set_numerics", [](int autocast_scope, std::string autocast_type, bool stochastic,
                            bool int64_wrap) {
    TORCH_CHECK(autocast_scope >= 0 && autocast_scope <= 2, "auto-cast scope must be 0, 1 or 2");
    g_tf32 = autocast_type == "tf32";
    if (autocast_type == "bf16") g_autocast_type = at::kBFloat16;
    else if (autocast_type == "fp16") g_autocast_type = at::kHalf;
    else if (autocast_type == "fp8_e4m3") g_autocast_type = at::kFloat8_e4m3fn;
    else TORCH_CHECK(autocast_type == "tf32", "unknown auto-cast type ", autocast_type);
    g_autocast_scope = autocast_scope;
    g_stochastic_rounding = stochastic;
    g_int64_wrap = int64_wrap;
    refresh_any();
  }, "Sets auto-cast (0 none, 1 matmult, 2 all; type), stochastic rounding, int64 wrap.");
}

}  // namespace torchneuron
