// Unboxed kernels for the ops small models run most (elementwise arithmetic,
// matmuls, softmax and NLL loss, reductions): the fallback's work without
// its boxing. Checked against torch 2.13.0.
//
// The boxed fallback (fallback.cpp) serves every op, but boxing costs: each
// argument becomes an IValue, and copying a Python-owned tensor into one
// takes the GIL to keep its Python object alive (PyTorch's PyObject
// preservation), once when the stack is built and once when it is dropped.
// A 64x64 add spent about 6.7 k instructions there against CPU's 9.3 k in
// all. These kernels take their arguments as the dispatcher passes them (by
// reference), alias the neuron tensors as CPU tensors (CpuAliases: one CPU
// storage per neuron storage, so overlap checks behave as on CPU), call the
// CPU kernel unboxed, adopt fresh results, and count and charge the op as
// the fallback does, under the same cost key. Whatever they do not handle
// (an op real Trainium runs on the host, opt-in numerics, nested tensors)
// goes to the boxed fallback unchanged, as does every call under dataless execution.
#include "../core.h"
#include "alias_cache.h"

#include <ATen/Operators.h>
#include <ATen/core/boxing/KernelFunction.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include <optional>
#include <tuple>
#include <type_traits>

namespace torchneuron {
namespace {

const c10::DispatchKeySet kCpuKeys(c10::DispatchKey::CPU);

// What converting one call's arguments found out.
struct FastCall {
  c10::DeviceIndex device = -1;
  DtypeKey dtypes;
  uint64_t key = kHashSeed;  // the cost key, as costing.cpp's hash_value builds it
  bool boxed = false;  // an argument only the boxed fallback handles
  bool cuda_checks_devices = false;  // the op refuses CPU scalars, as CUDA's kernel does
  CpuAliases aliases;
};

// ---- arguments: the CPU kernel's view of each, hashed as charge_op hashes it ----

at::Tensor convert_tensor(FastCall& call, const at::Tensor& t, bool is_write) {
  if (C10_UNLIKELY(t.defined() && (t.is_nested() || t.layout() != c10::kStrided))) {
    call.boxed = true;  // nested and sparse tensors: the fallback's own paths
    return t;
  }
  hash_cost_tensor(call.key, t);
  if (!t.defined()) {
    return t;
  }
  add_operand_dtype(call.dtypes, t, /*in_list=*/false);
  const c10::Device device = t.device();
  if (device.type() == kNeuron) {
    join_device(call.device, device);
    return call.aliases.of(t);
  }
  if (device.is_cpu() && !is_write && t.dim() == 0) {
    // A CPU scalar operand, as CUDA accepts; where CUDA's kernel checks devices the
    // boxed fallback raises CUDA's error, naming the argument.
    call.boxed = call.boxed || call.cuda_checks_devices;
    return t;
  }
  device_mismatch(c10::Device(kNeuron, call.device == -1 ? 0 : call.device), device);
}

// Arguments are converted into this: tensors become their CPU aliases (held by
// value), everything else is passed through by reference.
template <typename T>
struct Converted {
  using type = const T&;
};
template <>
struct Converted<at::Tensor> {
  using type = at::Tensor;
};
template <>
struct Converted<std::optional<at::Tensor>> {
  using type = std::optional<at::Tensor>;
};
template <>
struct Converted<at::TensorList> {
  using type = std::vector<at::Tensor>;
};

// A foreach list: every tensor a neuron tensor, as a foreach kernel on neuron
// takes them (anything else: the boxed fallback decides). Dtypes count once
// per run of equal dtypes and the cost key hashes the list, as the fallback does.
std::vector<at::Tensor> convert_list(FastCall& call, at::TensorList list) {
  std::vector<at::Tensor> out;
  out.reserve(list.size());
  hash_cost_list(call.key);
  for (const at::Tensor& t : list) {
    if (!t.defined() || t.device().type() != kNeuron || t.is_nested() ||
        t.layout() != c10::kStrided) {
      call.boxed = true;
      return {};
    }
    hash_cost_tensor(call.key, t);
    add_operand_dtype(call.dtypes, t, /*in_list=*/true);
    join_device(call.device, t.device());
    out.push_back(call.aliases.of(t));
  }
  return out;
}

template <typename T>
typename Converted<std::decay_t<T>>::type convert(FastCall& call, T&& value) {
  using D = std::decay_t<T>;
  if constexpr (std::is_same_v<D, at::Tensor>) {
    constexpr bool is_write = std::is_same_v<T, at::Tensor&>;
    return convert_tensor(call, value, is_write);
  } else if constexpr (std::is_same_v<D, std::optional<at::Tensor>>) {
    if (!value.has_value()) {
      hash_cost_none(call.key);
      return std::nullopt;
    }
    return convert_tensor(call, *value, false);
  } else if constexpr (std::is_same_v<D, at::TensorList>) {
    return convert_list(call, value);
  } else {
    if constexpr (std::is_same_v<D, at::Scalar>) {
      hash_cost_scalar(call.key, value);
    } else if constexpr (std::is_same_v<D, at::ArrayRef<at::Scalar>>) {
      hash_cost_list(call.key);
      for (const at::Scalar& v : value) {
        hash_cost_scalar(call.key, v);
      }
    } else if constexpr (std::is_same_v<D, int64_t>) {
      hash_cost_int(call.key, value);
    } else if constexpr (std::is_same_v<D, c10::SymInt>) {
      hash_cost_int(call.key, value.guard_int(__FILE__, __LINE__));
    } else if constexpr (std::is_same_v<D, bool>) {
      hash_cost_bool(call.key, value);
    } else if constexpr (std::is_same_v<D, at::ScalarType>) {
      hash_cost_int(call.key, static_cast<int64_t>(value));
    } else if constexpr (std::is_same_v<D, std::optional<at::ScalarType>>) {
      if (value.has_value()) {
        hash_cost_int(call.key, static_cast<int64_t>(*value));
        call.dtypes.add(*value);  // a dtype= argument is part of the op's dtypes
      } else {
        hash_cost_none(call.key);
      }
    } else if constexpr (std::is_same_v<D, at::OptionalIntArrayRef>) {
      if (value.has_value()) {
        hash_cost_list(call.key);
        for (int64_t v : *value) {
          hash_cost_int(call.key, v);
        }
      } else {
        hash_cost_none(call.key);
      }
    } else if constexpr (std::is_same_v<D, c10::string_view>) {
      // strings are not part of the cost key
    } else {
      static_assert(!sizeof(D), "fastpath.cpp: no conversion for this argument type");
    }
    return value;
  }
}

// ---- results ----

at::Tensor adopt(at::Tensor cpu, c10::DeviceIndex device) {
  return cpu.defined() ? adopt_cpu_result(std::move(cpu), device) : cpu;
}

template <typename Ret>
struct Results;

template <>
struct Results<at::Tensor> {  // a fresh result (or an unannounced view: adopt keeps aliasing)
  template <typename First>
  static at::Tensor back(at::Tensor cpu, First&, c10::DeviceIndex device) {
    return adopt(std::move(cpu), device);
  }
};

template <>
struct Results<at::Tensor&> {  // in place: the caller's tensor, written through its alias
  template <typename First>
  static at::Tensor& back(const at::Tensor&, First& self, c10::DeviceIndex) {
    return self;
  }
};

template <>
struct Results<std::tuple<at::Tensor, at::Tensor>> {
  template <typename First>
  static std::tuple<at::Tensor, at::Tensor> back(
      std::tuple<at::Tensor, at::Tensor> cpu, First&, c10::DeviceIndex device) {
    return {adopt(std::move(std::get<0>(cpu)), device), adopt(std::move(std::get<1>(cpu)), device)};
  }
};

template <>
struct Results<std::vector<at::Tensor>> {
  template <typename First>
  static std::vector<at::Tensor> back(std::vector<at::Tensor> cpu, First&, c10::DeviceIndex device) {
    for (at::Tensor& t : cpu) {
      t = adopt(std::move(t), device);
    }
    return cpu;
  }
};

std::vector<c10::IValue> as_ivalues(const std::vector<at::Tensor>& list) {
  return {c10::IValue(list)};
}
std::vector<c10::IValue> as_ivalues(const at::Tensor& t) {
  return {c10::IValue(t)};
}
std::vector<c10::IValue> as_ivalues(const std::tuple<at::Tensor, at::Tensor>& t) {
  return {c10::IValue(std::get<0>(t)), c10::IValue(std::get<1>(t))};
}

// An argument as the boxed fallback would have seen it (for the cost model, on a miss).
template <typename T>
c10::IValue to_ivalue(const T& value) {
  if constexpr (std::is_same_v<T, at::ArrayRef<at::Scalar>>) {
    c10::impl::GenericList list(c10::AnyType::get());
    for (const at::Scalar& v : value) {
      list.push_back(c10::IValue(v));
    }
    return list;
  } else {
    return c10::IValue(value);
  }
}

template <typename Op, typename Schema = typename Op::schema>
struct FastKernel;

template <typename Op, typename Ret, typename... Args>
struct FastKernel<Op, Ret(Args...)> {
  static const c10::OperatorHandle& handle() {
    static const c10::OperatorHandle op =
        c10::Dispatcher::singleton().findSchemaOrThrow(Op::name, Op::overload_name);
    return op;
  }

  static Ret boxed(c10::DispatchKeySet keys, Args... args) {
    static const c10::BoxedKernel fallback = c10::BoxedKernel::makeFromFunction<&neuron_fallback>();
    return c10::impl::BoxedKernelWrapper<Ret(Args...)>::call(
        fallback, handle(), keys, std::forward<Args>(args)...);
  }

  static Ret call(c10::DispatchKeySet keys, Args... args) {
    if (C10_UNLIKELY(dataless_active())) {
      return boxed(keys, std::forward<Args>(args)...);  // the fallback's dataless path
    }
    check_not_in_bad_fork();
    run_backward_on_calling_thread();
    FastCall call;
    static const bool checks_devices = op_info(handle().schema()).cuda_device_check != 0;
    call.cuda_checks_devices = checks_devices;
    std::optional<AliasLending> lending(std::in_place);  // only while converting
    // Converted in argument order (braced initialisation), each to its CPU view.
    std::tuple<typename Converted<std::decay_t<Args>>::type...> converted{
        convert(call, std::forward<Args>(args))...};
    lending.reset();
    if (call.boxed || numerics_active()) {
      return boxed(keys, std::forward<Args>(args)...);
    }
    if (call.device == -1) {
      call.device = current_device();
    }
    const c10::OperatorHandle& op = handle();
    OpRecord& record = op_record(op, call.dtypes);
    if (record.fallback) {  // placement, warnings, strict mode and bytes: the fallback's
      return boxed(keys, std::forward<Args>(args)...);
    }
    record.calls.fetch_add(1, std::memory_order_relaxed);
    auto run_cpu = [&]() -> std::decay_t<Ret> {
      RouteAllocations route(call.device);
      return std::apply(
          [](auto&... cpu_args) -> std::decay_t<Ret> {
            return Op::redispatch(kCpuKeys, cpu_args...);
          },
          converted);
    };
    auto inputs = [&] { return std::vector<c10::IValue>{to_ivalue(args)...}; };
    if constexpr (std::is_void_v<Ret>) {  // in-place foreach: written through the aliases
      run_cpu();
      charge_op_keyed(op, record, call.device, call.key, [&] {
        return std::make_pair(inputs(), std::vector<c10::IValue>{});
      });
    } else {
      std::decay_t<Ret> cpu_result = run_cpu();
      auto&& first = std::get<0>(std::forward_as_tuple(args...));
      decltype(auto) result = Results<Ret>::back(std::move(cpu_result), first, call.device);
      charge_op_keyed(op, record, call.device, call.key,
                      [&] { return std::make_pair(inputs(), as_ivalues(result)); });
      return result;
    }
  }
};

template <typename Op>
void register_fast(torch::Library& m) {
  std::string name = std::string(Op::name).substr(6);  // drop "aten::"
  if (Op::overload_name[0] != '\0') {
    name += std::string(".") + Op::overload_name;
  }
  m.impl(name.c_str(), torch::CppFunction::makeFromUnboxedFunction(
                           TORCH_FN(FastKernel<Op>::call)));
}

}  // namespace

// ==== Global Registration ====
TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  // elementwise arithmetic
  register_fast<at::_ops::add_Tensor>(m);
  register_fast<at::_ops::add__Tensor>(m);
  register_fast<at::_ops::sub_Tensor>(m);
  register_fast<at::_ops::sub__Tensor>(m);
  register_fast<at::_ops::mul_Tensor>(m);
  register_fast<at::_ops::mul__Tensor>(m);
  register_fast<at::_ops::div_Tensor>(m);
  register_fast<at::_ops::div__Tensor>(m);
  register_fast<at::_ops::addcmul_>(m);
  register_fast<at::_ops::addcdiv_>(m);
  register_fast<at::_ops::lerp__Scalar>(m);
  register_fast<at::_ops::pow_Tensor_Scalar>(m);
  register_fast<at::_ops::fill__Scalar>(m);
  register_fast<at::_ops::zero_>(m);
  // activations and their gradients
  register_fast<at::_ops::relu>(m);
  register_fast<at::_ops::threshold_backward>(m);
  register_fast<at::_ops::silu>(m);
  register_fast<at::_ops::silu_backward>(m);
  register_fast<at::_ops::gelu>(m);
  register_fast<at::_ops::gelu_backward>(m);
  register_fast<at::_ops::neg>(m);
  register_fast<at::_ops::exp>(m);
  register_fast<at::_ops::sqrt>(m);
  register_fast<at::_ops::rsqrt>(m);
  register_fast<at::_ops::tanh>(m);
  register_fast<at::_ops::sigmoid>(m);
  // matmuls
  register_fast<at::_ops::mm>(m);
  register_fast<at::_ops::addmm>(m);
  register_fast<at::_ops::bmm>(m);
  // foreach (torch.optim's default path, clip_grad_norm_, zero_grad)
  register_fast<at::_ops::_foreach_add__Scalar>(m);
  register_fast<at::_ops::_foreach_add__List>(m);
  register_fast<at::_ops::_foreach_add__ScalarList>(m);
  register_fast<at::_ops::_foreach_sub__Scalar>(m);
  register_fast<at::_ops::_foreach_mul__Scalar>(m);
  register_fast<at::_ops::_foreach_mul__List>(m);
  register_fast<at::_ops::_foreach_mul__ScalarList>(m);
  register_fast<at::_ops::_foreach_mul__Tensor>(m);
  register_fast<at::_ops::_foreach_div__Scalar>(m);
  register_fast<at::_ops::_foreach_div__ScalarList>(m);
  register_fast<at::_ops::_foreach_div__List>(m);
  register_fast<at::_ops::_foreach_addcmul__Scalar>(m);
  register_fast<at::_ops::_foreach_addcmul__ScalarList>(m);
  register_fast<at::_ops::_foreach_addcdiv__Scalar>(m);
  register_fast<at::_ops::_foreach_addcdiv__ScalarList>(m);
  register_fast<at::_ops::_foreach_lerp__Scalar>(m);
  register_fast<at::_ops::_foreach_lerp__List>(m);
  register_fast<at::_ops::_foreach_maximum__List>(m);
  register_fast<at::_ops::_foreach_sqrt>(m);
  register_fast<at::_ops::_foreach_sqrt_>(m);
  register_fast<at::_ops::_foreach_neg>(m);
  register_fast<at::_ops::_foreach_zero_>(m);
  register_fast<at::_ops::_foreach_add_Scalar>(m);
  register_fast<at::_ops::_foreach_mul_Scalar>(m);
  register_fast<at::_ops::_foreach_div_ScalarList>(m);
  register_fast<at::_ops::_foreach_norm_Scalar>(m);
  // reductions, softmax, loss
  register_fast<at::_ops::sum_dim_IntList>(m);
  register_fast<at::_ops::mean_dim>(m);
  register_fast<at::_ops::_softmax>(m);
  register_fast<at::_ops::_softmax_backward_data>(m);
  register_fast<at::_ops::_log_softmax>(m);
  register_fast<at::_ops::_log_softmax_backward_data>(m);
  register_fast<at::_ops::nll_loss_forward>(m);
  register_fast<at::_ops::nll_loss_backward>(m);
}

}  // namespace torchneuron
