"""A fused optimizer or a weight precision the device cannot run is refused at sharding time, naming the tables and
the alternatives."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torchrec
from torchrec.distributed.model_parallel import DistributedModelParallel
from torchrec.distributed.planner import EmbeddingShardingPlanner, Topology
from torchrec.distributed.types import ShardingEnv
from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward
from torchrec.types import DataType

from torchrec_ascend import HashEmbeddingBagConfig, get_default_hybrid_sharders
from torchrec_ascend.errors import ConfigError

pytestmark = pytest.mark.usefixtures("one_rank_group")


def shard(optimizer: type, hashed: bool, data_type: DataType = DataType.FP32) -> DistributedModelParallel:
    config = HashEmbeddingBagConfig if hashed else torchrec.EmbeddingBagConfig
    ebc = torchrec.EmbeddingBagCollection(tables=[config(name="user", embedding_dim=8, num_embeddings=64,
                                                         feature_names=["uid"], data_type=data_type)])
    apply_optimizer_in_backward(optimizer, [ebc.embedding_bags["user"].weight], {"lr": 0.1})
    sharders = get_default_hybrid_sharders()
    plan = EmbeddingShardingPlanner(topology=Topology(world_size=1, compute_device="cpu")).plan(ebc, sharders)
    return DistributedModelParallel(ebc, env=ShardingEnv.from_process_group(dist.group.WORLD),
                                    device=torch.device("cpu"), plan=plan, sharders=sharders)


@pytest.mark.parametrize("hashed", [True, False], ids=["hash", "plain"])
def test_lamb_on_cpu_is_a_clear_error(hashed: bool) -> None:
    """ADAM and PARTIAL_ROWWISE_ADAM run on the CPU (tests/optimizers); LAMB does not, and says so."""
    import torchrec.optim as trec_optim

    with pytest.raises(ConfigError, match=r"\[user\].*cpu backend cannot fuse LAMB.*EXACT_ADAGRAD.*ADAM"):
        shard(trec_optim.LAMB, hashed)


def test_emainplace_rowwise_adagrad_on_cpu_is_refused() -> None:
    """It runs in fbgemm's CPU TBE, but no oracle has checked its updates here: refused, naming the alternatives."""
    from fbgemm_gpu.split_embedding_configs import EmbOptimType
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder

    ebc = torchrec.EmbeddingBagCollection(tables=[torchrec.EmbeddingBagConfig(
        name="user", embedding_dim=8, num_embeddings=64, feature_names=["uid"])])
    sharder = EmbeddingBagCollectionSharder(fused_params={
        "optimizer": EmbOptimType.EMAINPLACE_ROWWISE_ADAGRAD, "learning_rate": 0.1})
    plan = EmbeddingShardingPlanner(topology=Topology(world_size=1, compute_device="cpu")).plan(ebc, [sharder])
    with pytest.raises(ConfigError, match=r"\[user\].*cannot fuse EMAINPLACE_ROWWISE_ADAGRAD.*EXACT_ROWWISE_ADAGRAD"):
        DistributedModelParallel(ebc, env=ShardingEnv.from_process_group(dist.group.WORLD),
                                 device=torch.device("cpu"), plan=plan, sharders=[sharder])


@pytest.mark.parametrize("optimizer", [torch.optim.Adagrad, torch.optim.Adam], ids=["adagrad", "adam"])
def test_supported_optimizer_shards(optimizer: type) -> None:
    assert shard(optimizer, hashed=True) is not None


@pytest.mark.parametrize("hashed", [True, False], ids=["hash", "plain"])
def test_bf16_weights_are_refused_at_sharding_naming_the_supported_precisions(hashed: bool) -> None:
    """fbgemm's CPU TBE has no BF16 forward: without the check the first lookup fails inside fbgemm."""
    with pytest.raises(ConfigError, match=r"\[user\]: data_type BF16 .*cpu backend.*weights are FP32, FP16"):
        shard(torch.optim.Adam, hashed, DataType.BF16)
    assert shard(torch.optim.Adam, hashed, DataType.FP16) is not None
