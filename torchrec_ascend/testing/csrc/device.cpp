// Runtime of the emulated NPU: device memory (its own allocator), pinned host memory, the device guard with
// streams and events, and the PrivateUse1 hooks torch asks for device count, current device and pinned memory.
// Work is executed synchronously on the host; streams and events keep the bookkeeping torch expects (a current
// stream per thread and device, event timestamps for elapsed_time) and tell the stream-order checker
// (stream_check.cpp) what orders what.
#include "emulator.h"

#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/core/impl/alloc_cpu.h>

#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <iomanip>
#include <sstream>
#include <cstring>
#include <map>
#include <mutex>
#include <unordered_map>

namespace torchrec_ascend::emulator {

namespace {

std::atomic<c10::DeviceIndex> g_device_count{8};
thread_local c10::DeviceIndex t_current_device = 0;

struct MemoryStats {
  std::atomic<int64_t> allocated{0};
  std::atomic<int64_t> peak{0};
};
MemoryStats g_memory[kMaxDevices];
std::atomic<int64_t> g_capacity{0};  // bytes per device; 0: unbounded

// A size as torch_npu's (and CUDA's) allocator messages write it.
std::string format_size(int64_t bytes) {
  std::ostringstream out;
  out << std::fixed << std::setprecision(2);
  const double b = static_cast<double>(bytes);
  if (bytes < 1024) {
    out << bytes << " bytes";
  } else if (bytes < 1024 * 1024) {
    out << b / 1024.0 << " KiB";
  } else if (bytes < int64_t{1024} * 1024 * 1024) {
    out << b / (1024.0 * 1024.0) << " MiB";
  } else {
    out << b / (1024.0 * 1024.0 * 1024.0) << " GiB";
  }
  return out.str();
}

// Count `nbytes` against the device's capacity, or fail as torch_npu's allocator fails (its message, and
// torch.OutOfMemoryError) without allocating.
void reserve(c10::DeviceIndex device, size_t nbytes) {
  auto& stats = g_memory[device];
  const int64_t bytes = static_cast<int64_t>(nbytes);
  const int64_t now = stats.allocated += bytes;
  const int64_t capacity = g_capacity.load();
  if (capacity > 0 && now > capacity) {
    stats.allocated -= bytes;
    TORCH_CHECK_WITH(OutOfMemoryError, false, "NPU out of memory. Tried to allocate ", format_size(bytes),
                     " (NPU ", static_cast<int>(device), "; ", format_size(capacity), " total capacity; ",
                     format_size(now - bytes), " already allocated; ", format_size(capacity - (now - bytes)),
                     " free) on the emulated npu, whose capacity is the npu profile's HBM unless "
                     "install(memory=...) or TORCHREC_ASCEND_EMULATOR_MEMORY sets it: the model does not fit one "
                     "device; shard it over more devices or give its tables smaller caches");
  }
  int64_t peak = stats.peak.load();
  while (now > peak && !stats.peak.compare_exchange_weak(peak, now)) {
  }
}

// ---- device memory ---------------------------------------------------------------------------------------
struct Block {
  void* data;
  size_t size;
  c10::DeviceIndex device;
};

void free_block(void* ctx) {
  auto* block = static_cast<Block*>(ctx);
  memory_freed(block);
  g_memory[block->device].allocated -= static_cast<int64_t>(block->size);
  c10::free_cpu(block->data);
  delete block;
}

struct DeviceAllocator final : c10::Allocator {
  c10::DataPtr allocate(size_t nbytes) override {
    const c10::DeviceIndex device = current_device();
    const c10::Device where(kDevice, device);
    if (nbytes == 0) {
      return {nullptr, nullptr, &c10::detail::deleteNothing, where};
    }
    reserve(device, nbytes);
    auto* block = new Block{c10::alloc_cpu(nbytes), nbytes, device};
    memory_allocated_on(block, nbytes, device);
    return {block->data, block, &free_block, where};
  }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    std::memcpy(dest, src, count);
  }
};
DeviceAllocator g_device_allocator;

// ---- pinned host memory ----------------------------------------------------------------------------------
std::mutex g_pinned_mutex;
std::map<uintptr_t, size_t> g_pinned;  // start address -> size

// Pinned buffers are whole pages: the stream-order checker read-protects one while a copy into it is in flight.
size_t page_size() {
  static const size_t size = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return size;
}

size_t whole_pages(size_t nbytes) {
  return (nbytes + page_size() - 1) / page_size() * page_size();
}

void free_pinned(void* data) {
  {
    std::lock_guard<std::mutex> lock(g_pinned_mutex);
    g_pinned.erase(reinterpret_cast<uintptr_t>(data));
  }
  std::free(data);
}

struct PinnedAllocator final : c10::Allocator {
  c10::DataPtr allocate(size_t nbytes) override {
    void* data = nullptr;
    if (nbytes > 0) {
      TORCH_CHECK(posix_memalign(&data, page_size(), whole_pages(nbytes)) == 0,
                  "emulated npu: out of host memory allocating ", nbytes, " bytes of pinned memory");
      std::lock_guard<std::mutex> lock(g_pinned_mutex);
      g_pinned[reinterpret_cast<uintptr_t>(data)] = nbytes;
    }
    return {data, data, &free_pinned, c10::Device(c10::DeviceType::CPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override {
    return &free_pinned;
  }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    std::memcpy(dest, src, count);
  }
};
PinnedAllocator g_pinned_allocator;

bool is_pinned(const void* data) {
  uintptr_t start = 0;
  size_t length = 0;
  return pinned_region(data, &start, &length);
}

// ---- streams and events ----------------------------------------------------------------------------------
std::atomic<int64_t> g_next_stream{1};
std::mutex g_stream_mutex;
std::unordered_map<int64_t, int> g_stream_priority;
thread_local int64_t t_current_stream[kMaxDevices] = {};

struct EventRecord {
  std::chrono::steady_clock::time_point when;
  bool recorded = false;
};

double now_ms(const EventRecord* event) {
  return std::chrono::duration<double, std::milli>(event->when.time_since_epoch()).count();
}

struct GuardImpl final : c10::impl::DeviceGuardImplInterface {
  c10::DeviceType type() const override {
    return kDevice;
  }
  c10::Device exchangeDevice(c10::Device device) const override {
    const c10::Device old = getDevice();
    if (device.index() != old.index()) {
      setDevice(device);
    }
    return old;
  }
  c10::Device getDevice() const override {
    return {kDevice, current_device()};
  }
  void setDevice(c10::Device device) const override {
    TORCH_CHECK(device.type() == kDevice, "emulated npu guard got a device of type ", device.type());
    set_current_device(device.index());
  }
  void uncheckedSetDevice(c10::Device device) const noexcept override {
    if (device.index() >= 0 && device.index() < device_count()) {
      t_current_device = device.index();
    }
  }
  c10::Stream getStream(c10::Device device) const override {
    const auto index = device.index() < 0 ? current_device() : device.index();
    return c10::Stream(c10::Stream::UNSAFE, c10::Device(kDevice, index), current_stream_id(index));
  }
  c10::Stream getDefaultStream(c10::Device device) const override {
    const auto index = device.index() < 0 ? current_device() : device.index();
    return c10::Stream(c10::Stream::UNSAFE, c10::Device(kDevice, index), 0);
  }
  c10::Stream getStreamFromGlobalPool(c10::Device device, bool high_priority) const override {
    return getNewStream(device, high_priority ? -1 : 0);
  }
  c10::Stream getNewStream(c10::Device device, int priority) const override {
    const auto index = device.index() < 0 ? current_device() : device.index();
    check_index(index);
    const int64_t id = g_next_stream++;
    {
      std::lock_guard<std::mutex> lock(g_stream_mutex);
      g_stream_priority[id] = priority;
    }
    return c10::Stream(c10::Stream::UNSAFE, c10::Device(kDevice, index), id);
  }
  c10::Stream exchangeStream(c10::Stream stream) const override {
    const auto index = stream.device_index();
    const int64_t old = set_current_stream_id(index, stream.id());
    return c10::Stream(c10::Stream::UNSAFE, c10::Device(kDevice, index), old);
  }
  void destroyEvent(void* event, const c10::DeviceIndex) const noexcept override {
    event_destroyed(event);
    delete static_cast<EventRecord*>(event);
  }
  void record(void** event, const c10::Stream& stream, const c10::DeviceIndex, const c10::EventFlag)
      const override {
    TORCH_CHECK(stream.device_type() == kDevice, "an emulated npu event can only record an npu stream");
    if (*event == nullptr) {
      *event = new EventRecord();
    }
    auto* record = static_cast<EventRecord*>(*event);
    record->when = std::chrono::steady_clock::now();
    record->recorded = true;
    event_recorded(record, stream);
  }
  void block(void* event, const c10::Stream& stream) const override {
    if (event != nullptr) {
      event_waited(event, stream);
    }
  }
  bool queryEvent(void* event) const override {  // done at once: the host now knows the work before it
    if (event != nullptr) {
      host_waited_event(event);
    }
    return true;
  }
  c10::DeviceIndex deviceCount() const noexcept override {
    return device_count();
  }
  bool queryStream(const c10::Stream& stream) const override {
    host_waited_stream(stream.device_index(), stream.id());
    return true;
  }
  void synchronizeStream(const c10::Stream& stream) const override {
    count_sync();
    host_waited_stream(stream.device_index(), stream.id());
  }
  void synchronizeEvent(void* event) const override {
    count_sync();
    if (event != nullptr) {
      host_waited_event(event);
    }
  }
  void synchronizeDevice(const c10::DeviceIndex device) const override {
    count_sync();
    host_waited_device(device < 0 ? current_device() : device);
  }
  void recordDataPtrOnStream(const c10::DataPtr& data, const c10::Stream& stream) const override {
    if (data.get_deleter() == &free_block) {
      memory_recorded_on(data.get_context(), stream);
    }
  }
  double elapsedTime(void* start, void* end, const c10::DeviceIndex) const override {
    auto* a = static_cast<EventRecord*>(start);
    auto* b = static_cast<EventRecord*>(end);
    TORCH_CHECK(a != nullptr && b != nullptr && a->recorded && b->recorded,
                "elapsed_time needs two recorded events (record() both first)");
    return now_ms(b) - now_ms(a);
  }
};

// ---- hooks -----------------------------------------------------------------------------------------------
struct Hooks final : at::PrivateUse1HooksInterface {
  bool isBuilt() const override {
    return true;
  }
  bool isAvailable() const override {
    return true;
  }
  bool hasPrimaryContext(c10::DeviceIndex) const override {
    return true;
  }
  c10::DeviceIndex deviceCount() const override {
    return device_count();
  }
  void setCurrentDevice(c10::DeviceIndex device) const override {
    set_current_device(device);
  }
  c10::DeviceIndex getCurrentDevice() const override {
    return current_device();
  }
  c10::DeviceIndex exchangeDevice(c10::DeviceIndex device) const override {
    const auto old = current_device();
    set_current_device(device);
    return old;
  }
  c10::DeviceIndex maybeExchangeDevice(c10::DeviceIndex device) const override {
    return exchangeDevice(device);
  }
  bool isPinnedPtr(const void* data) const override {
    return is_pinned(data);
  }
  at::Allocator* getPinnedMemoryAllocator() const override {
    return &g_pinned_allocator;
  }
  at::Device getDeviceFromPtr(void*) const override {
    return {kDevice, current_device()};
  }
  void resizePrivateUse1Bytes(const c10::Storage& storage, size_t newsize) const override {
    auto* impl = storage.unsafeGetStorageImpl();
    TORCH_CHECK(impl->resizable(), "this emulated npu storage is not resizable");
    const c10::DeviceGuard guard(storage.device());
    at::DataPtr fresh = g_device_allocator.allocate(newsize);
    const size_t keep = std::min(newsize, impl->nbytes());
    if (keep > 0) {
      std::memcpy(fresh.get(), impl->data(), keep);
    }
    impl->set_data_ptr_noswap(std::move(fresh));
    impl->set_nbytes(newsize);
  }
};

struct Registration {
  Registration() {
    at::RegisterPrivateUse1HooksInterface(new Hooks());
  }
};
Registration g_registration;

}  // namespace

C10_REGISTER_GUARD_IMPL(PrivateUse1, GuardImpl);
REGISTER_ALLOCATOR(c10::DeviceType::PrivateUse1, &g_device_allocator);

const void* allocation_of(const at::Tensor& tensor) {
  if (!tensor.defined() || tensor.device().type() != kDevice || !tensor.has_storage()) {
    return nullptr;
  }
  const c10::DataPtr& data = tensor.storage().data_ptr();
  return data.get_deleter() == &free_block ? data.get_context() : nullptr;
}

bool pinned_region(const void* data, uintptr_t* start, size_t* length) {
  const auto address = reinterpret_cast<uintptr_t>(data);
  std::lock_guard<std::mutex> lock(g_pinned_mutex);
  auto it = g_pinned.upper_bound(address);
  if (it == g_pinned.begin()) {
    return false;
  }
  --it;
  if (address >= it->first + it->second) {
    return false;
  }
  *start = it->first;
  *length = whole_pages(it->second);
  return true;
}

Counters& counters() {
  static Counters instance;
  return instance;
}

namespace {

struct ThreadCounters {
  int64_t native_id = static_cast<int64_t>(syscall(SYS_gettid));
  Counters counts;
};

// Live threads' counters: each thread registers its record at its first count and removes it at exit.
std::mutex g_threads_mutex;
std::vector<std::shared_ptr<ThreadCounters>> g_threads;

struct ThreadSlot {
  std::shared_ptr<ThreadCounters> record = std::make_shared<ThreadCounters>();
  ThreadSlot() {
    const std::lock_guard<std::mutex> lock(g_threads_mutex);
    g_threads.push_back(record);
  }
  ~ThreadSlot() {
    const std::lock_guard<std::mutex> lock(g_threads_mutex);
    g_threads.erase(std::remove(g_threads.begin(), g_threads.end(), record), g_threads.end());
  }
};

Counters& this_thread() {
  thread_local ThreadSlot slot;
  return slot.record->counts;
}

}  // namespace

void count_sync() {
  counters().syncs++;
  this_thread().syncs++;
}

void count_h2d(int64_t bytes) {
  for (Counters* c : {&counters(), &this_thread()}) {
    c->h2d++;
    c->h2d_bytes += bytes;
  }
}

void count_d2h(int64_t bytes, bool blocking) {
  for (Counters* c : {&counters(), &this_thread()}) {
    c->d2h++;
    c->d2h_bytes += bytes;
    c->syncs += blocking ? 1 : 0;
  }
}

void count_d2d() {
  counters().d2d++;
  this_thread().d2d++;
}

std::vector<std::pair<int64_t, std::vector<int64_t>>> thread_counters() {
  const std::lock_guard<std::mutex> lock(g_threads_mutex);
  std::vector<std::pair<int64_t, std::vector<int64_t>>> out;
  for (const auto& t : g_threads) {
    const Counters& c = t->counts;
    out.emplace_back(t->native_id, std::vector<int64_t>{c.h2d.load(), c.h2d_bytes.load(), c.d2h.load(),
                                                        c.d2h_bytes.load(), c.d2d.load(), c.syncs.load()});
  }
  return out;
}

c10::DeviceIndex device_count() {
  return g_device_count.load();
}

void set_device_count(c10::DeviceIndex count) {
  TORCH_CHECK(count >= 1 && count <= kMaxDevices, "the emulated npu supports 1 to ", kMaxDevices,
              " devices per process, got ", count);
  g_device_count = count;
}

void check_index(c10::DeviceIndex index) {
  TORCH_CHECK(index >= 0 && index < device_count(), "npu:", static_cast<int>(index),
              " is not a device of the emulated npu (it has ", static_cast<int>(device_count()),
              " devices; torchrec_ascend.testing.emulated_npu.install(device_count=...) sets the number)");
}

c10::DeviceIndex current_device() {
  return t_current_device;
}

void set_current_device(c10::DeviceIndex index) {
  if (index < 0) {
    return;
  }
  check_index(index);
  t_current_device = index;
}

int64_t memory_allocated(c10::DeviceIndex index) {
  check_index(index);
  return g_memory[index].allocated.load();
}

int64_t max_memory_allocated(c10::DeviceIndex index) {
  check_index(index);
  return g_memory[index].peak.load();
}

void set_memory_capacity(int64_t bytes) {
  TORCH_CHECK(bytes >= 0, "the emulated npu's memory capacity must be >= 0 bytes (0: unbounded), got ", bytes);
  g_capacity = bytes;
}

int64_t memory_capacity() {
  return g_capacity.load();
}

void reset_peak_memory(c10::DeviceIndex index) {
  check_index(index);
  g_memory[index].peak = g_memory[index].allocated.load();
}

int64_t current_stream_id(c10::DeviceIndex index) {
  check_index(index);
  return t_current_stream[index];
}

int64_t set_current_stream_id(c10::DeviceIndex index, int64_t stream_id) {
  check_index(index);
  const int64_t old = t_current_stream[index];
  t_current_stream[index] = stream_id;
  return old;
}

int stream_priority(int64_t stream_id) {
  std::lock_guard<std::mutex> lock(g_stream_mutex);
  auto it = g_stream_priority.find(stream_id);
  return it == g_stream_priority.end() ? 0 : it->second;
}

}  // namespace torchrec_ascend::emulator
