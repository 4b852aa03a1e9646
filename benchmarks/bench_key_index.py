"""Key index ops/s: the native KEY_VALUE key indexes of this tree against the numpy ones they replaced, same run.

Both tiers' indexes, at ``--keys`` keys (median of ``--reps`` batches of ``--batch`` keys each):

* host tier (:class:`KeyIndex`, key -> slot): fill, lookup of present keys, remove, insert (of the keys just
  removed: the free-slot and tombstone path a host tier's churn takes);
* disk tier (the fingerprint table of :class:`DiskStore`, without the record reads that verify a candidate):
  fill and find of present fingerprints.

The numpy implementation is the file ``key_index.py`` of the commit before the native ops (pass it with
``--numpy-index``; it only needs numpy, torch and ``torchrec_ascend.errors``)::

    git show c2302a0~1:torchrec_ascend/kernels/key_value/key_index.py > /tmp/numpy_key_index.py
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_key_index.py --numpy-index /tmp/numpy_key_index.py
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import time
from types import ModuleType
from typing import Callable, Dict

import numpy as np
import torch

from torchrec_ascend.kernels.key_value import key_index as native
from torchrec_ascend.native import ops

BITS, PARTITIONS = 28, 256


def load(path: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location("numpy_key_index", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def rate(n: int, fn: Callable[..., object], *args: object) -> float:
    """``n`` / the seconds ``fn(*args)`` takes."""
    start = time.perf_counter()
    fn(*args)
    return n / (time.perf_counter() - start)


def host(cls: type, keys: torch.Tensor, n: int, batch: int, reps: int, g: torch.Generator) -> Dict[str, float]:
    index = cls(max_capacity=keys.numel())
    fill = rate(n, lambda: [index.insert(part) for part in keys[:n].split(batch)])
    finds, removes, inserts = [], [], []
    for r in range(reps):
        probe = keys[torch.randint(0, n, (batch,), generator=g)]
        finds.append(rate(batch, index.lookup, probe))
        gone = keys[r * batch : (r + 1) * batch]
        removes.append(rate(batch, index.remove, gone))
        inserts.append(rate(batch, index.insert, gone))
    return {"fill": fill, "lookup": statistics.median(finds), "remove": statistics.median(removes),
            "insert": statistics.median(inserts)}


def disk_entries(keys: torch.Tensor) -> Dict[str, np.ndarray]:
    h = native.mix64(keys.numpy().view(np.uint64))
    fingerprint = h >> np.uint64(64 - BITS)
    location = np.arange(1, keys.numel() + 1, dtype=np.uint64)
    return {"part": (h & np.uint64(PARTITIONS - 1)).astype(np.int64), "fingerprint": fingerprint,
            "entry": (fingerprint << np.uint64(64 - BITS)) | location}


def disk_numpy(module: ModuleType, e: Dict[str, np.ndarray], batch: int, reps: int) -> Dict[str, float]:
    def home_of(entries: np.ndarray, p: int, size: int) -> np.ndarray:
        return module.scale(entries >> np.uint64(64 - BITS), BITS, np.int64(size))

    table = module.OpenTable(np.uint64, PARTITIONS, 1 << 20, home_of)

    def fill() -> None:
        for start in range(0, e["part"].size, batch):
            part = e["part"][start : start + batch]
            table.make_room(part)
            homes = module.scale(e["fingerprint"][start : start + batch], BITS, table.size[part])
            table.insert(part, homes, e["entry"][start : start + batch])

    def find(part: np.ndarray, fp: np.ndarray) -> np.ndarray:
        homes = module.scale(fp, BITS, table.size[part])
        return table.find(part, homes, lambda entries, which, _: (entries >> np.uint64(64 - BITS)) == fp[which])

    filled = rate(e["part"].size, fill)
    finds = []
    for r in range(reps):
        part, fp = e["part"][r * batch : (r + 1) * batch], e["fingerprint"][r * batch : (r + 1) * batch]
        finds.append(rate(batch, find, part, fp))
    return {"fill": filled, "find": statistics.median(finds)}


def disk_native(e: Dict[str, np.ndarray], batch: int, reps: int) -> Dict[str, float]:
    table = native.OpenTable(np.uint64, PARTITIONS, 1 << 20)

    def fill() -> None:
        for start in range(0, e["part"].size, batch):
            ops.fingerprint_insert(*table.state, torch.from_numpy(e["part"][start : start + batch]),
                                   torch.from_numpy(e["entry"][start : start + batch].view(np.int64)), BITS,
                                   native.MAX_LOAD, native.DISK_LOW_LOAD)

    filled = rate(e["part"].size, fill)
    finds = []
    for r in range(reps):
        part = torch.from_numpy(e["part"][r * batch : (r + 1) * batch])
        fp = torch.from_numpy(e["fingerprint"][r * batch : (r + 1) * batch].view(np.int64))
        finds.append(rate(batch, ops.fingerprint_find, *table.state[:2], part, fp, torch.full_like(part, -1), BITS))
    return {"fill": filled, "find": statistics.median(finds)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--numpy-index", required=True, help="key_index.py of the numpy implementation")
    parser.add_argument("--keys", type=int, default=4_000_000)
    parser.add_argument("--batch", type=int, default=65536)
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    old = load(args.numpy_index)
    g = torch.Generator().manual_seed(0)
    keys = torch.randint(0, 2**62, (args.keys + args.batch * args.reps,), generator=g).unique()
    keys = keys[torch.randperm(keys.numel(), generator=g)]
    results = {
        "host numpy": host(old.KeyIndex, keys, args.keys, args.batch, args.reps, g),
        "host native": host(native.KeyIndex, keys, args.keys, args.batch, args.reps, g),
    }
    entries = disk_entries(keys[: args.keys])
    results["disk numpy"] = disk_numpy(old, entries, args.batch, args.reps)
    results["disk native"] = disk_native(entries, args.batch, args.reps)
    print(f"{args.keys:,} keys, batches of {args.batch:,}, median of {args.reps}, million ops/s:")
    for name, numbers in results.items():
        print(f"  {name:12s}", "  ".join(f"{op} {v / 1e6:6.2f}" for op, v in numbers.items()))
    for tier in ("host", "disk"):
        new, base = results[f"{tier} native"], results[f"{tier} numpy"]
        print(f"  {tier} speed-up ", "  ".join(f"{op} {new[op] / base[op]:5.1f}x" for op in new))


if __name__ == "__main__":
    main()
