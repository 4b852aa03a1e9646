"""Soak: a KEY_VALUE table under Zipf traffic with heavy eviction churn for many steps (issue 29, item 4).

One process, a one-rank gloo group, one hash table (Adagrad fused into backward) on the KEY_VALUE kernel: a
small device cache, a small host budget and the rest on disk, so nearly every step evicts cache rows to host memory,
spills host rows to disk and brings disk rows back. At checkpoints along the run it reports:

* resident memory (``VmRSS``) and open file descriptors of the process;
* disk bytes (the sizes of the files in the table's disk folder, read from the file system) against live bytes
  (the disk tier's rows times the record size);
* counters per tier: IDs in the device cache, in host memory and on disk, against the IDs the run has sent (every ID
  is admitted and a KEY_VALUE table never drops one, so the tiers must hold exactly those); and, read from the tiers
  themselves, that no ID is in two tiers and every ID sent is in one.

Targets: resident memory (after ``malloc_trim``, so freed heap kept by malloc does not count) peaks less than 5% above
its value at the first checkpoint after warm-up; disk bytes at most 2x live bytes at every checkpoint; every counter
consistent at every checkpoint.

Run::

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_soak.py                 # 100,000 steps
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_soak.py --steps 600 --checkpoints 3 --json out.json
"""

from __future__ import annotations

import argparse
import gc
import os
import tempfile
import time
from typing import Any, Dict, List

import numpy as np
import torch
import torch.distributed as dist
import torchrec
from torchrec.distributed.model_parallel import DistributedModelParallel
from torchrec.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints, Topology
from torchrec.distributed.types import CacheParams, KeyValueParams, ShardingEnv
from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from results import make_result, target, write_result
from torchrec_ascend import HashEmbeddingBagConfig, get_default_hybrid_sharders
from torchrec_ascend.kernels.key_value.disk_record import RecordFormat
from torchrec_ascend.kernels.walk import sharded_kernels
from torchrec_ascend.native.memory import trim_heap

MEMORY_GROWTH, DISK_RATIO = 0.05, 2.0


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def open_files() -> int:
    return len(os.listdir("/proc/self/fd"))


def folder_bytes(folder: str) -> int:
    """Bytes of every file under ``folder``, from the file system (not from the store's own counters)."""
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(folder) for f in files)


def build(a: argparse.Namespace, directory: str) -> DistributedModelParallel:
    ebc = torchrec.EmbeddingBagCollection(tables=[HashEmbeddingBagConfig(
        name="item", embedding_dim=a.dim, num_embeddings=a.ids, feature_names=["f"])])
    apply_optimizer_in_backward(torch.optim.Adagrad, [ebc.embedding_bags["item"].weight], {"lr": 0.05})
    constraint = ParameterConstraints(
        sharding_types=["table_wise"], compute_kernels=["key_value"],
        cache_params=CacheParams(load_factor=a.cache_rows / a.ids),
        key_value_params=KeyValueParams(l2_cache_size=a.host_kb / 1024**2, ssd_storage_directory=directory))
    planner = EmbeddingShardingPlanner(topology=Topology(world_size=1, compute_device="cpu"),
                                       constraints={"item": constraint})
    sharders = get_default_hybrid_sharders()
    return DistributedModelParallel(ebc, env=ShardingEnv.from_process_group(dist.group.WORLD),
                                    device=torch.device("cpu"), plan=planner.plan(ebc, sharders), sharders=sharders)


def zipf_ids(rng: np.random.Generator, a: argparse.Namespace, steps: int) -> np.ndarray:
    """``steps`` batches of Zipf(a.zipf) IDs over ``a.ids`` ranks, each rank scattered to a fixed raw ID."""
    ranks = (rng.zipf(a.zipf, size=(steps, a.batch)) - 1) % a.ids
    return (ranks.astype(np.int64) * 2654435761) % (1 << 40)


def tier_check(kernel: Any, sent: np.ndarray) -> Dict[str, Any]:
    """IDs per tier read from the tiers themselves; whether they are disjoint and cover exactly the IDs sent."""
    slots = kernel.slot_table(0).slot_ids
    cached = slots[slots >= 0].numpy()
    store = kernel._stores[0]
    disk = np.concatenate([k.numpy() for k, _ in store.spill.chunks()] or [np.empty(0, np.int64)])
    below = np.concatenate([k.numpy() for k, _ in store.chunks()] or [np.empty(0, np.int64)])
    host = below[: below.size - disk.size]
    held = np.concatenate([cached, host, disk])
    distinct = np.unique(held)
    return {"cache_ids": int(cached.size), "host_ids": int(host.size), "disk_ids": int(disk.size),
            "ids_sent": int(sent.size), "no_id_in_two_tiers": bool(distinct.size == held.size),
            "tiers_hold_every_id_sent": bool(distinct.size == sent.size and np.array_equal(distinct, sent))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=100_000)
    parser.add_argument("--checkpoints", type=int, default=10, help="checkpoints along the run (after warm-up)")
    parser.add_argument("--warmup", type=float, default=0.2, help="fraction of the steps before the first checkpoint")
    parser.add_argument("--ids", type=int, default=100_000, help="distinct IDs the Zipf traffic draws from")
    parser.add_argument("--zipf", type=float, default=1.05)
    parser.add_argument("--batch", type=int, default=256, help="IDs per step (one bag each)")
    parser.add_argument("--cache-rows", type=int, default=1024)
    parser.add_argument("--host-kb", type=float, default=256.0)
    parser.add_argument("--dim", type=int, default=16)
    parser.add_argument("--segment-mb", type=float, default=None,
                        help="disk segment size (default: the store's)")
    parser.add_argument("--json", help="write the result here (run_all.py)")
    a = parser.parse_args()
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as tmp:
        dist.init_process_group("gloo", store=dist.FileStore(os.path.join(tmp, "store"), 1), rank=0, world_size=1)
        directory = os.path.join(tmp, "disk")
        dmp = build(a, directory)
        kernel = next(iter(sharded_kernels(dmp)))
        store = kernel._stores[0]
        record_bytes = RecordFormat(store.width, store.dtype).nbytes
        if a.segment_mb is not None:  # smaller segments: sealed (and so compactable) sooner
            store.spill.segment_records = max(1, int(a.segment_mb * 2**20) // record_bytes)
        warmup = max(1, int(a.warmup * a.steps))
        marks = sorted({warmup} | {warmup + (a.steps - warmup) * (i + 1) // a.checkpoints
                                   for i in range(a.checkpoints)})
        seen = np.zeros(0, dtype=np.int64)
        rows: List[Dict[str, Any]] = []
        start, step, chunk = time.perf_counter(), 0, 1000
        while step < a.steps:
            block = zipf_ids(rng, a, min(chunk, a.steps - step))
            merged = 0  # batches of the block already in `seen`
            for i, ids in enumerate(block):
                values = torch.from_numpy(ids)
                batch = KeyedJaggedTensor.from_lengths_sync(keys=["f"], values=values, lengths=torch.ones_like(values))
                dmp(batch).values().sum().backward()
                step += 1
                if step in marks:
                    raw_rss = rss_bytes()
                    gc.collect()
                    trim_heap()  # memory freed but kept by malloc is not held: the README's RSS figures trim too
                    held_rss = rss_bytes()
                    stats = kernel.cache_stats()["item"]
                    seen, merged = np.union1d(seen, block[merged : i + 1]), i + 1
                    check = tier_check(kernel, seen)
                    disk_live = stats["disk_rows"] * record_bytes
                    rows.append({
                        "step": step, "seconds": round(time.perf_counter() - start, 1),
                        "rss_MB": round(held_rss / 2**20, 1), "rss_untrimmed_MB": round(raw_rss / 2**20, 1),
                        "open_files": open_files(),
                        "disk_MB": round(folder_bytes(directory) / 2**20, 3),
                        "live_disk_MB": round(disk_live / 2**20, 3),
                        "disk/live": round(folder_bytes(directory) / max(1, disk_live), 3),
                        "segments": store.spill.stats()["segments"],
                        "compactions": store.spill.stats()["compactions"],
                        "cache_ids": check["cache_ids"], "host_rows": stats["host_rows"],
                        "disk_rows": stats["disk_rows"], "ids_sent": check["ids_sent"],
                        "tiers_sum_ok": check["cache_ids"] + stats["host_rows"] + stats["disk_rows"]
                        == check["ids_sent"] and check["host_ids"] == stats["host_rows"]
                        and check["disk_ids"] == stats["disk_rows"],
                        "disjoint": check["no_id_in_two_tiers"], "covers": check["tiers_hold_every_id_sent"],
                        "evicted": stats["evicted"], "spilled_rows": stats["spilled_rows"],
                        "promoted_rows": stats["promoted_rows"],
                    })
                    print("  ".join(f"{k}={v}" for k, v in rows[-1].items()), flush=True)
            seen = np.union1d(seen, block[merged:])
        elapsed = time.perf_counter() - start
        dist.destroy_process_group()
    growth = max(r["rss_MB"] for r in rows) / rows[0]["rss_MB"] - 1  # the peak after warm-up, not the last
    worst_disk = max(r["disk/live"] for r in rows if r["live_disk_MB"] > 0) if any(
        r["live_disk_MB"] > 0 for r in rows) else None
    consistent = all(r["tiers_sum_ok"] and r["disjoint"] and r["covers"] for r in rows)
    fds = {r["open_files"] for r in rows}
    notes = [f"{a.steps} steps of {a.batch} Zipf({a.zipf}) IDs over {a.ids} IDs, dim {a.dim} + Adagrad, "
             f"cache {a.cache_rows} rows, host budget {a.host_kb} KiB, {elapsed:.0f} s "
             f"({a.steps / elapsed:.0f} steps/s)",
             f"resident memory (after malloc_trim) {rows[0]['rss_MB']} MB at step {rows[0]['step']} (after warm-up), "
             f"peak after it {max(r['rss_MB'] for r in rows)} MB: {100 * growth:+.2f}%; {rows[-1]['rss_MB']} MB at "
             f"step {rows[-1]['step']}; open files {sorted(fds)}"]
    result = make_result(
        "KEY_VALUE soak: Zipf traffic, heavy eviction churn, memory, files, disk and tier counters",
        "the first checkpoint after warm-up (memory); the disk tier's live rows (disk bytes)", rows,
        [target("resident memory growth after warm-up", growth, "<=", MEMORY_GROWTH),
         target("disk bytes / live disk bytes (worst checkpoint)", worst_disk, "<=", DISK_RATIO),
         target("checkpoints with consistent tier counters (fraction)", float(consistent), ">=", 1.0)],
        notes)
    for line in notes:
        print(line)
    for t in result["targets"]:
        print(f"target {t['what']}: {t['value']} {t['target']} {'met' if t['met'] else 'NOT met'}")
    if a.json:
        write_result(a.json, result)


if __name__ == "__main__":
    main()
