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
tiers, written by torchrec-ascend's ``Saver``; ``dense/``: the encoder, its optimizer and each rank's progress,
written by ``torch.distributed.checkpoint``; see ``checkpoints.py``) and ``item_rows/`` (the disk tier of the item
table while it trains).

Faults: a checkpoint is saved every ``--save-every`` steps and at the end. On SIGTERM (a scheduler's preemption, or
torchrun's agent passing it on) every rank finishes the batches in flight, saves, and exits with status 143, which
torchrun restarts (``--max-restarts``); a rank that loses another (``kill -9``, a host down) stops within
``$TORCHREC_ASCEND_COLLECTIVE_TIMEOUT_S`` (default 120 s) with a ``RankLostError`` naming it. Run the same command
again (or let torchrun restart it) and the job resumes from its last complete checkpoint, ending with the model an
uninterrupted run ends with (``model_digest`` in ``metrics.json``), bit for bit.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import tempfile
import time
import traceback
import warnings
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Tuple

import torch
import torch.distributed as dist
from torch.distributed.optim import _apply_optimizer_in_backward as apply_optimizer_in_backward
from torchrec.distributed.model_parallel import DefaultDataParallelWrapper, DistributedModelParallel
from torchrec.distributed.planner import EmbeddingShardingPlanner
from torchrec.distributed.planner.storage_reservations import FixedPercentageStorageReservation
from torchrec.distributed.planner.types import KernelConfig, TopologyFactory, TrainerConfig
from torchrec.distributed.types import ShardingPlan
from torchrec.modules.embedding_configs import DataType, EmbeddingConfig
from torchrec.optim.keyed import CombinedOptimizer, KeyedOptimizerWrapper
from torchrec.optim.optimizers import in_backward_optimizer_filter
from torchrec.optim.rowwise_adagrad import RowWiseAdagrad
from tqdm import tqdm

from batches import TrainBatches, training_windows
from checkpoints import Progress, checkpoint_dir, latest, mark_done, model_digest, restore, save
from embedding_tables import ITEM_TABLE, embedding_sharders, item_cache_counters, item_constraints, item_tables
from evaluate import evaluate
from model import HSTURecommender
from report import cache_table, metrics_table, plot_training
from torchrec_ascend import HybridTrainPipelineSparseDist
from torchrec_ascend.datasets import leave_one_out, load_movielens_100k
from torchrec_ascend.errors import RankLostError
from torchrec_ascend.policies.registry import find_policy
from torchrec_ascend.shutdown import RESTARTABLE_EXIT, RankWatch, StopRequest, abort_rank, collective_timeout, end_rank

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
    parser.add_argument("--data-type", choices=["fp32", "fp16", "bf16"], default="fp32",
                        help="the item table's weight precision (its optimizer state stays FP32)")
    parser.add_argument("--save-every", type=int, default=100,
                        help="steps between checkpoints (0: only at the end and on SIGTERM)")
    return parser.parse_args(argv)


def init_process_group() -> None:
    """gloo process group from torchrun's environment, or a single process when started with plain python."""
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        # torchrun's restarted ranks share its store with the ranks they replace: keys of their own keep them from
        # reading the old ranks' gloo addresses (seen: "Gloo connectFullMesh failed ... Connection refused").
        address, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
        store = dist.PrefixStore(f"attempt-{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}/",
                                 dist.TCPStore(address, port, is_master=False, timeout=collective_timeout()))
        dist.init_process_group("gloo", store=store, rank=int(os.environ["RANK"]),
                                world_size=int(os.environ["WORLD_SIZE"]), timeout=collective_timeout())
    elif "RANK" in os.environ:
        dist.init_process_group("gloo", timeout=collective_timeout())
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
    # DDP regroups its gradient buckets after the first step; with more than two ranks that changes the order the
    # all-reduce sums in, so a job resumed from a checkpoint (whose first step uses the initial buckets) would drift
    # from an uninterrupted one in the last bit. Buckets that are never regrouped keep a resume bit for bit.
    fixed_buckets = DefaultDataParallelWrapper(static_graph=False, find_unused_parameters=True)
    dmp = DistributedModelParallel(model, device=device, plan=plan, sharders=sharders,
                                   data_parallel_wrapper=fixed_buckets)
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


def train(pipeline: HybridTrainPipelineSparseDist, loader: TrainBatches, progress: Progress, epochs: int,
          pause: "Pause", bar: tqdm, dmp: DistributedModelParallel) -> bool:
    """Train from ``progress.step`` to the end of ``epochs``; ``False`` if a stop was agreed (after saving).

    Every ``save_every`` steps, and after a step at which the ranks agree to stop (SIGTERM), the pipeline is
    drained (the batches in flight are trained: no rank drops one) and ``pause.save`` runs. Draining changes no
    result, so the batches, the RNG stream and the model are those of a run that never paused.
    """
    while progress.step < epochs * loader.steps_per_epoch:
        epoch, done = divmod(progress.step, loader.steps_per_epoch)
        batches = loader.epoch(epoch, skip=done)
        source: Iterator = batches
        stopping = False
        while True:
            try:
                loss = pipeline.progress(source)
            except StopIteration:
                if source is batches:
                    break  # the epoch is done
                pause.save(progress)  # drained
                if stopping:
                    return False
                source = batches
                continue
            progress.step += 1
            progress.losses.append(float(loss))
            bar.update()
            bar.set_postfix(epoch=epoch, loss=f"{progress.losses[-1]:.3f}", refresh=False)
            if progress.step % loader.steps_per_epoch == 0:  # the epoch's last batch (nothing of it left in flight)
                counters = cache_totals(dmp)
                progress.hit_rates.append(hit_rate(counters, progress.epoch_counters))
                progress.epoch_counters = counters
            if source is batches:
                stopping = pause.stop.agreed()  # collective, after every step
                if stopping or (pause.save_every and progress.step % pause.save_every == 0):
                    source = iter(())  # the pipeline trains what it holds, then raises StopIteration
    return True


class Pause:
    """When the training loop stops to save (the agreed SIGTERM, every ``save_every`` steps) and how it saves."""

    def __init__(self, stop: StopRequest, save_every: int, save_fn: Any, saved_step: Optional[int]) -> None:
        self.stop, self.save_every, self._save_fn = stop, save_every, save_fn
        self.saved_step = saved_step  # the step of the latest checkpoint

    def save(self, progress: Progress) -> None:
        if progress.step != self.saved_step:
            self._save_fn(progress)
            self.saved_step = progress.step


def main(argv: Optional[List[str]] = None) -> None:
    args = parse_args(argv)
    init_process_group()
    stop, watch = StopRequest(), RankWatch()  # SIGTERM only sets a flag from here on
    doing = ["setting up"]
    try:
        code = run(args, stop, doing)
    except Exception as err:
        try:
            if not isinstance(err, RankLostError):
                watch.check(err, doing[0])
            raise
        except Exception:
            traceback.print_exc()
            abort_rank(1)  # no teardown: a peer may be gone
    end_rank(code)  # ends the process: gloo's threads can abort interpreter shutdown after the work is done


def run(args: argparse.Namespace, stop: StopRequest, doing: List[str]) -> int:
    """The job, from data to metrics; returns the exit status (``RESTARTABLE_EXIT`` when stopped by SIGTERM)."""
    started = time.perf_counter()
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cpu")
    torch.manual_seed(args.seed)
    settings = {**vars(args), "world_size": world}

    marker = None
    if rank == 0:  # downloads on first use; the other ranks wait and then read the cached file
        data = load_movielens_100k(args.data_dir)
        marker = latest(args.out, settings)
        shutil.rmtree(args.out / "item_rows", ignore_errors=True)  # the disk tier of an earlier run
        if marker is None:
            shutil.rmtree(checkpoint_dir(args.out), ignore_errors=True)  # a finished run's
    shared = [marker]
    dist.broadcast_object_list(shared, src=0)
    marker = shared[0]
    if rank != 0:
        data = load_movielens_100k(args.data_dir)
    split = leave_one_out(data)
    catalogue = torch.unique(data.item)
    windows = training_windows(split, args.max_seq_len)
    loader = TrainBatches(windows, catalogue, args.batch_size, args.negatives, rank, world, args.seed)

    tables = item_tables(num_items=catalogue.numel(), dim=args.dim, data_type=DataType[args.data_type.upper()])
    dmp, dense_optimizer, plan = shard_model(args, tables, world_size=world, device=device)
    optimizer = CombinedOptimizer([dmp.fused_optimizer, dense_optimizer])
    pipeline = HybridTrainPipelineSparseDist(dmp, optimizer, device, pipe_n_batch=args.pipe_n_batch)
    progress = restore(dmp, dense_optimizer, args.out, marker) if marker else Progress(epoch_counters=cache_totals(dmp))
    setup_s = time.perf_counter() - started
    total_steps = args.epochs * loader.steps_per_epoch
    if rank == 0:
        print(f"MovieLens-100K: {len(data)} ratings, {data.num_users} users, {catalogue.numel()} items; "
              f"{windows.shape[0]} training windows, {world} rank(s), {loader.steps_per_epoch} steps/epoch, "
              f"{pipeline.pipe_n_batch} batches in flight", flush=True)
        print("\n".join(describe_tables(tables, plan)), flush=True)
        if marker:
            print(f"resuming from step {progress.step} of {total_steps} (checkpoint of {args.out / 'checkpoint'})",
                  flush=True)
    cache = cache_totals(dmp)
    if rank == 0:
        print(f"{ITEM_TABLE}: device cache of {int(cache['cache_rows'])} rows over all shards for "
              f"{catalogue.numel()} items ({cache['cache_rows'] / catalogue.numel():.0%}); evicted rows go to host "
              f"memory, then to {args.out / 'item_rows'}", flush=True)

    def save_at(at: Progress) -> None:
        doing[0] = f"saving step {at.step}"
        save(dmp, dense_optimizer, args.out, at, settings)

    dmp.train()
    bar = tqdm(total=total_steps, initial=progress.step, disable=rank != 0, desc="train", unit="step", mininterval=1)
    doing[0] = "training"
    pause = Pause(stop, args.save_every, save_at, marker["step"] if marker else None)
    finished = train(pipeline, loader, progress, args.epochs, pause, bar, dmp)
    bar.close()
    if not finished:
        if rank == 0:
            print(f"stopped by SIGTERM: saved step {progress.step} of {total_steps} to {args.out / 'checkpoint'}; "
                  f"exiting with {RESTARTABLE_EXIT} (run the same command again to resume)", flush=True)
        return RESTARTABLE_EXIT
    pause.save(progress)
    train_s = time.perf_counter() - started - setup_s

    doing[0] = "evaluating"
    pipeline.detach()  # restore the original forwards that the pipeline rewrote, for evaluation
    dmp.eval()  # a KEY_VALUE table still swaps rows in from host memory and disk in eval mode; it inserts no IDs
    digest = model_digest(dmp, dense_optimizer)
    # No evaluation call looks up more items than a training step (a history is no longer than a window, a catalogue
    # chunk no larger than the negatives), so the cache that fits training fits evaluation.
    metrics = evaluate(dmp.module, split, catalogue, args.max_seq_len, users_per_call=args.batch_size,
                       items_per_call=args.negatives)
    mean_losses = torch.tensor(progress.losses, dtype=torch.float64)
    dist.all_reduce(mean_losses)
    mean_losses /= world
    cache = cache_totals(dmp)
    total_s = time.perf_counter() - started
    if rank == 0:
        metrics.update(setup_s=setup_s, train_s=train_s, total_s=total_s, steps=progress.step,
                       final_epoch_loss=float(mean_losses[-loader.steps_per_epoch:].mean()),
                       cache_hit_rate_per_epoch=progress.hit_rates, cache=cache, model_digest=digest,
                       losses=mean_losses.tolist(), resumed_at=progress.resumed_at)
        (args.out / "metrics.json").write_text(json.dumps({**metrics, "args": vars(args)}, indent=2, default=str))
        plot_training(args.out / "training.png", mean_losses.tolist(), progress.hit_rates, loader.steps_per_epoch)
        mark_done(args.out)
        print(f"\n{cache_table(cache, progress.hit_rates)}")
        print(f"\nleave-one-out, {int(metrics['users'])} users, all {catalogue.numel()} items ranked, "
              f"training items excluded:\n{metrics_table(metrics)}")
        print(f"\nsetup {setup_s:.0f} s, training {train_s:.0f} s, total {total_s:.0f} s; wrote {args.out}/"
              f"{{metrics.json,training.png,checkpoint/}}")
    dist.barrier()
    return 0


if __name__ == "__main__":
    main()
