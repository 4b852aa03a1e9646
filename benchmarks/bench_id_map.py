"""Benchmark of IdMap.insert_or_lookup on Zipf(1.05) ID batches, against baselines measured in the same run.

Each contender gets the same batches and the same job: map every ID of a batch to a dense slot, inserting the new
ones, starting from an empty table. Reported: the first batch (table filling up) and the median of the later batches
(steady state), in million IDs per second, and our ratio to each baseline (medians). Baselines: a Python dict, and
pandas' khash (``Int64HashTable.get_labels``) when pandas is installed (it is not a dependency; ``pip install pandas``
into the benchmark's environment). IdMap and khash take turns batch by batch, so both see the same machine load.
Target: >= 100 M IDs/s single-threaded for 1,048,576 IDs per batch into a 10 M-slot table (later batches: about half
of their IDs are new, each a probe of a cold bucket of the 256 MB table). What bounds it is printed beside: as many
random 16-byte reads from a table of that size as a later batch has distinct IDs, timed in the same run.

Run briefly, pinned to one core::

    OMP_NUM_THREADS=1 taskset -c 1 .venv/bin/python benchmarks/bench_id_map.py
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Callable, List, Tuple

import numpy as np
import torch

from torchrec_ascend.hash.id_map import IdMap, num_buckets_for
from torchrec_ascend.native.memory import huge_page_full

# Odd multiplier (a bijection mod 2**63) that scatters Zipf ranks over the whole int64 ID range.
SCRAMBLE = 0x9E3779B97F4A7C15
INT63_MASK = (1 << 63) - 1


def zipf_batches(num_batches: int, batch_size: int, exponent: float, seed: int) -> List[torch.Tensor]:
    """Batches of Zipf-distributed IDs scrambled into ``[0, 2**63)``, deterministic in ``seed``."""
    rng = np.random.default_rng(seed)
    batches = []
    for _ in range(num_batches):
        ranks = rng.zipf(exponent, batch_size).astype(np.uint64)
        ids = (ranks * np.uint64(SCRAMBLE)) & np.uint64(INT63_MASK)  # uint64 products wrap mod 2**64
        batches.append(torch.from_numpy(ids.astype(np.int64)))
    return batches


def time_batches(steps: List[Callable[[torch.Tensor], object]], batches: List[torch.Tensor]) -> List[List[float]]:
    """Seconds of each of ``steps`` on each batch, in order (state carries over between batches); the steps take
    turns on every batch, so drifting load on shared cores hits them alike."""
    seconds: List[List[float]] = [[] for _ in steps]
    for ids in batches:
        for step, out in zip(steps, seconds):
            start = time.perf_counter()
            step(ids)
            out.append(time.perf_counter() - start)
    return seconds


def ours(capacity: int) -> Callable[[torch.Tensor], object]:
    id_map = IdMap(capacity)
    return id_map.insert_or_lookup


def python_dict() -> Callable[[torch.Tensor], object]:
    slot_of: dict = {}

    def step(ids: torch.Tensor) -> torch.Tensor:
        slots = []
        for k in ids.tolist():
            s = slot_of.get(k)
            if s is None:
                s = slot_of[k] = len(slot_of)
            slots.append(s)
        return torch.tensor(slots, dtype=torch.int64)

    return step


def pandas_khash(capacity: int) -> Callable[[torch.Tensor], object]:
    try:
        from pandas.core.hashtable import Int64HashTable, Int64Vector
    except ImportError:  # pandas >= 3 keeps it only here
        from pandas._libs.hashtable import Int64HashTable, Int64Vector

    table = Int64HashTable(capacity)

    def step(ids: torch.Tensor) -> torch.Tensor:
        # get_labels is khash's insert-or-lookup: new values get labels count_prior, count_prior + 1, ...
        labels = table.get_labels(ids.numpy(), Int64Vector(), count_prior=len(table))
        return torch.from_numpy(labels)

    return step


def random_reads(capacity: int, count: int, repeats: int = 5) -> float:
    """Median seconds of ``count`` random 16-byte reads (torch's ``index_select``) from a table the size of an
    IdMap's buckets: what touching one cold bucket per distinct ID of a batch costs on this machine's memory."""
    table = huge_page_full((num_buckets_for(capacity), 2), 0, torch.int64)
    g = torch.Generator().manual_seed(0)
    seconds = []
    for _ in range(repeats):
        rows = torch.randint(0, table.shape[0], (count,), generator=g)
        start = time.perf_counter()
        table.index_select(0, rows)
        seconds.append(time.perf_counter() - start)
    return statistics.median(seconds)


def rate(batch_size: int, seconds: float) -> float:
    return batch_size / seconds / 1e6


def report(name: str, batch_size: int, seconds: List[float]) -> Tuple[float, float]:
    first = rate(batch_size, seconds[0])
    later = rate(batch_size, statistics.median(seconds[1:])) if len(seconds) > 1 else first
    later_label = f"later batches (median of {len(seconds) - 1})"
    print(f"{name:<22} first batch {first:8.2f} M IDs/s   {later_label} {later:8.2f} M IDs/s")
    return first, later


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=8, help="batches for IdMap and khash")
    parser.add_argument("--dict-batches", type=int, default=3, help="batches for the (slow) Python dict")
    parser.add_argument("--batch-size", type=int, default=1 << 20)
    parser.add_argument("--capacity", type=int, default=10_000_000)
    parser.add_argument("--exponent", type=float, default=1.05)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    batches = zipf_batches(args.batches, args.batch_size, args.exponent, args.seed)
    distinct = len(torch.unique(torch.cat(batches)))
    print(
        f"{args.batches} batches of {args.batch_size} Zipf({args.exponent}) IDs, {distinct} distinct in all, "
        f"capacity {args.capacity}, torch threads {torch.get_num_threads()}"
    )
    try:
        khash = [pandas_khash(args.capacity)]
    except ImportError:
        khash = []
    timed = time_batches([ours(args.capacity), *khash], batches)
    _, ours_later = report("IdMap (native)", args.batch_size, timed[0])
    if len(batches) > 1:
        print_memory_bound(args, batches)
    dict_seconds = time_batches([python_dict()], batches[: args.dict_batches])[0]
    _, dict_later = report("Python dict", args.batch_size, dict_seconds)
    print(f"ratio IdMap / dict:  {ours_later / dict_later:6.1f}x (later-batch medians)")
    if not khash:
        print("pandas khash           skipped (pandas is not installed)")
        return
    _, khash_later = report("pandas khash", args.batch_size, timed[1])
    print(f"ratio IdMap / khash: {ours_later / khash_later:6.1f}x (later-batch medians)")


def print_memory_bound(args: argparse.Namespace, batches: List[torch.Tensor]) -> None:
    """What bounds the later batches: each distinct ID probes its bucket at least once, a cache miss for the rare
    ones in a table of 16 bytes a bucket far beyond the caches."""
    distinct = int(statistics.median(len(torch.unique(ids)) for ids in batches[1:]))
    seconds = random_reads(args.capacity, distinct)
    print(f"random reads: {distinct} distinct IDs per later batch (median); {distinct} random 16-byte reads from a "
          f"table of the IdMap's size (torch index_select) take {seconds * 1e3:.2f} ms: "
          f"{rate(args.batch_size, seconds):.1f} M IDs/s if each distinct ID cost one such read and nothing else")


if __name__ == "__main__":
    main()
