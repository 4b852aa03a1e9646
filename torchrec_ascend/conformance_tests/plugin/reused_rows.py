"""A reused row starts with fresh optimizer state: an ID that takes over an evicted ID's row trains as a new row.

One case of ``plugin/hash_tables.py`` (``{"promise": "reused_row", "kind": "ebc", "sharding_type": ...,
"kernel": "fused"|"key_value", "optimizer": "rowwise_adagrad"|"adam"}``). A hash table of :data:`SHARD_ROWS` rows
per shard (FUSED: ``num_embeddings``, ``overflow="evict"``; KEY_VALUE: the device cache, over host memory) trains
in two phases with row-wise Adagrad or Adam, whose per-row state is what a reused row must not inherit:

1. the IDs of ``A`` (more than a shard holds), each once: every row of every shard is taken and trained, so every
   row holds optimizer state;
2. the IDs of ``B`` (never seen, at most a shard's rows in all): the first batch brings all of them, so each takes a
   row an ``A`` ID held (evicted: FUSED drops it, KEY_VALUE writes it to host memory); later batches bring only
   ``B``, so nothing is evicted again.

Oracle, sharing no code with the kernels: each ``B`` ID as a brand-new row in plain Python: its initial value from
:func:`torchrec_ascend.native.reference.hash_uniform_init` (the pure-Python reference of the native initialiser) and
row-wise Adagrad or Adam (fbgemm's: both moments from zero, bias correction by the table's step count) written out
from zero state, on the gradients the loss gives it (the loss is linear in the pooled outputs, so a row's gradient
does not depend on any row). Reported: ``fwd_err`` (the phase-2 outputs vs. the
oracle's), ``row_err`` (the final ``B`` rows, from every tier, vs. the oracle's; inf if a ``B`` ID lost its row),
``full`` (every shard was full before phase 2), ``reused`` (rows evicted in phase 2, at least one per ``B`` ID) and
``new_ids`` (``len(B)``), ``residency``.
"""

from __future__ import annotations

import tempfile
from typing import Any, Dict, List, Optional, Tuple

import torch
import torch.distributed as dist
import torchrec
from torchrec.distributed.model_parallel import DistributedModelParallel
from torchrec.distributed.planner import ParameterConstraints
from torchrec.optim import RowWiseAdagrad
from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from torchrec_ascend import HashEmbeddingBagConfig
from torchrec_ascend.conformance_tests.launch import script_device
from torchrec_ascend.conformance_tests.plugin.runner import key_value_options, planned, residency
from torchrec_ascend.kernels.fused import HashRows
from torchrec_ascend.kernels.walk import sharded_kernels
from torchrec_ascend.native import reference

TABLE, FEATURE, SEED, DIM = "item", "f_item", 11, 8
INIT, LR, EPS = (-0.25, 0.25), 0.1, 1e-8
BETAS = (0.9, 0.999)  # Adam's defaults (torch's and fbgemm's): what the case trains with
SHARD_ROWS = 16  # rows per shard: FUSED's capacity, KEY_VALUE's device cache
KEY_VALUE_SHARD_ROWS = 512  # a KEY_VALUE shard's IDs (the cache holds SHARD_ROWS of them)
BATCH, BAG = 4, 2  # phase 1: samples per rank, IDs per sample
PHASE1_STEPS, PHASE2_STEPS = 3, 4
NEW_IDS = 12  # len(B): at most SHARD_ROWS, so B fits any shard however the IDs hash


def id_sets(world: int) -> Tuple[List[int], List[int]]:
    """``A``: every phase-1 ID, once each (``PHASE1_STEPS * world * BATCH * BAG`` of them); ``B``: the new IDs."""
    a = [10**12 + 7919 * k for k in range(PHASE1_STEPS * world * BATCH * BAG)]
    b = [2 * 10**12 + 104_729 * k for k in range(NEW_IDS)]
    return a, b


def batch_ids(step: int, rank: int, world: int) -> List[List[int]]:
    """``rank``'s bags at ``step``: phase 1 a slice of ``A``; phase 2 all of ``B`` split over the ranks first, then
    random bags of ``B`` (1-3 IDs, repeats allowed)."""
    a, b = id_sets(world)
    if step < PHASE1_STEPS:
        start = (step * world + rank) * BATCH * BAG
        return [a[start + s * BAG:start + (s + 1) * BAG] for s in range(BATCH)]
    if step == PHASE1_STEPS:
        mine = b[rank::world]
        return [mine[s:s + 2] for s in range(0, len(mine), 2)] or [[]]
    gen = torch.Generator().manual_seed(1000 * step + rank)
    return [[b[int(i)] for i in torch.randint(0, len(b), (int(n),), generator=gen)]
            for n in torch.randint(1, 4, (BATCH,), generator=gen)]


def upstream(step: int, rank: int, samples: int) -> torch.Tensor:
    return torch.randn(samples, DIM, generator=torch.Generator().manual_seed(31 * step + rank))


def build(kernel: str, sharding_type: str, pg: Any, directory: str, shards: Optional[int] = None,
          optimizer: str = "rowwise_adagrad") -> DistributedModelParallel:
    """The table as ``shards`` shards would hold it (default: as many as ``sharding_type`` makes on ``pg``), sharded
    ``sharding_type`` on ``pg``, ``optimizer`` (row-wise Adagrad or Adam) fused; KEY_VALUE's disk tier under
    ``directory``."""
    world = pg.size()
    shards = shards or (world if sharding_type == "row_wise" else 1)
    key_value = kernel == "key_value"
    ebc = torchrec.EmbeddingBagCollection(tables=[HashEmbeddingBagConfig(
        name=TABLE, embedding_dim=DIM, feature_names=[FEATURE], init_seed=SEED, weight_init_min=INIT[0],
        weight_init_max=INIT[1], num_embeddings=(KEY_VALUE_SHARD_ROWS if key_value else SHARD_ROWS) * shards,
        overflow="evict", eviction_policy="lru",
    )])
    cls = torch.optim.Adam if optimizer == "adam" else RowWiseAdagrad  # Adam with its default betas, BETAS
    apply_optimizer_in_backward(cls, [ebc.embedding_bags[TABLE].weight], {"lr": LR, "eps": EPS})
    constraints = {TABLE: ParameterConstraints(
        sharding_types=[sharding_type], compute_kernels=[kernel],
        **key_value_options(kernel, SHARD_ROWS / KEY_VALUE_SHARD_ROWS, 1, directory))}
    return planned(ebc, constraints, pg)


class FreshRows:
    """The oracle: ``B``'s rows as brand-new rows (reference initialisation, zero state), row-wise Adagrad or Adam
    in plain Python, SUM pooling."""

    def __init__(self, ids: List[int], optimizer: str) -> None:
        init = reference.hash_uniform_init(torch.tensor(ids), SEED, DIM, *INIT)
        self.rows = {i: init[k].clone() for k, i in enumerate(ids)}
        self.state = {i: torch.zeros(()) for i in ids}
        self.moments = {i: (torch.zeros(DIM), torch.zeros(DIM)) for i in ids}
        self.adam = optimizer == "adam"

    def forward(self, bags: List[List[int]]) -> torch.Tensor:
        return torch.stack([sum((self.rows[i] for i in bag), torch.zeros(DIM)) for bag in bags])

    def step(self, grads: Dict[int, torch.Tensor], table_steps: int) -> None:
        """One update of the rows in ``grads``; ``table_steps``: the table's steps so far, this one included."""
        for i, g in grads.items():
            if self.adam:
                (beta1, beta2), (m, v) = BETAS, self.moments[i]
                m, v = beta1 * m + (1 - beta1) * g, beta2 * v + (1 - beta2) * g * g
                self.moments[i] = (m, v)
                self.rows[i] = self.rows[i] - LR * (m / (1 - beta1 ** table_steps)) / (
                    (v / (1 - beta2 ** table_steps)).sqrt() + EPS)
            else:
                self.state[i] = self.state[i] + (g * g).mean()
                self.rows[i] = self.rows[i] - LR * g / (self.state[i].sqrt() + EPS)


def shard_stats(dmp: Any, pg: Any) -> List[Dict[str, int]]:
    """Every shard's slot-table counters (size, capacity, evicted...), from every rank."""
    local = [k.slot_table(t).stats() for k in sharded_kernels(dmp) if isinstance(k, HashRows)
             for t in range(k.num_tables)]
    gathered: List[Any] = [None] * pg.size()
    dist.all_gather_object(gathered, local, group=pg)
    return [s for part in gathered for s in part]


def final_rows(dmp: Any, pg: Any) -> Dict[int, torch.Tensor]:
    """ID -> row from every tier of every shard (no column split here)."""
    local = []
    for kernel in sharded_kernels(dmp):
        if isinstance(kernel, HashRows):
            for t in range(kernel.num_tables):
                ids, rows, _ = kernel.export_rows(t)
                local.append((ids.tolist(), rows.cpu()))
    gathered: List[Any] = [None] * pg.size()
    dist.all_gather_object(gathered, local, group=pg)
    return {i: row for part in gathered for ids, rows in part for i, row in zip(ids, rows)}


def run(case: Dict[str, Any], pg: Any) -> Dict[str, Any]:
    rank, world, device = pg.rank(), pg.size(), script_device()
    _, new_ids = id_sets(world)
    oracle = FreshRows(new_ids, case["optimizer"])
    fwd_err, full, evicted_before = 0.0, False, 0
    with tempfile.TemporaryDirectory(prefix="reused_rows_") as directory:
        dmp = build(case["kernel"], case["sharding_type"], pg, directory, optimizer=case["optimizer"])
        for step in range(PHASE1_STEPS + PHASE2_STEPS):
            if step == PHASE1_STEPS:
                stats = shard_stats(dmp, pg)
                full = all(s["size"] == s["capacity"] == SHARD_ROWS for s in stats)
                evicted_before = sum(s["evicted"] for s in stats)
            all_bags = [batch_ids(step, r, world) for r in range(world)]
            bags = all_bags[rank]
            kjt = KeyedJaggedTensor.from_lengths_sync(
                keys=[FEATURE], values=torch.tensor([i for bag in bags for i in bag], dtype=torch.int64),
                lengths=torch.tensor([len(bag) for bag in bags]),
            ).to(device)
            out = dmp(kjt).to_dict()[FEATURE]
            (out * upstream(step, rank, len(bags)).to(out.device)).sum().backward()
            if step < PHASE1_STEPS:
                continue
            fwd_err = max(fwd_err, (out.detach().cpu() - oracle.forward(bags)).abs().max().item())
            grads: Dict[int, torch.Tensor] = {}
            for r, rank_bags in enumerate(all_bags):  # TorchRec averages embedding gradients over the ranks
                for bag, g in zip(rank_bags, upstream(step, r, len(rank_bags))):
                    for i in bag:
                        grads[i] = grads.get(i, torch.zeros(DIM)) + g / world
            oracle.step(grads, step + 1)
        reused = sum(s["evicted"] for s in shard_stats(dmp, pg)) - evicted_before
        rows = final_rows(dmp, pg)
        missing = [i for i in new_ids if i not in rows]
        row_err = float("inf") if missing else max((rows[i] - oracle.rows[i]).abs().max().item() for i in new_ids)
        where = residency(parameters=dmp, optimizer=dmp.fused_optimizer, inputs=kjt, outputs=out)
        del dmp
    return {"fwd_err": fwd_err, "row_err": row_err, "full": full, "reused": reused, "new_ids": len(new_ids),
            "residency": where}
