// EmulatedHccl: the emulated NPU's collective backend, in HCCL's role, over a host backend (gloo).
//
// Each collective hands the host backend host aliases of the device tensors (the same bytes: input and output
// stay in device memory, nothing is counted as host traffic, as HCCL's transfers are not), waits for it, and
// returns completed work: device work on the emulator is synchronous. For the stream-order checker a collective
// runs on the device's collective stream after the launching stream, and its work's wait() orders the waiting
// stream after it, as HCCL's (and NCCL's) work does.
#include "collectives.h"

#include <ATen/core/ivalue.h>
#include <c10/core/StreamGuard.h>

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

std::vector<at::Tensor> flat(const std::vector<std::vector<at::Tensor>>& lists) {
  std::vector<at::Tensor> out;
  for (const auto& list : lists) {
    out.insert(out.end(), list.begin(), list.end());
  }
  return out;
}

// The stream-order checker's view of a collective (reads `inputs`, writes `outputs`), before it runs.
CollectiveClock launch(const std::string& op, const std::vector<at::Tensor>& inputs,
                       const std::vector<at::Tensor>& outputs) {
  std::vector<TensorUse> uses;
  for (const at::Tensor& t : inputs) {
    uses.push_back({&t, "input", false});
  }
  for (const at::Tensor& t : outputs) {
    uses.push_back({&t, "output", true});
  }
  return collective_launched("c10d::" + op + " (emulated hccl)", uses);
}

// Completed work whose wait() orders the waiting stream after the collective (as HCCL's work does).
class Done final : public c10d::Work {
 public:
  Done(const std::vector<at::Tensor>& results, CollectiveClock clock) : results_(results), clock_(std::move(clock)) {
    std::vector<c10::Device> devices;
    if (clock_.device >= 0) {
      devices.emplace_back(kDevice, clock_.device);
    }
    future_ = c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()), devices);
    if (devices.empty()) {
      future_->markCompleted(c10::IValue(results_));
      return;
    }
    // Completed on the collective stream: the future's events order whoever waits on it (DDP's reducer) after it.
    const c10::StreamGuard on(c10::Stream(c10::Stream::UNSAFE, devices[0], kCollectiveStream));
    future_->markCompleted(c10::IValue(results_));
  }
  bool isCompleted() override {
    return true;
  }
  bool wait(std::chrono::milliseconds) override {
    collective_waited(clock_);
    return true;
  }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override {
    return future_;
  }
  std::vector<at::Tensor> result() override {
    return results_;
  }

 private:
  c10::intrusive_ptr<c10::ivalue::Future> future_;
  std::vector<at::Tensor> results_;
  CollectiveClock clock_;
};

c10::intrusive_ptr<c10d::Work> finished(const c10::intrusive_ptr<c10d::Work>& work,
                                         const std::vector<at::Tensor>& results, CollectiveClock clock) {
  work->wait();
  return c10::make_intrusive<Done>(results, std::move(clock));
}

}  // namespace

EmulatedHccl::EmulatedHccl(c10::intrusive_ptr<c10d::Backend> host, int rank, int size)
    : c10d::Backend(rank, size), host_(std::move(host)) {}

const std::string EmulatedHccl::getBackendName() const {
  return "emulated_hccl";
}

c10::intrusive_ptr<c10d::Work> EmulatedHccl::broadcast(std::vector<at::Tensor>& tensors,
                                                       const c10d::BroadcastOptions& opts) {
  auto launched = launch("broadcast", tensors, tensors);
  auto host = aliases(tensors);
  return finished(host_->broadcast(host, opts), tensors, std::move(launched));
}

c10::intrusive_ptr<c10d::Work> EmulatedHccl::allreduce(std::vector<at::Tensor>& tensors,
                                                       const c10d::AllreduceOptions& opts) {
  auto launched = launch("allreduce", tensors, tensors);
  auto host = aliases(tensors);
  return finished(host_->allreduce(host, opts), tensors, std::move(launched));
}

c10::intrusive_ptr<c10d::Work> EmulatedHccl::allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                                 const c10d::AllreduceCoalescedOptions& opts) {
  auto launched = launch("allreduce_coalesced", tensors, tensors);
  auto host = aliases(tensors);
  return finished(host_->allreduce_coalesced(host, opts), tensors, std::move(launched));
}

c10::intrusive_ptr<c10d::Work> EmulatedHccl::reduce(std::vector<at::Tensor>& tensors,
                                                    const c10d::ReduceOptions& opts) {
  auto launched = launch("reduce", tensors, tensors);
  auto host = aliases(tensors);
  return finished(host_->reduce(host, opts), tensors, std::move(launched));
}

c10::intrusive_ptr<c10d::Work> EmulatedHccl::allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                                       std::vector<at::Tensor>& inputs,
                                                       const c10d::AllgatherOptions& opts) {
  auto launched = launch("allgather", inputs, flat(outputs));
  auto host_out = aliases(outputs);
  auto host_in = aliases(inputs);
  return finished(host_->allgather(host_out, host_in, opts), outputs.empty() ? inputs : outputs[0], std::move(launched));
}

c10::intrusive_ptr<c10d::Work> EmulatedHccl::_allgather_base(at::Tensor& output, at::Tensor& input,
                                                             const c10d::AllgatherOptions& opts) {
  auto launched = launch("_allgather_base", {input}, {output});
  auto host_out = host_alias(output);
  auto host_in = host_alias(input);
  return finished(host_->_allgather_base(host_out, host_in, opts), {output}, std::move(launched));
}

c10::intrusive_ptr<c10d::Work> EmulatedHccl::allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                             std::vector<at::Tensor>& inputs,
                                                                             const c10d::AllgatherOptions& opts) {
  auto launched = launch("allgather_into_tensor_coalesced", inputs, outputs);
  auto host_out = aliases(outputs);
  auto host_in = aliases(inputs);
  return finished(host_->allgather_into_tensor_coalesced(host_out, host_in, opts), outputs, std::move(launched));
}

c10::intrusive_ptr<c10d::Work> EmulatedHccl::gather(std::vector<std::vector<at::Tensor>>& outputs,
                                                    std::vector<at::Tensor>& inputs,
                                                    const c10d::GatherOptions& opts) {
  auto launched = launch("gather", inputs, flat(outputs));
  auto host_out = aliases(outputs);
  auto host_in = aliases(inputs);
  return finished(host_->gather(host_out, host_in, opts), inputs, std::move(launched));
}

c10::intrusive_ptr<c10d::Work> EmulatedHccl::scatter(std::vector<at::Tensor>& outputs,
                                                     std::vector<std::vector<at::Tensor>>& inputs,
                                                     const c10d::ScatterOptions& opts) {
  auto launched = launch("scatter", flat(inputs), outputs);
  auto host_out = aliases(outputs);
  auto host_in = aliases(inputs);
  return finished(host_->scatter(host_out, host_in, opts), outputs, std::move(launched));
}

c10::intrusive_ptr<c10d::Work> EmulatedHccl::reduce_scatter(std::vector<at::Tensor>& outputs,
                                                            std::vector<std::vector<at::Tensor>>& inputs,
                                                            const c10d::ReduceScatterOptions& opts) {
  auto launched = launch("reduce_scatter", flat(inputs), outputs);
  auto host_out = aliases(outputs);
  auto host_in = aliases(inputs);
  return finished(host_->reduce_scatter(host_out, host_in, opts), outputs, std::move(launched));
}

c10::intrusive_ptr<c10d::Work> EmulatedHccl::_reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                                  const c10d::ReduceScatterOptions& opts) {
  auto launched = launch("_reduce_scatter_base", {input}, {output});
  auto host_out = host_alias(output);
  auto host_in = host_alias(input);
  return finished(host_->_reduce_scatter_base(host_out, host_in, opts), {output}, std::move(launched));
}

c10::intrusive_ptr<c10d::Work> EmulatedHccl::reduce_scatter_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs, const c10d::ReduceScatterOptions& opts) {
  auto launched = launch("reduce_scatter_tensor_coalesced", inputs, outputs);
  auto host_out = aliases(outputs);
  auto host_in = aliases(inputs);
  return finished(host_->reduce_scatter_tensor_coalesced(host_out, host_in, opts), outputs, std::move(launched));
}

c10::intrusive_ptr<c10d::Work> EmulatedHccl::alltoall_base(at::Tensor& output, at::Tensor& input,
                                                           std::vector<int64_t>& output_splits,
                                                           std::vector<int64_t>& input_splits,
                                                           const c10d::AllToAllOptions& opts) {
  auto launched = launch("alltoall_base", {input}, {output});
  auto host_out = host_alias(output);
  auto host_in = host_alias(input);
  return finished(host_->alltoall_base(host_out, host_in, output_splits, input_splits, opts), {output}, std::move(launched));
}

c10::intrusive_ptr<c10d::Work> EmulatedHccl::alltoall(std::vector<at::Tensor>& outputs,
                                                      std::vector<at::Tensor>& inputs,
                                                      const c10d::AllToAllOptions& opts) {
  auto launched = launch("alltoall", inputs, outputs);
  auto host_out = aliases(outputs);
  auto host_in = aliases(inputs);
  return finished(host_->alltoall(host_out, host_in, opts), outputs, std::move(launched));
}

c10::intrusive_ptr<c10d::Work> EmulatedHccl::send(std::vector<at::Tensor>& tensors, int dst, int tag) {
  auto launched = launch("send", tensors, {});
  auto host = aliases(tensors);
  return finished(host_->send(host, dst, tag), tensors, std::move(launched));
}

c10::intrusive_ptr<c10d::Work> EmulatedHccl::recv(std::vector<at::Tensor>& tensors, int src, int tag) {
  auto launched = launch("recv", {}, tensors);
  auto host = aliases(tensors);
  return finished(host_->recv(host, src, tag), tensors, std::move(launched));
}

c10::intrusive_ptr<c10d::Work> EmulatedHccl::barrier(const c10d::BarrierOptions& opts) {
  auto launched = CollectiveClock{};
  return finished(host_->barrier(opts), {}, std::move(launched));
}

}  // namespace torchrec_ascend::emulator
