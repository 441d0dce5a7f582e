// Opt-in Trainium numerics, applied by the fallback, the own kernels
// (convolution) and the copy kernel to the CPU aliases of an op's tensors.
// All are off by default, so results equal CPU's unless a user asks to see
// the hardware's effects:
//  - auto-cast: the Neuron compiler's --auto-cast {matmult,all} with
//    --auto-cast-type {bf16,fp16,tf32,fp8_e4m3}: FP32 operands of TensorE ops
//    (matmul family, convolution) or of all ops are rounded to the cast type,
//    the FP32 accumulation is kept (TensorE accumulates in FP32 PSUM) and
//    results are rounded again;
//  - stochastic rounding (NEURON_RT_STOCHASTIC_ROUNDING_EN=1): engines compute
//    in FP32 and every BF16 value they write is rounded stochastically: FP32 to
//    BF16 conversions, and the BF16 results of ops, which here are computed in
//    FP32 from widened operands;
//  - INT64 computed as INT32: int64 results wrap around at 32 bits.
// Which ops each switch touches, and the formats' figures, are Python's rules
// (device/numerics.py), kept per op record (record_rules) and set by
// _set_numerics; this file only applies them.
// Checked against torch 2.13.0.
#include "../core.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/csrc/utils/pybind.h>

#include <atomic>
#include <map>
#include <mutex>

namespace torchneuron {
namespace {

using c10::IValue;
using Mode = OpNumerics::Mode;

std::atomic<int> g_autocast_scope{0};  // 0 none, 1 matmult, 2 all
std::atomic<c10::ScalarType> g_autocast_type{c10::ScalarType::BFloat16};
std::atomic<bool> g_tf32{false};  // the cast type is TF32 (no torch dtype)
std::atomic<bool> g_stochastic_rounding{false};
std::atomic<bool> g_int64_wrap{false};
std::atomic<bool> g_any{false};
// The formats' figures (device/numerics.BF16_DROPPED_BITS, INT64_STORED_BITS).
std::atomic<int> g_bf16_dropped_bits{16};
std::atomic<int> g_int64_stored_bits{32};

void refresh_any() {
  g_any = g_autocast_scope.load() != 0 || g_stochastic_rounding.load() || g_int64_wrap.load();
}

bool stochastic() {
  return g_stochastic_rounding.load(std::memory_order_relaxed);
}

// The rule word Python keeps in each op record (device/numerics.record_rules): bit 0 --auto-cast matmult rounds the op, bit 1
// --auto-cast all does, bit 2 stochastic rounding applies to its BF16 results. Ops
// real Trainium runs on the host CPU have none.
constexpr uint8_t kRuleRoundsBf16 = 1 << 2;

// Whether --auto-cast applies to an op (device/numerics.autocasts); here only which
// scope is on.
bool autocasts(const OpRecord& record) {
  const int scope = g_autocast_scope.load(std::memory_order_relaxed);  // 0 none, 1 matmult, 2 all
  return scope != 0 && (record.numerics_rule >> (scope - 1)) & 1;
}

// Whether stochastic rounding applies to the op's BF16 results (device/numerics.rounds_bf16).
bool rounds_bf16(const OpRecord& record) {
  return stochastic() && (record.numerics_rule & kRuleRoundsBf16);
}

// ---- rounding ----

// FP32 values rounded (to nearest even) to TF32's 10-bit mantissa.
at::Tensor round_to_tf32(const at::Tensor& t) {
  at::Tensor bits = t.contiguous().view(at::kInt);
  at::Tensor lsb = bits.bitwise_right_shift(13).bitwise_and(1);
  at::Tensor rounded = bits.add(lsb.add(0xFFF)).bitwise_and(~0x1FFF).view(at::kFloat);
  return at::where(t.isfinite(), rounded, t);
}

// Writes FP32 `src` (broadcast to `dst`) into BF16 `dst`, rounding up with
// probability equal to the discarded fraction: uniform noise below BF16's last
// mantissa bit is added, then the low bits are dropped. Seeded by the device's
// generator.
void stochastic_round_into(at::Tensor& dst, const at::Tensor& src, c10::DeviceIndex device) {
  const int dropped = g_bf16_dropped_bits.load(std::memory_order_relaxed);
  at::Tensor values = src.expand(dst.sizes()).contiguous();
  at::Tensor noise = at::randint(0, int64_t(1) << dropped, values.sizes(),
                                 cpu_view_of(default_generator(device)),
                                 at::TensorOptions().dtype(at::kInt));
  at::Tensor bits =
      values.view(at::kInt).add(noise).bitwise_and(~((1 << dropped) - 1)).view(at::kFloat);
  dst.copy_(at::where(values.isfinite(), bits, values));  // exact: the low bits are zero
}

// A BF16 tensor laid out as FP32 `t`, its values rounded stochastically.
at::Tensor stochastic_bf16(const at::Tensor& t, c10::DeviceIndex device) {
  at::Tensor out = at::empty_like(t, t.options().dtype(at::kBFloat16));
  stochastic_round_into(out, t, device);
  return out;
}

// FP32 values rounded to the auto-cast type, still as FP32. Rounding to BF16
// is stochastic when that switch is on, as for every BF16 the engines write.
at::Tensor round_for_autocast(const at::Tensor& t, c10::DeviceIndex device) {
  if (g_tf32.load()) {
    return round_to_tf32(t);
  }
  const c10::ScalarType type = g_autocast_type.load();
  if (type == at::kBFloat16 && stochastic()) {
    return stochastic_bf16(t, device).to(at::kFloat);
  }
  return t.to(type).to(at::kFloat);
}

// Keeps the low INT64_STORED_BITS bits, sign-extended. Applied to every int64
// result (device/numerics.wraps_int64 leaves out only views, whose data is
// already wrapped: wrapping them again is the identity).
void wrap_int64_(at::Tensor& t) {
  const int stored = g_int64_stored_bits.load(std::memory_order_relaxed);
  const int64_t half = int64_t(1) << (stored - 1);
  t.add_(half).bitwise_and_((int64_t(1) << stored) - 1).sub_(half);
}

// ---- which results are BF16 ----

void hash_kind(uint64_t& h, const IValue& v) {
  if (v.isTensor()) {
    const at::Tensor& t = v.toTensor();
    hash_mix(h, t.defined() ? static_cast<uint64_t>(t.scalar_type()) << 2 | (t.dim() == 0) << 1 |
                             t.unsafeGetTensorImpl()->is_wrapped_number()
                       : 0xff);
  } else if (v.isList()) {  // tensor lists too
    for (const IValue& e : v.toListRef()) {
      hash_kind(h, e);
    }
  } else {  // a scalar's kind, not its value, can change a result's dtype
    hash_mix(h, 0x100 | v.isDouble() | v.isInt() << 1 | v.isBool() << 2 | v.isComplexDouble() << 3);
  }
}

// What a result's dtype can depend on besides the op and its operands' dtypes
// (the record): which operands are 0-dim or wrapped numbers, the kinds of
// scalar arguments, and the default dtype (type promotion's inputs).
uint64_t promotion_key(const std::vector<IValue>& stack, size_t begin) {
  uint64_t h = kHashSeed;
  hash_mix(h, static_cast<uint64_t>(c10::get_default_dtype_as_scalartype()));
  for (size_t i = begin; i < stack.size(); ++i) {
    hash_kind(h, stack[i]);
  }
  return h;
}

IValue clone_tensors(const IValue& v) {
  if (v.isTensor()) {
    return v.toTensor().defined() ? IValue(v.toTensor().clone()) : v;
  }
  if (v.isTensorList()) {
    c10::List<at::Tensor> out;
    for (const at::Tensor& t : v.toTensorList()) {
      out.push_back(t.clone());
    }
    return out;
  }
  return v;
}

bool is_bf16(const IValue& v) {
  if (v.isTensor()) {
    return v.toTensor().defined() && v.toTensor().scalar_type() == at::kBFloat16;
  }
  if (v.isTensorList()) {
    for (const at::Tensor& t : v.toTensorList()) {
      if (t.scalar_type() == at::kBFloat16) {
        return true;
      }
    }
  }
  return false;
}

// Which results CPU returns as BF16 (a bit per return): learned by running the
// CPU kernel once, on these arguments ((a!) ones cloned), per op record and
// promotion_key. Operands widened to FP32 give FP32 results whether CPU would
// return them as BF16 or (as SDPA's logsumexp) as FP32; only CPU can tell.
uint32_t bf16_returns(const c10::OperatorHandle& op, const OpRecord& record, const OpInfo& info,
                      const std::vector<IValue>& stack, size_t begin) {
  static std::mutex mutex;
  static auto& learned = *new std::map<std::pair<const OpRecord*, uint64_t>, uint32_t>();
  const std::pair<const OpRecord*, uint64_t> key{&record, promotion_key(stack, begin)};
  {
    std::lock_guard<std::mutex> lock(mutex);
    auto it = learned.find(key);
    if (it != learned.end()) {
      return it->second;
    }
  }
  std::vector<IValue> probe;
  for (size_t i = begin; i < stack.size(); ++i) {
    probe.push_back(info.arg_is_write[i - begin] ? clone_tensors(stack[i]) : stack[i]);
  }
  op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), &probe);
  uint32_t bits = 0;
  for (size_t r = 0; r < probe.size() && r < 32; ++r) {
    bits |= static_cast<uint32_t>(is_bf16(probe[r])) << r;
  }
  std::lock_guard<std::mutex> lock(mutex);
  learned[key] = bits;
  return bits;
}

// ---- operands and results ----

at::Tensor widen(OpNumerics& n, const at::Tensor& t) {
  for (const auto& [narrow, wide] : n.widened) {
    if (narrow.is_same(t)) {
      return wide;
    }
  }
  at::Tensor wide = t.to(at::kFloat);
  n.widened.emplace_back(t, wide);  // keeps `t` alive: its address stays its own
  return wide;
}

// The FP32 stand-in the kernel writes in place of BF16 (a!) argument `t`.
at::Tensor stand_in(OpNumerics& n, const at::Tensor& t) {
  at::Tensor wide = widen(n, t);
  for (const auto& [arg, in] : n.stand_ins) {
    if (arg.is_same(t)) {
      return wide;
    }
  }
  n.stand_ins.emplace_back(t, wide);
  return wide;
}

// Replaces each tensor in `slot` (a tensor, or a list of them) with fn(tensor).
template <typename Fn>
void map_tensors(IValue& slot, Fn&& fn) {
  if (slot.isTensor()) {
    if (slot.toTensor().defined()) {
      slot = fn(slot.toTensor());
    }
  } else if (slot.isTensorList()) {
    c10::List<at::Tensor> out;
    for (const at::Tensor& t : slot.toTensorList()) {
      out.push_back(fn(t));
    }
    slot = std::move(out);
  }
}

// Copies the FP32 stand-ins into their BF16 arguments, rounding stochastically
// (resizing them first if the kernel resized the stand-in, as out= may).
void write_stand_ins(OpNumerics& n) {
  for (auto& [arg, in] : n.stand_ins) {
    if (arg.sizes() != in.sizes()) {
      arg.resize_(in.sizes(), in.suggest_memory_format());
    }
    stochastic_round_into(arg, in, n.device);
  }
}

// The mode of a fallback op. Stochastic when the rule applies to the op
// (rounds_bf16) and it writes a BF16 result: a BF16 (a!) argument, or a result
// CPU returns as BF16, asked only of ops with BF16 operands or dtype=bfloat16
// (device/numerics.rounds_bf16_result).
Mode fallback_mode(const c10::OperatorHandle& op, const OpRecord& record, const OpInfo& info,
                   const std::vector<IValue>& stack, size_t begin, uint32_t& bf16_results) {
  if (rounds_bf16(record)) {
    const auto& args = op.schema().arguments();
    bool writes_bf16 = false, reads_bf16 = false;
    for (size_t i = 0; i < args.size(); ++i) {
      const IValue& v = stack[begin + i];
      const bool bf16 = is_bf16(v) ||
          (args[i].name() == "dtype" && v.isInt() && v.toInt() == static_cast<int64_t>(at::kBFloat16));
      (info.arg_is_write[i] ? writes_bf16 : reads_bf16) |= bf16;
    }
    if (reads_bf16 && info.fresh_returns > 0) {
      bf16_results = bf16_returns(op, record, info, stack, begin);
    }
    if (writes_bf16 || bf16_results != 0) {
      return Mode::kStochastic;
    }
  }
  return autocasts(record) ? Mode::kAutocast : Mode::kNone;
}

}  // namespace

bool numerics_active() {
  return g_any.load(std::memory_order_relaxed);
}

at::Tensor numerics_operand(OpNumerics& n, const at::Tensor& t) {
  if (!t.defined()) {
    return t;
  }
  if (n.mode == Mode::kAutocast && t.scalar_type() == at::kFloat) {
    return round_for_autocast(t, n.device);
  }
  if (n.mode == Mode::kStochastic && t.scalar_type() == at::kBFloat16) {
    return widen(n, t);
  }
  return t;
}

at::Tensor numerics_result(OpNumerics& n, const at::Tensor& t) {
  if (!t.defined() || t.scalar_type() != at::kFloat) {
    return t;
  }
  if (n.mode == Mode::kAutocast) {
    return round_for_autocast(t, n.device);
  }
  if (n.mode == Mode::kStochastic) {
    return stochastic_bf16(t, n.device);
  }
  return t;
}

OpNumerics kernel_numerics(const OpRecord& record, c10::ArrayRef<at::Tensor> operands,
                           c10::DeviceIndex device) {
  OpNumerics n;
  n.device = device;
  if (!numerics_active()) {
    return n;
  }
  bool bf16 = false, fp32 = false;
  for (const at::Tensor& t : operands) {
    bf16 |= t.defined() && t.scalar_type() == at::kBFloat16;
    fp32 |= t.defined() && t.scalar_type() == at::kFloat;
  }
  if (rounds_bf16(record) && bf16) {
    n.mode = Mode::kStochastic;
  } else if (autocasts(record) && fp32) {
    n.mode = Mode::kAutocast;
  }
  return n;
}

OpNumerics numerics_before(const c10::OperatorHandle& op, const OpRecord& record,
                           const OpInfo& info, c10::DeviceIndex device,
                           std::vector<IValue>& stack, size_t begin) {
  OpNumerics n;
  n.device = device;
  n.mode = fallback_mode(op, record, info, stack, begin, n.bf16_returns);
  if (n.mode == Mode::kNone) {
    return n;
  }
  const auto& args = op.schema().arguments();
  for (size_t i = 0; i < args.size(); ++i) {
    IValue& slot = stack[begin + i];
    if (!info.arg_is_write[i]) {
      map_tensors(slot, [&](const at::Tensor& t) { return numerics_operand(n, t); });
    } else if (n.mode == Mode::kStochastic) {
      map_tensors(slot, [&](const at::Tensor& t) {
        return t.scalar_type() == at::kBFloat16 ? stand_in(n, t) : t;
      });
    }
    if (n.mode == Mode::kStochastic && args[i].name() == "dtype" && slot.isInt() &&
        slot.toInt() == static_cast<int64_t>(at::kBFloat16)) {
      slot = static_cast<int64_t>(at::kFloat);  // computed in FP32, rounded after
    }
  }
  return n;
}

void numerics_after(OpNumerics& n, const OpInfo& info, c10::ArrayRef<at::Tensor> written,
                    std::vector<IValue>& stack) {
  const size_t first_return = stack.size() - info.return_arg.size();
  if (n.mode == Mode::kStochastic) {
    write_stand_ins(n);
    for (size_t r = 0; r < info.return_arg.size(); ++r) {
      if (!info.return_is_write[r] && (n.bf16_returns >> r & 1)) {
        map_tensors(stack[first_return + r], [&](const at::Tensor& t) { return numerics_result(n, t); });
      }
    }
  }
  const bool cast = n.mode == Mode::kAutocast;
  const bool wrap = g_int64_wrap.load(std::memory_order_relaxed);
  auto finish = [&](at::Tensor t) {  // in place: (a!) results are the caller's tensors
    if (cast && t.scalar_type() == at::kFloat) {
      t.copy_(round_for_autocast(t, n.device));
    } else if (wrap && t.scalar_type() == at::kLong) {
      wrap_int64_(t);
    }
  };
  for (const at::Tensor& t : written) {
    if (t.defined()) {
      finish(t);
    }
  }
  for (size_t i = first_return; i < stack.size(); ++i) {
    if (stack[i].isTensor() && stack[i].toTensor().defined()) {
      finish(stack[i].toTensor());
    }
  }
}

bool stochastic_round_copy(at::Tensor& cpu_dst, const at::Tensor& cpu_src, c10::DeviceIndex device) {
  if (!stochastic() || cpu_dst.scalar_type() != at::kBFloat16 ||
      cpu_src.scalar_type() != at::kFloat) {
    return false;
  }
  stochastic_round_into(cpu_dst, cpu_src, device);
  return true;
}

void wrap_int64_copy(at::Tensor& cpu_dst) {
  if (g_int64_wrap.load(std::memory_order_relaxed) && cpu_dst.scalar_type() == at::kLong) {
    wrap_int64_(cpu_dst);
  }
}

void bind_numerics(py::module_& m) {
  m.def("_set_numerics", [](int autocast_scope, std::string autocast_type, bool stochastic,
                            bool int64_wrap, int bf16_dropped_bits, int int64_stored_bits) {
    TORCH_CHECK(autocast_scope >= 0 && autocast_scope <= 2, "auto-cast scope must be 0, 1 or 2");
    TORCH_CHECK(bf16_dropped_bits > 0 && bf16_dropped_bits < 23,
                "BF16 dropped bits must be in 1..22, got ", bf16_dropped_bits);
    TORCH_CHECK(int64_stored_bits > 1 && int64_stored_bits < 64,
                "int64 stored bits must be in 2..63, got ", int64_stored_bits);
    g_tf32 = autocast_type == "tf32";
    if (autocast_type == "bf16") g_autocast_type = at::kBFloat16;
    else if (autocast_type == "fp16") g_autocast_type = at::kHalf;
    else if (autocast_type == "fp8_e4m3") g_autocast_type = at::kFloat8_e4m3fn;
    else TORCH_CHECK(autocast_type == "tf32", "unknown auto-cast type ", autocast_type);
    g_autocast_scope = autocast_scope;
    g_stochastic_rounding = stochastic;
    g_int64_wrap = int64_wrap;
    g_bf16_dropped_bits = bf16_dropped_bits;
    g_int64_stored_bits = int64_stored_bits;
    refresh_any();
  }, "Sets auto-cast (0 none, 1 matmult, 2 all; type), stochastic rounding, int64 wrap, "
     "and the formats' figures (FP32 bits BF16 drops, bits int64 keeps).");
}

}  // namespace torchneuron
