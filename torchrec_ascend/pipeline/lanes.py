"""Host lanes: the threads that move batches through the host stages, one batch at a time per lane, in order.

A lane is one thread running some consecutive stages (for example COPY2DEVICE then SPLIT). Every lane handles
batches strictly in the order they were submitted, so different lanes work on different batches at once (a
pipeline), while each stage sees batch ``k`` before batch ``k + 1``. That order is what makes threads safe here:

* a lane that issues collectives issues them in the same order on every rank;
* TorchRec's input-dist modules keep per-call state (``RwSparseFeaturesDist.unbucketize_permute_tensor``), so one
  module must not split two batches at once;
* cache prefetch (ID mapping, swap planning) must see batches in training order.

Failures cut deterministically: once a lane sees batch ``k`` fail (its own stage or an upstream one), it skips every
later batch instead of running it, so every rank stops issuing collectives at the same batch when a failure is
symmetric (a dataloader raising at batch ``k`` everywhere). Parallelism inside one stage (across a batch's sharded
modules) uses :class:`ModuleWorkers`.

Example::

    lanes = HostLanes([Lane("load", ((Stage.LOAD, load),)), Lane("host", ((Stage.SPLIT, split),))], StageClock())
    future = lanes.submit(0, source)[-1]
    batch = future.result()            # raises PipelineStageError(stage, 0, ...) if a stage raised
    lanes.shutdown()                   # finishes what was submitted, then joins the threads
"""

from __future__ import annotations

import dataclasses
import itertools
import threading
import time
from collections import defaultdict
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, TypeVar

import torch

from torchrec_ascend.pipeline.stages import PipelineStageError, Stage

StageFn = Callable[[int, Any], Any]
T = TypeVar("T")
R = TypeVar("R")

_instance_ids = itertools.count()


def thread_prefix() -> str:
    """A fresh thread-name prefix, ``hybrid-pipeline-<n>``: every thread of the pipeline starts with it."""
    return f"hybrid-pipeline-{next(_instance_ids)}"


@dataclasses.dataclass(frozen=True)
class Lane:
    """One host thread and the stages it runs for each batch, in order.

    Args:
        name (str): thread name suffix (``<prefix>-<name>_0`` in ``threading.enumerate()``).
        steps (Tuple[Tuple[Stage, StageFn], ...]): ``(stage, fn)`` pairs; ``fn(batch_index, item)`` returns the item
            handed to the next step. The first lane's first step receives what :meth:`HostLanes.submit` was given;
            a step returning ``None`` means "end of data" and later steps and lanes pass ``None`` on untouched.

    Example::

        Lane("post", ((Stage.SECOND_ALL2ALL, wait_tensors), (Stage.POST_INPUT, prefetch)))
    """

    name: str
    steps: Tuple[Tuple[Stage, StageFn], ...]


class StageClock:
    """Seconds spent in each stage, summed over batches; safe to update from several threads.

    Example::

        clock = StageClock()
        clock.add(Stage.SPLIT, 0.002)
        clock.seconds()["SPLIT"]   # 0.002
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._seconds: Dict[str, float] = defaultdict(float)

    def add(self, stage: Stage, seconds: float) -> None:
        with self._lock:
            self._seconds[stage.value] += seconds

    def seconds(self) -> Dict[str, float]:
        """A copy: stage name -> total seconds."""
        with self._lock:
            return dict(self._seconds)


class HostLanes:
    """The lanes' threads and the per-batch chain of futures through them.

    Args:
        lanes (Sequence[Lane]): the lanes, upstream first.
        clock (StageClock): where stage times are added.
        prefix (str): thread name prefix; a unique one is made when empty.

    Example::

        lanes = HostLanes([Lane("load", ((Stage.LOAD, lambda i, src: next(src, None)),))], StageClock())
        batch = lanes.submit(0, iter([1, 2]))[-1].result()   # 1
        lanes.shutdown()
    """

    def __init__(self, lanes: Sequence[Lane], clock: StageClock, prefix: str = "") -> None:
        self.prefix = prefix or thread_prefix()
        self._lanes = list(lanes)
        self._clock = clock
        self._failed_at: List[Optional[int]] = [None] * len(self._lanes)
        self._executors = [
            ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"{self.prefix}-{lane.name}") for lane in self._lanes
        ]

    def submit(self, index: int, item: Any) -> List[Future]:
        """Queue batch ``index`` on every lane; returns one future per lane (the last one is the finished batch).

        Batches must be submitted in increasing ``index`` order.
        """
        futures: List[Future] = []
        upstream: Optional[Future] = None
        for position, executor in enumerate(self._executors):
            upstream = executor.submit(self._run, position, index, upstream, item)
            futures.append(upstream)
        return futures

    def shutdown(self) -> None:
        """Let every submitted batch finish its lanes (or be skipped after a failure), then join the threads.

        Nothing submitted is cancelled: a lane that issues collectives must issue the same ones on every rank, and
        which queued batches a cancellation would catch depends on timing.
        """
        for executor in self._executors:
            executor.shutdown(wait=True)

    def _run(self, position: int, index: int, upstream: Optional[Future], item: Any) -> Any:
        lane = self._lanes[position]
        failed_at = self._failed_at[position]
        if failed_at is not None:
            raise PipelineStageError(
                lane.steps[0][0], index, RuntimeError(f"skipped: batch {failed_at} failed before it in this lane")
            )
        try:
            if upstream is not None:
                item = upstream.result()  # an upstream PipelineStageError propagates as it is
            for stage, fn in lane.steps:
                if item is None:
                    return None
                start = time.perf_counter()
                try:
                    item = fn(index, item)
                except Exception as err:
                    raise PipelineStageError(stage, index, err) from err
                finally:
                    self._clock.add(stage, time.perf_counter() - start)
            return item
        except BaseException:
            self._failed_at[position] = index
            raise


class ModuleWorkers:
    """Runs one step over a batch's sharded modules, on a thread pool when there are several modules.

    Results come back in the modules' order, so whatever is built from them (the fused splits all-to-all) is in
    the same order on every rank regardless of which thread finished first.

    Args:
        threads (int): pool size; 1 runs everything on the calling thread.
        prefix (str): thread name prefix.

    Example::

        workers = ModuleWorkers(2, "demo")
        workers.map(lambda m: m * 2, [1, 2, 3])   # [2, 4, 6]
        workers.shutdown()
    """

    def __init__(self, threads: int, prefix: str) -> None:
        self._pool = (
            ThreadPoolExecutor(max_workers=threads, thread_name_prefix=f"{prefix}-modules") if threads > 1 else None
        )

    def map(self, fn: Callable[[T], R], items: Sequence[T]) -> List[R]:
        if self._pool is None or len(items) < 2:
            return [fn(item) for item in items]
        # A pool thread's current stream is its own (the default stream, where compute runs): without this a
        # stage's device work left its stage's stream, unordered with it (found by the emulated npu's stream check).
        stream = torch.accelerator.current_stream() if torch.accelerator.is_available() else None
        if stream is None:
            return list(self._pool.map(fn, items))

        def on_callers_stream(item: T) -> R:
            with stream:
                return fn(item)

        return list(self._pool.map(on_callers_stream, items))

    def shutdown(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
