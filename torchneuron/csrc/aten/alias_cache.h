// Where cached CPU aliases may be lent (alias_cache.cpp). Checked against torch 2.13.0.
//
// Only the unboxed fast path lends them: its arguments are references the
// caller holds for the whole call, so a neuron tensor (and the cache it owns)
// outlives the loan. The boxed fallback does not: conformance's fft.hfft
// crashed (heap corruption when a temporary's cache was freed) with lending
// there, not yet explained; until it is, the fallback makes fresh aliases.
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
