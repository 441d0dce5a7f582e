// Reusable CPU alias tensors: one per neuron tensor, lent to one op call at a
// time. Checked against torch 2.13.0.
//
// Every op hands its CPU kernel CPU tensors over the neuron tensors' memory
// (CpuAliases, fallback.cpp). Making a TensorImpl, setting its sizes and
// strides and freeing it again took about 1 k instructions per argument: a
// third of what a 64x64 add costs on top of CPU. A neuron tensor is usually
// an argument many times (weights every step, activations forward and
// backward), so each keeps its CPU TensorImpl in its BackendMeta slot (neuron
// tensors keep no other backend metadata: backend_meta.cpp) and lends it out.
//
// Each cache also keeps its alias's CPU storage over the neuron storage, so a
// call normally makes no CPU storage either (making, swapping and retiring one
// per argument was ~500 instructions of a 64x64 add). Views of one neuron
// storage still share one CPU storage within a call (the first lender's), so
// the CPU kernel's overlap checks see them. A kept storage references only the
// neuron storage its tensor already holds, so it keeps no device memory alive
// longer, except across set_(), which forgets the cache (forget_cached_alias).
// Between loans it holds no reference to the neuron storage (make_idle, taken
// back on the next loan): a neuron storage's use count is then what it is on
// CUDA, which decides whether autograd accumulates a gradient in place.
// It is checked on every loan against the neuron storage's current bytes
// (resize_, out= resizing and FSDP's storage.resize_(0) replace them) and
// renewed when stale. The alias's metadata is compared with the neuron
// tensor's on every loan and reset when it differs (the neuron tensor was
// resized or restrided, or the kernel changed the alias). An alias the kernel
// kept a reference to is never lent again.
#include "alias_cache.h"

#include "../core.h"

#include <c10/core/InferenceMode.h>

#include <atomic>
#include <mutex>
#include <typeinfo>

namespace torchneuron {

thread_local bool AliasLending::enabled_ = false;

namespace {

struct AliasCache final : c10::BackendMeta {
  std::atomic<bool> lent{false};
  at::Tensor alias;  // undefined until first lent; keeps its CPU storage between loans

  // A shallow copy of the neuron tensor (detach, .data) has other metadata
  // over time: it makes its own cache when first used.
  c10::intrusive_ptr<c10::BackendMeta> clone(
      const c10::intrusive_ptr<c10::BackendMeta>&) const override {
    return {};
  }
};

std::mutex& creation_mutex() {
  static std::mutex mutex;
  return mutex;
}

// The neuron tensor's cache, made on first use (once, even when two threads
// use a new tensor at the same time); null if its slot holds something else.
AliasCache* cache_of(c10::TensorImpl* impl) {
  c10::BackendMeta* meta = impl->get_backend_meta();
  if (C10_UNLIKELY(meta == nullptr)) {
    std::lock_guard<std::mutex> lock(creation_mutex());
    meta = impl->get_backend_meta();
    if (meta == nullptr) {
      impl->set_backend_meta(c10::make_intrusive<AliasCache>());
      meta = impl->get_backend_meta();
    }
  }
  // Nothing else may fill the slot (backend_meta.cpp refuses), but check cheaply.
  return typeid(*meta) == typeid(AliasCache) ? static_cast<AliasCache*>(meta) : nullptr;
}

bool same_view(const c10::TensorImpl& a, const c10::TensorImpl& b) {
  return a.storage_offset() == b.storage_offset() && a.sizes() == b.sizes() &&
         a.strides() == b.strides();
}

}  // namespace

at::Tensor cpu_tensor_over(c10::Storage cpu_storage, const at::Tensor& t) {
  const c10::DispatchKeySet cpu_keys(c10::DispatchKey::CPU);
  auto out = at::detail::make_tensor<c10::TensorImpl>(std::move(cpu_storage), cpu_keys, t.dtype());
  out.unsafeGetTensorImpl()->set_sizes_and_strides(
      t.sizes(), t.strides(), t.storage_offset());
  if (t.is_neg()) {
    out._set_neg(true);
  }
  if (t.is_conj()) {
    out._set_conj(true);
  }
  return out;
}

at::Tensor borrow_cached_alias(const at::Tensor& t, const c10::Storage* call_storage,
                               c10::BackendMeta** lender) {
  c10::TensorImpl* impl = t.unsafeGetTensorImpl();
  if (!AliasLending::enabled() || C10_UNLIKELY(typeid(*impl) != typeid(c10::TensorImpl))) {
    return {};  // nested and other TensorImpl subclasses: no plain sizes and strides
  }
  AliasCache* cache = cache_of(impl);
  if (cache == nullptr || cache->lent.exchange(true, std::memory_order_acquire)) {
    return {};  // lent to another thread's call: that call keeps it
  }
  *lender = cache;
  c10::StorageImpl* storage = t.storage().unsafeGetStorageImpl();
  if (!cache->alias.defined() || cache->alias.is_inference() != c10::InferenceMode::is_enabled()) {
    // First loan, or one made on the other side of an InferenceMode boundary
    // (an inference tensor has no autograd keys and no version counter): new.
    cache->alias = cpu_tensor_over(
        call_storage != nullptr ? *call_storage : cpu_storage_over(storage), t);
    return cache->alias;
  }
  c10::TensorImpl* alias = cache->alias.unsafeGetTensorImpl();
  if (call_storage != nullptr) {  // a view of a storage the call already aliases
    if (alias->storage().unsafeGetStorageImpl() != call_storage->unsafeGetStorageImpl()) {
      alias->set_storage_and_dtype(*call_storage, t.dtype());
    }
  } else if ((!rearm_if_over(*alias->storage().unsafeGetStorageImpl(), storage) &&
              !is_cpu_storage_over(*alias->storage().unsafeGetStorageImpl(), storage)) ||
             alias->dtype() != t.dtype()) {
    alias->set_storage_and_dtype(cpu_storage_over(storage), t.dtype());
  }
  if (!same_view(*alias, *impl)) {
    alias->set_sizes_and_strides(t.sizes(), t.strides(), t.storage_offset());
  }
  alias->_set_neg(t.is_neg());
  alias->_set_conj(t.is_conj());
  return cache->alias;
}

void return_cached_alias(c10::BackendMeta* lender, at::Tensor& borrowed) {
  auto* cache = static_cast<AliasCache*>(lender);
  // The cache and `borrowed` hold it; anything else means the kernel kept it.
  const bool kept_elsewhere = borrowed.use_count() != 2 || borrowed.weak_use_count() != 1;
  if (kept_elsewhere) {
    cache->alias = at::Tensor();  // its holder keeps it, with its storage
  } else if (borrowed.storage().use_count() == 1) {
    make_idle(*borrowed.storage().unsafeGetStorageImpl());  // only the alias holds it
  }
  borrowed = at::Tensor();
  cache->lent.store(false, std::memory_order_release);
}

void forget_cached_alias(const at::Tensor& t) {
  c10::BackendMeta* meta = t.unsafeGetTensorImpl()->get_backend_meta();
  if (meta == nullptr || typeid(*meta) != typeid(AliasCache)) {
    return;
  }
  auto* cache = static_cast<AliasCache*>(meta);
  if (!cache->lent.exchange(true, std::memory_order_acquire)) {  // a lent one is renewed on its next loan
    cache->alias = at::Tensor();
    cache->lent.store(false, std::memory_order_release);
  }
}

}  // namespace torchneuron
