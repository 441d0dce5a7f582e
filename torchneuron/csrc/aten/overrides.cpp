// Kernels for ops whose composite implementation takes a device-specific
// path on PrivateUse1 that has no CPU kernel behind it: convolution
// (convolution_overrideable) and fused LSTM/GRU cells (SDPA: attention.cpp). Each runs what the CPU would run (convolution with the opt-in
// numerics switches applied, as the fallback applies them to other ops).
// Checked against torch 2.13.0.
#include "../core.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <ATen/native/DispatchStub.h>
#include <torch/library.h>

namespace torchneuron {
namespace {

using at::Tensor;

c10::DeviceIndex common_device(std::initializer_list<const Tensor*> tensors) {
  c10::DeviceIndex device = -1;
  for (const Tensor* t : tensors) {
    if (t == nullptr || !t->defined()) {
      continue;
    }
    if (t->device().type() != kNeuron || (device != -1 && device != t->device().index())) {
      device_mismatch(c10::Device(kNeuron, device == -1 ? 0 : device), t->device());
    }
    device = t->device().index();
  }
  return device;
}

Tensor alias_or_undefined(const Tensor& t) {
  return t.defined() ? cpu_alias(t) : Tensor();
}

Tensor adopt_or_undefined(const Tensor& t, c10::DeviceIndex device) {
  return t.defined() ? adopt_cpu_result(t, device) : Tensor();
}

// ---- convolution: CPU's algorithm choice and kernels ----------------------
//
// Layout contract: a convolution's results (output, grad_input, grad_weight) are
// channels_last (2-d or 3-d) when the input or the weight suggests that format,
// otherwise contiguous. This is the rule CPU's oneDNN path and CUDA's cuDNN path
// apply, so channels_last models stay channels_last. FakeTensor predicts it for
// neuron tensors (torchneuron/device/fake_conv.py), and compiled graphs plan their
// buffers from that prediction, so eager and compiled strides agree. It is a rule of
// its own, not whatever CPU's kernel picked (CPU's slow 3-d path, taken for float64
// and batch-1 1x1x1 kernels, gives contiguous), because CPU's pick also depends on the
// thread count and the oneDNN switch at run time, which a prediction made at compile
// time cannot know. The operands are what ATen's convolution composites
// pass: 1-d convolutions arrive viewed as 2-d.

at::MemoryFormat conv_memory_format(const Tensor& input, const Tensor& weight) {
  const at::MemoryFormat in = input.suggest_memory_format();
  const at::MemoryFormat w = weight.suggest_memory_format();
  for (const auto format : {at::MemoryFormat::ChannelsLast, at::MemoryFormat::ChannelsLast3d}) {
    if (in == format || w == format) {
      return format;
    }
  }
  return at::MemoryFormat::Contiguous;
}

// A CPU result in the contract's layout (the same values; a copy only where CPU's
// kernel chose another layout).
Tensor in_format(const Tensor& t, at::MemoryFormat format) {
  return t.defined() ? t.contiguous(format) : t;
}

Tensor convolution_overrideable(
    const Tensor& input, const Tensor& weight, const std::optional<Tensor>& bias,
    c10::IntArrayRef stride, c10::IntArrayRef padding, c10::IntArrayRef dilation,
    bool transposed, c10::IntArrayRef output_padding, int64_t groups) {
  const Tensor& b = bias.has_value() ? *bias : Tensor();
  auto device = common_device({&input, &weight, &b});
  static const auto op =
      c10::Dispatcher::singleton().findSchemaOrThrow("aten::convolution_overrideable", "");
  const std::array<c10::IValue, 9> args{input, weight, bias, stride.vec(), padding.vec(),
      dilation.vec(), transposed, output_padding.vec(), groups};
  OpRecord& record = account_kernel(op, args);
  if (C10_UNLIKELY(dataless_active())) {  // the layout contract, on meta stand-ins
    auto meta = [](const Tensor& t) { return t.defined() ? meta_alias(t) : t; };
    Tensor out = adopt_meta_result(
        in_format(at::convolution(meta(input), meta(weight), meta(b), stride, padding, dilation,
                                  transposed, output_padding, groups),
                  conv_memory_format(input, weight)),
        device);
    charge_op(op, record, device, args, {c10::IValue(out)});
    return out;
  }
  RouteAllocations route(device);
  // Convolution runs on TensorE (an implicit GEMM): auto-cast "matmult" covers it.
  OpNumerics numerics = kernel_numerics(record, {input, weight, b}, device);
  auto operand = [&](const Tensor& t) { return numerics_operand(numerics, alias_or_undefined(t)); };
  Tensor out = adopt_cpu_result(in_format(numerics_result(numerics, at::convolution(
      operand(input), operand(weight), operand(b), stride, padding,
      dilation, transposed, output_padding, groups)), conv_memory_format(input, weight)),
      device);
  charge_op(op, record, device, args, {c10::IValue(out)});
  return out;
}

std::tuple<Tensor, Tensor, Tensor> convolution_backward_overrideable(
    const Tensor& grad_output, const Tensor& input, const Tensor& weight,
    c10::IntArrayRef stride, c10::IntArrayRef padding, c10::IntArrayRef dilation,
    bool transposed, c10::IntArrayRef output_padding, int64_t groups,
    std::array<bool, 3> output_mask) {
  auto device = common_device({&grad_output, &input, &weight});
  static const auto op = c10::Dispatcher::singleton().findSchemaOrThrow(
      "aten::convolution_backward_overrideable", "");
  const std::array<c10::IValue, 10> args{grad_output, input, weight, stride.vec(),
      padding.vec(), dilation.vec(), transposed, output_padding.vec(), groups,
      c10::List<bool>({output_mask[0], output_mask[1], output_mask[2]})};
  OpRecord& record = account_kernel(op, args);
  const int64_t out_channels = transposed ? weight.size(1) * groups : weight.size(0);
  RouteAllocations route(device);
  const bool dataless = dataless_active();  // meta stand-ins, no numerics
  // The gradients are convolutions too (TensorE): auto-cast as the forward.
  OpNumerics numerics =
      dataless ? OpNumerics() : kernel_numerics(record, {grad_output, input, weight}, device);
  auto operand = [&](const Tensor& t) {
    return dataless ? meta_alias(t) : numerics_operand(numerics, cpu_alias(t));
  };
  auto [gi, gw, gb] = at::convolution_backward(
      operand(grad_output), operand(input), operand(weight),
      std::vector<int64_t>{out_channels}, stride, padding, dilation, transposed,
      output_padding, groups, output_mask);
  const at::MemoryFormat format = conv_memory_format(input, weight);
  auto result = [&](const Tensor& t, at::MemoryFormat f) {
    if (dataless) {
      return t.defined() ? adopt_meta_result(in_format(t, f), device) : t;
    }
    return adopt_or_undefined(in_format(numerics_result(numerics, t), f), device);
  };
  std::tuple<Tensor, Tensor, Tensor> grads{
      result(gi, format), result(gw, format), result(gb, at::MemoryFormat::Contiguous)};
  charge_op(op, record, device, args,
            {c10::IValue(std::get<0>(grads)), c10::IValue(std::get<1>(grads)),
             c10::IValue(std::get<2>(grads))});
  return grads;
}

// ---- fused RNN cells --------------------------------------------------------
// The RNN composites call these on every non-CPU device. They use ATen ops on
// neuron tensors with CPU's operation order ((x W + b_ih) + (h W + b_hh)).
// Workspaces follow CUDA's layout: LSTM [i, f, g, o] activated gates; GRU
// [r, z, n, hx, h_n].

Tensor add_bias(const Tensor& gates, const std::optional<Tensor>& bias) {
  return bias.has_value() && bias->defined() ? gates + *bias : gates;
}

std::tuple<Tensor, Tensor, Tensor> fused_lstm_cell(
    const Tensor& input_gates, const Tensor& hidden_gates, const Tensor& cx,
    const std::optional<Tensor>& input_bias, const std::optional<Tensor>& hidden_bias) {
  Tensor gates = add_bias(input_gates, input_bias) + add_bias(hidden_gates, hidden_bias);
  auto chunks = gates.unsafe_chunk(4, 1);
  Tensor i = chunks[0].sigmoid();
  Tensor f = chunks[1].sigmoid();
  Tensor g = chunks[2].tanh();
  Tensor o = chunks[3].sigmoid();
  Tensor cy = (f * cx).add_(i * g);
  Tensor hy = o * cy.tanh();
  return {hy, cy, at::cat({i, f, g, o}, 1)};
}

std::tuple<Tensor, Tensor, Tensor> fused_lstm_cell_backward_impl(
    const std::optional<Tensor>& grad_hy, const std::optional<Tensor>& grad_cy,
    const Tensor& cx, const Tensor& cy, const Tensor& workspace, bool has_bias) {
  auto chunks = workspace.chunk(4, 1);
  const Tensor &i = chunks[0], &f = chunks[1], &g = chunks[2], &o = chunks[3];
  Tensor tanh_cy = cy.tanh();
  Tensor d_cy = at::zeros_like(cy);
  Tensor d_o = at::zeros_like(o);
  if (grad_hy.has_value() && grad_hy->defined()) {
    d_o = *grad_hy * tanh_cy;
    d_cy = *grad_hy * o * (1 - tanh_cy * tanh_cy);
  }
  if (grad_cy.has_value() && grad_cy->defined()) {
    d_cy = d_cy + *grad_cy;
  }
  Tensor grad_gates = at::cat(
      {d_cy * g * i * (1 - i), d_cy * cx * f * (1 - f), d_cy * i * (1 - g * g),
       d_o * o * (1 - o)},
      1);
  Tensor grad_cx = d_cy * f;
  Tensor grad_bias = has_bias ? grad_gates.sum(0) : Tensor();
  return {grad_gates, grad_cx, grad_bias};
}

std::tuple<Tensor, Tensor> fused_gru_cell(
    const Tensor& input_gates, const Tensor& hidden_gates, const Tensor& hx,
    const std::optional<Tensor>& input_bias, const std::optional<Tensor>& hidden_bias) {
  auto ig = add_bias(input_gates, input_bias).unsafe_chunk(3, 1);
  auto hg = add_bias(hidden_gates, hidden_bias).unsafe_chunk(3, 1);
  Tensor r = (hg[0] + ig[0]).sigmoid();
  Tensor z = (hg[1] + ig[1]).sigmoid();
  Tensor n = (ig[2] + hg[2] * r).tanh();
  Tensor hy = (hx - n).mul_(z).add_(n);
  return {hy, at::cat({r, z, n, hx, hg[2]}, 1)};
}

std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor> fused_gru_cell_backward(
    const Tensor& grad_hy, const Tensor& workspace, bool has_bias) {
  auto w = workspace.chunk(5, 1);
  const Tensor &r = w[0], &z = w[1], &n = w[2], &hx = w[3], &h_n = w[4];
  Tensor d_n = grad_hy * (1 - z) * (1 - n * n);
  Tensor d_z = grad_hy * (hx - n) * z * (1 - z);
  Tensor d_r = d_n * h_n * r * (1 - r);
  Tensor grad_input_gates = at::cat({d_r, d_z, d_n}, 1);
  Tensor grad_hidden_gates = at::cat({d_r, d_z, d_n * r}, 1);
  Tensor grad_hx = grad_hy * z;
  Tensor grad_input_bias = has_bias ? grad_input_gates.sum(0) : Tensor();
  Tensor grad_hidden_bias = has_bias ? grad_hidden_gates.sum(0) : Tensor();
  return {grad_input_gates, grad_hidden_gates, grad_hx, grad_input_bias, grad_hidden_bias};
}

// addr_ (a composite) calls addr_out(self, self, ...), and CPU's addr_out
// takes its in-place path (no broadcasting of self) only when `result` and
// `self` are the same C++ reference. A boxed call passes two stack slots, so
// the fallback cannot keep that identity; this kernel keeps it (counting,
// numerics switches and modelled time as the fallback applies them), and
// sends every other call to the fallback.
at::Tensor& addr_out(const at::Tensor& self, const at::Tensor& vec1, const at::Tensor& vec2,
                     const c10::Scalar& beta, const c10::Scalar& alpha, at::Tensor& out) {
  static const auto op = c10::Dispatcher::singleton().findSchemaOrThrow("aten::addr", "out");
  if (!out.is_same(self) || dataless_active()) {  // (the fallback's dataless path keeps the rule)
    std::vector<c10::IValue> stack;
    torch::jit::push(stack, self, vec1, vec2, beta, alpha, out);
    neuron_fallback(op, c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), &stack);
    return out;
  }
  const auto device = common_device({&out, &vec1, &vec2});
  const std::array<c10::IValue, 6> args{self, vec1, vec2, beta, alpha, out};
  OpRecord& record = account_kernel(op, args);
  RouteAllocations route(device);
  OpNumerics numerics = kernel_numerics(record, {out, vec1, vec2}, device);
  CpuAliases aliases;  // vec1/vec2 may be views of out: CPU's overlap checks must see it
  const at::Tensor alias = aliases.of(out);
  // With a switch on, the kernel reads a rounded copy of self: it runs in place on that copy.
  at::Tensor acc = numerics_operand(numerics, alias);
  at::addr_out(acc, acc, numerics_operand(numerics, aliases.of(vec1)),
               numerics_operand(numerics, aliases.of(vec2)), beta, alpha);
  const at::Tensor result = numerics_result(numerics, acc);
  if (!result.is_same(alias)) {
    alias.copy_(result);
  }
  charge_op(op, record, device, args, {c10::IValue(out)});
  return out;
}

}  // namespace

// ==== Global Registration ====
TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("addr.out", addr_out);
  m.impl("convolution_overrideable", convolution_overrideable);
  m.impl("convolution_backward_overrideable", convolution_backward_overrideable);
  m.impl("_thnn_fused_lstm_cell", fused_lstm_cell);
  m.impl("_thnn_fused_lstm_cell_backward_impl", fused_lstm_cell_backward_impl);
  m.impl("_thnn_fused_gru_cell", fused_gru_cell);
  m.impl("_thnn_fused_gru_cell_backward", fused_gru_cell_backward);
}

}  // namespace torchneuron
