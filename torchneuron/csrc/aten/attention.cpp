// Fused scaled dot-product attention on neuron: PyTorch's PrivateUse1 path
// (_fused_sdp_choice -> OVERRIDEABLE -> _scaled_dot_product_fused_attention_overrideable
// and its backward), so attention is one op, counted and charged as fused attention
// (hardware/flops.attention_work: Q, K, V, O and the log-sum-exp cross HBM, the S x S
// scores never do), as Trainium runs it. Checked against torch 2.13.0.
//
// Values are CPU's, bit for bit, as everywhere on neuron:
//  - without dropout the kernel runs CPU's flash attention
//    (_scaled_dot_product_flash_attention_for_cpu and its backward), which is what
//    CPU's own SDPA runs for the same inputs;
//  - with dropout CPU's SDPA takes its math path; the kernel runs the same ops in the
//    same order on CPU aliases (`math_with_dropout`, torch 2.13.0's
//    _scaled_dot_product_attention_math), drawing the dropout noise from the neuron
//    generator as CPU's dropout draws it from CPU's, so one seed gives CPU's result.
//    The generator's state before the draw travels to the backward inside
//    `philox_seed`'s storage (the tensor itself stays the 0-dim int64 the op's schema
//    and FakeTensor give it), and the backward replays the forward's ops under autograd
//    with the same noise: CPU's gradients.
// Where the fused kernel cannot apply, the choice is MATH, as CUDA's is: inputs that
// are not 4-D, nested, an attention mask that requires grad, unequal head sizes.
#include "../core.h"

#include <ATen/Context.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/native/transformers/sdp_utils_cpp.h>
#include <ATen/ops/_fused_sdp_choice_native.h>
#include <ATen/native/DispatchStub.h>
#include <ATen/native/transformers/attention.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

namespace torchneuron {
namespace {

using at::Tensor;

// Trainium's floating dtypes (no FP64 on any generation, trainium-facts.md: Data types).
bool trainium_float(c10::ScalarType t) {
  return t == at::kFloat || t == at::kBFloat16 || t == at::kHalf;
}

// The fused kernel's conditions: CPU flash attention's (sdp_utils_cpp.h), whatever the
// user's SDPA switches say, with dropout allowed (the math replica serves it).
bool fused_applies(const Tensor& query, const Tensor& key, const Tensor& value,
                   const std::optional<Tensor>& attn_mask, bool is_causal, bool enable_gqa) {
  const sdp::sdp_params params{query, key, value, attn_mask, 0.0, is_causal, enable_gqa};
  constexpr bool debug = false;
  if (!sdp::check_nested_tensor(params, debug) || !sdp::check_tensor_shapes(params, debug) ||
      !sdp::check_batch_size_and_num_heads_dense</*supports_gqa=*/true>(params, debug) ||
      !sdp::check_attn_mask_shape(params, debug) ||
      !sdp::check_nonzero_sequence_lengths_dense(params, debug) ||
      !sdp::check_last_dim_stride_equals_1_dense<false>(params, debug)) {
    return false;
  }
  // CPU's flash kernel requires one head size for Q, K and V.
  return query.sym_size(-1) == key.sym_size(-1) && key.sym_size(-1) == value.sym_size(-1) &&
         trainium_float(query.scalar_type()) && query.scalar_type() == key.scalar_type() &&
         key.scalar_type() == value.scalar_type();
}

bool any_fused_backend_enabled() {
  auto& ctx = at::globalContext();
  // sdpa_kernel(SDPBackend.FLASH_ATTENTION) in code written for CUDA asks for a fused
  // kernel: on neuron the fused kernel is this one, whichever fused backend is named.
  return ctx.userEnabledOverrideableSDP() || ctx.userEnabledFlashSDP() ||
         ctx.userEnabledMemEfficientSDP() || ctx.userEnabledCuDNNSDP();
}

// Output in the layout FakeTensor gives (torch/_meta_registrations.py,
// alloc_with_matching_layout): the query's dimension order, dense.
Tensor empty_matching_layout(const Tensor& query, c10::IntArrayRef sizes, c10::TensorOptions options) {
  std::vector<int64_t> order(query.dim());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return query.stride(a) > query.stride(b); });
  std::vector<int64_t> permuted(order.size());
  for (size_t i = 0; i < order.size(); ++i) {
    permuted[i] = sizes[order[i]];
  }
  std::vector<int64_t> inverse(order.size());
  for (size_t i = 0; i < order.size(); ++i) {
    inverse[order[i]] = static_cast<int64_t>(i);
  }
  return at::empty(permuted, options).permute(inverse);
}

// empty_like(t) on the meta device: the layout FakeTensor gives a gradient of `t`.
Tensor meta_like_fake(const Tensor& t) {
  return at::empty_like(at::empty_strided(t.sizes(), t.strides(), t.options().device(c10::kMeta)));
}

// `t` with the strides of `like_strides` (a meta tensor), copied only where they differ.
Tensor in_layout_of(const Tensor& t, const Tensor& like_strides) {
  if (t.strides() == like_strides.strides()) {
    return t;
  }
  Tensor out = at::empty_strided(like_strides.sizes(), like_strides.strides(), t.options());
  return out.copy_(t);
}

// ---- the math path with dropout, as CPU runs it --------------------------------------
// torch 2.13.0's _scaled_dot_product_attention_math, op for op (the scale split as
// sqrt on both operands, half/bfloat16 computed in float unless the user allows
// reduced-precision reductions, GQA by repeat_interleave, _safe_softmax), with
// at::dropout's CPU formula (_dropout_impl: noise = bernoulli_(1-p) in the weights'
// memory order, divided by 1-p, multiplied) drawing from `generator`.
Tensor math_with_dropout(const Tensor& query_, const Tensor& key, const Tensor& value,
                         const std::optional<Tensor>& attn_mask_, double dropout_p, bool is_causal,
                         std::optional<double> scale, at::Generator generator) {
  auto& ctx = at::globalContext();
  const auto origin_dtype = query_.scalar_type();
  auto widen = [&](const Tensor& t) {
    const bool reduced = t.scalar_type() == at::kHalf || t.scalar_type() == at::kBFloat16;
    return !ctx.allowFP16BF16ReductionMathSDP() && reduced ? t.to(at::kFloat) : t;
  };
  const Tensor query_acc = widen(query_);
  const Tensor key_acc = widen(key);
  const Tensor value_acc = widen(value);
  std::optional<Tensor> attn_mask = attn_mask_;
  const bool negative = scale.has_value() && *scale < 0.0;
  const double softmax_scale = scale.has_value() ? std::abs(*scale)
                                                 : 1.0 / std::sqrt(static_cast<double>(query_acc.size(-1)));
  const double scaling_factor = std::sqrt(softmax_scale);
  const Tensor query = query_acc * (negative ? 0.0 - scaling_factor : scaling_factor);
  if (is_causal) {
    TORCH_CHECK(!attn_mask.has_value(),
                "_scaled_dot_product_attention: Explicit attn_mask should not be set when is_causal=True");
    Tensor causal = at::ones({query.size(-2), key_acc.size(-2)}, query.options().dtype(at::kBool)).tril();
    attn_mask = at::where(causal, 0.0,
                          at::scalar_tensor(-std::numeric_limits<double>::infinity(),
                                            causal.options().dtype(query.dtype())));
  }
  Tensor key_expanded = key_acc;
  Tensor value_expanded = value_acc;
  const int64_t q_heads = query.size(-3);
  if (key_acc.size(-3) != q_heads || value_acc.size(-3) != q_heads) {
    key_expanded = key_acc.repeat_interleave(q_heads / key_acc.size(-3), -3);
    value_expanded = value_acc.repeat_interleave(q_heads / value_acc.size(-3), -3);
  }
  Tensor attn = at::matmul(query, key_expanded.transpose(-2, -1) * scaling_factor);
  if (attn_mask.has_value()) {
    attn.add_(*attn_mask);
  }
  attn = at::_safe_softmax(attn, -1);
  if (dropout_p == 1) {
    attn = attn.mul(at::zeros({}, attn.options()));
  } else if (attn.numel() > 0) {
    Tensor noise = at::empty_like(attn);
    noise.bernoulli_(1 - dropout_p, generator);
    noise.div_(1 - dropout_p);
    attn = attn.mul(noise);
  }
  return at::matmul(attn, value_expanded).to(origin_dtype);
}

// The generator state rides in philox_seed's storage: [0] = bytes of state, then the state.
Tensor seed_carrying_state(at::Generator generator) {
  Tensor state;
  {
    std::lock_guard<std::mutex> lock(generator.mutex());
    state = generator.get_state();
  }
  const int64_t bytes = state.numel();
  Tensor carrier = at::empty({1 + (bytes + 7) / 8}, at::TensorOptions().dtype(at::kLong));
  carrier.data_ptr<int64_t>()[0] = bytes;
  std::memcpy(carrier.data_ptr<int64_t>() + 1, state.data_ptr(), bytes);
  return carrier.as_strided({}, {}, 0);
}

at::Generator generator_from_seed(const Tensor& philox_seed) {
  const int64_t capacity = philox_seed.defined() && philox_seed.device().is_cpu() &&
                                   philox_seed.scalar_type() == at::kLong
                               ? static_cast<int64_t>(philox_seed.storage().nbytes())
                               : 0;
  const int64_t bytes = capacity >= 8 ? philox_seed.const_data_ptr<int64_t>()[0] : -1;
  TORCH_CHECK(bytes > 0 && 8 + bytes <= capacity,
              "_scaled_dot_product_fused_attention_overrideable_backward on neuron: philox_seed "
              "must be the one the forward returned (it carries the dropout generator's state); "
              "got a tensor that does not. Call the backward with the forward's philox_seed.");
  Tensor state = at::empty({bytes}, at::TensorOptions().dtype(at::kByte));
  std::memcpy(state.data_ptr(), philox_seed.const_data_ptr<int64_t>() + 1, bytes);
  at::Generator generator = at::detail::createCPUGenerator();
  generator.set_state(state);
  return generator;
}

// ---- the ops ---------------------------------------------------------------------------

using ForwardResult = std::tuple<Tensor, Tensor, Tensor, Tensor, c10::SymInt, c10::SymInt, Tensor, Tensor, Tensor>;

Tensor cpu_scalar_long(int64_t v) {
  return at::scalar_tensor(v, at::TensorOptions().dtype(at::kLong));
}

ForwardResult fused_attention(const Tensor& query, const Tensor& key, const Tensor& value,
                              const std::optional<Tensor>& attn_bias, double dropout_p, bool is_causal,
                              bool return_debug_mask, std::optional<double> scale) {
  static const auto op = c10::Dispatcher::singleton().findSchemaOrThrow(
      "aten::_scaled_dot_product_fused_attention_overrideable", "");
  TORCH_CHECK_NOT_IMPLEMENTED(!return_debug_mask,
      "_scaled_dot_product_fused_attention_overrideable on neuron: return_debug_mask=True is not "
      "supported (the fused kernel keeps no attention weights); call it with return_debug_mask=False.");
  TORCH_CHECK(dropout_p >= 0 && dropout_p <= 1,
              "dropout probability has to be between 0 and 1, but got ", dropout_p);
  const bool gqa = query.dim() == 4 && key.dim() == 4 && query.size(1) != key.size(1);
  TORCH_CHECK(fused_applies(query, key, value, attn_bias, is_causal, gqa),
      "_scaled_dot_product_fused_attention_overrideable on neuron needs dense 4-D query, key and "
      "value [batch, heads, seq, head_dim] of one floating dtype and one head size, key/value heads "
      "dividing query heads, nonzero sequence lengths, unit stride in the last dimension and a mask "
      "that does not require grad; got query ", query.sizes(), ", key ", key.sizes(), ", value ",
      value.sizes(), ". F.scaled_dot_product_attention picks the math path for such inputs.");
  const Tensor& mask = attn_bias.has_value() ? *attn_bias : Tensor();
  c10::DeviceIndex device = -1;
  for (const Tensor* t : {&query, &key, &value, &mask}) {
    if (t->defined()) {
      join_device(device, t->device());
    }
  }
  const std::array<c10::IValue, 8> args{query, key, value, attn_bias, dropout_p, is_causal,
                                        return_debug_mask, scale};
  OpRecord& record = account_kernel(op, args);
  const int64_t batch = query.size(0), heads = query.size(1), lq = query.size(2), lk = key.size(2);
  auto out_sizes = query.sizes().vec();
  out_sizes.back() = value.size(-1);
  Tensor output, logsumexp, philox_seed = cpu_scalar_long(0), philox_offset = cpu_scalar_long(0);
  if (C10_UNLIKELY(dataless_active())) {
    const auto meta_options = query.options().device(c10::kMeta);
    output = adopt_meta_result(empty_matching_layout(query, out_sizes, meta_options), device);
    logsumexp = adopt_meta_result(at::empty({batch, heads, lq}, meta_options.dtype(at::kFloat)), device);
  } else {
    const at::Generator generator = cpu_view_of(default_generator(device));
    if (dropout_p > 0) {  // host memory, made before device allocations are routed
      philox_seed = seed_carrying_state(generator);
    }
    RouteAllocations route(device);
    // The opt-in Trainium numerics (numerics.cpp) as the fallback applies them: on the
    // data operands and results, not the mask or the FP32 log-sum-exp.
    OpNumerics numerics = kernel_numerics(record, {query, key, value}, device);
    auto operand = [&](const Tensor& t) { return numerics_operand(numerics, cpu_alias(t)); };
    const Tensor q = operand(query), k = operand(key), v = operand(value);
    const std::optional<Tensor> m = mask.defined() ? std::optional<Tensor>(cpu_alias(mask)) : std::nullopt;
    const Tensor layout = empty_matching_layout(query, out_sizes, query.options().device(c10::kMeta));
    auto result = [&](const Tensor& t) { return adopt_cpu_result(in_layout_of(numerics_result(numerics, t), layout), device); };
    if (dropout_p == 0) {
      auto [out, lse] = at::_scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, is_causal, m, scale);
      output = result(out);
      logsumexp = adopt_cpu_result(lse.to(at::kFloat).contiguous(), device);
    } else {
      at::NoGradGuard no_grad;
      output = result(math_with_dropout(q, k, v, m, dropout_p, is_causal, scale, generator));
      // The math path has no log-sum-exp; its backward replays the forward instead.
      logsumexp = adopt_cpu_result(at::full({batch, heads, lq}, std::numeric_limits<float>::quiet_NaN(),
                                            q.options().dtype(at::kFloat)), device);
    }
  }
  charge_op(op, record, device, args, {c10::IValue(output), c10::IValue(logsumexp)});
  return {output, logsumexp, Tensor(), Tensor(), c10::SymInt(lq), c10::SymInt(lk),
          philox_seed, philox_offset, Tensor() /* debug_attn_mask: none, as FakeTensor gives */};
}

std::tuple<Tensor, Tensor, Tensor, Tensor> fused_attention_backward(
    const Tensor& grad_out, const Tensor& query, const Tensor& key, const Tensor& value,
    const Tensor& attn_bias, std::array<bool, 4> grad_input_mask, const Tensor& out,
    const Tensor& logsumexp, const Tensor& cum_seq_q, const Tensor& cum_seq_k, c10::SymInt max_q,
    c10::SymInt max_k, double dropout_p, bool is_causal, const Tensor& philox_seed,
    const Tensor& philox_offset, std::optional<double> scale) {
  static const auto op = c10::Dispatcher::singleton().findSchemaOrThrow(
      "aten::_scaled_dot_product_fused_attention_overrideable_backward", "");
  TORCH_CHECK(!grad_input_mask[3] || !attn_bias.defined(),
      "_scaled_dot_product_fused_attention_overrideable_backward on neuron: the fused kernel gives "
      "no gradient for attn_bias; F.scaled_dot_product_attention takes the math path when the mask "
      "requires grad.");
  c10::DeviceIndex device = -1;
  for (const Tensor* t : {&grad_out, &query, &key, &value, &attn_bias, &out}) {
    if (t->defined()) {
      join_device(device, t->device());
    }
  }
  const std::array<c10::IValue, 17> args{grad_out, query, key, value, attn_bias,
      c10::List<bool>({grad_input_mask[0], grad_input_mask[1], grad_input_mask[2], grad_input_mask[3]}),
      out, logsumexp, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p, is_causal, philox_seed,
      philox_offset, scale};
  OpRecord& record = account_kernel(op, args);
  Tensor grad_q, grad_k, grad_v;
  if (C10_UNLIKELY(dataless_active())) {
    grad_q = adopt_meta_result(at::empty_like(meta_alias(query)), device);
    grad_k = adopt_meta_result(at::empty_like(meta_alias(key)), device);
    grad_v = adopt_meta_result(at::empty_like(meta_alias(value)), device);
  } else {
    RouteAllocations route(device);
    OpNumerics numerics = kernel_numerics(record, {grad_out, query, key, value}, device);
    auto operand = [&](const Tensor& t) { return numerics_operand(numerics, cpu_alias(t)); };
    const Tensor q = operand(query), k = operand(key), v = operand(value), g = operand(grad_out);
    const std::optional<Tensor> m =
        attn_bias.defined() ? std::optional<Tensor>(cpu_alias(attn_bias)) : std::nullopt;
    Tensor gq, gk, gv;
    if (dropout_p == 0) {
      std::tie(gq, gk, gv) = at::_scaled_dot_product_flash_attention_for_cpu_backward(
          g, q, k, v, operand(out), cpu_alias(logsumexp),
          0.0, is_causal, m, scale);
    } else {
      // Replay the forward under autograd (this kernel runs below it: let it in again,
      // without autocast) with the forward's noise, and differentiate it: CPU's backward.
      const auto tls = c10::impl::tls_local_dispatch_key_set();
      c10::impl::ForceDispatchKeyGuard keys(tls.included_ - c10::autocast_dispatch_keyset,
                                            tls.excluded_ - c10::autograd_dispatch_keyset_with_ADInplaceOrView);
      at::AutoGradMode grad_mode(true);
      const Tensor qr = q.detach().requires_grad_(true), kr = k.detach().requires_grad_(true),
                   vr = v.detach().requires_grad_(true);
      const Tensor replay = math_with_dropout(qr, kr, vr, m, dropout_p, is_causal, scale,
                                              generator_from_seed(philox_seed));
      auto grads = torch::autograd::grad({replay}, {qr, kr, vr}, {g});
      gq = grads[0];
      gk = grads[1];
      gv = grads[2];
    }
    // FakeTensor's layout (empty_like of each input).
    auto result = [&](const Tensor& grad, const Tensor& input) {
      return adopt_cpu_result(in_layout_of(numerics_result(numerics, grad), meta_like_fake(input)), device);
    };
    grad_q = result(gq, query);
    grad_k = result(gk, key);
    grad_v = result(gv, value);
  }
  charge_op(op, record, device, args, {c10::IValue(grad_q), c10::IValue(grad_k), c10::IValue(grad_v)});
  return {grad_q, grad_k, grad_v, Tensor()};
}

}  // namespace

// (outside the anonymous namespace: the dispatch stub below names it)
// The SDPA composite asks this for the backend on PrivateUse1. It reads only shapes,
// strides, dtypes and flags, never data, so it also answers for FakeTensors while
// torch.compile traces.
int64_t fused_sdp_choice(
    const Tensor& query, const Tensor& key, const Tensor& value,
    const std::optional<Tensor>& attn_mask, double dropout_p, bool is_causal,
    std::optional<double> scale, bool enable_gqa) {
  if (any_fused_backend_enabled() && fused_applies(query, key, value, attn_mask, is_causal, enable_gqa)) {
    return static_cast<int64_t>(sdp::SDPBackend::overrideable);
  }
  if (at::globalContext().userEnabledMathSDP()) {
    return static_cast<int64_t>(sdp::SDPBackend::math);
  }
  return static_cast<int64_t>(sdp::SDPBackend::error);
}

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("_fused_sdp_choice", fused_sdp_choice);
  m.impl("_scaled_dot_product_fused_attention_overrideable", fused_attention);
  m.impl("_scaled_dot_product_fused_attention_overrideable_backward", fused_attention_backward);
}

}  // namespace torchneuron

// The SDPA composite consults this dispatch stub, not the op above.
namespace at::native {
REGISTER_PRIVATEUSE1_DISPATCH(_fused_sdp_choice_stub, &torchneuron::fused_sdp_choice);
}  // namespace at::native
