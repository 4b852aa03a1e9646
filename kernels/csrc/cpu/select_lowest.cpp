// CPU kernels of select_lowest and select_lowest_packed: the positions of the `num` candidates with the lowest scores,
// by radix selection.
// The eviction policies choose their victims with it every KEY_VALUE step; torch.topk's comparison-based selection
// of (value, index) pairs costs several times more on these few-thousand-slot masks.
#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <memory>

#include "../ops.h"

namespace torchrec_ascend {

namespace {

constexpr int kDigitBits = 11;  // 2048 bins: at most 6 passes over 64-bit keys, usually 1 or 2

// Unsigned keys in the scores' order. Integers: the sign bit flipped. Floats: the bits, negatives reversed, every
// NaN above +inf (torch.sort's order) and -0.0 equal to 0.0.
inline uint64_t order_key(int64_t value) {
  return static_cast<uint64_t>(value) ^ (uint64_t{1} << 63);
}

inline uint64_t order_key(double value) {
  if (std::isnan(value)) {
    return ~uint64_t{0};
  }
  if (value == 0.0) {
    value = 0.0;
  }
  uint64_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  return bits >> 63 ? ~bits : bits | (uint64_t{1} << 63);
}

// The candidates' keys and positions, in position order, and the OR and AND of the keys.
struct Active {
  std::unique_ptr<uint64_t[]> keys;  // uninitialised (no zero fill): every entry read was written first
  std::unique_ptr<int64_t[]> positions;
  int64_t size = 0;
  uint64_t any_bits = 0;
  uint64_t all_bits = ~uint64_t{0};
};

// The order key of the policies' packed score (high, low) (torchrec_ascend.policies.scored.pack): high saturated
// into [0, 2**31 - 1], low into [0, 2**32 - 1].
inline uint64_t packed_key(int64_t high, int64_t low) {
  constexpr int64_t kLowBits = 32;
  const int64_t h = std::clamp<int64_t>(high, 0, (int64_t{1} << (63 - kLowBits)) - 1);
  const int64_t l = std::clamp<int64_t>(low, 0, (int64_t{1} << kLowBits) - 1);
  return order_key((h << kLowBits) | l);
}

// Every loop below is branch-free: each slot is written, and the count advances only where it is taken. Which slots
// are taken is close to random, so branches would mispredict on a large share of them.
template <typename KeyOf>
Active gather(KeyOf key_of, const bool* candidates, int64_t n) {
  Active a;
  a.keys.reset(new uint64_t[static_cast<size_t>(n)]);
  a.positions.reset(new int64_t[static_cast<size_t>(n)]);
  for (int64_t i = 0; i < n; ++i) {
    const uint64_t key = key_of(i);
    const bool take = candidates[i];
    a.keys[a.size] = key;
    a.positions[a.size] = i;
    a.any_bits |= take ? key : 0;
    a.all_bits &= take ? key : ~uint64_t{0};
    a.size += take;
  }
  return a;
}

// Writes to `out` the positions of the `want` lowest keys of `a` (want <= a.size; `out` holds a.size + 1) and
// returns how many it wrote (`want`); ties go to the lowest positions. Each pass ranks the active keys by the next
// digit below the bits they all share: keys of lower digits are chosen, those of the digit where `want` falls stay
// active, the rest are dropped.
int64_t select(Active& a, int64_t want, int64_t* out) {
  std::array<int64_t, size_t{1} << kDigitBits> bins;
  int64_t chosen = 0;
  while (want > 0) {
    const uint64_t differ = a.any_bits ^ a.all_bits;
    if (want == a.size || differ == 0) {  // all of them, or all equal: the first `want` by position
      std::copy(a.positions.get(), a.positions.get() + want, out + chosen);
      return chosen + want;
    }
    const int top = 63 - __builtin_clzll(differ);
    const int low = top + 1 > kDigitBits ? top + 1 - kDigitBits : 0;
    const uint64_t mask = (uint64_t{1} << (top + 1 - low)) - 1;
    std::fill(bins.begin(), bins.begin() + mask + 1, 0);
    for (int64_t t = 0; t < a.size; ++t) {
      ++bins[(a.keys[t] >> low) & mask];
    }
    uint64_t digit = 0;
    int64_t below = 0;  // < want, so `out` never overflows
    while (below + bins[digit] < want) {
      below += bins[digit++];
    }
    int64_t kept = 0;
    a.any_bits = 0;
    a.all_bits = ~uint64_t{0};
    for (int64_t t = 0; t < a.size; ++t) {  // kept <= t: compacting in place never overwrites an unread key
      const uint64_t key = a.keys[t];
      const int64_t position = a.positions[t];
      const uint64_t d = (key >> low) & mask;
      const bool stays = d == digit;
      out[chosen] = position;
      chosen += d < digit;
      a.keys[kept] = key;
      a.positions[kept] = position;
      a.any_bits |= stays ? key : 0;
      a.all_bits &= stays ? key : ~uint64_t{0};
      kept += stays;
    }
    a.size = kept;
    want -= below;
  }
  return chosen;
}

at::Tensor chosen_positions(Active& active, int64_t num, const at::TensorOptions& options) {
  at::Tensor out = at::empty({active.size + 1}, options.dtype(at::kLong));
  const int64_t chosen = select(active, std::min(num, active.size), out.data_ptr<int64_t>());
  return out.narrow(0, 0, chosen);
}

}  // namespace

at::Tensor select_lowest_cpu(const at::Tensor& scores_arg, const at::Tensor& candidates_arg, int64_t num) {
  constexpr const char* op = "select_lowest";
  TORCH_CHECK_VALUE(
      scores_arg.dim() == 1 && candidates_arg.dim() == 1 && scores_arg.numel() == candidates_arg.numel(), op,
      ": `scores` and `candidates` must be 1-D tensors of one length, got shapes ", scores_arg.sizes(), " and ",
      candidates_arg.sizes(), "; pass one score and one flag per slot.");
  TORCH_CHECK_TYPE(
      scores_arg.scalar_type() == at::kLong || scores_arg.scalar_type() == at::kDouble, op,
      ": `scores` must be int64 or float64, got ", scores_arg.scalar_type(),
      "; widen it first (every integer and float dtype converts exactly).");
  TORCH_CHECK_TYPE(
      candidates_arg.scalar_type() == at::kBool, op, ": `candidates` must be bool, got ", candidates_arg.scalar_type(),
      ".");
  TORCH_CHECK_VALUE(num >= 0, op, ": `num` must be >= 0, got ", num, ".");
  const at::Tensor scores = scores_arg.contiguous();
  const at::Tensor candidates = candidates_arg.contiguous();
  const int64_t n = scores.numel();
  const bool* flags = candidates.data_ptr<bool>();
  Active active;
  if (scores.scalar_type() == at::kLong) {
    const int64_t* s = scores.data_ptr<int64_t>();
    active = gather([s](int64_t i) { return order_key(s[i]); }, flags, n);
  } else {
    const double* s = scores.data_ptr<double>();
    active = gather([s](int64_t i) { return order_key(s[i]); }, flags, n);
  }
  return chosen_positions(active, num, scores.options());
}

at::Tensor select_lowest_packed_cpu(
    const at::Tensor& high_arg, const at::Tensor& low_arg, const at::Tensor& candidates_arg, int64_t num) {
  constexpr const char* op = "select_lowest_packed";
  check_1d_int64(high_arg, op, "high");
  check_1d_int64(low_arg, op, "low");
  TORCH_CHECK_VALUE(
      high_arg.numel() == low_arg.numel() && candidates_arg.dim() == 1 && candidates_arg.numel() == high_arg.numel(),
      op, ": `high`, `low` and `candidates` must be 1-D tensors of one length, got shapes ", high_arg.sizes(), ", ",
      low_arg.sizes(), " and ", candidates_arg.sizes(), "; pass one of each per slot.");
  TORCH_CHECK_TYPE(
      candidates_arg.scalar_type() == at::kBool, op, ": `candidates` must be bool, got ", candidates_arg.scalar_type(),
      ".");
  TORCH_CHECK_VALUE(num >= 0, op, ": `num` must be >= 0, got ", num, ".");
  const at::Tensor high = high_arg.contiguous();
  const at::Tensor low = low_arg.contiguous();
  const at::Tensor candidates = candidates_arg.contiguous();
  const int64_t* h = high.data_ptr<int64_t>();
  const int64_t* l = low.data_ptr<int64_t>();
  Active active = gather([h, l](int64_t i) { return packed_key(h[i], l[i]); }, candidates.data_ptr<bool>(),
                         high.numel());
  return chosen_positions(active, num, high.options());
}

}  // namespace torchrec_ascend
