// CPU kernels of the ID map: raw int64 ID -> dense slot in [0, capacity). The state lives in three tensors owned by
// kernels/id_map.py's IdMap (so it is part of state_dict): buckets (see id_table.h), free_slots (a stack of freed
// slots) and counters (next_fresh, num_free). Slot assignment depends only on the sequence of calls, never on the
// bucket layout: new IDs of a call take slots in order of first occurrence, freed slots first (most recently freed
// first), then fresh slots in increasing order.
#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/scalar_tensor.h>

#include <algorithm>
#include <limits>
#include <vector>

#include "../ops.h"
#include "id_table.h"

namespace torchrec_ascend {

namespace {
constexpr int64_t kNotFound = -1;
constexpr int64_t kLookupGrain = 1 << 15;
}  // namespace

namespace {

// The checks every insert runs; returns `ids` contiguous.
at::Tensor checked_insert_args(
    const at::Tensor& buckets, const at::Tensor& free_slots, const at::Tensor& counters, const at::Tensor& ids,
    const char* op) {
  check_id_map_layout(buckets, free_slots, counters, op);
  check_counter_values(counters, free_slots.numel(), op);
  check_1d_int64(ids, op, "ids");
  at::Tensor contiguous = ids.contiguous();
  check_non_negative(contiguous, op);
  return contiguous;
}

// One insert-or-lookup pass over `ids` into `out` (slots, kNotFound where the map is full: that ID is not inserted);
// `visit(i, slot, inserted)` sees each position as it is mapped. The probe that misses ends on the empty bucket the
// new ID goes into.
template <typename Visit>
void insert_pass(
    const at::Tensor& buckets, const at::Tensor& free_slots, const at::Tensor& counters, const at::Tensor& ids,
    int64_t* out, Visit visit) {
  IdTable table(buckets);
  const int64_t capacity = free_slots.numel();
  const int64_t* free = free_slots.data_ptr<int64_t>();
  int64_t* count = counters.data_ptr<int64_t>();
  int64_t next_fresh = count[0];
  int64_t num_free = count[1];
  const int64_t* in = ids.data_ptr<int64_t>();
  const int64_t n = ids.numel();
  HomeWindow<kPrefetchDistance, /*kForWrite=*/1> homes(table, in, 0, n);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t key = in[i];
    const uint64_t b = table.find_from(homes.take(i), key);
    if (table.key(b) == key) {
      out[i] = table.slot(b);
      visit(i, out[i], false);
      continue;
    }
    int64_t slot = kNotFound;
    if (num_free > 0) {
      slot = free[--num_free];
    } else if (next_fresh < capacity) {
      slot = next_fresh++;
    }
    if (slot != kNotFound) {
      table.set(b, key, slot);
    }
    out[i] = slot;
    visit(i, slot, slot != kNotFound);
  }
  count[0] = next_fresh;
  count[1] = num_free;
}

// last_used of a row inserted by the running id_map_insert_stamped call, until the call ends (no step takes it).
constexpr int64_t kInsertedNow = std::numeric_limits<int64_t>::min();

}  // namespace

std::tuple<at::Tensor, at::Tensor> id_map_insert_or_lookup_cpu(
    const at::Tensor& buckets, const at::Tensor& free_slots, const at::Tensor& counters, const at::Tensor& ids_arg) {
  const at::Tensor ids = checked_insert_args(buckets, free_slots, counters, ids_arg, "id_map_insert_or_lookup");
  at::Tensor slots = at::empty({ids.numel()}, ids.options());
  at::Tensor is_new = at::empty({ids.numel()}, ids.options().dtype(at::kBool));
  bool* fresh = is_new.data_ptr<bool>();
  insert_pass(buckets, free_slots, counters, ids, slots.data_ptr<int64_t>(),
              [fresh](int64_t i, int64_t, bool inserted) { fresh[i] = inserted; });
  return {slots, is_new};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> id_map_insert_stamped_cpu(
    const at::Tensor& buckets, const at::Tensor& free_slots, const at::Tensor& counters, const at::Tensor& last_used,
    const at::Tensor& ids_arg, int64_t step) {
  constexpr const char* op = "id_map_insert_stamped";
  const at::Tensor ids = checked_insert_args(buckets, free_slots, counters, ids_arg, op);
  TORCH_CHECK(
      last_used.dim() == 1 && last_used.numel() == free_slots.numel() && last_used.scalar_type() == at::kLong &&
          last_used.is_contiguous(),
      op, ": `last_used` must be a contiguous int64 tensor of shape [capacity=", free_slots.numel(), "], got ",
      last_used.scalar_type(), " ", last_used.sizes(), "; pass the slot table's `last_used` buffer.");
  TORCH_CHECK_VALUE(step >= 0, op, ": `step` must be >= 0, got ", step, "; pass the slot table's step counter.");

  const int64_t n = ids.numel();
  at::Tensor slots = at::empty({n}, ids.options());
  int64_t* out = slots.data_ptr<int64_t>();
  int64_t* used = last_used.data_ptr<int64_t>();
  std::vector<int64_t> new_positions;
  int64_t hits = 0;
  // Rows inserted now are marked, so their IDs' repeats in this batch are not counted as hits; the other rows are
  // stamped after the probes, in a loop whose iterations are independent (their cache misses overlap).
  insert_pass(buckets, free_slots, counters, ids, out, [&](int64_t i, int64_t slot, bool inserted) {
    if (inserted) {
      used[slot] = kInsertedNow;
      new_positions.push_back(i);
    }
  });
  for (int64_t i = 0; i < n; ++i) {
    const int64_t slot = out[i];
    if (slot != kNotFound && used[slot] != kInsertedNow) {
      used[slot] = step;
      ++hits;
    }
  }
  at::Tensor positions = at::empty({static_cast<int64_t>(new_positions.size())}, ids.options());
  int64_t* pos = positions.data_ptr<int64_t>();
  for (size_t k = 0; k < new_positions.size(); ++k) {
    pos[k] = new_positions[k];
    used[out[new_positions[k]]] = step;
  }
  return {slots, positions, at::scalar_tensor(hits, ids.options())};
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
