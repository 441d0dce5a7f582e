// Whole-sequence RNNs (nn.LSTM, nn.GRU, nn.RNN) on neuron: CPU's own
// implementation on device memory, as one counted and charged op.
//
// aten::lstm/gru/rnn_tanh/rnn_relu (.input and .data, the packed form) are
// CompositeImplicitAutograd. On CPU the composite runs oneDNN's whole-sequence
// LSTM kernel (mkldnn_rnn_layer) or, for GRU/RNN, cells whose input
// projection is one matmul over the sequence; on any other device it runs one
// fused cell per timestep (_thnn_fused_*_cell), a dozen small ops per step.
// Here the op is registered at AutogradPrivateUse1 (and PrivateUse1, for
// inference mode): it runs the CPU composite on CPU aliases of the device
// tensors, with CPU allocations routed into device memory, so results are
// CPU's bit for bit. Autograd: the CPU composite records its own graph over
// CPU leaves aliasing the inputs; one neuron node (CpuGraphBackward) holds it,
// and its backward runs that CPU graph (torch::autograd::grad) on the device
// memory. Dropout between layers is CPU's (_dropout_impl) drawn from the
// neuron generator. The forward is counted and charged as the aten op, the
// backward as torchneuron::<mode>_backward.<overload>.
//
// The composite (today's per-step path) still runs where this cannot: inputs
// that are not plain neuron tensors (fake/functional tensors while tracing,
// mixed devices, whose errors it raises), forward-mode AD, and autocast on
// neuron (whose op lists cast the cells and matmuls), and dataless execution (which
// then counts the per-step ops, not one RNN op). Checked on torch 2.13.0.
#include "../core.h"

#include <ATen/autocast_mode.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/gru_native.h>
#include <ATen/ops/lstm_native.h>
#include <ATen/ops/rnn_relu_native.h>
#include <ATen/ops/rnn_tanh_native.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/basic_ops.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/library.h>

#include <algorithm>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace torchneuron {
namespace {

using at::Tensor;
using at::TensorList;
using c10::IValue;
using torch::autograd::variable_list;

enum class Mode { kLstm, kGru, kRnnTanh, kRnnRelu };

int64_t gates(Mode mode) {
  switch (mode) {
    case Mode::kLstm: return 4;
    case Mode::kGru: return 3;
    default: return 1;
  }
}

// A tensor whose bytes are in neuron memory, as the CPU aliases need: not a
// fake, functional or other Python/wrapper tensor (those trace the composite).
bool plain_neuron(const Tensor& t) {
  constexpr c10::DispatchKeySet kWrappers({c10::DispatchKey::Python,
      c10::DispatchKey::Functionalize, c10::DispatchKey::PythonTLSSnapshot,
      c10::DispatchKey::FuncTorchBatched, c10::DispatchKey::FuncTorchGradWrapper});
  return t.defined() && t.device().type() == kNeuron && t.layout() == c10::kStrided &&
      t.has_storage() && !t.key_set().has_any(kWrappers) && !t._fw_grad(0).defined();
}

// Whether this call can run CPU's implementation on device memory, and on which device.
std::optional<c10::DeviceIndex> cpu_path_device(const std::vector<Tensor>& tensors) {
  // Dataless execution has no CPU graph to hold: the composite's per-step ops run it.
  if (at::autocast::is_autocast_enabled(c10::DeviceType::PrivateUse1) || dataless_active()) {
    return std::nullopt;
  }
  c10::DeviceIndex device = -1;
  for (const Tensor& t : tensors) {
    if (!plain_neuron(t) || (device != -1 && t.device().index() != device)) {
      return std::nullopt;
    }
    device = t.device().index();
  }
  return device;
}

const char kBackpropTwice[] =
    "Trying to backward through the graph a second time (or directly access saved tensors "
    "after they have already been freed). Saved intermediate values of the graph are freed "
    "when you call .backward() or autograd.grad(). Specify retain_graph=True if you need to "
    "backward through the graph a second time or if you need to access saved tensors after "
    "calling backward.";

// The backward of one RNN call: the CPU autograd graph its forward recorded
// over CPU aliases of the device tensors. Its outputs are the op's results,
// its inputs (next edges) the op's differentiable arguments.
class CpuGraphBackward : public torch::autograd::Node {
 public:
  CpuGraphBackward(std::string name, const c10::OperatorHandle& op, c10::DeviceIndex device,
                   std::vector<IValue> args, std::vector<Tensor> results, std::vector<Tensor> leaves)
      : name_(std::move(name)), op_(op), device_(device), args_(std::move(args)),
        results_(std::move(results)), leaves_(std::move(leaves)) {}

  std::string name() const override { return name_; }

  // The engine calls this after apply() unless the graph is retained: the
  // CPU graph goes with it, as a built-in node frees its saved tensors.
  void release_variables() override {
    results_.clear();
    leaves_.clear();
    args_.clear();
    released_ = true;
  }

  variable_list apply(variable_list&& grads) override {
    TORCH_CHECK(!released_, kBackpropTwice);
    variable_list out(num_outputs());
    std::vector<Tensor> results, grad_results, leaves;
    std::vector<size_t> where;
    for (size_t i = 0; i < grads.size() && i < results_.size(); ++i) {
      const Tensor& g = grads[i];
      if (g.defined() && !g._is_zerotensor() && results_[i].requires_grad()) {
        results.push_back(results_[i]);
        grad_results.push_back(cpu_alias(g));
      }
    }
    for (size_t j = 0; j < leaves_.size(); ++j) {
      if (leaves_[j].defined() && leaves_[j].requires_grad() && should_compute_output(j)) {
        leaves.push_back(leaves_[j]);
        where.push_back(j);
      }
    }
    if (results.empty() || leaves.empty()) {
      return out;
    }
    OpRecord& record = account_kernel(op_, args_);
    const bool create_graph = c10::GradMode::is_enabled();
    variable_list cpu_grads;
    {
      RouteAllocations route(device_);
      // Retained: a later backward with retain_graph=True may need it; it is
      // freed with release_variables().
      cpu_grads = torch::autograd::grad(results, leaves, grad_results, /*retain_graph=*/true,
                                        /*create_graph=*/false, /*allow_unused=*/true);
    }
    std::vector<IValue> charged;
    for (size_t k = 0; k < cpu_grads.size(); ++k) {
      if (cpu_grads[k].defined()) {
        out[where[k]] = adopt_cpu_result(cpu_grads[k], device_);
        charged.emplace_back(out[where[k]]);
      }
    }
    charge_op(op_, record, device_, args_, charged);
    return create_graph && std::any_of(grads.begin(), grads.end(), [](const Tensor& g) {
      return g.defined() && g.requires_grad();
    }) ? no_double_backward(std::move(out)) : out;
  }

 private:
  // With create_graph=True the gradients get a node that raises if they are
  // differentiated (as @once_differentiable does): the CPU graph is run
  // without create_graph, so a second derivative would otherwise be silently missing.
  variable_list no_double_backward(variable_list grads) const {
    for (Tensor& g : grads) {
      if (g.defined()) {
        g = g.detach();
        g.set_requires_grad(true);
      }
    }
    torch::autograd::DelayedError error(
        "the backward of " + name_ + " (nn.RNN/GRU/LSTM on neuron) is not differentiable: "
        "double backward through a recurrent layer is not supported", grads.size());
    return error.apply(std::move(grads));
  }

  std::string name_;
  c10::OperatorHandle op_;
  c10::DeviceIndex device_;
  std::vector<IValue> args_;  // the forward's arguments, for counting and charging
  std::vector<Tensor> results_;  // CPU results: the CPU graph hangs off them
  std::vector<Tensor> leaves_;  // CPU aliases of the differentiable arguments
  bool released_ = false;
};

// CPU's dropout between layers (_dropout_impl, which both CPU paths call via
// at::dropout) with the neuron device's generator: nn.LSTM(dropout=p) on
// neuron after torch.neuron.manual_seed(s) draws the masks CPU draws after
// torch.manual_seed(s).
Tensor dropout_between_layers(const Tensor& x, double p, const at::Generator& generator) {
  if (x.numel() == 0) {
    return x;
  }
  if (p == 1) {
    return x * at::zeros({}, x.options());
  }
  Tensor noise = at::empty_like(x);
  noise.bernoulli_(1 - p, generator);
  noise.div_(1 - p);
  return x * noise;
}

// One RNN call as CPU runs it: `layers(first, count, input, hx)` runs layers
// [first, first + count) of the CPU composite and returns (output, hidden
// states...). Without dropout that is one call for all layers; with dropout
// each layer is a call and CPU's dropout runs between them.
struct Layers {
  int64_t num_layers;
  double dropout;
  bool train;
  std::function<std::vector<Tensor>(int64_t first, int64_t count, const Tensor& input)> run;
};

std::vector<Tensor> run_layers(const Layers& layers, const Tensor& input, c10::DeviceIndex device) {
  if (layers.dropout == 0 || !layers.train || layers.num_layers == 1) {
    return layers.run(0, layers.num_layers, input);
  }
  const at::Generator generator = cpu_view_of(default_generator(device));
  Tensor x = input;
  std::vector<std::vector<Tensor>> hidden;
  for (int64_t l = 0; l < layers.num_layers; ++l) {
    std::vector<Tensor> r = layers.run(l, 1, x);
    x = r[0];
    if (l < layers.num_layers - 1) {
      x = dropout_between_layers(x, layers.dropout, generator);
    }
    hidden.emplace_back(r.begin() + 1, r.end());
  }
  std::vector<Tensor> out{x};
  for (size_t h = 0; h < hidden[0].size(); ++h) {
    std::vector<Tensor> per_layer;
    for (const auto& layer : hidden) {
      per_layer.push_back(layer[h]);
    }
    out.push_back(at::cat(per_layer, 0));
  }
  return out;
}

// Runs one RNN call on device memory: `cpu(leaves)` gets CPU aliases of
// `tensors` (in order, requiring grad as they do) and returns CPU results.
std::vector<Tensor> run_on_device(
    const c10::OperatorHandle& op, const c10::OperatorHandle& backward_op,
    std::vector<IValue> args, const std::vector<Tensor>& tensors, c10::DeviceIndex device,
    const std::function<std::vector<Tensor>(const std::vector<Tensor>&)>& cpu) {
  OpRecord& record = account_kernel(op, args);
  const bool record_grad = c10::GradMode::is_enabled() &&
      std::any_of(tensors.begin(), tensors.end(), [](const Tensor& t) { return t.requires_grad(); });
  std::vector<Tensor> leaves;
  leaves.reserve(tensors.size());
  for (const Tensor& t : tensors) {
    Tensor alias = cpu_alias(t);
    if (record_grad) {
      // In-place changes to the device tensor show in the CPU graph's checks.
      alias.unsafeGetTensorImpl()->set_version_counter(t.unsafeGetTensorImpl()->version_counter());
      if (t.requires_grad()) {
        alias.set_requires_grad(true);
      }
    }
    leaves.push_back(std::move(alias));
  }
  std::vector<Tensor> cpu_results;
  {
    RouteAllocations route(device);
    c10::AutoGradMode grad_mode(record_grad);
    cpu_results = cpu(leaves);
  }
  std::vector<Tensor> results;
  std::vector<IValue> charged;
  for (const Tensor& r : cpu_results) {
    // With a graph the CPU result stays in it: the device tensor shares its
    // memory (the extra reference stops adopt_cpu_result taking it over).
    const c10::Storage shared = record_grad ? r.storage() : c10::Storage();
    results.push_back(adopt_cpu_result(r, device));
    charged.emplace_back(results.back());
  }
  if (record_grad) {
    std::string name = backward_op.schema().name();
    name = name.substr(name.find("::") + 2);
    auto node = c10::make_intrusive<CpuGraphBackward>(
        std::move(name), backward_op, device, args, cpu_results, leaves);
    node->set_next_edges(torch::autograd::collect_next_edges(tensors));
    for (size_t i = 0; i < results.size(); ++i) {
      results[i].unsafeGetTensorImpl()->set_version_counter(
          cpu_results[i].unsafeGetTensorImpl()->version_counter());
      torch::autograd::set_history(results[i], node);
    }
  }
  charge_op(op, record, device, args, charged);
  return results;
}

// The parameters of layers [first, first + count): `per_layer` tensors per
// layer (all directions).
std::vector<Tensor> slice(const std::vector<Tensor>& v, int64_t begin, int64_t count) {
  return std::vector<Tensor>(v.begin() + begin, v.begin() + begin + count);
}

c10::OperatorHandle find_op(const char* name, const char* overload) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, overload);
}

// Parameters per layer, or -1 if `params` does not split evenly (the
// composite then raises its own error).
int64_t params_per_layer(size_t params, int64_t num_layers, bool bidirectional) {
  const int64_t layers = num_layers * (bidirectional ? 2 : 1);
  if (layers <= 0 || static_cast<int64_t>(params) % layers != 0) {
    return -1;
  }
  return static_cast<int64_t>(params) / num_layers;
}

// ---- LSTM (two hidden states) -------------------------------------------------

std::tuple<Tensor, Tensor, Tensor> lstm_input(
    const Tensor& input, TensorList hx, TensorList params, bool has_biases, int64_t num_layers,
    double dropout, bool train, bool bidirectional, bool batch_first) {
  std::vector<Tensor> tensors{input};
  tensors.insert(tensors.end(), hx.begin(), hx.end());
  tensors.insert(tensors.end(), params.begin(), params.end());
  const auto device = cpu_path_device(tensors);
  const int64_t per_layer = params_per_layer(params.size(), num_layers, bidirectional);
  if (!device || hx.size() != 2 || per_layer < 0) {
    return at::native::lstm(input, hx, params, has_biases, num_layers, dropout, train,
                            bidirectional, batch_first);
  }
  static const auto op = find_op("aten::lstm", "input");
  static const auto backward = find_op("torchneuron::lstm_backward", "input");
  const int64_t directions = bidirectional ? 2 : 1;
  auto r = run_on_device(
      op, backward,
      {input, hx.vec(), params.vec(), has_biases, num_layers, dropout, train, bidirectional,
       batch_first},
      tensors, *device, [&](const std::vector<Tensor>& cpu) {
        const std::vector<Tensor> p = slice(cpu, 3, params.size());
        // Seq-first from here on, as the composite does, so dropout masks
        // are drawn over the same layout as on CPU.
        Tensor x = batch_first ? cpu[0].transpose(0, 1) : cpu[0];
        Layers layers{num_layers, dropout, train,
            [&](int64_t first, int64_t count, const Tensor& in) {
              auto [o, h, c] = at::lstm(
                  in, {cpu[1].narrow(0, first * directions, count * directions),
                       cpu[2].narrow(0, first * directions, count * directions)},
                  slice(p, first * per_layer, count * per_layer), has_biases, count,
                  count == num_layers ? dropout : 0.0, train, bidirectional, false);
              return std::vector<Tensor>{o, h, c};
            }};
        std::vector<Tensor> out = run_layers(layers, x, *device);
        if (batch_first) {
          out[0] = out[0].transpose(0, 1);
        }
        return out;
      });
  return {r[0], r[1], r[2]};
}

std::tuple<Tensor, Tensor, Tensor> lstm_data(
    const Tensor& data, const Tensor& batch_sizes, TensorList hx, TensorList params,
    bool has_biases, int64_t num_layers, double dropout, bool train, bool bidirectional) {
  std::vector<Tensor> tensors{data};
  tensors.insert(tensors.end(), hx.begin(), hx.end());
  tensors.insert(tensors.end(), params.begin(), params.end());
  const auto device = cpu_path_device(tensors);
  const int64_t per_layer = params_per_layer(params.size(), num_layers, bidirectional);
  if (!device || hx.size() != 2 || per_layer < 0 || batch_sizes.device().type() != c10::kCPU) {
    return at::native::lstm(data, batch_sizes, hx, params, has_biases, num_layers, dropout,
                            train, bidirectional);
  }
  static const auto op = find_op("aten::lstm", "data");
  static const auto backward = find_op("torchneuron::lstm_backward", "data");
  const int64_t directions = bidirectional ? 2 : 1;
  auto r = run_on_device(
      op, backward,
      {data, batch_sizes, hx.vec(), params.vec(), has_biases, num_layers, dropout, train,
       bidirectional},
      tensors, *device, [&](const std::vector<Tensor>& cpu) {
        const std::vector<Tensor> p = slice(cpu, 3, params.size());
        Layers layers{num_layers, dropout, train,
            [&](int64_t first, int64_t count, const Tensor& in) {
              auto [o, h, c] = at::lstm(
                  in, batch_sizes,
                  {cpu[1].narrow(0, first * directions, count * directions),
                   cpu[2].narrow(0, first * directions, count * directions)},
                  slice(p, first * per_layer, count * per_layer), has_biases, count,
                  count == num_layers ? dropout : 0.0, train, bidirectional);
              return std::vector<Tensor>{o, h, c};
            }};
        return run_layers(layers, cpu[0], *device);
      });
  return {r[0], r[1], r[2]};
}

// ---- GRU and RNN (one hidden state) --------------------------------------------

using OneHiddenInput = std::tuple<Tensor, Tensor> (*)(
    const Tensor&, const Tensor&, TensorList, bool, int64_t, double, bool, bool, bool);
using OneHiddenData = std::tuple<Tensor, Tensor> (*)(
    const Tensor&, const Tensor&, const Tensor&, TensorList, bool, int64_t, double, bool, bool);

struct OneHidden {
  const char* op;  // "aten::gru"
  const char* backward;  // "torchneuron::gru_backward"
  OneHiddenInput composite_input;  // at::native:: (today's path)
  OneHiddenData composite_data;
  OneHiddenInput cpu_input;  // at:: (dispatches to CPU for CPU tensors)
  OneHiddenData cpu_data;
};

template <const OneHidden& kind>
std::tuple<Tensor, Tensor> one_hidden_input(
    const Tensor& input, const Tensor& hx, TensorList params, bool has_biases, int64_t num_layers,
    double dropout, bool train, bool bidirectional, bool batch_first) {
  std::vector<Tensor> tensors{input, hx};
  tensors.insert(tensors.end(), params.begin(), params.end());
  const auto device = cpu_path_device(tensors);
  const int64_t per_layer = params_per_layer(params.size(), num_layers, bidirectional);
  if (!device || per_layer < 0) {
    return kind.composite_input(input, hx, params, has_biases, num_layers, dropout, train,
                                bidirectional, batch_first);
  }
  static const auto op = find_op(kind.op, "input");
  static const auto backward = find_op(kind.backward, "input");
  const int64_t directions = bidirectional ? 2 : 1;
  auto r = run_on_device(
      op, backward,
      {input, hx, params.vec(), has_biases, num_layers, dropout, train, bidirectional, batch_first},
      tensors, *device, [&](const std::vector<Tensor>& cpu) {
        const std::vector<Tensor> p = slice(cpu, 2, params.size());
        Tensor x = batch_first ? cpu[0].transpose(0, 1) : cpu[0];
        Layers layers{num_layers, dropout, train,
            [&](int64_t first, int64_t count, const Tensor& in) {
              auto [o, h] = kind.cpu_input(
                  in, cpu[1].narrow(0, first * directions, count * directions),
                  slice(p, first * per_layer, count * per_layer), has_biases, count,
                  count == num_layers ? dropout : 0.0, train, bidirectional, false);
              return std::vector<Tensor>{o, h};
            }};
        std::vector<Tensor> out = run_layers(layers, x, *device);
        if (batch_first) {
          out[0] = out[0].transpose(0, 1);
        }
        return out;
      });
  return {r[0], r[1]};
}

template <const OneHidden& kind>
std::tuple<Tensor, Tensor> one_hidden_data(
    const Tensor& data, const Tensor& batch_sizes, const Tensor& hx, TensorList params,
    bool has_biases, int64_t num_layers, double dropout, bool train, bool bidirectional) {
  std::vector<Tensor> tensors{data, hx};
  tensors.insert(tensors.end(), params.begin(), params.end());
  const auto device = cpu_path_device(tensors);
  const int64_t per_layer = params_per_layer(params.size(), num_layers, bidirectional);
  if (!device || per_layer < 0 || batch_sizes.device().type() != c10::kCPU) {
    return kind.composite_data(data, batch_sizes, hx, params, has_biases, num_layers, dropout,
                               train, bidirectional);
  }
  static const auto op = find_op(kind.op, "data");
  static const auto backward = find_op(kind.backward, "data");
  const int64_t directions = bidirectional ? 2 : 1;
  auto r = run_on_device(
      op, backward,
      {data, batch_sizes, hx, params.vec(), has_biases, num_layers, dropout, train, bidirectional},
      tensors, *device, [&](const std::vector<Tensor>& cpu) {
        const std::vector<Tensor> p = slice(cpu, 2, params.size());
        Layers layers{num_layers, dropout, train,
            [&](int64_t first, int64_t count, const Tensor& in) {
              auto [o, h] = kind.cpu_data(
                  in, batch_sizes, cpu[1].narrow(0, first * directions, count * directions),
                  slice(p, first * per_layer, count * per_layer), has_biases, count,
                  count == num_layers ? dropout : 0.0, train, bidirectional);
              return std::vector<Tensor>{o, h};
            }};
        return run_layers(layers, cpu[0], *device);
      });
  return {r[0], r[1]};
}

constexpr OneHidden kGru{"aten::gru", "torchneuron::gru_backward", &at::native::gru,
                         &at::native::gru, &at::gru, &at::gru};
constexpr OneHidden kRnnTanh{"aten::rnn_tanh", "torchneuron::rnn_tanh_backward",
                             &at::native::rnn_tanh, &at::native::rnn_tanh, &at::rnn_tanh,
                             &at::rnn_tanh};
constexpr OneHidden kRnnRelu{"aten::rnn_relu", "torchneuron::rnn_relu_backward",
                             &at::native::rnn_relu, &at::native::rnn_relu, &at::rnn_relu,
                             &at::rnn_relu};

void register_rnns(torch::Library& m) {
  m.impl("lstm.input", lstm_input);
  m.impl("lstm.data", lstm_data);
  m.impl("gru.input", one_hidden_input<kGru>);
  m.impl("gru.data", one_hidden_data<kGru>);
  m.impl("rnn_tanh.input", one_hidden_input<kRnnTanh>);
  m.impl("rnn_tanh.data", one_hidden_data<kRnnTanh>);
  m.impl("rnn_relu.input", one_hidden_input<kRnnRelu>);
  m.impl("rnn_relu.data", one_hidden_data<kRnnRelu>);
}

}  // namespace

// ==== Global Registration ====
// The backward ops exist to be counted and charged (no kernel: CpuGraphBackward
// runs them). Their arguments are the forward's.
TORCH_LIBRARY_FRAGMENT(torchneuron, m) {
  m.def("lstm_backward.input(Tensor input, Tensor[] hx, Tensor[] params, bool has_biases, "
        "int num_layers, float dropout, bool train, bool bidirectional, bool batch_first) -> ()");
  m.def("lstm_backward.data(Tensor data, Tensor batch_sizes, Tensor[] hx, Tensor[] params, "
        "bool has_biases, int num_layers, float dropout, bool train, bool bidirectional) -> ()");
  for (const char* mode : {"gru", "rnn_tanh", "rnn_relu"}) {
    const std::string name = std::string(mode) + "_backward";
    m.def(torch::schema((name + ".input(Tensor input, Tensor hx, Tensor[] params, "
        "bool has_biases, int num_layers, float dropout, bool train, bool bidirectional, "
        "bool batch_first) -> ()").c_str()));
    m.def(torch::schema((name + ".data(Tensor data, Tensor batch_sizes, Tensor hx, "
        "Tensor[] params, bool has_biases, int num_layers, float dropout, bool train, "
        "bool bidirectional) -> ()").c_str()));
  }
}

// Autograd sees these first; PrivateUse1 serves inference mode, which skips autograd.
TORCH_LIBRARY_IMPL(aten, AutogradPrivateUse1, m) {
  register_rnns(m);
}

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  register_rnns(m);
}

}  // namespace torchneuron
