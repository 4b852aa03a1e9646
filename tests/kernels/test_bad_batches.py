"""A batch the kernels refuse, before any row moves: a negative ID of a hash table (FUSED) and a plain KEY_VALUE
table's row beyond its shard, each an InputError naming the table and the feature.

Oracle: the documented messages, and the refusing table's state (its slot table's counters) unchanged by the
batch; each kernel checks its own features, so the other table may have looked its IDs up. One process, a 1-rank
gloo group, table_wise tables.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torchrec
from torchrec.distributed.model_parallel import DistributedModelParallel
from torchrec.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints, Topology
from torchrec.distributed.types import CacheParams, ShardingEnv
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from torchrec_ascend import HashEmbeddingBagConfig, get_default_hybrid_sharders
from torchrec_ascend.errors import InputError
from torchrec_ascend.kernels.walk import sharded_kernels

pytestmark = pytest.mark.usefixtures("one_rank_group")
ROWS = 32


def model() -> DistributedModelParallel:
    ebc = torchrec.EmbeddingBagCollection(tables=[
        HashEmbeddingBagConfig(name="user", embedding_dim=8, num_embeddings=ROWS, feature_names=["uid"]),
        torchrec.EmbeddingBagConfig(name="item", embedding_dim=8, num_embeddings=ROWS, feature_names=["iid"]),
    ])
    constraints = {
        "user": ParameterConstraints(sharding_types=["table_wise"], compute_kernels=["fused"]),
        "item": ParameterConstraints(sharding_types=["table_wise"], compute_kernels=["key_value"],
                                     cache_params=CacheParams(load_factor=0.5)),
    }
    planner = EmbeddingShardingPlanner(topology=Topology(world_size=1, compute_device="cpu"), constraints=constraints)
    sharders = get_default_hybrid_sharders()
    return DistributedModelParallel(ebc, env=ShardingEnv.from_process_group(dist.group.WORLD),
                                    device=torch.device("cpu"), plan=planner.plan(ebc, sharders), sharders=sharders)


def batch(uids: list, iids: list) -> KeyedJaggedTensor:
    return KeyedJaggedTensor.from_lengths_sync(
        keys=["uid", "iid"], values=torch.tensor(uids + iids), lengths=torch.tensor([len(uids), len(iids)]))


def counters(dmp: DistributedModelParallel) -> dict:
    """Per table, its slot table's counters."""
    return {name: stats for k in sharded_kernels(dmp) for name, stats in k.hash_stats().items()}


@pytest.mark.parametrize("uids, iids, table, message", [
    ([1, -5, 2], [3], "user", "hash table 'user', feature 'uid': IDs must be non-negative int64, got -5."),
    ([1], [3, ROWS + 8], "item",
     f"table 'item', feature 'iid': row {ROWS + 8} is out of range for a shard of {ROWS} rows"),
])
def test_a_refused_batch_names_table_and_feature_and_changes_nothing(uids: list, iids: list, table: str,
                                                                      message: str) -> None:
    dmp = model()
    dmp(batch([1, 2], [3, 4]))
    before = counters(dmp)
    with pytest.raises(InputError) as caught:
        dmp(batch(uids, iids))
    assert message in str(caught.value)
    assert isinstance(caught.value, ValueError), "callers catching ValueError keep working"
    assert counters(dmp)[table] == before[table]
    dmp(batch([1, 2], [3, 4]))  # the kernels still take good batches
