"""A table read by several features takes one policy step per batch, unsharded and sharded alike.

One case of ``plugin/hash_tables.py`` (``{"promise": "policy_steps", "kind": "ebc", "sharding_type":
"unsharded"|<type>, "kernel": "fused"|"key_value"}``). Hash table ``item`` is read by features ``f_a`` and ``f_b``,
table ``user`` by ``f_user`` alone, both with LRU eviction (``overflow="evict"``, so every batch steps the policies
and the step decides what is evicted). :data:`STEPS` training batches, every feature holding IDs in every sample.

Oracle: the number of batches trained. Reported: ``steps`` (table -> the step of every shard of it, from every rank;
a step per feature would make ``item``'s twice ``user``'s) and ``residency``.
"""

from __future__ import annotations

import tempfile
from typing import Any, Dict, List

import torch
import torch.distributed as dist
import torchrec
from torchrec.distributed.planner import ParameterConstraints
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from torchrec_ascend import HashEmbeddingBagConfig
from torchrec_ascend.conformance_tests.launch import script_device
from torchrec_ascend.conformance_tests.plugin.runner import key_value_options, planned, residency
from torchrec_ascend.kernels.fused import HashRows
from torchrec_ascend.kernels.walk import sharded_kernels

FEATURES = {"user": ["f_user"], "item": ["f_a", "f_b"]}
ROWS, DIM, STEPS, BATCH = 128, 8, 5, 4  # rows per table (a KEY_VALUE table: its device cache holds half)


def build(case: Dict[str, Any], pg: Any, directory: str) -> torch.nn.Module:
    ebc = torchrec.EmbeddingBagCollection(tables=[
        HashEmbeddingBagConfig(name=name, embedding_dim=DIM, num_embeddings=ROWS, feature_names=features,
                               overflow="evict", eviction_policy="lru")
        for name, features in FEATURES.items()
    ])
    device = script_device()
    if case["sharding_type"] == "unsharded":
        return ebc.to(device)
    constraints = {name: ParameterConstraints(sharding_types=[case["sharding_type"]], compute_kernels=[case["kernel"]],
                                              **key_value_options(case["kernel"], 0.5, 1, directory))
                   for name in FEATURES}
    return planned(ebc, constraints, pg)


def make_batch(step: int, rank: int) -> KeyedJaggedTensor:
    """One ID per sample and feature, from a pool larger than a table (so the policies evict)."""
    gen = torch.Generator().manual_seed(100 * step + rank)
    keys = [f for features in FEATURES.values() for f in features]
    return KeyedJaggedTensor.from_lengths_sync(keys=keys, values=torch.randint(0, 4 * ROWS, (len(keys) * BATCH,),
                                                                               generator=gen),
                                               lengths=torch.ones(len(keys) * BATCH, dtype=torch.int64))


def table_steps(model: torch.nn.Module, pg: Any, sharded: bool) -> Dict[str, List[int]]:
    """Table -> the step of each of its shards (every rank's), or of the unsharded module's slot table."""
    if not sharded:
        ebc: Any = model.embedding_bags
        return {name: [ebc[name].slots.step] for name in FEATURES}
    local: List[Any] = [(name, k.slot_table(t).step) for k in sharded_kernels(model) if isinstance(k, HashRows)
                        for t, name in enumerate(k.hash_stats())]
    gathered: List[Any] = [None] * pg.size()
    dist.all_gather_object(gathered, local, group=pg)
    steps: Dict[str, List[int]] = {}
    for name, step in (entry for part in gathered for entry in part):
        steps.setdefault(name, []).append(step)
    return steps


def run(case: Dict[str, Any], pg: Any) -> Dict[str, Any]:
    rank, device = pg.rank(), script_device()
    sharded = case["sharding_type"] != "unsharded"
    with tempfile.TemporaryDirectory(prefix="policy_steps_") as directory:
        model = build(case, pg, directory)
        for step in range(STEPS):
            batch = make_batch(step, rank if sharded else 0).to(device)
            out = model(batch).values()
            out.sum().backward()
        steps = table_steps(model, pg, sharded)
        optimizer = {"optimizer": [model.fused_optimizer]} if sharded else {}
        where = residency(parameters=model, inputs=batch, outputs=out, **optimizer)
        del model
    return {"steps": steps, "batches": STEPS, "residency": where}
