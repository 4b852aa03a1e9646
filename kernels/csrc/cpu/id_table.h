// Open-addressing view over an ID map's `buckets` tensor: linear probing, keys and slots interleaved (one cache line
// serves both), backward-shift deletion so no tombstones ever accumulate.
#pragma once

#include <ATen/ATen.h>

#include "../hashing.h"

namespace torchrec_ascend {

// How many IDs ahead the batch loops prefetch their home buckets; hides DRAM latency on tables larger than the cache.
constexpr int64_t kPrefetchDistance = 16;

class IdTable {
 public:
  explicit IdTable(const at::Tensor& buckets)
      : entries_(buckets.data_ptr<int64_t>()),
        mask_(static_cast<uint64_t>(buckets.size(0)) - 1),
        shift_(64 - __builtin_ctzll(static_cast<uint64_t>(buckets.size(0)))) {}

  void prefetch(int64_t key, int for_write) const {
    __builtin_prefetch(entries_ + 2 * home_bucket(key, shift_), for_write, 1);
  }

  // The bucket holding `key`, or else the empty bucket that ends its probe sequence (where it would be inserted).
  uint64_t find(int64_t key) const {
    uint64_t b = home_bucket(key, shift_);
    while (true) {
      const int64_t k = entries_[2 * b];
      if (k == key || k == kEmptyKey) {
        return b;
      }
      b = (b + 1) & mask_;
    }
  }

  int64_t key(uint64_t b) const {
    return entries_[2 * b];
  }
  int64_t slot(uint64_t b) const {
    return entries_[2 * b + 1];
  }
  void set(uint64_t b, int64_t key, int64_t slot) {
    entries_[2 * b] = key;
    entries_[2 * b + 1] = slot;
  }

  // Empties bucket `hole`, then shifts later members of its cluster back so every key stays reachable from its home.
  void erase(uint64_t hole) {
    for (uint64_t j = (hole + 1) & mask_; entries_[2 * j] != kEmptyKey; j = (j + 1) & mask_) {
      const uint64_t home = home_bucket(entries_[2 * j], shift_);
      // `hole` lies on j's probe path [home, j] iff it is at least as far from j as home is.
      if (((j - home) & mask_) >= ((j - hole) & mask_)) {
        set(hole, entries_[2 * j], entries_[2 * j + 1]);
        hole = j;
      }
    }
    set(hole, kEmptyKey, kEmptyKey);
  }

 private:
  int64_t* entries_;
  uint64_t mask_;
  int shift_;
};

}  // namespace torchrec_ascend
