"""Hash tables with the inputs users send, 2 ranks, against the unsharded hash collection on the global batch.

Run with torchrun (``conformance_tests/launch.py``); each case is ``{"kernel": "fused"|"key_value", "sharding_type":
..., "input": "int32"|"weighted"|"mean"}``: int32 IDs and lengths (IDs below 2**31), per-sample weights (a function
of the ID, so the local and global batches agree), or MEAN pooling. Both models train with SGD fused into backward
(unsharded: applied in backward); reported: the largest forward difference over all steps and the largest final
row difference (every ID seen, gathered from every shard and tier).
"""

from __future__ import annotations

import tempfile
from typing import Any, Dict

import torch
import torchrec
from torchrec.distributed.model_parallel import DistributedModelParallel
from torchrec.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints, Topology
from torchrec.distributed.types import CacheParams, KeyValueParams, ShardingEnv
from torchrec.modules.embedding_configs import PoolingType
from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from torchrec_ascend import HashEmbeddingBagConfig, get_default_hybrid_sharders
from torchrec_ascend.conformance_tests.plugin.hash_tables import (
    TABLES,
    concat,
    max_row_diff,
    rank_batches,
    rows_of,
    sharded_rows,
    split_global,
    unsharded_rows,
    upstream,
)
from torchrec_ascend.conformance_tests.plugin.runner import main

DIM, LR, STEPS = 16, 0.1, 6


def make_module(case: Dict[str, Any]) -> torch.nn.Module:
    pooling = PoolingType.MEAN if case["input"] == "mean" else PoolingType.SUM
    module = torchrec.EmbeddingBagCollection(tables=[
        HashEmbeddingBagConfig(name=n, num_embeddings=c, embedding_dim=DIM, feature_names=[f"f_{n}"], init_seed=s,
                               pooling=pooling, weight_init_min=-0.25, weight_init_max=0.25)
        for n, c, s in TABLES
    ], is_weighted=case["input"] == "weighted")
    apply_optimizer_in_backward(torch.optim.SGD, module.parameters(), {"lr": LR})
    return module


def shard(module: torch.nn.Module, case: Dict[str, Any], pg: Any, directory: str) -> Any:
    key_value = case["kernel"] == "key_value"
    constraints = {n: ParameterConstraints(
        sharding_types=[case["sharding_type"]], compute_kernels=[case["kernel"]],
        cache_params=CacheParams(load_factor=1.0) if key_value else None,
        key_value_params=KeyValueParams(ssd_storage_directory=directory) if key_value else None,
    ) for n, _, _ in TABLES}
    planner = EmbeddingShardingPlanner(topology=Topology(world_size=pg.size(), compute_device="cpu"),
                                       constraints=constraints)
    sharders = get_default_hybrid_sharders()
    return DistributedModelParallel(module, env=ShardingEnv.from_process_group(pg), device=torch.device("cpu"),
                                    plan=planner.plan(module, sharders), sharders=sharders)


def as_input(batch: KeyedJaggedTensor, case: Dict[str, Any], local: bool) -> KeyedJaggedTensor:
    """The batch as the case sends it: int32 (the sharded model's local batch only), weighted, or as is."""
    values = batch.values() % (2**31 - 1) if case["input"] == "int32" else batch.values()
    weights = ((values % 7) + 1).float() / 4 if case["input"] == "weighted" else None
    index = torch.int32 if case["input"] == "int32" and local else torch.int64
    return KeyedJaggedTensor.from_lengths_sync(keys=batch.keys(), values=values.to(index),
                                               lengths=batch.lengths().to(index), weights=weights)


def run_case(case: Dict[str, Any], pg: Any) -> Dict[str, Any]:
    rank, world = pg.rank(), pg.size()
    with tempfile.TemporaryDirectory(prefix="hash_inputs_") as directory:
        dmp = shard(make_module(case), case, pg, directory)
        unsharded = make_module(case)
        fwd_err = 0.0
        for step in range(STEPS):
            batches = [as_input(b, case, local=False) for b in rank_batches(step, world)]
            ref_blocks = rows_of("ebc", unsharded(concat_weighted(batches)), batches[0])
            local = as_input(rank_batches(step, world)[rank], case, local=True)
            mine = torch.cat(rows_of("ebc", dmp(local), local), dim=1)
            fwd_err = max(fwd_err, (mine.detach() - split_global("ebc", ref_blocks, batches, rank)).abs().max().item())
            (mine * upstream("ebc", mine, step, rank)).sum().backward()
            ref = [split_global("ebc", ref_blocks, batches, r) for r in range(world)]
            (sum((x * upstream("ebc", x, step, r)).sum() for r, x in enumerate(ref)) / world).backward()
        row_err = max_row_diff(sharded_rows(dmp, pg), unsharded_rows(unsharded, "ebc"))
    return {"fwd_err": fwd_err, "row_err": row_err}


def concat_weighted(batches: list) -> KeyedJaggedTensor:
    """:func:`concat` keeping per-sample weights (recomputed from the IDs, as :func:`as_input` makes them)."""
    merged = concat(batches)
    if batches[0].weights_or_none() is None:
        return merged
    weights = ((merged.values() % 7) + 1).float() / 4
    return KeyedJaggedTensor.from_lengths_sync(keys=merged.keys(), values=merged.values(), lengths=merged.lengths(),
                                               weights=weights)


if __name__ == "__main__":
    main(__doc__, run_case, worst=("fwd_err", "row_err"))
