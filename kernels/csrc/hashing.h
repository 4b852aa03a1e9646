// Hashing primitives shared by every torchrec_ascend kernel (CPU now, NPU later): the bits they produce are part of
// the contract (row placement across ranks, initial rows, checkpoints), so they live in one place and kernels/
// reference.py mirrors them exactly.
#pragma once

#include <cstdint>

namespace torchrec_ascend {

// Marks an empty bucket in an ID map; IDs are non-negative, so it can never be a key.
constexpr int64_t kEmptyKey = -1;
// Weyl-sequence increment of splitmix64 (2**64 / golden ratio, odd).
constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ULL;

// splitmix64 finaliser: a bijection on 64 bits whose every output bit depends on every input bit.
inline uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

// Rank that owns an ID under row-wise hash placement.
inline int64_t hash_rank_of(int64_t id, int64_t world_size) {
  return static_cast<int64_t>(mix64(static_cast<uint64_t>(id)) % static_cast<uint64_t>(world_size));
}

// Home bucket of a key in a table of 2**(64 - shift) buckets. It takes the TOP bits of the mix because hash_rank_of
// uses the low ones (mod world_size): with the low bits, all IDs of one rank would share their buckets' low bits and
// pile up in 1/world_size of the table.
inline uint64_t home_bucket(int64_t key, int shift) {
  return mix64(static_cast<uint64_t>(key)) >> shift;
}

}  // namespace torchrec_ascend
