"""The two checkpoint paths of a KEY_VALUE table mostly on disk: stock torch.distributed.checkpoint (DCP) against
the Saver, same table, same run, and both against the disk's own sequential speeds measured in the same run.

One process, a 1-rank gloo group: a hash KEY_VALUE table of ``--rows`` rows x ``--dim`` fp32 with row-wise
Adagrad, its rows written straight into the disk tier below a tiny cache and host budget. Each repetition saves it
both ways (``dcp.save`` of ``state_dict()`` and ``fused_optimizer.state_dict()``; ``Saver().save``, full), in
alternating order, then loads each into a fresh model (``dcp.load`` + ``load_state_dict``; ``Saver().load``), and
measures the disk with a file of the Saver's data file's size: a sequential write of it then ``fdatasync`` (what
``dd conv=fdatasync`` measures) and a cold sequential read of it. Every load and read is cold: the page cache's
pages of the files read are dropped first (``sync``, then ``posix_fadvise(DONTNEED)`` on each file; no root
needed). A save's time ends when it returns (the Saver and DCP both fsync their files); a load's when it returns
(the table is usable; the disk tier's segment files it wrote are a cache, never synced) and, reported beside it,
after a ``sync`` that writes those segment files out. Reported: median seconds and GB/s of records (weights and
optimizer state) per path, the targets (Saver restore >= 0.5 GB/s and >= 0.4x the cold sequential read of the same
bytes; Saver full save >= 0.9x the sequential write of the same bytes), and that both paths restored the same
rows (a sample of IDs compared bit for bit, and with the rows written)::

    OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE .venv/bin/python benchmarks/bench_checkpoint_paths.py --dir /work/bench \
        --rows 4000000
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from typing import Any, Callable, Dict, List, Tuple

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torchrec
from torchrec.distributed.model_parallel import DistributedModelParallel
from torchrec.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints, Topology
from torchrec.distributed.types import CacheParams, KeyValueParams, ShardingEnv
from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward
from torchrec.optim.rowwise_adagrad import RowWiseAdagrad

from results import make_result, target, write_result
from torchrec_ascend import HashEmbeddingBagConfig, get_default_hybrid_sharders
from torchrec_ascend.checkpoint import Saver
from torchrec_ascend.checkpoint.key_value_state import settle_loads
from torchrec_ascend.kernels.walk import sharded_kernels


def model(rows: int, dim: int, directory: str) -> Tuple[DistributedModelParallel, Any]:
    """The table's model with its disk tier in ``directory``, and its kernel."""
    ebc = torchrec.EmbeddingBagCollection(tables=[HashEmbeddingBagConfig(
        name="item", embedding_dim=dim, num_embeddings=rows, feature_names=["iid"])])
    apply_optimizer_in_backward(RowWiseAdagrad, [ebc.embedding_bags["item"].weight], {"lr": 0.1})
    constraints = {"item": ParameterConstraints(
        sharding_types=["table_wise"], compute_kernels=["key_value"], cache_params=CacheParams(load_factor=0.001),
        key_value_params=KeyValueParams(l2_cache_size=1 / 1024**2, ssd_storage_directory=directory))}
    planner = EmbeddingShardingPlanner(topology=Topology(world_size=1, compute_device="cpu"), constraints=constraints)
    sharders = get_default_hybrid_sharders()
    dmp = DistributedModelParallel(ebc, env=ShardingEnv.from_process_group(dist.group.WORLD),
                                   device=torch.device("cpu"), plan=planner.plan(ebc, sharders), sharders=sharders)
    (kernel,) = list(sharded_kernels(dmp))
    return dmp, kernel


def keys_at(start: int, end: int) -> torch.Tensor:
    return torch.arange(start, end, dtype=torch.int64) * 2654435761 % (1 << 62)


def rows_of(keys: torch.Tensor, width: int) -> torch.Tensor:
    """A distinct packed record (weights, then the row-wise state) per key."""
    return (keys.to(torch.float32)[:, None] % 9973) + torch.arange(width, dtype=torch.float32) / 1000


def drop_cached(path: str) -> None:
    """Write out, then drop from the page cache, the file ``path`` or every file under it: the next read of them
    is cold."""
    os.sync()
    files = [path] if os.path.isfile(path) else [os.path.join(d, f) for d, _, names in os.walk(path) for f in names]
    for name in files:
        fd = os.open(name, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def timed(action: Callable[[], Any]) -> Tuple[float, float]:
    """Seconds until ``action`` returns, and until a ``sync`` after it returns (what it left dirty written out)."""
    os.sync()  # what an earlier step left dirty is not charged to this one
    start = time.perf_counter()
    action()
    returned = time.perf_counter() - start
    os.sync()
    return returned, time.perf_counter() - start


def disk_speeds(path: str, nbytes: int) -> Tuple[float, float]:
    """Seconds of a sequential write of ``nbytes`` to ``path`` then ``fdatasync`` (``dd conv=fdatasync``), and of
    a cold sequential read of it; 16 MiB at a time, the file deleted after."""
    chunk = np.random.default_rng(0).integers(0, 255, size=16 << 20, dtype=np.uint8)  # not zeros: no shortcut
    os.sync()
    start = time.perf_counter()
    with open(path, "wb", buffering=0) as f:
        for offset in range(0, nbytes, chunk.size):
            f.write(chunk[: min(chunk.size, nbytes - offset)])
        os.fdatasync(f.fileno())
    write_s = time.perf_counter() - start
    drop_cached(path)
    buffer = bytearray(chunk.size)
    start = time.perf_counter()
    with open(path, "rb", buffering=0) as f:
        while f.readinto(buffer):
            pass
    read_s = time.perf_counter() - start
    os.remove(path)
    return write_s, read_s


def repetition(saved: DistributedModelParallel, args: argparse.Namespace, directory: str, reverse: bool,
               sample: torch.Tensor, seconds: Dict[str, List[float]]) -> bool:
    """Save ``saved`` both ways and load each into a fresh model (``reverse``: the Saver first), then measure the
    disk with the Saver's file size, adding the times to ``seconds``; returns whether both loads give ``sample``'s
    rows as written."""
    dcp_dir, saver_dir = os.path.join(directory, "dcp"), os.path.join(directory, "saver")
    saves: List[Tuple[str, Callable[[], Any]]] = [
        ("dcp.save", lambda: dcp.save({"model": saved.state_dict(), "optim": saved.fused_optimizer.state_dict()},
                                      checkpoint_id=dcp_dir)),
        ("Saver.save", lambda: Saver().save(saved, saver_dir)),
    ]
    for name, action in saves[::-1] if reverse else saves:
        seconds[name].append(timed(action)[0])
    restored = {}
    for name in ["Saver.load", "dcp.load"] if reverse else ["dcp.load", "Saver.load"]:
        fresh, kernel = model(args.rows, args.dim, os.path.join(directory, name))

        def load(fresh: Any = fresh, name: str = name) -> None:
            if name == "Saver.load":
                Saver().load(fresh, saver_dir)
                return
            state = {"model": fresh.state_dict(), "optim": fresh.fused_optimizer.state_dict()}
            dcp.load(state, checkpoint_id=dcp_dir)
            fresh.load_state_dict(state["model"])
            assert not settle_loads(fresh)

        drop_cached(directory)
        returned, synced = timed(load)
        seconds[name].append(returned)
        seconds[f"{name} + sync"].append(synced)
        restored[name] = kernel.checkpoint.read_records(0, sample)[0]
        kernel.row_tier.close()
    saver_bytes = sum(os.path.getsize(os.path.join(saver_dir, d, f)) for d in os.listdir(saver_dir)
                      if os.path.isdir(os.path.join(saver_dir, d)) for f in os.listdir(os.path.join(saver_dir, d)))
    shutil.rmtree(directory, ignore_errors=True)
    write_s, read_s = disk_speeds(os.path.join(os.path.dirname(directory), "disk-speed.dat"), saver_bytes)
    seconds["sequential write + fdatasync"].append(write_s)
    seconds["cold sequential read"].append(read_s)
    expected = rows_of(sample, restored["dcp.load"].shape[1])
    return torch.equal(restored["dcp.load"], restored["Saver.load"]) and torch.equal(restored["dcp.load"], expected)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--dir", default=None, help="where the tables and checkpoints go (default: a temp folder)")
    parser.add_argument("--json", default=None, help="write the result here (benchmarks/run_all.py)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    root = tempfile.mkdtemp(prefix="bench-ckpt-", dir=args.dir)
    try:
        result = run(args, root)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    if args.json:
        write_result(args.json, result)


def run(args: argparse.Namespace, root: str) -> Dict[str, Any]:
    dist.init_process_group("gloo", store=dist.FileStore(os.path.join(root, "pg"), 1), rank=0, world_size=1)
    saved, kernel = model(args.rows, args.dim, os.path.join(root, "saved"))
    store = kernel.row_tier.stores[0]
    width = store.width
    step = 65536
    store.load((keys_at(s, min(args.rows, s + step)), rows_of(keys_at(s, min(args.rows, s + step)), width))
               for s in range(0, args.rows, step))
    gigabytes = args.rows * width * 4 / 1e9
    names = ["dcp.save", "Saver.save", "dcp.load", "Saver.load", "dcp.load + sync", "Saver.load + sync",
             "sequential write + fdatasync", "cold sequential read"]
    seconds: Dict[str, List[float]] = {name: [] for name in names}
    sample = keys_at(0, args.rows)[torch.randperm(args.rows)[:4096]]
    agree = True
    load_average = os.getloadavg()[0]
    for rep in range(args.reps):
        agree &= repetition(saved, args, os.path.join(root, f"rep-{rep}"), rep % 2 == 1, sample, seconds)
    store.close()
    dist.destroy_process_group()
    median = {name: statistics.median(times) for name, times in seconds.items()}
    rows = []
    for name in names:
        row = {"path": name, "median s": round(median[name], 2), "GB/s": round(gigabytes / median[name], 3),
               "runs": len(seconds[name])}
        if name.startswith(("dcp", "Saver")):
            first, rest = name.split(".", 1)
            row["vs the other path"] = round(median[f"{'Saver' if first == 'dcp' else 'dcp'}.{rest}"] / median[name], 2)
        rows.append(row)
    disk = {"save": median["sequential write + fdatasync"], "load": median["cold sequential read"]}
    both = disk["save"] + disk["load"]
    # Profiled (cProfile of Saver().load of this table): fdatasync 0.66 s and pwrite 0.38 s of 2.05-2.17 s.
    copy_bound = (f"a restore copies every byte it reads into the KEY_VALUE table's disk tier, and about half of its "
                  f"time goes to those writes (fdatasync and pwrite, under cProfile): a sequential write + fdatasync "
                  f"of the same bytes took {disk['save']:.2f} s in this run, {disk['save'] / disk['load']:.1f}x its "
                  f"cold read (the restore, writing behind, {median['Saver.load']:.2f} s)")
    targets = [
        target("Saver restore GB/s of records, cold (until load returns)", gigabytes / median["Saver.load"], ">=", 0.5,
               bound=copy_bound),
        target("Saver restore / cold sequential read of the same bytes (time ratio)",
               disk["load"] / median["Saver.load"], ">=", 0.4, bound=copy_bound),
        target("Saver full save / sequential write + fdatasync of the same bytes (time ratio)",
               disk["save"] / median["Saver.save"], ">=", 0.9),
    ]
    notes = [f"{args.rows} rows x {args.dim} fp32 + row-wise Adagrad: {gigabytes:.2f} GB of records, on disk below "
             f"a {max(1, args.rows // 1000)}-row cache; the disk measured with files of the Saver data file's size",
             "cold: sync, then posix_fadvise(DONTNEED) on every file read, before each load and read",
             f"for reference, a restore reads every row and writes it into the disk tier: a cold read and a "
             f"sequential write + fdatasync of the same bytes take {both:.2f} s one after the other "
             f"({gigabytes / both:.2f} GB/s, time ratio {disk['load'] / both:.2f} of the cold read), the write alone "
             f"{disk['save']:.2f} s ({gigabytes / disk['save']:.2f} GB/s, ratio {disk['load'] / disk['save']:.2f}); "
             "not a bound: that write fills fresh page cache, the restore writes behind and reuses the pages it drops",
             f"both paths restored the same rows as written (4096 sampled IDs, every repetition): {agree}",
             f"load average at start: {load_average:.2f}"]
    for row in rows:
        print(f"{row['path']:>30}: {row['median s']:8.2f} s  {row['GB/s']:7.3f} GB/s  (runs {row['runs']})")
    for t in targets:
        print(f"target {t['what']}: {t['value']:.3f} ({t['target']}): {'met' if t['met'] else 'NOT met'}")
    for line in notes:
        print(line)
    if not agree:
        raise SystemExit("the two paths restored different rows")
    return make_result("KEY_VALUE table mostly on disk: stock DCP vs the Saver vs the disk (1 rank)",
                       "the other path and the disk's sequential write and cold read of the same bytes, same run "
                       "(alternating order)", rows, targets, notes)


if __name__ == "__main__":
    main()
