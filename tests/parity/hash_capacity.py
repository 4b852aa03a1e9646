"""A row_wise hash table of ``num_embeddings`` rows on 2 ranks holds exactly that many IDs, against a Python model.

Run with torchrun (``conformance_tests/launch.py``); each case is ``{"kind": "ebc" | "ec"}``. The table has 8 rows
(4 per shard); the IDs are picked by the pure-Python placement reference (``hash_rank``) so each shard receives
exactly its 4, with distinct last uses. The model is a plain-Python LRU dict per shard: 8 distinct IDs must all be
held with nothing evicted or rejected and every output row the ID's initial row (no ID reads the not-admitted
vector); a 9th ID must evict exactly the least recently used ID of its shard, and nothing on the other shard.

Reported: ``mismatch`` (the first step where a shard's IDs or counters differ from the model, "" if none),
``fwd_err`` and the summed ``evicted`` / ``rejected`` counters.
"""

from __future__ import annotations

import collections
from typing import Any, Dict, List

import torch
import torch.distributed as dist
import torchrec
from torchrec.distributed.model_parallel import DistributedModelParallel
from torchrec.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints, Topology
from torchrec.distributed.types import ShardingEnv
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from torchrec_ascend import HashEmbeddingBagConfig, HashEmbeddingConfig, get_default_hybrid_sharders
from torchrec_ascend.conformance_tests.plugin.runner import main
from torchrec_ascend.kernels.fused import HashRows
from torchrec_ascend.kernels.walk import sharded_kernels
from torchrec_ascend.native import reference

ROWS, DIM, SEED = 8, 8, 5
INIT = (-0.25, 0.25)


def pick_ids(world: int) -> List[List[int]]:
    """Per rank, the IDs placed on its shard (the placement reference), ROWS // world + 1 of them."""
    candidates = torch.arange(64, dtype=torch.int64) * 7_919 + 2**40
    owner = reference.hash_rank(candidates, world)
    return [candidates[owner == r][: ROWS // world + 1].tolist() for r in range(world)]


def steps(per_shard: List[List[int]]) -> List[List[int]]:
    """The global batches: each shard's IDs one per step (distinct last uses), its first ID again, then one more
    ID for shard 0 (the table then holds ROWS + 1 distinct IDs)."""
    share = ROWS // len(per_shard)
    out = [[ids[k] for ids in per_shard] for k in range(share)]
    return out + [[per_shard[0][0]], [per_shard[0][share]]]


def build(kind: str, pg: Any) -> Any:
    if kind == "ec":
        module: Any = torchrec.EmbeddingCollection(tables=[HashEmbeddingConfig(
            name="t", embedding_dim=DIM, num_embeddings=ROWS, feature_names=["f"], overflow="evict",
            eviction_policy="lru", init_seed=SEED, weight_init_min=INIT[0], weight_init_max=INIT[1])])
    else:
        module = torchrec.EmbeddingBagCollection(tables=[HashEmbeddingBagConfig(
            name="t", embedding_dim=DIM, num_embeddings=ROWS, feature_names=["f"], overflow="evict",
            eviction_policy="lru", init_seed=SEED, weight_init_min=INIT[0], weight_init_max=INIT[1])])
    planner = EmbeddingShardingPlanner(topology=Topology(world_size=pg.size(), compute_device="cpu"),
                                       constraints={"t": ParameterConstraints(sharding_types=["row_wise"])})
    sharders = get_default_hybrid_sharders()
    return DistributedModelParallel(module, env=ShardingEnv.from_process_group(pg), device=torch.device("cpu"),
                                    plan=planner.plan(module, sharders), sharders=sharders)


def run_case(case: Dict[str, Any], pg: Any) -> Dict[str, Any]:
    rank, world = pg.rank(), pg.size()
    dmp = build(case["kind"], pg)
    table = next(k for k in sharded_kernels(dmp) if isinstance(k, HashRows)).slot_table(0)
    per_shard = pick_ids(world)
    model = [collections.OrderedDict() for _ in range(world)]  # per shard: ID -> None, least recently used first
    evicted_model = [0] * world
    mismatch, fwd_err = "", 0.0
    for step, ids in enumerate(steps(per_shard)):
        mine = ids if rank == 0 else []  # rank 0 sends the batch, the other ranks an empty one
        features = KeyedJaggedTensor.from_lengths_sync(keys=["f"], values=torch.tensor(mine, dtype=torch.int64),
                                                       lengths=torch.tensor([len(mine)]))
        out = dmp(features)
        values = out.values() if case["kind"] == "ebc" else out["f"].values()
        expected = reference.hash_uniform_init(torch.tensor(mine, dtype=torch.int64), SEED, DIM, *INIT)
        if case["kind"] == "ebc":
            expected = expected.sum(0, keepdim=True)
        fwd_err = max(fwd_err, (values.detach() - expected).abs().max().item() if values.numel() else 0.0)
        for i in ids:
            shard = int(reference.hash_rank(torch.tensor([i]), world))
            model[shard].pop(i, None)
            if len(model[shard]) == ROWS // world:
                model[shard].popitem(last=False)
                evicted_model[shard] += 1
            model[shard][i] = None
        held: List[Any] = [None] * world
        dist.all_gather_object(held, (sorted(table.id_map.export()[0].tolist()), dict(table.counters)), group=pg)
        for shard, (shard_ids, counters) in enumerate(held):
            expected_state = (sorted(model[shard]), evicted_model[shard], 0)
            if not mismatch and (shard_ids, counters["evicted"], counters["rejected"]) != expected_state:
                mismatch = (f"step {step}, shard {shard}: holds {shard_ids} (evicted {counters['evicted']}, rejected "
                            f"{counters['rejected']}), the model {expected_state}")
    return {"mismatch": mismatch, "fwd_err": fwd_err, "evicted": table.counters["evicted"],
            "rejected": table.counters["rejected"], "held": len(table)}


if __name__ == "__main__":
    main(__doc__, run_case, worst=("fwd_err",), totals=("evicted", "rejected", "held"))
