// Partitioned open-addressing buckets of the KEY_VALUE key indexes (torchrec_ascend/kernels/key_value/key_index.py
// owns the arrays and documents the layout): `partitions` regions of `stride` buckets each, region p using its first
// sizes[p] buckets (0: the partition is empty). A bucket is an unsigned integer: 0 empty, all ones a tombstone,
// anything else an entry. Linear probing from a home bucket, wrapping inside the region; a probe ends at an empty
// bucket. A partition is rebuilt on its own (without tombstones, at load low_load) before an insert would fill more
// than max_load of its buckets, so the table never holds a second copy of more than one partition.
#pragma once

#include <ATen/core/Tensor.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "../hashing.h"

namespace torchrec_ascend {

constexpr int64_t kMinBuckets = 8;
// Entries ahead whose home's inputs a rebuild prefetches (see OpenTable::make_room's `prefetch`).
constexpr size_t kRehashAhead = 16;

// make_room's default `prefetch`: homes computed from the entry alone need nothing fetched.
struct NoPrefetch {
  template <typename T>
  void operator()(T) const {}
};

// The hash every key index uses: splitmix64 of key + the Weyl increment (key_index.py's mix64).
inline uint64_t index_hash(int64_t key) {
  return mix64(static_cast<uint64_t>(key) + kGolden);
}

// floor(fraction * size / 2**bits): a `bits`-bit hash mapped onto [0, size).
inline int64_t scale_to(uint64_t fraction, int bits, int64_t size) {
  return static_cast<int64_t>((fraction * static_cast<uint64_t>(size)) >> bits);
}

// Buckets a partition gets when rebuilt for `keys` keys (key_index.py's OpenTable sizing rule).
inline int64_t rebuilt_size(int64_t keys, double low_load) {
  return std::max<int64_t>(kMinBuckets, static_cast<int64_t>(std::ceil(static_cast<double>(keys) / low_load)) + 1);
}

template <typename T>
class OpenTable {
 public:
  static constexpr T kTomb = static_cast<T>(~static_cast<T>(0));

  // `buckets` is int32 (T = uint32_t) or int64 (T = uint64_t) [partitions * stride]; the others int64 [partitions].
  OpenTable(const at::Tensor& buckets, const at::Tensor& sizes, const at::Tensor* live, const at::Tensor* used)
      : buckets_(reinterpret_cast<T*>(buckets.data_ptr())),
        partitions_(sizes.numel()),
        stride_(buckets.numel() / sizes.numel()),
        size_(sizes.data_ptr<int64_t>()),
        live_(live ? live->data_ptr<int64_t>() : nullptr),
        used_(used ? used->data_ptr<int64_t>() : nullptr) {}

  int64_t partitions() const {
    return partitions_;
  }
  int64_t stride() const {
    return stride_;
  }
  int64_t size(int64_t p) const {
    return size_[p];
  }
  T* region(int64_t p) const {
    return buckets_ + p * stride_;
  }
  T at(int64_t global) const {
    return buckets_[global];
  }
  void prefetch(int64_t p, int64_t home) const {
    __builtin_prefetch(region(p) + home, 0, 1);
  }

  // The global bucket of the first entry from `position` on (in partition p) that `match(entry)` accepts, else -1.
  template <typename Match>
  int64_t find(int64_t p, int64_t position, Match&& match) const {
    const int64_t size = size_[p];
    if (size == 0) {
      return -1;
    }
    const T* r = region(p);
    for (int64_t pos = position;; pos = pos + 1 == size ? 0 : pos + 1) {
      const T entry = r[pos];
      if (entry == 0) {
        return -1;
      }
      if (entry != kTomb && match(entry)) {
        return p * stride_ + pos;
      }
    }
  }

  // Stores `entry` (of a key known to be absent) in the first free bucket from `home` on.
  int64_t insert(int64_t p, int64_t home, T entry) {
    T* r = region(p);
    const int64_t size = size_[p];
    for (int64_t pos = home;; pos = pos + 1 == size ? 0 : pos + 1) {
      const T old = r[pos];
      if (old == 0 || old == kTomb) {
        used_[p] += old == 0;
        live_[p] += 1;
        r[pos] = entry;
        return p * stride_ + pos;
      }
    }
  }

  // insert(), but the probe first runs to its end: if `same(entry)` accepts an entry on it, nothing is stored and
  // the result is -2 - (that entry's global bucket).
  template <typename Same>
  int64_t insert_absent(int64_t p, int64_t home, T entry, Same&& same) {
    T* r = region(p);
    const int64_t size = size_[p];
    int64_t free = -1;
    for (int64_t pos = home;; pos = pos + 1 == size ? 0 : pos + 1) {
      const T old = r[pos];
      if (old == 0 || old == kTomb) {
        free = free < 0 ? pos : free;
        if (old == 0) {
          break;
        }
      } else if (same(old)) {
        return -2 - (p * stride_ + pos);
      }
    }
    used_[p] += r[free] == 0;
    live_[p] += 1;
    r[free] = entry;
    return p * stride_ + free;
  }

  void erase(int64_t global) {
    buckets_[global] = kTomb;
    live_[global / stride_] -= 1;
  }

  // Whether `incoming` more keys would fill partition p past max_load (make_room would rebuild it).
  bool over_load(int64_t p, int64_t incoming, double max_load) const {
    return incoming && static_cast<double>(used_[p] + incoming) > max_load * static_cast<double>(size_[p]);
  }

  // Rebuilds the partitions that `incoming[p]` more keys would fill past max_load. Returns -1, or (changing
  // nothing) the first partition that would need more than `stride` buckets. `home_of(entry, size)` is an entry's
  // home at a new size; `prefetch(entry)` is called kRehashAhead entries before it, for homes that read memory.
  template <typename HomeOf, typename Prefetch = NoPrefetch>
  int64_t make_room(
      const std::vector<int64_t>& incoming, double max_load, double low_load, HomeOf&& home_of,
      Prefetch&& prefetch = Prefetch{}) {
    std::vector<int64_t> due;
    for (int64_t p = 0; p < partitions_; ++p) {
      if (over_load(p, incoming[p], max_load)) {
        if (rebuilt_size(live_[p] + incoming[p], low_load) > stride_) {
          return p;
        }
        due.push_back(p);
      }
    }
    for (const int64_t p : due) {
      rehash(p, rebuilt_size(live_[p] + incoming[p], low_load), home_of, prefetch);
    }
    return -1;
  }

 private:
  // Rebuilds partition p with `size` buckets and no tombstones; pages no longer used go back to the system.
  template <typename HomeOf, typename Prefetch>
  void rehash(int64_t p, int64_t size, HomeOf&& home_of, Prefetch&& prefetch) {
    T* r = region(p);
    const int64_t old_size = size_[p];
    std::vector<T> entries;
    entries.reserve(static_cast<size_t>(live_[p]));
    for (int64_t i = 0; i < old_size; ++i) {
      if (r[i] != 0 && r[i] != kTomb) {
        entries.push_back(r[i]);
      }
    }
    std::memset(r, 0, static_cast<size_t>(old_size) * sizeof(T));
    if (size < old_size) {
      release(r + size, r + old_size);
    }
    size_[p] = size;
    live_[p] = used_[p] = 0;
    for (size_t i = 0; i < entries.size(); ++i) {
      if (i + kRehashAhead < entries.size()) {
        prefetch(entries[i + kRehashAhead]);
      }
      insert(p, home_of(entries[i], size), entries[i]);
    }
  }

  // The whole pages inside [begin, end) of the anonymous mapping: discarded, they read 0 again.
  static void release(T* begin, T* end) {
    const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
    const uintptr_t first = (reinterpret_cast<uintptr_t>(begin) + page - 1) / page * page;
    const uintptr_t last = reinterpret_cast<uintptr_t>(end) / page * page;
    if (last > first) {
      madvise(reinterpret_cast<void*>(first), last - first, MADV_DONTNEED);
    }
  }

  T* buckets_;
  int64_t partitions_;
  int64_t stride_;
  int64_t* size_;
  int64_t* live_;
  int64_t* used_;
};

}  // namespace torchrec_ascend
