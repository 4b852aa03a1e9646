"""The ``torch.npu`` module of the emulated NPU (registered by :func:`torchrec_ascend.testing.emulated_npu.install`).

It has the shape of torch_npu's ``torch.npu`` for what TorchRec and torchrec-ascend call: devices, streams with a
current stream per thread and device, events, synchronisation and memory statistics. Work on the emulator runs
synchronously on the host; streams, events and waits feed the stream-order check (see
:mod:`torchrec_ascend.testing.emulated_npu`), which fails where hardware could run two streams' work out of order.
Random ops on npu tensors draw from the CPU generator (``torch.manual_seed`` seeds it), so seeding here is a no-op.

Example::

    from torchrec_ascend.testing import emulated_npu
    emulated_npu.install()
    s = torch.npu.Stream(priority=-1)
    with torch.npu.stream(s):
        assert torch.npu.current_stream() == s
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator, List, Optional, Tuple, Union

import torch

DeviceLike = Union[int, str, torch.device, None]
_NAME = "npu"


def _ext() -> Any:
    from torchrec_ascend.testing import _emulator

    return _emulator


def _index(device: DeviceLike) -> int:
    if device is None:
        return current_device()
    if isinstance(device, int):
        return device
    device = torch.device(device)
    if device.type != _NAME:
        raise ValueError(f"expected an npu device, got {device}")
    return current_device() if device.index is None else device.index


def is_available() -> bool:
    """True: the emulated device is present once installed."""
    return True


def is_initialized() -> bool:
    """True: the emulator needs no lazy initialisation."""
    return True


def init() -> None:
    """Nothing to initialise (kept for torch_npu compatibility)."""


def _is_in_bad_fork() -> bool:
    return False


def device_count() -> int:
    """Number of emulated devices in this process (``install(device_count=...)``, default 8)."""
    return int(_ext().device_count())


def current_device() -> int:
    """This thread's current device index."""
    return int(_ext().current_device())


def set_device(device: DeviceLike) -> None:
    """Make ``device`` this thread's current device."""
    _ext().set_device(_index(device))


def get_device_name(device: DeviceLike = None) -> str:
    """A name that says what it is: ``"emulated npu (torchrec_ascend.testing)"``."""
    _ext().check_index(_index(device))
    return "emulated npu (torchrec_ascend.testing)"


def synchronize(device: DeviceLike = None) -> None:
    """Wait for the device (returns at once; counted as a host sync; orders every stream's work before later work)."""
    _ext().synchronize(_index(device))


class device:  # lowercase, as torch names it (torch.cuda.device)
    """Context manager that makes ``device`` the current device and restores the previous one."""

    def __init__(self, device: DeviceLike) -> None:
        self._index = _index(device)
        self._previous = -1

    def __enter__(self) -> None:
        self._previous = current_device()
        set_device(self._index)

    def __exit__(self, *exc: Any) -> None:
        set_device(self._previous)


class Stream(torch.Stream):
    """An emulated npu stream (a ``torch.Stream`` of device type npu).

    Args:
        device: the device (default: the current one).
        priority: lower is more urgent, as on torch_npu; kept for ``priority`` only.
    """

    def __new__(cls, device: DeviceLike = None, priority: int = 0, **kwargs: Any) -> "Stream":
        if kwargs:  # stream_id / device_index / device_type: wrap an existing stream
            return super().__new__(cls, **kwargs)
        return super().__new__(cls, device=torch.device(_NAME, _index(device)), priority=priority)

    @property
    def priority(self) -> int:
        return int(_ext().stream_priority(self.stream_id))

    def __repr__(self) -> str:
        return f"<emulated npu Stream device=npu:{self.device_index} id={self.stream_id} priority={self.priority}>"


_DEVICE_TYPE_CODE = 20  # c10::DeviceType::PrivateUse1, the type code torch.Stream takes


def _wrap(stream_id: int, index: int) -> Stream:
    return Stream(stream_id=stream_id, device_index=index, device_type=_DEVICE_TYPE_CODE)


def current_stream(device: DeviceLike = None) -> Stream:
    """This thread's current stream on ``device``."""
    index = _index(device)
    return _wrap(int(_ext().current_stream_id(index)), index)


def default_stream(device: DeviceLike = None) -> Stream:
    """The default stream (id 0) of ``device``."""
    return _wrap(0, _index(device))


def set_stream(stream: torch.Stream) -> None:
    """Make ``stream`` this thread's current stream on its device."""
    _ext().set_current_stream_id(stream.device_index, stream.stream_id)


@contextlib.contextmanager
def stream(stream: Optional[torch.Stream]) -> Iterator[None]:
    """Context manager: ``stream`` is this thread's current stream on its device inside (None: no change)."""
    if stream is None:
        yield
        return
    previous = _ext().set_current_stream_id(stream.device_index, stream.stream_id)
    try:
        yield
    finally:
        _ext().set_current_stream_id(stream.device_index, previous)


def Event(enable_timing: bool = False, blocking: bool = False, interprocess: bool = False) -> torch.Event:
    """An event of the current emulated device (``record``, ``wait``, ``query``, ``synchronize``, ``elapsed_time`` in
    host milliseconds). A ``torch.Event``: torch's event methods accept no subclass."""
    return torch.Event(device=torch.device(_NAME, current_device()), enable_timing=enable_timing, blocking=blocking,
                       interprocess=interprocess)


def memory_allocated(device: DeviceLike = None) -> int:
    """Bytes of emulated device memory held by live tensors on ``device``."""
    return int(_ext().memory_allocated(_index(device)))


def max_memory_allocated(device: DeviceLike = None) -> int:
    """Peak of :func:`memory_allocated` since the start or the last :func:`reset_peak_memory_stats`."""
    return int(_ext().max_memory_allocated(_index(device)))


def reset_peak_memory_stats(device: DeviceLike = None) -> None:
    """Start the peak of :func:`max_memory_allocated` again from the current usage."""
    _ext().reset_peak_memory(_index(device))


def mem_get_info(device: DeviceLike = None) -> Tuple[int, int]:
    """``(free, total)`` bytes of ``device``, as torch_npu answers (total: the emulator's capacity; 0 unbounded).

    Example::

        free, total = torch.npu.mem_get_info()
    """
    total = int(_ext().memory_capacity())
    return max(total - memory_allocated(device), 0), total


def empty_cache() -> None:
    """Nothing is cached: freed device memory returns to the host at once."""


def manual_seed(seed: int) -> None:
    """No-op: random ops on the emulator use the CPU generator (seed it with ``torch.manual_seed``)."""


def manual_seed_all(seed: int) -> None:
    """No-op, as :func:`manual_seed`."""


def get_amp_supported_dtype() -> List[torch.dtype]:
    """Dtypes autocast may use on the device."""
    return [torch.float16, torch.bfloat16]
