"""The item table and how it is sharded: the one place that decides where item rows live.

The table is a torchrec-ascend hash table: raw MovieLens item IDs go in as they are (no ID-to-row dictionary), and
``num_embeddings`` is its capacity, a bit above the catalogue. It is sharded ``row_wise`` (each ID lives on rank
``hash(ID) % world_size``) with the KEY_VALUE kernel: every shard keeps a device cache of ``CACHE_LOAD_FACTOR`` of
its rows, over a host-memory tier of ``HOST_BUDGET_GB`` that spills to a disk tier in the run folder. Rows leaving
the cache are chosen by the ``decayed_lfu`` eviction policy, a third-party plugin (``examples/custom_policy``,
installed by ``scripts/run-main-job``). Everything else in the example is stock TorchRec.

Sizing rule: a shard's cache must hold the distinct items of one batch, plus those of the batches the pipeline keeps
pinned. Here a step (two ranks of 64 windows of 50 items, plus candidates) touches up to ~690 of a shard's ~840
items, because MovieLens-100K's histories reach most of its small catalogue every step; the cache is 740 rows per
shard (0.8 of 925), 1480 rows in all for 1682 items. On a real catalogue the same rule gives a small fraction.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Dict, List, Optional

from torch import nn
from torchrec.distributed.planner.types import ParameterConstraints
from torchrec.distributed.types import CacheParams, KeyValueParams, ModuleSharder, ShardingType
from torchrec.modules.embedding_configs import DataType, EmbeddingConfig

from torchrec_ascend import HashEmbeddingConfig, get_default_hybrid_sharders
from torchrec_ascend.kernels.key_value import cache_metrics

ITEM_TABLE = "item"
HISTORY = "history"  # the user's past items, one sequence per sample
CANDIDATES = "candidates"  # the items a batch scores against (sampled softmax), looked up from the same table

CAPACITY_HEADROOM = 1.1  # table capacity over the catalogue size
CACHE_LOAD_FACTOR = 0.8  # device-cache rows per shard row
HOST_BUDGET_GB = 4 / 1024**2  # 4 KiB of host memory per shard (a dozen rows): evicted rows reach the disk tier
EVICTION_POLICY = "decayed_lfu"
EVICTION_OPTIONS = {"half_life": 50}  # steps; an epoch is 19 steps with the defaults


def item_tables(num_items: int, dim: int, data_type: DataType = DataType.FP32) -> List[EmbeddingConfig]:
    """The embedding tables of the model: one hash table of raw item IDs, read by both features.

    Args:
        num_items: distinct items in the data (the capacity is ``CAPACITY_HEADROOM`` times that).
        dim: embedding width.
        data_type: the weights' precision (the optimizer state stays FP32).

    Example::

        item_tables(1682, 64)[0].num_embeddings   # 1851
    """
    return [
        HashEmbeddingConfig(
            name=ITEM_TABLE,
            embedding_dim=dim,
            num_embeddings=math.ceil(CAPACITY_HEADROOM * num_items),
            feature_names=[HISTORY, CANDIDATES],
            eviction_policy=EVICTION_POLICY,
            eviction_options=dict(EVICTION_OPTIONS),
            data_type=data_type,
        )
    ]


def item_constraints(run_dir: Path) -> Dict[str, ParameterConstraints]:
    """Planner constraints per table: ``row_wise`` placement and the ``key_value`` kernel with its tiers.

    Args:
        run_dir: the disk tier goes to ``run_dir / "item_rows"`` (one subfolder per rank).

    Example::

        EmbeddingShardingPlanner(topology=topology, constraints=item_constraints(Path("runs/movielens_hstu")))
    """
    return {
        ITEM_TABLE: ParameterConstraints(
            sharding_types=[ShardingType.ROW_WISE.value],
            compute_kernels=["key_value"],
            cache_params=CacheParams(load_factor=CACHE_LOAD_FACTOR),
            key_value_params=KeyValueParams(
                l2_cache_size=HOST_BUDGET_GB, ssd_storage_directory=str(run_dir / "item_rows")
            ),
        )
    }


def embedding_sharders() -> List[ModuleSharder[nn.Module]]:
    """The sharders handed to the planner and to ``DistributedModelParallel`` (stock ones, hash tables included).

    Example::

        DistributedModelParallel(model, plan=plan, sharders=embedding_sharders())
    """
    return get_default_hybrid_sharders()


def item_cache_counters(model: nn.Module) -> Optional[Dict[str, int]]:
    """This rank's counters of the item table's KEY_VALUE tiers, or ``None`` when the table has no cache.

    Returns:
        Dict[str, int]: ``hits``, ``lookups``, ``evicted``, ``swapped_in``, ``swapped_out``, ``disk_rows``, ...
        (see ``torchrec_ascend.kernels.key_value.cache_metrics``), cumulative since the model was sharded.

    Example::

        counters = item_cache_counters(dmp)
        hit_rate = counters["hits"] / counters["lookups"]
    """
    return cache_metrics(model).get(ITEM_TABLE)
