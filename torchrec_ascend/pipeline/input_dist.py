"""TorchRec's input dist, cut where the pipeline's host stages meet, and the process groups it runs on.

``TrainPipelineSparseDist`` runs a sharded module's input dist in two calls (start, then wait for the splits). The
hybrid pipeline needs finer cuts so that each host lane does one kind of work:

* :func:`split` (SPLIT): each pipelined module's ``input_dist``: permute, bucketize, and the per-rank splits. No
  collective is issued: the pipeline's ``KJTAllToAllForward`` only records what to send.
* :func:`launch_splits` + :func:`wait_splits` (FIRST_ALL2ALL): the fused splits all-to-all (how many lengths and
  IDs each rank receives); waiting for it issues the lengths/IDs all-to-all.
* :func:`wait_tensors` (SECOND_ALL2ALL): waits for the lengths/IDs all-to-all and assembles the local KJTs.
* :func:`prefetch` (POST_INPUT): the sharded modules' ``prefetch`` (TorchRec's idiom for cached tables), where
  kernels do ID mapping, swap planning and swap-in ahead of compute.

:class:`InputDistGroups` gives the input dists their own process groups, so the host lane's all-to-alls never
interleave with the caller thread's output-dist and DDP collectives on the model's groups.

TorchRec's private names (the fused splits all-to-all, the input dists' ``KJTAllToAllForward`` objects and their
process groups) are reached through :mod:`torchrec_ascend.adapters.train_pipeline`; the pipelined forwards'
``name``/``args`` and the fields of ``PrefetchTrainPipelineContext`` are public.

Example::

    split(modules, batch, context, workers)
    launch_splits(context); wait_splits(context)
    wait_tensors(modules, context, workers); prefetch(modules, context, workers, forward_stream=None)
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence

import torch
import torch.distributed as dist
from torchrec.distributed.train_pipeline.pipeline_context import PrefetchTrainPipelineContext

from torchrec_ascend.adapters import train_pipeline as adapter
from torchrec_ascend.pipeline.lanes import ModuleWorkers

GROUP_DESC = "torchrec_ascend_pipeline_input_dist"


def split(
    modules: Sequence[torch.nn.Module], batch: Any, context: PrefetchTrainPipelineContext, workers: ModuleWorkers
) -> None:
    """SPLIT: run each pipelined module's ``input_dist`` on ``batch``; fills ``context`` in the modules' order."""

    def one(module: Any) -> Any:
        forward = module.forward
        args, kwargs = forward.args.build_args_kwargs(batch)
        args, kwargs = module.preprocess_input(args, kwargs)
        module_ctx = module.create_context()
        return forward.name, module_ctx, module.input_dist(module_ctx, *args, **kwargs)

    for name, module_ctx, request in workers.map(one, modules):
        context.module_contexts[name] = module_ctx
        context.input_dist_splits_requests[name] = request


def launch_splits(context: PrefetchTrainPipelineContext) -> None:
    """FIRST_ALL2ALL, first half: issue the fused splits all-to-all (one per process group)."""
    adapter.fuse_input_dist_splits(context)


def wait_splits(context: PrefetchTrainPipelineContext) -> None:
    """FIRST_ALL2ALL, second half: wait for the splits; this issues the lengths/IDs all-to-all of every module."""
    for names, awaitable in context.fused_splits_awaitables:
        for name, request in zip(names, awaitable.wait()):
            context.input_dist_tensors_requests[name] = request
    context.input_dist_splits_requests.clear()
    context.fused_splits_awaitables.clear()


def wait_tensors(
    modules: Sequence[torch.nn.Module], context: PrefetchTrainPipelineContext, workers: ModuleWorkers
) -> None:
    """SECOND_ALL2ALL: wait for each module's lengths/IDs all-to-all and keep the assembled input for compute."""
    names = [module.forward.name for module in modules]  # type: ignore[attr-defined]  # TorchRec's pipelined forward, named
    requests = [context.input_dist_tensors_requests.pop(name) for name in names]
    for name, dist_input in zip(names, workers.map(lambda request: request.wait(), requests)):
        context.module_input_post_prefetch[name] = dist_input


def prefetch(
    modules: Sequence[torch.nn.Module],
    context: PrefetchTrainPipelineContext,
    workers: ModuleWorkers,
    forward_stream: Optional[torch.Stream],
) -> None:
    """POST_INPUT: each module's ``prefetch`` (a no-op for kernels without a cache), as TorchRec's prefetch pipeline.

    Moves each module's context to ``module_contexts_post_prefetch``, where the pipelined forward picks it up.
    """
    names = [module.forward.name for module in modules]  # type: ignore[attr-defined]  # TorchRec's pipelined forward, named
    module_ctxs = [context.module_contexts.pop(name) for name in names]

    def one(pair: Any) -> None:
        (module, name), module_ctx = pair
        dist_input = context.module_input_post_prefetch[name]
        if forward_stream is not None:
            # As TorchRec's prefetch pipeline: the input and the context were made on the lanes' streams and are
            # used, then freed, by compute; recorded here, the allocator does not hand their memory to a lane's
            # stream while work of this stream or compute's may still read it.
            for stream in (torch.accelerator.current_stream(), forward_stream):
                dist_input.record_stream(stream)
                module_ctx.record_stream(stream)
        module.prefetch(dist_input=dist_input, forward_stream=forward_stream, ctx=module_ctx)

    workers.map(one, list(zip(zip(modules, names), module_ctxs)))
    for name, module_ctx in zip(names, module_ctxs):
        context.module_contexts_post_prefetch[name] = module_ctx


class InputDistGroups:
    """Mirrors of the process groups the input dists were built with: same ranks, same backend, their own queue.

    Collectives of one group must be issued in the same order on every rank. The hybrid pipeline issues input-dist
    all-to-alls from a host thread while the caller's thread issues output-dist and DDP collectives, so the two may
    not share a group. Each distinct group found on the pipelined modules' input dists gets one mirror (created
    collectively, in the modules' order, on every rank of that group); :meth:`retarget` points the input dists at
    the mirrors.

    Example::

        groups = InputDistGroups()
        groups.retarget(pipelined_modules)   # 1 input dist now issues its all-to-alls on the mirror
        groups.destroy()
    """

    def __init__(self) -> None:
        self._mirrors: Dict[dist.ProcessGroup, dist.ProcessGroup] = {}

    def retarget(self, modules: Sequence[torch.nn.Module]) -> int:
        """Point every pipelined input dist of ``modules`` at its group's mirror; returns how many were pointed."""
        count = 0
        for forward in adapter.input_dist_forwards(modules):
            group = adapter.group_of(forward)
            if group is not None and group.size() > 1:
                adapter.set_group(forward, self._mirror(group))
                count += 1
        return count

    def groups(self) -> List[dist.ProcessGroup]:
        """The mirrors created so far."""
        return list(self._mirrors.values())

    def destroy(self) -> None:
        """Destroy the mirrors (a local operation); call once no collective is in flight on them."""
        mirrors, self._mirrors = list(self._mirrors.values()), {}
        if dist.is_initialized():
            for group in mirrors:
                dist.destroy_process_group(group)

    def _mirror(self, group: dist.ProcessGroup) -> dist.ProcessGroup:
        if group in self._mirrors.values():
            return group
        if group not in self._mirrors:
            ranks = dist.get_process_group_ranks(group)
            self._mirrors[group] = dist.new_group(
                ranks=ranks,
                backend=dist.get_backend(group),
                # Only a subgroup's own ranks take part in creating its mirror (2D sharding has many subgroups).
                use_local_synchronization=len(ranks) != dist.get_world_size(),
                group_desc=GROUP_DESC,
            )
        return self._mirrors[group]

