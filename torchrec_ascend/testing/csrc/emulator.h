// The emulated NPU: shared declarations of the runtime (device.cpp), the operator kernels (ops.cpp) and the
// collective backend (collectives.cpp). Device memory is host memory allocated and owned by the emulator; every
// tensor on it has device type PrivateUse1 ("npu" once torchrec_ascend.testing.emulated_npu.install() renamed it).
#pragma once

#include <ATen/ATen.h>
#include <c10/core/Device.h>

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

namespace torchrec_ascend::emulator {

constexpr c10::DeviceType kDevice = c10::DeviceType::PrivateUse1;

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
void count_sync();

c10::DeviceIndex device_count();
void set_device_count(c10::DeviceIndex count);
c10::DeviceIndex current_device();
void set_current_device(c10::DeviceIndex index);
void check_index(c10::DeviceIndex index);

int64_t memory_allocated(c10::DeviceIndex index);
int64_t max_memory_allocated(c10::DeviceIndex index);
void reset_peak_memory(c10::DeviceIndex index);

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

}  // namespace torchrec_ascend::emulator
