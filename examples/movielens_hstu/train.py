"""Train an HSTU next-item recommender on MovieLens-100K with TorchRec and torchrec-ascend, evaluate it, save it.

Run on CPU with two ranks (gloo)::

    OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE \\
        torchrun --standalone --nproc-per-node 2 examples/movielens_hstu/train.py --out runs/movielens_hstu

Steps: load the data (downloaded on first use), split leave-one-out, shard the item table with the stock planner
and ``DistributedModelParallel`` (a hash table of raw item IDs, ``row_wise`` over the ranks, KEY_VALUE kernel: a
device cache over host memory over disk; see ``embedding_tables.py``), train with torchrec-ascend's
``HybridTrainPipelineSparseDist`` (3 batches in flight; fused row-wise Adagrad for the table, AdamW for the dense
encoder), evaluate HR@10/NDCG@10 against a popularity baseline, and write to ``--out``: ``metrics.json``,
``training.png`` (loss per step, cache hit rate per epoch), ``checkpoint/`` (``sparse/``: the item table from all
tiers, written by torchrec-ascend's ``Saver``; ``dense/``: the encoder and its optimizer, written by
``torch.distributed.checkpoint``) and ``item_rows/`` (the disk tier of the item table while it trains).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import tempfile
import time
import warnings
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.optim import _apply_optimizer_in_backward as apply_optimizer_in_backward
from torchrec.distributed.model_parallel import DistributedModelParallel
from torchrec.distributed.planner import EmbeddingShardingPlanner
from torchrec.distributed.planner.storage_reservations import FixedPercentageStorageReservation
from torchrec.distributed.planner.types import KernelConfig, TopologyFactory, TrainerConfig
from torchrec.distributed.types import ShardingPlan
from torchrec.modules.embedding_configs import EmbeddingConfig
from torchrec.optim.keyed import CombinedOptimizer, KeyedOptimizerWrapper
from torchrec.optim.optimizers import in_backward_optimizer_filter
from torchrec.optim.rowwise_adagrad import RowWiseAdagrad
from tqdm import tqdm

from batches import TrainBatches, training_windows
from embedding_tables import ITEM_TABLE, embedding_sharders, item_cache_counters, item_constraints, item_tables
from evaluate import evaluate
from model import HSTURecommender
from report import cache_table, metrics_table, plot_training
from torchrec_ascend import HybridTrainPipelineSparseDist, Saver
from torchrec_ascend.checkpoint import dense_state_dict
from torchrec_ascend.datasets import leave_one_out, load_movielens_100k
from torchrec_ascend.policies.registry import find_policy
from torchrec_ascend.shutdown import end_rank

# Known, harmless notices from TorchRec 1.8 internals (deprecated DDP argument, ShardedTensor in state_dict, fx
# tracing), silenced so the job's own output stays readable.
warnings.filterwarnings("ignore", category=FutureWarning, module=r"torchrec\.")
warnings.filterwarnings("ignore", message="Please use DTensor instead", category=FutureWarning)
logging.getLogger("torch.fx._symbolic_trace").setLevel(logging.ERROR)

# Cache counters summed over ranks for the report (cumulative, except the tier sizes, which are current).
CACHE_COUNTERS = ("lookups", "hits", "evicted", "swapped_out", "swapped_in", "initialised", "cache_rows",
                  "host_rows", "disk_rows")


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("runs/movielens_hstu"), help="output folder")
    parser.add_argument("--data-dir", default=None, help="dataset cache (default: $TORCHREC_ASCEND_DATA or ~/.cache)")
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--batch-size", type=int, default=64, help="windows per rank per step")
    parser.add_argument("--max-seq-len", type=int, default=50)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--heads", type=int, default=2)
    parser.add_argument("--dropout", type=float, default=0.2)
    parser.add_argument("--temperature", type=float, default=0.2)
    parser.add_argument("--negatives", type=int, default=256, help="random negatives per batch")
    parser.add_argument("--dense-lr", type=float, default=2e-3)
    parser.add_argument("--sparse-lr", type=float, default=0.05)
    parser.add_argument("--pipe-n-batch", type=int, default=3, help="batches in flight in the training pipeline")
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


def init_process_group() -> None:
    """gloo process group from torchrun's environment, or a single process when started with plain python."""
    if "RANK" in os.environ:
        dist.init_process_group("gloo")
    else:
        store = Path(tempfile.mkdtemp()) / "store"
        dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)


def shard_model(
    args: argparse.Namespace, tables: List[EmbeddingConfig], world_size: int, device: torch.device
) -> Tuple[DistributedModelParallel, KeyedOptimizerWrapper, ShardingPlan]:
    """Build the model, plan its tables with the stock planner and shard it (collective: call on every rank).

    Returns the sharded model, the optimizer of its dense parameters (the table's is fused into backward) and the
    plan.
    """
    model = HSTURecommender(tables, args.max_seq_len, args.layers, args.heads, args.dropout, args.temperature,
                            device=torch.device("meta"))
    # Stock TorchRec idiom: the table's optimizer is fused into the backward of the embedding kernel.
    apply_optimizer_in_backward(RowWiseAdagrad, model.item_embeddings.parameters(), {"lr": args.sparse_lr})
    sharders = embedding_sharders()
    planner = EmbeddingShardingPlanner(
        topology=TopologyFactory.create_topology(
            TrainerConfig(world_size=world_size), kernel_config=KernelConfig(compute_device=device.type)
        ),
        constraints=item_constraints(args.out),
        storage_reservation=FixedPercentageStorageReservation(percentage=0.15),
    )
    plan = planner.collective_plan(model, sharders, dist.GroupMember.WORLD)
    dmp = DistributedModelParallel(model, device=device, plan=plan, sharders=sharders)
    dense = KeyedOptimizerWrapper(
        dict(in_backward_optimizer_filter(dmp.named_parameters())),
        lambda params: torch.optim.AdamW(params, lr=args.dense_lr),
    )
    return dmp, dense, plan


def describe_tables(tables: List[EmbeddingConfig], plan: ShardingPlan) -> List[str]:
    """One line per sharded table (placement, kernel) and one for the item table's hash options and cache."""
    lines = [
        f"{path}.{table}: {sharding.sharding_type} on ranks {sharding.ranks}, {sharding.compute_kernel} kernel"
        for path, shardings in plan.plan.items()
        for table, sharding in shardings.items()
    ]
    [config] = [table for table in tables if table.name == ITEM_TABLE]
    policy = find_policy(config.eviction_policy, "eviction")
    lines.append(
        f"{ITEM_TABLE}: {type(config).__name__} of raw item IDs, capacity {config.num_embeddings}; eviction policy "
        f"{config.eviction_policy!r} {config.eviction_options} from {policy.distribution} {policy.version}"
    )
    return lines


def cache_totals(model: DistributedModelParallel) -> Dict[str, float]:
    """The item table's cache counters summed over ranks (collective)."""
    counters = item_cache_counters(model) or {}
    totals = torch.tensor([float(counters.get(key, 0)) for key in CACHE_COUNTERS], dtype=torch.float64)
    dist.all_reduce(totals)
    return dict(zip(CACHE_COUNTERS, totals.tolist()))


def hit_rate(now: Dict[str, float], before: Dict[str, float]) -> Optional[float]:
    """Cache hits over lookups between two :func:`cache_totals` readings; ``None`` without a cache."""
    lookups = now["lookups"] - before["lookups"]
    return (now["hits"] - before["hits"]) / lookups if lookups else None


def main(argv: Optional[List[str]] = None) -> None:
    args = parse_args(argv)
    started = time.perf_counter()
    init_process_group()
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cpu")
    torch.manual_seed(args.seed)

    if rank == 0:  # downloads on first use; the other ranks wait and then read the cached file
        data = load_movielens_100k(args.data_dir)
        for stale in ("item_rows", "checkpoint"):  # a previous run's disk tier and checkpoint
            shutil.rmtree(args.out / stale, ignore_errors=True)
    dist.barrier()
    if rank != 0:
        data = load_movielens_100k(args.data_dir)
    split = leave_one_out(data)
    catalogue = torch.unique(data.item)
    windows = training_windows(split, args.max_seq_len)
    loader = TrainBatches(windows, catalogue, args.batch_size, args.negatives, rank, world, args.seed)

    tables = item_tables(num_items=catalogue.numel(), dim=args.dim)
    dmp, dense_optimizer, plan = shard_model(args, tables, world_size=world, device=device)
    optimizer = CombinedOptimizer([dmp.fused_optimizer, dense_optimizer])
    pipeline = HybridTrainPipelineSparseDist(dmp, optimizer, device, pipe_n_batch=args.pipe_n_batch)
    setup_s = time.perf_counter() - started
    cache = cache_totals(dmp)
    if rank == 0:
        print(f"MovieLens-100K: {len(data)} ratings, {data.num_users} users, {catalogue.numel()} items; "
              f"{windows.shape[0]} training windows, {world} rank(s), {loader.steps_per_epoch} steps/epoch, "
              f"{pipeline.pipe_n_batch} batches in flight", flush=True)
        print("\n".join(describe_tables(tables, plan)), flush=True)
        print(f"{ITEM_TABLE}: device cache of {int(cache['cache_rows'])} rows over all shards for "
              f"{catalogue.numel()} items ({cache['cache_rows'] / catalogue.numel():.0%}); evicted rows go to host "
              f"memory, then to {args.out / 'item_rows'}", flush=True)

    losses: List[float] = []
    hit_rates: List[Optional[float]] = []
    dmp.train()
    bar = tqdm(total=args.epochs * loader.steps_per_epoch, disable=rank != 0, desc="train", unit="step", mininterval=1)
    for epoch in range(args.epochs):
        batches = loader.epoch(epoch)
        while True:
            try:
                loss = pipeline.progress(batches)
            except StopIteration:
                break
            losses.append(float(loss))
            bar.update()
            bar.set_postfix(epoch=epoch, loss=f"{losses[-1]:.3f}", refresh=False)
        cache, before = cache_totals(dmp), cache
        hit_rates.append(hit_rate(cache, before))
    bar.close()
    train_s = time.perf_counter() - started - setup_s

    pipeline.detach()  # restore the original forwards that the pipeline rewrote, for evaluation
    dmp.eval()  # a KEY_VALUE table still swaps rows in from host memory and disk in eval mode; it inserts no IDs
    # No evaluation call looks up more items than a training step (a history is no longer than a window, a catalogue
    # chunk no larger than the negatives), so the cache that fits training fits evaluation.
    metrics = evaluate(dmp.module, split, catalogue, args.max_seq_len, users_per_call=args.batch_size,
                       items_per_call=args.negatives)
    mean_losses = torch.tensor(losses, dtype=torch.float64)
    dist.all_reduce(mean_losses)
    mean_losses /= world

    args.out.mkdir(parents=True, exist_ok=True)
    # The item table from every tier (IDs, rows, optimizer and policy state) with torchrec-ascend's Saver; the rest
    # (encoder and its optimizer) with stock torch.distributed.checkpoint.
    Saver().save(dmp, str(args.out / "checkpoint" / "sparse"))
    dense = {"model": dense_state_dict(dmp), "optim": dense_optimizer.state_dict()}
    dcp.save(dense, checkpoint_id=args.out / "checkpoint" / "dense")
    total_s = time.perf_counter() - started
    if rank == 0:
        metrics.update(setup_s=setup_s, train_s=train_s, total_s=total_s, steps=len(losses),
                       final_epoch_loss=float(mean_losses[-loader.steps_per_epoch:].mean()),
                       cache_hit_rate_per_epoch=hit_rates, cache=cache)
        (args.out / "metrics.json").write_text(json.dumps({**metrics, "args": vars(args)}, indent=2, default=str))
        plot_training(args.out / "training.png", mean_losses.tolist(), hit_rates, loader.steps_per_epoch)
        print(f"\n{cache_table(cache, hit_rates)}")
        print(f"\nleave-one-out, {int(metrics['users'])} users, all {catalogue.numel()} items ranked, "
              f"training items excluded:\n{metrics_table(metrics)}")
        print(f"\nsetup {setup_s:.0f} s, training {train_s:.0f} s, total {total_s:.0f} s; wrote {args.out}/"
              f"{{metrics.json,training.png,checkpoint/}}")
    dist.barrier()
    end_rank()  # ends the process: gloo's threads can abort interpreter shutdown after the work is done


if __name__ == "__main__":
    main()
