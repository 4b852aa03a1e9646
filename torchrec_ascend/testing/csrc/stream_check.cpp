// Stream-order checker of the emulated NPU, after PyTorch's CUDA Stream Sanitizer (torch/cuda/_sanitizer.py).
//
// Kernels run synchronously on the host, so a missing wait cannot give wrong numbers here; this checker says
// where it would on hardware. Every kernel records the device allocations it reads and writes, on the launching
// thread's current stream. Streams carry vector clocks: each kernel ticks its stream's clock; an event recorded on
// a stream captures what that stream has seen; waiting for it (Stream.wait_event, wait_stream, the autograd
// engine's hand-overs) merges it into the waiting stream; a host wait (synchronize, .item(), a blocking copy)
// makes the host know the work, and work issued afterwards on any stream is ordered after it. An access is an
// error when the allocation was last written (or read, for a write) on another stream whose work the accessing
// stream does not know: the message names the op, the tensor, both streams and both call sites.
//
// Also checked: memory freed while a stream other than its allocation stream may still use it, with no
// record_stream for that stream (the caching allocator of a real device hands it to the next allocation on the
// allocation stream; found in a deleter, the error is raised by the next kernel); and a host read of a pinned
// buffer whose non_blocking device->host copy has not been waited for (the buffer is read-protected until a
// host wait covers the copy; the data lands then, as on hardware; a read before faults and the process stops
// with this checker's message, then faulthandler's Python stack of the read).
//
// A call site is the innermost Python frames outside torch's own package, captured per kernel (under the GIL,
// never while holding this checker's lock), or the autograd node on the engine's threads.
#include "emulator.h"

#include <Python.h>
#include <frameobject.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>
#include <torch/csrc/autograd/function.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <sstream>
#include <unordered_map>

namespace torchrec_ascend::emulator {

// ---- call sites ----------------------------------------------------------------------------------------------
struct Code {
  std::string file;
  std::string name;
  bool internal;
};
struct Site {
  std::string op;
  std::vector<std::pair<const Code*, int>> frames;  // innermost first
  std::string node;                                 // the autograd node, where no Python frame runs

  std::string format() const {
    std::ostringstream out;
    out << op;
    if (!frames.empty()) {
      for (const auto& [code, line] : frames) {
        out << "\n      " << code->file << ":" << line << " in " << code->name;
      }
    } else if (!node.empty()) {
      out << "\n      (autograd engine thread) backward node " << node;
    } else {
      out << "\n      (no Python frame)";
    }
    return out.str();
  }
};
namespace {

std::unordered_map<PyCodeObject*, Code> g_codes;  // under the GIL; each key holds a reference (never reused)
constexpr size_t kFrames = 3;
constexpr int kMaxWalk = 64;

std::atomic<bool> g_enabled{false};
std::string g_torch_dir;  // frames under it are torch's own; a call site is the first frames outside it

using SitePtr = std::shared_ptr<const Site>;

SitePtr capture(std::string op) {
  auto site = std::make_shared<Site>();
  site->op = std::move(op);
  if (Py_IsInitialized() && !_Py_IsFinalizing()) {
    const PyGILState_STATE gil = PyGILState_Ensure();
    PyFrameObject* frame = PyEval_GetFrame();
    Py_XINCREF(frame);
    for (int depth = 0; frame != nullptr && site->frames.size() < kFrames && depth < kMaxWalk; ++depth) {
      PyCodeObject* code = PyFrame_GetCode(frame);
      auto it = g_codes.find(code);
      if (it == g_codes.end()) {
        const char* file = PyUnicode_AsUTF8(code->co_filename);
        const char* name = PyUnicode_AsUTF8(code->co_qualname);
        const std::string path = file != nullptr ? file : "?";
        Code info{path, name != nullptr ? name : "?",
                  !g_torch_dir.empty() && path.compare(0, g_torch_dir.size(), g_torch_dir) == 0};
        it = g_codes.emplace(code, std::move(info)).first;  // keeps the reference PyFrame_GetCode gave
      } else {
        Py_DECREF(code);
      }
      if (!it->second.internal) {
        site->frames.emplace_back(&it->second, PyFrame_GetLineNumber(frame));
      }
      PyFrameObject* back = PyFrame_GetBack(frame);
      Py_DECREF(frame);
      frame = back;
    }
    Py_XDECREF(frame);
    PyErr_Clear();
    PyGILState_Release(gil);
  }
  if (site->frames.empty()) {
    if (const auto node = torch::autograd::get_current_node()) {
      site->node = node->name();
    }
  }
  return site;
}

// ---- streams -------------------------------------------------------------------------------------------------
using Clock = std::unordered_map<int64_t, int64_t>;  // stream key -> the last tick of that stream known done

int64_t key_of(c10::DeviceIndex device, int64_t stream_id) {
  return stream_id * kMaxDevices + device;
}

std::string stream_name(int64_t key) {
  const int64_t id = key / kMaxDevices;
  const int64_t device = key % kMaxDevices;
  std::ostringstream out;
  if (id == 0) {
    out << "the default stream of npu:" << device;
  } else if (id == kCollectiveStream) {
    out << "the collective stream of npu:" << device << " (HCCL's own)";
  } else {
    out << "stream " << id << " of npu:" << device << " (priority " << stream_priority(id) << ")";
  }
  return out.str();
}

void merge(Clock& into, const Clock& from) {
  for (const auto& [stream, tick] : from) {
    auto& mine = into[stream];
    mine = std::max(mine, tick);
  }
}

struct StreamState {
  int64_t tick = 0;
  Clock known;
  uint64_t epoch = 0;  // the host epoch merged into `known`
};

struct Access {
  int64_t stream;
  int64_t tick;
  SitePtr site;
  std::string argument;
};

struct Memory {
  int64_t stream;  // the allocation stream (-1: allocated while the checker was off)
  size_t bytes;
  std::optional<Access> write;
  std::vector<Access> reads;  // since the last write, the latest per stream
  std::vector<int64_t> recorded;  // record_stream
};

struct InFlight {
  int64_t stream;
  int64_t tick;
  at::Tensor destination;  // the pinned buffer (read-protected)
  at::Tensor staging;      // the data, landing in `destination` when a host wait covers the copy
  uintptr_t start;
  size_t length;
};

std::mutex g_mutex;
std::unordered_map<int64_t, StreamState> g_streams;
Clock g_host;  // what the host has waited for
uint64_t g_epoch = 1;
std::unordered_map<const void*, Memory> g_memory;
std::unordered_map<const void*, Clock> g_events;
std::vector<InFlight> g_in_flight;
std::string g_pending;  // an error found in a deleter: raised by the next kernel
std::atomic<bool> g_has_pending{false};

StreamState& state_of(int64_t key) {
  StreamState& s = g_streams[key];
  if (s.epoch != g_epoch) {
    merge(s.known, g_host);
    s.epoch = g_epoch;
  }
  return s;
}

bool ordered(StreamState& on, int64_t on_key, const Access& before) {
  if (before.stream == on_key) {
    return true;
  }
  auto it = on.known.find(before.stream);
  return it != on.known.end() && it->second >= before.tick;
}

Clock seen_by(int64_t key) {
  StreamState& s = state_of(key);
  Clock clock = s.known;
  clock[key] = s.tick;
  return clock;
}

// ---- pinned buffers with a copy in flight: read-protected; a fault there prints why ---------------------------
constexpr int kRegions = 256;
constexpr size_t kMessage = 2048;
struct Region {
  std::atomic<uintptr_t> start{0};
  std::atomic<uintptr_t> end{0};
  char message[kMessage];
};
Region g_regions[kRegions];
struct sigaction g_previous_segv;
std::atomic<bool> g_handler_installed{false};

constexpr char kReadSummary[] =
    "stream-order check (emulated npu): the process stopped at a host read of a pinned buffer whose non_blocking "
    "device->host copy had not been waited for (the copy's call site is above)\n";

void on_segv(int signal, siginfo_t* info, void* context) {
  const auto address = reinterpret_cast<uintptr_t>(info->si_addr);
  bool ours = false;
  for (auto& region : g_regions) {
    if (address >= region.start.load() && address < region.end.load()) {
      const ssize_t ignored = write(STDERR_FILENO, region.message, strnlen(region.message, kMessage));
      (void)ignored;
      ours = true;
      break;
    }
  }
  // The previous handler (faulthandler: the Python stack of the read) runs next; then the default action.
  const struct sigaction previous = g_previous_segv;
  struct sigaction fallback{};
  fallback.sa_handler = SIG_DFL;
  sigaction(SIGSEGV, &fallback, nullptr);
  if ((previous.sa_flags & SA_SIGINFO) != 0 && previous.sa_sigaction != nullptr) {
    previous.sa_sigaction(signal, info, context);
  } else if (previous.sa_handler != SIG_DFL && previous.sa_handler != SIG_IGN) {
    previous.sa_handler(signal);
  }
  if (ours) {  // last in the output, where a run's tail shows it
    const ssize_t ignored = write(STDERR_FILENO, kReadSummary, sizeof(kReadSummary) - 1);
    (void)ignored;
  }
  sigaction(SIGSEGV, &fallback, nullptr);
}

void install_handler() {
  if (g_handler_installed.exchange(true)) {
    return;
  }
  struct sigaction action{};
  action.sa_sigaction = &on_segv;
  action.sa_flags = SA_SIGINFO;
  sigemptyset(&action.sa_mask);
  sigaction(SIGSEGV, &action, &g_previous_segv);
}

void protect(const InFlight& copy, const std::string& message) {
  for (auto& region : g_regions) {
    if (region.start.load() == 0) {
      std::snprintf(region.message, kMessage, "%s\n", message.c_str());
      region.end = copy.start + copy.length;
      region.start = copy.start;
      break;
    }
  }
  TORCH_CHECK(mprotect(reinterpret_cast<void*>(copy.start), copy.length, PROT_NONE) == 0,
              "emulated npu: mprotect of a pinned buffer failed: ", std::strerror(errno));
}

void unprotect_and_land(InFlight& copy) {
  bool still_protected = false;
  for (const auto& other : g_in_flight) {
    still_protected |= other.start == copy.start;
  }
  if (!still_protected) {
    mprotect(reinterpret_cast<void*>(copy.start), copy.length, PROT_READ | PROT_WRITE);
    for (auto& region : g_regions) {
      if (region.start.load() == copy.start) {
        region.start = 0;
        region.end = 0;
      }
    }
  } else {
    mprotect(reinterpret_cast<void*>(copy.start), copy.length, PROT_READ | PROT_WRITE);
  }
  copy.destination.copy_(copy.staging);
  if (still_protected) {
    mprotect(reinterpret_cast<void*>(copy.start), copy.length, PROT_NONE);
  }
}

// After a host wait (g_mutex held): the copies it covers leave g_in_flight and are returned to land.
std::vector<InFlight> covered_copies() {
  std::vector<InFlight> done;
  for (auto it = g_in_flight.begin(); it != g_in_flight.end();) {
    auto known = g_host.find(it->stream);
    if (known != g_host.end() && known->second >= it->tick) {
      done.push_back(std::move(*it));
      it = g_in_flight.erase(it);
    } else {
      ++it;
    }
  }
  return done;
}

void host_learns(const Clock& clock) {
  std::vector<InFlight> landing;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    merge(g_host, clock);
    ++g_epoch;
    landing = covered_copies();
    for (auto& copy : landing) {
      unprotect_and_land(copy);
    }
  }
}

std::string describe(const at::Tensor& tensor) {
  std::ostringstream out;
  out << "a " << tensor.scalar_type() << " tensor of shape " << tensor.sizes() << " on " << tensor.device()
      << " (storage " << tensor.storage().data() << ", " << tensor.storage().nbytes() << " bytes)";
  return out.str();
}

std::string wait_hint(int64_t waiter, int64_t writer) {
  return "make " + stream_name(waiter) + " wait for " + stream_name(writer) +
         " first: record an event on it after the access and call wait_event(event) on this stream "
         "(or this_stream.wait_stream(that_stream), or synchronize)";
}

}  // namespace

void set_stream_check(bool enabled, const std::string& torch_dir) {
  g_torch_dir = torch_dir;
  if (enabled) {
    install_handler();
  }
  g_enabled = enabled;
}

bool stream_check_enabled() {
  return g_enabled.load(std::memory_order_relaxed);
}

void raise_pending_stream_error() {
  if (!g_has_pending.load(std::memory_order_relaxed)) {
    return;
  }
  std::string pending;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    pending.swap(g_pending);
    g_has_pending = false;
  }
  TORCH_CHECK(pending.empty(), pending);
}

namespace {

// Check `uses` as one kernel on stream `key` (g_mutex held): the error message, or "" after recording them.
std::string check_and_record(const std::string& op, const std::vector<std::pair<const void*, const TensorUse*>>& mine,
                             int64_t key, int64_t tick, const SitePtr& site) {
  StreamState& on = state_of(key);
  for (const auto& [allocation, use] : mine) {
    Memory& memory = g_memory.try_emplace(allocation, Memory{-1, use->tensor->storage().nbytes()}).first->second;
    const Access* conflict = nullptr;
    if (memory.write && !ordered(on, key, *memory.write)) {
      conflict = &*memory.write;
    } else if (use->write) {
      for (const auto& read : memory.reads) {
        if (!ordered(on, key, read)) {
          conflict = &read;
          break;
        }
      }
    }
    if (conflict != nullptr) {
      const bool was_write = conflict == &*memory.write;
      std::ostringstream out;
      out << "stream-order check (emulated npu): " << op << " on " << stream_name(key)
          << (use->write ? " writes " : " reads ") << describe(*use->tensor) << " (argument '" << use->argument
          << "'), which " << (was_write ? "was written" : "was read") << " on " << stream_name(conflict->stream)
          << " with nothing ordering the two (no event recorded there and waited for here, no wait_stream, "
          << "no synchronize since).\n  this access: " << site->format() << "\n  the earlier "
          << (was_write ? "write" : "read") << " (argument '" << conflict->argument
          << "'): " << conflict->site->format() << "\n  On hardware the two may run in either order. Fix: "
          << wait_hint(key, conflict->stream) << ".";
      return out.str();
    }
  }
  for (const auto& [allocation, use] : mine) {
    Memory& memory = g_memory.at(allocation);
    Access access{key, tick, site, use->argument};
    if (use->write) {
      memory.write = std::move(access);
      memory.reads.clear();
    } else {
      bool replaced = false;
      for (auto& read : memory.reads) {
        if (read.stream == key) {
          read = access;
          replaced = true;
        }
      }
      if (!replaced) {
        memory.reads.push_back(std::move(access));
      }
    }
  }
  return "";
}

std::vector<std::pair<const void*, const TensorUse*>> device_uses(const std::vector<TensorUse>& uses) {
  std::vector<std::pair<const void*, const TensorUse*>> mine;
  for (const auto& use : uses) {
    if (const void* allocation = allocation_of(*use.tensor)) {
      mine.emplace_back(allocation, &use);
    }
  }
  return mine;
}

}  // namespace

KernelCheck::KernelCheck(const std::string& op, const std::vector<TensorUse>& uses) {
  if (!stream_check_enabled()) {
    return;
  }
  raise_pending_stream_error();
  const auto mine = device_uses(uses);
  if (mine.empty()) {
    return;
  }
  active_ = true;
  const c10::DeviceIndex device = mine.front().second->tensor->device().index();
  site_ = capture(op);
  std::string error;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    stream_ = key_of(device, current_stream_id(device));
    tick_ = ++state_of(stream_).tick;
    error = check_and_record(op, mine, stream_, tick_, site_);
  }
  TORCH_CHECK(error.empty(), error);
}

CollectiveClock collective_launched(const std::string& op, const std::vector<TensorUse>& uses) {
  CollectiveClock done;
  if (!stream_check_enabled()) {
    return done;
  }
  raise_pending_stream_error();
  const auto mine = device_uses(uses);
  if (mine.empty()) {
    return done;
  }
  done.device = mine.front().second->tensor->device().index();
  const SitePtr site = capture(op);
  std::string error;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    const int64_t launcher = key_of(done.device, current_stream_id(done.device));
    const int64_t key = key_of(done.device, kCollectiveStream);
    const Clock before = seen_by(launcher);
    StreamState& collective = state_of(key);
    merge(collective.known, before);
    const int64_t tick = ++collective.tick;
    error = check_and_record(op, mine, key, tick, site);
    for (const auto& [allocation, use] : mine) {
      g_memory.at(allocation).recorded.push_back(key);
    }
    const Clock after = seen_by(key);
    done.clock.assign(after.begin(), after.end());
  }
  TORCH_CHECK(error.empty(), error);
  return done;
}

void collective_waited(const CollectiveClock& done) {
  if (!stream_check_enabled() || done.device < 0) {
    return;
  }
  std::lock_guard<std::mutex> lock(g_mutex);
  StreamState& waiter = state_of(key_of(done.device, current_stream_id(done.device)));
  for (const auto& [stream, tick] : done.clock) {
    auto& mine = waiter.known[stream];
    mine = std::max(mine, tick);
  }
}

void KernelCheck::wrote(const at::Tensor& output, const std::string& argument) {
  if (!active_) {
    return;
  }
  const void* allocation = allocation_of(output);
  if (allocation == nullptr) {
    return;
  }
  std::lock_guard<std::mutex> lock(g_mutex);
  auto it = g_memory.find(allocation);
  if (it != g_memory.end()) {
    it->second.write = Access{stream_, tick_, site_, argument};
    it->second.reads.clear();
  }
}

void memory_allocated_on(const void* allocation, size_t bytes, c10::DeviceIndex device) {
  if (!stream_check_enabled()) {
    return;
  }
  std::lock_guard<std::mutex> lock(g_mutex);
  g_memory[allocation] = Memory{key_of(device, current_stream_id(device)), bytes};
}

void memory_freed(const void* allocation) noexcept {
  if (!stream_check_enabled()) {
    return;
  }
  std::lock_guard<std::mutex> lock(g_mutex);
  auto it = g_memory.find(allocation);
  if (it == g_memory.end()) {
    return;
  }
  Memory memory = std::move(it->second);
  g_memory.erase(it);
  if (memory.stream < 0 || !g_pending.empty()) {
    return;
  }
  StreamState& owner = state_of(memory.stream);
  std::vector<const Access*> accesses;
  if (memory.write) {
    accesses.push_back(&*memory.write);
  }
  for (const auto& read : memory.reads) {
    accesses.push_back(&read);
  }
  for (const Access* access : accesses) {
    const bool recorded =
        std::find(memory.recorded.begin(), memory.recorded.end(), access->stream) != memory.recorded.end();
    if (recorded || ordered(owner, memory.stream, *access)) {
      continue;
    }
    std::ostringstream out;
    out << "stream-order check (emulated npu): device memory (" << memory.bytes << " bytes) allocated on "
        << stream_name(memory.stream) << " was freed while " << stream_name(access->stream)
        << " may still use it, with no record_stream for that stream: the caching allocator of a real device "
        << "hands it to the next allocation on " << stream_name(memory.stream) << ", which can overwrite it under "
        << "the pending work.\n  the last use on " << stream_name(access->stream) << " (argument '"
        << access->argument << "'): " << access->site->format() << "\n  Fix: call tensor.record_stream("
        << "<that stream>) where the tensor is handed to it (or make " << stream_name(memory.stream)
        << " wait for it before the tensor is dropped).";
    g_pending = out.str();
    g_has_pending = true;
    return;
  }
}

void memory_recorded_on(const void* allocation, c10::Stream stream) {
  if (!stream_check_enabled() || allocation == nullptr) {
    return;
  }
  std::lock_guard<std::mutex> lock(g_mutex);
  auto it = g_memory.find(allocation);
  if (it != g_memory.end()) {
    it->second.recorded.push_back(key_of(stream.device_index(), stream.id()));
  }
}

void event_recorded(const void* event, c10::Stream stream) {
  if (!stream_check_enabled()) {
    return;
  }
  std::lock_guard<std::mutex> lock(g_mutex);
  g_events[event] = seen_by(key_of(stream.device_index(), stream.id()));
}

void event_waited(const void* event, c10::Stream stream) {
  if (!stream_check_enabled()) {
    return;
  }
  std::lock_guard<std::mutex> lock(g_mutex);
  auto it = g_events.find(event);
  if (it != g_events.end()) {  // an event never recorded orders nothing (as on hardware)
    merge(state_of(key_of(stream.device_index(), stream.id())).known, it->second);
  }
}

void event_destroyed(const void* event) noexcept {
  std::lock_guard<std::mutex> lock(g_mutex);
  g_events.erase(event);
}

void host_waited_event(const void* event) {
  if (!stream_check_enabled()) {
    return;
  }
  Clock clock;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    auto it = g_events.find(event);
    if (it == g_events.end()) {
      return;
    }
    clock = it->second;
  }
  host_learns(clock);
}

void host_waited_stream(c10::DeviceIndex device, int64_t stream_id) {
  if (!stream_check_enabled()) {
    return;
  }
  Clock clock;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    clock = seen_by(key_of(device, stream_id));
  }
  host_learns(clock);
}

void host_waited_device(c10::DeviceIndex device) {
  if (!stream_check_enabled()) {
    return;
  }
  Clock clock;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    std::vector<int64_t> keys;
    for (const auto& entry : g_streams) {
      if (entry.first % kMaxDevices == device) {
        keys.push_back(entry.first);
      }
    }
    for (int64_t key : keys) {
      merge(clock, seen_by(key));
    }
  }
  host_learns(clock);
}

bool copy_in_flight(const at::Tensor& destination, const at::Tensor& source_host, uintptr_t start, size_t length) {
  if (!stream_check_enabled()) {
    return false;
  }
  const c10::DeviceIndex device = current_device();
  SitePtr site = capture("a non_blocking device->host copy (aten::_copy_from)");
  InFlight copy{0, 0, destination, source_host.clone(), start, length};
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    copy.stream = key_of(device, current_stream_id(device));
    copy.tick = g_streams[copy.stream].tick;
    std::ostringstream out;
    out << "stream-order check (emulated npu): host read of a pinned buffer (" << describe(destination)
        << ") whose non_blocking device->host copy on " << stream_name(copy.stream)
        << " has not been waited for; on hardware it may not have arrived. The copy: " << site->format()
        << "\n  Fix: record an event on that stream after the copy and call event.synchronize() (or "
        << "stream.synchronize()) before the host reads the buffer. The read is the Python stack below "
        << "(faulthandler), if enabled.";
    protect(copy, out.str());
    g_in_flight.push_back(std::move(copy));
  }
  return true;
}

}  // namespace torchrec_ascend::emulator
