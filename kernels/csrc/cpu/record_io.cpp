// Gathering fixed-size records by offset from open files: the KEY_VALUE disk tier's reads
// (torchrec_ascend/kernels/key_value/segment_file.py).
//
// Random reads of files larger than memory are bound by the disk's latency when issued one at a time (a page fault or
// a pread each: queue depth 1). So every record's pages are announced first with posix_fadvise(WILLNEED), which queues
// their reads without waiting; the disk serves them in parallel, and the preads that follow mostly copy from the page
// cache. The advice is a hint: its failures are ignored, the preads report real ones.
#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <limits>
#include <numeric>
#include <vector>

#include "../ops.h"

namespace torchrec_ascend {

namespace {

// One posix_fadvise(WILLNEED) per run of records (in file order) whose byte ranges are at most a page apart: records
// that share pages are announced once, and at most one page is read that no record needs.
void announce(const int64_t* fds, const int64_t* offsets, const std::vector<int64_t>& order, int64_t record_bytes) {
#ifdef POSIX_FADV_WILLNEED
  const int64_t page = sysconf(_SC_PAGESIZE);
  int64_t fd = -1, start = 0, end = 0;
  for (const int64_t i : order) {
    const int64_t begin = offsets[i] * record_bytes;
    if (fds[i] == fd && begin <= end + page) {
      end = std::max(end, begin + record_bytes);
      continue;
    }
    if (fd >= 0) {
      posix_fadvise(static_cast<int>(fd), start, end - start, POSIX_FADV_WILLNEED);
    }
    fd = fds[i], start = begin, end = begin + record_bytes;
  }
  if (fd >= 0) {
    posix_fadvise(static_cast<int>(fd), start, end - start, POSIX_FADV_WILLNEED);
  }
#endif
}

}  // namespace

at::Tensor read_records_cpu(
    const at::Tensor& fds_arg, const at::Tensor& offsets_arg, int64_t record_bytes, const at::Tensor& out) {
  constexpr const char* op = "read_records";
  check_1d_int64(fds_arg, op, "fds");
  check_1d_int64(offsets_arg, op, "offsets");
  const int64_t n = offsets_arg.numel();
  TORCH_CHECK_VALUE(
      fds_arg.numel() == n, op, ": `fds` and `offsets` must have one element per record, got ", fds_arg.numel(),
      " and ", n);
  TORCH_CHECK_VALUE(record_bytes > 0, op, ": record_bytes must be > 0, got ", record_bytes);
  TORCH_CHECK_VALUE(
      out.device().is_cpu() && out.is_contiguous() && static_cast<int64_t>(out.nbytes()) == n * record_bytes, op,
      ": `out` must be a contiguous CPU tensor of ", n * record_bytes, " bytes (", n, " records of ", record_bytes,
      "), got ", out.nbytes(), " bytes on ", out.device());
  const at::Tensor fds_t = fds_arg.contiguous();
  const at::Tensor offsets_t = offsets_arg.contiguous();
  const int64_t* fds = fds_t.data_ptr<int64_t>();
  const int64_t* offsets = offsets_t.data_ptr<int64_t>();
  const int64_t max_offset = std::numeric_limits<off_t>::max() / record_bytes - 1;
  for (int64_t i = 0; i < n; ++i) {
    TORCH_CHECK_VALUE(
        0 <= fds[i] && fds[i] <= std::numeric_limits<int>::max(), op, ": fds[", i, "] = ", fds[i],
        " is not a file descriptor");
    TORCH_CHECK_VALUE(
        0 <= offsets[i] && offsets[i] <= max_offset, op, ": offsets[", i, "] = ", offsets[i],
        " is not a record offset in [0, ", max_offset, "]");
  }
  std::vector<int64_t> order(n);
  std::iota(order.begin(), order.end(), int64_t{0});
  std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    return fds[a] != fds[b] ? fds[a] < fds[b] : offsets[a] < offsets[b];
  });
  announce(fds, offsets, order, record_bytes);

  auto* base = static_cast<uint8_t*>(out.data_ptr());
  int64_t failed = -1, error = 0;
  for (const int64_t i : order) {
    uint8_t* to = base + i * record_bytes;
    int64_t done = 0;
    while (done < record_bytes) {
      const ssize_t got = pread(static_cast<int>(fds[i]), to + done, record_bytes - done, offsets[i] * record_bytes + done);
      if (got > 0) {
        done += got;
      } else if (got < 0 && errno == EINTR) {
        continue;
      } else {
        failed = i, error = got == 0 ? 0 : errno;  // 0: the file ends before the record does
        break;
      }
    }
    if (failed >= 0) {
      break;
    }
  }
  at::Tensor result = at::empty({2}, fds_arg.options());
  result.data_ptr<int64_t>()[0] = failed;
  result.data_ptr<int64_t>()[1] = error;
  return result;
}

}  // namespace torchrec_ascend
