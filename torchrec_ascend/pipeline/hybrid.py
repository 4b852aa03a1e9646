"""HybridTrainPipelineSparseDist: TorchRec's sparse-dist train pipeline with its host stages on threads, 1-12 deep.

Why: ID bucketizing, the two input all-to-alls, KJT assembly and cache prefetch (ID mapping, swap planning) run
on the host. TorchRec's ``TrainPipelineSparseDist`` reorders that work around compute but runs it on the caller's
thread, two batches deep; off CUDA nothing overlaps. RecSDK overlaps up to 12 batches on thread pools.

Design:

* The model rewrite is TorchRec's own: this class subclasses ``TrainPipelineSparseDist`` and uses
  ``_pipeline_model`` (``_rewrite_model``) with ``PrefetchPipelinedForward``, the forward of TorchRec's prefetch
  pipeline, so each sharded module's forward takes an input dist that a host thread already finished and prefetched.
* The host stages (LOAD, COPY2DEVICE, SPLIT, FIRST_ALL2ALL, SECOND_ALL2ALL, POST_INPUT; see
  :mod:`~torchrec_ascend.pipeline.host_stages`) run on four lanes, one thread each, every lane taking batches in
  order; a pool of ``host_threads`` runs a stage over a batch's sharded modules in parallel. COMPUTE (forward,
  backward, optimizer step) stays on the caller's thread. ``pipe_n_batch`` batches are in flight at once: while
  batch ``k`` computes, batches ``k+1 .. k+pipe_n_batch-1`` move through the host stages.
* Collectives: gloo and hccl process groups must see each group's collectives in the same order on every rank.
  The input dists' all-to-alls are issued by one lane, in batch order, on mirror groups of their own
  (:class:`~torchrec_ascend.pipeline.input_dist.InputDistGroups`: ``dist.new_group`` over the same ranks, same
  backend), so they never interleave with the caller thread's output-dist and DDP collectives on the model's
  groups. The first batch's input dist runs on the caller's thread while the model is rewritten, on the model's
  groups, before any lane exists.
* POST_INPUT calls each sharded module's ``prefetch`` (TorchRec's idiom, as ``PrefetchTrainPipelineSparseDist``
  does, but also where the device has no streams), so kernels that prefetch get every batch ahead of compute and
  in order. Every object in the model with ``set_pipeline_depth(depth)`` is told the depth at construction; a
  hash kernel accepts any depth: each prefetched batch pins its rows against eviction until the lookup after its
  own (its backward is done by then), so pins follow the batches actually in flight; a batch whose rows do not
  fit next to the pinned ones is mapped at its lookup instead, with the same result.
* Devices with streams (from the backend profile) get memcpy, data-dist and prefetch streams; stages hand batches
  over with events (:mod:`~torchrec_ascend.pipeline.streams`). CPU has none.
* Failures: a stage that raises on batch ``k`` makes ``progress`` raise :class:`PipelineStageError` (stage, batch
  index, cause) when batch ``k`` would have been computed; batches before ``k`` train normally. Lanes skip every
  batch after a failed one, so ranks that fail alike stop issuing collectives at the same batch. Threads are joined
  (after the batches already submitted finish or are skipped; nothing is cancelled, since which queued batch a
  cancellation catches would differ between ranks) when a host stage fails, at the end of the data, on
  ``detach()`` and when the pipeline is garbage-collected; the mirror groups are destroyed on collection. A
  COMPUTE failure keeps the batches behind it in flight, so training can go on past a bad batch.

Example::

    pipeline = HybridTrainPipelineSparseDist(dmp, optimizer, torch.device("cpu"), pipe_n_batch=3)
    batches = iter(dataloader)
    while True:
        try:
            pipeline.progress(batches)
        except StopIteration:
            break
"""

from __future__ import annotations

import dataclasses
import time
import weakref
from collections import deque
from concurrent.futures import Future
from typing import Any, Callable, Deque, Dict, Iterator, List, Optional, Tuple

import torch
from torch.profiler import record_function
from torchrec.distributed.train_pipeline.pipeline_context import PrefetchTrainPipelineContext
from torchrec.distributed.train_pipeline.runtime_forwards import PrefetchPipelinedForward
from torchrec.distributed.train_pipeline.types import PipelineState

from torchrec_ascend import adapters
from torchrec_ascend.adapters import train_pipeline
from torchrec_ascend.adapters.train_pipeline import SparseDistPipeline
from torchrec_ascend.pipeline import host_stages, input_dist, sizing
from torchrec_ascend.pipeline.host_stages import BatchInFlight, Source
from torchrec_ascend.pipeline.lanes import HostLanes, ModuleWorkers, StageClock, thread_prefix
from torchrec_ascend.pipeline.stages import PipelineStageError, Stage
from torchrec_ascend.pipeline.streams import PipelineStreams


@dataclasses.dataclass
class _Entry:
    """A batch in flight: its index, the load lane's future (is there a batch?) and the last lane's."""

    index: int
    loaded: Future
    done: Future


class _Resources:
    """What must be released when the pipeline stops or is collected; holds no reference to the pipeline."""

    def __init__(self) -> None:
        self.lanes: Optional[HostLanes] = None
        self.workers: Optional[ModuleWorkers] = None
        self.groups = input_dist.InputDistGroups()

    def stop_threads(self) -> None:
        """Let submitted batches finish their host stages, then join every thread."""
        lanes, workers, self.lanes, self.workers = self.lanes, self.workers, None, None
        if lanes is not None:
            lanes.shutdown()
        if workers is not None:
            workers.shutdown()

    def close(self) -> None:
        self.stop_threads()
        self.groups.destroy()


class HybridTrainPipelineSparseDist(SparseDistPipeline, pipelined_forward=PrefetchPipelinedForward):
    """TorchRec's ``TrainPipelineSparseDist`` with host stages on threads and ``pipe_n_batch`` batches in flight.

    Same use as the stock pipeline: ``progress(dataloader_iter)`` trains one batch and returns the model output,
    raises ``StopIteration`` when the data is done; ``detach()`` gives the original model back (in-flight batches
    are kept and training resumes on the next ``progress``). The optimizer steps the dense parameters; sharded
    tables are updated by their fused optimizers in backward, as with the stock pipeline.

    Args:
        model (torch.nn.Module): the model, usually a ``DistributedModelParallel``; its forward takes one batch and
            returns ``(losses, output)``. It must be traceable by torch.fx apart from its sharded modules.
        optimizer (torch.optim.Optimizer): dense optimizer, stepped after each backward.
        device (torch.device): training device.
        pipe_n_batch (int): batches in flight, counting the one computing: 1 (no overlap) to 12.
        host_threads (Optional[int]): pool size for running a stage over a batch's sharded modules in parallel;
            None: ``TORCHREC_ASCEND_PIPELINE_HOST_THREADS``, else sized from the cores available (see
            :mod:`~torchrec_ascend.pipeline.sizing`).
        execute_all_batches (bool): True trains every batch; False (stock semantics) stops as soon as the
            dataloader ends, so the last ``pipe_n_batch - 1`` batches are not trained.
        apply_jit (bool): ``torch.jit.script`` the non-sharded modules (stock option).
        custom_model_fwd (Optional[Callable]): replaces ``model`` as the forward (stock option).

    Raises:
        ConfigError: ``pipe_n_batch`` or ``host_threads`` is invalid, a kernel refuses the depth, or the
            installed torchrec is not a version this pipeline was written for.

    Example::

        pipeline = HybridTrainPipelineSparseDist(dmp, dense_optimizer, torch.device("cpu"), pipe_n_batch=6)
        batches = iter(loader)
        for _ in range(steps):
            output = pipeline.progress(batches)
    """

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        device: torch.device,
        pipe_n_batch: int = 3,
        host_threads: Optional[int] = None,
        execute_all_batches: bool = True,
        apply_jit: bool = False,
        custom_model_fwd: Optional[Callable[[Any], Tuple[torch.Tensor, Any]]] = None,
    ) -> None:
        adapters.require(train_pipeline.ADAPTER, "HybridTrainPipelineSparseDist",
                         instead="TorchRec's own TrainPipelineSparseDist")
        self._depth = sizing.validate_depth(pipe_n_batch)
        self._host_threads = sizing.host_threads(host_threads)
        super().__init__(
            model=model,
            optimizer=optimizer,
            device=device,
            execute_all_batches=execute_all_batches,
            apply_jit=apply_jit,
            context_type=PrefetchTrainPipelineContext,
            custom_model_fwd=custom_model_fwd,
        )
        # Before any thread or group exists: a kernel that cannot protect this many batches refuses here.
        self.depth_configured: List[str] = sizing.apply_pipeline_depth(model, self._depth)
        self._streams = PipelineStreams(device)
        self.set_streams(self._streams.memcpy, self._streams.data_dist)
        self._clock = StageClock()
        self._in_flight: Deque[_Entry] = deque()
        self._source: Optional[Source] = None
        self._trace_batch: Any = None  # the batch the model was rewritten with; re-attaching traces it again
        self._resources = _Resources()
        weakref.finalize(self, self._resources.close)

    @property
    def pipe_n_batch(self) -> int:
        """Batches in flight, counting the one computing."""
        return self._depth

    @property
    def host_threads(self) -> int:
        """Size of the pool that runs a stage over a batch's sharded modules."""
        return self._host_threads

    def stage_seconds(self) -> Dict[str, float]:
        """Seconds spent per stage since construction, summed over batches (host stages overlap each other)."""
        return self._clock.seconds()

    def progress(self, dataloader_iter: Iterator[Any]) -> Any:
        """Train the next batch and return the model output.

        Raises:
            StopIteration: the data is done (every batch trained, unless ``execute_all_batches=False``).
            PipelineStageError: a stage raised on the batch due now; the batches behind it are dropped and
                ``progress`` may be called again (with a new iterator) to go on.
        """
        self.set_state(PipelineState.IDLE)
        if not self.model_attached:
            self.attach(self.model)
        if self._source is None or self._source.iterator is not dataloader_iter:
            self._source = Source(dataloader_iter)
        if not self._in_flight and self._source.exhausted:
            raise StopIteration
        if not self.pipelined_modules:
            self._rewire()
        self._top_up()
        if not self.execute_all_batches:
            self._stop_unless_loaded(self._in_flight[-1])
        return self._compute(self._next_ready())

    def detach(self) -> torch.nn.Module:
        """Finish the in-flight batches' host stages, join the threads and return the original model.

        The finished batches are kept: the next ``progress`` re-attaches the model and trains them first.
        """
        self._resources.stop_threads()
        return super().detach()

    def attach(self, model: Optional[torch.nn.Module] = None, sparse_dist: bool = True) -> None:
        """Re-attach after :meth:`detach` (``progress`` does it by itself); ``sparse_dist`` is ignored."""
        if self.model_attached:
            self.detach()  # rewriting an already rewritten model would lose its original forwards
        if model is not None:
            self.model = model
        self.model_attached = True
        self.pipelined_modules = []  # progress() rewrites the model again before the next batch

    def reset(self) -> None:
        """Drop the batches in flight (after finishing their host stages) and forget the dataloader."""
        self._resources.stop_threads()
        self._in_flight.clear()
        self._source = None
        super().reset()

    def rewrite_model(self, batch: Any, context: Any, pipelined_forward: Any) -> None:
        # TorchRec's rewrite (which also starts this batch's input dist on the model's groups), then move the
        # pipelined input dists onto their mirror groups for every later batch. If any of it fails, the model gets
        # its forwards back: lanes must never run input dists that were not rewritten (they would issue
        # collectives on the model's groups from a host thread).
        self.forget_rewrite()  # done again by TorchRec's rewrite once it finishes
        try:
            self.stock_rewrite(batch, context, pipelined_forward)
            self._resources.groups.retarget(self.pipelined_modules)
        except BaseException:
            if self.rewrite_finished:  # the rewrite finished: undo it as detach() does
                super().detach()
                self.model_attached = True
            else:
                for module, forward in zip(self.pipelined_modules, self.original_forwards):
                    module.forward = forward
            self.pipelined_modules = []
            raise

    def _rewire(self) -> None:
        """Rewrite the model. The first time, the first batch goes through its host stages on this thread."""
        if self._trace_batch is not None:
            # Re-attaching: like the stock attach(), tracing restarts an input dist, here into a context dropped.
            throwaway = self.context_type(index=-1, version=1)
            self.rewrite_model(self._trace_batch, throwaway, self.pipelined_forward_type)
            return
        source, index = self._source, self.next_index
        assert source is not None
        self.next_index += 1
        item = self._inline(Stage.LOAD, index, lambda: host_stages.load(source, index, self.context_type))
        if item is None:
            raise StopIteration
        self._inline(
            Stage.COPY2DEVICE, index, lambda: host_stages.copy_to_device(item, self.training_device, self._streams)
        )
        self._inline(
            Stage.SPLIT, index, lambda: self.rewrite_model(item.batch, item.context, self.pipelined_forward_type)
        )
        self._trace_batch = item.batch
        self._inline(Stage.FIRST_ALL2ALL, index, lambda: input_dist.wait_splits(item.context))
        modules, here = self.pipelined_modules, ModuleWorkers(1, "")  # 1 thread: runs on the caller's
        self._inline(Stage.SECOND_ALL2ALL, index, lambda: input_dist.wait_tensors(modules, item.context, here))
        self._inline(
            Stage.POST_INPUT, index, lambda: input_dist.prefetch(modules, item.context, here, self._streams.compute)
        )
        done: Future = Future()
        done.set_result(item)
        self._in_flight.appendleft(_Entry(index, loaded=done, done=done))

    def _inline(self, stage: Stage, index: int, fn: Callable[[], Any]) -> Any:
        start = time.perf_counter()
        try:
            return fn()
        except Exception as err:
            raise PipelineStageError(stage, index, err) from err
        finally:
            self._clock.add(stage, time.perf_counter() - start)

    def _top_up(self) -> None:
        """Submit batches until ``pipe_n_batch`` are in flight."""
        while len(self._in_flight) < self._depth:
            if self._resources.lanes is None:
                prefix = thread_prefix()
                workers = ModuleWorkers(self._host_threads, prefix)
                lanes = host_stages.build_lanes(
                    self.pipelined_modules, self.training_device, self._streams, workers, self.context_type
                )
                self._resources.workers, self._resources.lanes = workers, HostLanes(lanes, self._clock, prefix)
            index = self.next_index
            self.next_index += 1
            futures = self._resources.lanes.submit(index, self._source)
            self._in_flight.append(_Entry(index, loaded=futures[0], done=futures[-1]))

    def _stop_unless_loaded(self, entry: _Entry) -> None:
        """Stock ``execute_all_batches=False``: stop once the dataloader cannot fill the pipeline."""
        try:
            loaded = entry.loaded.result()
        except PipelineStageError as err:
            self._drop_in_flight()
            raise _with_detail(err, "The batches in flight were dropped (execute_all_batches=False)") from err.__cause__
        if loaded is None:
            self._drop_in_flight()
            raise StopIteration

    def _next_ready(self) -> BatchInFlight:
        entry = self._in_flight.popleft()
        try:
            item = entry.done.result()
        except PipelineStageError as err:
            dropped = [e.index for e in self._in_flight]
            self._drop_in_flight()
            detail = (
                f"Batches {dropped[0]}..{dropped[-1]}, in flight behind it, were dropped. " if dropped else ""
            ) + "Call progress() again (with a new iterator if the dataloader failed) to go on"
            raise _with_detail(err, detail) from err.__cause__
        if item is None:
            self._drop_in_flight()
            raise StopIteration
        return item

    def _drop_in_flight(self) -> None:
        self._resources.stop_threads()
        self._in_flight.clear()

    def _compute(self, item: BatchInFlight) -> Any:
        """COMPUTE on the caller's thread: forward, backward, optimizer step."""
        context = item.context
        self.set_module_context(context)
        start = time.perf_counter()
        try:
            if self.model.training:
                with record_function("## zero_grad ##"):
                    self.dense_optimizer.zero_grad()
            self._streams.wait(item.ready, item.batch)
            self.set_state(PipelineState.CALL_FWD)
            with record_function(f"## forward {context.index} ##"):
                losses, output = self.model_fwd(item.batch)
            if self.model.training:
                self.set_state(PipelineState.CALL_BWD)
                with record_function(f"## backward {context.index} ##"):
                    torch.sum(losses, dim=0).backward()
                self.sync_embeddings(self.model, self.sync_interval_batches, context)
                with record_function(f"## optimizer {context.index} ##"):
                    self.dense_optimizer.step()
        except Exception as err:
            raise PipelineStageError(
                Stage.COMPUTE, int(context.index), err, "The batches in flight behind it are kept"
            ) from err
        finally:
            self._clock.add(Stage.COMPUTE, time.perf_counter() - start)
        self.set_state(PipelineState.IDLE)
        return output


def _with_detail(err: PipelineStageError, detail: str) -> PipelineStageError:
    cause = err.__cause__ if err.__cause__ is not None else err
    return PipelineStageError(err.stage, err.batch_index, cause, detail)
