"""Fused ADAM and PARTIAL_ROWWISE_ADAM on the CPU (``torchrec_ascend.kernels.fused_optimizers``) against torch.optim.

Oracles that share nothing with the kernel: per table an unsharded ``embedding_bag`` / ``embedding`` with autograd,
and ``TouchedRowsAdam`` (the conformance scripts' oracle: ``torch.optim.AdamW``'s own update on the rows a step
touched, bias-corrected by the table group's step count as fbgemm's ADAM on CUDA; PARTIAL_ROWWISE_ADAM written out).
Sharded on 2 ranks (row_wise / table_wise / column_wise, plain and hash, FUSED and KEY_VALUE with a tiny cache) the
conformance scripts compare the same way; here a few of their cases run. Bad hyper-parameters are refused at
construction naming the table; a reused hash row starts with zero Adam state.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List

import pytest
import torch
import torch.distributed as dist
import torchrec
from fbgemm_gpu.split_embedding_configs import EmbOptimType
from fbgemm_gpu.split_table_batched_embeddings_ops_common import EmbeddingLocation, PoolingMode
from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
    ComputeDevice,
    SplitTableBatchedEmbeddingBagsCodegen,
)
from hypothesis import given, settings
from hypothesis import strategies as st
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
from torchrec.distributed.model_parallel import DistributedModelParallel
from torchrec.distributed.planner import EmbeddingShardingPlanner, Topology
from torchrec.distributed.types import ShardingEnv
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from tbe_batches import oracle_lookup, random_batch
from torchrec_ascend import HashEmbeddingBagConfig, get_default_hybrid_sharders
from torchrec_ascend.conformance_tests.launch import run_distributed
from torchrec_ascend.conformance_tests.plugin import hash_tables, key_value
from torchrec_ascend.conformance_tests.stock import sharding_matrix
from torchrec_ascend.conformance_tests.stock.sharding_matrix import TouchedRowsAdam
from torchrec_ascend.errors import ConfigError
from torchrec_ascend.kernels.fused_optimizers import install_on_tbe
from torchrec_ascend.kernels.walk import sharded_kernels

LR, EPS, BETAS, DECAY = 0.05, 1e-8, (0.8, 0.95), 0.01


def tbe(specs: List[Any], features: List[int], name: str, pooling: PoolingMode) -> Any:
    module = SplitTableBatchedEmbeddingBagsCodegen(
        [(rows, dim, EmbeddingLocation.HOST, ComputeDevice.CPU) for rows, dim in specs], feature_table_map=features,
        optimizer=EmbOptimType.EXACT_SGD, learning_rate=LR, eps=EPS, beta1=BETAS[0], beta2=BETAS[1],
        weight_decay=DECAY, pooling_mode=pooling, device="cpu")
    install_on_tbe(module, name)
    return module


@settings(deadline=None, max_examples=25)
@given(
    name=st.sampled_from(["ADAM", "PARTIAL_ROWWISE_ADAM"]),
    pooling=st.sampled_from([PoolingMode.SUM, PoolingMode.MEAN, PoolingMode.NONE]),
    dims=st.sampled_from([(4, 4), (4, 8)]),
    weighted=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_tbe_trains_as_torch_adamw_on_the_touched_rows(name: str, pooling: PoolingMode, dims: Any, weighted: bool,
                                                       seed: int) -> None:
    """Several steps, two tables (three features, one shared), duplicate IDs, empty bags, rows absent from steps."""
    dims = (4, 4) if pooling == PoolingMode.NONE else dims  # a sequence TBE has one dim
    weighted = weighted and pooling == PoolingMode.SUM
    gen = torch.Generator().manual_seed(seed)
    specs, features, batch = [(7, dims[0]), (9, dims[1])], [0, 1, 1], 3
    module = tbe(specs, features, name, pooling)
    reference = [torch.nn.Parameter(w.detach().clone()) for w in module.split_embedding_weights()]
    oracle = TouchedRowsAdam(reference, lr=LR, eps=EPS, betas=BETAS, weight_decay=DECAY,
                             rowwise=name == "PARTIAL_ROWWISE_ADAM")
    for _ in range(4):
        steps = random_batch(gen, specs, features, batch)
        out = module(steps.indices, steps.offsets, steps.per_sample_weights(weighted))
        expected = oracle_lookup(reference, features, steps, weighted, pooling)
        torch.testing.assert_close(out, expected, atol=1e-6, rtol=1e-6)
        upstream = torch.randn(out.shape, generator=gen)
        (out * upstream).sum().backward()
        (expected * upstream).sum().backward()
        oracle.step()
        oracle.zero_grad()
    for t, ref in enumerate(reference):
        torch.testing.assert_close(module.split_embedding_weights()[t], ref.detach(), atol=1e-6, rtol=1e-5)
        moments = module.get_optimizer_state()[t]
        torch.testing.assert_close(moments["exp_avg"], oracle.state[ref]["exp_avg"], atol=1e-6, rtol=1e-5)
        second = oracle.state[ref]["exp_avg_sq"]
        second = second[:, 0] if name == "PARTIAL_ROWWISE_ADAM" else second  # the oracle repeats a row's value
        torch.testing.assert_close(moments["exp_avg_sq"], second, atol=1e-7, rtol=1e-5)
    assert int(module.iter) == 4


def test_per_sample_weight_gradient_is_the_oracle_s() -> None:
    module = tbe([(5, 4)], [0], "ADAM", PoolingMode.SUM)
    reference = module.split_embedding_weights()[0].detach().clone()
    ids, offsets = torch.tensor([1, 3, 3, 0]), torch.tensor([0, 2, 4])
    weights = torch.rand(4, requires_grad=True)
    mine = torch.rand(4).copy_(weights.detach()).requires_grad_()
    upstream = torch.randn(2, 4)
    (module(ids, offsets, mine) * upstream).sum().backward()
    expected = torch.nn.functional.embedding_bag(ids, reference, offsets[:-1], mode="sum", per_sample_weights=weights)
    (expected * upstream).sum().backward()
    torch.testing.assert_close(mine.grad, weights.grad)


def test_no_step_outside_training() -> None:
    module = tbe([(5, 4)], [0], "ADAM", PoolingMode.SUM)
    before = module.split_embedding_weights()[0].clone()
    with torch.no_grad():
        module(torch.tensor([1, 2]), torch.tensor([0, 2]))
    assert int(module.iter) == 0 and torch.equal(module.split_embedding_weights()[0], before)


# -- sharded, through DistributedModelParallel (one rank here; two ranks in the scripts below) ------------------------

@pytest.fixture(scope="module")
def group(one_rank_group: None) -> Any:
    return dist.group.WORLD


def shard(fused_params: Dict[str, Any], hashed: bool = False, rows: int = 64, **hash_options: Any) -> Any:
    config = HashEmbeddingBagConfig if hashed else torchrec.EmbeddingBagConfig
    ebc = torchrec.EmbeddingBagCollection(tables=[config(name="user", embedding_dim=8, num_embeddings=rows,
                                                         feature_names=["uid"], **hash_options)])
    sharders = (get_default_hybrid_sharders(fused_params=fused_params) if hashed
                else [EmbeddingBagCollectionSharder(fused_params=fused_params)])
    plan = EmbeddingShardingPlanner(topology=Topology(world_size=1, compute_device="cpu")).plan(ebc, sharders)
    return DistributedModelParallel(ebc, env=ShardingEnv.from_process_group(dist.group.WORLD),
                                    device=torch.device("cpu"), plan=plan, sharders=sharders)


@pytest.mark.parametrize("bad, rule", [
    ({"learning_rate": -0.1}, r"learning_rate=-0.1 must be >= 0"),
    ({"beta1": 1.0}, r"beta1=1.0 must be in \[0, 1\)"),
    ({"beta2": -0.5}, r"beta2=-0.5 must be in \[0, 1\)"),
    ({"eps": 0.0}, r"eps=0.0 must be > 0"),
    ({"weight_decay": -1.0}, r"weight_decay=-1.0 must be >= 0"),
])
def test_out_of_range_hyper_parameters_are_refused_at_construction(group: Any, bad: Dict[str, Any],
                                                                   rule: str) -> None:
    with pytest.raises(ConfigError, match=r"tables \[user\] \(ADAM\): " + rule):
        shard({"optimizer": EmbOptimType.ADAM, "learning_rate": 0.1, **bad})


def test_a_reused_hash_row_starts_with_zero_adam_state(group: Any) -> None:
    """A 2-ID hash table: ID 1 trains, IDs 2 and 3 evict it, ID 4 evicts 3 and takes a trained row: after one step
    its moments are a fresh row's first step (from zero state), not the previous holder's decayed ones."""
    dmp = shard({"optimizer": EmbOptimType.ADAM, "learning_rate": LR}, hashed=True, rows=2, overflow="evict")
    kernel = next(iter(sharded_kernels(dmp)))
    for ids in ([1, 1], [2, 3], [2, 3], [4, 2]):
        kjt = KeyedJaggedTensor.from_lengths_sync(["uid"], torch.tensor(ids), torch.tensor([len(ids)]))
        dmp(kjt)["uid"].sum().backward()
        if ids == [1, 1]:
            trained = int(kernel.slot_table(0).id_map.lookup(torch.tensor([1])))
    slot = int(kernel.slot_table(0).id_map.lookup(torch.tensor([4])))
    assert slot == trained or int(kernel.slot_table(0).id_map.lookup(torch.tensor([2]))) == trained
    state = kernel.pack_rows(0, torch.tensor([slot]))[0, 8:]
    emb = kernel._emb_module
    m, v = state[:8], state[8:]
    # One step from zero state with gradient g: m = (1 - beta1) g, v = (1 - beta2) g^2 (g: 1, the sum's gradient).
    g = torch.ones(8)
    torch.testing.assert_close(m, (1 - emb.optimizer_args.beta1) * g)
    torch.testing.assert_close(v, (1 - emb.optimizer_args.beta2) * g * g)


# -- two ranks: the conformance scripts' Adam cases --------------------------------------------------------------------

TWO_RANK_SHARDING = [{"kind": k, "sharding_type": t, "optimizer": o} for k, t, o in (
    ("ebc", "table_wise", "adam"), ("ebc", "row_wise", "partial_rowwise_adam"), ("ec", "column_wise", "adam"))]
TWO_RANK_KEY_VALUE = [{"kind": k, "sharding_type": t, "optimizer": o, "steps": 30, "cache_rows": 64, "host_kb": 8}
                      for k, t, o in (("ebc", "row_wise", "adam"), ("ec", "table_wise", "partial_rowwise_adam"))]
TWO_RANK_HASH = [{"kind": "ebc", "sharding_type": "column_wise", "optimizer": "partial_rowwise_adam"}]


@pytest.mark.multiprocess
def test_two_ranks_sharded_plain_hash_and_key_value_match_the_oracles() -> None:
    tolerance = 1e-6  # float32 rounding of the same formula in another order (measured: <= 1.8e-7)
    stock = run_distributed(Path(sharding_matrix.__file__), world_size=2, cases=TWO_RANK_SHARDING)["results"]
    for result in stock:
        assert not result["error"], result.get("traceback") or result["error"]
        assert result["fwd_err"] < tolerance and result["weight_err"] < tolerance, result
        assert result["moved"] > 0.1, "the weights hardly moved: the case proves nothing"
    hashed = run_distributed(Path(hash_tables.__file__), world_size=2, cases=TWO_RANK_HASH)["results"]
    for result in hashed:
        assert not result["error"], result.get("traceback") or result["error"]
        assert max(result["row_err_unsharded"], result["row_err_python"]) < tolerance, result
    cached = run_distributed(Path(key_value.__file__), world_size=2, cases=TWO_RANK_KEY_VALUE)["results"]
    for result in cached:
        assert not result["error"], result.get("traceback") or result["error"]
        assert result["fwd_err"] == 0.0 and result["row_err"] == 0.0, "KEY_VALUE is not FUSED bit for bit"
        assert result["swapped_in"] > 0 and result["disk_rows"] > 0, "the state never left the cache and came back"
