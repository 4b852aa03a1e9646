"""HostLanes against a plain sequential model: order, end of data, deterministic failure cut, threads joined.

The oracle is what a single thread running every lane's steps batch by batch would produce; the invariants are the
ones the pipeline's collectives rely on: each lane sees batches in submission order, and which batches a lane runs
after a failure depends only on where the failure happened, never on thread timing.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Dict, List, Optional, Tuple

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from torchrec_ascend.pipeline.lanes import HostLanes, Lane, ModuleWorkers, StageClock, thread_prefix
from torchrec_ascend.pipeline.stages import PipelineStageError, Stage

STAGES = [Stage.LOAD, Stage.SPLIT, Stage.FIRST_ALL2ALL, Stage.POST_INPUT]  # one per lane


class Recorder:
    """Steps that add a lane-specific number, sleep a little (to shake the timing), log the batches they ran."""

    def __init__(self, sleeps: List[float], fail: Optional[Tuple[int, int]], end_at: Optional[int]) -> None:
        self.sleeps, self.fail, self.end_at = sleeps, fail, end_at
        self.ran: Dict[int, List[int]] = {lane: [] for lane in range(len(STAGES))}
        self.lock = threading.Lock()

    def step(self, lane: int) -> Any:
        def run(index: int, item: Any) -> Any:
            with self.lock:
                self.ran[lane].append(index)
            time.sleep(self.sleeps[(index + lane) % len(self.sleeps)])
            if self.fail == (lane, index):
                raise ValueError(f"lane {lane} broke on batch {index}")
            if lane == 0 and self.end_at is not None and index >= self.end_at:
                return None
            return item + 10**lane

        return run


def make_lanes(recorder: Recorder, prefix: str) -> HostLanes:
    lanes = [Lane(f"l{lane}", ((stage, recorder.step(lane)),)) for lane, stage in enumerate(STAGES)]
    return HostLanes(lanes, StageClock(), prefix)


def alive(prefix: str) -> int:
    return sum(t.name.startswith(prefix) for t in threading.enumerate())


@settings(deadline=None, max_examples=25)
@given(
    n=st.integers(1, 10),
    sleeps=st.lists(st.sampled_from([0.0, 0.0005, 0.002]), min_size=1, max_size=5),
    fail=st.none() | st.tuples(st.integers(0, len(STAGES) - 1), st.integers(0, 9)),
    end_at=st.none() | st.integers(0, 9),
)
def test_lanes_match_sequential_model(
    n: int, sleeps: List[float], fail: Optional[Tuple[int, int]], end_at: Optional[int]
) -> None:
    recorder = Recorder(sleeps, fail, end_at)
    prefix = thread_prefix()
    lanes = make_lanes(recorder, prefix)
    finals = [lanes.submit(index, 1000 * index)[-1] for index in range(n)]
    lanes.shutdown()
    assert alive(prefix) == 0

    ended = min(n, end_at if end_at is not None else n)  # batches from `ended` on carry "end of data" (None)
    # A failure happens only if its step runs: lane 0 runs every batch, later lanes only batches before the end.
    failed = fail is not None and fail[1] < (n if fail[0] == 0 else ended)
    for index, future in enumerate(finals):
        if failed and index >= fail[1]:
            with pytest.raises(PipelineStageError) as info:
                future.result()
            if index == fail[1]:
                assert (info.value.stage, info.value.batch_index) == (STAGES[fail[0]], fail[1])
                assert isinstance(info.value.__cause__, ValueError)
        elif index >= ended:
            assert future.result() is None
        else:
            assert future.result() == 1000 * index + sum(10**lane for lane in range(len(STAGES)))

    for lane, ran in recorder.ran.items():
        # What each lane ran depends only on where the data ended and what failed, never on thread timing.
        expected = n if lane == 0 else ended
        if failed:
            failed_lane, failed_at = fail
            if lane == failed_lane:
                expected = failed_at + 1
            elif lane > failed_lane:
                expected = min(failed_at, ended)
        assert ran == list(range(expected)), f"lane {lane} ran {ran}, expected batches 0..{expected - 1}"


def test_skipped_batches_name_the_failed_one() -> None:
    recorder = Recorder([0.0], fail=(1, 2), end_at=None)
    lanes = make_lanes(recorder, thread_prefix())
    futures = [lanes.submit(index, 0) for index in range(5)]
    lanes.shutdown()
    with pytest.raises(PipelineStageError, match="skipped: batch 2 failed before it"):
        futures[4][1].result()


def test_stage_clock_adds_per_stage() -> None:
    recorder = Recorder([0.002], fail=None, end_at=None)
    clock = StageClock()
    lanes = HostLanes([Lane("l0", ((Stage.LOAD, recorder.step(0)), (Stage.SPLIT, recorder.step(1))))], clock)
    for index in range(3):
        lanes.submit(index, 0)
    lanes.shutdown()
    seconds = clock.seconds()
    assert set(seconds) == {"LOAD", "SPLIT"}
    assert all(value >= 3 * 0.002 * 0.9 for value in seconds.values())


def test_module_workers_keep_the_modules_order() -> None:
    prefix = thread_prefix()
    workers = ModuleWorkers(3, prefix)
    # Later items finish first: the result order must still follow the input order.
    assert workers.map(lambda i: (time.sleep(0.002 * (4 - i)), i)[1], [0, 1, 2, 3]) == [0, 1, 2, 3]
    workers.shutdown()
    assert alive(prefix) == 0
