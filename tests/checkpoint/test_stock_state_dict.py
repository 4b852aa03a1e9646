"""Stock state_dict() of sharded FUSED hash tables (one rank): each weight row's ID travels as ``weight_id``; rows
without their IDs are refused instead of being read as other IDs' rows. The 2-rank round trips through DCP (every
sharding type, resharding, misplaced IDs) are in tests/hash/test_sharded_hash_tables.py."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torchrec
from torchrec.distributed.model_parallel import DistributedModelParallel
from torchrec.distributed.planner import EmbeddingShardingPlanner, Topology
from torchrec.distributed.types import ShardingEnv
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from torchrec_ascend import HashEmbeddingBagConfig, HashEmbeddingConfig, get_default_hybrid_sharders
from torchrec_ascend.errors import ConfigError

pytestmark = pytest.mark.usefixtures("one_rank_group")
IDS = torch.tensor([7, 2**62, 7, 123456789])


def collection() -> torchrec.EmbeddingBagCollection:
    return torchrec.EmbeddingBagCollection(tables=[HashEmbeddingBagConfig(
        name="user", embedding_dim=4, num_embeddings=16, feature_names=["uid"], init_seed=3)])


def batch(ids: torch.Tensor = IDS) -> KeyedJaggedTensor:
    lengths = torch.ones(ids.numel(), dtype=torch.long)
    return KeyedJaggedTensor.from_lengths_sync(keys=["uid"], values=ids, lengths=lengths)


def shard(module: torch.nn.Module) -> DistributedModelParallel:
    sharders = get_default_hybrid_sharders()
    plan = EmbeddingShardingPlanner(topology=Topology(world_size=1, compute_device="cpu")).plan(module, sharders)
    return DistributedModelParallel(module, env=ShardingEnv.from_process_group(dist.group.WORLD),
                                    device=torch.device("cpu"), plan=plan, sharders=sharders)


def local(value: torch.Tensor) -> torch.Tensor:
    return value.local_shards()[0].tensor if hasattr(value, "local_shards") else value


def test_weight_id_names_the_id_of_every_row() -> None:
    dmp = shard(collection())
    dmp(batch())
    state = dmp.state_dict()
    ids = local(state["embedding_bags.user.weight_id"])[:, 0]
    assert ids.shape[0] == local(state["embedding_bags.user.weight"]).shape[0]
    assert sorted(ids[ids >= 0].tolist()) == sorted(set(IDS.tolist()))


def test_round_trip_into_a_fresh_model_looks_up_the_same_rows() -> None:
    trained = shard(collection())
    trained(batch())
    with torch.no_grad():
        for p in trained.parameters():
            p.add_(1.0)  # rows no initialisation could give: a lost ID would show
    fresh = shard(collection())
    fresh.load_state_dict(trained.state_dict())
    torch.testing.assert_close(fresh(batch()).values(), trained(batch()).values(), rtol=0, atol=0)


def test_rows_without_their_ids_are_refused() -> None:
    state = shard(collection()).state_dict()
    del state["embedding_bags.user.weight_id"]
    with pytest.raises(ConfigError, match=r"'user'.*without the ID of each row.*Saver"):
        shard(collection()).load_state_dict(state)


def test_sharding_a_trained_unsharded_collection_is_refused_not_silently_reset() -> None:
    # Sharding an EmbeddingCollection loads the unsharded module's state (an EmbeddingBagCollection on CPU starts
    # from fresh rows, plain tables included); hash rows cannot follow their IDs there, so this is an error.
    module = torchrec.EmbeddingCollection(tables=[HashEmbeddingConfig(
        name="user", embedding_dim=4, num_embeddings=16, feature_names=["uid"])])
    module(batch())
    with pytest.raises(ConfigError, match=r"'user'.*holds 3 IDs in an unsharded module.*Saver"):
        shard(module)
    shard(torchrec.EmbeddingCollection(tables=module.embedding_configs()))  # untrained: nothing to lose
