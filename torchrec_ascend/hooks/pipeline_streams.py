"""H4: streams for the stock train pipelines on devices TorchRec does not know, and ``record_stream`` after comms.

TorchRec's pipelines create their memcpy / data-dist / prefetch / lookup streams only for cuda and mtia; on any
other device they silently run without overlap (``_stream_context`` falls back to ``torch.cuda.stream``). After
each pipeline's ``__init__`` we fill the stream attributes it left empty from the device profile's stream factory
(roles and priorities declared there) and use the device module's ``stream`` context. CPU has no streams and cuda's
are TorchRec's own: nothing changes for them.

Covered, by patching ``__init__`` of:

* ``TrainPipelineBase``, ``TrainPipelineSparseDist`` and through it its subclasses that add no stream
  (``TrainPipelineSemiSync``, ``EvalPipelineSparseDist``, ``TrainPipelineSparseDistLite``, which drops its
  data-dist stream on purpose after ours is set, and ``TrainPipelineSparseDistCompAutograd``);
* ``TrainPipelineFusedSparseDist`` (``emb_lookup_stream="new"``) and ``PrefetchTrainPipelineSparseDist``, which
  add streams after their parent's ``__init__``;
* ``StagedTrainPipeline`` (its ``_stream_context``; the stage streams are the caller's) and
  ``SparseDataDistUtil``, the stage helper that creates a default stream.

Without streams (the CPU), ``PrefetchTrainPipelineSparseDist``'s prefetch step returns at once (``prefetch_embeddings``
tests the data-dist stream), so its first ``progress()`` fails in ``PrefetchPipelinedForward``; the patched
``prefetch_embeddings`` does the same steps in program order there (wait for the input dist, ``prefetch``, hand the
batch to the forward). ``TrainPipelineSemiSync`` is refused (a ``ConfigError`` naming the alternatives) where
TorchRec does not manage the streams: its lookup calls ``torch.cuda.current_stream()`` unconditionally.

Not covered: ``DataLoadingThread`` sets the thread's current device only for cuda/mtia (one device per process is
assumed on other devices); ``PipelinedPostproc`` records streams only for cuda/mtia tensors; the experimental
pipelines and the 2D (``DMPCollection``) kernels create ``torch.cuda`` streams unconditionally.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

from torchrec_ascend import backends
from torchrec_ascend.backends.profile import DeviceProfile
from torchrec_ascend.dotted import resolve_object
from torchrec_ascend.injection.patch import Patch
from torchrec_ascend.versions import TORCHREC

_PIPELINES = "torchrec.distributed.train_pipeline.train_pipelines"
_STAGES = "torchrec.distributed.train_pipeline.pipeline_stage"
_STREAM_ROLES = {
    "_memcpy_stream": "memcpy",
    "_data_dist_stream": "data_dist",
    "_prefetch_stream": "prefetch",
    "_emb_lookup_stream": "emb_lookup",
}


def streamed_profile(device: Any) -> Optional[DeviceProfile]:
    """The profile of ``device`` (a ``torch.device`` or type string) if it has streams TorchRec does not manage.

    Example::

        streamed_profile(torch.device("cpu"))   # None: no streams
        streamed_profile(torch.device("npu"))   # the npu profile
    """
    profile = backends.profile_for(getattr(device, "type", str(device)))
    if profile is None or profile.streams is None or profile.streams.managed_by_torchrec:
        return None
    return profile


def device_module(profile: DeviceProfile) -> Any:
    """The torch device module named by ``profile.streams.device_module`` (``torch.npu``), imported."""
    assert profile.streams is not None
    return resolve_object(profile.streams.device_module)


def fill_streams(pipeline: Any, device: Any = None) -> None:
    """Give ``pipeline`` the streams its device supports (no-op for cpu, cuda and mtia).

    Every stream attribute the pipeline has and left ``None`` gets ``Stream(priority=<its role's priority>)``,
    ``_default_stream`` (if ``None``) the current stream, and ``_stream_context`` the device module's ``stream``.

    Args:
        pipeline: a TorchRec train pipeline or pipeline stage helper.
        device: the pipeline's device (default: ``pipeline._device``).

    Example::

        pipeline = TrainPipelineSparseDist(model, optimizer, torch.device("npu"))   # filled by the patch
        fill_streams(pipeline)   # idempotent: attributes already set are kept
    """
    profile = streamed_profile(device if device is not None else getattr(pipeline, "_device", None))
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


def _staged_after_init(original: Callable[..., None]) -> Callable[..., None]:
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        fill_streams(self, self._compute_stream.device)

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


def prefetch_in_program_order(context: Any, pipelined_modules: Any) -> None:
    """``PrefetchTrainPipelineSparseDist``'s prefetch step without streams (the CPU): wait for each module's input
    dist, ``prefetch``, and hand the batch and its context to the forward, in program order."""
    for sharded_module in pipelined_modules:
        name = sharded_module.forward._name
        dist_input = context.input_dist_tensors_requests.pop(name).wait()
        sharded_module.prefetch(ctx=context.module_contexts[name], dist_input=dist_input, forward_stream=None)
        context.module_input_post_prefetch[name] = dist_input
        context.module_contexts_post_prefetch[name] = context.module_contexts.pop(name)


def _prefetch_without_streams(original: Callable[..., None]) -> Callable[..., None]:
    def prefetch_embeddings(
        context: Any, pipelined_modules: Any, device: Any, stream_context: Any, data_dist_stream: Any,
        forward_stream: Any,
    ) -> None:
        if data_dist_stream is not None:
            return original(context, pipelined_modules, device, stream_context, data_dist_stream, forward_stream)
        prefetch_in_program_order(context, pipelined_modules)

    return prefetch_embeddings


def _refuse_semi_sync(original: Callable[..., None]) -> Callable[..., None]:
    def __init__(self: Any, model: Any, optimizer: Any, device: Any, *args: Any, **kwargs: Any) -> None:
        profile = backends.profile_for(getattr(device, "type", str(device)))
        if profile is None or profile.streams is None or not profile.streams.managed_by_torchrec:
            from torchrec_ascend.errors import ConfigError

            raise ConfigError(
                f"TrainPipelineSemiSync is not supported on {device}: its semi-synchronous embedding lookup "
                "(EmbeddingPipelinedForward) runs on CUDA streams only. Use TrainPipelineSparseDist, "
                "PrefetchTrainPipelineSparseDist or torchrec_ascend.HybridTrainPipelineSparseDist."
            )
        original(self, model, optimizer, device, *args, **kwargs)

    return __init__


def _init_patch(module: str, cls: str, wrapper: Callable[[Any], Any] = _after_init) -> Patch:
    return Patch.wrap(
        name=f"h4.streams_{cls}",
        target=f"{module}:{cls}.__init__",
        requires=TORCHREC,
        reason=f"{cls} creates streams only for cuda/mtia; fill them from the device profile",
        wrapper=wrapper,
    )


PATCHES = [
    _init_patch(_PIPELINES, "TrainPipelineBase"),
    _init_patch(_PIPELINES, "TrainPipelineSparseDist"),
    _init_patch(_PIPELINES, "TrainPipelineFusedSparseDist"),
    _init_patch(_PIPELINES, "PrefetchTrainPipelineSparseDist"),
    _init_patch(_PIPELINES, "StagedTrainPipeline", _staged_after_init),
    _init_patch(_STAGES, "SparseDataDistUtil"),
    Patch.wrap(
        name="h4.prefetch_without_streams",
        target=f"{_PIPELINES}:prefetch_embeddings",
        requires=TORCHREC,
        reason="PrefetchTrainPipelineSparseDist skips its prefetch step without a data-dist stream (CPU) and then "
        "fails in PrefetchPipelinedForward; run the step in program order there",
        wrapper=_prefetch_without_streams,
    ),
    Patch.wrap(
        name="h4.semi_sync_needs_torchrec_streams",
        target=f"{_PIPELINES}:TrainPipelineSemiSync.__init__",
        requires=TORCHREC,
        reason="TrainPipelineSemiSync's lookup calls torch.cuda.current_stream() unconditionally; refuse it with a "
        "clear error where TorchRec does not manage the streams",
        wrapper=_refuse_semi_sync,
    ),
    Patch.wrap(
        name="h4.comm_record_stream",
        target="torchrec.distributed.comm_ops:Request._wait_impl",
        requires=TORCHREC,
        reason="collective outputs are recorded on the consumer stream only for cuda",
        wrapper=_wait_impl,
    ),
]
