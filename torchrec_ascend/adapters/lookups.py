"""Adapter for TorchRec's sharded embedding modules: the lookups they hold and the kernels inside those lookups.

A sharded EmbeddingBagCollection or EmbeddingCollection keeps one lookup per sharding type in ``_lookups`` (a
data_parallel one wrapped in DistributedDataParallel) and each lookup keeps its kernels in ``_emb_modules``;
``named_modules()`` lists the table slices instead, so code that needs the kernels (metrics, checkpoints, pipelines
setting their depth) reads those two fields, here only.

Example::

    from torchrec_ascend.adapters.lookups import kernels_of
    [type(k).__name__ for k in kernels_of(dmp.module.sparse.ebc)]   # ['HashFusedEmbeddingBag']
"""

from __future__ import annotations

from typing import Any, Iterator, Tuple

import torch

from torchrec_ascend.adapters import Adapter
from torchrec_ascend.versions import TORCHREC

_LOOKUP = "torchrec.distributed.embedding_lookup"

ADAPTER = Adapter(
    name="a.lookups",
    target=f"{_LOOKUP}:GroupedPooledEmbeddingsLookup",
    privates=(
        "torchrec.distributed.embeddingbag:ShardedEmbeddingBagCollection._lookups",
        "torchrec.distributed.embedding:ShardedEmbeddingCollection._lookups",
        f"{_LOOKUP}:GroupedPooledEmbeddingsLookup._emb_modules",
        f"{_LOOKUP}:GroupedEmbeddingsLookup._emb_modules",
        f"{_LOOKUP}:GroupedPooledEmbeddingsLookup._feature_splits",
        f"{_LOOKUP}:GroupedEmbeddingsLookup._feature_splits",
        f"{_LOOKUP}:GroupedEmbeddingsLookup._need_prefetch",
    ),
    requires=TORCHREC,
    reason="hash and KEY_VALUE kernels are found inside a sharded model for their metrics, checkpoints and "
    "pipeline depth, and prefetched by hash FUSED kernels: sharded modules hide their lookups from named_modules()",
)


def kernels_of(module: torch.nn.Module) -> Iterator[torch.nn.Module]:
    """The embedding kernels of ``module``'s lookups; none for a module that is not a sharded embedding module."""
    for lookup in getattr(module, "_lookups", None) or []:
        lookup = getattr(lookup, "module", lookup)  # DistributedDataParallel wraps data_parallel lookups
        yield from getattr(lookup, "_emb_modules", None) or []


def kernels_with_features(lookup: Any, features: Any) -> Iterator[Tuple[torch.nn.Module, Any]]:
    """Each kernel of one lookup with its part of ``features`` (a KJT), split as the lookup's forward splits it."""
    kernels = lookup._emb_modules
    return zip(kernels, features.split(lookup._feature_splits) if kernels else [])


def prefetches_every_kernel(lookup: torch.nn.Module) -> bool:
    """Whether a sequence lookup's own ``prefetch`` reaches all its kernels (it does once one table is cached)."""
    return bool(getattr(lookup, "_need_prefetch", False))
