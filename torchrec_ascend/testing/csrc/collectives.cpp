// EmulatedHccl: the emulated NPU's collective backend, in HCCL's role, over a host backend (gloo).
//
// Each collective hands the host backend host aliases of the device tensors (the same bytes: input and output
// stay in device memory, nothing is counted as host traffic, as HCCL's transfers are not), waits for it, and
// returns completed work: device work on the emulator is synchronous.
#include "collectives.h"

#include <ATen/core/ivalue.h>

namespace torchrec_ascend::emulator {

namespace {

std::vector<at::Tensor> aliases(const std::vector<at::Tensor>& tensors) {
  std::vector<at::Tensor> out;
  out.reserve(tensors.size());
  for (const at::Tensor& t : tensors) {
    out.push_back(host_alias(t));
  }
  return out;
}

std::vector<std::vector<at::Tensor>> aliases(const std::vector<std::vector<at::Tensor>>& lists) {
  std::vector<std::vector<at::Tensor>> out;
  out.reserve(lists.size());
  for (const auto& list : lists) {
    out.push_back(aliases(list));
  }
  return out;
}

c10::intrusive_ptr<c10d::Work> finished(const c10::intrusive_ptr<c10d::Work>& work,
                                         const std::vector<at::Tensor>& results) {
  work->wait();
  auto future = c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()));
  future->markCompleted(c10::IValue(results));
  return c10d::Work::create_from_future(future);
}

}  // namespace

EmulatedHccl::EmulatedHccl(c10::intrusive_ptr<c10d::Backend> host, int rank, int size)
    : c10d::Backend(rank, size), host_(std::move(host)) {}

const std::string EmulatedHccl::getBackendName() const {
  return "emulated_hccl";
}

c10::intrusive_ptr<c10d::Work> EmulatedHccl::broadcast(std::vector<at::Tensor>& tensors,
                                                       const c10d::BroadcastOptions& opts) {
  auto host = aliases(tensors);
  return finished(host_->broadcast(host, opts), tensors);
}

c10::intrusive_ptr<c10d::Work> EmulatedHccl::allreduce(std::vector<at::Tensor>& tensors,
                                                       const c10d::AllreduceOptions& opts) {
  auto host = aliases(tensors);
  return finished(host_->allreduce(host, opts), tensors);
}

c10::intrusive_ptr<c10d::Work> EmulatedHccl::allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                                 const c10d::AllreduceCoalescedOptions& opts) {
  auto host = aliases(tensors);
  return finished(host_->allreduce_coalesced(host, opts), tensors);
}

c10::intrusive_ptr<c10d::Work> EmulatedHccl::reduce(std::vector<at::Tensor>& tensors,
                                                    const c10d::ReduceOptions& opts) {
  auto host = aliases(tensors);
  return finished(host_->reduce(host, opts), tensors);
}

c10::intrusive_ptr<c10d::Work> EmulatedHccl::allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                                       std::vector<at::Tensor>& inputs,
                                                       const c10d::AllgatherOptions& opts) {
  auto host_out = aliases(outputs);
  auto host_in = aliases(inputs);
  return finished(host_->allgather(host_out, host_in, opts), outputs.empty() ? inputs : outputs[0]);
}

c10::intrusive_ptr<c10d::Work> EmulatedHccl::_allgather_base(at::Tensor& output, at::Tensor& input,
                                                             const c10d::AllgatherOptions& opts) {
  auto host_out = host_alias(output);
  auto host_in = host_alias(input);
  return finished(host_->_allgather_base(host_out, host_in, opts), {output});
}

c10::intrusive_ptr<c10d::Work> EmulatedHccl::allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                             std::vector<at::Tensor>& inputs,
                                                                             const c10d::AllgatherOptions& opts) {
  auto host_out = aliases(outputs);
  auto host_in = aliases(inputs);
  return finished(host_->allgather_into_tensor_coalesced(host_out, host_in, opts), outputs);
}

c10::intrusive_ptr<c10d::Work> EmulatedHccl::gather(std::vector<std::vector<at::Tensor>>& outputs,
                                                    std::vector<at::Tensor>& inputs,
                                                    const c10d::GatherOptions& opts) {
  auto host_out = aliases(outputs);
  auto host_in = aliases(inputs);
  return finished(host_->gather(host_out, host_in, opts), inputs);
}

c10::intrusive_ptr<c10d::Work> EmulatedHccl::scatter(std::vector<at::Tensor>& outputs,
                                                     std::vector<std::vector<at::Tensor>>& inputs,
                                                     const c10d::ScatterOptions& opts) {
  auto host_out = aliases(outputs);
  auto host_in = aliases(inputs);
  return finished(host_->scatter(host_out, host_in, opts), outputs);
}

c10::intrusive_ptr<c10d::Work> EmulatedHccl::reduce_scatter(std::vector<at::Tensor>& outputs,
                                                            std::vector<std::vector<at::Tensor>>& inputs,
                                                            const c10d::ReduceScatterOptions& opts) {
  auto host_out = aliases(outputs);
  auto host_in = aliases(inputs);
  return finished(host_->reduce_scatter(host_out, host_in, opts), outputs);
}

c10::intrusive_ptr<c10d::Work> EmulatedHccl::_reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                                  const c10d::ReduceScatterOptions& opts) {
  auto host_out = host_alias(output);
  auto host_in = host_alias(input);
  return finished(host_->_reduce_scatter_base(host_out, host_in, opts), {output});
}

c10::intrusive_ptr<c10d::Work> EmulatedHccl::reduce_scatter_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs, const c10d::ReduceScatterOptions& opts) {
  auto host_out = aliases(outputs);
  auto host_in = aliases(inputs);
  return finished(host_->reduce_scatter_tensor_coalesced(host_out, host_in, opts), outputs);
}

c10::intrusive_ptr<c10d::Work> EmulatedHccl::alltoall_base(at::Tensor& output, at::Tensor& input,
                                                           std::vector<int64_t>& output_splits,
                                                           std::vector<int64_t>& input_splits,
                                                           const c10d::AllToAllOptions& opts) {
  auto host_out = host_alias(output);
  auto host_in = host_alias(input);
  return finished(host_->alltoall_base(host_out, host_in, output_splits, input_splits, opts), {output});
}

c10::intrusive_ptr<c10d::Work> EmulatedHccl::alltoall(std::vector<at::Tensor>& outputs,
                                                      std::vector<at::Tensor>& inputs,
                                                      const c10d::AllToAllOptions& opts) {
  auto host_out = aliases(outputs);
  auto host_in = aliases(inputs);
  return finished(host_->alltoall(host_out, host_in, opts), outputs);
}

c10::intrusive_ptr<c10d::Work> EmulatedHccl::send(std::vector<at::Tensor>& tensors, int dst, int tag) {
  auto host = aliases(tensors);
  return finished(host_->send(host, dst, tag), tensors);
}

c10::intrusive_ptr<c10d::Work> EmulatedHccl::recv(std::vector<at::Tensor>& tensors, int src, int tag) {
  auto host = aliases(tensors);
  return finished(host_->recv(host, src, tag), tensors);
}

c10::intrusive_ptr<c10d::Work> EmulatedHccl::barrier(const c10d::BarrierOptions& opts) {
  return finished(host_->barrier(opts), {});
}

}  // namespace torchrec_ascend::emulator
