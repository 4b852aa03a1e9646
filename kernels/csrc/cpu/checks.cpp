// Input checks shared by the CPU kernels. Each message names the op and argument, the rule broken and the fix.
#include <c10/util/Exception.h>

#include "../hashing.h"
#include "../ops.h"

namespace torchrec_ascend {

void check_1d_int64(const at::Tensor& t, const char* op, const char* arg) {
  TORCH_CHECK_VALUE(
      t.dim() == 1, op, ": `", arg, "` must be a 1-D tensor, got shape ", t.sizes(), "; flatten it with .reshape(-1).");
  TORCH_CHECK_TYPE(
      t.scalar_type() == at::kLong, op, ": `", arg, "` must be int64, got ", t.scalar_type(),
      "; cast it with .long().");
}

void check_non_negative(const at::Tensor& ids, const char* op) {
  const int64_t* p = ids.data_ptr<int64_t>();
  const int64_t n = ids.numel();
  // OR of all values has the sign bit set iff some value is negative; unlike an early-exit search it vectorizes.
  int64_t all_bits = 0;
  for (int64_t i = 0; i < n; ++i) {
    all_bits |= p[i];
  }
  if (all_bits >= 0) {
    return;
  }
  int64_t first = 0;
  while (p[first] >= 0) {
    ++first;
  }
  TORCH_CHECK_VALUE(
      false, op, ": negative IDs are not allowed (the map keys are 0..2**63-1), got ", p[first], " at position ",
      first, "; remove or remap negative IDs before this call.");
}

void check_buckets(const at::Tensor& buckets, const char* op) {
  const int64_t rows = buckets.dim() == 2 ? buckets.size(0) : 0;
  TORCH_CHECK(
      buckets.dim() == 2 && buckets.size(1) == 2 && buckets.scalar_type() == at::kLong && buckets.is_contiguous() &&
          rows >= 2 && (rows & (rows - 1)) == 0,
      op, ": `buckets` must be a contiguous int64 tensor of shape [num_buckets, 2] with num_buckets a power of two,",
      " got ", buckets.scalar_type(), " ", buckets.sizes(), "; pass the `buckets` buffer of an IdMap.");
}

void check_counters_layout(const at::Tensor& counters, const char* op) {
  TORCH_CHECK(
      counters.dim() == 1 && counters.numel() == 2 && counters.scalar_type() == at::kLong && counters.is_contiguous(),
      op, ": `counters` must be a contiguous int64 tensor of shape [2] (next_fresh, num_free), got ",
      counters.scalar_type(), " ", counters.sizes(), "; pass the `counters` buffer of an IdMap.");
}

void check_counter_values(const at::Tensor& counters, int64_t capacity, const char* op) {
  const int64_t* c = counters.data_ptr<int64_t>();
  TORCH_CHECK(
      0 <= c[1] && c[1] <= c[0] && c[0] <= capacity, op, ": `counters` (next_fresh=", c[0], ", num_free=", c[1],
      ") must satisfy 0 <= num_free <= next_fresh <= capacity (", capacity,
      "); the state is corrupted, reload it from a checkpoint or rebuild it from an export.");
}

void check_id_map_layout(
    const at::Tensor& buckets, const at::Tensor& free_slots, const at::Tensor& counters, const char* op) {
  check_buckets(buckets, op);
  check_counters_layout(counters, op);
  TORCH_CHECK(
      free_slots.dim() == 1 && free_slots.scalar_type() == at::kLong && free_slots.is_contiguous(), op,
      ": `free_slots` must be a contiguous 1-D int64 tensor of length capacity, got ", free_slots.scalar_type(), " ",
      free_slots.sizes(), "; pass the `free_slots` buffer of an IdMap.");
  TORCH_CHECK(
      buckets.size(0) > free_slots.numel(), op, ": `buckets` must have more rows than the capacity (",
      free_slots.numel(), ") so every probe ends on an empty bucket, got ", buckets.size(0), "; build the state with IdMap(capacity).");
}

}  // namespace torchrec_ascend
