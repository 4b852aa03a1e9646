// Operator kernels of the emulated NPU.
//
// * Memory and metadata kernels (empty, views, resize_, set_) work on the emulator's own memory.
// * Copies between host and device memory (_copy_from) and scalar reads (_local_scalar_dense) are counted.
// * Every other aten operator runs its CPU kernel over host aliases of the device memory (same bytes, no copy),
//   after the device check real devices make: tensors of one op live on one device, 0-dim CPU scalars excepted,
//   CPU index tensors excepted for indexing ops. Results come back in device memory; results that alias an
//   input (views) alias the device tensor.
// * Operators of other namespaces run only if provided (provide_ops: fbgemm's ops, standing in for fbgemm-ascend);
//   any other one fails as an operator without a device kernel fails on hardware.
#include "emulator.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/native/Resize.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <ATen/ops/as_strided_native.h>
#include <ATen/ops/resize_native.h>
#include <ATen/ops/set_native.h>
#include <ATen/ops/view_native.h>
#include <c10/core/CPUAllocator.h>
#include <torch/library.h>

#include <map>
#include <memory>
#include <optional>
#include <set>
#include <sstream>

namespace torchrec_ascend::emulator {

at::Tensor host_alias(const at::Tensor& tensor, bool resizable) {
  if (!tensor.defined() || tensor.device().type() != kDevice) {
    return tensor;
  }
  const c10::Storage& storage = tensor.storage();
  c10::Storage host(c10::Storage::use_byte_size_t(), storage.nbytes(),
                    c10::DataPtr(const_cast<void*>(storage.data()), c10::Device(c10::DeviceType::CPU)),
                    resizable ? c10::GetCPUAllocator() : nullptr, resizable);
  at::Tensor alias = at::empty({0}, tensor.options().device(c10::DeviceType::CPU));
  alias.set_(host, tensor.storage_offset(), tensor.sizes(), tensor.strides());
  return alias;
}

at::Tensor device_copy(const at::Tensor& host, c10::Device device) {
  if (!host.defined() || host.device().type() == kDevice) {
    return host;
  }
  const auto options = host.options().device(device);
  at::Tensor out = host.is_non_overlapping_and_dense() ? at::empty_strided(host.sizes(), host.strides(), options)
                                                       : at::empty(host.sizes(), options);
  host_alias(out).copy_(host);
  return out;
}

namespace {

c10::TensorOptions device_options(const at::Tensor& like, c10::Device device) {
  return like.options().device(device);
}

bool allows_cpu_indices(const c10::OperatorName& name) {
  static const std::set<std::string> ops = {"aten::index", "aten::index_put_", "aten::index_put",
                                            "aten::_index_put_impl_", "aten::_unsafe_index"};
  return ops.count(name.name) > 0;
}

// Operators whose output size depends on the data: on a device, the host waits for the device to learn it.
bool sizes_from_data(const c10::OperatorName& name) {
  static const std::set<std::string> ops = {
      "aten::nonzero",     "aten::masked_select",      "aten::_unique",     "aten::_unique2",
      "aten::unique_dim",  "aten::unique_consecutive", "aten::bincount",    "aten::unique_dim_consecutive",
      "aten::nonzero_numpy"};
  return ops.count(name.name) > 0;
}

class DeviceCheck {
 public:
  explicit DeviceCheck(const c10::OperatorHandle& op) : op_(op) {}

  void add(const at::Tensor& tensor, const std::string& argument) {
    if (!tensor.defined()) {
      return;
    }
    const c10::Device device = tensor.device();
    if (device.type() == kDevice) {
      if (!device_) {
        device_ = device;
      } else if (*device_ != device) {
        fail(*device_, device, argument);
      }
    } else if (!(device.is_cpu() && tensor.dim() == 0) && !other_) {
      other_ = device;
      other_argument_ = argument;
    }
  }
  void add_device_argument(c10::Device device) {
    if (!device_) {
      device_ = device.has_index() ? device : c10::Device(kDevice, current_device());
    }
  }
  std::optional<c10::Device> finish() {
    if (device_ && other_ && !(other_->is_cpu() && allows_cpu_indices(op_.schema().operator_name()))) {
      fail(*device_, *other_, other_argument_);
    }
    return device_;
  }

 private:
  [[noreturn]] void fail(c10::Device a, c10::Device b, const std::string& argument) const {
    TORCH_CHECK(false, "Expected all tensors to be on the same device, but found at least two devices, ", a,
                " and ", b, "! (when checking argument '", argument, "' of ", op_.schema().operator_name(),
                " on the emulated npu)");
  }
  const c10::OperatorHandle& op_;
  std::optional<c10::Device> device_;
  std::optional<c10::Device> other_;
  std::string other_argument_;
};

struct Written {
  at::Tensor device;
  at::Tensor host;
};

// After the CPU kernel: make a mutated device argument match its host alias (moved to fresh memory if it grew).
void write_back(const Written& w) {
  const at::Tensor& host = w.host;
  const bool same_memory = host.storage().data() == w.device.storage().data();
  const bool same_shape = host.sizes().equals(w.device.sizes()) && host.strides().equals(w.device.strides()) &&
                          host.storage_offset() == w.device.storage_offset();
  if (same_memory) {
    if (!same_shape) {
      at::Tensor device = w.device;
      device.set_(device.storage(), host.storage_offset(), host.sizes(), host.strides());
    }
    return;
  }
  at::Tensor fresh = device_copy(host, w.device.device());
  at::Tensor device = w.device;
  device.set_(fresh);
}

struct AliasedInput {
  const c10::AliasInfo* alias;
  c10::IValue device;
  at::Tensor host;  // undefined for lists
};

const AliasedInput* find_input(const std::vector<AliasedInput>& inputs, const c10::AliasInfo* alias) {
  for (const auto& input : inputs) {
    if (input.alias == alias || (input.alias != nullptr && *input.alias == *alias)) {
      return &input;
    }
  }
  return nullptr;
}

at::Tensor view_or_copy(const at::Tensor& result, const AliasedInput* input, c10::Device device) {
  if (input != nullptr && input->device.isTensor() && input->host.defined() &&
      result.storage().data() == input->host.storage().data()) {
    const at::Tensor& source = input->device.toTensor();
    at::Tensor view = at::empty({0}, device_options(result, source.device()));
    view.set_(source.storage(), result.storage_offset(), result.sizes(), result.strides());
    return view;
  }
  return device_copy(result, device);
}

void run_on_host(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const auto& schema = op.schema();
  const auto& arguments = schema.arguments();
  const size_t begin = stack->size() - arguments.size();

  DeviceCheck check(op);
  bool bool_index = false;
  for (size_t i = 0; i < arguments.size(); ++i) {
    const c10::IValue& value = (*stack)[begin + i];
    const std::string& name = arguments[i].name();
    if (value.isTensor()) {
      check.add(value.toTensor(), name);
    } else if (value.isTensorList()) {
      for (const at::Tensor& t : value.toTensorVector()) {
        check.add(t, name);
      }
    } else if (value.isOptionalTensorList()) {
      for (const auto& t : value.toOptionalTensorVector()) {
        if (t.has_value()) {
          check.add(*t, name);
          bool_index |= t->defined() && (t->scalar_type() == at::kBool || t->scalar_type() == at::kByte);
        }
      }
    } else if (value.isDevice() && value.toDevice().type() == kDevice) {
      check.add_device_argument(value.toDevice());
    }
  }
  const std::optional<c10::Device> target = check.finish();

  std::vector<TensorUse> uses;
  if (stream_check_enabled()) {
    for (size_t i = 0; i < arguments.size(); ++i) {
      const c10::IValue& value = (*stack)[begin + i];
      const c10::AliasInfo* alias = arguments[i].alias_info();
      const bool writes = alias != nullptr && alias->isWrite();
      if (value.isTensor()) {
        uses.push_back({&value.toTensor(), arguments[i].name(), writes});
      } else if (value.isTensorList() || value.isOptionalTensorList()) {
        for (const c10::IValue& item : value.toListRef()) {
          if (item.isTensor()) {
            uses.push_back({&item.toTensor(), arguments[i].name(), writes});
          }
        }
      }
    }
  }
  KernelCheck streams(c10::toString(schema.operator_name()), uses);

  std::vector<Written> written;
  std::vector<AliasedInput> aliased;
  for (size_t i = 0; i < arguments.size(); ++i) {
    c10::IValue& value = (*stack)[begin + i];
    const c10::AliasInfo* alias = arguments[i].alias_info();
    const bool writes = alias != nullptr && alias->isWrite();
    if (value.isTensor()) {
      const at::Tensor device = value.toTensor();
      at::Tensor host = host_alias(device, writes);
      if (writes && device.defined() && device.device().type() == kDevice) {
        written.push_back({device, host});
      }
      if (alias != nullptr) {
        aliased.push_back({alias, value, host});
      }
      value = host;
    } else if (value.isTensorList()) {
      const auto devices = value.toTensorVector();
      c10::List<at::Tensor> hosts;
      for (const at::Tensor& device : devices) {
        at::Tensor host = host_alias(device, writes);
        if (writes && device.defined() && device.device().type() == kDevice) {
          written.push_back({device, host});
        }
        hosts.push_back(host);
      }
      if (alias != nullptr) {
        aliased.push_back({alias, value, at::Tensor()});
      }
      value = hosts;
    } else if (value.isOptionalTensorList()) {
      c10::List<std::optional<at::Tensor>> hosts;
      for (const auto& device : value.toOptionalTensorVector()) {
        hosts.push_back(device.has_value() ? std::optional<at::Tensor>(host_alias(*device)) : std::nullopt);
      }
      value = hosts;
    } else if (value.isDevice() && value.toDevice().type() == kDevice) {
      value = c10::Device(c10::DeviceType::CPU);
    }
  }

  op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), stack);

  for (const auto& w : written) {
    write_back(w);
  }
  const auto& returns = schema.returns();
  const size_t rbegin = stack->size() - returns.size();
  bool host_read = sizes_from_data(schema.operator_name()) ||
                   (bool_index && schema.operator_name().name == "aten::index");
  for (size_t j = 0; j < returns.size(); ++j) {
    c10::IValue& value = (*stack)[rbegin + j];
    const c10::AliasInfo* alias = returns[j].alias_info();
    const AliasedInput* input = alias != nullptr ? find_input(aliased, alias) : nullptr;
    if (alias != nullptr && alias->isWrite()) {
      TORCH_CHECK(input != nullptr, "emulated npu: ", schema.operator_name(),
                  " returns a mutated alias that matches no argument");
      value = input->device;
    } else if (value.isTensor()) {
      value = target ? view_or_copy(value.toTensor(), input, *target) : value;
      if (input == nullptr && value.isTensor()) {
        streams.wrote(value.toTensor(), returns[j].name());
      }
    } else if (value.isTensorList() && target) {
      c10::List<at::Tensor> devices;
      for (const at::Tensor& host : value.toTensorVector()) {
        devices.push_back(device_copy(host, *target));
        streams.wrote(devices.get(devices.size() - 1), returns[j].name());
      }
      value = devices;
    } else if (value.isScalar() || value.isBool() || value.isInt() || value.isDouble()) {
      host_read = true;  // a number or truth value computed on the device reaches the host
    }
  }
  if (host_read && target) {
    count_sync();
    host_waited_stream(target->index(), current_stream_id(target->index()));
  }
}

std::string namespace_of(const c10::OperatorHandle& op) {
  const std::string& name = op.schema().name();
  return name.substr(0, name.find("::"));
}

std::set<std::string>& withheld() {
  static std::set<std::string> names;
  return names;
}

void provided_kernel(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  run_on_host(op, stack);
}

void fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const std::string ns = namespace_of(op);
  if (ns == "aten" || ns == "prims") {
    run_on_host(op, stack);
    return;
  }
  const auto name = op.schema().operator_name();
  std::ostringstream full;
  full << name;
  if (withheld().count(full.str()) > 0 || withheld().count(name.name) > 0) {
    TORCH_CHECK_NOT_IMPLEMENTED(false, "Could not run '", full.str(),
                                "' with arguments from the 'npu' (PrivateUse1) backend: the emulated npu "
                                "withholds its kernel (torchrec_ascend.testing.emulated_npu.withhold_ops), as "
                                "fbgemm-ascend lacks some ops on some SoCs; give the op a host fallback or "
                                "call it on host tensors");
  }
  TORCH_CHECK_NOT_IMPLEMENTED(false, "Could not run '", full.str(),
                              "' with arguments from the 'npu' (PrivateUse1) backend: the operator has no "
                              "kernel for the emulated npu (a host-only operator was handed device tensors); "
                              "move its inputs to the host explicitly or register a PrivateUse1 kernel for it");
}

// ---- kernels on the emulator's own memory ------------------------------------------------------------------

at::Tensor empty_memory_format(c10::IntArrayRef size, std::optional<c10::ScalarType> dtype,
                               std::optional<c10::Layout> layout, std::optional<c10::Device> device,
                               std::optional<bool> pin_memory, std::optional<c10::MemoryFormat> memory_format) {
  TORCH_CHECK(c10::layout_or_default(layout) == c10::Layout::Strided,
              "the emulated npu supports strided tensors only");
  TORCH_CHECK(!c10::pinned_memory_or_default(pin_memory), "pinned memory lives on the host, not on the npu");
  const c10::DeviceGuard guard(c10::device_or_default(device));
  return at::detail::empty_generic(size, at::GetAllocator(kDevice), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                   c10::dtype_or_default(dtype), memory_format);
}

at::Tensor empty_strided(c10::IntArrayRef size, c10::IntArrayRef stride, std::optional<c10::ScalarType> dtype,
                         std::optional<c10::Layout> layout, std::optional<c10::Device> device,
                         std::optional<bool> pin_memory) {
  TORCH_CHECK(c10::layout_or_default(layout) == c10::Layout::Strided,
              "the emulated npu supports strided tensors only");
  TORCH_CHECK(!c10::pinned_memory_or_default(pin_memory), "pinned memory lives on the host, not on the npu");
  const c10::DeviceGuard guard(c10::device_or_default(device));
  return at::detail::empty_strided_generic(size, stride, at::GetAllocator(kDevice),
                                           c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                           c10::dtype_or_default(dtype));
}

at::Tensor as_strided(const at::Tensor& self, c10::SymIntArrayRef size, c10::SymIntArrayRef stride,
                      std::optional<c10::SymInt> storage_offset) {
  std::optional<int64_t> offset;
  if (storage_offset) {
    offset = storage_offset->expect_int();
  }
  return at::native::as_strided_tensorimpl(self, C10_AS_INTARRAYREF_SLOW(size), C10_AS_INTARRAYREF_SLOW(stride),
                                           offset);
}

at::Tensor view(const at::Tensor& self, c10::SymIntArrayRef size) {
  return at::native::view(self, C10_AS_INTARRAYREF_SLOW(size));
}

at::Tensor reshape_alias(const at::Tensor& self, c10::SymIntArrayRef size, c10::SymIntArrayRef stride) {
  return at::native::_reshape_alias(self, C10_AS_INTARRAYREF_SLOW(size), C10_AS_INTARRAYREF_SLOW(stride));
}

const at::Tensor& resize(const at::Tensor& self, c10::SymIntArrayRef size,
                         std::optional<c10::MemoryFormat> memory_format) {
  const c10::DeviceGuard guard(self.device());
  return at::native::resize_(self, C10_AS_INTARRAYREF_SLOW(size), memory_format);
}

at::Tensor& set_tensor(at::Tensor& self, const at::Tensor& source) {
  return at::native::set_tensor_(self, source);
}

at::Tensor& set_storage(at::Tensor& self, at::Storage source) {
  return at::native::set_(self, std::move(source));
}

at::Tensor& set_storage_offset(at::Tensor& self, at::Storage source, c10::SymInt offset, c10::SymIntArrayRef size,
                               c10::SymIntArrayRef stride) {
  return at::native::set_storage_cpu_(self, std::move(source), offset.expect_int(), C10_AS_INTARRAYREF_SLOW(size),
                                      C10_AS_INTARRAYREF_SLOW(stride));
}

// ---- counted traffic -------------------------------------------------------------------------------------

at::Tensor copy_from(const at::Tensor& self, const at::Tensor& dst, bool non_blocking) {
  const bool from_device = self.device().type() == kDevice;
  const bool to_device_memory = dst.device().type() == kDevice;
  const int64_t bytes = static_cast<int64_t>(self.numel()) * static_cast<int64_t>(self.element_size());
  // Between two devices a copy is ordered with the current streams of both (as CUDA's peer copy): each side is
  // checked on its own device's stream.
  const bool one_device = !from_device || !to_device_memory || self.device() == dst.device();
  const KernelCheck streams("aten::_copy_from", one_device ? std::vector<TensorUse>{{&self, "self", false},
                                                                                    {&dst, "dst", true}}
                                                           : std::vector<TensorUse>{{&self, "self", false}});
  const KernelCheck peer("aten::_copy_from", one_device ? std::vector<TensorUse>{}
                                                        : std::vector<TensorUse>{{&dst, "dst", true}});
  if (from_device && to_device_memory) {
    count_d2d();
  } else if (to_device_memory) {
    count_h2d(bytes);
  } else if (from_device) {
    count_d2h(bytes, !non_blocking);
  }
  if (from_device && !to_device_memory) {
    uintptr_t start = 0;
    size_t length = 0;
    const c10::DeviceIndex device = self.device().index();
    if (non_blocking && dst.numel() > 0 && pinned_region(dst.data_ptr(), &start, &length) &&
        copy_in_flight(dst, host_alias(self), start, length)) {
      return dst;  // lands when a host wait covers it
    }
    host_waited_stream(device, current_stream_id(device));  // a copy into pageable memory completes at once
  }
  host_alias(dst).copy_(host_alias(self));
  return dst;
}

at::Tensor copy_from_and_resize(const at::Tensor& self, const at::Tensor& dst) {
  at::Tensor target = dst;
  target.resize_(self.sizes());
  return copy_from(self, target, false);
}

c10::Scalar local_scalar_dense(const at::Tensor& self) {
  const KernelCheck streams("aten::_local_scalar_dense", {{&self, "self", false}});
  count_sync();
  host_waited_stream(self.device().index(), current_stream_id(self.device().index()));
  return at::_local_scalar_dense(host_alias(self));
}

void record_stream(at::Tensor& self, c10::Stream stream) {
  TORCH_CHECK(stream.device_type() == kDevice, "record_stream of an npu tensor needs an npu stream, got a ",
              stream.device_type(), " stream");
  check_index(stream.device_index());
  memory_recorded_on(allocation_of(self), stream);
}

std::map<std::string, std::unique_ptr<torch::Library>>& provided() {
  static std::map<std::string, std::unique_ptr<torch::Library>> libraries;
  return libraries;
}

}  // namespace

void provide_ops(const std::vector<std::string>& names) {
  for (const std::string& name : names) {
    const auto split = name.find("::");
    TORCH_CHECK(split != std::string::npos, "expected a qualified operator name 'ns::op', got '", name, "'");
    withheld().erase(name);
    if (provided().count(name) > 0) {
      continue;
    }
    auto library = std::make_unique<torch::Library>(torch::Library::IMPL, name.substr(0, split),
                                                    c10::DispatchKey::PrivateUse1, __FILE__, __LINE__);
    library->impl(name.substr(split + 2).c_str(), torch::CppFunction::makeFromBoxedFunction<&provided_kernel>());
    provided()[name] = std::move(library);
  }
}

void withhold_ops(const std::vector<std::string>& names) {
  for (const std::string& name : names) {
    provided().erase(name);
    withheld().insert(name);
  }
}

std::vector<std::string> provided_ops() {
  std::vector<std::string> names;
  for (const auto& entry : provided()) {
    names.push_back(entry.first);
  }
  return names;
}

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("empty.memory_format", empty_memory_format);
  m.impl("empty_strided", empty_strided);
  m.impl("as_strided", as_strided);
  m.impl("view", view);
  m.impl("_reshape_alias", reshape_alias);
  m.impl("resize_", resize);
  m.impl("set_.source_Tensor", set_tensor);
  m.impl("set_.source_Storage", set_storage);
  m.impl("set_.source_Storage_storage_offset", set_storage_offset);
  m.impl("_copy_from", copy_from);
  m.impl("_copy_from_and_resize", copy_from_and_resize);
  m.impl("_local_scalar_dense", local_scalar_dense);
  m.impl("record_stream", record_stream);
}

TORCH_LIBRARY_IMPL(_, PrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&fallback>());
}

}  // namespace torchrec_ascend::emulator
