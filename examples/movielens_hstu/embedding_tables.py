"""The item table and how it is sharded: the one place to edit when the table becomes a hash table with a cache.

Today the example uses stock TorchRec only: an ``EmbeddingConfig`` with ``max_item_id + 1`` rows (raw MovieLens IDs
index rows directly, row 0 is never used), ``table_wise`` sharding and the ``fused`` kernel, which keeps the whole
table in memory. With torchrec-ascend the same model switches to a hash table holding raw IDs and a KEY_VALUE cache
smaller than the catalogue by editing these functions only::

    from torchrec_ascend import HashEmbeddingConfig, get_default_hybrid_sharders

    HashEmbeddingConfig(name=ITEM_TABLE, embedding_dim=dim, num_embeddings=capacity, feature_names=[...])
    ParameterConstraints(sharding_types=["row_wise"], compute_kernels=["key_value"],
                         cache_params=CacheParams(load_factor=0.1))
    get_default_hybrid_sharders()
"""

from __future__ import annotations

from typing import Dict, List, Optional

from torch import nn
from torchrec.distributed.embedding_types import EmbeddingComputeKernel
from torchrec.distributed.planner.types import ParameterConstraints
from torchrec.distributed.sharding_plan import get_default_sharders
from torchrec.distributed.types import ModuleSharder, ShardingType
from torchrec.modules.embedding_configs import EmbeddingConfig

ITEM_TABLE = "item"
HISTORY = "history"  # the user's past items, one sequence per sample
CANDIDATES = "candidates"  # the items a batch scores against (sampled softmax), looked up from the same table


def item_tables(num_item_rows: int, dim: int) -> List[EmbeddingConfig]:
    """The embedding tables of the model: one item table read by both features.

    Args:
        num_item_rows: rows of the table; with a stock table, the largest raw item ID + 1.
        dim: embedding width.

    Example::

        item_tables(1683, 64)[0].feature_names   # ['history', 'candidates']
    """
    return [
        EmbeddingConfig(
            name=ITEM_TABLE, embedding_dim=dim, num_embeddings=num_item_rows, feature_names=[HISTORY, CANDIDATES]
        )
    ]


def item_constraints() -> Dict[str, ParameterConstraints]:
    """Planner constraints per table: ``table_wise`` placement and the ``fused`` kernel.

    Example::

        EmbeddingShardingPlanner(topology=topology, constraints=item_constraints())
    """
    return {
        ITEM_TABLE: ParameterConstraints(
            sharding_types=[ShardingType.TABLE_WISE.value],
            compute_kernels=[EmbeddingComputeKernel.FUSED.value],
        )
    }


def embedding_sharders() -> List[ModuleSharder[nn.Module]]:
    """The sharders handed to the planner and to ``DistributedModelParallel``.

    Example::

        DistributedModelParallel(model, plan=plan, sharders=embedding_sharders())
    """
    return get_default_sharders()


def item_cache_hit_rate(model: nn.Module) -> Optional[float]:
    """Hit rate of the item table's device cache since the last call, or ``None`` where the kernel has no cache.

    The ``fused`` kernel keeps the whole table resident, so there is nothing to report yet; the KEY_VALUE kernel's
    metrics will be read here.

    Example::

        item_cache_hit_rate(model)   # None with the fused kernel
    """
    return None
