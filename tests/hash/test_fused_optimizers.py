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
def test_a_precision_the_kernel_cannot_hold_is_refused_at_sharding_naming_the_supported_ones(hashed: bool) -> None:
    """Without the check fbgemm's TBE would fail at the first lookup; BF16 and FP16 weights shard (tests/optimizers)."""
    with pytest.raises(ConfigError, match=r"\[user\]: data_type INT8 .*cpu backend.*weights are FP32, FP16, BF16"):
        shard(torch.optim.Adam, hashed, DataType.INT8)
    assert shard(torch.optim.Adam, hashed, DataType.FP16) is not None
    assert shard(torch.optim.Adagrad, hashed, DataType.BF16) is not None


def test_a_weight_decay_mode_on_bf16_tables_is_refused_naming_the_table() -> None:
    """fbgemm's CPU EXACT_ROWWISE_ADAGRAD steps alike with and without one; BF16 tables refuse it, not drop it."""
    from fbgemm_gpu.split_embedding_configs import EmbOptimType
    from fbgemm_gpu.tbe.config.optimizer_config import WeightDecayMode
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder

    ebc = torchrec.EmbeddingBagCollection(tables=[torchrec.EmbeddingBagConfig(
        name="user", embedding_dim=8, num_embeddings=64, feature_names=["uid"], data_type=DataType.BF16)])
    sharder = EmbeddingBagCollectionSharder(fused_params={
        "optimizer": EmbOptimType.EXACT_ROWWISE_ADAGRAD, "learning_rate": 0.1, "weight_decay": 0.01,
        "weight_decay_mode": WeightDecayMode.DECOUPLE})
    plan = EmbeddingShardingPlanner(topology=Topology(world_size=1, compute_device="cpu")).plan(ebc, [sharder])
    with pytest.raises(ConfigError, match=r"\[user\] \(EXACT_ROWWISE_ADAGRAD, BF16 weights\): weight_decay_mode"):
        DistributedModelParallel(ebc, env=ShardingEnv.from_process_group(dist.group.WORLD),
                                 device=torch.device("cpu"), plan=plan, sharders=[sharder])
