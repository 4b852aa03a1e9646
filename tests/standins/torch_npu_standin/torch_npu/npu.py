"""STAND-IN for ``torch.npu`` (``torch_npu.npu``), for tests only: streams and events that record, never run.

Only what torchrec-ascend's hooks and TorchRec's pipelines touch: ``Stream(priority=...)``, ``current_stream()``,
the ``stream(s)`` context manager, ``Event``, ``is_available()``, ``device_count()`` and device selection.
"""

from __future__ import annotations

import os
from typing import Any, Dict, List, Optional

import torch

_current_device = 0
_current: Dict[int, "Stream"] = {}


def _index(device: Any) -> int:
    if device is None:
        return _current_device
    if isinstance(device, int):
        return device
    index = torch.device(device).index
    return _current_device if index is None else index


class Stream:
    """A stream that remembers its device and priority and what it was asked to wait for."""

    def __init__(self, device: Any = None, priority: int = 0, **kwargs: Any) -> None:
        self.device = torch.device("npu", _index(device))
        self.priority = priority
        self.waited: List[Any] = []

    def wait_stream(self, stream: "Stream") -> None:
        self.waited.append(stream)

    def wait_event(self, event: "Event") -> None:
        self.waited.append(event)

    def record_event(self, event: Optional["Event"] = None) -> "Event":
        event = event or Event()
        event.record(self)
        return event

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        pass

    def __repr__(self) -> str:
        return f"<stand-in torch.npu.Stream device={self.device} priority={self.priority}>"


class Event:
    """An event that remembers the stream it was recorded on."""

    def __init__(self, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False) -> None:
        self.stream: Optional[Stream] = None

    def record(self, stream: Optional[Stream] = None) -> None:
        self.stream = stream or current_stream()

    def wait(self, stream: Optional[Stream] = None) -> None:
        (stream or current_stream()).wait_event(self)

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        pass


def current_stream(device: Any = None) -> Stream:
    index = _index(device)
    if index not in _current:
        _current[index] = Stream(device=index)
    return _current[index]


def default_stream(device: Any = None) -> Stream:
    return current_stream(device)


def set_stream(stream: Stream) -> None:
    _current[stream.device.index] = stream


class StreamContext:
    """``with torch.npu.stream(s):`` makes ``s`` current (``None`` is a no-op, as in torch.cuda)."""

    def __init__(self, stream: Optional[Stream]) -> None:
        self.stream = stream
        self._saved: Optional[Stream] = None

    def __enter__(self) -> Optional[Stream]:
        if self.stream is not None:
            self._saved = current_stream(self.stream.device)
            set_stream(self.stream)
        return self.stream

    def __exit__(self, *exc: object) -> None:
        if self._saved is not None:
            set_stream(self._saved)


def stream(stream: Optional[Stream]) -> StreamContext:
    return StreamContext(stream)


def is_available() -> bool:
    return True


def device_count() -> int:
    return int(os.environ.get("TORCH_NPU_STANDIN_DEVICES", "2"))


def current_device() -> int:
    return _current_device


def set_device(device: Any) -> None:
    global _current_device
    _current_device = _index(device)


def synchronize(device: Any = None) -> None:
    pass
