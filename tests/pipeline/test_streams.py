"""PipelineStreams: nothing on CPU; on a device with streams (a fake device module here), one stream per role with the
profile's priorities, and event hand-over between stages."""

from __future__ import annotations

import contextlib
import sys
import types
from typing import Any, Iterator, List, Optional

import pytest
import torch

from torchrec_ascend.backends.profile import StreamSpec
from torchrec_ascend.pipeline import host_stages, streams
from torchrec_ascend.pipeline.streams import PipelineStreams


class FakeStream:
    def __init__(self, priority: int = 0) -> None:
        self.priority = priority
        self.waited: List[Any] = []

    def wait_event(self, event: Any) -> None:
        self.waited.append(event)


class FakeEvent:
    def __init__(self) -> None:
        self.stream: Optional[FakeStream] = None

    def record(self, stream: FakeStream) -> None:
        self.stream = stream


class FakeDevice:
    """The parts of ``torch.npu`` the pipeline uses."""

    Stream, Event = FakeStream, FakeEvent

    def __init__(self) -> None:
        self.default = FakeStream()
        self.current = self.default

    def current_stream(self) -> FakeStream:
        return self.current

    @contextlib.contextmanager
    def stream(self, stream: FakeStream) -> Iterator[None]:
        previous, self.current = self.current, stream
        try:
            yield
        finally:
            self.current = previous


class Batch:
    def __init__(self) -> None:
        self.recorded: List[Any] = []
        self.copied_on: Optional[FakeStream] = None

    def to(self, device: torch.device, non_blocking: bool = False) -> "Batch":
        self.copied_on = FAKE.current
        return self

    def record_stream(self, stream: Any) -> None:
        self.recorded.append(stream)


FAKE = FakeDevice()


@pytest.fixture
def fake_device(monkeypatch: pytest.MonkeyPatch) -> FakeDevice:
    monkeypatch.setitem(sys.modules, "fake_torch", types.SimpleNamespace(fake=FAKE))
    spec = StreamSpec(device_module="fake_torch.fake", priorities={"memcpy": 0, "data_dist": -1, "prefetch": 1})
    monkeypatch.setattr(streams.backends, "profile_for", lambda device_type: types.SimpleNamespace(streams=spec))
    return FAKE


def test_cpu_has_no_streams() -> None:
    cpu = PipelineStreams(torch.device("cpu"))
    assert (cpu.memcpy, cpu.data_dist, cpu.prefetch, cpu.compute) == (None, None, None, None)
    with cpu.use(cpu.memcpy):
        pass
    assert cpu.mark(cpu.memcpy) is None
    cpu.wait(None, Batch())


def test_roles_get_streams_with_profile_priorities(fake_device: FakeDevice) -> None:
    made = PipelineStreams(torch.device("cpu"))
    assert [s.priority for s in (made.memcpy, made.data_dist, made.prefetch)] == [0, -1, 1]
    assert made.compute is fake_device.default


def test_stages_hand_over_with_events(fake_device: FakeDevice) -> None:
    made = PipelineStreams(torch.device("cpu"))
    item = host_stages.BatchInFlight(batch=Batch(), context=None)  # type: ignore[arg-type]  # the copy stage reads no context
    host_stages.copy_to_device(item, torch.device("cpu"), made)
    assert item.batch.copied_on is made.memcpy, "the copy runs on the memcpy stream"
    assert item.ready.stream is made.memcpy, "the hand-over event is recorded on the memcpy stream"
    with made.use(made.data_dist):
        made.wait(item.ready, item.batch)
    assert made.data_dist.waited == [item.ready], "the next stage waits for the event, not the whole stream"
    assert item.batch.recorded == [made.data_dist], "the batch is recorded on the consuming stream"
    assert fake_device.current is fake_device.default, "use() restores the thread's stream"
