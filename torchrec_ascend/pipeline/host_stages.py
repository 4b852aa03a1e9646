"""The hybrid pipeline's host lanes: which stage runs on which thread, and what a batch carries between them.

Four lanes, each one thread taking batches in order (see :mod:`torchrec_ascend.pipeline.lanes` for why one):

========  ===========================  ===================================================================
lane      stages                       why it is a lane of its own
========  ===========================  ===================================================================
load      LOAD                         the user's dataloader (parsing, feature building) is not thread-safe
host      COPY2DEVICE, SPLIT           host compute per batch: permute and bucketize the IDs
a2a       FIRST_ALL2ALL                the only lane issuing collectives, so it issues them in batch order
post      SECOND_ALL2ALL, POST_INPUT   waits for the IDs, then prefetch (ID mapping, swap planning) in order
========  ===========================  ===================================================================

While the caller's thread computes batch ``k``, the lanes work on batches ``k + 1 .. k + depth - 1``. The stage
functions hold no reference to the pipeline object, so dropping the pipeline lets it be collected (and its threads
joined) even with batches in flight.

Example::

    lanes = build_lanes(pipelined_modules, device, streams, workers, PrefetchTrainPipelineContext)
"""

from __future__ import annotations

import dataclasses
from typing import Any, Iterator, List, Optional, Sequence, Type

import torch
from torchrec.distributed.train_pipeline.pipeline_context import PrefetchTrainPipelineContext

from torchrec_ascend.pipeline import input_dist
from torchrec_ascend.pipeline.lanes import Lane, ModuleWorkers
from torchrec_ascend.pipeline.stages import Stage
from torchrec_ascend.pipeline.streams import PipelineStreams


@dataclasses.dataclass
class Source:
    """The dataloader iterator and whether it has run out (written by the load lane only).

    Example::

        source = Source(iter(batches))
    """

    iterator: Iterator[Any]
    exhausted: bool = False


@dataclasses.dataclass
class BatchInFlight:
    """A batch between stages: the batch, its TorchRec pipeline context, and the event its last stage recorded."""

    batch: Any
    context: PrefetchTrainPipelineContext
    ready: Optional[Any] = None


def load(source: Source, index: int, context_type: Type[PrefetchTrainPipelineContext]) -> Optional[BatchInFlight]:
    """LOAD: the next batch, or None once the iterator is exhausted (never calling ``next`` on it again).

    Like TorchRec's pipelines, a dataloader yielding ``None`` ends the data.
    """
    if source.exhausted:
        return None
    batch = next(source.iterator, None)
    if batch is None:
        source.exhausted = True
        return None
    return BatchInFlight(batch=batch, context=context_type(index=index, version=1))


def copy_to_device(item: BatchInFlight, device: torch.device, streams: PipelineStreams) -> BatchInFlight:
    """COPY2DEVICE: ``batch.to(device)`` on the memcpy stream."""
    with streams.use(streams.memcpy):
        item.batch = item.batch.to(device, non_blocking=True)
    item.ready = streams.mark(streams.memcpy)
    return item


def build_lanes(
    modules: Sequence[torch.nn.Module],
    device: torch.device,
    streams: PipelineStreams,
    workers: ModuleWorkers,
    context_type: Type[PrefetchTrainPipelineContext],
) -> List[Lane]:
    """The four lanes for the pipelined ``modules``, upstream first (the load lane receives the :class:`Source`)."""
    modules = list(modules)

    def load_step(index: int, source: Source) -> Optional[BatchInFlight]:
        return load(source, index, context_type)

    def copy_step(index: int, item: BatchInFlight) -> BatchInFlight:
        return copy_to_device(item, device, streams)

    def split_step(index: int, item: BatchInFlight) -> BatchInFlight:
        with streams.use(streams.data_dist):
            streams.wait(item.ready, item.batch)
            input_dist.split(modules, item.batch, item.context, workers)
        return item

    def first_all_to_all_step(index: int, item: BatchInFlight) -> BatchInFlight:
        with streams.use(streams.data_dist):
            input_dist.launch_splits(item.context)
            input_dist.wait_splits(item.context)
        item.ready = streams.mark(streams.data_dist)
        return item

    def second_all_to_all_step(index: int, item: BatchInFlight) -> BatchInFlight:
        with streams.use(streams.prefetch):
            streams.wait(item.ready)
            input_dist.wait_tensors(modules, item.context, workers)
        return item

    def post_input_step(index: int, item: BatchInFlight) -> BatchInFlight:
        with streams.use(streams.prefetch):
            # A cached table's prefetch evicts rows whose last updates (the optimizer's, a new row's initial
            # values) compute issued on its stream: read them after those, not beside them.
            streams.follow(streams.compute)
            input_dist.prefetch(modules, item.context, workers, forward_stream=streams.compute)
        item.ready = streams.mark(streams.prefetch)
        return item

    return [
        Lane("load", ((Stage.LOAD, load_step),)),
        Lane("host", ((Stage.COPY2DEVICE, copy_step), (Stage.SPLIT, split_step))),
        Lane("a2a", ((Stage.FIRST_ALL2ALL, first_all_to_all_step),)),
        Lane("post", ((Stage.SECOND_ALL2ALL, second_all_to_all_step), (Stage.POST_INPUT, post_input_step))),
    ]
