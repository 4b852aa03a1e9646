"""Benchmark of HybridTrainPipelineSparseDist at depths 1, 3 and 6 against TorchRec's TrainPipelineSparseDist, 2 ranks.

Workload (ID-mapping heavy): every rank's dataloader maps raw 63-bit feature IDs (Zipf) to table rows with the native
ID map (``IdMap.insert_or_lookup``), many IDs per sample; the tables are row-wise sharded, so every batch is also
bucketized and sent through the two input all-to-alls. Compute is a pooled EBC lookup and an MLP. Depth 1 runs
every stage of a batch before the next one starts: it is the serial baseline, and its stage timers give the share
of a step spent in host stages. Ratios are steps/s against depth 1, medians over runs measured in the same process
(variants interleaved, so machine noise hits them alike).

``--row-layouts``: each benchmark runs with the IDs' rows as the ID map hands them out ("as mapped", the workload of
every report before this option: 96% of the IDs fall in rank 0's shard) and spread over the shards ("spread", as a
real table's hashed IDs are); both are reported.

``--device-ms`` adds that much emulated accelerator time to every step's compute (a sleep on the caller's thread,
during which the host cores are free, as they are while an NPU computes). With 0, compute runs on the same CPU cores
as the host stages: on a machine with no spare core per rank, overlap cannot speed anything up there.

Each depth's line also gives its compute per step (the slower rank) and the cores busy (both ranks' CPU seconds per
wall second); from them, two ceilings of every deeper pipeline: a step is no shorter than its compute (which runs
on the caller's thread, sharing the rank's interpreter and cores with the host lanes), and overlap only moves work
onto the cores the serial pipeline leaves idle (while a step's CPU work stays the same).

Run briefly (it launches its own 2 ranks)::

    OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE .venv/bin/python benchmarks/bench_pipeline.py   # 0 and 8 ms, both layouts
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, NoReturn

import numpy as np
import torch
import torch.distributed as dist
import torchrec
from torchrec.datasets.utils import Batch
from torchrec.distributed.model_parallel import DistributedModelParallel
from torchrec.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints, Topology
from torchrec.distributed.sharding_plan import get_default_sharders
from torchrec.distributed.train_pipeline import TrainPipelineSparseDist
from torchrec.distributed.types import ShardingEnv
from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward
from torchrec.optim.keyed import KeyedOptimizerWrapper
from torchrec.optim.optimizers import in_backward_optimizer_filter
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from torchrec_ascend.conformance_tests.launch import run_distributed
from torchrec_ascend.hash.id_map import IdMap
from torchrec_ascend.pipeline import HybridTrainPipelineSparseDist, Stage
from torchrec_ascend.shutdown import end_rank

SCRAMBLE, INT63_MASK = 0x9E3779B97F4A7C15, (1 << 63) - 1  # as bench_id_map.py: Zipf ranks over the int64 range
# An ID map slot -> a table row. The map hands out slots in first-seen order, so "as mapped" puts a Zipf stream's
# IDs in the lowest rows: 96% of them in rank 0's row-wise shard (default sizes), whose rank then does nearly all
# the embedding work while the other waits. "spread" scatters them over the rows (and shards) as hashed IDs are in
# a real table.
ROW_LAYOUTS: Dict[str, Callable[[torch.Tensor, int], torch.Tensor]] = {
    "as mapped": lambda slots, rows: slots.remainder(rows),
    "spread": lambda slots, rows: (slots * 2654435761).remainder(rows),  # Knuth's multiplicative hash
}


class MappedIdLoader:
    """Endless batches whose sparse IDs are raw hashes mapped to rows by one IdMap per table (host work per batch)."""

    def __init__(self, args: argparse.Namespace, rank: int) -> None:
        self.args, self.rank = args, rank
        rng = np.random.default_rng(1234 + rank)
        pool = args.batch * args.ids_per_sample * 8
        ranks = rng.zipf(1.1, (args.tables, pool)).astype(np.uint64)
        self.raw = torch.from_numpy(((ranks * np.uint64(SCRAMBLE)) & np.uint64(INT63_MASK)).astype(np.int64))
        self.maps = [IdMap(args.id_capacity) for _ in range(args.tables)]
        self.gen = torch.Generator().manual_seed(rank)
        self.cursor = 0

    def batches(self, count: int) -> Iterator[Batch]:
        for _ in range(count):
            yield self._next()

    def _next(self) -> Batch:
        a = self.args
        n = a.batch * a.ids_per_sample
        start = self.cursor % (self.raw.shape[1] - n)
        self.cursor += n
        rows = []
        for table, id_map in enumerate(self.maps):
            slots, _ = id_map.insert_or_lookup(self.raw[table, start:start + n])
            rows.append(ROW_LAYOUTS[a.row_layout](slots, a.rows))
        lengths = torch.full((a.tables * a.batch,), a.ids_per_sample, dtype=torch.long)
        return Batch(
            dense_features=torch.randn(a.batch, a.dense, generator=self.gen),
            sparse_features=KeyedJaggedTensor.from_lengths_sync(
                keys=[f"f{t}" for t in range(a.tables)], values=torch.cat(rows), lengths=lengths
            ),
            labels=torch.randint(0, 2, (a.batch,), generator=self.gen).float(),
        )


class Model(torch.nn.Module):
    def __init__(self, a: argparse.Namespace) -> None:
        super().__init__()
        self.ebc = torchrec.EmbeddingBagCollection(
            tables=[torchrec.EmbeddingBagConfig(name=f"t{t}", num_embeddings=a.rows, embedding_dim=a.dim,
                                                feature_names=[f"f{t}"]) for t in range(a.tables)],
            device=torch.device("cpu"),
        )
        width = a.tables * a.dim + a.dense
        self.mlp = torch.nn.Sequential(
            torch.nn.Linear(width, a.hidden), torch.nn.ReLU(), torch.nn.Linear(a.hidden, a.hidden), torch.nn.ReLU(),
            torch.nn.Linear(a.hidden, 1),
        )

    def forward(self, batch: Batch) -> Any:
        pooled = self.ebc(batch.sparse_features).values()
        logits = self.mlp(torch.cat([pooled, batch.dense_features], dim=1)).squeeze(1)
        return torch.nn.functional.binary_cross_entropy_with_logits(logits, batch.labels), logits


def shard(a: argparse.Namespace, pg: dist.ProcessGroup) -> Any:
    torch.manual_seed(0)
    model = Model(a)
    apply_optimizer_in_backward(torch.optim.SGD, model.ebc.parameters(), {"lr": 0.01})
    constraints = {f"t{t}": ParameterConstraints(sharding_types=["row_wise"], compute_kernels=["fused"])
                   for t in range(a.tables)}
    planner = EmbeddingShardingPlanner(topology=Topology(world_size=pg.size(), compute_device="cpu"),
                                       constraints=constraints)
    sharders = get_default_sharders()
    dmp = DistributedModelParallel(model, env=ShardingEnv.from_process_group(pg), device=torch.device("cpu"),
                                   plan=planner.plan(model, sharders), sharders=sharders)
    dense = KeyedOptimizerWrapper(dict(in_backward_optimizer_filter(dmp.named_parameters())),
                                  lambda ps: torch.optim.SGD(ps, lr=0.01))
    return dmp, dense


def timed_run(make: Callable[[], Any], loader: MappedIdLoader, a: argparse.Namespace) -> Dict[str, Any]:
    """Steps/s of one pipeline over warmup + steps batches, and its stage seconds over the timed steps."""
    pipeline = make()
    batches = loader.batches(a.warmup + a.steps)
    for _ in range(a.warmup):
        pipeline.progress(batches)
    before = pipeline.stage_seconds() if hasattr(pipeline, "stage_seconds") else {}
    dist.barrier()
    start, cpu_start = time.perf_counter(), time.process_time()
    for _ in range(a.steps):
        pipeline.progress(batches)
    seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - cpu_start
    after = pipeline.stage_seconds() if hasattr(pipeline, "stage_seconds") else {}
    pipeline.detach()
    stages = {k: (after[k] - before.get(k, 0.0)) / a.steps for k in after}
    return {"steps_per_s": a.steps / seconds, "stage_ms": {k: 1000 * v for k, v in stages.items()},
            "cores_busy": cpu_seconds / seconds}


def rank_main(a: argparse.Namespace) -> NoReturn:
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    pg = dist.group.WORLD
    dmp, dense = shard(a, pg)
    loader = MappedIdLoader(a, pg.rank())

    def forward(batch: Batch) -> Any:
        time.sleep(a.device_ms / 1000)  # emulated accelerator compute: the host cores are free meanwhile
        return dmp(batch)

    fwd = forward if a.device_ms else None
    device = torch.device("cpu")
    variants: Dict[str, Callable[[], Any]] = {
        "stock": lambda: TrainPipelineSparseDist(dmp, dense, device, custom_model_fwd=fwd),
        **{f"depth {d}": (lambda d=d: HybridTrainPipelineSparseDist(dmp, dense, device, pipe_n_batch=d,
                                                                     custom_model_fwd=fwd)) for d in a.depths},
    }
    runs: Dict[str, List[Dict[str, Any]]] = {name: [] for name in variants}
    for _ in range(a.runs):
        for name, make in variants.items():  # interleaved: noise on this shared machine hits every variant alike
            runs[name].append(timed_run(make, loader, a))
    gathered: List[Any] = [None] * pg.size()
    dist.all_gather_object(gathered, runs, group=pg)
    if pg.rank() == 0:
        with open(a.out, "w") as f:
            json.dump({"info": {"argv": sys.argv}, "results": [{"per_rank": gathered}]}, f)
    dist.barrier()
    end_rank()


def report(a: argparse.Namespace, per_rank: List[Dict[str, List[Dict[str, Any]]]]) -> None:
    # A step takes as long as its slowest rank: per run, the lower of the ranks' rates.
    names = list(per_rank[0])
    rates = {n: [min(r[n][i]["steps_per_s"] for r in per_rank) for i in range(a.runs)] for n in names}
    median = {n: statistics.median(v) for n, v in rates.items()}
    serial = per_rank[0][f"depth {a.depths[0]}"]
    stage_ms = {k: statistics.median(run["stage_ms"][k] for run in serial) for k in serial[0]["stage_ms"]}
    host = sum(v for k, v in stage_ms.items() if k != Stage.COMPUTE.value)
    compute = stage_ms.get(Stage.COMPUTE.value, 0.0)
    print(f"\n--device-ms {a.device_ms}, rows {a.row_layout}: {a.tables} tables x {a.rows} rows x dim {a.dim}, "
          f"row_wise; batch {a.batch}, {a.ids_per_sample} IDs/sample/table "
          f"({a.batch * a.ids_per_sample * a.tables} per batch and rank); {a.runs} runs x {a.steps} steps")
    print("  serial step (depth 1, rank 0): " + ", ".join(f"{k} {v:.2f} ms" for k, v in stage_ms.items()))
    print(f"  host stages {host:.1f} ms = {100 * host / (host + compute):.0f}% of a serial step "
          f"(compute {compute:.1f} ms, of which {a.device_ms} ms emulated device time)")
    serial_name, cores = f"depth {a.depths[0]}", os.cpu_count() or 1

    def busy(name: str) -> float:  # cores busy: both ranks' CPU seconds (all threads) per wall second, median of runs
        return statistics.median(sum(r[name][i]["cores_busy"] for r in per_rank) for i in range(a.runs))

    def compute_ms(name: str) -> float:  # COMPUTE ms per step on the slower rank (median of runs); 0: not timed
        return max(statistics.median(run["stage_ms"].get(Stage.COMPUTE.value, 0.0) for run in r[name])
                   for r in per_rank)

    base, stock = median[serial_name], median["stock"]
    for name in names:
        runs = ", ".join(f"{r:.1f}" for r in rates[name])
        timed = f"compute {compute_ms(name):.2f} ms of a {1e3 / median[name]:.2f} ms step, " if compute_ms(name) else ""
        print(f"  {name:>8}: {median[name]:6.2f} steps/s (runs: {runs})  vs depth {a.depths[0]}: "
              f"{median[name] / base:.2f}x  vs stock: {median[name] / stock:.2f}x  {timed}cores busy {busy(name):.2f}")
    # What bounds a deeper pipeline: a step is never shorter than its compute on the caller's thread, and overlap
    # moves work onto idle cores without removing any (a ceiling only while a step's CPU work stays the same). On the
    # CPU the compute is Python and torch ops that take turns with the host lanes' on the rank's interpreter lock, so
    # it grows as the lanes work beside it; emulated device time (--device-ms) needs neither, and there the host
    # stages hide behind it.
    for depth in a.depths[1:]:
        name = f"depth {depth}"
        print(f"  ceilings of {name}: a step is no shorter than its compute, {compute_ms(name):.2f} ms here "
              f"({compute_ms(serial_name):.2f} at {serial_name}: the host lanes share the rank's Python interpreter "
              f"and cores with it), against a serial step of {1e3 / base:.2f} ms: "
              f"{1e3 / base / compute_ms(name):.2f}x; the cores "
              f"{serial_name} leaves idle ({busy(serial_name):.2f} of {cores} busy): {cores / busy(serial_name):.2f}x "
              f"if a step's CPU work stays what it is at {serial_name}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device-ms", type=float, nargs="+", default=[0.0, 8.0],
                        help="emulated accelerator ms per step; one benchmark per value")
    parser.add_argument("--depths", type=int, nargs="+", default=[1, 3, 6])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=4)
    parser.add_argument("--tables", type=int, default=4)
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--dim", type=int, default=16)
    parser.add_argument("--batch", type=int, default=512)
    parser.add_argument("--ids-per-sample", type=int, default=32)
    parser.add_argument("--id-capacity", type=int, default=1 << 20)
    parser.add_argument("--dense", type=int, default=16)
    parser.add_argument("--row-layouts", nargs="+", choices=list(ROW_LAYOUTS), default=list(ROW_LAYOUTS),
                        help="IDs' rows as the ID map hands them out, or spread over the shards; one benchmark each")
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--cases", help="(set by the launcher) JSON list holding one benchmark's settings")
    parser.add_argument("--out", help="(set by the launcher) where rank 0 writes results")
    a = parser.parse_args()
    if a.cases:  # a rank
        a.__dict__.update(json.loads(a.cases)[0])
        rank_main(a)  # ends the process
    for device_ms, row_layout in itertools.product(a.device_ms, a.row_layouts):
        settings = {k: v for k, v in vars(a).items() if k not in ("cases", "out", "device_ms", "row_layouts")}
        settings.update(device_ms=device_ms, row_layout=row_layout)
        run = run_distributed(Path(__file__), world_size=2, cases=[settings], timeout=900)
        report(argparse.Namespace(**settings), run["results"][0]["per_rank"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
