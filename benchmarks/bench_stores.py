"""Throughput of the KEY_VALUE row stores (HostStore alone, HostStore spilling to DiskStore) per 16k-row batch.

Prints, per scenario and operation, the median time of one batch, rows/s, MB/s of row payload, and the ratio to a
plain in-memory baseline measured in the same run: ``index_select`` (get) and ``index_copy_`` (put) on one tensor
holding every row, with the same batches of positions. The ratio is store time / baseline time (lower is better).

Scenarios, each on a fresh store filled with ``--rows`` random raw IDs:

* ``host``: the budget holds every row; put overwrites existing rows, get reads them.
* ``host+disk``: the budget holds ``--host-fraction`` of the rows, the rest spill to a DiskStore under ``--dir``;
  random batches touch both tiers, so get promotes and put spills (the steady state of a table larger than memory).

Run::

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_stores.py --rows 262144 --batch 16384 --repeats 7
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from typing import Callable, Dict, List

import torch

from torchrec_ascend.kernels.key_value.disk_store import DiskStore
from torchrec_ascend.kernels.key_value.host_store import HostStore
from torchrec_ascend.kernels.key_value.key_index import KeyIndex

EMBEDDING_DIM, OPTIMIZER_WIDTH = 64, 64
WIDTH = EMBEDDING_DIM + OPTIMIZER_WIDTH


def median_seconds(step: Callable[[int], None], repeats: int) -> float:
    """Median wall time of ``step(i)`` over ``repeats`` calls, after one warm-up call."""
    step(repeats)
    times = []
    for i in range(repeats):
        start = time.perf_counter()
        step(i)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def host_budget(rows: int) -> int:
    """Bytes a HostStore needs to hold ``rows`` rows without spilling (its own accounting, plus slack)."""
    return rows * (WIDTH * 4 + 8) + KeyIndex.nbytes_for(2 * rows)


def bench_store(store: HostStore, keys: torch.Tensor, batches: List[torch.Tensor], repeats: int) -> Dict[str, float]:
    """Fill ``store`` with ``keys``, then time put (overwrite) and get on the positions in ``batches``."""
    batch = batches[0].numel()
    for start in range(0, keys.numel(), batch):
        chunk = keys[start : start + batch]
        store.put(chunk, torch.randn(chunk.numel(), WIDTH))
    new_rows = torch.randn(batch, WIDTH)
    return {
        "put": median_seconds(lambda i: store.put(keys[batches[i]], new_rows), repeats),
        "get": median_seconds(lambda i: store.get(keys[batches[i]]), repeats),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=262144, help="distinct keys in the table")
    parser.add_argument("--batch", type=int, default=16384, help="rows per put/get call")
    parser.add_argument("--repeats", type=int, default=7, help="timed batches per measurement (median)")
    parser.add_argument("--host-fraction", type=float, default=0.25, help="host budget / table size, spill case")
    parser.add_argument("--dir", default=None, help="directory for the disk store (default: a temporary one)")
    args = parser.parse_args()
    torch.manual_seed(0)

    keys = torch.randint(0, 2**63 - 1, (args.rows,), dtype=torch.int64).unique()
    keys = keys[torch.randperm(keys.numel())]
    batches = [torch.randperm(keys.numel())[: args.batch] for _ in range(args.repeats + 1)]
    table = torch.randn(keys.numel(), WIDTH)
    new_rows = torch.randn(args.batch, WIDTH)
    baseline = {
        "put": median_seconds(lambda i: table.index_copy_(0, batches[i], new_rows), args.repeats),
        "get": median_seconds(lambda i: table.index_select(0, batches[i]), args.repeats),
    }

    results = {"index_select/index_copy_": baseline}
    with HostStore(WIDTH, budget_bytes=host_budget(keys.numel()), name="bench") as store:
        results["host"] = bench_store(store, keys, batches, args.repeats)
        spilled = store.stats()["spilled_rows"]
        assert spilled == 0, f"the host-only scenario spilled {spilled} rows: raise host_budget()"
    with tempfile.TemporaryDirectory(dir=args.dir) as directory:
        disk = DiskStore(directory, WIDTH, name="bench")
        budget = host_budget(int(keys.numel() * args.host_fraction))
        with HostStore(WIDTH, budget_bytes=budget, spill=disk, name="bench") as store:
            results["host+disk"] = bench_store(store, keys, batches, args.repeats)
            stats = store.stats()

    payload = args.batch * WIDTH * 4
    print(f"rows={keys.numel()} batch={args.batch} width={WIDTH} float32 repeats={args.repeats} (medians)")
    print(f"{'scenario':<26}{'op':<5}{'ms/batch':>10}{'Mrows/s':>10}{'MB/s':>10}{'x baseline':>12}")
    for scenario, timings in results.items():
        for op, seconds in timings.items():
            print(
                f"{scenario:<26}{op:<5}{seconds * 1e3:>10.2f}{args.batch / seconds / 1e6:>10.2f}"
                f"{payload / seconds / 1e6:>10.0f}{seconds / baseline[op]:>12.1f}"
            )
    print(
        f"host+disk end state: host_rows={stats['host_rows']} disk_rows={stats['disk_rows']} "
        f"spilled_rows={stats['spilled_rows']} promoted_rows={stats['promoted_rows']} disk_bytes={stats['disk_bytes']}"
    )


if __name__ == "__main__":
    main()
