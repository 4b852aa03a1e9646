// The emulated NPU: shared declarations of the runtime (device.cpp), the operator kernels (ops.cpp) and the
// collective backend (collectives.cpp). Device memory is host memory allocated and owned by the emulator; every
// tensor on it has device type PrivateUse1 ("npu" once torchrec_ascend.testing.emulated_npu.install() renamed it).
#pragma once

#include <ATen/ATen.h>
#include <c10/core/Device.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace torchrec_ascend::emulator {

constexpr c10::DeviceType kDevice = c10::DeviceType::PrivateUse1;
constexpr c10::DeviceIndex kMaxDevices = 64;
// The stream id of each device's collective stream (where the stream-order checker runs collectives).
constexpr int64_t kCollectiveStream = int64_t{1} << 40;

// Traffic counters: copies between host and device memory, and the times the host waited for the device.
struct Counters {
  std::atomic<int64_t> h2d{0};
  std::atomic<int64_t> h2d_bytes{0};
  std::atomic<int64_t> d2h{0};
  std::atomic<int64_t> d2h_bytes{0};
  std::atomic<int64_t> d2d{0};
  std::atomic<int64_t> syncs{0};
};

Counters& counters();
// Each count goes to the process's counters and to the calling thread's (so a report can say which thread copied
// or waited: a lane waiting on an event is allowed, the compute thread waiting is not).
void count_sync();
void count_h2d(int64_t bytes);
void count_d2h(int64_t bytes, bool blocking);  // a blocking one is also a host sync
void count_d2d();
// The counters of every live thread that counted, by native thread id (threading.get_native_id()).
std::vector<std::pair<int64_t, std::vector<int64_t>>> thread_counters();

c10::DeviceIndex device_count();
void set_device_count(c10::DeviceIndex count);
c10::DeviceIndex current_device();
void set_current_device(c10::DeviceIndex index);
void check_index(c10::DeviceIndex index);

int64_t memory_allocated(c10::DeviceIndex index);
int64_t max_memory_allocated(c10::DeviceIndex index);
void reset_peak_memory(c10::DeviceIndex index);
// Device memory per device, in bytes (0: unbounded); an allocation past it fails as torch_npu's does.
void set_memory_capacity(int64_t bytes);
int64_t memory_capacity();

// Streams: ids per device, a current stream per thread and device (0 is the default stream).
int64_t current_stream_id(c10::DeviceIndex index);
int64_t set_current_stream_id(c10::DeviceIndex index, int64_t stream_id);  // returns the previous one
int stream_priority(int64_t stream_id);

// A CPU tensor over the same memory as an emulated-device tensor (same storage bytes, offset, sizes, strides).
// `resizable`: a kernel may grow it; it then moves to fresh host memory and the caller copies it back.
at::Tensor host_alias(const at::Tensor& tensor, bool resizable = false);

// A host tensor copied into fresh memory of `device` (not counted: the emulator's own data movement).
at::Tensor device_copy(const at::Tensor& host, c10::Device device);

// fbgemm (or other non-aten) operators given a device kernel, by qualified name "ns::name[.overload]".
void provide_ops(const std::vector<std::string>& names);
void withhold_ops(const std::vector<std::string>& names);
std::vector<std::string> provided_ops();

// The allocation (the allocator's context) holding a tensor's memory on the emulated npu; nullptr for other
// tensors and empty storages.
const void* allocation_of(const at::Tensor& tensor);
// The pinned allocation holding `data`, page-aligned: its start and length (false if `data` is not pinned).
bool pinned_region(const void* data, uintptr_t* start, size_t* length);

// ---- stream-order checker (stream_check.cpp; off until set_stream_check(true)) ------------------------------
void set_stream_check(bool enabled, const std::string& torch_dir);
bool stream_check_enabled();
// Raise the error a deleter found (memory freed under another stream's pending work), if any.
void raise_pending_stream_error();

struct TensorUse {
  const at::Tensor* tensor;
  std::string argument;
  bool write;
};
struct Site;

// One kernel on the current stream: checks its reads and writes against the other streams' (raises on a race)
// and records them; `wrote` records an output in fresh memory.
class KernelCheck {
 public:
  KernelCheck(const std::string& op, const std::vector<TensorUse>& uses);
  void wrote(const at::Tensor& output, const std::string& argument);

 private:
  bool active_ = false;
  int64_t stream_ = 0;
  int64_t tick_ = 0;
  std::shared_ptr<const Site> site_;
};

// A collective over `uses`, launched from the current stream: it runs on the device's collective stream (HCCL's
// own), after the launching stream's work, and records its tensors there (as HCCL does). Returns what waiting for
// it (Work::wait) makes the waiting stream know.
struct CollectiveClock {
  c10::DeviceIndex device = -1;
  std::vector<std::pair<int64_t, int64_t>> clock;
};
CollectiveClock collective_launched(const std::string& op, const std::vector<TensorUse>& uses);
void collective_waited(const CollectiveClock& done);

void memory_allocated_on(const void* allocation, size_t bytes, c10::DeviceIndex device);
void memory_freed(const void* allocation) noexcept;
void memory_recorded_on(const void* allocation, c10::Stream stream);  // record_stream
void event_recorded(const void* event, c10::Stream stream);
void event_waited(const void* event, c10::Stream stream);
void event_destroyed(const void* event) noexcept;
void host_waited_event(const void* event);
void host_waited_stream(c10::DeviceIndex device, int64_t stream_id);
void host_waited_device(c10::DeviceIndex device);
// A non_blocking device->host copy into the pinned `destination`: the data (`source_host`, copied now) lands when
// a host wait covers the copy; until then the pinned pages [start, start + length) are read-protected. False:
// the checker is off (copy at once).
bool copy_in_flight(const at::Tensor& destination, const at::Tensor& source_host, uintptr_t start, size_t length);

}  // namespace torchrec_ascend::emulator
