"""Adapter for TorchRec's row-wise sharding: the fields of ``RwSparseFeaturesDist`` (the input dist) and of the
``BaseRwEmbeddingSharding`` shardings that the hash-placed row-wise sharding reuses.

Example::

    world_size(dist)                # ranks the input dist buckets for
    send(dist, bucketized_kjt)      # TorchRec's all-to-all of the buckets
    process_group(sharding), sharding_device(sharding), has_feature_processor(sharding)
"""

from __future__ import annotations

from typing import Any

import torch
from torchrec.distributed.sharding.rw_sharding import BaseRwEmbeddingSharding, RwSparseFeaturesDist
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from torchrec_ascend.adapters import Adapter
from torchrec_ascend.versions import TORCHREC

_DIST = "torchrec.distributed.sharding.rw_sharding:RwSparseFeaturesDist"
_SHARDING = "torchrec.distributed.sharding.rw_sharding:BaseRwEmbeddingSharding"

ADAPTER = Adapter(
    name="a.sharding",
    target=_SHARDING,
    privates=(
        f"{_DIST}._world_size",
        f"{_DIST}._is_sequence",
        f"{_DIST}._dist",
        f"{_SHARDING}._pg",
        f"{_SHARDING}._device",
        f"{_SHARDING}._has_feature_processor",
    ),
    requires=TORCHREC,
    reason="row-wise hash tables bucket IDs by hash in their own input dist, then send them with the stock one's "
    "all-to-all, built from the stock sharding's process group and device",
)


def world_size(input_dist: RwSparseFeaturesDist) -> int:
    """How many ranks ``input_dist`` buckets features for."""
    return input_dist._world_size


def is_sequence(input_dist: RwSparseFeaturesDist) -> bool:
    """True for a sequence (EmbeddingCollection) input dist, which keeps the un-bucketize permutation."""
    return input_dist._is_sequence


def send(input_dist: RwSparseFeaturesDist, bucketized: KeyedJaggedTensor) -> Any:
    """Start ``input_dist``'s all-to-all of bucket-major ``bucketized`` features; returns TorchRec's awaitable."""
    return input_dist._dist(bucketized)


def process_group(sharding: BaseRwEmbeddingSharding) -> Any:
    """The process group the sharding's collectives run on."""
    return sharding._pg


def sharding_device(sharding: BaseRwEmbeddingSharding) -> torch.device:
    """The device the sharding was built for."""
    return sharding._device


def has_feature_processor(sharding: Any) -> bool:
    """True if a table of the sharding has a feature processor (False where TorchRec does not record it)."""
    return bool(getattr(sharding, "_has_feature_processor", False))
