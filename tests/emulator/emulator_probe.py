"""Child-side programs of the emulator tests: each installs the emulated NPU in a fresh interpreter and reports facts.

The emulator renames PrivateUse1 for the life of a process, so it never runs in the pytest process.
``python -c "from emulator_probe import main; main('device')"`` runs one program.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import threading
from typing import Any, Callable, Dict

import torch

from fresh_interpreter import report
from torchrec_ascend.testing import emulated_npu


def _error(fn: Callable[[], Any]) -> str:
    try:
        fn()
    except Exception as err:  # the type and message are the facts
        return f"{type(err).__name__}: {err}"
    return ""


def _counted(fn: Callable[[], Any]) -> Dict[str, int]:
    with emulated_npu.measure() as m:
        fn()
    return dataclasses.asdict(m.counts)


def _per_thread() -> Dict[str, Dict[str, int]]:
    """A sync on this thread and a blocking copy up on another, each counted as its own thread's (by name)."""
    x = torch.arange(4, device="npu")
    seen: Dict[str, Dict[str, int]] = {}

    def side() -> None:
        with emulated_npu.measure() as own:
            x.cpu()
        seen.update({emulated_npu.thread_name(t): dataclasses.asdict(c) for t, c in own.threads.items()})

    with emulated_npu.measure() as m:
        x.sum().item()
        worker = threading.Thread(target=side, name="side")
        worker.start()
        worker.join()
    # join() returns before the worker's OS thread ends (and drops its record): read this thread's entry only.
    seen["MainThread"] = dataclasses.asdict(m.threads[threading.get_native_id()])
    return seen


def device() -> Dict[str, Any]:
    emulated_npu.install(device_count=2)
    emulated_npu.install(device_count=2)  # idempotent
    facts: Dict[str, Any] = {"backend_name": torch._C._get_privateuse1_backend_name()}
    from torchrec_ascend.testing import device_module

    npu = torch.npu
    facts["module"] = npu is device_module
    facts["api"] = [npu.is_available(), npu.device_count(), npu.current_device()]
    facts["reinstall_other_count"] = _error(lambda: emulated_npu.install(device_count=3))
    x = torch.arange(5).to("npu")
    facts["tensor"] = [type(x) is torch.Tensor, x.is_npu, str(x.device)]
    facts["module_npu"] = str(torch.nn.Linear(2, 2).npu().weight.device)
    npu.set_device(1)
    facts["after_set_device"] = [npu.current_device(), str(torch.empty(1, device="npu").device)]
    with npu.device(0):
        facts["device_context"] = npu.current_device()
    facts["bad_device"] = _error(lambda: npu.set_device(5))
    npu.set_device(0)

    # Devices must match, as on hardware; 0-dim CPU scalars and CPU indices are allowed, as torch allows for CUDA.
    facts["mix_add"] = _error(lambda: x + torch.ones(5, dtype=torch.long))
    facts["mix_mm"] = _error(lambda: torch.mm(torch.ones(2, 2, device="npu"), torch.ones(2, 2)))
    facts["mix_devices"] = _error(lambda: torch.ones(2, device="npu:0") + torch.ones(2, device="npu:1"))
    facts["scalar_ok"] = str((x + torch.tensor(1)).device)
    facts["cpu_index"] = (x[torch.tensor([0, 4])]).cpu().tolist()
    facts["numpy"] = _error(lambda: x.numpy())

    # Exact counts.
    facts["to_npu"] = _counted(lambda: torch.arange(5).to("npu"))
    facts["item"] = _counted(lambda: x.sum().item())
    facts["int"] = _counted(lambda: int(x[0]))
    facts["bool"] = _counted(lambda: bool(x[1]))
    facts["tolist"] = _counted(lambda: x.tolist())
    facts["cpu"] = _counted(lambda: x.cpu())
    facts["to_cpu_non_blocking"] = _counted(lambda: x.to("cpu", non_blocking=True))
    facts["compute"] = _counted(lambda: ((x * 2 + 1).cumsum(0)[1:3].float().mean(), torch.zeros(3, device="npu")))
    facts["nonzero"] = _counted(lambda: torch.nonzero(x))
    facts["equal"] = _counted(lambda: torch.equal(x, x))
    facts["synchronize"] = _counted(lambda: npu.synchronize())
    facts["device_to_device"] = _counted(lambda: x.to("npu:1"))

    # Memory semantics: views alias device memory, in-place and out= ops write it, autograd runs on it.
    base = torch.zeros(6, device="npu")
    base.view(2, 3)[:, 1].fill_(7)
    base.unsqueeze(0).narrow(1, 4, 2).add_(1)
    facts["views"] = base.cpu().tolist()
    out = torch.empty(0, dtype=torch.long, device="npu")
    torch.cumsum(x, 0, out=out)
    facts["out_resized"] = [str(out.device), out.cpu().tolist()]
    w = torch.tensor([1.0, -2.0, 3.0], device="npu", requires_grad=True)
    (w * w).sum().backward()
    facts["grad"] = [str(w.grad.device), w.grad.cpu().tolist()]
    before = npu.memory_allocated()
    big = torch.empty(1000, device="npu")
    facts["memory"] = [npu.memory_allocated() - before]
    del big
    facts["memory"].append(npu.memory_allocated() - before)

    # Pinned host memory.
    pinned = torch.ones(4).pin_memory()
    facts["pinned"] = [pinned.is_pinned(), torch.ones(4).is_pinned(), torch.empty(4, pin_memory=True).is_pinned()]
    facts["pinned_copy"] = _counted(lambda: pinned.to("npu", non_blocking=True))

    # Streams: a current stream per thread, priorities kept, events, record_stream.
    high = npu.Stream(priority=-1)
    seen: Dict[str, Any] = {}

    def other_thread() -> None:
        seen["before"] = npu.current_stream().stream_id
        mine = npu.Stream()
        with npu.stream(mine):
            seen["inside"] = npu.current_stream() == mine
            barrier.wait()
            barrier.wait()

    barrier = threading.Barrier(2)
    with npu.stream(high):
        thread = threading.Thread(target=other_thread)
        thread.start()
        barrier.wait()
        facts["main_inside"] = npu.current_stream() == high
        barrier.wait()
        thread.join()
    facts["thread"] = seen
    facts["per_thread"] = _per_thread()
    facts["streams"] = [high.priority, npu.current_stream() == npu.default_stream(), high.stream_id != 0]
    start, end = npu.Event(enable_timing=True), npu.Event(enable_timing=True)
    start.record()
    end.record(high)
    high.wait_event(end)
    high.wait_stream(npu.current_stream())
    facts["events"] = [start.query(), start.elapsed_time(end) >= 0.0]
    x.record_stream(high)
    facts["record_stream_ok"] = True

    # An operator with a CPU kernel only: no npu kernel, as on hardware.
    library = torch.library.Library("emuprobe", "DEF")
    library.define("double(Tensor x) -> Tensor")
    library.impl("double", lambda t: t * 2, "CPU")
    facts["cpu_only_op"] = _error(lambda: torch.ops.emuprobe.double(x))
    facts["cpu_only_op_on_cpu"] = torch.ops.emuprobe.double(torch.ones(1)).tolist()
    return facts


def fbgemm() -> Dict[str, Any]:
    emulated_npu.install()
    import fbgemm_gpu  # noqa: F401  (registers torch.ops.fbgemm)

    fb = torch.ops.fbgemm
    facts: Dict[str, Any] = {"withheld": emulated_npu.withheld_ops()}
    facts["provided_count"] = len(emulated_npu.provided_ops())
    lengths = torch.tensor([2, 0, 3, 1])
    facts["cumsum"] = [fb.asynchronous_complete_cumsum(lengths).tolist(),
                       fb.asynchronous_complete_cumsum(lengths.npu()).cpu().tolist(),
                       str(fb.asynchronous_complete_cumsum(lengths.npu()).device)]
    facts["cumsum_counts"] = _counted(lambda: fb.asynchronous_complete_cumsum(lengths.npu()))
    with emulated_npu.withhold_ops(["asynchronous_complete_cumsum"]) as held:
        facts["held_names"] = held.names
        facts["held_error"] = _error(lambda: fb.asynchronous_complete_cumsum(lengths.npu()))
        facts["held_has_kernel"] = torch._C._dispatch_has_kernel_for_dispatch_key(
            "fbgemm::asynchronous_complete_cumsum", "PrivateUse1")
    facts["restored"] = fb.asynchronous_complete_cumsum(lengths.npu()).cpu().tolist()
    facts["unknown_name"] = _error(lambda: emulated_npu.withhold_ops(["no_such_op_anywhere"]))

    # block_bucketize_sparse_features is withheld by default: no npu kernel until the H6 host fallback exists.
    args = dict(bucketize_pos=False, sequence=True, block_sizes=torch.tensor([3]), my_size=2)
    values, blen = torch.tensor([0, 4, 1, 5, 2]), torch.tensor([2, 3])
    facts["bucketize_error"] = _error(lambda: fb.block_bucketize_sparse_features(blen.npu(), values.npu(), **{
        **args, "block_sizes": args["block_sizes"].npu()}))
    from torchrec_ascend.backends.npu import NPU
    from torchrec_ascend.hooks.sparse_ops import register_host_fallbacks

    facts["h6_registered"] = register_host_fallbacks(NPU)
    expected = fb.block_bucketize_sparse_features(blen, values, **args)
    with emulated_npu.measure() as m:
        got = fb.block_bucketize_sparse_features(blen.npu(), values.npu(), **{
            **args, "block_sizes": args["block_sizes"].npu()})
    facts["bucketize_counts"] = dataclasses.asdict(m.counts)
    facts["bucketize_equal"] = all(
        (a is None and b is None) or (a is not None and b is not None and torch.equal(a, b.cpu()))
        for a, b in zip(expected, got))
    facts["bucketize_devices"] = [str(t.device) for t in got if t is not None]

    # An op whose autograd fbgemm registers for AutogradCPU only (TorchRec's column-wise output permute): the same
    # output and input gradient on npu as on the CPU (without the emulator's bridge the gradient was dropped).
    lists = [torch.tensor(x) for x in ([0, 2, 5, 8], [2, 0, 1], [0, 3, 5, 8], [1, 2, 0])]
    pooled, upstream = torch.randn(4, 8, requires_grad=True), torch.randn(4, 8)
    split = fb.permute_pooled_embs_auto_grad_split
    (split(pooled, *lists) * upstream).sum().backward()
    on_npu = pooled.detach().npu().requires_grad_()
    out = split(on_npu, *(x.npu() for x in lists))
    (out * upstream.npu()).sum().backward()
    facts["split_permute"] = [torch.equal(out.cpu(), split(pooled, *lists)), str(out.device),
                              on_npu.grad is not None and torch.equal(on_npu.grad.cpu(), pooled.grad),
                              str(on_npu.grad.device) if on_npu.grad is not None else None]

    # permute_2D_sparse_data on npu tensors equals its CPU result.
    permute = torch.tensor([1, 0], dtype=torch.int32)
    plengths = torch.tensor([[1, 2], [2, 1]])
    pvalues = torch.arange(6)
    cpu_out = fb.permute_2D_sparse_data(permute, plengths, pvalues)
    npu_out = fb.permute_2D_sparse_data(permute.npu(), plengths.npu(), pvalues.npu())
    facts["permute_equal"] = all(
        (a is None and b is None) or torch.equal(a, b.cpu()) for a, b in zip(cpu_out, npu_out))
    return facts


def collectives() -> Dict[str, Any]:
    """Two ranks (forked) over the emulator's hccl-role backend; each rank's facts come back through a queue."""
    return _two_ranks(_rank)


def _rank(rank: int, store_file: str, queue: Any) -> None:
    import torch.distributed as dist

    emulated_npu.install()
    torch.npu.set_device(rank)
    store = dist.FileStore(store_file, 2)
    dist.init_process_group(f"cpu:gloo,npu:{emulated_npu.COLLECTIVE_BACKEND}", store=store, rank=rank, world_size=2)
    facts: Dict[str, Any] = {"backend": dist.get_backend()}
    device = torch.device("npu", rank)
    with emulated_npu.measure() as m:
        total = torch.full((3,), float(rank + 1), device=device)
        dist.all_reduce(total)
        # uneven all_to_all: rank 0 sends 1 row to 0 and 2 to 1; rank 1 sends 2 to 0 and 1 to 1
        send = torch.arange(3, dtype=torch.float32, device=device) + 10 * rank
        in_splits = [1, 2] if rank == 0 else [2, 1]
        out_splits = [1, 2] if rank == 0 else [2, 1]
        received = torch.empty(sum(out_splits), device=device)
        dist.all_to_all_single(received, send, out_splits, in_splits)
        gathered = torch.empty(6, device=device)
        dist.all_gather_into_tensor(gathered, send)
        scattered = torch.empty(1, device=device)
        dist.reduce_scatter_tensor(scattered, torch.tensor([1.0, 2.0], device=device) * (rank + 1))
        pieces = [torch.empty(3, device=device) for _ in range(2)]
        dist.all_gather(pieces, send)
        work = dist.all_reduce(torch.ones(2, device=device), async_op=True)
        work.wait()
        dist.barrier()
        host = torch.ones(2)
        dist.all_reduce(host)
    facts["counts"] = dataclasses.asdict(m.counts)
    facts["devices"] = sorted({str(t.device) for t in (total, received, gathered, scattered, *pieces)})
    facts["all_reduce"] = total.cpu().tolist()
    facts["all_to_all"] = received.cpu().tolist()
    facts["all_gather"] = gathered.cpu().tolist()
    facts["reduce_scatter"] = scattered.cpu().tolist()
    facts["all_gather_list"] = [p.cpu().tolist() for p in pieces]
    facts["host_all_reduce"] = host.tolist()
    gloo_only = dist.new_group([0, 1], backend="gloo")
    dist.barrier()  # both ranks finished connecting the new group
    facts["mixed_error"] = _error(lambda: dist.all_reduce(torch.ones(1, device=device), group=gloo_only))
    dist.barrier()
    dist.destroy_process_group()
    queue.put((rank, facts))
    os._exit(0)


def tbe() -> Dict[str, Any]:
    """fbgemm's TBE on the accelerator layout (DEVICE, CUDA compute: the npu profile's TbeSpec) vs its CPU layout."""
    emulated_npu.install()
    from fbgemm_gpu.split_embedding_configs import EmbOptimType
    from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
        ComputeDevice,
        EmbeddingLocation,
        SplitTableBatchedEmbeddingBagsCodegen,
    )

    facts: Dict[str, Any] = {}
    specs = [(10, 4), (7, 8)]
    indices, offsets = torch.tensor([1, 2, 3, 1, 0, 6, 2]), torch.tensor([0, 2, 4, 5, 7])
    for optimizer in (EmbOptimType.EXACT_SGD, EmbOptimType.EXACT_ROWWISE_ADAGRAD):
        host = SplitTableBatchedEmbeddingBagsCodegen(
            [(r, d, EmbeddingLocation.HOST, ComputeDevice.CPU) for r, d in specs], optimizer=optimizer,
            learning_rate=0.1)
        dev = SplitTableBatchedEmbeddingBagsCodegen(
            [(r, d, EmbeddingLocation.DEVICE, ComputeDevice.CUDA) for r, d in specs], optimizer=optimizer,
            learning_rate=0.1, device=torch.device("npu"))
        with torch.no_grad():
            dev.weights_dev.copy_(host.weights_host)
        steps = []
        for step in range(4):
            expected = host(indices, offsets)
            with emulated_npu.measure() as m:
                got = dev(indices.npu(), offsets.npu())
                if step < 3:
                    (got * torch.arange(got.numel(), device="npu").view_as(got)).sum().backward()
                else:  # a plain sum: the output's gradient is a temporary (expanded ones made contiguous)
                    got.sum().backward()
            if step < 3:
                (expected * torch.arange(expected.numel()).view_as(expected)).sum().backward()
            else:
                expected.sum().backward()
            steps.append({
                "output_equal": torch.equal(expected, got.cpu()),
                "weights_diff": float((dev.weights_dev.detach().cpu() - host.weights_host.detach()).abs().max()),
                "device": str(got.device),
                "weights_device": str(dev.weights_dev.device),
                "counts": dataclasses.asdict(m.counts),
            })
        facts[optimizer.name] = steps
    return facts


def ebc() -> Dict[str, Any]:
    """Stock TorchRec EmbeddingBagCollection forward/backward on the emulated npu vs the same module on the CPU."""
    emulated_npu.install()
    import torchrec
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    tables = [
        torchrec.EmbeddingBagConfig(name="t1", embedding_dim=4, num_embeddings=10, feature_names=["f1"]),
        torchrec.EmbeddingBagConfig(name="t2", embedding_dim=8, num_embeddings=6, feature_names=["f2"]),
    ]
    cpu = torchrec.EmbeddingBagCollection(tables=tables)
    npu = torchrec.EmbeddingBagCollection(tables=tables, device=torch.device("npu"))
    npu.load_state_dict(cpu.state_dict())

    def batch() -> KeyedJaggedTensor:  # a fresh KJT each time: KJT.to() keeps a cached to_dict() of the old device
        return KeyedJaggedTensor.from_lengths_sync(
            keys=["f1", "f2"], values=torch.tensor([1, 2, 3, 4, 5, 0]), lengths=torch.tensor([2, 1, 2, 1]))

    expected = cpu(batch()).values()
    (expected * expected).sum().backward()
    with emulated_npu.measure() as upload:
        features = batch().to(torch.device("npu"))
    with emulated_npu.measure() as step:
        got = npu(features).values()
        (got * got).sum().backward()
    return {
        "output_equal": torch.allclose(expected, got.cpu()),
        "output_device": str(got.device),
        "grads": {n: [str(q.grad.device), torch.allclose(p.grad, q.grad.cpu())]
                  for (n, p), (_, q) in zip(cpu.named_parameters(), npu.named_parameters())},
        "upload": dataclasses.asdict(upload.counts),
        "step": dataclasses.asdict(step.counts),
    }


def sharded() -> Dict[str, Any]:
    """Stock DistributedModelParallel on 2 ranks of the emulated npu vs the same model on the CPU (same seed)."""
    return _two_ranks(_sharded_rank)


def _two_ranks(target: Callable[..., None]) -> Dict[str, Any]:
    import multiprocessing as mp
    import tempfile

    store_file = os.path.join(tempfile.mkdtemp(), "store")
    context = mp.get_context("fork")
    queue = context.SimpleQueue()
    ranks = [context.Process(target=target, args=(r, store_file, queue)) for r in range(2)]
    for p in ranks:
        p.start()
    results = dict(queue.get() for _ in ranks)
    for p in ranks:
        p.join(60)
    return {"ranks": results, "exit": [p.exitcode for p in ranks]}


def _sharded_rank(rank: int, store_file: str, queue: Any) -> None:
    import torch.distributed as dist

    emulated_npu.install()
    from torchrec_ascend.backends.npu import NPU
    from torchrec_ascend.hooks.sparse_ops import register_host_fallbacks

    register_host_fallbacks(NPU)  # what activating the npu backend does: block_bucketize is withheld
    torch.npu.set_device(rank)
    dist.init_process_group("cpu:gloo,npu:hccl", store=dist.FileStore(store_file, 2), rank=rank, world_size=2)
    import torchrec
    from torchrec.distributed.model_parallel import DistributedModelParallel
    from torchrec.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints, Topology
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    tables = [
        torchrec.EmbeddingBagConfig(name="t1", embedding_dim=8, num_embeddings=40, feature_names=["f1"]),
        torchrec.EmbeddingBagConfig(name="t2", embedding_dim=8, num_embeddings=30, feature_names=["f2"]),
    ]

    def batch(device: torch.device) -> KeyedJaggedTensor:
        return KeyedJaggedTensor.from_lengths_sync(
            keys=["f1", "f2"], values=torch.tensor([1, 2, 3, 4, 25, 0]) + rank, lengths=torch.tensor([2, 1, 2, 1])
        ).to(device)

    def train(sharding: str, device: torch.device) -> Dict[str, Any]:
        torch.manual_seed(0)
        ebc = torchrec.EmbeddingBagCollection(tables=tables, device=torch.device("meta"))
        planner = EmbeddingShardingPlanner(
            topology=Topology(world_size=2, compute_device=device.type),
            constraints={t.name: ParameterConstraints(sharding_types=[sharding]) for t in tables})
        plan = planner.collective_plan(ebc, None, dist.GroupMember.WORLD)
        model = DistributedModelParallel(ebc, device=device, plan=plan)
        with emulated_npu.measure() as step:
            first = model(batch(device)).wait().values()
            first.sum().backward()  # the fused optimizer updates the rows
        second = model(batch(device)).wait().values()
        return {"first": first.detach().cpu(), "second": second.detach().cpu(), "counts": step.counts,
                "devices": sorted({str(p.device) for p in model.parameters() if p.numel() > 0} | {str(first.device)}),
                "placements": sorted({str(s.placement) for t in plan.plan[""].values()
                                      for s in t.sharding_spec.shards})}

    facts: Dict[str, Any] = {}
    for sharding in ("table_wise", "row_wise"):
        cpu, npu = train(sharding, torch.device("cpu")), train(sharding, torch.device("npu", rank))
        facts[sharding] = {
            "first_equal": torch.equal(cpu["first"], npu["first"]),
            "second_equal": torch.equal(cpu["second"], npu["second"]),
            "trained": not torch.equal(npu["first"], npu["second"]),
            "devices": npu["devices"],
            "placements": npu["placements"],
            "counts": dataclasses.asdict(npu["counts"]),
        }
    dist.destroy_process_group()
    queue.put((rank, facts))
    os._exit(0)


def pipeline() -> Dict[str, Any]:
    """Stock TrainPipelineSparseDist (streams from the npu profile, H4) and DMP.copy (H5) on one emulated npu."""
    import tempfile

    import torch.distributed as dist

    emulated_npu.install()
    from torchrec_ascend.backends.npu import NPU
    from torchrec_ascend.hooks.sparse_ops import register_host_fallbacks

    register_host_fallbacks(NPU)
    store = dist.FileStore(os.path.join(tempfile.mkdtemp(), "store"), 1)
    dist.init_process_group("cpu:gloo,npu:hccl", store=store, rank=0, world_size=1)
    import torchrec
    from torchrec.distributed.model_parallel import DistributedModelParallel
    from torchrec.distributed.train_pipeline import TrainPipelineSparseDist
    from torchrec.optim.keyed import KeyedOptimizerWrapper
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    class Model(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ebc = torchrec.EmbeddingBagCollection(tables=[torchrec.EmbeddingBagConfig(
                name="t1", embedding_dim=8, num_embeddings=40, feature_names=["f1"])], device=torch.device("meta"))

        def forward(self, kjt: KeyedJaggedTensor) -> Any:
            loss = self.ebc(kjt).values().sum()
            return loss, loss.detach()

    device = torch.device("npu", 0)
    model = DistributedModelParallel(Model(), device=device)
    optimizer = KeyedOptimizerWrapper(dict(model.named_parameters()), lambda p: torch.optim.SGD(p, lr=0.1))
    pipe = TrainPipelineSparseDist(model, optimizer, device)
    batches = iter([KeyedJaggedTensor.from_lengths_sync(
        keys=["f1"], values=torch.tensor([1, 2, 3]) + i, lengths=torch.tensor([2, 1])) for i in range(3)])
    losses = []
    for _ in range(3):
        losses.append(str(pipe.progress(batches).device))
    copy = model.copy(device)
    return {
        "streams": [type(pipe._memcpy_stream).__name__, pipe._memcpy_stream.device_type == 20,
                    pipe._data_dist_stream.priority],
        "losses": losses,
        "copy_devices": sorted({str(p.device) for p in copy.parameters() if p.numel() > 0}),
        "copy_shares_group": copy._env.process_group is model._env.process_group,
    }


def activation() -> Dict[str, Any]:
    """The torchrec-ascend backend selection once the emulator is installed (no torch_npu here)."""
    from torchrec_ascend import backends
    from torchrec_ascend.hooks import sparse_ops

    facts: Dict[str, Any] = {"before": sorted(backends.profiles())}
    emulated_npu.install()
    import torchrec  # noqa: F401  (the registry is built: the backend activates, its H6 entry registers the ops)

    profile = backends.active()
    facts.update(name=profile.name, device_type=profile.device_type, collective=profile.collective_backend,
                 description=profile.description, by_type=backends.profile_for("npu").name,
                 host_fallbacks=sparse_ops.REGISTERED, after=sorted(backends.profiles()))
    return facts


def hash_modules() -> Dict[str, Any]:
    """Unsharded hash tables (torchrec_ascend.hash.modules) on the emulated npu vs the same collection on the CPU."""
    emulated_npu.install()
    import torchrec
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    from torchrec_ascend.hash.configs import HashEmbeddingBagConfig

    tables = [  # "item" is read by two features: the collection maps both in one call per batch (assign_batch)
        HashEmbeddingBagConfig(name="user", embedding_dim=4, num_embeddings=8, feature_names=["u"]),
        HashEmbeddingBagConfig(name="item", embedding_dim=4, num_embeddings=8, feature_names=["i", "j"]),
    ]
    cpu = torchrec.EmbeddingBagCollection(tables=tables)
    npu = torchrec.EmbeddingBagCollection(tables=tables).to("npu")
    facts: Dict[str, Any] = {
        "slot_table_device": [str(t.slots.slot_ids.device) for t in npu.embedding_bags.values()],
        "weight_device": [str(t.weight.device) for t in npu.embedding_bags.values()],
        "state_dict_keys": list(npu.state_dict()) == list(cpu.state_dict()),
    }

    def batch(values: list) -> KeyedJaggedTensor:
        return KeyedJaggedTensor.from_lengths_sync(keys=["u", "i", "j"], values=torch.tensor(values),
                                                   lengths=torch.tensor([2, 1, 1, 1, 1, 1]))

    steps = []
    for values in ([7, 2**40, 3, 5, 3, 9, 11], [7, 7, 3, 12, 9, 5, 5]):
        expected = cpu(batch(values)).values()
        (expected * expected).sum().backward()
        got = npu(batch(values).to("npu")).values()
        (got * got).sum().backward()
        steps.append([str(got.device), torch.equal(expected, got.cpu())])
    facts["train"] = steps
    facts["grads"] = [torch.equal(p.grad, q.grad.cpu()) for p, q in zip(cpu.parameters(), npu.parameters())]
    cpu.eval(), npu.eval()
    unknown = [7, 99, 3, 5, 98, 9, 11]  # 99 and 98 were never trained: they read not_admitted_value
    facts["eval_unknown"] = torch.equal(cpu(batch(unknown)).values(), npu(batch(unknown).to("npu")).values().cpu())
    npu.train()

    lookup = npu.embedding_bags["user"]
    offsets = torch.tensor([0, 2, 3]).to("npu")
    new_ids, known_ids = torch.tensor([21, 22, 21]).to("npu"), torch.tensor([7, 21, 7]).to("npu")
    facts["lookup_new"] = _counted(lambda: lookup(new_ids, offsets))
    facts["lookup_known"] = _counted(lambda: lookup(known_ids, offsets))
    facts["negative"] = _error(lambda: npu(batch([1, 2, 3, -4, 5, 6, 7]).to("npu")))
    facts["full"] = _error(lambda: npu(batch(list(range(100, 107))).to("npu")) and npu(
        batch(list(range(200, 207))).to("npu")))
    return facts


def sharded_tensor_device() -> Dict[str, Any]:
    """ShardedTensor.device on 2 emulated-npu ranks where rank 1 holds no shard (patch h5.sharded_tensor_device)."""
    return _two_ranks(_sharded_tensor_rank)


def _sharded_tensor_rank(rank: int, store_file: str, queue: Any) -> None:
    import torch.distributed as dist

    emulated_npu.install()
    import torchrec  # noqa: F401  # the patch registry applies its entries
    from torch.distributed._shard.sharded_tensor import Shard, ShardedTensor, ShardMetadata
    from torch.distributed._shard.sharded_tensor._ops.tensor_ops import tensor_device

    torch.npu.set_device(rank)
    store = dist.FileStore(store_file, 2)
    dist.init_process_group(f"cpu:gloo,npu:{emulated_npu.COLLECTIVE_BACKEND}", store=store, rank=rank, world_size=2)

    def table(group: Any, device: str) -> Any:
        shards = [Shard(torch.ones(4, 2, device=device), ShardMetadata([0, 0], [4, 2], f"rank:0/{device}"))]
        return ShardedTensor._init_from_local_shards(shards if rank == 0 else [], [4, 2], process_group=group)

    on_npu = table(None, "npu:0")
    gloo = dist.new_group([0, 1], backend="gloo")
    on_gloo = table(gloo, "cpu")
    facts = {
        "device": str(on_npu.device),
        "torch_op": _error(lambda: tensor_device(None, (on_npu,), None, on_npu._process_group)),
        "gloo_device": str(on_gloo.device),
    }
    dist.barrier()
    dist.destroy_process_group()
    queue.put((rank, facts))
    os._exit(0)


def dense_kernels() -> Dict[str, Any]:
    """TorchRec's pooled dense (data_parallel) kernel built for the emulated npu (h2.dense_pooled_device) vs the CPU."""
    emulated_npu.install()
    from torchrec.distributed.batched_embedding_kernel import BatchedDenseEmbeddingBag
    from torchrec.distributed.embedding_types import (
        EmbeddingComputeKernel,
        GroupedEmbeddingConfig,
        ShardedEmbeddingTable,
    )
    from torchrec.modules.embedding_configs import DataType, PoolingType
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    from torchrec_ascend.kernels.dense import SequenceDenseEmbedding  # the npu profile's sequence/dense kernel

    tables = [ShardedEmbeddingTable(name=name, embedding_dim=4, num_embeddings=rows, feature_names=[f"f_{name}"],
                                    local_rows=rows, local_cols=4, pooling=PoolingType.SUM, data_type=DataType.FP32)
              for name, rows in (("a", 10), ("b", 6))]
    config = GroupedEmbeddingConfig(data_type=DataType.FP32, pooling=PoolingType.SUM, is_weighted=False,
                                    has_feature_processor=False, compute_kernel=EmbeddingComputeKernel.DENSE,
                                    embedding_tables=tables)

    def batch() -> KeyedJaggedTensor:
        return KeyedJaggedTensor.from_lengths_sync(keys=["f_a", "f_b"], values=torch.tensor([1, 2, 9, 5, 0]),
                                                   lengths=torch.tensor([2, 1, 1, 1]))

    facts: Dict[str, Any] = {}
    for name, cls in (("pooled", BatchedDenseEmbeddingBag), ("sequence", SequenceDenseEmbedding)):
        cpu, npu = cls(config, None, torch.device("cpu")), cls(config, None, torch.device("npu"))
        with torch.no_grad():
            npu.emb_module.weights.copy_(cpu.emb_module.weights.to("npu"))
        expected, got = cpu(batch()), npu(batch().to("npu"))
        (expected * expected).sum().backward()
        (got * got).sum().backward()
        facts[name] = {
            "parameters": sorted({str(p.device) for p in npu.parameters()}),
            "per_table": sorted({str(p.device) for p in npu._param_per_table.values()}),
            "state_dict": sorted({str(t.device) for t in npu.state_dict().values()}),
            "output": [str(got.device), torch.equal(expected, got.cpu())],
            "grad": [str(npu.emb_module.weights.grad.device),
                     torch.equal(cpu.emb_module.weights.grad, npu.emb_module.weights.grad.cpu())],
            "cpu_kernel": str(cpu.emb_module.weights.device),
        }
    return facts


def hash_data_parallel() -> Dict[str, Any]:
    """data_parallel hash tables (EBC and EC, dense kernel) on 2 emulated-npu ranks over an npu-only group."""
    return _two_ranks(_hash_data_parallel_rank)


def _hash_data_parallel_rank(rank: int, store_file: str, queue: Any) -> None:
    import torch.distributed as dist

    emulated_npu.install()
    os.environ["TORCHREC_ASCEND_DEVICE"] = "npu_emulated"
    import torchrec
    from torchrec.distributed.model_parallel import DistributedModelParallel
    from torchrec.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints, Topology
    from torchrec.distributed.types import ShardingEnv
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    from torchrec_ascend import backends
    from torchrec_ascend.hash.configs import HashEmbeddingBagConfig, HashEmbeddingConfig
    from torchrec_ascend.kernels.dense import HashDenseRows
    from torchrec_ascend.kernels.walk import sharded_kernels
    from torchrec_ascend.sharders import get_default_hybrid_sharders

    backends.activate()
    torch.npu.set_device(rank)
    dist.init_process_group(emulated_npu.COLLECTIVE_BACKEND, store=dist.FileStore(store_file, 2), rank=rank,
                            world_size=2)  # no host backend, as on an Ascend host
    device = torch.device("npu", rank)
    # Ranks share ID 7 and 3 (in different orders): every replica must give each ID the same row.
    values = torch.tensor([7, 3, 11, 5] if rank == 0 else [3, 7, 13, 5])
    batch = KeyedJaggedTensor.from_lengths_sync(keys=["f", "g"], values=values, lengths=torch.tensor([2, 1, 1, 0]))
    facts: Dict[str, Any] = {}
    for kind, config, collection in (("ebc", HashEmbeddingBagConfig, torchrec.EmbeddingBagCollection),
                                     ("ec", HashEmbeddingConfig, torchrec.EmbeddingCollection)):
        torch.manual_seed(0)
        tables = [config(name="t", embedding_dim=4, num_embeddings=16, feature_names=["f", "g"])]
        module = collection(tables=tables)  # type: ignore[operator]  # the tuple mixes two collection classes
        sharders = get_default_hybrid_sharders()
        planner = EmbeddingShardingPlanner(
            topology=Topology(world_size=2, compute_device=device.type),
            constraints={"t": ParameterConstraints(sharding_types=["data_parallel"], compute_kernels=["dense"])})
        plan = planner.collective_plan(module, sharders, dist.GroupMember.WORLD)
        model = DistributedModelParallel(module, env=ShardingEnv.from_process_group(dist.GroupMember.WORLD),
                                         device=device, plan=plan, sharders=sharders)
        on_device = batch.to(device)

        def step(model: Any = model, on_device: Any = on_device, kind: str = kind) -> Any:
            out = model(on_device)
            rows = out.values() if kind == "ebc" else torch.cat([out[k].values() for k in ("f", "g")])
            rows.sum().backward()
            return rows

        error = _error(step)
        if error:
            facts[kind] = {"error": error}
            continue
        with emulated_npu.measure() as m:
            rows = step()
        # A batch over the gather width (256 IDs per rank at first): one more gather and copy, then the wider width.
        wide = KeyedJaggedTensor.from_lengths_sync(keys=["f", "g"], values=torch.tensor([7, 3] * 150 + [5]),
                                                   lengths=torch.tensor([300, 0, 1, 0])).to(device)
        with emulated_npu.measure() as widening:
            step(on_device=wide)
        kernels = [k for k in sharded_kernels(model) if isinstance(k, HashDenseRows)]
        id_maps = [[t.tolist() for t in st.id_map.export()] for k in kernels for st in k._slot_tables]
        facts[kind] = {"error": "", "device": str(rows.device), "counts": dataclasses.asdict(m.counts),
                       "widening": dataclasses.asdict(widening.counts), "widths": [k._gather_width for k in kernels],
                       "id_maps": id_maps, "rows": rows.detach().cpu().tolist()}
    dist.destroy_process_group()
    queue.put((rank, facts))
    os._exit(0)


PROGRAMS: Dict[str, Callable[[], Dict[str, Any]]] = {
    "hash_data_parallel": hash_data_parallel,
    "activation": activation,
    "pipeline": pipeline,
    "sharded": sharded,
    "device": device,
    "fbgemm": fbgemm,
    "collectives": collectives,
    "tbe": tbe,
    "ebc": ebc,
    "hash_modules": hash_modules,
    "sharded_tensor_device": sharded_tensor_device,
    "dense_kernels": dense_kernels,
}


def main(name: str) -> None:
    """Run the program ``name`` and report its facts, then end without interpreter teardown: on torch 2.14's CUDA
    build (the tr19 lane, no GPU) teardown after the fbgemm probes aborts in a C++ thread destructor ("terminate
    called without an active exception") once the report is out; the facts are what the tests check."""
    report(PROGRAMS[name]())
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
