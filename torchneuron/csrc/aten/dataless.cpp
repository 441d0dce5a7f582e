// Dataless execution: neuron ops run their shape logic only. Checked against torch 2.13.0.
//
// While the switch is on (torchneuron.dataless, TORCHNEURON_DATALESS=1), every op that
// reaches the neuron backend comes here instead of running its CPU kernel:
//  1. Each neuron argument becomes a meta tensor with its sizes, strides, offset and
//     dtype, over one meta storage per neuron storage (aliasing is seen as on the
//     device); CPU scalars and indices become meta tensors too, a neuron `device=`
//     becomes meta, generators are dropped. Devices are checked as the fallback checks
//     them, and the op is counted under the fallback's key (placement, strict mode).
//  2. The op's Meta kernel runs (structured ops' meta functions, Python meta
//     registrations). Ops without one, and ops whose result shapes depend on values
//     (nonzero, masked_select, unique...), ask Python's rules (device/dataless_rules.py).
//  3. Results go back per the schema: in-place and out= results are the caller's
//     tensors (resized if the meta kernel resized them), views are views of the
//     argument's neuron storage, and fresh results get neuron storages from the
//     caching allocator that hold no values (allocator.cpp) -- the same sizes the
//     normal run allocates, so memory statistics, peaks and OOM are the normal run's.
//  4. The op is charged its modelled time with the same arguments and results as in a
//     normal run, so the cost model sees the same calls.
// Reading a value never computed (.item(), a copy to the host) gives a placeholder and
// is noted with its call site (Python: device/dataless.py). A few ops tell what their
// results hold without data (fills; finite checks, as dataless values are assumed
// finite), so that `if torch.isfinite(loss)` and GradScaler's found_inf read what a
// healthy run reads.
#include "../core.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/CPUAllocator.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/jit/python/pybind_utils.h>
#include <torch/csrc/utils/pybind.h>

#include <cmath>
#include <limits>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>

namespace torchneuron {

std::atomic<int> g_dataless_depth{0};

namespace {

using c10::IValue;

const c10::DispatchKeySet kMetaKeys(c10::DispatchKey::Meta);
constexpr double kUnknown = std::numeric_limits<double>::quiet_NaN();

// What an op tells about the values of its results without data.
enum class ValueRule : uint8_t {
  kNone,  // nothing: results and written arguments hold unknown values
  kTrue,  // every result element is true (isfinite of finite values)
  kFalse,  // ... false (isnan, isinf)
  kSame,  // a result holds the known value of argument 0 (copies, reductions of a uniform tensor)
  kNot,  // the logical negation of argument 0's
  kAnd,  // logical and of arguments 0 and 1's
  kOr,  // logical or
  kFill,  // fill_(self, value): self holds `value`
  kZero,  // zero_(self)
  kUnscale,  // _amp_foreach_non_finite_check_and_unscale_: finite values leave found_inf as it was
  kEq,  // eq: a tensor equals itself; a finite value never equals inf or nan
  kNe,  // ne: the negation of kEq
  kMul,  // the product of arguments 0 and 1's (for bools: and)
  kAbs,  // the absolute value of argument 0's
};

ValueRule value_rule_of(const std::string& name) {
  static const std::unordered_map<std::string, ValueRule> rules = {
      {"aten::isfinite", ValueRule::kTrue},
      {"aten::isnan", ValueRule::kFalse},
      {"aten::isinf", ValueRule::kFalse},
      {"aten::isposinf", ValueRule::kFalse},
      {"aten::isneginf", ValueRule::kFalse},
      {"aten::logical_not", ValueRule::kNot},
      {"aten::bitwise_not", ValueRule::kNot},
      {"aten::logical_and", ValueRule::kAnd},
      {"aten::bitwise_and", ValueRule::kAnd},
      {"aten::logical_or", ValueRule::kOr},
      {"aten::bitwise_or", ValueRule::kOr},
      {"aten::all", ValueRule::kSame},
      {"aten::any", ValueRule::kSame},
      {"aten::amax", ValueRule::kSame},
      {"aten::amin", ValueRule::kSame},
      {"aten::max", ValueRule::kSame},
      {"aten::min", ValueRule::kSame},
      {"aten::clone", ValueRule::kSame},
      {"aten::_to_copy", ValueRule::kSame},
      {"aten::fill_", ValueRule::kFill},
      {"aten::zero_", ValueRule::kZero},
      {"aten::_amp_foreach_non_finite_check_and_unscale_", ValueRule::kUnscale},
      {"aten::eq", ValueRule::kEq},
      {"aten::ne", ValueRule::kNe},
      {"aten::mul", ValueRule::kMul},
      {"aten::abs", ValueRule::kAbs},
  };
  auto it = rules.find(name);
  return it == rules.end() ? ValueRule::kNone : it->second;
}

// How an op's results are found: its Meta kernel, or Python's rules.
struct DatalessOp {
  std::atomic<bool> python_rule{false};
  ValueRule value = ValueRule::kNone;
};

py::object* g_shape_rules = nullptr;  // leaked on purpose, as the other Python hooks
py::object* g_read_observer = nullptr;
// Ops whose results Python shapes, named by Python once (data-dependent shapes).
std::unordered_map<std::string, bool>* g_python_ops = nullptr;

std::string op_name(const c10::OperatorHandle& op) {
  const auto& name = op.operator_name();
  return name.overload_name.empty() ? name.name : name.name + "." + name.overload_name;
}

thread_local ThreadCache<DatalessOp> t_dataless_ops;

DatalessOp& dataless_op(const c10::OperatorHandle& op) {
  return t_dataless_ops.get(&op.schema(), 0, 1, [&]() -> DatalessOp& {
    static std::mutex mutex;
    static auto& known = *new std::unordered_map<const c10::FunctionSchema*, DatalessOp>();
    std::lock_guard<std::mutex> lock(mutex);
    auto it = known.find(&op.schema());
    if (it == known.end()) {
      it = known.try_emplace(&op.schema()).first;  // node-based: stable addresses
      it->second.value = value_rule_of(op.operator_name().name);
      bool python = false;
      {
        py::gil_scoped_acquire gil;
        if (g_python_ops != nullptr) {
          auto found = g_python_ops->find(op.operator_name().name);
          python = found != g_python_ops->end() && found->second;
        }
      }
      it->second.python_rule.store(python);
    }
    return it->second;
  });
}

// ---- arguments: meta stand-ins of the neuron tensors --------------------------

struct MetaCall {
  c10::SmallVector<IValue, 6> originals;  // arguments before conversion
  c10::DeviceIndex device = -1;
  DtypeKey dtypes;
  // One meta storage per storage an argument uses (neuron ones map back to the device).
  c10::SmallVector<std::pair<c10::StorageImpl*, c10::Storage>, 4> storages;
  // Storages the op allocated fresh, and the neuron storage each became.
  c10::SmallVector<std::pair<c10::StorageImpl*, c10::Storage>, 2> fresh;
  c10::SmallVector<std::pair<at::Tensor, at::Tensor>, 4> written;  // (a!) neuron arguments, metas
  bool counted_fallback = false;
};

const c10::Storage& meta_storage(MetaCall& call, c10::StorageImpl* storage) {
  for (const auto& [seen, meta] : call.storages) {
    if (seen == storage) {
      return meta;
    }
  }
  call.storages.emplace_back(
      storage, c10::Storage(c10::Storage::use_byte_size_t(), storage->nbytes(),
                            c10::GetAllocator(c10::kMeta), /*resizable=*/true));
  return call.storages.back().second;
}

at::Tensor meta_like(const c10::Storage& storage, const at::Tensor& t) {
  at::Tensor meta = at::detail::make_tensor<c10::TensorImpl>(
      c10::Storage(storage), kMetaKeys, t.dtype());
  auto* impl = meta.unsafeGetTensorImpl();
  impl->set_sizes_and_strides(t.sizes(), t.strides(), t.storage_offset());
  meta._set_neg(t.is_neg());
  meta._set_conj(t.is_conj());
  if (t.unsafeGetTensorImpl()->is_wrapped_number()) {
    impl->set_wrapped_number(true);  // Python numbers keep their type-promotion rules
  }
  return meta;
}

// The meta stand-in of a tensor argument; CPU tensors are accepted where the fallback
// accepts them (0-dim scalars anywhere, indices in lists), and only as inputs.
at::Tensor meta_tensor(const at::Tensor& t, MetaCall& call, bool cpu_allowed, bool is_write,
                       bool in_list) {
  if (!t.defined()) {
    return t;
  }
  add_operand_dtype(call.dtypes, t, in_list);
  TORCH_CHECK_NOT_IMPLEMENTED(
      !t.is_nested() && t.layout() == c10::kStrided,
      "Dataless execution (torchneuron.dataless) supports strided tensors; this op got a ",
      t.is_nested() ? "nested" : "sparse", " tensor. Run this part of the program without "
      "dataless execution.");
  const auto device = t.device();
  if (device.type() == kNeuron) {
    join_device(call.device, device);
  } else if (device.is_cpu() && !is_write && t.dim() == 0) {
    return t;  // a CPU scalar: Meta kernels take it as CPU kernels do (its value too)
  } else if (!(device.is_cpu() && !is_write && cpu_allowed) && device.type() != c10::kMeta) {
    device_mismatch(c10::Device(kNeuron, call.device == -1 ? 0 : call.device), device);
  }
  return meta_like(meta_storage(call, t.storage().unsafeGetStorageImpl()), t);
}

IValue meta_argument(const IValue& v, bool is_write, MetaCall& call) {
  if (v.isTensor()) {
    return meta_tensor(v.toTensor(), call, false, is_write, false);
  }
  if (v.isTensorList()) {
    c10::List<at::Tensor> out;
    for (const at::Tensor& t : v.toTensorList()) {
      out.push_back(meta_tensor(t, call, false, is_write, /*in_list=*/true));
    }
    return out;
  }
  if (v.isList()) {  // e.g. Tensor?[] indices
    auto list = v.toList();
    if (list.size() == 0) {
      return v;
    }
    c10::impl::GenericList out(list.elementType());
    for (const IValue& e : list) {
      out.push_back(e.isTensor() ? IValue(meta_tensor(e.toTensor(), call, true, is_write, true))
                                 : e);
    }
    return out;
  }
  if (v.isDevice() && v.toDevice().type() == kNeuron) {
    if (call.device == -1 && v.toDevice().index() >= 0) {
      call.device = v.toDevice().index();
    }
    return c10::Device(c10::kMeta);
  }
  if (v.isGenerator()) {
    return IValue();  // no values are drawn
  }
  return v;
}

// ---- results: neuron tensors over storages without values --------------------

// The neuron storage a meta storage of this call stands for: an argument's, or a fresh
// one (allocated once per meta storage) sized as the meta kernel sized it.
c10::Storage neuron_storage_for(const c10::Storage& meta, MetaCall& call) {
  c10::StorageImpl* impl = meta.unsafeGetStorageImpl();
  for (const auto& [neuron, stand_in] : call.storages) {
    if (stand_in.unsafeGetStorageImpl() == impl && neuron->device_type() == kNeuron) {
      return c10::Storage(c10::intrusive_ptr<c10::StorageImpl>::reclaim_copy(neuron));
    }
  }
  for (const auto& [seen, neuron] : call.fresh) {
    if (seen == impl) {
      return neuron;
    }
  }
  const size_t nbytes = impl->nbytes();
  c10::Storage neuron(c10::make_intrusive<c10::StorageImpl>(
      c10::StorageImpl::use_byte_size_t(), nbytes, allocate_on(call.device, nbytes),
      device_allocator(), /*resizable=*/true));
  call.fresh.emplace_back(impl, neuron);
  return neuron;
}

at::Tensor neuron_result(const at::Tensor& meta, MetaCall& call) {
  if (!meta.defined()) {
    return meta;
  }
  TORCH_CHECK_NOT_IMPLEMENTED(
      meta.layout() == c10::kStrided && !meta.is_nested(),
      "Dataless execution (torchneuron.dataless) supports strided results; this op returned a ",
      meta.layout(), " tensor.");
  TORCH_INTERNAL_ASSERT(meta.device().type() == c10::kMeta,
                        "a dataless shape rule returned a tensor on ", meta.device());
  return neuron_tensor_over(neuron_storage_for(meta.storage(), call), meta);
}

IValue neuron_return(const IValue& v, MetaCall& call) {
  if (v.isTensor()) {
    return neuron_result(v.toTensor(), call);
  }
  if (v.isTensorList()) {
    c10::List<at::Tensor> out;
    for (const at::Tensor& t : v.toTensorList()) {
      out.push_back(neuron_result(t, call));
    }
    return out;
  }
  return v;
}

// Gives an (a!) argument what the meta kernel did to its stand-in: a larger storage if
// it was resized (out=), its sizes, strides and offset.
void write_back(const at::Tensor& neuron, const at::Tensor& meta, c10::DeviceIndex device) {
  c10::StorageImpl* storage = neuron.storage().unsafeGetStorageImpl();
  const size_t needed = meta.storage().nbytes();
  if (needed > storage->nbytes()) {
    storage->set_data_ptr_noswap(allocate_on(neuron.device().index(), needed));
    storage->set_nbytes(needed);
  }
  if (neuron.sizes() != meta.sizes() || neuron.strides() != meta.strides() ||
      neuron.storage_offset() != meta.storage_offset()) {
    neuron.unsafeGetTensorImpl()->set_sizes_and_strides(meta.sizes(), meta.strides(),
                                                        meta.storage_offset());
  }
}

// ---- known values -------------------------------------------------------------

// Whether `t` covers every byte of its storage (so a fill of `t` is a fill of the storage).
bool covers_storage(const at::Tensor& t) {
  return t.storage_offset() == 0 && t.is_non_overlapping_and_dense() &&
      static_cast<size_t>(t.numel()) * t.itemsize() == t.storage().nbytes();
}

// The value every element of `v` (a tensor argument) is known to hold, or NaN.
double known_of(const IValue& v) {
  if (!v.isTensor() || !v.toTensor().defined() || !v.toTensor().has_storage()) {
    return kUnknown;
  }
  c10::StorageImpl* storage = v.toTensor().storage().unsafeGetStorageImpl();
  const double* value = known_value(*storage);
  return value == nullptr ? kUnknown : *value;
}

void set_known(const at::Tensor& t, double value) {
  if (!t.defined() || !t.has_storage() || !covers_storage(t)) {
    return;
  }
  if (double* slot = known_value(*t.storage().unsafeGetStorageImpl())) {
    *slot = value;
  }
}

double truth(double v) {
  return std::isnan(v) ? kUnknown : (v != 0 ? 1.0 : 0.0);
}

// Whether eq(arg 0, arg 1) holds everywhere (1), nowhere (0) or is unknown (NaN): a
// tensor equals itself and a finite value never equals inf or nan (dataless values are
// assumed finite); else both sides must be known.
double equality(const MetaCall& call) {
  if (call.originals.size() < 2 || !call.originals[0].isTensor()) {
    return kUnknown;
  }
  const at::Tensor& a = call.originals[0].toTensor();
  const IValue& other = call.originals[1];
  const double known_a = known_of(call.originals[0]);
  if (other.isScalar()) {
    const double b = other.toScalar().toDouble();
    if (std::isinf(b) || std::isnan(b)) {
      return 0.0;
    }
    return std::isnan(known_a) ? kUnknown : (known_a == b ? 1.0 : 0.0);
  }
  if (!other.isTensor() || !other.toTensor().defined()) {
    return kUnknown;
  }
  const at::Tensor& b = other.toTensor();
  if (a.is_same(b) || (a.has_storage() && b.has_storage() && a.is_alias_of(b) &&
                       a.sizes() == b.sizes() && a.strides() == b.strides() &&
                       a.storage_offset() == b.storage_offset() && a.dtype() == b.dtype())) {
    return 1.0;
  }
  const double known_b = known_of(other);
  return std::isnan(known_a) || std::isnan(known_b) ? kUnknown : (known_a == known_b ? 1.0 : 0.0);
}

// What the rule says every fresh result holds, or NaN.
double result_value(ValueRule rule, const MetaCall& call) {
  const auto arg = [&](size_t i) {
    return i < call.originals.size() ? known_of(call.originals[i]) : kUnknown;
  };
  switch (rule) {
    case ValueRule::kTrue:
      return 1.0;
    case ValueRule::kFalse:
      return 0.0;
    case ValueRule::kSame:  // unary (max.other and the like compare two tensors: unknown)
      return call.originals.size() > 1 && call.originals[1].isTensor() ? kUnknown : arg(0);
    case ValueRule::kNot:
      return std::isnan(arg(0)) ? kUnknown : (arg(0) == 0 ? 1.0 : 0.0);
    case ValueRule::kAnd: {
      const double a = truth(arg(0)), b = truth(arg(1));
      return (a == 0 || b == 0) ? 0.0 : (a == 1 && b == 1 ? 1.0 : kUnknown);
    }
    case ValueRule::kEq:
    case ValueRule::kNe: {
      const double eq = equality(call);
      return std::isnan(eq) || rule == ValueRule::kEq ? eq : 1.0 - eq;
    }
    case ValueRule::kMul: {
      const double a = arg(0), b = arg(1);
      return (a == 0 || b == 0) ? 0.0 : a * b;  // NaN (unknown) unless both are known
    }
    case ValueRule::kAbs:
      return std::fabs(arg(0));
    case ValueRule::kOr: {
      const double a = truth(arg(0)), b = truth(arg(1));
      return (a == 1 || b == 1) ? 1.0 : (a == 0 && b == 0 ? 0.0 : kUnknown);
    }
    default:
      return kUnknown;
  }
}

// ---- Python: shape rules and reads --------------------------------------------

[[noreturn]] void rethrow_python(py::error_already_set& e, const std::string& context) {
  const std::string message = context + e.what();
  if (e.matches(PyExc_NotImplementedError)) {
    TORCH_CHECK_NOT_IMPLEMENTED(false, message);
  }
  if (e.matches(PyExc_ValueError)) {
    TORCH_CHECK_VALUE(false, message);
  }
  if (e.matches(PyExc_TypeError)) {
    TORCH_CHECK_TYPE(false, message);
  }
  TORCH_CHECK(false, message);
}

bool python_not_implemented(const python_error& e) {
  py::gil_scoped_acquire gil;
  return e.type != nullptr && PyErr_GivenExceptionMatches(e.type, PyExc_NotImplementedError);
}

// Runs Python's shape rule for `op` on the meta arguments; pushes its results.
void run_python_rule(const c10::OperatorHandle& op, c10::ArrayRef<IValue> meta_args,
                     torch::jit::Stack* stack) {
  const auto& returns = op.schema().returns();
  py::gil_scoped_acquire gil;
  TORCH_CHECK_NOT_IMPLEMENTED(g_shape_rules != nullptr,
                              op_name(op), " has no Meta kernel and dataless execution has no "
                              "shape rules registered");
  try {
    py::tuple args(meta_args.size());
    for (size_t i = 0; i < meta_args.size(); ++i) {
      args[i] = torch::jit::toPyObject(meta_args[i]);
    }
    py::object out = (*g_shape_rules)(op_name(op), args);
    py::tuple results = py::reinterpret_borrow<py::tuple>(out);
    TORCH_INTERNAL_ASSERT(results.size() == returns.size(), "dataless rule for ", op_name(op),
                          " returned ", results.size(), " values for ", returns.size(),
                          " returns");
    for (size_t r = 0; r < returns.size(); ++r) {
      stack->push_back(torch::jit::toIValue(results[r], returns[r].type()));
    }
  } catch (py::error_already_set& e) {
    rethrow_python(e, "");
  }
}

}  // namespace

void dataless_fallback(const c10::OperatorHandle& op, c10::DispatchKeySet,
                       torch::jit::Stack* stack) {
  check_not_in_bad_fork();
  run_backward_on_calling_thread();
  const auto& schema = op.schema();
  const OpInfo& info = op_info(schema);
  const size_t num_args = schema.arguments().size();
  const size_t begin = stack->size() - num_args;

  MetaCall call;
  call.originals.reserve(num_args);
  for (size_t i = 0; i < num_args; ++i) {
    IValue& slot = (*stack)[begin + i];
    call.originals.push_back(slot);
    if (slot.isNone()) {
      continue;
    }
    const auto& arg = schema.arguments()[i];
    if (slot.isInt() && arg.name() == "dtype") {
      call.dtypes.add(static_cast<c10::ScalarType>(slot.toInt()));
    }
    slot = meta_argument(slot, info.arg_is_write[i], call);
    if (info.arg_is_write[i]) {
      const IValue& orig = call.originals.back();
      if (orig.isTensor() && orig.toTensor().device().type() == kNeuron) {
        call.written.emplace_back(orig.toTensor(), slot.toTensor());
      } else if (orig.isTensorList()) {
        auto olist = orig.toTensorList();
        auto mlist = slot.toTensorList();
        for (size_t j = 0; j < olist.size(); ++j) {
          if (olist.get(j).defined() && olist.get(j).device().type() == kNeuron) {
            call.written.emplace_back(olist.get(j), mlist.get(j));
          }
        }
      }
    }
  }
  if (call.device == -1) {
    call.device = current_device();
  }
  OpRecord& record = account_op(op, call.dtypes, call.originals, &call.counted_fallback);

  DatalessOp& rules = dataless_op(op);
  std::vector<IValue> meta_args(stack->begin() + begin, stack->end());
  if (rules.python_rule.load(std::memory_order_relaxed)) {
    stack->resize(begin);
    run_python_rule(op, meta_args, stack);
  } else {
    bool shaped = true;
    try {
      op.redispatchBoxed(kMetaKeys, stack);
    } catch (const c10::NotImplementedError&) {
      shaped = false;
    } catch (python_error& e) {  // a Python meta registration raised
      if (!python_not_implemented(e)) {
        throw;
      }
      shaped = false;
    } catch (py::error_already_set& e) {
      bool not_implemented;
      {
        py::gil_scoped_acquire gil;
        not_implemented = e.matches(PyExc_NotImplementedError);
      }
      if (!not_implemented) {
        throw;
      }
      shaped = false;
    }
    if (!shaped) {
      // No Meta kernel: Python's rules shape this op from now on. A Meta kernel that
      // stopped at a data-dependent step (a boolean mask): Python shapes this call.
      if (!op.hasKernelForDispatchKey(c10::DispatchKey::Meta)) {
        rules.python_rule.store(true, std::memory_order_relaxed);
      }
      stack->resize(begin);
      run_python_rule(op, meta_args, stack);
    }
  }

  for (const auto& [neuron, meta] : call.written) {
    write_back(neuron, meta, call.device);
    if (rules.value == ValueRule::kUnscale &&
        meta.unsafeGetTensorImpl() == meta_args[1].toTensor().unsafeGetTensorImpl()) {
      continue;  // found_inf: finite values find no inf, so it holds what it held
    }
    mark_without_values(*neuron.storage().unsafeGetStorageImpl());
  }
  if (rules.value == ValueRule::kFill && !call.written.empty()) {
    const IValue& fill = call.originals[1];
    set_known(call.written[0].first, fill.isScalar() ? fill.toScalar().toDouble() : known_of(fill));
  } else if (rules.value == ValueRule::kZero && !call.written.empty()) {
    set_known(call.written[0].first, 0.0);
  }

  const size_t num_returns = info.return_arg.size();
  const size_t out_begin = stack->size() - num_returns;
  const double fresh_value = result_value(rules.value, call);
  for (size_t r = 0; r < num_returns; ++r) {
    IValue& slot = (*stack)[out_begin + r];
    const int arg = info.return_arg[r];
    if (arg >= 0 && info.return_is_write[r]) {
      slot = call.originals[arg];  // in-place / out=: the caller's tensor, written back
    } else {
      slot = neuron_return(slot, call);
    }
    // The first result holds what the rule says (max.dim's indices, the second, do not).
    if (r == 0 && !std::isnan(fresh_value) && slot.isTensor() && (arg < 0 || info.return_is_write[r])) {
      set_known(slot.toTensor(), fresh_value);
    }
    if (call.counted_fallback) {
      record.bytes_out.fetch_add(neuron_bytes(slot), std::memory_order_relaxed);
    }
  }
  charge_op(op, record, call.device, call.originals,
            c10::ArrayRef<IValue>(stack->data() + out_begin, num_returns));
}

at::Tensor meta_alias(const at::Tensor& t) {
  TORCH_CHECK_NOT_IMPLEMENTED(!t.is_nested() && t.layout() == c10::kStrided,
                              "Dataless execution (torchneuron.dataless) supports strided tensors");
  return meta_like(c10::Storage(c10::Storage::use_byte_size_t(), t.storage().nbytes(),
                                c10::GetAllocator(c10::kMeta), /*resizable=*/true),
                   t);
}

at::Tensor adopt_meta_result(const at::Tensor& meta, c10::DeviceIndex device) {
  MetaCall call;
  call.device = device;
  return neuron_result(meta, call);
}

void check_holds_values(const at::Tensor& t, const char* what) {
  if (C10_LIKELY(g_storages_without_values.load(std::memory_order_relaxed) == 0) ||
      dataless_active() || !t.has_storage()) {
    return;
  }
  const c10::StorageImpl* storage = t.storage().unsafeGetStorageImpl();
  TORCH_CHECK(storage == nullptr || holds_values(*storage),
              "This neuron tensor (shape ", t.sizes(), ", ", t.dtype(), ") holds no values: it "
              "was made or last written under dataless execution (torchneuron.dataless or "
              "TORCHNEURON_DATALESS=1), which computes shapes, memory and modelled time but no "
              "data, so ", what, " would read meaningless bytes. Use it only inside dataless "
              "execution, or compute it again outside.");
}

namespace {

// The placeholder of a read of `t`: its known value, else Python's placeholder (0);
// Python notes the call site either way. Caller holds the GIL.
double placeholder(const at::Tensor& t, const char* what) {
  const double value = known_of(t);
  if (g_read_observer == nullptr || g_read_observer->is_none()) {
    return std::isnan(value) ? 0.0 : value;
  }
  try {
    py::object known = std::isnan(value) ? py::none() : py::cast(value);
    return (*g_read_observer)(what, py::cast(t.sizes().vec()), dtype_name(t.scalar_type()),
                              known).cast<double>();
  } catch (py::error_already_set& e) {
    rethrow_python(e, "");
  }
}

}  // namespace

c10::Scalar dataless_scalar(const at::Tensor& t, const char* what) {
  double v;
  {
    py::gil_scoped_acquire gil;
    v = placeholder(t, what);
  }
  if (t.scalar_type() == c10::kBool) {
    return c10::Scalar(v != 0);
  }
  if (c10::isIntegralType(t.scalar_type(), /*includeBool=*/false)) {
    return c10::Scalar(static_cast<int64_t>(v));
  }
  if (c10::isComplexType(t.scalar_type())) {
    return c10::Scalar(c10::complex<double>(v, 0));
  }
  return c10::Scalar(v);
}

void fill_dataless_read(at::Tensor& cpu_dst, const at::Tensor& neuron_src) {
  cpu_dst.fill_(dataless_scalar(neuron_src, "copy to the host"));
}

void bind_dataless(py::module_& m) {
  m.def("_dataless_enter", []() { g_dataless_depth.fetch_add(1); },
        "Turns dataless execution on (nested calls count).");
  m.def("_dataless_exit", []() {
    TORCH_CHECK(g_dataless_depth.load() > 0, "dataless execution is not on");
    g_dataless_depth.fetch_sub(1);
  }, "Undoes one _dataless_enter.");
  m.def("_dataless_active", []() { return dataless_active(); });
  m.def("_holds_values", [](const at::Tensor& t) {
    return !t.has_storage() || holds_values(*t.storage().unsafeGetStorageImpl());
  }, "False if the tensor's storage was made or last written under dataless execution.");
  m.def("_known_value", [](const at::Tensor& t) -> py::object {
    const double v = known_of(t);
    return std::isnan(v) ? py::none() : py::cast(v);
  }, "The value every element of a dataless tensor is known to hold, or None.");
  m.def("_mark_without_values", [](const at::Tensor& t) {
    if (t.has_storage()) {
      mark_without_values(*t.storage().unsafeGetStorageImpl());
    }
  }, "Marks a tensor's storage as holding no values (a dataless write).");
  m.def("_check_holds_values", [](const at::Tensor& t, const std::string& what) {
    check_holds_values(t, what.c_str());
  }, "Outside dataless execution, raises if the tensor holds no values (the op path's wording).");
  m.def("_meta_alias", [](const at::Tensor& t) {
    TORCH_CHECK_TYPE(t.device().type() == kNeuron, "_meta_alias expects a neuron tensor, got one on ",
                     t.device());
    return meta_alias(t);
  }, "A meta tensor with a neuron tensor's sizes, strides, offset and dtype.");
  m.def("_storages_without_values", []() {
    return g_storages_without_values.load();
  }, "How many live storages hold no values.");
  m.def("_set_dataless_hooks", [](py::object shape_rules, py::object read_observer,
                                  std::vector<std::string> python_ops) {
    if (g_shape_rules == nullptr) {
      g_shape_rules = new py::object();
      g_read_observer = new py::object();
      g_python_ops = new std::unordered_map<std::string, bool>();
    }
    *g_shape_rules = std::move(shape_rules);
    *g_read_observer = std::move(read_observer);
    for (const auto& name : python_ops) {
      (*g_python_ops)[name] = true;
    }
  }, "Sets Python's shape rules (op name, meta args) -> results, its read observer "
     "(what, shape, dtype, known value or None) -> placeholder, and the ops (by base "
     "name) whose results its rules always shape.");
}

}  // namespace torchneuron
