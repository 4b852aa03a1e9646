"""Cold random record reads: the disk tier's batched read (``segment_file.read_records``) against page faults
through a memory map (the read path it replaced), same file, same run.

A file of ``--gib`` GiB of ``--record-bytes`` records is written once; before every batch its pages are dropped
from the page cache (``posix_fadvise(DONTNEED)``, so every record is a disk read), then a batch of ``--batch`` random
records (the disk records one step of the 200M-row scale benchmark reads) is read both ways, alternating which goes
first. Reported: the median ms per batch of each over ``--reps`` batches, and the speed-up (target >= 2x). The
file is deleted at the end, also on failure::

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_disk_reads.py --dir /work/bench-reads
"""

from __future__ import annotations

import argparse
import mmap
import os
import shutil
import statistics
import tempfile
import time
from typing import Callable, Dict, List

import numpy as np

from torchrec_ascend.kernels.key_value.segment_file import SegmentFile, read_records

TARGET = 2.0


def mapped_gather(seg: SegmentFile, offsets: np.ndarray) -> np.ndarray:
    """The replaced read: a read-only map without read-around, one numpy gather (a page fault per record)."""
    with open(seg.path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
        m.madvise(mmap.MADV_RANDOM)
        view = np.frombuffer(m, dtype=np.uint64).reshape(-1, seg.words)
        records = view[offsets]
        del view
        return records


def batched(seg: SegmentFile, offsets: np.ndarray) -> np.ndarray:
    return read_records([seg], np.zeros(offsets.size, dtype=np.int64), offsets)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gib", type=float, default=8.0)
    parser.add_argument("--record-bytes", type=int, default=280)
    parser.add_argument("--batch", type=int, default=2560)
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--dir", default=tempfile.gettempdir())
    args = parser.parse_args()
    words = args.record_bytes // 8
    count = int(args.gib * (1 << 30)) // (8 * words)
    if shutil.disk_usage(args.dir).free < 2 * count * 8 * words:
        raise SystemExit(f"bench_disk_reads: {args.dir} needs {2 * count * 8 * words / 1e9:.1f} GB free")
    directory = tempfile.mkdtemp(prefix="bench-reads-", dir=args.dir)
    try:
        seg = SegmentFile(directory, words, 0)
        rng = np.random.default_rng(0)
        block = rng.integers(0, 2**63, size=(1 << 16, words), dtype=np.uint64)
        for start in range(0, count, block.shape[0]):
            seg.append(block[: min(block.shape[0], count - start)])
        contenders: Dict[str, Callable[[SegmentFile, np.ndarray], np.ndarray]] = {
            "memory map (page faults)": mapped_gather, "read_records (announced, then pread)": batched}
        times: Dict[str, List[float]] = {name: [] for name in contenders}
        for rep in range(args.reps):
            order = list(contenders) if rep % 2 == 0 else list(reversed(contenders))
            offsets = rng.integers(0, count, size=args.batch)
            results = []
            for name in order:
                os.posix_fadvise(seg._open_fd(), 0, 0, os.POSIX_FADV_DONTNEED)
                began = time.perf_counter()
                results.append(contenders[name](seg, offsets))
                times[name].append(time.perf_counter() - began)
            assert np.array_equal(results[0], results[1])
        seg.close()
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    print(f"{count:,} records of {8 * words} B ({count * 8 * words / 1e9:.1f} GB), batches of {args.batch} random "
          f"records, cold page cache, median of {args.reps}")
    medians = {name: statistics.median(t) * 1e3 for name, t in times.items()}
    for name, ms in medians.items():
        print(f"{name:40s} {ms:8.1f} ms/batch  {args.batch / ms:6.1f} records/ms")
    mapped, native = medians.values()
    print(f"target read_records speed-up over the memory map: {mapped / native:.2f} (>= {TARGET}): "
          f"{'met' if mapped / native >= TARGET else 'NOT met'}")


if __name__ == "__main__":
    main()
