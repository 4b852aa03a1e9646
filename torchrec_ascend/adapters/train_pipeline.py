"""Adapter for TorchRec's sparse-dist train pipeline: its private state, its model rewrite, and the pipelined input
dists (``KJTAllToAllForward``) with their process groups.

:class:`SparseDistPipeline` is ``TrainPipelineSparseDist`` with every private field a subclass needs behind a named,
public accessor; :func:`fuse_input_dist_splits` and :func:`input_dist_forwards` reach the input dists that
``_override_input_dist_forwards`` installs. No other module touches these names (see :data:`ADAPTER`).

Example::

    class MyPipeline(SparseDistPipeline, pipelined_forward=PrefetchPipelinedForward):
        def rewrite_model(self, batch, context, pipelined_forward):
            self.stock_rewrite(batch, context, pipelined_forward)
            for forward in input_dist_forwards(self.pipelined_modules):
                set_group(forward, mirror_of(group_of(forward)))
"""

from __future__ import annotations

from typing import Any, Callable, List, Optional, Sequence

import torch
from torchrec.distributed.train_pipeline import utils as _pipeline_utils
from torchrec.distributed.train_pipeline.runtime_forwards import KJTAllToAllForward
from torchrec.distributed.train_pipeline.train_pipelines import TrainPipelineSparseDist

from torchrec_ascend.adapters import Adapter
from torchrec_ascend.versions import TORCHREC

_PIPELINE = "torchrec.distributed.train_pipeline.train_pipelines:TrainPipelineSparseDist"
_FIELDS = (
    "_model", "_model_attached", "_pipelined_modules", "_original_forwards", "_original_kjt_dist_forwards",
    "_next_index", "_context_type", "_pipelined_forward_type", "_device", "_optimizer", "_execute_all_batches",
    "_model_fwd", "_dmp_collection_sync_interval_batches", "_state", "_memcpy_stream", "_data_dist_stream",
    "_set_module_context", "_pipeline_model",
)

ADAPTER = Adapter(
    name="a.train_pipeline",
    target=_PIPELINE,
    privates=(
        *(f"{_PIPELINE}.{field}" for field in _FIELDS),
        "torchrec.distributed.train_pipeline.utils:_fuse_input_dist_splits",
        "torchrec.distributed.train_pipeline.runtime_forwards:KJTAllToAllForward._pg",
        "torchrec.distributed.embeddingbag:ShardedEmbeddingBagCollection._input_dists",
        "torchrec.distributed.embedding:ShardedEmbeddingCollection._input_dists",
        "torchrec.distributed.sharding.rw_sharding:RwSparseFeaturesDist._dist",
    ),
    requires=TORCHREC,
    reason="the hybrid pipeline reuses TrainPipelineSparseDist's model rewrite and state, and moves the pipelined "
    "input dists onto process groups of their own",
)


class SparseDistPipeline(TrainPipelineSparseDist):
    """``TrainPipelineSparseDist`` with named accessors for the private fields a subclass drives.

    Subclass it with ``pipelined_forward=`` (the forward class TorchRec's rewrite installs) and override
    :meth:`rewrite_model` instead of the private ``_pipeline_model``; call :meth:`stock_rewrite` for TorchRec's own.
    """

    def __init_subclass__(cls, pipelined_forward: Optional[type] = None, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if pipelined_forward is not None:
            cls._pipelined_forward_type = pipelined_forward

    # --- the model and its rewrite ---
    @property
    def model(self) -> torch.nn.Module:
        """The model the pipeline trains (rewritten while attached)."""
        return self._model

    @model.setter
    def model(self, model: torch.nn.Module) -> None:
        self._model = model

    @property
    def model_attached(self) -> bool:
        """False after ``detach()`` until the model is attached again."""
        return self._model_attached

    @model_attached.setter
    def model_attached(self, attached: bool) -> None:
        self._model_attached = attached

    @property
    def pipelined_modules(self) -> List[torch.nn.Module]:
        """The sharded modules TorchRec's rewrite pipelined (empty until the model is rewritten)."""
        return self._pipelined_modules

    @pipelined_modules.setter
    def pipelined_modules(self, modules: List[torch.nn.Module]) -> None:
        self._pipelined_modules = modules

    @property
    def original_forwards(self) -> List[Callable[..., Any]]:
        """The pipelined modules' forwards before the rewrite, in their order."""
        return self._original_forwards

    @property
    def rewrite_finished(self) -> bool:
        """True once TorchRec's rewrite overrode the input dists' forwards (``detach()`` then undoes it)."""
        return bool(self._original_kjt_dist_forwards)

    def forget_rewrite(self) -> None:
        """Mark the input-dist override as not done (before a new rewrite, which sets it again)."""
        self._original_kjt_dist_forwards: List[Any] = []

    def _pipeline_model(self, batch: Any, context: Any, pipelined_forward: Any = None) -> None:
        # TorchRec's entry point for the rewrite (also called by its own attach paths): routed to rewrite_model.
        self.rewrite_model(batch, context, pipelined_forward or self.pipelined_forward_type)

    def rewrite_model(self, batch: Any, context: Any, pipelined_forward: Any) -> None:
        """Rewrite the model for pipelining (and start ``batch``'s input dist); TorchRec's by default."""
        self.stock_rewrite(batch, context, pipelined_forward)

    def stock_rewrite(self, batch: Any, context: Any, pipelined_forward: Any) -> None:
        """TorchRec's own rewrite (``TrainPipelineSparseDist._pipeline_model``)."""
        TrainPipelineSparseDist._pipeline_model(self, batch, context, pipelined_forward)

    # --- what TorchRec's constructor stored ---
    @property
    def pipelined_forward_type(self) -> type:
        """The forward class TorchRec's rewrite installs on the pipelined modules."""
        return self._pipelined_forward_type

    @property
    def context_type(self) -> type:
        """The pipeline context class (``context_type`` of the constructor)."""
        return self._context_type

    @property
    def training_device(self) -> torch.device:
        """The ``device`` of the constructor."""
        return self._device

    @property
    def dense_optimizer(self) -> torch.optim.Optimizer:
        """The ``optimizer`` of the constructor."""
        return self._optimizer

    @property
    def execute_all_batches(self) -> bool:
        """The ``execute_all_batches`` of the constructor."""
        return self._execute_all_batches

    @property
    def model_fwd(self) -> Callable[[Any], Any]:
        """The forward called on a batch (``custom_model_fwd``, else the model)."""
        return self._model_fwd

    @property
    def sync_interval_batches(self) -> Optional[int]:
        """TorchRec's DMP-collection sync interval (passed to ``sync_embeddings``)."""
        return self._dmp_collection_sync_interval_batches

    @property
    def next_index(self) -> int:
        """The index the next batch's context gets."""
        return self._next_index

    @next_index.setter
    def next_index(self, index: int) -> None:
        self._next_index = index

    def set_state(self, state: Any) -> None:
        """Record the ``PipelineState`` (TorchRec's profilers read it)."""
        self._state = state

    def set_module_context(self, context: Any) -> None:
        """Hand ``context`` to the pipelined forwards (TorchRec's ``_set_module_context``)."""
        self._set_module_context(context)

    def set_streams(self, memcpy: Optional[torch.Stream], data_dist: Optional[torch.Stream]) -> None:
        """Replace the memcpy and data-dist streams TorchRec's constructor chose."""
        self._memcpy_stream, self._data_dist_stream = memcpy, data_dist


def fuse_input_dist_splits(context: Any) -> None:
    """Issue the fused splits all-to-all of ``context``'s input dists (TorchRec's ``_fuse_input_dist_splits``)."""
    _pipeline_utils._fuse_input_dist_splits(context)


def input_dist_forwards(modules: Sequence[torch.nn.Module]) -> List[KJTAllToAllForward]:
    """The ``KJTAllToAllForward`` objects the rewrite put on the input dists of ``modules`` and their children."""
    found = []
    for module in modules:
        for child in module.modules():
            for input_dist in getattr(child, "_input_dists", None) or []:
                forward = getattr(getattr(input_dist, "_dist", None), "forward", None)
                if isinstance(forward, KJTAllToAllForward):
                    found.append(forward)
    return found


def group_of(forward: KJTAllToAllForward) -> Any:
    """The process group ``forward`` issues its all-to-alls on (None if it has none)."""
    return forward._pg


def set_group(forward: KJTAllToAllForward, group: Any) -> None:
    """Make ``forward`` issue its all-to-alls on ``group``."""
    forward._pg = group
