// Where cached CPU aliases may be lent (alias_cache.cpp): while a call converts its
// arguments, in the unboxed fast path and in the boxed fallback. Checked against torch 2.13.0.
//
// A loan must end before the neuron tensor that owns the cache dies. The fast path's
// arguments are references the caller holds for the whole call; the fallback's call
// state keeps its arguments (`originals`) until after the loans are returned. With the
// opposite order, a temporary whose last holder was the call (fft.hfft's composite)
// freed its cache while lent: heap corruption in conformance, now a regression test.
#pragma once

namespace torchneuron {

class AliasLending {
 public:
  AliasLending() : previous_(enabled_) { enabled_ = true; }
  ~AliasLending() { enabled_ = previous_; }
  AliasLending(const AliasLending&) = delete;
  AliasLending& operator=(const AliasLending&) = delete;
  static bool enabled() { return enabled_; }

 private:
  static thread_local bool enabled_;
  bool previous_;
};

}  // namespace torchneuron
