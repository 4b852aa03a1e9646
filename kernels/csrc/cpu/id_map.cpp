// CPU kernels of the ID map: raw int64 ID -> dense slot in [0, capacity). The state lives in three tensors owned by
// kernels/id_map.py's IdMap (so it is part of state_dict): buckets (see id_table.h), free_slots (a stack of freed
// slots) and counters (next_fresh, num_free). Slot assignment depends only on the sequence of calls, never on the
// bucket layout: new IDs of a call take slots in order of first occurrence, freed slots first (most recently freed
// first), then fresh slots in increasing order.
#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>

#include <algorithm>
#include <vector>

#include "../ops.h"
#include "id_table.h"

namespace torchrec_ascend {

namespace {
constexpr int64_t kNotFound = -1;
constexpr int64_t kLookupGrain = 1 << 15;
}  // namespace

std::tuple<at::Tensor, at::Tensor> id_map_insert_or_lookup_cpu(
    const at::Tensor& buckets, const at::Tensor& free_slots, const at::Tensor& counters, const at::Tensor& ids_arg) {
  constexpr const char* op = "id_map_insert_or_lookup";
  check_id_map_layout(buckets, free_slots, counters, op);
  check_counter_values(counters, free_slots.numel(), op);
  check_1d_int64(ids_arg, op, "ids");
  const at::Tensor ids = ids_arg.contiguous();
  check_non_negative(ids, op);

  const int64_t n = ids.numel();
  at::Tensor slots = at::empty({n}, ids.options());
  at::Tensor is_new = at::empty({n}, ids.options().dtype(at::kBool));
  IdTable table(buckets);
  const int64_t capacity = free_slots.numel();
  const int64_t* free = free_slots.data_ptr<int64_t>();
  int64_t* count = counters.data_ptr<int64_t>();
  int64_t next_fresh = count[0];
  int64_t num_free = count[1];
  const int64_t* in = ids.data_ptr<int64_t>();
  int64_t* out = slots.data_ptr<int64_t>();
  bool* fresh = is_new.data_ptr<bool>();

  // One pass: the probe that misses ends on the empty bucket the new ID goes into.
  HomeWindow<kPrefetchDistance, /*kForWrite=*/1> homes(table, in, 0, n);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t key = in[i];
    const uint64_t b = table.find_from(homes.take(i), key);
    fresh[i] = false;
    if (table.key(b) == key) {
      out[i] = table.slot(b);
      continue;
    }
    int64_t slot = kNotFound;  // full: the ID is not inserted, the caller raises or evicts and retries
    if (num_free > 0) {
      slot = free[--num_free];
    } else if (next_fresh < capacity) {
      slot = next_fresh++;
    }
    if (slot != kNotFound) {
      table.set(b, key, slot);
      fresh[i] = true;
    }
    out[i] = slot;
  }
  count[0] = next_fresh;
  count[1] = num_free;
  return {slots, is_new};
}

at::Tensor id_map_lookup_cpu(const at::Tensor& buckets, const at::Tensor& ids_arg) {
  constexpr const char* op = "id_map_lookup";
  check_buckets(buckets, op);
  check_1d_int64(ids_arg, op, "ids");
  const at::Tensor ids = ids_arg.contiguous();
  check_non_negative(ids, op);

  const int64_t n = ids.numel();
  at::Tensor slots = at::empty({n}, ids.options());
  const IdTable table(buckets);
  const int64_t* in = ids.data_ptr<int64_t>();
  int64_t* out = slots.data_ptr<int64_t>();
  // Read-only, so chunks are independent and the result does not depend on the thread count.
  at::parallel_for(0, n, kLookupGrain, [&](int64_t begin, int64_t end) {
    HomeWindow<kPrefetchDistance, /*kForWrite=*/0> homes(table, in, begin, end);
    for (int64_t i = begin; i < end; ++i) {
      const uint64_t b = table.find_from(homes.take(i), in[i]);
      out[i] = table.key(b) == in[i] ? table.slot(b) : kNotFound;
    }
  });
  return slots;
}

at::Tensor id_map_remove_cpu(
    const at::Tensor& buckets, const at::Tensor& free_slots, const at::Tensor& counters, const at::Tensor& ids_arg) {
  constexpr const char* op = "id_map_remove";
  check_id_map_layout(buckets, free_slots, counters, op);
  check_counter_values(counters, free_slots.numel(), op);
  check_1d_int64(ids_arg, op, "ids");
  const at::Tensor ids = ids_arg.contiguous();
  check_non_negative(ids, op);

  const int64_t n = ids.numel();
  at::Tensor freed = at::empty({n}, ids.options());
  IdTable table(buckets);
  int64_t* free = free_slots.data_ptr<int64_t>();
  int64_t* count = counters.data_ptr<int64_t>();
  int64_t num_free = count[1];
  const int64_t* in = ids.data_ptr<int64_t>();
  int64_t* out = freed.data_ptr<int64_t>();
  HomeWindow<kPrefetchDistance, /*kForWrite=*/1> homes(table, in, 0, n);
  for (int64_t i = 0; i < n; ++i) {
    const uint64_t b = table.find_from(homes.take(i), in[i]);
    if (table.key(b) != in[i]) {
      out[i] = kNotFound;
      continue;
    }
    out[i] = table.slot(b);
    free[num_free++] = out[i];  // cannot overflow: num_free < number of slots ever handed out <= capacity
    table.erase(b);
  }
  count[1] = num_free;
  return freed;
}

std::tuple<at::Tensor, at::Tensor> id_map_export_cpu(const at::Tensor& buckets, const at::Tensor& counters) {
  constexpr const char* op = "id_map_export";
  check_buckets(buckets, op);
  check_counters_layout(counters, op);
  check_counter_values(counters, buckets.size(0) - 1, op);
  const int64_t next_fresh = counters.data_ptr<int64_t>()[0];
  const int64_t size = next_fresh - counters.data_ptr<int64_t>()[1];
  // Slots are dense below next_fresh, so placing each key at its slot sorts by slot in O(buckets + next_fresh).
  std::vector<int64_t> key_of_slot(static_cast<size_t>(next_fresh), kEmptyKey);
  const int64_t* entries = buckets.data_ptr<int64_t>();
  for (int64_t b = 0; b < buckets.size(0); ++b) {
    const int64_t key = entries[2 * b];
    if (key != kEmptyKey) {
      const int64_t slot = entries[2 * b + 1];
      TORCH_CHECK(
          0 <= slot && slot < next_fresh, op, ": bucket ", b, " holds slot ", slot, " outside [0, next_fresh=",
          next_fresh, "); the state is corrupted, reload it from a checkpoint.");
      key_of_slot[slot] = key;
    }
  }
  at::Tensor out_ids = at::empty({size}, buckets.options());
  at::Tensor out_slots = at::empty({size}, buckets.options());
  int64_t* ids_ptr = out_ids.data_ptr<int64_t>();
  int64_t* slots_ptr = out_slots.data_ptr<int64_t>();
  int64_t k = 0;
  for (int64_t s = 0; s < next_fresh; ++s) {
    if (key_of_slot[s] != kEmptyKey) {
      TORCH_CHECK(
          k < size, op, ": the buckets hold more IDs than counters say (", size,
          "); the state is corrupted, reload it from a checkpoint.");
      ids_ptr[k] = key_of_slot[s];
      slots_ptr[k] = s;
      ++k;
    }
  }
  TORCH_CHECK(
      k == size, op, ": the buckets hold ", k, " IDs but counters say ", size,
      "; the state is corrupted, reload it from a checkpoint.");
  return {out_ids, out_slots};
}

void id_map_rebuild_cpu(
    const at::Tensor& buckets,
    const at::Tensor& free_slots,
    const at::Tensor& counters,
    const at::Tensor& ids_arg,
    const at::Tensor& slots_arg) {
  constexpr const char* op = "id_map_rebuild";
  check_id_map_layout(buckets, free_slots, counters, op);
  check_1d_int64(ids_arg, op, "ids");
  check_1d_int64(slots_arg, op, "slots");
  TORCH_CHECK_VALUE(
      ids_arg.numel() == slots_arg.numel(), op, ": `ids` and `slots` must have the same length, got ", ids_arg.numel(),
      " and ", slots_arg.numel(), "; pass both tensors of one IdMap.export().");
  const at::Tensor ids = ids_arg.contiguous();
  const at::Tensor slots = slots_arg.contiguous();
  check_non_negative(ids, op);

  const int64_t n = ids.numel();
  const int64_t capacity = free_slots.numel();
  const int64_t* in_ids = ids.data_ptr<int64_t>();
  const int64_t* in_slots = slots.data_ptr<int64_t>();
  std::vector<bool> used(static_cast<size_t>(capacity), false);
  int64_t next_fresh = 0;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t s = in_slots[i];
    TORCH_CHECK_VALUE(
        0 <= s && s < capacity, op, ": slot ", s, " (position ", i, ") is outside [0, capacity=", capacity,
        "); rebuild into an IdMap with a larger capacity.");
    TORCH_CHECK_VALUE(!used[s], op, ": slot ", s, " appears twice (position ", i, "); an export holds each slot once.");
    used[s] = true;
    next_fresh = std::max(next_fresh, s + 1);
  }

  // Inputs are valid up to duplicate IDs, which only the table can find: from here on the old state is discarded.
  int64_t* count = counters.data_ptr<int64_t>();
  count[0] = count[1] = 0;
  buckets.fill_(kEmptyKey);
  IdTable table(buckets);
  for (int64_t i = 0; i < n; ++i) {
    const uint64_t b = table.find(in_ids[i]);
    if (table.key(b) == in_ids[i]) {
      buckets.fill_(kEmptyKey);  // leave a valid empty map behind (counters are already zero)
      TORCH_CHECK_VALUE(
          false, op, ": ID ", in_ids[i], " appears twice (second at position ", i,
          "); an export holds each ID once.");
    }
    table.set(b, in_ids[i], in_slots[i]);
  }
  // Holes below next_fresh become free slots, pushed high to low so the lowest is handed out first.
  int64_t* free = free_slots.data_ptr<int64_t>();
  int64_t num_free = 0;
  for (int64_t s = next_fresh - 1; s >= 0; --s) {
    if (!used[s]) {
      free[num_free++] = s;
    }
  }
  count[0] = next_fresh;
  count[1] = num_free;
}

}  // namespace torchrec_ascend
