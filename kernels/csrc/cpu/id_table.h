// Open-addressing view over an ID map's `buckets` tensor: linear probing, keys and slots interleaved (one cache line
// serves both), backward-shift deletion so no tombstones ever accumulate.
#pragma once

#include <ATen/core/Tensor.h>

#include <algorithm>

#include "../hashing.h"

namespace torchrec_ascend {

// How many IDs ahead the batch loops prefetch their home buckets; hides DRAM latency on tables larger than the cache.
constexpr int64_t kPrefetchDistance = 64;

class IdTable {
 public:
  explicit IdTable(const at::Tensor& buckets)
      : entries_(buckets.data_ptr<int64_t>()),
        mask_(static_cast<uint64_t>(buckets.size(0)) - 1),
        shift_(64 - __builtin_ctzll(static_cast<uint64_t>(buckets.size(0)))) {}

  uint64_t home(int64_t key) const {
    return home_bucket(key, shift_);
  }

  template <int kForWrite>
  void prefetch_bucket(uint64_t b) const {
    __builtin_prefetch(entries_ + 2 * b, kForWrite, 1);
  }

  // The bucket holding `key`, or else the empty bucket that ends its probe sequence (where it would be inserted).
  uint64_t find(int64_t key) const {
    return find_from(home(key), key);
  }

  // find(), given the key's home bucket `b`.
  uint64_t find_from(uint64_t b, int64_t key) const {
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

// The home buckets of ids[i + 1, i + kLookahead] while a loop visits ids[i]: each ID is hashed once, when it
// enters the window, and its bucket prefetched then, so kLookahead probes are in flight behind the current one.
template <int64_t kLookahead, int kForWrite>
class HomeWindow {
  static_assert((kLookahead & (kLookahead - 1)) == 0, "the window is a ring indexed by i mod kLookahead");

 public:
  HomeWindow(const IdTable& table, const int64_t* ids, int64_t begin, int64_t end)
      : table_(table), ids_(ids), end_(end) {
    for (int64_t i = begin; i < std::min(end, begin + kLookahead); ++i) {
      push(i);
    }
  }

  // The home of ids[i] (each i once, in increasing order); ids[i + kLookahead] takes its place in the window.
  uint64_t take(int64_t i) {
    const uint64_t b = ring_[i & (kLookahead - 1)];
    if (i + kLookahead < end_) {
      push(i + kLookahead);
    }
    return b;
  }

 private:
  void push(int64_t i) {
    const uint64_t b = table_.home(ids_[i]);
    table_.template prefetch_bucket<kForWrite>(b);
    ring_[i & (kLookahead - 1)] = b;
  }

  const IdTable& table_;
  const int64_t* ids_;
  int64_t end_;
  uint64_t ring_[kLookahead];
};

}  // namespace torchrec_ascend
