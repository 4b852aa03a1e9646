"""H4: streams for the stock train pipelines on devices TorchRec does not know, and ``record_stream`` after comms.

TorchRec's pipelines create their memcpy / data-dist / prefetch streams only for cuda and mtia; on any other device
they silently run without overlap. After each pipeline's ``__init__`` we fill the stream attributes it left empty
from the device profile's stream factory (roles and priorities declared there). CPU has no streams: nothing changes.
"""

from __future__ import annotations

import importlib
from typing import Any, Callable, Optional

from torchrec_ascend import backends
from torchrec_ascend.backends.profile import DeviceProfile
from torchrec_ascend.hooks.versions import TORCHREC_1_8
from torchrec_ascend.injection.patch import Patch

_PIPELINES = "torchrec.distributed.train_pipeline.train_pipelines"
_STREAM_ROLES = {
    "_memcpy_stream": "memcpy",
    "_data_dist_stream": "data_dist",
    "_prefetch_stream": "prefetch",
    "_emb_lookup_stream": "emb_lookup",
}


def streamed_profile(device: Any) -> Optional[DeviceProfile]:
    """The profile of ``device`` if it has streams that TorchRec does not manage itself."""
    profile = backends.profile_for(getattr(device, "type", str(device)))
    if profile is None or profile.streams is None or profile.streams.managed_by_torchrec:
        return None
    return profile


def device_module(profile: DeviceProfile) -> Any:
    assert profile.streams is not None
    module_name, _, attr = profile.streams.device_module.rpartition(".")
    return getattr(importlib.import_module(module_name), attr)


def fill_streams(pipeline: Any) -> None:
    """Give ``pipeline`` the streams its device supports (no-op for cpu, cuda and mtia)."""
    profile = streamed_profile(getattr(pipeline, "_device", None))
    if profile is None:
        return
    assert profile.streams is not None
    module = device_module(profile)
    for attr, role in _STREAM_ROLES.items():
        if hasattr(pipeline, attr) and getattr(pipeline, attr) is None:
            setattr(pipeline, attr, module.Stream(priority=profile.streams.priorities.get(role, 0)))
    if hasattr(pipeline, "_default_stream") and pipeline._default_stream is None:
        pipeline._default_stream = module.current_stream()
    pipeline._stream_context = module.stream


def _after_init(original: Callable[..., None]) -> Callable[..., None]:
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        fill_streams(self)

    return __init__


def _wait_impl(original: Callable[..., Any]) -> Callable[..., Any]:
    def _wait_impl(self: Any) -> Any:
        ret = original(self)
        import torch

        if isinstance(ret, torch.Tensor):
            profile = streamed_profile(ret.device)
            if profile is not None:
                ret.record_stream(device_module(profile).current_stream())
        return ret

    return _wait_impl


def _pipeline_patch(cls: str) -> Patch:
    return Patch.wrap(
        name=f"h4.streams_{cls}",
        target=f"{_PIPELINES}:{cls}.__init__",
        requires=TORCHREC_1_8,
        reason=f"{cls} creates streams only for cuda/mtia; fill them from the device profile",
        wrapper=_after_init,
    )


PATCHES = [
    _pipeline_patch("TrainPipelineBase"),
    _pipeline_patch("TrainPipelineSparseDist"),
    _pipeline_patch("TrainPipelineFusedSparseDist"),
    _pipeline_patch("PrefetchTrainPipelineSparseDist"),
    Patch.wrap(
        name="h4.comm_record_stream",
        target="torchrec.distributed.comm_ops:Request._wait_impl",
        requires=TORCHREC_1_8,
        reason="collective outputs are recorded on the consumer stream only for cuda",
        wrapper=_wait_impl,
    ),
]
