"""Admission: a rejected ID reads ``not_admitted_value`` and gets no row; an admitted one trains as a new row.

One case of ``plugin/hash_tables.py`` (``{"promise": "admission", "kind": "ebc", "sharding_type": "table_wise",
"kernel": "fused"|"key_value"}``). Hash tables ``item`` and ``user`` (one per rank, table-wise) admit with
``admission_policy="count"``, ``admission_options={"threshold": THRESHOLD}`` (:data:`THRESHOLD`) and
``not_admitted_value`` :data:`NOT_ADMITTED`: each a FUSED table with room for every ID of the traffic (nothing is
evicted), or a KEY_VALUE table whose device cache of :data:`CACHE_ROWS` rows holds fewer than the IDs admitted
(admitted rows go down to host memory and come back, and must not be asked for admission again). Every rank sends
:data:`BATCH` bags of 1 to :data:`MAX_BAG` IDs a table for :data:`STEPS` training batches (row-wise Adagrad), from
:data:`POOL` IDs skewed towards the pool's low end, so some IDs are admitted after being rejected (every admitted
one, with this traffic) and some never.

Oracle, sharing no code with the kernels or the policies: the rule written out in plain Python (``count``'s, as
``torchrec-ascend policies`` documents it: an ID is admitted once it has been seen ``threshold`` times in total;
RecSDK's POLICY_COUNT). An ID's count is its occurrences in the batches so far, every rank's and every bag's; in the
batch that brings it to :data:`THRESHOLD` it gets a row: its initial value from
:func:`torchrec_ascend.native.reference.hash_uniform_init` (the pure-Python reference of the native initialiser),
then row-wise Adagrad from zero state written out, on the gradients the loss (linear in the pooled outputs) gives it
in that batch and after. Before that batch each of its occurrences reads the vector of :data:`NOT_ADMITTED` and
trains nothing. Checked batch by batch (each rank's pooled outputs) and at the end: the IDs holding rows in every
rank's shards (every tier) are exactly the admitted ones, with the oracle's rows.

Reported: ``fwd_err`` (the outputs vs. the oracle's, worst over batches and ranks), ``bad_steps`` (rank 0's batches
whose outputs differ), ``row_err`` (the final rows vs. the oracle's; inf when the IDs holding rows differ),
``unexpected`` (rejected IDs holding a row, a few) and ``missing`` (admitted IDs holding none, a few), ``admitted``,
``rejected`` (IDs seen, never admitted), ``late`` (admitted after reading :data:`NOT_ADMITTED` in an earlier batch),
``swapped_in`` (admitted rows that came back to a KEY_VALUE cache from host memory) and ``residency``.
"""

from __future__ import annotations

import collections
import tempfile
from typing import Any, Dict, List, Set, Tuple

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
from torchrec_ascend.kernels.key_value.kernel import KeyValueRows
from torchrec_ascend.kernels.walk import sharded_kernels
from torchrec_ascend.native import reference

TABLES = (("item", 5), ("user", 9))  # name, init seed; one table per rank: a fault strikes every rank alike
DIM, INIT, LR, EPS = 8, (-0.25, 0.25), 0.1, 1e-8
THRESHOLD, NOT_ADMITTED = 3, 0.5  # count admission; the value every element of a rejected ID's vector reads
POOL = 32  # distinct IDs a table's traffic draws from: a FUSED table holds them all
KEY_VALUE_ROWS, CACHE_ROWS = 256, 12  # a KEY_VALUE table's IDs and its device cache (a batch brings at most 12)
STEPS, BATCH, MAX_BAG = 12, 3, 2  # training batches, bags per rank and table, most IDs in a bag
DIFFERS = 1e-6  # a batch's outputs differ from the oracle's beyond this (the check's tolerance)
Key = Tuple[str, int]


def build(kernel: str, pg: Any, directory: str) -> DistributedModelParallel:
    """The two tables (module docstring), table-wise on ``pg``, row-wise Adagrad fused; KEY_VALUE's disk tier under
    ``directory``."""
    key_value = kernel == "key_value"
    ebc = torchrec.EmbeddingBagCollection(tables=[HashEmbeddingBagConfig(
        name=table, embedding_dim=DIM, feature_names=[f"f_{table}"], init_seed=seed, weight_init_min=INIT[0],
        weight_init_max=INIT[1], num_embeddings=KEY_VALUE_ROWS if key_value else POOL, admission_policy="count",
        admission_options={"threshold": THRESHOLD}, not_admitted_value=NOT_ADMITTED,
    ) for table, seed in TABLES])
    apply_optimizer_in_backward(RowWiseAdagrad, [ebc.embedding_bags[t].weight for t, _ in TABLES],
                                {"lr": LR, "eps": EPS})
    options = key_value_options(kernel, CACHE_ROWS / KEY_VALUE_ROWS, 1, directory)
    return planned(ebc, {table: ParameterConstraints(sharding_types=["table_wise"], compute_kernels=[kernel], **options)
                         for table, _ in TABLES}, pg)


def batch_bags(step: int, rank: int, table: int) -> List[List[int]]:
    """``rank``'s bags of table ``table`` at ``step``: 1 to :data:`MAX_BAG` IDs each, skewed towards the pool's low
    end (repeats allowed), so low IDs recur and high ones come seldom."""
    gen = torch.Generator().manual_seed(7919 * step + 31 * table + rank)
    lengths = torch.randint(1, MAX_BAG + 1, (BATCH,), generator=gen).tolist()
    picks = (torch.rand(sum(lengths), generator=gen) ** 2 * POOL).long().tolist()
    ids = [10**15 + 104_729 * k for k in picks]
    starts = [sum(lengths[:b]) for b in range(BATCH)]
    return [ids[s:s + n] for s, n in zip(starts, lengths)]


def upstream(step: int, rank: int, table: int) -> torch.Tensor:
    """The loss's weights on ``rank``'s pooled outputs of ``table`` at ``step`` (the loss is linear in them)."""
    return torch.randn(BATCH, DIM, generator=torch.Generator().manual_seed(1009 * step + 17 * table + rank))


class CountAdmissionRule:
    """The oracle (module docstring): per (table, ID) its count until it is admitted, then its row and row-wise
    Adagrad state; :data:`NOT_ADMITTED` for the rest."""

    def __init__(self) -> None:
        self.counts: Dict[Key, int] = collections.Counter()
        self.rows: Dict[Key, torch.Tensor] = {}
        self.state: Dict[Key, torch.Tensor] = {}
        self.late: Set[Key] = set()

    def admit(self, table: str, seed: int, occurrences: List[int]) -> None:
        """Count a batch's ``occurrences`` of ``table``'s IDs (every rank's); an ID reaching :data:`THRESHOLD` gets
        its initial row before the batch is looked up."""
        for i, n in collections.Counter(occurrences).items():
            key = (table, i)
            if key in self.rows:
                continue
            seen_before = self.counts[key] > 0
            self.counts[key] += n
            if self.counts[key] >= THRESHOLD:
                self.rows[key] = reference.hash_uniform_init(torch.tensor([i]), seed, DIM, *INIT)[0].clone()
                self.state[key] = torch.zeros(())
                if seen_before:
                    self.late.add(key)

    def forward(self, table: str, bags: List[List[int]]) -> torch.Tensor:
        """SUM-pooled rows of ``bags``: an admitted ID's row, a rejected one's vector of :data:`NOT_ADMITTED`."""
        rejected = torch.full((DIM,), NOT_ADMITTED)
        return torch.stack([sum((self.rows.get((table, i), rejected) for i in bag), torch.zeros(DIM))
                            for bag in bags])

    def step(self, table: str, bags: List[List[List[int]]], grads: List[torch.Tensor]) -> None:
        """Row-wise Adagrad on the admitted IDs of every rank's ``bags``, each bag's gradient its row of ``grads``
        (per rank) averaged over the ranks, as TorchRec averages embedding gradients; rejected IDs train nothing."""
        summed: Dict[Key, torch.Tensor] = {}
        for rank_bags, rank_grads in zip(bags, grads):
            for bag, g in zip(rank_bags, rank_grads):
                for i in bag:
                    summed[(table, i)] = summed.get((table, i), torch.zeros(DIM)) + g / len(bags)
        for key, g in summed.items():
            if key in self.rows:
                self.state[key] = self.state[key] + (g * g).mean()
                self.rows[key] = self.rows[key] - LR * g / (self.state[key].sqrt() + EPS)


def make_batch(bags: List[List[List[int]]]) -> KeyedJaggedTensor:
    """One rank's batch: per table (in :data:`TABLES` order) its bags."""
    return KeyedJaggedTensor.from_lengths_sync(
        keys=[f"f_{table}" for table, _ in TABLES],
        values=torch.tensor([i for table_bags in bags for bag in table_bags for i in bag], dtype=torch.int64),
        lengths=torch.tensor([len(bag) for table_bags in bags for bag in table_bags]))


def held_rows(model: Any, pg: Any) -> Tuple[Dict[Key, torch.Tensor], int]:
    """Every (table, ID) holding a row in any rank's shards (every tier) -> its row, and the rows swapped back into
    the shards' caches from host memory (KEY_VALUE), read on every rank."""
    local = []
    for kernel in (k for k in sharded_kernels(model) if isinstance(k, HashRows)):
        swaps: Dict[str, Dict[str, int]] = kernel.cache_stats() if isinstance(kernel, KeyValueRows) else {}
        for t, name in enumerate(kernel.hash_stats()):
            ids, rows, _ = kernel.export_rows(t)
            local.append((name, ids.tolist(), rows.cpu(), swaps.get(name, {}).get("swapped_in", 0)))
    gathered: List[Any] = [None] * pg.size()
    dist.all_gather_object(gathered, local, group=pg)
    parts = [part for rank_parts in gathered for part in rank_parts]
    held = {(name, i): row for name, ids, rows, _ in parts for i, row in zip(ids, rows)}
    return held, sum(swapped_in for *_, swapped_in in parts)


def compare_rows(held: Dict[Key, torch.Tensor], oracle: CountAdmissionRule) -> Dict[str, Any]:
    """The final rows against the oracle's: the IDs holding a row that should not, those lacking one, the largest
    difference (inf when the IDs differ) and the counts of admitted, rejected and late IDs."""
    unexpected = sorted(set(held) - set(oracle.rows))
    missing = sorted(set(oracle.rows) - set(held))
    row_err = float("inf") if unexpected or missing else max(
        ((held[k] - oracle.rows[k]).abs().max().item() for k in held), default=0.0)
    return {"row_err": row_err, "unexpected": unexpected[:5], "missing": missing[:5], "admitted": len(oracle.rows),
            "rejected": len(set(oracle.counts) - set(oracle.rows)), "late": len(oracle.late)}


def run(case: Dict[str, Any], pg: Any) -> Dict[str, Any]:
    rank, world, device = pg.rank(), pg.size(), script_device()
    oracle = CountAdmissionRule()
    fwd_err, bad_steps = 0.0, []
    with tempfile.TemporaryDirectory(prefix="admission_") as directory:
        model = build(case["kernel"], pg, directory)
        for step in range(STEPS):
            bags = [[batch_bags(step, r, t) for r in range(world)] for t in range(len(TABLES))]  # table, rank
            for (table, seed), table_bags in zip(TABLES, bags):
                oracle.admit(table, seed, [i for rank_bags in table_bags for bag in rank_bags for i in bag])
            batch = make_batch([table_bags[rank] for table_bags in bags]).to(device)
            pooled = model(batch).to_dict()
            outs = [pooled[f"f_{table}"] for table, _ in TABLES]
            sum((out * upstream(step, rank, t).to(device)).sum() for t, out in enumerate(outs)).backward()
            err = max((out.detach().cpu() - oracle.forward(table, bags[t][rank])).abs().max().item()
                      for t, ((table, _), out) in enumerate(zip(TABLES, outs)))
            fwd_err = max(fwd_err, err)
            bad_steps += [step] if err > DIFFERS else []
            for t, (table, _) in enumerate(TABLES):
                oracle.step(table, bags[t], [upstream(step, r, t) for r in range(world)])
        held, swapped_in = held_rows(model, pg)
        where = residency(parameters=model, optimizer=model.fused_optimizer, inputs=batch, outputs=outs[0])
        del model
    return {"fwd_err": fwd_err, "bad_steps": bad_steps, **compare_rows(held, oracle), "swapped_in": swapped_in,
            "residency": where}
