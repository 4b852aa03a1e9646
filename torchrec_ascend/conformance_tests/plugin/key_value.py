"""KEY_VALUE transparency: a tiny device cache over host memory over disk trains bit for bit like FUSED.

Run with torchrun (``conformance_tests/launch.py``), any world size; each case is
``{"kind": "ebc"|"ec", "sharding_type": ..., "optimizer": ..., "steps": N, "cache_rows": R, "host_kb": K}``.
Two copies of the same hash-table model train on the same batches: one FUSED (every row in the TBE), one KEY_VALUE
with ``R`` cache rows per shard and a host budget of ``K`` KiB spilling to disk. An optional ``"variant"`` changes
the model or the batches: ``"mean"`` (MEAN pooling), ``"weighted"`` (per-sample weights), ``"mixed_dims"`` (tables
of dims 8 and 16), ``"fp16"`` (FP16 tables), ``"bf16"`` (BF16 tables, rounded stochastically as fbgemm's default is),
``"int32"`` (int32 IDs and lengths), ``"vbe"`` (a variable batch
size per feature, ``stride_per_key_per_rank``), ``"empty_rank"`` (the last rank's batches have no samples) or
``"eval"`` (after training, eval-mode forwards under ``torch.no_grad()`` of batches larger than the cache).
``{"kind": "pipeline", ..., "depth": D}`` instead trains a ranker (hash EBC and a linear head) whose KEY_VALUE copy
runs behind ``HybridTrainPipelineSparseDist`` at depth ``D`` (rows swapped in ahead on a host thread, each batch's
rows pinned while it is in flight) against the FUSED copy in a plain loop; it also reports ``trained``, the batches
the pipeline trained (a pin never released ends the run early with a CapacityError), and with
``"budget": "compute_thread"`` what each step after the first ``D`` cost the compute thread on the emulated NPU
(``transfers["key_value_pipeline_compute_thread"]``). With ``"kernel": "fused"`` the pipelined copy is FUSED too
(the same budget for FUSED hash tables: ``transfers["fused_hash_pipeline_compute_thread"]``).
Reported: the largest forward difference over all steps and the largest final row difference (both must be exactly
0), and the cache counters (evictions, rows swapped out and in, rows on disk) so a case that never swapped cannot
pass unnoticed. Both models and their batches live on the suite's device (the host and disk tiers on the host, by
design); ``residency`` says where the KEY_VALUE model's parameters, optimizer state, inputs and outputs were.
"""

from __future__ import annotations

import contextlib
import gc
import tempfile
from typing import Any, Dict, List

import torch
import torchrec
from torchrec.distributed.planner import ParameterConstraints
from torchrec.modules.embedding_configs import DataType, PoolingType
from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from torchrec_ascend import HashEmbeddingBagConfig, HashEmbeddingConfig
from torchrec_ascend.conformance_tests.launch import script_device
from torchrec_ascend.conformance_tests.plugin.hash_tables import OPTIMIZERS, max_row_diff, rows_of, sharded_rows
from torchrec_ascend.conformance_tests.plugin.runner import (
    count_transfers,
    counted_on_this_thread,
    key_value_options,
    main,
    planned,
    residency,
)
from torchrec_ascend.kernels.key_value import cache_metrics

DIM = 8
TABLES = [("user", 1024, 3), ("item", 1024, 5)]  # name, capacity (FUSED must hold every ID), init seed
POOL = 400  # distinct IDs per feature: several times the cache
BATCH, MAX_LEN = 8, 3  # a row-wise shard sees at most 2 * 8 * 3 = 48 IDs per table per batch


def make_module(kind: str, variant: str = "") -> torch.nn.Module:
    dims = [DIM * (1 + t) if variant == "mixed_dims" else DIM for t in range(len(TABLES))]
    data_type = {"fp16": DataType.FP16, "bf16": DataType.BF16}.get(variant, DataType.FP32)
    if kind == "ec":
        return torchrec.EmbeddingCollection(tables=[
            HashEmbeddingConfig(name=n, num_embeddings=c, embedding_dim=d, feature_names=[f"f_{n}"], init_seed=s,
                                data_type=data_type)
            for (n, c, s), d in zip(TABLES, dims)
        ])
    return torchrec.EmbeddingBagCollection(tables=[
        HashEmbeddingBagConfig(name=n, num_embeddings=c, embedding_dim=d, feature_names=[f"f_{n}"], init_seed=s,
                               data_type=data_type, pooling=PoolingType.MEAN if variant == "mean" else PoolingType.SUM)
        for (n, c, s), d in zip(TABLES, dims)
    ], is_weighted=variant == "weighted")


def make_batch(step: int, rank: int, variant: str = "", world: int = 1, max_len: int = MAX_LEN) -> KeyedJaggedTensor:
    """``rank``'s batch: ``BATCH`` samples per feature (``vbe``: feature ``t`` has ``BATCH - t - rank % 2``,
    expanded back in the output; ``empty_rank``: none on the last rank)."""
    gen = torch.Generator().manual_seed(7919 * step + rank)
    samples = [BATCH - (t + rank % 2 if variant == "vbe" else 0) for t in range(len(TABLES))]
    if variant == "empty_rank" and rank == world - 1:
        samples = [0] * len(TABLES)
    lengths = torch.randint(0, max_len + 1, (sum(samples),), generator=gen)
    scale, spread = (1_009, 2**20) if variant == "int32" else (1_000_003, 2**40)
    per_table: List[torch.Tensor] = []
    for table_lengths in torch.split(lengths, samples):
        n = int(table_lengths.sum())
        hot = torch.randint(0, POOL // 8, (n,), generator=gen)  # a hot set and a long tail, like real traffic
        tail = torch.randint(0, POOL, (n,), generator=gen)
        picks = torch.where(torch.rand(n, generator=gen) < 0.5, hot, tail)
        per_table.append(picks * scale + len(per_table) * spread)  # spread-out raw IDs, per table
    keys = [f"f_{n}" for n, _, _ in TABLES]
    index = torch.int32 if variant == "int32" else torch.int64
    values, lengths = torch.cat(per_table).to(index), lengths.to(index)
    weights = torch.rand(values.numel(), generator=gen) if variant == "weighted" else None
    if variant == "vbe":
        inverse = torch.stack([torch.arange(BATCH) % b for b in samples])
        return KeyedJaggedTensor(keys=keys, values=values, lengths=lengths, weights=weights,
                                 stride_per_key_per_rank=[[b] for b in samples], inverse_indices=(keys, inverse))
    return KeyedJaggedTensor.from_lengths_sync(keys=keys, values=values, lengths=lengths, weights=weights)


def shard(module: torch.nn.Module, case: Dict[str, Any], key_value: bool, pg: Any, directory: str) -> Any:
    world, kernel = pg.size(), "key_value" if key_value else "fused"
    constraints = {}
    for name, capacity, _ in TABLES:
        shard_rows = capacity // world if case["sharding_type"] == "row_wise" else capacity
        options = key_value_options(kernel, case["cache_rows"] / shard_rows, case["host_kb"] / 1024, directory
                                    ) if key_value else {}  # FUSED cases have no cache size
        constraints[name] = ParameterConstraints(sharding_types=[case["sharding_type"]], compute_kernels=[kernel],
                                                 **options)
    return planned(module, constraints, pg)


def build(case: Dict[str, Any], key_value: bool, pg: Any, directory: str) -> Any:
    module = make_module(case["kind"], case.get("variant", ""))
    lookups = module.embeddings if case["kind"] == "ec" else module.embedding_bags
    cls, kwargs = OPTIMIZERS[case["optimizer"]]
    apply_optimizer_in_backward(cls, [lookup.weight for lookup in lookups.values()], dict(kwargs))
    return shard(module, case, key_value, pg, directory)


class Ranker(torch.nn.Module):
    """Hash EBC -> linear -> BCE: a model TorchRec's pipelines can drive (it takes a Batch, returns (loss, out))."""

    def __init__(self) -> None:
        super().__init__()
        self.ebc = make_module("ebc")
        torch.manual_seed(0)
        self.head = torch.nn.Linear(len(TABLES) * DIM, 1)

    def forward(self, batch: Any) -> Any:
        logits = self.head(self.ebc(batch.sparse_features).values()).squeeze(1)
        return torch.nn.functional.binary_cross_entropy_with_logits(logits, batch.labels), logits


def ranker_batch(step: int, rank: int) -> Any:
    from torchrec.datasets.utils import Batch

    gen = torch.Generator().manual_seed(31 * step + rank)
    return Batch(dense_features=torch.zeros(BATCH, 1), sparse_features=make_batch(step, rank),
                 labels=torch.randint(0, 2, (BATCH,), generator=gen).float())


def run_pipeline_case(case: Dict[str, Any], pg: Any, directory: str) -> Dict[str, Any]:
    """KEY_VALUE (or FUSED, ``"kernel": "fused"``) behind HybridTrainPipelineSparseDist (IDs mapped and rows swapped
    in ahead, on a host thread) vs FUSED in a loop."""
    from torchrec.optim.keyed import KeyedOptimizerWrapper
    from torchrec.optim.optimizers import in_backward_optimizer_filter

    from torchrec_ascend.kernels.fused import HashRows
    from torchrec_ascend.kernels.walk import sharded_kernels
    from torchrec_ascend.pipeline import HybridTrainPipelineSparseDist

    kernel = case.get("kernel", "key_value")
    models = []
    for key_value in (False, kernel == "key_value"):
        model = Ranker()
        cls, kwargs = OPTIMIZERS[case["optimizer"]]
        apply_optimizer_in_backward(cls, [b.weight for b in model.ebc.embedding_bags.values()], dict(kwargs))
        dmp = shard(model, case, key_value, pg, directory)
        dense = KeyedOptimizerWrapper(dict(in_backward_optimizer_filter(dmp.named_parameters())),
                                      lambda ps: torch.optim.SGD(ps, lr=0.05))
        models.append((dmp, dense))
    (fused, fused_opt), (cached, cached_opt) = models
    device = script_device()
    for step in range(case["steps"]):
        fused_opt.zero_grad()
        fused(ranker_batch(step, pg.rank()).to(device))[0].backward()
        fused_opt.step()
    pipeline = HybridTrainPipelineSparseDist(cached, cached_opt, device, pipe_n_batch=case["depth"])
    batches = iter([ranker_batch(step, pg.rank()) for step in range(case["steps"])])  # the pipeline copies them
    outputs: List[torch.Tensor] = []
    transfers: Dict[str, Dict[str, int]] = {}
    part = f"{'fused_hash' if kernel == 'fused' else 'key_value'}_pipeline_compute_thread"
    while True:
        # Once the pipeline is full, what each step costs the compute thread (on the emulated NPU).
        counted = case.get("budget") == "compute_thread" and len(outputs) >= case["depth"]
        try:
            with counted_on_this_thread(part, transfers) if counted else contextlib.nullcontext():
                outputs.append(pipeline.progress(batches))
        except StopIteration:
            break
    pipeline.detach()
    dense_err = max((a - b).abs().max().item() for a, b in zip(fused.module.head.parameters(),
                                                                cached.module.head.parameters()))
    where = residency(parameters=cached, optimizer=[cached.fused_optimizer, cached_opt], inputs=[],
                      outputs=outputs)
    kernels = [k for k in sharded_kernels(cached) if isinstance(k, HashRows)]
    metrics = cache_metrics(cached)
    return {
        "fwd_err": dense_err,
        "row_err": max_row_diff(sharded_rows(fused, pg), sharded_rows(cached, pg)),
        "trained": len(outputs),
        "prefetched": sum(k.prefetched_batches for k in kernels),
        "kernels": len(kernels),
        **{k: sum(m[k] for m in metrics.values()) for k in ("evicted", "swapped_out", "swapped_in", "disk_rows")},
        "residency": where,
        "transfers": transfers,
    }


def run_case(case: Dict[str, Any], pg: Any) -> Dict[str, Any]:
    if case["kind"] == "pipeline":
        with tempfile.TemporaryDirectory(prefix="kv_disk_") as directory:
            return run_pipeline_case({**case, "kind": "ebc"}, pg, directory)
    rank, kind = pg.rank(), case["kind"]
    with tempfile.TemporaryDirectory(prefix="kv_disk_") as directory:
        fused = build(case, key_value=False, pg=pg, directory=directory)
        cached = build(case, key_value=True, pg=pg, directory=directory)
        fwd_err, device, variant = 0.0, script_device(), case.get("variant", "")
        transfers = count_transfers(fused, cached)
        evaluating = 2 if variant == "eval" else 0
        for step in range(case["steps"] + evaluating):
            train = step < case["steps"]  # then eval: batches of up to 40 IDs a sample, larger than the cache
            batch = make_batch(step, rank, variant, pg.size(), MAX_LEN if train else 40).to(device)
            outs = []
            for model in (fused, cached):
                model.train(train)
                with torch.set_grad_enabled(train):
                    out = torch.cat(rows_of(kind, model(batch), batch), dim=1 if kind == "ebc" else 0)
                gen = torch.Generator().manual_seed(step * 31 + rank)
                if train:
                    (out * torch.randn(out.shape, generator=gen).to(out.dtype).to(device)).sum().backward()
                outs.append(out.detach())
            fwd_err = max(fwd_err, (outs[0] - outs[1]).abs().max().item() if outs[0].numel() else 0.0)
        where = residency(parameters=cached, optimizer=cached.fused_optimizer, inputs=batch, outputs=outs[1])
        row_err = max_row_diff(sharded_rows(fused, pg), sharded_rows(cached, pg))
        metrics = cache_metrics(cached)
        totals = {k: sum(m[k] for m in metrics.values()) for k in ("evicted", "swapped_out", "swapped_in", "disk_rows")}
        del fused, cached
        gc.collect()
    return {"fwd_err": fwd_err, "row_err": row_err, "residency": where, "transfers": transfers, **totals}


if __name__ == "__main__":
    main(__doc__, run_case, worst=("fwd_err", "row_err"),
         totals=("evicted", "swapped_out", "swapped_in", "disk_rows", "prefetched", "kernels"))
