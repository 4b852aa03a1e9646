"""KEY_VALUE at its edges, 2 ranks, against FUSED hash tables holding every ID (bit for bit).

Run with torchrun (``conformance_tests/launch.py``); cases:

* ``{"kind": "full_cache", "module": "ebc"|"ec"}``: ``CacheParams(load_factor=1.0)`` on a 10-ID table sharded
  row_wise; every batch touches exactly the 5 IDs each shard owns. The cache must hold them all (no eviction) and
  train as FUSED.
* ``{"kind": "eval", "module": "ebc"|"ec", "pooling": "sum"|"mean", "weighted": bool, "vbe": bool}``: a small
  cache, a training step, then eval-mode forwards under ``torch.no_grad()`` whose rows are many times the cache, then
  training goes on. Every output (train and eval) and every final row must equal FUSED's. With ``vbe`` every batch
  has a variable batch size per feature (``stride_per_key_per_rank`` with ``inverse_indices``; TorchRec's row-wise
  output dist is made for the first batch's kind, so a model does not switch kinds).

Reported: ``fwd_err``, ``eval_err``, ``row_err`` (all must be 0.0), ``evicted`` and ``eval_rows`` (distinct rows an
eval batch touched on a shard, so a case that fit the cache cannot pass unnoticed).
"""

from __future__ import annotations

import tempfile
from typing import Any, Dict, List

import torch
import torchrec
from torchrec.distributed.model_parallel import DistributedModelParallel
from torchrec.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints, Topology
from torchrec.distributed.types import CacheParams, KeyValueParams, ShardingEnv
from torchrec.modules.embedding_configs import PoolingType
from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from torchrec_ascend import HashEmbeddingBagConfig, HashEmbeddingConfig, get_default_hybrid_sharders
from torchrec_ascend.conformance_tests.plugin.hash_tables import max_row_diff, rows_of, sharded_rows
from torchrec_ascend.conformance_tests.plugin.runner import main
from torchrec_ascend.kernels.key_value import cache_metrics
from torchrec_ascend.native import ops

DIM, BATCH, LR = 8, 4, 0.1


def make_module(case: Dict[str, Any], capacity: int) -> torch.nn.Module:
    common = dict(embedding_dim=DIM, num_embeddings=capacity, init_seed=5, weight_init_min=-0.2, weight_init_max=0.2)
    if case["module"] == "ec":
        return torchrec.EmbeddingCollection(tables=[
            HashEmbeddingConfig(name="t", feature_names=["f", "g"], **common)  # two features share the table
        ])
    pooling = PoolingType.MEAN if case.get("pooling") == "mean" else PoolingType.SUM
    return torchrec.EmbeddingBagCollection(tables=[
        HashEmbeddingBagConfig(name="t", feature_names=["f", "g"], pooling=pooling, **common)
    ], is_weighted=bool(case.get("weighted")))


def shard(module: torch.nn.Module, key_value: bool, load_factor: float, pg: Any, directory: str,
          rowwise: bool = False) -> Any:
    # fbgemm's variable-batch lookups (even in eval) take row-wise Adagrad, not Adagrad
    optimizer = torchrec.optim.RowWiseAdagrad if rowwise else torch.optim.Adagrad
    apply_optimizer_in_backward(optimizer, module.parameters(), {"lr": LR, "eps": 1e-8})
    constraints = {"t": ParameterConstraints(
        sharding_types=["row_wise"], compute_kernels=["key_value" if key_value else "fused"],
        cache_params=CacheParams(load_factor=load_factor) if key_value else None,
        key_value_params=KeyValueParams(ssd_storage_directory=directory) if key_value else None,
    )}
    planner = EmbeddingShardingPlanner(topology=Topology(world_size=pg.size(), compute_device="cpu"),
                                       constraints=constraints)
    sharders = get_default_hybrid_sharders()
    return DistributedModelParallel(module, env=ShardingEnv.from_process_group(pg), device=torch.device("cpu"),
                                    plan=planner.plan(module, sharders), sharders=sharders)


def ids_owned_by_each_rank(per_rank: int, world: int) -> torch.Tensor:
    """``per_rank`` raw IDs for every rank (rank-major), by the row-wise hash placement."""
    candidates = torch.arange(1000, 1000 + 64 * per_rank * world) * 7_919
    owner = ops.hash_rank(candidates, world)
    return torch.cat([candidates[owner == r][:per_rank] for r in range(world)])


def batch(ids: torch.Tensor, step: int, rank: int, weighted: bool, vbe: bool = False) -> KeyedJaggedTensor:
    """``BATCH`` samples per feature (2 features) drawing from ``ids``, every ID present at least once; ``vbe``:
    feature ``g`` has ``BATCH - 1 - rank`` samples, expanded back to ``BATCH`` in the output."""
    gen = torch.Generator().manual_seed(100 * step + rank)
    samples = [BATCH, BATCH - 1 - rank] if vbe else [BATCH, BATCH]
    lengths = torch.randint(0, 4, (sum(samples),), generator=gen)
    lengths[0] = lengths[0] + ids.numel()
    values = torch.cat([ids, ids[torch.randint(0, ids.numel(), (int(lengths.sum()) - ids.numel(),), generator=gen)]])
    weights = torch.rand(values.numel(), generator=gen) if weighted else None
    if vbe:
        inverse = torch.stack([torch.arange(BATCH) % n for n in samples])
        return KeyedJaggedTensor(keys=["f", "g"], values=values, lengths=lengths, weights=weights,
                                 stride_per_key_per_rank=[[n] for n in samples], inverse_indices=(["f", "g"], inverse))
    return KeyedJaggedTensor.from_lengths_sync(keys=["f", "g"], values=values, lengths=lengths, weights=weights)


def train_step(models: List[Any], kjt: KeyedJaggedTensor, kind: str, seed: int) -> float:
    outs = []
    for model in models:
        out = torch.cat(rows_of(kind, model(kjt), kjt), dim=1 if kind == "ebc" else 0)
        (out * torch.randn(out.shape, generator=torch.Generator().manual_seed(seed))).sum().backward()
        outs.append(out.detach())
    return (outs[0] - outs[1]).abs().max().item() if outs[0].numel() else 0.0


def eval_step(models: List[Any], kjt: KeyedJaggedTensor, kind: str) -> float:
    outs = []
    with torch.no_grad():
        for model in models:
            model.eval()
            outs.append(torch.cat(rows_of(kind, model(kjt), kjt), dim=1 if kind == "ebc" else 0))
            model.train()
    return (outs[0] - outs[1]).abs().max().item() if outs[0].numel() else 0.0


def run_case(case: Dict[str, Any], pg: Any) -> Dict[str, Any]:
    rank, world, kind = pg.rank(), pg.size(), case["module"]
    weighted = bool(case.get("weighted"))
    with tempfile.TemporaryDirectory(prefix="kv_edges_") as directory:
        if case["kind"] == "full_cache":
            fused = shard(make_module(case, 64), False, 1.0, pg, directory)
            cached = shard(make_module(case, 5 * world), True, 1.0, pg, directory)
            ids = ids_owned_by_each_rank(5, world)  # every row of every shard, from every rank
            fwd_err = max(train_step([fused, cached], batch(ids, s, rank, weighted), kind, s) for s in range(4))
            eval_err = eval_step([fused, cached], batch(ids, 9, rank, weighted), kind)
            eval_rows = 5
        else:
            vbe = bool(case.get("vbe"))
            fused = shard(make_module(case, 1024), False, 1.0, pg, directory, rowwise=vbe)
            cached = shard(make_module(case, 512 * world), True, 8 / 512, pg, directory, rowwise=vbe)  # 8 per shard
            small = ids_owned_by_each_rank(3, world)
            big = ids_owned_by_each_rank(60, world)
            unknown = ids_owned_by_each_rank(70, world)[-10:]  # never trained: the not-admitted vector
            fwd_err, eval_err = 0.0, 0.0
            for s in range(3):
                step_ids = big.view(world, -1)[:, s * 4:(s + 1) * 4].reshape(-1)  # 4 per shard
                fwd_err = max(fwd_err, train_step([fused, cached], batch(step_ids, s, rank, weighted, vbe), kind, s))
                eval_batch = batch(torch.cat([big, unknown]), s, rank, weighted, vbe)
                eval_err = max(eval_err, eval_step([fused, cached], eval_batch, kind))
            fwd_err = max(fwd_err, train_step([fused, cached], batch(small, 7, rank, weighted, vbe), kind, 7))
            eval_rows = 60
        row_err = max_row_diff(sharded_rows(fused, pg), sharded_rows(cached, pg))
        evicted = sum(m["evicted"] for m in cache_metrics(cached).values())
    return {"fwd_err": fwd_err, "eval_err": eval_err, "row_err": row_err, "evicted": evicted, "eval_rows": eval_rows}


if __name__ == "__main__":
    main(__doc__, run_case, worst=("fwd_err", "eval_err", "row_err"), totals=("evicted",))
