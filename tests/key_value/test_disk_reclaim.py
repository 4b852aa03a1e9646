"""The disk tier reclaims the space of rows that moved (issue 29, item 4): rows overwritten or taken back up leave
garbage records, and compaction keeps the segment files within ``1 / (1 - compact_fraction)`` times the live records
plus the floor of the segment being appended to, also when the whole store is smaller than one segment (before, the
segment being appended to was never compacted, so a small store's files grew until it filled: 256 MiB by default).
Oracle: a dict of the rows last written, read back exactly after every round."""

from __future__ import annotations

import os
from pathlib import Path

import torch

from torchrec_ascend.kernels.key_value.disk_store import ACTIVE_GARBAGE_BYTES, DiskStore
from torchrec_ascend.kernels.key_value.tier import DISK_COMPACT_FRACTION

KEYS = 30_000


def files_bytes(folder: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(folder) for f in files)


def test_churn_in_a_store_smaller_than_a_segment_keeps_disk_within_twice_the_live_rows(tmp_path: Path) -> None:
    gen = torch.Generator().manual_seed(3)
    # As the KEY_VALUE tier makes it; default segments: 256 MiB, far above this store.
    store = DiskStore(str(tmp_path), width=16, name="user", compact_fraction=DISK_COMPACT_FRACTION)
    expected = {}
    ratios = []
    for round_ in range(30):  # 30000 keys (2.4 MB live), a fifth rewritten, a twentieth taken out each round
        keys = torch.randperm(KEYS, generator=gen)[: KEYS // 5] if round_ else torch.arange(KEYS)
        rows = torch.randn(keys.numel(), 16, generator=gen)
        store.put(keys, rows)
        expected.update(zip(keys.tolist(), rows))
        taken = torch.randperm(KEYS, generator=gen)[: KEYS // 20]
        store.pop(taken)
        for key in taken.tolist():
            expected.pop(key, None)
        ratios.append(files_bytes(store.path) / store.stats()["live_bytes"])
    keys = torch.tensor(sorted(expected))
    got, found = store.get(keys)
    assert bool(found.all()) and len(store) == keys.numel()
    assert torch.equal(got, torch.stack([expected[k] for k in keys.tolist()])), "a compacted row changed"
    assert store.stats()["compactions"] > 0
    assert max(ratios) <= 2.0 + ACTIVE_GARBAGE_BYTES / store.stats()["live_bytes"], ratios
    assert max(ratios[5:]) <= 2.0, f"disk / live bytes reached {max(ratios[5:]):.2f} (per round: {ratios})"
    store.close()
