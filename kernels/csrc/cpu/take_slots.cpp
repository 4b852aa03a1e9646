// CPU kernel of take_slots: the checked eviction wrapper's test of a policy's victims (every KEY_VALUE eviction).
// One pass over the victims replaces a bounds reduction, a scatter and a count over every slot of the cache.
#include <ATen/ops/scalar_tensor.h>
#include <c10/util/Exception.h>

#include "../ops.h"

namespace torchrec_ascend {

at::Tensor take_slots_cpu(const at::Tensor& free, const at::Tensor& slots) {
  constexpr const char* op = "take_slots";
  TORCH_CHECK_VALUE(free.dim() == 1 && free.is_contiguous(), op, ": `free` must be a contiguous 1-D tensor, got shape ",
                    free.sizes(), "; pass a fresh mask such as resident & evictable.");
  TORCH_CHECK_TYPE(free.scalar_type() == at::kBool, op, ": `free` must be bool, got ", free.scalar_type(), ".");
  check_1d_int64(slots, op, "slots");
  bool* flags = free.data_ptr<bool>();
  const at::Tensor ordered = slots.contiguous();
  const int64_t* s = ordered.data_ptr<int64_t>();
  const int64_t n = free.numel();
  bool all_taken = true;
  for (int64_t i = 0; i < ordered.numel() && all_taken; ++i) {
    // A slot outside [0, n) is never read; a repeated one finds its flag already cleared.
    all_taken = s[i] >= 0 && s[i] < n && flags[s[i]];
    if (all_taken) {
      flags[s[i]] = false;
    }
  }
  return at::scalar_tensor(all_taken, free.options());
}

}  // namespace torchrec_ascend
