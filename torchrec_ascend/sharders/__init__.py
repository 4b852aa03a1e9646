"""Hybrid sharders: how stock DistributedModelParallel shards hash tables next to plain ones.

Stock TorchRec sharders already handle hash tables inside ``EmbeddingBagCollection`` / ``EmbeddingCollection``
(torchrec-ascend patches the sharded modules: hash specs travel with each table, row-wise hash tables are placed by
``hash(ID) % world_size``, kernels map raw IDs to rows). :func:`get_default_hybrid_sharders` adds sharders for the
RecSDK migration names ``HashEmbeddingBagCollection`` / ``HashEmbeddingCollection``.

Which sharding types a hash table supports: data_parallel (replicas insert every rank's IDs in the same order),
table_wise, column_wise, table_column_wise and row_wise (by hash); table_row_wise and grid_shard are refused with a
clear error (the planner never proposes them).

Example::

    from torchrec.distributed.model_parallel import DistributedModelParallel
    from torchrec_ascend import get_default_hybrid_sharders

    model = DistributedModelParallel(model, sharders=get_default_hybrid_sharders())
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Type

from torchrec.distributed.embedding import EmbeddingCollectionSharder
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
from torchrec.distributed.types import ModuleSharder

from torchrec_ascend.hash.modules import HashEmbeddingBagCollection, HashEmbeddingCollection

# Sharding types a hash table can use (the kernels map raw IDs per shard; every listed type gives each shard the
# same IDs in the same order, hash-partitioned IDs for row_wise, or all ranks' IDs for data_parallel replicas).
HASH_SHARDING_TYPES = ("data_parallel", "table_wise", "column_wise", "table_column_wise", "row_wise")


class HashEmbeddingBagCollectionSharder(EmbeddingBagCollectionSharder):
    """The stock EmbeddingBagCollection sharder, for :class:`HashEmbeddingBagCollection` (RecSDK's name)."""

    @property
    def module_type(self) -> Type[HashEmbeddingBagCollection]:
        return HashEmbeddingBagCollection


class HashEmbeddingCollectionSharder(EmbeddingCollectionSharder):
    """The stock EmbeddingCollection sharder, for :class:`HashEmbeddingCollection` (RecSDK's name)."""

    @property
    def module_type(self) -> Type[HashEmbeddingCollection]:
        return HashEmbeddingCollection


def get_default_hybrid_sharders(
    fused_params: Optional[Dict[str, Any]] = None, use_index_dedup: bool = False
) -> List[ModuleSharder[Any]]:
    """The sharder list to hand to DistributedModelParallel for models with hash (and plain) tables.

    Args:
        fused_params: optional fused optimizer parameters shared by all sharders, as for the stock sharders.
        use_index_dedup: EmbeddingCollections send each table's distinct IDs once per batch through the all-to-all
            and expand the returned rows (TorchRec's ``EmbeddingCollectionSharder`` flag; torchrec-ascend makes it
            exact for raw IDs, see :mod:`.index_dedup`). Pooled tables need every ID at its owner: not deduped.

    Returns:
        Sharders for EmbeddingBagCollection, EmbeddingCollection and their Hash* migration names.
    """
    return [
        EmbeddingBagCollectionSharder(fused_params=fused_params),
        EmbeddingCollectionSharder(fused_params=fused_params, use_index_dedup=use_index_dedup),
        HashEmbeddingBagCollectionSharder(fused_params=fused_params),
        HashEmbeddingCollectionSharder(fused_params=fused_params, use_index_dedup=use_index_dedup),
    ]
