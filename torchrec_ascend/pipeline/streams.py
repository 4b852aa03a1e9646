"""The hybrid pipeline's device streams, made from the backend profile; on a device without streams (CPU) every
method is a no-op.

Roles, as in TorchRec's pipelines: ``memcpy`` (COPY2DEVICE), ``data_dist`` (SPLIT, FIRST_ALL2ALL), ``prefetch``
(SECOND_ALL2ALL, POST_INPUT); compute runs on the caller's current stream. Host lanes hand a batch over with an
event recorded at the end of a stage; the next stage makes its stream wait for that event (not for the whole
stream, which by then may hold later batches' work) and records the batch's tensors on its stream.

Example::

    streams = PipelineStreams(torch.device("cpu"))
    with streams.use(streams.memcpy):        # nullcontext on CPU
        batch = batch.to(device, non_blocking=True)
    ready = streams.mark(streams.memcpy)     # None on CPU
    streams.wait(ready, batch)
"""

from __future__ import annotations

import contextlib
from typing import Any, ContextManager, Optional

import torch

from torchrec_ascend import backends
from torchrec_ascend.hooks.pipeline_streams import device_module


class PipelineStreams:
    """Streams for the pipeline's roles on ``device``, from ``backends.profile_for(device.type).streams``.

    Args:
        device (torch.device): the training device.

    Attributes:
        memcpy, data_dist, prefetch (Optional[torch.Stream]): None where the device has no streams.
        compute (Optional[torch.Stream]): the constructing thread's current stream (where compute runs).
    """

    def __init__(self, device: torch.device) -> None:
        profile = backends.profile_for(device.type)
        spec = profile.streams if profile is not None else None
        self._module: Any = device_module(profile) if profile is not None and spec is not None else None
        self.memcpy = self._make("memcpy", spec)
        self.data_dist = self._make("data_dist", spec)
        self.prefetch = self._make("prefetch", spec)
        self.compute: Optional[torch.Stream] = self._module.current_stream() if self._module is not None else None

    def _make(self, role: str, spec: Any) -> Optional[torch.Stream]:
        if self._module is None:
            return None
        return self._module.Stream(priority=spec.priorities.get(role, 0))

    def use(self, stream: Optional[torch.Stream]) -> ContextManager[Any]:
        """Make ``stream`` current on this thread (nothing without streams)."""
        return contextlib.nullcontext() if stream is None else self._module.stream(stream)

    def mark(self, stream: Optional[torch.Stream]) -> Optional[Any]:
        """An event recorded on ``stream`` now: the hand-over point to the next stage (None without streams)."""
        if stream is None:
            return None
        event = self._module.Event()
        event.record(stream)
        return event

    def follow(self, stream: Optional[torch.Stream]) -> None:
        """Make this thread's current stream wait for all work issued on ``stream`` so far (nothing without streams)."""
        if stream is not None:
            self._module.current_stream().wait_stream(stream)

    def wait(self, event: Optional[Any], tensors: Optional[Any] = None) -> None:
        """Make this thread's current stream wait for ``event``; record ``tensors`` (a Pipelineable) on it."""
        if event is None:
            return
        current = self._module.current_stream()
        current.wait_event(event)
        if tensors is not None:
            tensors.record_stream(current)
