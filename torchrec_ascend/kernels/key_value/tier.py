"""The KEY_VALUE row tier: rows leaving the device cache go to a host store that spills to a disk store.

Rows leave the cache (the kernel's pool) packed with their optimizer state in the pool's :class:`RowCodec`
encoding (:meth:`Pool.pack_stored`: 16-bit weights stay 16-bit) and come back unchanged; to checkpoints the tier
speaks packed float32 rows (:meth:`Pool.pack`'s layout). An ID never seen is initialised as a function of (seed, ID,
column) with zero optimizer state (plain tables: keyed by row within the shard, initialised from the global row).
See :mod:`torchrec_ascend.kernels.row_tier` for the protocol.

Example::

    tier = HostDiskTier(pool, config, [True])   # pool: the KEY_VALUE kernel's device cache, one hash table
    tier.stores[0].stats()["host_rows"]   # rows of table 0 in host memory
"""

from __future__ import annotations

import os
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Tuple

import torch
from torchrec.distributed.embedding_types import GroupedEmbeddingConfig

from torchrec_ascend.hash.slot_table import Assignment
from torchrec_ascend.kernels.key_value.disk_store import DiskStore
from torchrec_ascend.kernels.key_value.host_store import HostStore
from torchrec_ascend.kernels.pool import Pool

# A disk segment is compacted once this fraction of it is garbage: the files stay within 1 / (1 - 0.4) = 1.67x the
# live rows plus what one batch adds and the 1 MiB floor of the segment being appended to, under the 2x promised
# (at 0.5 a batch's moves pushed them just past 2x between compactions; benchmarks/bench_soak.py).
DISK_COMPACT_FRACTION = 0.4


class HostDiskTier:
    """Host and disk stores below a KEY_VALUE kernel's device cache, one of each per table.

    Args:
        pool: the kernel's device cache, which the rows leave and enter.
        config: the shard's own (not cache-sized) grouped config: ``l2_cache_size`` (GB of host memory per table,
            default unbounded) and ``ssd_storage_directory`` (the disk tier; none: a full host store is an error) of
            its fused params.
        is_hash: per table, keys are raw IDs (hash table), not rows of the shard (plain table).

    Attributes:
        stores: per table, its host store (spilling to its disk store).
        swaps: per table, rows ``swapped_in``, ``swapped_out`` and ``initialised`` so far.
        is_hash: per table, keys are raw IDs (hash table), not rows of the shard (plain table).
        key_offsets: per table, the shard's first global row (plain tables' rows are initialised from it).
    """

    lower_tiers = True

    def __init__(self, pool: Pool, config: GroupedEmbeddingConfig, is_hash: List[bool]) -> None:
        self._pool = pool
        tables = config.embedding_tables
        self.is_hash = is_hash
        self.key_offsets = [t.local_metadata.shard_offsets[0] for t in tables]
        params = config.fused_params or {}
        budget_gb = params.get("l2_cache_size")
        directory = params.get("ssd_storage_directory")
        rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
        self.stores: List[HostStore] = []
        self._codecs = [pool.codec(t) for t in range(len(tables))]
        for table, codec in zip(tables, self._codecs):
            disk = DiskStore(os.path.join(directory, f"rank{rank}"), codec.width, codec.dtype, name=table.name,
                             compact_fraction=DISK_COMPACT_FRACTION) if directory else None
            budget = int(budget_gb * 1024**3) if budget_gb is not None else 1 << 62
            self.stores.append(HostStore(codec.width, codec.dtype, budget_bytes=budget, spill=disk, name=table.name))
        self.swaps: List[Dict[str, int]] = [
            dict.fromkeys(("swapped_in", "swapped_out", "initialised"), 0) for _ in tables
        ]

    def known(self, t: int) -> Optional[Callable[[torch.Tensor], torch.Tensor]]:
        # IDs with a row below the cache: admitted already, and looked up (swapped in) in eval mode too. Every row of
        # a plain table exists (a row never trained is its initial value), as in a FUSED plain table.
        if not self.is_hash[t]:
            return lambda keys: torch.ones(keys.shape, dtype=torch.bool)
        return self.stores[t].contains

    def arrived(self, t: int, assignment: Assignment) -> None:
        rows, found = self.stores[t].pop(assignment.new_ids)
        num_found = int(found.sum())
        if num_found < found.numel():
            fresh = ~found
            keys = assignment.new_ids[fresh]
            if not self.is_hash[t]:
                keys = keys + self.key_offsets[t]  # plain tables: initialised from the global row
            initial = torch.zeros(keys.numel(), self._pool.row_width(t))
            initial[:, : self._pool.cols(t)] = self._pool.initial_rows(t, keys)
            rows[fresh] = self._codecs[t].encode(initial)
        self._pool.unpack_stored(t, assignment.new_slots, rows)
        self.swaps[t]["swapped_in"] += num_found
        self.swaps[t]["initialised"] += found.numel() - num_found

    def left(self, t: int, slots: torch.Tensor, ids: torch.Tensor) -> None:
        # Every cached row was trained (eval lookups do not insert), so every evicted row is written back.
        self.stores[t].put(ids, self._pool.pack_stored(t, slots))
        self.swaps[t]["swapped_out"] += ids.numel()

    def stored(self, t: int, block_rows: int) -> Iterator[Tuple[torch.Tensor, torch.Tensor]]:
        return ((keys, self._codecs[t].decode(rows)) for keys, rows in self.stores[t].chunks(block_rows))

    def stored_keys(self, t: int, block_rows: int) -> Iterator[torch.Tensor]:
        return self.stores[t].keys(block_rows)

    def read(self, t: int, keys: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        store = self.stores[t]
        promote, store.promote = store.promote, False  # a checkpoint read must not move rows between tiers
        try:
            rows, found = store.get(keys)
            return self._codecs[t].decode(rows), found
        finally:
            store.promote = promote

    def checkpoint_state(self, t: int) -> Dict[str, Any]:
        return {"swaps": dict(self.swaps[t])}

    def fill(self, t: int, chunks: Iterable[Tuple[torch.Tensor, torch.Tensor]]) -> Optional[Callable[[], None]]:
        store = self.stores[t]
        if len(store):
            return None
        store.load(self._encoded(t, chunks))
        return store.clear

    def restore(
        self, t: int, chunks: Optional[Iterable[Tuple[torch.Tensor, torch.Tensor]]], state: Dict[str, Any]
    ) -> None:
        if chunks is not None:
            self.stores[t].clear()
            self.stores[t].load(self._encoded(t, chunks))
        self.swaps[t] = {**dict.fromkeys(self.swaps[t], 0), **state.get("swaps", {})}

    def _encoded(self, t: int, chunks: Iterable[Tuple[torch.Tensor, torch.Tensor]]
                 ) -> Iterator[Tuple[torch.Tensor, torch.Tensor]]:
        for keys, rows in chunks:
            yield keys, self._codecs[t].encode(rows)
            del keys, rows  # freed before the next chunk is read: a load holds one chunk at a time

    def close(self) -> None:
        """Release the host and disk tiers (removes the disk files)."""
        for store in self.stores:
            store.close()
