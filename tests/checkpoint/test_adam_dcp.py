"""Fused Adam and BF16 tables through stock torch.distributed.checkpoint (one rank): the step counter that Adam's
bias correction and BF16's stochastic rounding read travels in ``fused_optimizer.state_dict()`` (``<table>.iter``),
so a model restored by DCP trains on exactly as the saved one (bit for bit), for plain FUSED, plain KEY_VALUE and
hash tables, FP32 and BF16 (weights BF16, state FP32), BF16 rounded to nearest or stochastically (fbgemm's default).
The oracle is the saved model trained on."""

from __future__ import annotations

import tempfile
from typing import Any, Dict, Iterator

import pytest
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torchrec
from torchrec.distributed.model_parallel import DistributedModelParallel
from torchrec.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints, Topology
from torchrec.distributed.types import CacheParams, KeyValueParams, ShardingEnv
from torchrec.optim import RowWiseAdagrad
from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor
from torchrec.types import DataType

from torchrec_ascend import HashEmbeddingBagConfig, get_default_hybrid_sharders
from torchrec_ascend.checkpoint.key_value_state import settle_loads

pytestmark = pytest.mark.usefixtures("one_rank_group")
ROWS, DIM = 64, 8
KERNELS = {"plain_fused": "fused", "plain_kv": "key_value", "hash_kv": "key_value"}


@pytest.fixture
def disk() -> Iterator[str]:
    with tempfile.TemporaryDirectory() as directory:
        yield directory


def model(disk: str, data_type: DataType = DataType.FP32, optimizer: Any = torch.optim.Adam,
          stochastic: bool = False) -> DistributedModelParallel:
    torch.manual_seed(0)
    ebc = torchrec.EmbeddingBagCollection(tables=[
        torchrec.EmbeddingBagConfig(name="plain_fused", embedding_dim=DIM, num_embeddings=ROWS, feature_names=["a"],
                                    data_type=data_type),
        torchrec.EmbeddingBagConfig(name="plain_kv", embedding_dim=DIM, num_embeddings=ROWS, feature_names=["b"],
                                    data_type=data_type),
        HashEmbeddingBagConfig(name="hash_kv", embedding_dim=DIM, num_embeddings=ROWS, feature_names=["c"],
                               init_seed=3, data_type=data_type),
    ])
    apply_optimizer_in_backward(optimizer, ebc.parameters(), {"lr": 0.05})
    constraints = {name: ParameterConstraints(
        sharding_types=["table_wise"], compute_kernels=[kernel],
        **({"cache_params": CacheParams(load_factor=0.3), "key_value_params": KeyValueParams(
            l2_cache_size=1e-6, ssd_storage_directory=disk)} if kernel == "key_value" else {}))
        for name, kernel in KERNELS.items()}
    sharders = get_default_hybrid_sharders(fused_params={"stochastic_rounding": stochastic})
    plan = EmbeddingShardingPlanner(topology=Topology(world_size=1, compute_device="cpu"),
                                    constraints=constraints).plan(ebc, sharders)
    return DistributedModelParallel(ebc, env=ShardingEnv.from_process_group(dist.group.WORLD),
                                    device=torch.device("cpu"), plan=plan, sharders=sharders)


def train(dmp: DistributedModelParallel, steps: range) -> torch.Tensor:
    outputs = []
    for step in steps:
        gen = torch.Generator().manual_seed(step)
        values = torch.randint(0, ROWS, (18,), generator=gen)
        kjt = KeyedJaggedTensor.from_lengths_sync(keys=["a", "b", "c"], values=values,
                                                  lengths=torch.ones(18, dtype=torch.long))
        out = dmp(kjt).values()
        out.sum().backward()
        outputs.append(out.detach())
    return torch.cat(outputs)


def both(dmp: DistributedModelParallel) -> Dict[str, Any]:
    return {"model": dmp.state_dict(), "optim": dmp.fused_optimizer.state_dict()}


@pytest.mark.parametrize("data_type, optimizer, stochastic", [
    (DataType.FP32, torch.optim.Adam, False),
    (DataType.BF16, torch.optim.Adam, False),
    (DataType.BF16, torch.optim.Adam, True),
    (DataType.BF16, RowWiseAdagrad, True),  # the counter is carried for the rounding alone
], ids=["fp32-adam", "bf16-adam-nearest", "bf16-adam-stochastic", "bf16-rowwise_adagrad-stochastic"])
def test_trains_on_after_a_dcp_load_exactly_as_the_saved_model(disk: str, data_type: DataType, optimizer: Any,
                                                              stochastic: bool) -> None:
    saved = model(disk, data_type, optimizer, stochastic)
    weights = saved.state_dict()["embedding_bags.plain_fused.weight"]
    assert weights.local_shards()[0].tensor.dtype == (torch.bfloat16 if data_type == DataType.BF16 else torch.float32)
    train(saved, range(4))
    optim = both(saved)["optim"]["state"]
    counters = {name: optim[f"embedding_bags.{name}.weight"][f"{name}.iter"] for name in KERNELS}
    assert all(int(c) == 4 for c in counters.values()), counters
    dcp.save(both(saved), checkpoint_id=f"{disk}/ckpt")
    loaded = model(disk, data_type, optimizer, stochastic)
    state = both(loaded)
    dcp.load(state, checkpoint_id=f"{disk}/ckpt")
    loaded.load_state_dict(state["model"])
    assert not settle_loads(loaded)
    assert torch.equal(train(loaded, range(4, 8)), train(saved, range(4, 8)))
