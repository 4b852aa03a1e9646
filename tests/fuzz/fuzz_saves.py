"""A two-save checkpoint chain written without a model (two "ranks", two tables, a full save and an increment),
the reader stack a load runs over it (everything but the kernels), and what was written, as the fuzz oracle.

Example::

    written = write_chain(root)
    result = read_everything(root)      # {(table, col0, bucket): (records, state)}
    assert_written(result, written)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, Set, Tuple

import torch

from torchrec_ascend.checkpoint.files import FORMAT_VERSION, ArrayFileWriter, write_json
from torchrec_ascend.checkpoint.layout import ShardLayout
from torchrec_ascend.checkpoint.restore import _entries_of, _layout_of
from torchrec_ascend.checkpoint.shard_files import read_chain_records, read_shard_state, write_shard
from torchrec_ascend.checkpoint.versions import FORMAT, METADATA, resolve_chain, save_directory
from torchrec_ascend.kernels.fused import ShardRows

WORLD = 2
TABLES = {"user": 4, "item": 3}  # name -> columns (one element-wise optimizer state: rows of 2 * cols)
Written = Set[Tuple[int, bytes]]


def layout(table: str, rank: int) -> ShardLayout:
    cols = TABLES[table]
    return ShardLayout(table=table, hash_ids=True, dim=cols, col0=0, cols=cols, bucket=rank, buckets=WORLD,
                       row_offset=rank * 16, rows=16, capacity=15, key_value=False, optimizer="exact_adagrad",
                       states=("element",), eviction="lru {}", admission="")


def records(ids: torch.Tensor, width: int, salt: float) -> ShardRows:
    n = ids.numel()
    rows = torch.arange(n * width, dtype=torch.float32).view(n, width) * 0.5 + salt
    return ShardRows(ids, torch.arange(n), torch.full((n,), 3), rows)


def write_chain(root: Path) -> Written:
    """Save 1 (full) and save 2 (an increment: some IDs changed, one removed) under ``root``; returns every
    ``(id, row bytes)`` written."""
    written: Written = set()
    for version, chain in ((1, [1]), (2, [1, 2])):
        directory = Path(save_directory(str(root), version))
        directory.mkdir(parents=True)
        files, shards = {}, []
        for rank in range(WORLD):
            name = f"rank-{rank:05d}-of-{WORLD:05d}.data"
            with ArrayFileWriter(str(directory / name)) as writer:
                for table in TABLES:
                    lay = layout(table, rank)
                    ids = torch.arange(6, dtype=torch.int64) * WORLD + rank + (100 if table == "item" else 0)
                    if version == 2:
                        ids = ids[:2]
                    block = records(ids, lay.width, version * 1000.0 + rank)
                    removed = torch.tensor([] if version == 1 else [int(ids[0]) + 4 * WORLD], dtype=torch.int64)
                    state = {"step": version * 3, "iteration": version * 3, "counters": {"lookups": 7 * version},
                             "next_fresh": ids.numel(), "free_slots": torch.empty(0, dtype=torch.int64),
                             "eviction": {"last": torch.arange(4)}, "admission": {}}
                    half = ids.numel() // 2
                    blocks = [ShardRows(*(getattr(block, f)[:half] for f in ("ids", "slots", "last_used", "rows"))),
                              ShardRows(*(getattr(block, f)[half:] for f in ("ids", "slots", "last_used", "rows")))]
                    shards.append(write_shard(writer, lay, blocks, removed.clone, state))
                    written |= {(i, r.numpy().tobytes()) for i, r in zip(ids.tolist(), block.rows)}
                files[name] = writer.commit()
        write_json(str(directory / METADATA), {
            "format": FORMAT, "format_version": FORMAT_VERSION, "id": f"save{version}", "version": version,
            "kind": "full" if version == 1 else "incremental", "chain": chain, "world_size": WORLD, "created": 0.0,
            "files": files, "shards": shards,
        })
    return written


def read_everything(root: Path) -> Dict[Tuple[str, int, int], Tuple[ShardRows, Dict[str, Any]]]:
    """What a load of ``root``'s latest save reads, per saved shard: its records after the chain, and its state."""
    chain = resolve_chain(str(root))
    directory, final = chain[-1]
    out = {}
    for entry in final["shards"]:
        lay = _layout_of(entry, directory)
        out[(lay.table, lay.col0, lay.bucket)] = (read_chain_records(_entries_of(chain, lay)),
                                                  read_shard_state(directory, entry))
    return out


def as_dict(result: Dict[Tuple[str, int, int], Tuple[ShardRows, Dict[str, Any]]]) -> Dict[Any, Dict[int, bytes]]:
    """Records per shard as ``{id: row bytes}`` (order-free)."""
    return {key: {i: r.numpy().tobytes() for i, r in zip(rec.ids.tolist(), rec.rows)}
            for key, (rec, _) in result.items()}


def assert_written(result: Dict[Tuple[str, int, int], Tuple[ShardRows, Dict[str, Any]]], written: Written) -> None:
    """Every record returned is one that was written (ID and row bytes), at most once per shard."""
    for key, (rec, _) in result.items():
        ids = rec.ids.tolist()
        assert len(set(ids)) == len(ids), f"{key}: an ID returned twice"
        assert rec.rows.dtype == torch.float32 and rec.rows.shape == (len(ids), rec.rows.shape[1])
        stray = [i for i, r in zip(ids, rec.rows) if (i, r.numpy().tobytes()) not in written]
        assert not stray, f"{key}: records never written were returned for IDs {stray[:5]}"
