"""The two checkpoint paths of a KEY_VALUE table mostly on disk: stock torch.distributed.checkpoint (DCP) against
the Saver, same table, same run.

One process, a 1-rank gloo group: a hash KEY_VALUE table of ``--rows`` rows x ``--dim`` fp32 with row-wise
Adagrad, its rows written straight into the disk tier below a tiny cache and host budget. Each repetition saves it
both ways (``dcp.save`` of ``state_dict()`` and ``fused_optimizer.state_dict()``; ``Saver().save``, full), in
alternating order, then loads each into a fresh model (``dcp.load`` + ``load_state_dict``; ``Saver().load``).
Reported: median seconds and GB/s of records (weights and optimizer state) for each, DCP against the Saver, and
that both restored the same rows (a sample of IDs compared bit for bit, and with the rows written). Guides which
path to use; no target (both are bounded by this machine's disk)::

    OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE .venv/bin/python benchmarks/bench_checkpoint_paths.py --dir /work/bench
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from typing import Any, Callable, Dict, List, Tuple

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torchrec
from torchrec.distributed.model_parallel import DistributedModelParallel
from torchrec.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints, Topology
from torchrec.distributed.types import CacheParams, KeyValueParams, ShardingEnv
from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward
from torchrec.optim.rowwise_adagrad import RowWiseAdagrad

from results import make_result, write_result
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


def timed(action: Callable[[], Any]) -> float:
    os.sync()  # what an earlier step left dirty is not charged to this one
    start = time.perf_counter()
    action()
    os.sync()
    return time.perf_counter() - start


def repetition(saved: DistributedModelParallel, args: argparse.Namespace, directory: str, reverse: bool,
               sample: torch.Tensor, seconds: Dict[str, List[float]]) -> bool:
    """Save ``saved`` both ways and load each into a fresh model (``reverse``: the Saver first), adding the times to
    ``seconds``; returns whether both loads give ``sample``'s rows as written."""
    dcp_dir, saver_dir = os.path.join(directory, "dcp"), os.path.join(directory, "saver")
    saves: List[Tuple[str, Callable[[], Any]]] = [
        ("dcp.save", lambda: dcp.save({"model": saved.state_dict(), "optim": saved.fused_optimizer.state_dict()},
                                      checkpoint_id=dcp_dir)),
        ("Saver.save", lambda: Saver().save(saved, saver_dir)),
    ]
    for name, action in saves[::-1] if reverse else saves:
        seconds[name].append(timed(action))
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

        seconds[name].append(timed(load))
        restored[name] = kernel.checkpoint.read_records(0, sample)[0]
        kernel.row_tier.close()
    shutil.rmtree(directory, ignore_errors=True)
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
    seconds: Dict[str, List[float]] = {"dcp.save": [], "Saver.save": [], "dcp.load": [], "Saver.load": []}
    sample = keys_at(0, args.rows)[torch.randperm(args.rows)[:4096]]
    agree = True
    for rep in range(args.reps):
        agree &= repetition(saved, args, os.path.join(root, f"rep-{rep}"), rep % 2 == 1, sample, seconds)
    store.close()
    dist.destroy_process_group()
    rows = []
    for name, times in seconds.items():
        median = statistics.median(times)
        other = seconds[name.replace("dcp", "Saver") if name.startswith("dcp") else name.replace("Saver", "dcp")]
        rows.append({"path": name, "median s": round(median, 2), "GB/s": round(gigabytes / median, 3),
                     "vs the other path": round(statistics.median(other) / median, 2), "runs": len(times)})
    notes = [f"{args.rows} rows x {args.dim} fp32 + row-wise Adagrad: {gigabytes:.2f} GB of records, on disk below "
             f"a {max(1, args.rows // 1000)}-row cache",
             f"both paths restored the same rows as written (4096 sampled IDs, every repetition): {agree}"]
    for line in [*(f"{r['path']:>10}: {r['median s']:8.2f} s  {r['GB/s']:7.3f} GB/s" for r in rows), *notes]:
        print(line)
    if not agree:
        raise SystemExit("the two paths restored different rows")
    return make_result("KEY_VALUE table mostly on disk: stock DCP vs the Saver (1 rank)",
                       "the other path, same table, same run (alternating order)", rows, [], notes)


if __name__ == "__main__":
    main()
