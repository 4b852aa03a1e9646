// CPU kernels of the KEY_VALUE key indexes (see open_table.h for the bucket layout). The arrays belong to
// torchrec_ascend/kernels/key_value/key_index.py (address space reserved with mmap, memory spent page by page):
// the kernels read and write them in place and never copy more than one partition.
//
// * key_index_*: the host tier's key -> slot index. A bucket is a uint32 slot + 1 (passed as int32); the key of a
//   slot is key_column[slot]. Key k lives in partition mix(k) & (partitions - 1), home bucket
//   (mix(k) >> 32) * size >> 32. An insert checks that its keys are absent and distinct; upsert and pop are the host
//   store's put and pop, handing out and freeing slots on its free-slot stack and stamping them.
// * fingerprint_*: the disk tier's index. A bucket is a uint64 (passed as int64) whose top `fingerprint_bits` are a
//   fingerprint of the key's hash and whose low bits locate its record; the caller hashes, and verifies candidates
//   against the records. Home bucket: fingerprint * size >> fingerprint_bits.
#include <ATen/ops/empty.h>
#include <ATen/ops/scalar_tensor.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <initializer_list>
#include <limits>
#include <tuple>
#include <vector>

#include "../ops.h"
#include "open_table.h"

namespace torchrec_ascend {

namespace {

constexpr int64_t kAhead = 16;  // keys ahead whose home buckets are prefetched

void check_index_state(
    const at::Tensor& buckets,
    at::ScalarType bucket_type,
    const at::Tensor& sizes,
    std::initializer_list<const at::Tensor*> counters,
    const char* op) {
  TORCH_CHECK_VALUE(
      sizes.dim() == 1 && sizes.scalar_type() == at::kLong && sizes.is_contiguous() && sizes.numel() > 0 &&
          (sizes.numel() & (sizes.numel() - 1)) == 0,
      op, ": `sizes` must be a contiguous int64 [partitions] tensor with partitions a power of two, got ",
      sizes.scalar_type(), " ", sizes.sizes(), "; pass the state of one key index");
  TORCH_CHECK_VALUE(
      buckets.dim() == 1 && buckets.scalar_type() == bucket_type && buckets.is_contiguous() &&
          buckets.numel() % sizes.numel() == 0 && buckets.numel() / sizes.numel() >= kMinBuckets,
      op, ": `buckets` must be a contiguous ", bucket_type, " [partitions * stride] tensor with stride >= ",
      kMinBuckets, ", got ", buckets.scalar_type(), " ", buckets.sizes(), " for ", sizes.numel(),
      " partitions; pass the state of one key index");
  for (const at::Tensor* counter : counters) {
    TORCH_CHECK_VALUE(
        counter->dim() == 1 && counter->scalar_type() == at::kLong && counter->is_contiguous() &&
            counter->numel() == sizes.numel(),
        op, ": the live and used counts must be contiguous int64 [", sizes.numel(), "] tensors like `sizes`, got ",
        counter->scalar_type(), " ", counter->sizes());
  }
  const int64_t stride = buckets.numel() / sizes.numel();
  const int64_t* size = sizes.data_ptr<int64_t>();
  for (int64_t p = 0; p < sizes.numel(); ++p) {
    TORCH_CHECK(
        size[p] == 0 || (kMinBuckets <= size[p] && size[p] <= stride), op, ": partition ", p, " has size ", size[p],
        ", outside {0} and [", kMinBuckets, ", ", stride, "]; the index state is corrupted");
  }
}

void check_key_column(const at::Tensor& key_column, const char* op) {
  check_1d_int64(key_column, op, "key_column");
  TORCH_CHECK_VALUE(key_column.is_contiguous(), op, ": `key_column` must be contiguous");
}

// The host index's slot state: free_slots int32 [max_slots] (a stack), counts int64 [3] (slots on the stack, slots
// handed out, the most slots the stack has held), stamps int32 [max_slots] or empty (no per-slot stamps).
void check_slot_state(
    const at::Tensor& free_slots, const at::Tensor& counts, const at::Tensor& stamps, const at::Tensor& key_column,
    const char* op) {
  const int64_t slots = key_column.numel();
  TORCH_CHECK_VALUE(
      free_slots.dim() == 1 && free_slots.scalar_type() == at::kInt && free_slots.is_contiguous() &&
          free_slots.numel() == slots,
      op, ": `free_slots` must be a contiguous int32 [", slots, "] tensor like `key_column`, got ",
      free_slots.scalar_type(), " ", free_slots.sizes());
  TORCH_CHECK_VALUE(
      counts.dim() == 1 && counts.scalar_type() == at::kLong && counts.is_contiguous() && counts.numel() == 3, op,
      ": `counts` must be a contiguous int64 [3] tensor (free, handed out, most free), got ", counts.scalar_type(), " ",
      counts.sizes());
  TORCH_CHECK_VALUE(
      stamps.dim() == 1 && stamps.scalar_type() == at::kInt && stamps.is_contiguous() &&
          (stamps.numel() == 0 || stamps.numel() >= slots),
      op, ": `stamps` must be a contiguous int32 tensor of at least ", slots, " elements (or empty), got ",
      stamps.scalar_type(), " ", stamps.sizes());
  const int64_t* count = counts.data_ptr<int64_t>();
  TORCH_CHECK(
      0 <= count[0] && count[0] <= count[1] && count[1] <= slots && count[0] <= count[2] && count[2] <= slots, op,
      ": counts (", count[0], ", ", count[1], ", ", count[2], ") are not free <= handed out <= ", slots,
      " and free <= most free <= ", slots, "; the index state is corrupted");
}

// An entry's home in a rebuilt partition of the host index: from its key, read from the key column at random, so
// rebuilds prefetch it ahead (make_room's `prefetch`).
struct HostHome {
  const int64_t* key;
  int64_t operator()(uint32_t e, int64_t size) const {
    return scale_to(index_hash(key[e - 1]) >> 32, 32, size);
  }
  void operator()(uint32_t e) const {
    __builtin_prefetch(key + e - 1, 0, 1);
  }
};

// Partition and home of each key of the host index (homes at the current sizes).
struct Placement {
  std::vector<int64_t> part;
  std::vector<int64_t> home;
};

template <typename T, typename Hash>
Placement place(const OpenTable<T>& table, int64_t n, Hash&& hash_of, int bits) {
  Placement out{std::vector<int64_t>(n), std::vector<int64_t>(n)};
  const uint64_t mask = static_cast<uint64_t>(table.partitions() - 1);
  for (int64_t i = 0; i < n; ++i) {
    const uint64_t h = hash_of(i);
    out.part[i] = static_cast<int64_t>(h & mask);
    out.home[i] = scale_to(h >> (64 - bits), bits, table.size(out.part[i]));
  }
  return out;
}

// Prefetches, for the key kAhead places on, its home bucket and, for the key half as far on, the keys of the
// entries along its probe (its buckets are in cache by then; up to kChainPrefetch of them): a probe compares a key
// per entry it meets, each a cache miss in the key column, so they are fetched together, not one after another.
// That matters most for a key that is absent (every insert, most lookups of a cache tier): at load 0.8 its probe
// meets about 12 buckets.
constexpr int64_t kChainPrefetch = 16;

inline void prefetch_ahead(
    const OpenTable<uint32_t>& table, const Placement& where, const int64_t* key, int64_t key_len, int64_t i,
    int64_t n) {
  if (i + kAhead < n) {
    table.prefetch(where.part[i + kAhead], where.home[i + kAhead]);
  }
  const int64_t j = i + kAhead / 2;
  if (j < n && table.size(where.part[j]) > 0) {
    const uint32_t* r = table.region(where.part[j]);
    const int64_t size = table.size(where.part[j]);
    int64_t pos = where.home[j];
    for (int64_t step = 0; step < kChainPrefetch; ++step, pos = pos + 1 == size ? 0 : pos + 1) {
      const uint32_t e = r[pos];
      if (e == 0) {
        break;
      }
      if (e != OpenTable<uint32_t>::kTomb && e <= key_len) {
        __builtin_prefetch(key + e - 1, 0, 1);
      }
    }
  }
}

// The host index's find of each in[i].
template <typename Visit>
void for_each_found(
    const OpenTable<uint32_t>& table, const int64_t* key, int64_t key_len, const int64_t* in, int64_t n,
    const char* op, Visit&& visit) {
  const Placement where = place(table, n, [&](int64_t i) { return index_hash(in[i]); }, 32);
  for (int64_t i = 0; i < n; ++i) {
    prefetch_ahead(table, where, key, key_len, i, n);
    const int64_t b = table.find(where.part[i], where.home[i], [&](uint32_t e) {
      TORCH_CHECK(e <= key_len, op, ": a bucket holds slot ", e - 1, " beyond the key column; the state is corrupted");
      return key[e - 1] == in[i];
    });
    visit(i, b);
  }
}

}  // namespace

at::Tensor key_index_lookup_cpu(
    const at::Tensor& buckets, const at::Tensor& sizes, const at::Tensor& key_column, const at::Tensor& keys_arg) {
  constexpr const char* op = "key_index_lookup";
  check_index_state(buckets, at::kInt, sizes, {}, op);
  check_key_column(key_column, op);
  check_1d_int64(keys_arg, op, "keys");
  const at::Tensor keys = keys_arg.contiguous();
  const int64_t n = keys.numel();
  at::Tensor slots = at::empty({n}, keys.options());
  int64_t* out = slots.data_ptr<int64_t>();
  const OpenTable<uint32_t> table(buckets, sizes, nullptr, nullptr);
  for_each_found(
      table, key_column.data_ptr<int64_t>(), key_column.numel(), keys.data_ptr<int64_t>(), n, op,
      [&](int64_t i, int64_t b) { out[i] = b < 0 ? -1 : static_cast<int64_t>(table.at(b)) - 1; });
  return slots;
}

at::Tensor key_index_insert_cpu(
    const at::Tensor& buckets,
    const at::Tensor& sizes,
    const at::Tensor& live,
    const at::Tensor& used,
    const at::Tensor& key_column,
    const at::Tensor& slots_arg,
    double max_load,
    double low_load) {
  constexpr const char* op = "key_index_insert";
  check_index_state(buckets, at::kInt, sizes, {&live, &used}, op);
  check_key_column(key_column, op);
  check_1d_int64(slots_arg, op, "slots");
  const at::Tensor slots = slots_arg.contiguous();
  const int64_t n = slots.numel();
  const int64_t* slot = slots.data_ptr<int64_t>();
  const int64_t* key = key_column.data_ptr<int64_t>();
  const int64_t key_len = key_column.numel();
  for (int64_t i = 0; i < n; ++i) {
    TORCH_CHECK_VALUE(
        0 <= slot[i] && slot[i] < key_len && slot[i] < int64_t{0xFFFFFFFE}, op, ": slot ", slot[i], " (position ", i,
        ") is outside the key column [0, ", key_len, "); hand out slots below the index's capacity");
  }
  OpenTable<uint32_t> table(buckets, sizes, &live, &used);
  const uint64_t mask = static_cast<uint64_t>(table.partitions() - 1);
  std::vector<int64_t> new_key(n);  // gathered once: reused slots are scattered over the key column
  std::vector<int64_t> incoming(table.partitions(), 0);
  for (int64_t i = 0; i < n; ++i) {
    if (i + kAhead < n) {
      __builtin_prefetch(key + slot[i + kAhead], 0, 1);
    }
    new_key[i] = key[slot[i]];
    incoming[index_hash(new_key[i]) & mask] += 1;
  }
  const int64_t full = table.make_room(incoming, max_load, low_load, HostHome{key}, HostHome{key});
  if (full >= 0) {
    return at::scalar_tensor(full, sizes.options());
  }
  const Placement where = place(table, n, [&](int64_t i) { return index_hash(new_key[i]); }, 32);
  std::vector<int64_t> placed(n);
  for (int64_t i = 0; i < n; ++i) {
    prefetch_ahead(table, where, key, key_len, i, n);
    const int64_t k = new_key[i];
    placed[i] = table.insert_absent(
        where.part[i], where.home[i], static_cast<uint32_t>(slot[i] + 1), [&](uint32_t e) { return key[e - 1] == k; });
    if (placed[i] < 0) {  // present, or a repeat of an earlier key of this call: take this call's keys out again
      for (int64_t j = 0; j < i; ++j) {
        table.erase(placed[j]);
      }
      return at::scalar_tensor(-2 - i, sizes.options());
    }
  }
  return at::scalar_tensor(-1, sizes.options());
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> key_index_upsert_cpu(
    const at::Tensor& buckets,
    const at::Tensor& sizes,
    const at::Tensor& live,
    const at::Tensor& used,
    const at::Tensor& key_column,
    const at::Tensor& free_slots,
    const at::Tensor& counts,
    const at::Tensor& stamps,
    const at::Tensor& keys_arg,
    int64_t stamp,
    double max_load,
    double low_load) {
  constexpr const char* op = "key_index_upsert";
  check_index_state(buckets, at::kInt, sizes, {&live, &used}, op);
  check_key_column(key_column, op);
  check_slot_state(free_slots, counts, stamps, key_column, op);
  check_1d_int64(keys_arg, op, "keys");
  TORCH_CHECK_VALUE(stamps.numel() > 0, op, ": `stamps` must not be empty: every slot put is stamped");
  TORCH_CHECK_VALUE(
      0 <= stamp && stamp <= std::numeric_limits<int32_t>::max(), op, ": stamp must be in [0, 2**31 - 1], got ",
      stamp);
  const at::Tensor keys = keys_arg.contiguous();
  const int64_t n = keys.numel();
  const int64_t* in = keys.data_ptr<int64_t>();
  int64_t* key = key_column.data_ptr<int64_t>();
  const int64_t key_len = key_column.numel();
  const int32_t* stack = free_slots.data_ptr<int32_t>();
  int64_t* count = counts.data_ptr<int64_t>();
  int32_t* mark = stamps.data_ptr<int32_t>();
  OpenTable<uint32_t> table(buckets, sizes, &live, &used);
  const uint64_t mask = static_cast<uint64_t>(table.partitions() - 1);

  // Rebuilds are sized for the absent keys (a rebuild for keys already there would grow past the memory the owner
  // budgets). Every key given is an upper bound of them: only the keys of partitions that bound would rebuild (or
  // all, when it exceeds the slots left) are looked up first, so most keys are indexed in one pass.
  std::vector<int64_t> part_of(n);
  std::vector<int64_t> incoming(table.partitions(), 0);
  for (int64_t i = 0; i < n; ++i) {
    part_of[i] = static_cast<int64_t>(index_hash(in[i]) & mask);
    incoming[part_of[i]] += 1;
  }
  const int64_t slots_left = count[0] + key_len - count[1];
  const bool check_all = n > slots_left;
  std::vector<char> due(table.partitions(), 0);
  for (int64_t p = 0; p < table.partitions(); ++p) {
    due[p] = check_all || table.over_load(p, incoming[p], max_load);
  }
  std::vector<int64_t> checked;  // positions of the keys looked up first
  for (int64_t i = 0; i < n; ++i) {
    if (due[part_of[i]]) {
      checked.push_back(i);
    }
  }
  std::vector<int64_t> found(checked.empty() ? 0 : n, -1);
  if (!checked.empty()) {
    std::vector<int64_t> checked_keys(checked.size());
    for (size_t j = 0; j < checked.size(); ++j) {
      checked_keys[j] = in[checked[j]];
      incoming[part_of[checked[j]]] = 0;
    }
    int64_t absent = 0;
    for_each_found(
        table, key, key_len, checked_keys.data(), static_cast<int64_t>(checked.size()), op, [&](int64_t j, int64_t b) {
          const int64_t i = checked[j];
          found[i] = b < 0 ? -1 : static_cast<int64_t>(table.at(b)) - 1;
          incoming[part_of[i]] += b < 0;
          absent += b < 0;
        });
    TORCH_CHECK(
        !check_all || absent <= slots_left, op, ": ", absent, " keys are new but only ", slots_left,
        " slots are left; the store must make room before it puts them");
  }
  const int64_t full = table.make_room(incoming, max_load, low_load, HostHome{key}, HostHome{key});
  at::Tensor slots_t = at::empty({n}, keys.options());
  at::Tensor positions_t = at::empty({n}, keys.options());
  if (full >= 0) {
    return {slots_t.narrow(0, 0, 0), positions_t.narrow(0, 0, 0), at::scalar_tensor(full, sizes.options())};
  }

  // Pass 2: absent keys take a slot (the free stack's top, else the next fresh one) as they are indexed; a repeat
  // finds the slot its first occurrence took. While the pass runs, the stamp of a slot taken is -1 - its output
  // place, so a repeat moves that place's position to its own: the last occurrence wins.
  int64_t* out_slot = slots_t.data_ptr<int64_t>();
  int64_t* out_pos = positions_t.data_ptr<int64_t>();
  int64_t m = 0;
  const Placement where = place(table, n, [&](int64_t i) { return index_hash(in[i]); }, 32);  // homes after rebuilds
  for (int64_t i = 0; i < n; ++i) {
    prefetch_ahead(table, where, key, key_len, i, n);
    int64_t s = found.empty() ? -1 : found[i];
    if (s < 0) {
      const int64_t candidate = count[0] > 0 ? stack[count[0] - 1] : count[1];
      const int64_t k = in[i];
      const auto same = [&](uint32_t e) { return key[e - 1] == k; };
      const int64_t b = table.insert_absent(where.part[i], where.home[i], static_cast<uint32_t>(candidate + 1), same);
      if (b >= 0) {
        count[0] > 0 ? --count[0] : ++count[1];
        key[candidate] = k;
        s = candidate;
      } else {
        s = static_cast<int64_t>(table.at(-2 - b)) - 1;
      }
    }
    if (mark[s] < 0) {
      out_pos[-1 - mark[s]] = i;
    } else {
      out_slot[m] = s;
      out_pos[m] = i;
      mark[s] = static_cast<int32_t>(-1 - m);
      ++m;
    }
  }
  for (int64_t j = 0; j < m; ++j) {
    mark[out_slot[j]] = static_cast<int32_t>(stamp);
  }
  return {slots_t.narrow(0, 0, m), positions_t.narrow(0, 0, m), at::scalar_tensor(-1, sizes.options())};
}

std::tuple<at::Tensor, at::Tensor> key_index_pop_cpu(
    const at::Tensor& buckets,
    const at::Tensor& sizes,
    const at::Tensor& live,
    const at::Tensor& key_column,
    const at::Tensor& free_slots,
    const at::Tensor& counts,
    const at::Tensor& stamps,
    const at::Tensor& keys_arg,
    int64_t free_stamp) {
  constexpr const char* op = "key_index_pop";
  check_index_state(buckets, at::kInt, sizes, {&live}, op);
  check_key_column(key_column, op);
  check_slot_state(free_slots, counts, stamps, key_column, op);
  check_1d_int64(keys_arg, op, "keys");
  TORCH_CHECK_VALUE(
      std::numeric_limits<int32_t>::min() <= free_stamp && free_stamp <= std::numeric_limits<int32_t>::max(), op,
      ": free_stamp must fit int32, got ", free_stamp);
  const at::Tensor keys = keys_arg.contiguous();
  const int64_t n = keys.numel();
  OpenTable<uint32_t> table(buckets, sizes, &live, nullptr);
  at::Tensor slots_t = at::empty({n}, keys.options());
  int64_t* slot = slots_t.data_ptr<int64_t>();
  std::vector<int64_t> bucket(n);
  for_each_found(
      table, key_column.data_ptr<int64_t>(), key_column.numel(), keys.data_ptr<int64_t>(), n, op,
      [&](int64_t i, int64_t b) {
        bucket[i] = b;
        slot[i] = b < 0 ? -1 : static_cast<int64_t>(table.at(b)) - 1;
      });
  // Every occurrence of a key gets its slot; its first occurrence frees it (the repeats find a tombstone).
  int32_t* stack = free_slots.data_ptr<int32_t>();
  int64_t* count = counts.data_ptr<int64_t>();
  int32_t* mark = stamps.numel() ? stamps.data_ptr<int32_t>() : nullptr;
  at::Tensor freed_t = at::empty({n}, keys.options());
  int64_t* freed = freed_t.data_ptr<int64_t>();
  int64_t m = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (bucket[i] >= 0 && table.at(bucket[i]) != OpenTable<uint32_t>::kTomb) {
      table.erase(bucket[i]);
      freed[m++] = slot[i];
      stack[count[0]++] = static_cast<int32_t>(slot[i]);
      if (mark != nullptr) {
        mark[slot[i]] = static_cast<int32_t>(free_stamp);
      }
    }
  }
  count[2] = std::max(count[2], count[0]);
  return {slots_t, freed_t.narrow(0, 0, m)};
}

at::Tensor fingerprint_find_cpu(
    const at::Tensor& buckets,
    const at::Tensor& sizes,
    const at::Tensor& part_arg,
    const at::Tensor& fingerprints_arg,
    const at::Tensor& after_arg,
    int64_t fingerprint_bits) {
  constexpr const char* op = "fingerprint_find";
  check_index_state(buckets, at::kLong, sizes, {}, op);
  check_1d_int64(part_arg, op, "part");
  check_1d_int64(fingerprints_arg, op, "fingerprints");
  check_1d_int64(after_arg, op, "after");
  TORCH_CHECK_VALUE(
      0 < fingerprint_bits && fingerprint_bits < 64, op, ": fingerprint_bits must be in [1, 63], got ",
      fingerprint_bits);
  const int64_t n = part_arg.numel();
  TORCH_CHECK_VALUE(
      fingerprints_arg.numel() == n && after_arg.numel() == n, op,
      ": `part`, `fingerprints` and `after` must have one element per key, got ", n, ", ", fingerprints_arg.numel(),
      " and ", after_arg.numel());
  const at::Tensor part_t = part_arg.contiguous();
  const at::Tensor fp_t = fingerprints_arg.contiguous();
  const at::Tensor after_t = after_arg.contiguous();
  const int64_t* part = part_t.data_ptr<int64_t>();
  const int64_t* fp = fp_t.data_ptr<int64_t>();
  const int64_t* after = after_t.data_ptr<int64_t>();
  const OpenTable<uint64_t> table(buckets, sizes, nullptr, nullptr);
  const int bits = static_cast<int>(fingerprint_bits);
  std::vector<int64_t> start(n);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t p = part[i];
    TORCH_CHECK_VALUE(
        0 <= p && p < table.partitions(), op, ": part[", i, "] = ", p, " is outside [0, ", table.partitions(), ")");
    const int64_t size = table.size(p);
    if (after[i] < 0) {
      start[i] = scale_to(static_cast<uint64_t>(fp[i]), bits, size);
    } else {
      const int64_t pos = after[i] - p * table.stride();
      TORCH_CHECK_VALUE(
          0 <= pos && pos < size, op, ": after[", i, "] = ", after[i], " is not a bucket of partition ", p,
          "; pass -1 or a bucket this op returned for that key");
      start[i] = pos + 1 == size ? 0 : pos + 1;
    }
  }
  at::Tensor found = at::empty({n}, part_t.options());
  int64_t* out = found.data_ptr<int64_t>();
  for (int64_t i = 0; i < n; ++i) {
    if (i + kAhead < n) {
      table.prefetch(part[i + kAhead], start[i + kAhead]);
    }
    const uint64_t want = static_cast<uint64_t>(fp[i]);
    out[i] = table.find(part[i], start[i], [&](uint64_t e) { return (e >> (64 - bits)) == want; });
  }
  return found;
}

at::Tensor fingerprint_insert_cpu(
    const at::Tensor& buckets,
    const at::Tensor& sizes,
    const at::Tensor& live,
    const at::Tensor& used,
    const at::Tensor& part_arg,
    const at::Tensor& entries_arg,
    int64_t fingerprint_bits,
    double max_load,
    double low_load) {
  constexpr const char* op = "fingerprint_insert";
  check_index_state(buckets, at::kLong, sizes, {&live, &used}, op);
  check_1d_int64(part_arg, op, "part");
  check_1d_int64(entries_arg, op, "entries");
  TORCH_CHECK_VALUE(
      0 < fingerprint_bits && fingerprint_bits < 64, op, ": fingerprint_bits must be in [1, 63], got ",
      fingerprint_bits);
  const int64_t n = part_arg.numel();
  TORCH_CHECK_VALUE(
      entries_arg.numel() == n, op, ": `part` and `entries` must have the same length, got ", n, " and ",
      entries_arg.numel());
  const at::Tensor part_t = part_arg.contiguous();
  const at::Tensor entries_t = entries_arg.contiguous();
  const int64_t* part = part_t.data_ptr<int64_t>();
  const uint64_t* entry = reinterpret_cast<const uint64_t*>(entries_t.data_ptr<int64_t>());
  OpenTable<uint64_t> table(buckets, sizes, &live, &used);
  const int bits = static_cast<int>(fingerprint_bits);
  std::vector<int64_t> incoming(table.partitions(), 0);
  for (int64_t i = 0; i < n; ++i) {
    TORCH_CHECK_VALUE(
        0 <= part[i] && part[i] < table.partitions(), op, ": part[", i, "] = ", part[i], " is outside [0, ",
        table.partitions(), ")");
    TORCH_CHECK_VALUE(
        entry[i] != 0 && entry[i] != OpenTable<uint64_t>::kTomb, op, ": entries[", i,
        "] is 0 or all ones, which mark empty buckets and tombstones");
    incoming[part[i]] += 1;
  }
  const auto home_of = [&](uint64_t e, int64_t size) { return scale_to(e >> (64 - bits), bits, size); };
  const int64_t full = table.make_room(incoming, max_load, low_load, home_of);
  if (full >= 0) {
    return at::scalar_tensor(full, sizes.options());
  }
  for (int64_t i = 0; i < n; ++i) {
    if (i + kAhead < n) {
      table.prefetch(part[i + kAhead], home_of(entry[i + kAhead], table.size(part[i + kAhead])));
    }
    table.insert(part[i], home_of(entry[i], table.size(part[i])), entry[i]);
  }
  return at::scalar_tensor(-1, sizes.options());
}

}  // namespace torchrec_ascend
