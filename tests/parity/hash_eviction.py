"""Sharded hash tables under eviction (2 ranks, row_wise, more distinct IDs than rows) against plain-Python models.

Run with torchrun (``conformance_tests/launch.py``); each case is ``{"policy": NAME}`` for a built-in eviction
policy. One table of 16 IDs per shard is read by two features (a step is a batch) and trained with SGD on batches
drawn from 60 IDs. Two oracles:

* every shard's policy is wrapped in the plain-Python reference of its ranking (``tests/policies/policy_reference.py``):
  each victim (and expired set) must be among the lowest-scoring rows (ties are the policy's to break);
* a dict ``ID -> row`` (deterministic initial rows, SGD written out) that drops the IDs the shards no longer hold
  and gives a returning ID a fresh row: every step's output and every final row must equal it.

Reported: ``fwd_err``, ``row_err`` (<= 1e-6), ``evicted`` (summed over ranks) and ``error`` (a reference check that
failed, with its step).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Dict, List, Tuple

import torch
import torchrec
from torchrec.distributed.model_parallel import DistributedModelParallel
from torchrec.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints, Topology
from torchrec.distributed.types import ShardingEnv
from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from torchrec_ascend import HashEmbeddingBagConfig, get_default_hybrid_sharders
from torchrec_ascend.conformance_tests.plugin.hash_tables import sharded_rows
from torchrec_ascend.conformance_tests.plugin.runner import main
from torchrec_ascend.kernels.fused import HashRows
from torchrec_ascend.kernels.walk import sharded_kernels
from torchrec_ascend.native import reference

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "policies"))
from policy_reference import (
    EpochLFURef,
    EpochLRURef,
    LFURef,
    LRURef,
    ReferenceTee,
    ShowClickRef,
    TTLRef,
)

CAPACITY, DIM, LR, SEED, STEPS, POOL, BATCH = 16, 8, 0.5, 3, 40, 60, 2
INIT = (-0.25, 0.25)
FEATURES = ["f", "g"]
POLICIES: Dict[str, Tuple[Dict[str, Any], Any, float]] = {
    "lru": ({}, LRURef, 0.0),
    "lfu": ({}, LFURef, 0.0),
    "epoch_lru": ({"epoch_steps": 3}, lambda: EpochLRURef(3), 0.0),
    "epoch_lfu": ({"epoch_steps": 3}, lambda: EpochLFURef(3), 0.0),
    "ttl": ({"ttl_steps": 4}, lambda: TTLRef(4), 0.0),
    "showclick": ({"alpha": 1.0, "beta": 3.0, "score_decay": 0.8, "evict_percentage": 0.3},
                  lambda: ShowClickRef(1.0, 3.0, 0.8, 0.3), 1e-9),
}
IDS = (torch.arange(POOL) * 7_919 + 2**40).tolist()


def batch(step: int, rank: int) -> List[List[List[int]]]:
    """Per feature, ``BATCH`` samples of up to 2 IDs (a hot set and a tail): at most 16 IDs over both ranks."""
    gen = torch.Generator().manual_seed(97 * step + rank)
    out = []
    for _ in FEATURES:
        samples = []
        for _ in range(BATCH):
            n = int(torch.randint(0, 3, (1,), generator=gen))
            hot = torch.randint(0, 8, (n,), generator=gen)
            tail = torch.randint(0, POOL, (n,), generator=gen)
            picks = torch.where(torch.rand(n, generator=gen) < 0.4, hot, tail)
            samples.append([IDS[i] for i in picks.tolist()])
        out.append(samples)
    return out


def kjt(samples: List[List[List[int]]]) -> KeyedJaggedTensor:
    flat = [s for feature in samples for s in feature]
    return KeyedJaggedTensor.from_lengths_sync(
        keys=FEATURES, values=torch.tensor([i for s in flat for i in s], dtype=torch.int64),
        lengths=torch.tensor([len(s) for s in flat]),
    )


def upstream(step: int, rank: int) -> torch.Tensor:
    return torch.randn(BATCH, DIM * len(FEATURES), generator=torch.Generator().manual_seed(13 * step + rank))


def build(policy: str, pg: Any) -> Any:
    options, make_ref, tolerance = POLICIES[policy]
    module = torchrec.EmbeddingBagCollection(tables=[HashEmbeddingBagConfig(
        name="t", embedding_dim=DIM, num_embeddings=CAPACITY * pg.size(), feature_names=FEATURES,
        overflow="evict", eviction_policy=policy, eviction_options=options, init_seed=SEED,
        weight_init_min=INIT[0], weight_init_max=INIT[1],
    )])
    apply_optimizer_in_backward(torch.optim.SGD, module.parameters(), {"lr": LR})
    planner = EmbeddingShardingPlanner(topology=Topology(world_size=pg.size(), compute_device="cpu"),
                                       constraints={"t": ParameterConstraints(sharding_types=["row_wise"])})
    sharders = get_default_hybrid_sharders()
    dmp = DistributedModelParallel(module, env=ShardingEnv.from_process_group(pg), device=torch.device("cpu"),
                                   plan=planner.plan(module, sharders), sharders=sharders)
    tables = [t for k in sharded_kernels(dmp) if isinstance(k, HashRows) for t in k._slot_tables]
    for table in tables:
        table.eviction = ReferenceTee(table.eviction, make_ref(), tolerance)
    return dmp, tables


def run_case(case: Dict[str, Any], pg: Any) -> Dict[str, Any]:
    rank, world = pg.rank(), pg.size()
    dmp, tables = build(case["policy"], pg)
    rows: Dict[int, torch.Tensor] = {}
    fwd_err = 0.0
    for step in range(STEPS):
        samples = [batch(step, r) for r in range(world)]
        out = dmp(kjt(samples[rank])).values()
        held = {i for _, i in sharded_rows(dmp, pg)}
        for i in set(rows) - held:  # evicted: a returning ID starts afresh
            del rows[i]
        for i in sorted({i for s in samples for f in s for b in f for i in b} - set(rows)):
            rows[i] = reference.hash_uniform_init(torch.tensor([i]), SEED, DIM, *INIT)[0]
        expected = torch.cat([torch.stack([sum((rows[i] for i in b), torch.zeros(DIM)) for b in f])
                              for f in samples[rank]], dim=1)
        fwd_err = max(fwd_err, (out.detach() - expected).abs().max().item())
        (out * upstream(step, rank)).sum().backward()
        grads: Dict[int, torch.Tensor] = {}
        for r in range(world):  # TorchRec averages embedding gradients over ranks
            g = upstream(step, r) / world
            for k, feature in enumerate(samples[r]):
                for j, bag in enumerate(feature):
                    for i in bag:
                        grads[i] = grads.get(i, torch.zeros(DIM)) + g[j, k * DIM:(k + 1) * DIM]
        for i, g in grads.items():
            rows[i] = rows[i] - LR * g
    final = sharded_rows(dmp, pg)
    row_err = max((final[("t", i)] - r).abs().max().item() for i, r in rows.items()) if set(
        i for _, i in final) == set(rows) else float("inf")
    return {"fwd_err": fwd_err, "row_err": row_err, "evicted": sum(t.counters["evicted"] for t in tables)}


if __name__ == "__main__":
    main(__doc__, run_case, worst=("fwd_err", "row_err"), totals=("evicted",))
