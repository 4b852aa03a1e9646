"""Row-wise sharding of hash tables: an ID lives on rank ``hash(ID) % world_size``, not on a range of rows.

Stock row-wise sharding sends ID ``x`` to the rank owning the row block ``x // block_size``; a hash table's IDs are
raw 64-bit values with no row meaning, so the input dist here buckets them with :func:`hash_bucketize` (the layout
of ``block_bucketize_sparse_features``, original IDs kept) and each rank's kernel maps them to its own rows. The
lookup and the output dist (reduce-scatter for pooled tables, all-to-all plus un-permute for sequences) are stock.

:func:`hash_bucketize` is a host op: on an accelerator the input dist packs the batch's lengths, IDs and weights
into one byte buffer on the device and copies it to the host once (a blocking copy, so one host sync; the
negative-ID check runs on the host copy), buckets them there and copies the bucketed lengths, IDs, un-bucketize
permutation and weights back packed the same way, in one copy, before TorchRec's all-to-all: 1 device-to-host and 1
host-to-device copy per call whether the batch is weighted or has a variable batch size per feature. On the CPU
every copy is a no-op.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence

import torch
from torchrec.distributed.sharding.rw_sequence_sharding import RwSequenceEmbeddingSharding
from torchrec.distributed.sharding.rw_sharding import RwPooledEmbeddingSharding, RwSparseFeaturesDist
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from torchrec_ascend.adapters import sharding as adapter
from torchrec_ascend.errors import ConfigError, check_non_negative_ids
from torchrec_ascend.native import ops


class HashRwSparseFeaturesDist(RwSparseFeaturesDist):
    """Buckets a KeyedJaggedTensor's raw IDs by ``hash(ID) % world_size`` and sends each bucket to its rank.

    Args:
        pg: the process group of the all-to-all.
        table_of: feature name -> table name, for every feature of the hash tables in this sharding.
        is_sequence: sequence (EmbeddingCollection) features keep the un-bucketize permutation.
        device: device of the internal buffers.
    """

    def __init__(self, pg: Any, table_of: Dict[str, str], is_sequence: bool,
                 device: Optional[torch.device] = None) -> None:
        super().__init__(
            pg=pg, num_features=len(table_of), feature_hash_sizes=[pg.size()] * len(table_of), device=device,
            is_sequence=is_sequence,
        )
        self._table_of = table_of

    def forward(self, sparse_features: KeyedJaggedTensor) -> Any:
        device = sparse_features.values().device
        weights = sparse_features.weights_or_none()
        # int32 IDs and lengths are taken as TorchRec takes them; an ID is placed by its int64 value.
        lengths, values, *host_weights = _move(
            [sparse_features.lengths().long(), sparse_features.values().long()]
            + ([] if weights is None else [weights]), torch.device("cpu"), non_blocking=False,
        )
        check_non_negative_ids(values, sparse_features.keys(), lambda: sparse_features.offset_per_key()[1:],
                               lambda feature: self._table_of.get(feature, "?"))
        world = adapter.world_size(self)
        lengths, bucketed, weights, permute = ops.hash_bucketize(
            lengths, values, host_weights[0] if host_weights else None, world,
        )
        lengths, bucketed, permute, *device_weights = _move(
            [lengths, bucketed, permute] + ([] if weights is None else [weights]), device, non_blocking=True,
        )
        weights = device_weights[0] if device_weights else None
        variable = sparse_features.variable_stride_per_key()
        bucketized = KeyedJaggedTensor(
            keys=list(sparse_features.keys()) * world,
            values=bucketed,
            weights=weights,
            lengths=lengths.view(-1),
            stride=None if variable else sparse_features.stride(),
            stride_per_key_per_rank=sparse_features.stride_per_key_per_rank() * world if variable else None,
        )
        self.unbucketize_permute_tensor = permute if adapter.is_sequence(self) else None
        return adapter.send(self, bucketized)


def _move(tensors: Sequence[torch.Tensor], device: torch.device, non_blocking: bool) -> List[torch.Tensor]:
    """``tensors`` (1-D; all but the last int64, so every piece starts 8-byte aligned) on ``device`` in one copy.

    Their bytes are concatenated where they live, the buffer crosses once and is cut back into views of it: one
    copy and (blocking) one host sync per call instead of one per tensor. A no-op where they already are.

    Example::

        lengths, ids, weights = _move([kjt.lengths().long(), kjt.values().long(), kjt.weights()], cpu, False)
    """
    if all(t.device == device for t in tensors):
        return list(tensors)
    packed = torch.cat([t.contiguous().view(torch.uint8) for t in tensors]).to(device, non_blocking=non_blocking)
    out, start = [], 0
    for t in tensors:
        end = start + t.numel() * t.element_size()
        out.append(packed[start:end].view(t.dtype))
        start = end
    return out


def _table_of(sharding: Any) -> Dict[str, str]:
    """Feature -> table of a sharding's tables, in the order its input dist sees the features."""
    return {f: t.name for t in sharding.embedding_tables() for f in t.feature_names}


def _check_supported(sharding: Any, kind: str) -> None:
    if adapter.has_feature_processor(sharding):
        raise ConfigError(
            f"row-wise hash tables [{', '.join(sharding.embedding_names())}] with a feature processor are not "
            f"supported ({kind}); shard them table_wise or column_wise."
        )


class HashRwPooledEmbeddingSharding(RwPooledEmbeddingSharding):
    """Row-wise sharding of EmbeddingBagCollection hash tables (hash placement; stock lookup and reduce-scatter)."""

    def create_input_dist(self, device: Optional[torch.device] = None) -> HashRwSparseFeaturesDist:
        _check_supported(self, "EmbeddingBagCollection")
        return HashRwSparseFeaturesDist(
            pg=adapter.process_group(self), table_of=_table_of(self), is_sequence=False,
            device=device if device is not None else adapter.sharding_device(self),
        )


class HashRwSequenceEmbeddingSharding(RwSequenceEmbeddingSharding):
    """Row-wise sharding of EmbeddingCollection hash tables (hash placement; stock lookup and all-to-all)."""

    def create_input_dist(self, device: Optional[torch.device] = None) -> HashRwSparseFeaturesDist:
        _check_supported(self, "EmbeddingCollection")
        return HashRwSparseFeaturesDist(
            pg=adapter.process_group(self), table_of=_table_of(self), is_sequence=True,
            device=device if device is not None else adapter.sharding_device(self),
        )
