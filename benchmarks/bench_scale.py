"""Scale: training a KEY_VALUE table whose rows and optimizer state are larger than this machine's memory.

One rank trains a model (one EmbeddingBagCollection table of ``--rows`` rows of ``--dim`` fp32 with row-wise
Adagrad fused into backward, a linear head, MSE) on Zipf(``--alpha``) IDs, with the KEY_VALUE kernel: a device
cache of ``--cache-rows`` rows over a host tier of ``--host-gib`` over the disk tier in ``--dir``. Every row exists
before training (the disk tier is filled with the rows the kernel would initialise, as after a restore), so the
table really is ``rows * (dim + 1) * 4`` bytes. The baseline is the same model with a table of
``--baseline-rows`` rows that the host tier holds entirely (no disk tier), on the same rank sequence.

Measured in the same run:

* the disk's own limits with ``fio`` (``dd`` and Python ``pread`` when fio is missing): random 4 KiB reads at queue
  depth 1 and 32 (the disk tier announces a batch's reads at once, so it can go past depth 1), sequential 1 MiB
  writes;
* steps/s of both models (after a warm-up that fills the cache; over ``--windows`` windows of ``--steps`` steps
  each, the two models' windows interleaved, since the load of shared cores drifts), their ratio (target >= 0.3)
  and the range of the ratios of single window pairs, the hit rate of each
  tier (device cache hits / lookups; of the rows swapped in, the share found in host memory and on disk), records
  read and written per step by the disk tier and the bytes the process read and wrote on the device
  (``/proc/self/io``), with the fraction of the disk's measured throughput they reach;
* peak RSS (``VmHWM``) against the promise: device cache + host budget + disk index + a constant;
* host memory per disk-resident key (target <= 16 B at 10M keys): the RSS growth of a fresh process that builds a
  table of each ``--memory-keys`` size through the planner and DMP and fills it, over its keys on disk;
* checkpoints (``Saver``) of a sub-table of ``--ckpt-rows`` rows, mostly on disk (the full table and its
  checkpoint do not fit the free disk together): full and incremental save GB/s against the disk's sequential
  write throughput, the incremental bytes when 10% of the rows changed, and the restore's GB/s and peak RSS (a
  load streams the rows below the pool, so the sub-table may be larger than memory).

It refuses to start without the free disk it needs, deletes everything it wrote (also on failure or Ctrl-C) and
writes its numbers into ``benchmarks/REPORT.md`` (its own section, the rest kept). Not part of ``run_all.py``'s
default run (it needs ~60 GB of disk and ~20 minutes); run it with ``scripts/run-scale-benchmark``::

    scripts/run-scale-benchmark                          # full size: 200M rows x 64 fp32 + Adagrad, ~55 GB
    scripts/run-scale-benchmark --rows 4000000 --baseline-rows 1000000 --ckpt-rows 1000000 --steps 10  # dry run
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import re
import resource
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Tuple

import torch
import torch.distributed as dist
import torchrec
from torch.distributed.optim import _apply_optimizer_in_backward as apply_optimizer_in_backward
from torchrec.distributed.model_parallel import DistributedModelParallel
from torchrec.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints, Topology
from torchrec.distributed.types import CacheParams, KeyValueParams, ShardingEnv
from torchrec.optim.keyed import KeyedOptimizerWrapper
from torchrec.optim.optimizers import in_backward_optimizer_filter
from torchrec.optim.rowwise_adagrad import RowWiseAdagrad
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from torchrec_ascend import Saver, get_default_hybrid_sharders
from torchrec_ascend.checkpoint.restore import available_memory
from torchrec_ascend.errors import StorageError
from torchrec_ascend.kernels.key_value import cache_metrics
from torchrec_ascend.kernels.key_value.kernel import KeyValueRows
from torchrec_ascend.kernels.walk import sharded_kernels
from torchrec_ascend.native.memory import trim_heap

HERE = Path(__file__).resolve().parent
REPORT = HERE / "REPORT.md"
SECTION = "## Scale: a KEY_VALUE table larger than memory (bench_scale.py)"
TARGET = 0.3
MEMORY_TARGET = 16  # bytes of host memory per disk-resident key, in total (issue 32)
RECORD_OVERHEAD = 16  # key and checksum words of a disk record
CONSTANT_BYTES = 512 << 20  # the promise's constant: a batch's temporaries, autograd, the dense part, heap slack
GIB = 1 << 30


# -- the disk's own limits ---------------------------------------------------------------------------------------------

def fio(directory: str, rw: str, bs: str, depth: int, seconds: int) -> Optional[float]:
    """MB/s of one fio job on a 4 GiB file in ``directory`` (O_DIRECT), or None when fio is missing."""
    if shutil.which("fio") is None:
        return None
    path = os.path.join(directory, "fio.dat")
    engine = "libaio" if depth > 1 else "psync"
    command = ["fio", "--name=disk", f"--filename={path}", "--size=4G", f"--rw={rw}", f"--bs={bs}", "--direct=1",
               f"--ioengine={engine}", f"--iodepth={depth}", f"--runtime={seconds}", "--time_based",
               "--output-format=json"]
    try:
        out = json.loads(subprocess.run(command, capture_output=True, text=True, check=True).stdout)
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)
    job = out["jobs"][0]["read" if "read" in rw else "write"]
    return job["bw_bytes"] / 1e6


def dd_write(directory: str) -> float:
    """MB/s of a 2 GiB sequential O_DIRECT write with dd (fio's stand-in)."""
    path = os.path.join(directory, "dd.dat")
    try:
        done = subprocess.run(["dd", "if=/dev/zero", f"of={path}", "bs=16M", "count=128", "oflag=direct"],
                              capture_output=True, text=True, check=True)
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)
    seconds = float(re.search(r"copied, ([\d.]+) s", done.stderr).group(1))
    return 2 * GIB / seconds / 1e6


def disk_limits(directory: str, seconds: int) -> Dict[str, Any]:
    """The disk's random-read and sequential-write throughput, measured now."""
    limits = {"tool": "fio" if shutil.which("fio") else "dd"}
    limits["seq_write_MBps"] = fio(directory, "write", "1M", 1, seconds) or dd_write(directory)
    limits["rand_read_4k_qd1_MBps"] = fio(directory, "randread", "4k", 1, seconds)
    limits["rand_read_4k_qd32_MBps"] = fio(directory, "randread", "4k", 32, seconds)
    return limits


# -- the model and its traffic ---------------------------------------------------------------------------------------

class Model(torch.nn.Module):
    """One pooled embedding table and a linear head, trained with MSE."""

    def __init__(self, rows: int, dim: int) -> None:
        super().__init__()
        table = torchrec.EmbeddingBagConfig(name="item", num_embeddings=rows, embedding_dim=dim,
                                            feature_names=["item"])
        self.ebc = torchrec.EmbeddingBagCollection(tables=[table], device=torch.device("meta"))
        self.head = torch.nn.Linear(dim, 1)

    def forward(self, features: KeyedJaggedTensor, target: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.mse_loss(self.head(self.ebc(features)["item"]).squeeze(1), target)


class Traffic:
    """Batches of Zipf(alpha) ranks over ``rows`` IDs (a continuous power-law inverse CDF), each rank mapped to a
    row by a fixed multiplicative permutation (hot rows spread over the whole table). The same seed gives the same
    rank sequence whatever ``rows``."""

    MULTIPLIER = 2654435761  # odd and not a multiple of 5: a permutation of [0, rows) for rows = 2**a * 5**b

    def __init__(self, rows: int, alpha: float, batch: int, pooling: int, seed: int) -> None:
        self.rows, self.alpha, self.batch, self.pooling = rows, alpha, batch, pooling
        self.generator = torch.Generator().manual_seed(seed)

    def ids(self, count: int) -> torch.Tensor:
        u = torch.rand(count, dtype=torch.float64, generator=self.generator)
        e = 1.0 - self.alpha
        ranks = ((1.0 + u * ((self.rows + 1.0) ** e - 1.0)) ** (1.0 / e) - 1.0).floor().long().clamp_(0, self.rows - 1)
        return self.row_of(ranks)

    def row_of(self, ranks: torch.Tensor) -> torch.Tensor:
        """The row of each Zipf rank (0 is the most frequent)."""
        return ranks * self.MULTIPLIER % self.rows

    def next(self) -> Tuple[KeyedJaggedTensor, torch.Tensor]:
        values = self.ids(self.batch * self.pooling)
        lengths = torch.full((self.batch,), self.pooling, dtype=torch.int32)
        target = torch.rand(self.batch, generator=self.generator)
        return KeyedJaggedTensor.from_lengths_sync(keys=["item"], values=values, lengths=lengths), target


def build(rows: int, dim: int, cache_rows: int, host_gib: float, directory: Optional[str]) -> Tuple[Any, Any]:
    """The model sharded by DMP (1 rank, table_wise, KEY_VALUE) and its dense optimizer."""
    torch.manual_seed(0)
    model = Model(rows, dim)
    apply_optimizer_in_backward(RowWiseAdagrad, [model.ebc.embedding_bags["item"].weight], {"lr": 0.05})
    constraints = {"item": ParameterConstraints(
        sharding_types=["table_wise"], compute_kernels=["key_value"],
        cache_params=CacheParams(load_factor=cache_rows / rows),
        key_value_params=KeyValueParams(l2_cache_size=host_gib, ssd_storage_directory=directory))}
    sharders = get_default_hybrid_sharders()
    topology = Topology(world_size=1, compute_device="cpu", hbm_cap=1 << 50, ddr_cap=1 << 50)
    plan = EmbeddingShardingPlanner(topology=topology, constraints=constraints).plan(model, sharders)
    dmp = DistributedModelParallel(model, env=ShardingEnv.from_process_group(dist.group.WORLD),
                                   device=torch.device("cpu"), plan=plan, sharders=sharders)
    dense = KeyedOptimizerWrapper(dict(in_backward_optimizer_filter(dmp.named_parameters())),
                                  lambda params: torch.optim.Adagrad(params, lr=0.05))
    return dmp, dense


def kernel_of(dmp: Any) -> KeyValueRows:
    (kernel,) = [k for k in sharded_kernels(dmp) if isinstance(k, KeyValueRows)]
    return kernel


def initial_chunks(kernel: KeyValueRows, ids: torch.Tensor, chunk: int) -> Iterator[Tuple[torch.Tensor, torch.Tensor]]:
    """The rows of ``ids`` as the kernel initialises them on first use: initial weights, zero optimizer state."""
    width = kernel.row_width(0)
    for part in ids.split(chunk):
        packed = torch.zeros(part.numel(), width)
        packed[:, : kernel._local_cols[0]] = kernel.initial_rows(0, part)
        yield part, packed


def fill(kernel: KeyValueRows, traffic: "Traffic", chunk: int = 1 << 18) -> float:
    """Create every row below the cache, as after a long run: the hottest IDs (by Zipf rank) in the host tier as
    far as it holds them, the rest bulk-loaded into the disk tier. Returns seconds."""
    start = time.perf_counter()
    store, rows = kernel._stores[0], traffic.rows
    hot = traffic.row_of(torch.arange(min(rows, store.max_rows)))
    for ids, packed in initial_chunks(kernel, hot, chunk):
        store.put(ids, packed)
    if store.spill is not None and hot.numel() < rows:
        cold = torch.ones(rows, dtype=torch.bool)
        cold[hot] = False
        store.spill.bulk_load(initial_chunks(kernel, cold.nonzero().squeeze(1), chunk))
    return time.perf_counter() - start


def step(dmp: Any, dense: Any, batch: Tuple[KeyedJaggedTensor, torch.Tensor]) -> None:
    loss = dmp(*batch)
    loss.backward()
    dense.step()
    dense.zero_grad()


def process_io() -> Dict[str, int]:
    fields = dict(line.split(": ") for line in Path("/proc/self/io").read_text().splitlines())
    return {"read_bytes": int(fields["read_bytes"]), "write_bytes": int(fields["write_bytes"])}


def peak_rss() -> int:
    match = re.search(r"VmHWM:\s+(\d+) kB", Path("/proc/self/status").read_text())
    return int(match.group(1)) * 1024


def current_rss() -> int:
    return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def reset_peak_rss() -> None:
    with contextlib.suppress(OSError):
        Path("/proc/self/clear_refs").write_text("5")


def counters(dmp: Any) -> Dict[str, int]:
    stats = cache_metrics(dmp)["item"]
    return {**stats, **process_io()}


class Timed:
    """One model under its traffic, timed in windows of steps; its counters add up over the timed windows only, so
    windows of two models can interleave (same machine state for both: the load of these shared cores drifts)."""

    def __init__(self, name: str, dmp: Any, dense: Any, traffic: Traffic) -> None:
        self.name, self.dmp, self.dense, self.traffic = name, dmp, dense, traffic
        self.rates: List[float] = []
        self.steps = 0
        self.seconds = 0.0
        self.delta: Dict[str, int] = {}

    def warm(self, steps: int) -> None:
        for _ in range(steps):
            step(self.dmp, self.dense, self.traffic.next())

    def window(self, steps: int) -> None:
        batches = [self.traffic.next() for _ in range(steps)]
        before = counters(self.dmp)
        start = time.perf_counter()
        for batch in batches:
            step(self.dmp, self.dense, batch)
        seconds = time.perf_counter() - start
        after = counters(self.dmp)
        for k in after:
            if isinstance(after[k], int):
                self.delta[k] = self.delta.get(k, 0) + after[k] - before[k]
        self.rates.append(steps / seconds)
        self.steps += steps
        self.seconds += seconds

    def result(self) -> Dict[str, Any]:
        """Steps/s over all windows together (the host tier's periodic spills included, which a median of windows
        would hide), each window's steps/s; hit rates and I/O per step over all windows."""
        d, steps, seconds = self.delta, self.steps, self.seconds
        record_bytes = kernel_of(self.dmp)._stores[0].row_bytes + RECORD_OVERHEAD
        swapped_in = max(1, d["swapped_in"])
        at_end = counters(self.dmp)
        out = {
            "name": self.name, "steps": steps, "seconds": seconds, "steps_per_s": steps / seconds,
            "window_steps_per_s": self.rates, "ids_per_step": self.traffic.batch * self.traffic.pooling,
            "cache_hit_rate": d["hits"] / max(1, d["lookups"]),
            "swapped_in_per_step": d["swapped_in"] / steps, "initialised_per_step": d["initialised"] / steps,
            "host_share_of_swapped_in": d["host_reads"] / swapped_in,
            "disk_share_of_swapped_in": d["disk_reads"] / swapped_in,
            "disk_records_read_per_step": d["disk_records_read"] / steps,
            "disk_records_written_per_step": d["disk_records_written"] / steps,
            "disk_tier_MB_read_per_step": d["disk_records_read"] * record_bytes / steps / 1e6,
            "disk_tier_MB_written_per_step": d["disk_records_written"] * record_bytes / steps / 1e6,
            "device_MB_read_per_s": d["read_bytes"] / seconds / 1e6,
            "device_MB_written_per_s": d["write_bytes"] / seconds / 1e6,
            "device_MB_read_per_step": d["read_bytes"] / steps / 1e6,
            "device_MB_written_per_step": d["write_bytes"] / steps / 1e6,
            "tiers_at_end": {k: at_end[k] for k in ("cache_rows", "host_rows", "disk_rows", "host_bytes", "disk_bytes",
                                                     "disk_index_bytes", "budget_bytes")},
        }
        print(json.dumps(out), flush=True)
        return out


def interleaved(models: Tuple[Timed, Timed], windows: int, steps: int) -> List[float]:
    """Time ``windows`` windows of ``steps`` steps of each model, alternating which goes first; returns the ratio
    second / first of steps/s of each window pair (their spread shows the noise and the periodic spills)."""
    first, second = models
    for w in range(windows):
        for m in (first, second) if w % 2 == 0 else (second, first):
            m.window(steps)
    return [b / a for a, b in zip(first.rates, second.rates)]


# -- checkpoints of a sub-table --------------------------------------------------------------------------------------

def tree_bytes(path: str) -> int:
    return sum(f.stat().st_size for f in Path(path).rglob("*") if f.is_file())


def read_rows(dmp: Any, ids: torch.Tensor) -> torch.Tensor:
    """The rows of ``ids`` as an eval-mode forward sees them (from whichever tier holds them)."""
    features = KeyedJaggedTensor.from_lengths_sync(keys=["item"], values=ids,
                                                   lengths=torch.ones(ids.numel(), dtype=torch.int32))
    dmp.eval()
    try:
        with torch.no_grad():
            return dmp.module.ebc(features)["item"].clone()
    finally:
        dmp.train()


def full_disk(dmp: Any, dense: Any, directory: str, probe: torch.Tensor, rows: int, batch: int) -> Dict[str, Any]:
    """A disk that fills up mid-run: training batches of IDs outside ``probe`` until a write fails, then checks that
    the batch failed with a StorageError, that every probed row reads the same, and that training goes on once
    there is room again. A file-size limit (``RLIMIT_FSIZE`` at the size of the segment file being appended, with
    ``SIGXFSZ`` ignored) stands in for the full disk: the segment write fails the same way (``EFBIG`` where a full
    disk gives ``ENOSPC``), without filling this machine's disk."""
    before = read_rows(dmp, probe)
    outside = torch.ones(rows, dtype=torch.bool)
    outside[probe] = False
    pool = outside.nonzero().squeeze(1)
    generator = torch.Generator().manual_seed(4)

    def batch_of_ids() -> Tuple[KeyedJaggedTensor, torch.Tensor]:
        ids = pool[torch.randint(0, pool.numel(), (batch,), generator=generator)]
        return (KeyedJaggedTensor.from_lengths_sync(keys=["item"], values=ids,
                                                    lengths=torch.ones(batch, dtype=torch.int32)), torch.rand(batch))

    files = [f for f in Path(directory).rglob("*.rows") if f.is_file()]
    active = max(files, key=lambda f: f.stat().st_mtime_ns)
    limits = resource.getrlimit(resource.RLIMIT_FSIZE)
    handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (active.stat().st_size, limits[1]))
    error, steps = None, 0
    try:
        while error is None and steps < 200:
            try:
                step(dmp, dense, batch_of_ids())
                steps += 1
            except StorageError as failure:
                error = str(failure)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, limits)
        signal.signal(signal.SIGXFSZ, handler)
    kept = torch.equal(read_rows(dmp, probe), before)
    step(dmp, dense, batch_of_ids())  # raises if the kernel cannot go on
    return {"full_disk_steps": steps, "full_disk_error": error, "full_disk_rows_kept": kept}


def damage_segments(directory: str, places: int = 16) -> int:
    """Overwrite 64 bytes at ``places`` random offsets in the first half of every segment file under
    ``directory`` (as a failing disk would); returns the files damaged."""
    files = [f for f in Path(directory).rglob("*") if f.is_file() and f.stat().st_size > 1 << 20]
    generator = torch.Generator().manual_seed(3)
    for f in files:
        with open(f, "r+b") as out:
            for offset in torch.randint(0, f.stat().st_size // 2, (places,), generator=generator).tolist():
                out.seek(offset)
                out.write(os.urandom(64))
    return len(files)


def checkpoints(args: argparse.Namespace, work: str) -> Dict[str, Any]:
    """Full save, 10% of the rows changed by training, incremental save, and a restore of both, of a sub-table
    mostly on disk."""
    rows = args.ckpt_rows
    dmp, dense = build(rows, args.dim, args.cache_rows, args.host_gib / 4, os.path.join(work, "ckpt-table"))
    kernel = kernel_of(dmp)
    fill(kernel, Traffic(rows, args.alpha, args.batch, args.pooling, seed=7))
    path = os.path.join(work, "ckpt")
    saver = Saver()
    start = time.perf_counter()
    saver.save(dmp, path)
    full_s = time.perf_counter() - start
    full_bytes = tree_bytes(path)
    changed = torch.randperm(rows, generator=torch.Generator().manual_seed(1))[: rows // 10]
    per_batch = min(args.cache_rows // 2, 65536)
    for ids in changed.split(per_batch):
        features = KeyedJaggedTensor.from_lengths_sync(keys=["item"], values=ids,
                                                       lengths=torch.ones(ids.numel(), dtype=torch.int32))
        step(dmp, dense, (features, torch.rand(ids.numel())))
    start = time.perf_counter()
    saver.save(dmp, path, incremental=True)
    incremental_s = time.perf_counter() - start
    incremental_bytes = tree_bytes(path) - full_bytes
    probe = torch.randperm(rows, generator=torch.Generator().manual_seed(2))[:65536]
    filled_up = full_disk(dmp, dense, os.path.join(work, "ckpt-table"), probe, rows, per_batch)
    # A failing disk after that save: the next save must fail naming the damaged file, and the last complete
    # save must still restore every row bit for bit (the full-disk check trained no probed row).
    expected = read_rows(dmp, probe)
    damaged_files = damage_segments(os.path.join(work, "ckpt-table"))
    try:
        saver.save(dmp, path)
        damage_error = None
    except StorageError as error:
        damage_error = str(error)
    kernel.close()
    del dmp, dense, kernel
    restored, _ = build(rows, args.dim, args.cache_rows, args.host_gib / 4, os.path.join(work, "restored-table"))
    trim_heap()  # what the sub-table freed goes back to the system: the growth below is the load's own
    rss_before_restore, available = current_rss(), available_memory()
    reset_peak_rss()
    start = time.perf_counter()
    saver.load(restored, path)
    restore_s = time.perf_counter() - start
    restore_rss_growth = peak_rss() - rss_before_restore
    tiers = cache_metrics(restored)["item"]
    restored_stats = kernel_of(restored)._stores[0].stats()
    restored_equal = torch.equal(read_rows(restored, probe), expected)
    kernel_of(restored).close()
    out = {"rows": rows, "table_GB": rows * (args.dim + 1) * 4 / 1e9, "full_bytes": full_bytes,
           "full_s": full_s, "full_GBps": full_bytes / full_s / 1e9, "changed_rows": changed.numel(),
           "incremental_bytes": incremental_bytes, "incremental_s": incremental_s,
           "incremental_GBps": incremental_bytes / incremental_s / 1e9,
           "incremental_share_of_full": incremental_bytes / full_bytes,
           "restore_s": restore_s, "restore_GBps": (full_bytes + incremental_bytes) / restore_s / 1e9,
           "restore_rss_growth": restore_rss_growth, "available_before_restore": available,
           "restored_host_bytes": restored_stats["host_bytes"],
           "restored_index_bytes": restored_stats["disk_index_bytes"],
           "restored_tier_rows": {k: tiers[k] for k in ("cache_rows", "host_rows", "disk_rows")},
           "damaged_files": damaged_files, "damage_error": damage_error, "probe_rows": probe.numel(),
           "restored_equal": restored_equal, **filled_up}
    print(json.dumps(out), flush=True)
    return out


def memory_probe(rows: int, dim: int, directory: str) -> Dict[str, Any]:
    """Resident-set growth per disk-resident key of a KEY_VALUE table of ``rows`` rows built through the planner and
    DMP (host tier of 1 MiB: nearly every row on disk) and filled as :func:`fill` does. Run in a fresh process
    (``--memory-probe``), so nothing of an earlier stage is in the numbers, after a small table was built, filled
    and closed, so neither are the modules and caches any first table loads (about 16 MB)."""
    os.makedirs(directory, exist_ok=True)

    def filled(size: int) -> Tuple[Any, KeyValueRows]:
        dmp, _ = build(size, dim, 4096, 1 / 1024, directory)
        fill(kernel_of(dmp), Traffic(size, 1.05, 2048, 8, seed=7))
        return dmp, kernel_of(dmp)

    trim_heap()
    start = current_rss()
    _, warm_up = filled(1 << 16)
    warm_up.close()
    del warm_up
    trim_heap()
    before = current_rss()
    dmp, kernel = filled(rows)
    trim_heap()
    after = current_rss()
    stats = kernel._stores[0].stats()
    disk_rows = stats["disk_rows"]
    out = {"rows": rows, "disk_rows": disk_rows, "rss_growth": after - before,
           "B_per_disk_key": (after - before) / disk_rows,
           "first_table_bytes": before - start, "B_per_disk_key_with_first_table": (after - start) / disk_rows,
           "index_B_per_disk_key": stats["disk_index_bytes"] / disk_rows, "host_bytes": stats["host_bytes"]}
    kernel.close()
    return out


def memory_per_disk_key(sizes: List[int], dim: int, work: str) -> List[Dict[str, Any]]:
    """:func:`memory_probe` of each size, each in its own process."""
    results = []
    for rows in sizes:
        command = [sys.executable, __file__, "--memory-probe", str(rows), "--dim", str(dim),
                   "--dir", os.path.join(work, f"memory-{rows}")]
        done = subprocess.run(command, capture_output=True, text=True, check=True)
        results.append(json.loads(done.stdout.strip().splitlines()[-1]))
        print(json.dumps(results[-1]), flush=True)
    return results


# -- the report -------------------------------------------------------------------------------------------------------

def gb(n: float) -> str:
    return f"{n / 1e9:.2f} GB"


def section(args: argparse.Namespace, r: Dict[str, Any]) -> str:
    big, base, disk, ck = r["scale"], r["baseline"], r["disk"], r["checkpoint"]
    ratio = big["steps_per_s"] / base["steps_per_s"]
    seq = disk["seq_write_MBps"]
    qd1 = disk.get("rand_read_4k_qd1_MBps")
    lines = [
        SECTION, "",
        f"Run {r['date']} (`{r['command']}`), 1 rank, load average at start {r['load']}. Table `item`: "
        f"{args.rows:,} rows x {args.dim} fp32 + row-wise Adagrad = {gb(r['table_bytes'])} of rows and optimizer "
        f"state ({r['table_bytes'] / r['ram_bytes']:.2f}x this machine's {gb(r['ram_bytes'])} of RAM), "
        f"{gb(r['disk_bytes'])} of segment files; Zipf({args.alpha}) IDs, {args.batch} samples x {args.pooling} IDs "
        f"a step; device cache {args.cache_rows:,} rows, host tier {args.host_gib} GiB. Filled (bulk load, as after "
        f"a restore) in {r['fill_s']:.0f} s.",
        "",
        f"Steps/s: {args.windows} windows of {args.steps} steps per model, the two models' windows interleaved "
        f"(after {args.warmup} warm-up steps each), steps over the seconds of all windows (periodic spills "
        f"included); the ratio of those, and the range of the ratios of single window pairs.",
        "",
        "| model | steps/s | vs host-memory table | cache hit rate | swapped in / step (host / disk share) | "
        "disk records read / written per step | device MB read / written per step |",
        "|---|---|---|---|---|---|---|",
    ]
    spread = f"{min(r['window_ratios']):.2f}-{max(r['window_ratios']):.2f}"
    for m, vs in ((base, "1.00 (baseline)"), (big, f"{ratio:.2f}, windows {spread} (target >= {TARGET}: "
                                               f"{'met' if ratio >= TARGET else 'NOT met'})")):
        lines.append(
            f"| {m['name']} | {m['steps_per_s']:.2f} | {vs} | {m['cache_hit_rate']:.3f} | "
            f"{m['swapped_in_per_step']:.0f} ({m['host_share_of_swapped_in']:.2f} / "
            f"{m['disk_share_of_swapped_in']:.2f})"
            f" | {m['disk_records_read_per_step']:.0f} / {m['disk_records_written_per_step']:.0f} | "
            f"{m['device_MB_read_per_step']:.1f} / {m['device_MB_written_per_step']:.1f} |")
    lines += [
        "",
        f"Disk ({disk['tool']}, measured in this run): sequential 1 MiB writes {seq:.0f} MB/s; random 4 KiB reads "
        f"{qd1 or float('nan'):.0f} MB/s at queue depth 1, {disk.get('rand_read_4k_qd32_MBps') or float('nan'):.0f} "
        f"MB/s at 32. The disk tier reached {big['device_MB_read_per_s']:.1f} MB/s of device reads "
        f"({big['device_MB_read_per_s'] / qd1 if qd1 else float('nan'):.2f} of the QD1 random-read limit) and "
        f"{big['device_MB_written_per_s']:.1f} MB/s of writes ({big['device_MB_written_per_s'] / seq:.2f} of the "
        f"sequential limit).",
        "",
        f"Peak RSS while training {gb(r['peak_rss'])} against the promise {gb(r['promise'])}: RSS before the model "
        f"{gb(r['rss_before'])} + device cache {gb(r['cache_bytes'])} + host budget {gb(r['host_budget'])} + disk "
        f"index {gb(r['disk_index_bytes'])} ({r['disk_index_bytes'] / max(1, big['tiers_at_end']['disk_rows']):.1f} "
        f"B a disk key) + {CONSTANT_BYTES >> 20} MiB ({'kept' if r['peak_rss'] <= r['promise'] else 'NOT kept'}); "
        f"peak while filling (the bulk load holds 16 B a row besides the index) {gb(r['peak_rss_fill'])}.",
        "",
        memory_sentence(r["memory"]),
        "",
        f"Checkpoints (`Saver`) of a sub-table of {ck['rows']:,} rows ({ck['table_GB']:.1f} GB, mostly on disk; the "
        f"full table and its checkpoint do not fit the free disk together): full save {gb(ck['full_bytes'])} "
        f"({ck['full_bytes'] / r['ram_bytes']:.2f}x RAM) in "
        f"{ck['full_s']:.0f} s = {ck['full_GBps']:.2f} GB/s ({ck['full_GBps'] * 1e3 / seq:.2f} of the disk's "
        f"sequential writes); after training changed {ck['changed_rows']:,} rows (10%), the incremental save wrote "
        f"{gb(ck['incremental_bytes'])} ({ck['incremental_share_of_full']:.2f} of the full save) in "
        f"{ck['incremental_s']:.1f} s = {ck['incremental_GBps']:.2f} GB/s; restoring both into a fresh model "
        f"took {ck['restore_s']:.0f} s = {ck['restore_GBps']:.2f} GB/s of checkpoint (the rows below the pool are "
        f"read once, each block stored into the empty tiers as it is checked); the process's peak RSS rose "
        f"{gb(ck['restore_rss_growth'])} during the load, of which the host tier (filled first) holds "
        f"{gb(ck['restored_host_bytes'])} and the disk index {gb(ck['restored_index_bytes'])} "
        f"({gb(ck['available_before_restore'] or 0)} of memory were available before it).",
        "",
        full_disk_sentence(ck),
        "",
        damage_sentence(ck),
        "",
    ]
    return "\n".join(lines)


def memory_sentence(probes: List[Dict[str, Any]]) -> str:
    """The RSS growth per disk-resident key at each probed size, against the 16 B target."""
    if not probes:
        return "Memory per disk key: not measured (--memory-keys empty)."
    sizes = "; ".join(
        f"{m['disk_rows']:,} disk keys: {m['B_per_disk_key']:.1f} B (index {m['index_B_per_disk_key']:.1f} B; "
        f"{m['B_per_disk_key_with_first_table']:.1f} B counting the first table's modules and caches)"
        for m in probes)
    last = probes[-1]
    verdict = "met" if last["B_per_disk_key_with_first_table"] <= MEMORY_TARGET else "NOT met"
    return (f"Host memory per disk-resident key (RSS growth after `malloc_trim` of a fresh process that builds the "
            f"table through the planner and DMP with a 1 MiB host tier and fills it as above, divided by the keys on "
            f"disk; measured after a first table of 65,536 rows was built, filled and closed, and also counting "
            f"that first table's one-off {probes[-1]['first_table_bytes'] / 1e6:.0f} MB): {sizes}. Target <= "
            f"{MEMORY_TARGET} B at the largest size, both ways: {verdict}.")


def full_disk_sentence(ck: Dict[str, Any]) -> str:
    failed = (f"failed in step {ck['full_disk_steps'] + 1}: `StorageError: {ck['full_disk_error'][:300]}`"
              if ck["full_disk_error"] else f"did NOT fail in {ck['full_disk_steps']} steps")
    kept = "the same, bit for bit" if ck["full_disk_rows_kept"] else "DIFFERENTLY"
    return (f"Full disk mid-run (a file-size limit at the appended segment's size stands in for it: the same failed "
            f"segment write, EFBIG instead of ENOSPC): training the sub-table on IDs outside the "
            f"{ck['probe_rows']:,} probed rows {failed}; the probed rows then read {kept}, and training went on "
            f"once the limit was lifted.")


def damage_sentence(ck: Dict[str, Any]) -> str:
    if not ck["damaged_files"]:
        return "Damaged disk: NOT exercised (the sub-table had no segment files: raise --ckpt-rows)."
    failed = f"failed: `StorageError: {ck['damage_error'][:300]}`" if ck["damage_error"] else "did NOT fail"
    return (f"Damaged disk: after the incremental save, 64-byte pieces of all {ck['damaged_files']} segment files "
            f"of the live table were overwritten. The next save {failed}; the last complete save restored "
            f"{ck['probe_rows']:,} probed rows {'bit for bit' if ck['restored_equal'] else 'WRONGLY'} (eval-mode "
            f"lookups before the damage vs after the restore).")


def write_report(text: str, path: Path) -> None:
    """Replace this benchmark's section of the report (or append it), keeping every other section."""
    old = path.read_text() if path.exists() else ""
    start = old.find(SECTION)
    if start < 0:
        new = old.rstrip("\n") + "\n\n" + text
    else:
        following = old.find("\n## ", start + len(SECTION))
        new = old[:start] + text + ("\n" + old[following + 1 :] if following >= 0 else "")
    path.write_text(new)


# -- main -------------------------------------------------------------------------------------------------------------

def needed_disk(args: argparse.Namespace) -> int:
    record = (args.dim + 1) * 4 + RECORD_OVERHEAD
    table = args.rows * record * 1.005  # the segments and the garbage training leaves (fio's file is gone by then)
    # The sub-table with the garbage of its 10% changed rows, its full save and increment (records + 8 B), then the
    # saves and the restored copy (the sub-table is gone by then): at most ~2.25x the segments.
    ckpt = args.ckpt_rows * record * 2.4
    memory = max(args.memory_keys, default=0) * record * 1.005  # the memory probes run one at a time
    return int(max(table, ckpt, memory, 4 * GIB) + GIB + args.reserve_gib * GIB)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=200_000_000)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--baseline-rows", type=int, default=4_000_000)
    parser.add_argument("--ckpt-rows", type=int, default=16_000_000)
    parser.add_argument("--cache-rows", type=int, default=262_144)
    parser.add_argument("--host-gib", type=float, default=2.0)
    parser.add_argument("--alpha", type=float, default=1.05)
    parser.add_argument("--batch", type=int, default=2048)
    parser.add_argument("--pooling", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=100)
    parser.add_argument("--steps", type=int, default=20, help="steps per timed window")
    parser.add_argument("--windows", type=int, default=5, help="timed windows per model, interleaved")
    parser.add_argument("--fio-seconds", type=int, default=15)
    parser.add_argument("--dir", default="/work/scale-bench")
    parser.add_argument("--reserve-gib", type=float, default=15.0, help="free disk to leave to others")
    parser.add_argument("--report", type=Path, default=REPORT)
    parser.add_argument("--json", type=Path, default=None, help="also write the raw numbers here")
    parser.add_argument("--memory-keys", type=lambda text: [int(float(x)) for x in text.split(",")],
                        default=[1_000_000, 3_000_000, 10_000_000],
                        help="table sizes (comma-separated) whose RSS growth per disk key is measured")
    parser.add_argument("--memory-probe", type=int, default=None, help=argparse.SUPPRESS)  # one size, in a child
    args = parser.parse_args()
    if args.memory_probe is not None:
        init_single_rank()
        print(json.dumps(memory_probe(args.memory_probe, args.dim, args.dir)), flush=True)
        return

    os.makedirs(args.dir, exist_ok=True)
    work = os.path.join(args.dir, f"run-{os.getpid()}")
    free = shutil.disk_usage(args.dir).free
    need = needed_disk(args)
    if free < need:
        sys.exit(f"bench_scale: refusing to start: {args.dir} has {gb(free)} free, the run needs {gb(need)} "
                 f"(table segments or checkpoints, and --reserve-gib for others); free space or pass smaller "
                 f"--rows/--ckpt-rows")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("bench_scale: terminated"))  # finally-blocks clean up
    os.makedirs(work)
    try:
        run(args, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        with contextlib.suppress(OSError):
            os.rmdir(args.dir)
        print(f"bench_scale: removed {work}", flush=True)


def init_single_rank() -> None:
    torch.set_num_threads(1)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1")
    dist.init_process_group("gloo")


def run(args: argparse.Namespace, work: str) -> None:
    init_single_rank()
    r: Dict[str, Any] = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
                         "command": "scripts/run-scale-benchmark " + " ".join(sys.argv[1:]),
                         "load": os.getloadavg()[0],
                         "ram_bytes": os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"),
                         "table_bytes": args.rows * (args.dim + 1) * 4}
    r["disk"] = disk_limits(work, args.fio_seconds)
    print(json.dumps(r["disk"]), flush=True)
    r["memory"] = memory_per_disk_key(args.memory_keys, args.dim, work)

    dmp, dense = build(args.baseline_rows, args.dim, args.cache_rows, 64.0, None)
    traffic = Traffic(args.baseline_rows, args.alpha, args.batch, args.pooling, seed=7)
    fill(kernel_of(dmp), traffic)
    base = Timed(f"{args.baseline_rows:,} rows in host memory", dmp, dense, traffic)
    base.warm(args.warmup)

    r["rss_before"] = current_rss()  # the baseline model stays: its windows interleave with the big one's
    reset_peak_rss()
    dmp, dense = build(args.rows, args.dim, args.cache_rows, args.host_gib, os.path.join(work, "table"))
    kernel = kernel_of(dmp)
    traffic = Traffic(args.rows, args.alpha, args.batch, args.pooling, seed=7)
    r["fill_s"] = fill(kernel, traffic)
    r["peak_rss_fill"] = peak_rss()
    r["disk_bytes"] = kernel._stores[0].stats()["disk_bytes"]
    reset_peak_rss()
    big = Timed(f"{args.rows:,} rows, disk tier", dmp, dense, traffic)
    big.warm(args.warmup)
    r["window_ratios"] = interleaved((base, big), args.windows, args.steps)
    r["baseline"], r["scale"] = base.result(), big.result()
    r["peak_rss"] = peak_rss()
    stats = kernel._stores[0].stats()
    r["cache_bytes"] = cache_metrics(dmp)["item"]["cache_bytes"]
    r["host_budget"] = stats["budget_bytes"]
    r["disk_index_bytes"] = stats["disk_index_bytes"]
    r["promise"] = r["rss_before"] + r["cache_bytes"] + r["host_budget"] + r["disk_index_bytes"] + CONSTANT_BYTES
    kernel.close()
    kernel_of(base.dmp).close()
    del dmp, dense, kernel, base, big

    r["checkpoint"] = checkpoints(args, work)
    if args.json:
        args.json.write_text(json.dumps(r, indent=1))
    write_report(section(args, r), args.report)
    print(section(args, r), flush=True)


if __name__ == "__main__":
    main()
