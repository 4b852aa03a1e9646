// Python binding of the emulated NPU (torchrec_ascend.testing._emulator). Loading it registers the device;
// torchrec_ascend.testing.emulated_npu.install() renames it "npu" and adds the Python side.
#include "collectives.h"
#include "emulator.h"

#include <torch/extension.h>

namespace emu = torchrec_ascend::emulator;

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "Emulated NPU (PrivateUse1) runtime of torchrec_ascend.testing; not hardware.";
  m.def("device_count", [] { return static_cast<int>(emu::device_count()); });
  m.def("set_device_count", [](int count) { emu::set_device_count(static_cast<c10::DeviceIndex>(count)); });
  m.def("current_device", [] { return static_cast<int>(emu::current_device()); });
  m.def("set_device", [](int index) { emu::set_current_device(static_cast<c10::DeviceIndex>(index)); });
  m.def("check_index", [](int index) { emu::check_index(static_cast<c10::DeviceIndex>(index)); });
  m.def("synchronize", [](int index) {
    emu::check_index(static_cast<c10::DeviceIndex>(index));
    emu::count_sync();
    emu::host_waited_device(static_cast<c10::DeviceIndex>(index));
  });
  m.def("set_stream_check", &emu::set_stream_check, py::arg("enabled"), py::arg("torch_dir"),
        "Turn the stream-order checker on or off; frames under torch_dir are not call sites.");
  m.def("stream_check_enabled", &emu::stream_check_enabled);
  m.def("raise_pending_stream_error", &emu::raise_pending_stream_error,
        "Raise the error a deleter found (memory freed under another stream's pending work), if any.");
  m.def("current_stream_id", [](int index) { return emu::current_stream_id(static_cast<c10::DeviceIndex>(index)); });
  m.def("set_current_stream_id", [](int index, int64_t stream_id) {
    return emu::set_current_stream_id(static_cast<c10::DeviceIndex>(index), stream_id);
  });
  m.def("stream_priority", &emu::stream_priority);
  m.def("memory_allocated", [](int index) { return emu::memory_allocated(static_cast<c10::DeviceIndex>(index)); });
  m.def("max_memory_allocated",
        [](int index) { return emu::max_memory_allocated(static_cast<c10::DeviceIndex>(index)); });
  m.def("set_memory_capacity", &emu::set_memory_capacity, py::arg("bytes"));
  m.def("memory_capacity", &emu::memory_capacity);
  m.def("reset_peak_memory", [](int index) { emu::reset_peak_memory(static_cast<c10::DeviceIndex>(index)); });
  m.def("counters", [] {
    const auto& c = emu::counters();
    return std::vector<int64_t>{c.h2d.load(), c.h2d_bytes.load(), c.d2h.load(), c.d2h_bytes.load(),
                                c.d2d.load(), c.syncs.load()};
  });
  m.def("thread_counters", &emu::thread_counters,
        "(native thread id, counters) of every live thread that counted, counters in counters()' order.");
  m.def("host_alias", [](const at::Tensor& tensor) { return emu::host_alias(tensor); },
        "A CPU tensor over the same memory as an npu tensor (no copy, not counted).");
  m.def("device_copy", [](const at::Tensor& host, int index) {
    return emu::device_copy(host, c10::Device(emu::kDevice, static_cast<c10::DeviceIndex>(index)));
  }, "A host tensor copied into fresh memory of npu:index (not counted).");
  m.def("provide_ops", &emu::provide_ops);
  m.def("withhold_ops", &emu::withhold_ops);
  m.def("provided_ops", &emu::provided_ops);
  py::class_<emu::EmulatedHccl, c10d::Backend, c10::intrusive_ptr<emu::EmulatedHccl>>(m, "EmulatedHccl")
      .def(py::init<c10::intrusive_ptr<c10d::Backend>, int, int>(), py::arg("host"), py::arg("rank"),
           py::arg("size"));
}
