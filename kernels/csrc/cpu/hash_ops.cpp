// CPU kernels of the stateless hash ops on ID batches: hash_unique (dedup in first-occurrence order), hash_rank and
// hash_bucketize (row-wise placement by mix64(id) % world_size) and hash_uniform_init (per-ID deterministic rows).
#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/from_blob.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "../hashing.h"
#include "../ops.h"
#include "id_table.h"

namespace torchrec_ascend {

namespace {
constexpr int64_t kElementwiseGrain = 1 << 14;
constexpr int64_t kNoIndex = -1;

uint64_t next_power_of_two(uint64_t x) {
  return x <= 1 ? 1 : uint64_t{1} << (64 - __builtin_clzll(x - 1));
}

// Rounds a double to float32 once, the way Python's struct.pack("f") does (round to nearest even).
float to_float(double x) {
  return static_cast<float>(x);
}
}  // namespace

std::tuple<at::Tensor, at::Tensor, at::Tensor> hash_unique_cpu(const at::Tensor& ids_arg) {
  constexpr const char* op = "hash_unique";
  check_1d_int64(ids_arg, op, "ids");
  const at::Tensor ids = ids_arg.contiguous();
  const int64_t n = ids.numel();
  const int64_t* in = ids.data_ptr<int64_t>();
  at::Tensor unique = at::empty({n}, ids.options());
  at::Tensor inverse = at::empty({n}, ids.options());
  at::Tensor counts = at::empty({n}, ids.options());
  int64_t* u = unique.data_ptr<int64_t>();
  int64_t* inv = inverse.data_ptr<int64_t>();
  int64_t* c = counts.data_ptr<int64_t>();

  // Load factor <= 1/2. Entries are (key, index into unique); any int64 is a valid key, so the index marks empties.
  const uint64_t num_buckets = next_power_of_two(std::max<uint64_t>(16, 2 * static_cast<uint64_t>(n)));
  const uint64_t mask = num_buckets - 1;
  const int shift = 64 - __builtin_ctzll(num_buckets);
  std::vector<int64_t> table(2 * num_buckets, kNoIndex);
  int64_t* t = table.data();
  int64_t k = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (i + kPrefetchDistance < n) {
      __builtin_prefetch(t + 2 * home_bucket(in[i + kPrefetchDistance], shift), 1, 1);
    }
    const int64_t key = in[i];
    for (uint64_t b = home_bucket(key, shift);; b = (b + 1) & mask) {
      const int64_t index = t[2 * b + 1];
      if (index == kNoIndex) {
        t[2 * b] = key;
        t[2 * b + 1] = k;
        u[k] = key;
        c[k] = 1;
        inv[i] = k++;
        break;
      }
      if (t[2 * b] == key) {
        ++c[index];
        inv[i] = index;
        break;
      }
    }
  }
  return {unique.narrow(0, 0, k).clone(), inverse, counts.narrow(0, 0, k).clone()};
}

at::Tensor hash_rank_cpu(const at::Tensor& ids_arg, int64_t world_size) {
  constexpr const char* op = "hash_rank";
  check_1d_int64(ids_arg, op, "ids");
  TORCH_CHECK_VALUE(world_size >= 1, op, ": `world_size` must be >= 1, got ", world_size, ".");
  const at::Tensor ids = ids_arg.contiguous();
  at::Tensor ranks = at::empty_like(ids);
  const int64_t* in = ids.data_ptr<int64_t>();
  int64_t* out = ranks.data_ptr<int64_t>();
  at::parallel_for(0, ids.numel(), kElementwiseGrain, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      out[i] = hash_rank_of(in[i], world_size);
    }
  });
  return ranks;
}

std::tuple<at::Tensor, at::Tensor, std::optional<at::Tensor>, at::Tensor> hash_bucketize_cpu(
    const at::Tensor& lengths_arg,
    const at::Tensor& values_arg,
    const std::optional<at::Tensor>& weights,
    int64_t world_size) {
  constexpr const char* op = "hash_bucketize";
  TORCH_CHECK_TYPE(
      lengths_arg.scalar_type() == at::kInt || lengths_arg.scalar_type() == at::kLong, op,
      ": `lengths` must be int32 or int64, got ", lengths_arg.scalar_type(), "; cast it with .long().");
  TORCH_CHECK_VALUE(
      lengths_arg.dim() == 1, op, ": `lengths` must be 1-D (one length per feature and sample, feature-major),",
      " got shape ", lengths_arg.sizes(), ".");
  check_1d_int64(values_arg, op, "values");
  TORCH_CHECK_VALUE(world_size >= 1, op, ": `world_size` must be >= 1, got ", world_size, ".");
  if (weights.has_value()) {
    TORCH_CHECK_VALUE(
        weights->dim() == 1 && weights->numel() == values_arg.numel(), op,
        ": `weights` must be 1-D with one weight per value (", values_arg.numel(), "), got shape ", weights->sizes(),
        "; pass the KeyedJaggedTensor's weights unchanged.");
  }
  const at::Tensor lengths = lengths_arg.to(at::kLong).contiguous();
  const at::Tensor values = values_arg.contiguous();
  const int64_t num_segments = lengths.numel();
  const int64_t n = values.numel();
  const int64_t* len = lengths.data_ptr<int64_t>();
  const int64_t* in = values.data_ptr<int64_t>();

  int64_t total = 0;
  for (int64_t s = 0; s < num_segments; ++s) {
    TORCH_CHECK_VALUE(
        len[s] >= 0, op, ": `lengths` must be non-negative, got ", len[s], " at position ", s, ".");
    total += len[s];
  }
  TORCH_CHECK_VALUE(
      total == n, op, ": `lengths` sum to ", total, " but there are ", n,
      " values; pass lengths and values of the same KeyedJaggedTensor.");

  // Pass 1: rank of every value and the bucket-major lengths [world_size, num_segments].
  std::vector<int64_t> rank(static_cast<size_t>(n));
  std::vector<int64_t> cursor(static_cast<size_t>(world_size * num_segments), 0);
  for (int64_t s = 0, i = 0; s < num_segments; ++s) {
    for (const int64_t end = i + len[s]; i < end; ++i) {
      rank[i] = hash_rank_of(in[i], world_size);
      ++cursor[rank[i] * num_segments + s];
    }
  }
  at::Tensor new_lengths =
      at::from_blob(cursor.data(), {world_size * num_segments}, at::kLong).to(lengths_arg.scalar_type(), false, true);
  // Exclusive prefix sum turns each (bucket, segment) length into its write cursor in new_values.
  int64_t offset = 0;
  for (int64_t& c : cursor) {
    const int64_t count = c;
    c = offset;
    offset += count;
  }
  // Pass 2: scatter; walking the input in order keeps each segment's values in input order within its bucket.
  at::Tensor new_values = at::empty({n}, values.options());
  at::Tensor permute = at::empty({n}, values.options());
  int64_t* out = new_values.data_ptr<int64_t>();
  int64_t* perm = permute.data_ptr<int64_t>();
  for (int64_t s = 0, i = 0; s < num_segments; ++s) {
    for (const int64_t end = i + len[s]; i < end; ++i) {
      const int64_t pos = cursor[rank[i] * num_segments + s]++;
      out[pos] = in[i];
      perm[i] = pos;
    }
  }
  std::optional<at::Tensor> new_weights;
  if (weights.has_value()) {
    new_weights = at::empty_like(*weights).index_copy_(0, permute, *weights);
  }
  return {new_lengths, new_values, new_weights, permute};
}

at::Tensor hash_uniform_init_cpu(const at::Tensor& ids_arg, int64_t seed, int64_t dim, double low, double high) {
  constexpr const char* op = "hash_uniform_init";
  check_1d_int64(ids_arg, op, "ids");
  TORCH_CHECK_VALUE(dim >= 0, op, ": `dim` must be >= 0, got ", dim, ".");
  // The scale is rounded to float32 so that scale * u (u has 24 bits) is exact in double: the one rounding left,
  // low + scale * u, then gives the same bits with or without fused multiply-add, on every compiler and CPU.
  const double scale = to_float(high - low);
  TORCH_CHECK_VALUE(
      std::isfinite(low) && std::isfinite(high) && low < high && std::isfinite(scale), op,
      ": need finite low < high with high - low within float32 range, got low=", low, ", high=", high, ".");
  const at::Tensor ids = ids_arg.contiguous();
  const int64_t n = ids.numel();
  at::Tensor out = at::empty({n, dim}, ids.options().dtype(at::kFloat));
  const int64_t* in = ids.data_ptr<int64_t>();
  float* o = out.data_ptr<float>();
  const uint64_t seed_mix = mix64(static_cast<uint64_t>(seed));
  const int64_t grain = std::max<int64_t>(1, kElementwiseGrain / std::max<int64_t>(dim, 1));
  at::parallel_for(0, n, grain, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      // Row i is the splitmix64 stream seeded by (seed, id): element j is its (j+1)-th output.
      const uint64_t state = mix64(static_cast<uint64_t>(in[i]) ^ seed_mix);
      for (int64_t j = 0; j < dim; ++j) {
        const uint64_t h = mix64(state + static_cast<uint64_t>(j + 1) * kGolden);
        const double u = static_cast<double>(h >> 40) * 0x1.0p-24;  // top 24 bits -> [0, 1)
        float r = to_float(low + scale * u);
        if (r >= high) {  // rounding may reach high; the interval is half-open
          r = std::nextafter(r, -INFINITY);
        }
        o[i * dim + j] = r;
      }
    }
  });
  return out;
}

}  // namespace torchrec_ascend
