"""``eviction_cadence`` decides when a pool evicts, how much, and which rows it protects.

One case of ``plugin/hash_tables.py`` (``{"promise": "cadence", "kind": "ebc", "sharding_type": "table_wise",
"kernel": "fused"|"key_value"}``). Hash tables ``item`` and ``user`` (one per rank, table-wise; each a FUSED pool
of :data:`ROWS` rows, or a KEY_VALUE device cache of :data:`ROWS` rows over host memory) evict with
``eviction_policy="ttl"`` (``ttl_steps`` :data:`TTL`; under pressure the longest idle first) and
``eviction_cadence`` :data:`CADENCE`. Every rank sends a few IDs a batch per table from a small Zipf-like pool for
:data:`STEPS` training batches; after each, the pools' IDs are read.

Oracle, sharing no code with the pools: the README's rules written out in plain Python, checked batch by batch from
each pool's IDs before the batch. Batch ``s`` (1-based) brings the distinct IDs ``B`` of every rank; the pool held
``R``, and ``new = B - R`` need rows, ``free`` rows are empty. Steps ``s`` divisible by ``interval`` are bulk steps:
they drop every ID of ``R - B`` idle for more than ``TTL`` steps, and evict enough to leave
``ceil(headroom * rows)`` rows free after the batch (as far as IDs outside the batch allow). Other steps evict only
what the batch cannot fit. The evicted IDs are never the batch's; they are the longest idle (ties in any order),
among IDs inserted at least ``min_residency`` steps ago first. After the batch the pool holds ``R - evicted + B``.

Reported: ``violations`` (the first few broken rules, each naming the step), ``checked`` (batches checked),
``bulk_beyond_need`` (bulk steps that evicted more than the batch needed), ``expired_beyond_headroom`` (IDs dropped
idle beyond what the headroom alone would have evicted), ``forced`` (evictions on other steps), ``protected`` (steps
where idle order alone would have evicted a young ID) and ``residency``.
"""

from __future__ import annotations

import math
import tempfile
from typing import Any, Dict, List, Set

import torch
import torch.distributed as dist
import torchrec
from torchrec.distributed.model_parallel import DistributedModelParallel
from torchrec.distributed.planner import ParameterConstraints
from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from torchrec_ascend import HashEmbeddingBagConfig
from torchrec_ascend.conformance_tests.launch import script_device
from torchrec_ascend.conformance_tests.plugin.runner import key_value_options, planned, residency
from torchrec_ascend.kernels.fused import HashRows
from torchrec_ascend.kernels.walk import sharded_kernels

TABLES, DIM = ("item", "user"), 8  # one table per rank: a fault in a lookup strikes every rank alike
ROWS = 16  # the pool: a FUSED table's rows, a KEY_VALUE table's device cache
KEY_VALUE_ROWS = 256  # a KEY_VALUE table's IDs (its cache holds ROWS of them)
TTL, CADENCE = 4, {"interval": 3, "min_residency": 3, "headroom": 0.25}
STEPS, BATCH, POOL = 36, 3, 48  # batches, IDs per rank a batch, distinct IDs in the traffic
QUIET, HOT = range(19, 28), 4  # batches that bring only the HOT most frequent IDs, so the others expire at once


def build(kernel: str, pg: Any, directory: str) -> DistributedModelParallel:
    key_value = kernel == "key_value"
    ebc = torchrec.EmbeddingBagCollection(tables=[HashEmbeddingBagConfig(
        name=table, embedding_dim=DIM, feature_names=[f"f_{table}"],
        num_embeddings=KEY_VALUE_ROWS if key_value else ROWS, overflow="evict", eviction_policy="ttl",
        eviction_options={"ttl_steps": TTL}, eviction_cadence=CADENCE,
    ) for table in TABLES])
    apply_optimizer_in_backward(torch.optim.SGD, [ebc.embedding_bags[t].weight for t in TABLES], {"lr": 0.1})
    options = key_value_options(kernel, ROWS / KEY_VALUE_ROWS, 1, directory)
    constraints = {table: ParameterConstraints(sharding_types=["table_wise"], compute_kernels=[kernel], **options)
                   for table in TABLES}
    return planned(ebc, constraints, pg)


def batch_ids(step: int, rank: int, table: int) -> List[int]:
    """``rank``'s IDs of table ``table`` at ``step``: skewed towards the pool's low end, so some IDs recur and
    others go idle; the :data:`QUIET` batches bring only the :data:`HOT` first ones."""
    gen = torch.Generator().manual_seed(7919 * step + 31 * table + rank)
    picks = (torch.rand(BATCH, generator=gen) ** 2 * (HOT if step in QUIET else POOL)).long()
    return [10**15 + 104_729 * int(k) for k in picks]


def pool_ids(model: Any, pg: Any) -> Dict[str, Set[int]]:
    """Table -> the IDs its pool (its one shard) holds now, read on every rank."""
    local = [(name, [i for i in k.slot_table(t).slot_ids.tolist() if i >= 0])
             for k in sharded_kernels(model) if isinstance(k, HashRows) for t, name in enumerate(k.hash_stats())]
    gathered: List[Any] = [None] * pg.size()
    dist.all_gather_object(gathered, local, group=pg)
    return {name: set(ids) for part in gathered for name, ids in part}


class CadenceRules:
    """The oracle: the README's cadence rules, checked one batch at a time (module docstring)."""

    def __init__(self, table: str, rows: int) -> None:
        self.table, self.rows = table, rows
        self.spare = math.ceil(CADENCE["headroom"] * rows)
        self.last_use: Dict[int, int] = {}
        self.inserted: Dict[int, int] = {}
        self.violations: List[str] = []
        self.counts = {"checked": 0, "bulk_beyond_need": 0, "expired_beyond_headroom": 0, "forced": 0, "protected": 0}

    def check(self, step: int, held: Set[int], batch: Set[int], after: Set[int]) -> None:
        """Batch ``step`` brought ``batch`` to a pool holding ``held``; it holds ``after`` now."""
        self.counts["checked"] += 1
        bulk = step % CADENCE["interval"] == 0
        new, free = batch - held, self.rows - len(held)
        evicted = held - after
        idle = held - batch
        expired = {i for i in idle if self.last_use[i] <= step - TTL - 1} if bulk else set()
        candidates = idle - expired
        need = max(0, len(new) - free - len(expired))
        wanted = max(need, min(len(new) + self.spare - free - len(expired), len(candidates))) if bulk else need
        chosen = evicted - expired
        self._expect(after == (held - evicted) | batch, step, f"holds {sorted(after ^ ((held - evicted) | batch))} "
                     "beyond the IDs it held less those evicted plus the batch")
        self._expect(expired <= evicted, step, f"kept IDs idle for more than {TTL} steps: {sorted(expired - evicted)}")
        self._expect(not evicted & batch, step, f"evicted IDs of its own batch: {sorted(evicted & batch)}")
        self._expect(len(chosen) == wanted, step, f"evicted {len(chosen)} live IDs, the rules ask for {wanted} "
                     f"({len(new)} new, {free} free, {len(expired)} expired, bulk={bulk})")
        young = {i for i in candidates if self.inserted[i] > step - CADENCE["min_residency"]}
        mature = candidates - young
        pool = mature if len(chosen) <= len(mature) else young
        self._expect(chosen <= pool or len(chosen) > len(mature) and mature <= chosen, step,
                     f"evicted young IDs {sorted(chosen & young)} while mature ones {sorted(mature - chosen)} stayed")
        picked = chosen & pool
        if picked and pool - picked:
            self._expect(max(self.last_use[i] for i in picked) <= min(self.last_use[i] for i in pool - picked), step,
                         "evicted an ID used more recently than one it kept")
        if chosen and young and len(chosen) <= len(mature):
            self.counts["protected"] += min(self.last_use[i] for i in young) < max(self.last_use[i] for i in chosen)
        self.counts["bulk_beyond_need"] += bulk and len(chosen) > need
        self.counts["expired_beyond_headroom"] += max(0, len(expired) - max(0, len(new) + self.spare - free))
        self.counts["forced"] += 0 if bulk else len(chosen)
        for i in batch:
            self.last_use[i] = step
        for i in new:
            self.inserted[i] = step

    def _expect(self, ok: bool, step: int, what: str) -> None:
        if not ok and len(self.violations) < 5:
            self.violations.append(f"table {self.table!r}, step {step}: {what}")


def run(case: Dict[str, Any], pg: Any) -> Dict[str, Any]:
    rank, world, device = pg.rank(), pg.size(), script_device()
    rules = {table: CadenceRules(table, ROWS) for table in TABLES}
    with tempfile.TemporaryDirectory(prefix="cadence_") as directory:
        model = build(case["kernel"], pg, directory)
        held = pool_ids(model, pg)
        for step in range(1, STEPS + 1):
            ids = [batch_ids(step, rank, t) for t in range(len(TABLES))]
            batch = KeyedJaggedTensor.from_lengths_sync(
                keys=[f"f_{table}" for table in TABLES], values=torch.tensor([i for part in ids for i in part]),
                lengths=torch.ones(sum(map(len, ids)), dtype=torch.int64)).to(device)
            out = model(batch).values()
            out.sum().backward()
            after = pool_ids(model, pg)
            for t, table in enumerate(TABLES):
                brought = {i for r in range(world) for i in batch_ids(step, r, t)}
                rules[table].check(step, held[table], brought, after[table])
            held = after
        where = residency(parameters=model, optimizer=model.fused_optimizer, inputs=batch, outputs=out)
        del model
    counts = {key: sum(r.counts[key] for r in rules.values()) for key in rules[TABLES[0]].counts}
    return {"violations": [v for r in rules.values() for v in r.violations], **counts, "residency": where}
