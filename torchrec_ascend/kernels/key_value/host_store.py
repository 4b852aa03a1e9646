"""HostStore: the KEY_VALUE kernel's host-memory tier, bounded by a byte budget, spilling to a DiskStore.

Every key lives in exactly one tier. Rows grow on demand (see :mod:`.row_chunks`: existing rows never move) up to
the most rows the budget allows. A ``put`` of new keys beyond that spills the least recently used host rows (by
the last ``put`` or ``get`` call that touched them: one ``torch.topk`` over per-slot stamps) to the disk store, and
never drops a row. ``get`` reads disk rows transparently and, with ``promote=True``, moves them up to the host
tier (spilling others in turn). ``pop`` is how the kernel takes rows into its device cache: rows leave the store.
Not thread-safe: one caller (the kernel's batch path) at a time.

What the budget counts (``nbytes``): per slot handed out (used or freed), the row, an int32 LRU stamp and the key
(int64); the index's buckets in use (4 bytes each, at a load between 0.46 and 0.6); the free-slot stack (int32) up
to the most slots freed at once: 12 + 6.7..8.7 bytes a slot beyond the row, plus at most 4 for the stack. The most
rows is where one more would break the budget with the stack full (bounded by this machine's RAM). Nothing grows
by doubling or copying (see :mod:`.row_chunks` and :mod:`.key_index`): a rehash copies one of up to 256 index
partitions. Not counted: tensors of a call in flight
(inputs, outputs, rows being spilled) and a fixed cost of about one memory page per index partition.
"""

from __future__ import annotations

import itertools
from typing import Dict, Iterable, Iterator, Optional, Tuple

import numpy as np
import torch

from torchrec_ascend.errors import ConfigError, StorageError
from torchrec_ascend.native.memory import physical_memory_bytes, reserve

from .disk_store import DiskStore
from .key_index import KeyIndex
from .row_chunks import RowChunks
from .row_store import check_keys, check_rows, last_occurrence, tensor_nbytes

FREE_STAMP = torch.iinfo(torch.int32).max  # stamp of a slot that holds no row: never chosen as a victim
STAMP_BYTES = 4
MAX_CLOCK = FREE_STAMP - 1  # past this the stamps are renumbered (see _tick)


class HostStore:
    """Rows of one table in host memory within ``budget_bytes``, overflowing into an optional disk store.

    Args:
        width (int): elements per row (embedding dim + optimizer-state width).
        dtype (torch.dtype): element type of the rows.
        budget_bytes (int): host memory this store may hold (see the module docstring for what counts).
        spill (Optional[DiskStore]): where rows go beyond the budget; the host store takes ownership and closes
            it. ``None``: a put beyond the budget raises.
        name (str): the table's name, used in messages.
        promote (bool): whether ``get`` moves rows found on disk into host memory.
        spill_headroom (float): when spilling, also free this fraction of the host capacity, so the next puts
            do not each pay for choosing victims.
        initial_rows (int): unused (growth is free: rows are allocated as they arrive).

    Raises:
        ConfigError: bad width, budget or headroom, or a spill store of another width or dtype.

    Example::

        disk = DiskStore("/mnt/ssd/cache", width=128, name="user_id")
        store = HostStore(128, torch.float32, budget_bytes=1 << 30, spill=disk, name="user_id")
        store.put(torch.tensor([3, 5]), torch.randn(2, 128))
        rows, found = store.pop(torch.tensor([5]))
        store.stats()["host_rows"]  # 1
        store.close()
    """

    def __init__(
        self,
        width: int,
        dtype: torch.dtype = torch.float32,
        budget_bytes: int = 1 << 30,
        spill: Optional[DiskStore] = None,
        name: str = "table",
        promote: bool = True,
        spill_headroom: float = 1 / 32,
        initial_rows: int = 1024,
    ) -> None:
        self.name = name
        self.width = width
        self.dtype = dtype
        self.budget_bytes = budget_bytes
        self.where = f"host store of table '{name}'"
        if width <= 0:
            raise ConfigError(f"{self.where}: width must be > 0, got {width}")
        if budget_bytes < 0:
            raise ConfigError(f"{self.where}: budget_bytes must be >= 0, got {budget_bytes}")
        if not 0.0 <= spill_headroom < 1.0:
            raise ConfigError(f"{self.where}: spill_headroom must be in [0, 1), got {spill_headroom}")
        if spill is not None and (spill.width != width or spill.dtype != dtype):
            raise ConfigError(
                f"{self.where}: its disk store holds rows of width {spill.width} and {spill.dtype}, but this table's "
                f"rows are width {width} and {dtype}; create the DiskStore with the same width and dtype"
            )
        self.row_bytes = width * torch.empty(0, dtype=dtype).element_size()
        self.max_rows = self._max_rows_within(budget_bytes)
        self.spill = spill
        self.promote = promote
        self._headroom_rows = int(spill_headroom * self.max_rows)
        self._index = KeyIndex(max_capacity=self.max_rows)
        self._rows = RowChunks(width, dtype, max_rows=max(1, self.max_rows))
        self._stamp_store = torch.from_numpy(reserve(np.int32, max(1, self.max_rows)))
        self._stamp = self._stamp_store[:0]
        self._clock = 0
        self._version = 0
        self._counters = {"spills": 0, "spilled_rows": 0, "direct_disk_rows": 0, "promotions": 0, "promoted_rows": 0,
                          "host_reads": 0, "disk_reads": 0}

    def __len__(self) -> int:
        return len(self._index) + (len(self.spill) if self.spill is not None else 0)

    def __enter__(self) -> "HostStore":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def host_rows(self) -> int:
        """Rows held in host memory."""
        return len(self._index)

    @property
    def nbytes(self) -> int:
        """Host memory held, as charged against ``budget_bytes`` (always ``<= budget_bytes``)."""
        return self._rows.nbytes + tensor_nbytes(self._stamp) + self._index.nbytes

    def stats(self) -> Dict[str, int]:
        """Counters for metrics, per tier and of the moves between them.

        Keys: ``host_rows``, ``host_bytes``, ``host_capacity_rows``, ``budget_bytes``, ``disk_rows``,
        ``disk_bytes`` (segment files, garbage included), ``disk_index_bytes`` (host memory of the disk index, not
        in the budget), ``spills`` (calls that spilled), ``spilled_rows`` (host rows moved to disk),
        ``direct_disk_rows`` (put rows that went straight to disk: more new rows in one call than fit),
        ``promotions`` and ``promoted_rows`` (disk rows moved up by ``get``), ``host_reads`` and ``disk_reads``
        (rows found in each tier by ``get`` and ``pop``: the hits of each tier), ``disk_records_read`` and
        ``disk_records_written`` (records the disk tier read and wrote, verification and compaction included).

        Example::

            store.stats()["spilled_rows"]
        """
        disk = self.spill.stats() if self.spill is not None else {}
        return {
            "host_rows": self.host_rows,
            "host_bytes": self.nbytes,
            "host_capacity_rows": self.max_rows,
            "budget_bytes": self.budget_bytes,
            "disk_rows": disk.get("rows", 0),
            "disk_bytes": disk.get("file_bytes", 0),
            "disk_index_bytes": disk.get("index_bytes", 0),
            "disk_records_read": disk.get("records_read", 0),
            "disk_records_written": disk.get("records_written", 0),
            **self._counters,
        }

    def put(self, keys: torch.Tensor, rows: torch.Tensor) -> None:
        """:meth:`RowStore.put`: insert or overwrite rows, the last of a repeated key wins. May spill LRU rows to disk.

        Raises:
            ConfigError: malformed keys or rows.
            StorageError: the rows do not fit the budget and there is no disk store, or the disk write failed;
                either way the store is unchanged.
        """
        keys = check_keys(keys, self.where)
        rows = check_rows(rows, keys.numel(), self.width, self.dtype, self.where)
        if len(self._index) + keys.numel() <= self.max_rows and self._disk_empty():
            # No spill and no disk copy to drop: one native pass indexes the keys, hands out slots, stamps them
            self._tick()
            slots, positions = self._index.upsert(keys, self._stamp_store, self._clock)
            self._grow_storage()
            self._rows.scatter(slots, rows if positions.numel() == keys.numel() else rows.index_select(0, positions))
            self._version += 1
            return
        last = last_occurrence(keys)
        if last is not None:
            keys, rows = keys[last], rows[last]
        self._tick()
        slots = self._index.lookup(keys)
        present = slots >= 0
        if bool(present.all()):
            self._rows.scatter(slots, rows)
            self._stamp.index_fill_(0, slots, self._clock)
        else:
            hit, miss = present.nonzero().squeeze(1), (~present).nonzero().squeeze(1)
            hit_slots = slots.index_select(0, hit)
            self._place(keys.index_select(0, miss), rows.index_select(0, miss), protect=hit_slots, on_disk=False)
            self._rows.scatter(hit_slots, rows.index_select(0, hit))
            self._stamp.index_fill_(0, hit_slots, self._clock)
        self._version += 1

    def get(self, keys: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """:meth:`RowStore.get` from whichever tier holds them; with ``promote``, disk rows move to host memory.

        Raises:
            ConfigError: malformed keys.
            StorageError: a disk record is damaged, or a promotion had to spill and the disk write failed; the
                store is unchanged.
        """
        keys = check_keys(keys, self.where)
        self._tick()
        rows, found, hit_slots = self._read_host(keys)
        self._counters["host_reads"] += hit_slots.numel()
        miss = (~found).nonzero().squeeze(1)
        if self.spill is not None and miss.numel():
            disk_rows, disk_found = self.spill.get(keys[miss])
            rows[miss] = disk_rows
            found[miss] = disk_found
            self._counters["disk_reads"] += int(disk_found.sum())
            if self.promote and bool(disk_found.any()):
                self._promote(keys[miss][disk_found], disk_rows[disk_found], protect=hit_slots)
        self._stamp.index_fill_(0, hit_slots, self._clock)
        return rows, found

    def contains(self, keys: torch.Tensor) -> torch.Tensor:
        """Bool ``[n]``: which keys either tier holds (nothing is read or moved)."""
        keys = check_keys(keys, self.where)
        found = self._index.lookup(keys) >= 0
        if self.spill is not None and not bool(found.all()):
            found |= self.spill.contains(keys)
        return found

    def pop(self, keys: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """Read rows and remove them from the store (both tiers); repeated keys all get the row.

        Returns and raises as :meth:`get`; on an error nothing is removed.
        """
        keys = check_keys(keys, self.where)
        if self._disk_empty():  # every row is in host memory: one native pass finds and removes the keys
            slots = self._index.pop(keys, self._stamp_store, FREE_STAMP)
            found = slots >= 0
            num_found = int(found.sum())
            if num_found == keys.numel():
                rows = self._rows.gather(slots)  # freed slots keep their rows until the next put hands them out
            else:
                hit = found.nonzero().squeeze(1)
                rows = torch.zeros(keys.numel(), self.width, dtype=self.dtype)
                rows.index_copy_(0, hit, self._rows.gather(slots.index_select(0, hit)))
            self._counters["host_reads"] += num_found
            self._version += 1
            return rows, found
        rows, found, _ = self._read_host(keys)
        host_keys = keys[found]
        miss = (~found).nonzero().squeeze(1)
        disk_found = torch.zeros(0, dtype=torch.bool)
        if self.spill is not None and miss.numel():
            disk_rows, disk_found = self.spill.pop(keys[miss])
            rows[miss] = disk_rows
            found[miss] = disk_found
        self._counters["host_reads"] += host_keys.numel()
        self._counters["disk_reads"] += int(disk_found.sum())
        self._index.pop(host_keys, self._stamp_store, FREE_STAMP)
        self._version += 1
        return rows, found

    def remove(self, keys: torch.Tensor) -> None:
        """Forget keys in both tiers; absent keys and repeats are ignored."""
        keys = check_keys(keys, self.where)
        self._index.pop(keys, self._stamp_store, FREE_STAMP)
        if self.spill is not None:
            self.spill.remove(keys)
        self._version += 1

    def clear(self) -> None:
        """Forget every row of both tiers (the disk store's files are deleted; host memory stays reserved)."""
        self._index.pop(self._index.export()[0], self._stamp_store, FREE_STAMP)
        if self.spill is not None:
            self.spill.clear()
        self._version += 1

    def load(self, chunks: Iterable[Tuple[torch.Tensor, torch.Tensor]]) -> int:
        """Fill an empty store from ``(keys, rows)`` chunks, read one at a time: host memory first, as far as the
        budget allows, then the rest into the disk store in one :meth:`DiskStore.bulk_load`. Keys must be distinct
        across all chunks (a checkpoint's are checked as it is read).

        Returns:
            int: the rows loaded.

        Raises:
            ConfigError: the store is not empty, a chunk is malformed, or a key repeats within the disk part.
            StorageError: the rows do not fit the budget and there is no disk store, or a disk write failed.

        Whatever the chunks or the load raise, the store is left empty.

        Example::

            store.load(zip(keys.split(65536), rows.split(65536)))
        """
        if len(self):
            raise ConfigError(f"{self.where}: load fills an empty store; this one holds {len(self)} rows")
        chunks = iter(chunks)
        try:
            for keys, rows in chunks:
                free = self.max_rows - len(self._index)
                if free:
                    self.put(keys[:free], rows[:free])
                if keys.numel() > free:
                    if self.spill is None:
                        more = keys.numel() - free + sum(k.numel() for k, _ in chunks)
                        raise StorageError(
                            f"{self.where}: {more} rows to load do not fit: the host store holds at most "
                            f"{self.max_rows} rows within budget_bytes={self.budget_bytes}. Raise the table's host "
                            "memory budget, or give the table a disk directory"
                        )
                    rest = itertools.chain([(keys[free:], rows[free:])], chunks)
                    del keys, rows  # the disk part holds one chunk at a time
                    self.spill.bulk_load(rest)
        except BaseException:
            self.clear()
            raise
        return len(self)

    def chunks(self, rows_per_chunk: int = 65536) -> Iterator[Tuple[torch.Tensor, torch.Tensor]]:
        """Every ``(keys int64 [m], rows [m, width])`` once, host rows first, ``m <= rows_per_chunk``.

        Raises:
            RuntimeError: the store changed between two chunks.
            StorageError: a disk record is damaged.
        """
        keys, slots = self._index.export()
        version = self._version
        for start in range(0, keys.numel(), rows_per_chunk):
            self._check_unchanged(version)
            yield keys[start : start + rows_per_chunk], self._rows.gather(slots[start : start + rows_per_chunk])
        if self.spill is not None:
            for chunk in self.spill.chunks(rows_per_chunk):
                self._check_unchanged(version)
                yield chunk

    def keys(self, rows_per_chunk: int = 65536) -> Iterator[torch.Tensor]:
        """The keys of :meth:`chunks`, in its order and blocks, without reading their rows.

        Raises:
            RuntimeError: the store changed between two blocks.
            StorageError: a disk record is damaged.
        """
        keys, version = self._index.export()[0], self._version
        for start in range(0, keys.numel(), rows_per_chunk):
            self._check_unchanged(version)
            yield keys[start : start + rows_per_chunk]
        if self.spill is not None:
            for chunk in self.spill.keys(rows_per_chunk):
                self._check_unchanged(version)
                yield chunk

    def close(self) -> None:
        """Close the disk store, if any (see :meth:`DiskStore.close`); host memory is freed with the object."""
        if self.spill is not None:
            self.spill.close()

    # -- internals ------------------------------------------------------------------------------------------------

    def _check_unchanged(self, version: int) -> None:
        if version != self._version:  # builtin, like dict's: a caller mutating the store it iterates
            raise RuntimeError(f"{self.where}: the store changed while chunks() was iterating; do not mutate it")

    def _nbytes_at(self, capacity: int) -> int:
        """An upper bound of :attr:`nbytes` once the host tier holds ``capacity`` rows."""
        return capacity * (self.row_bytes + STAMP_BYTES) + KeyIndex.nbytes_for(capacity)

    def _max_rows_within(self, budget_bytes: int) -> int:
        """The largest capacity whose :meth:`_nbytes_at` fits the budget and this machine's RAM (bisect)."""
        budget_bytes = min(budget_bytes, physical_memory_bytes())
        low, high = 0, budget_bytes // (self.row_bytes + STAMP_BYTES) + 1  # _nbytes_at(high) > budget
        while high - low > 1:
            middle = (low + high) // 2
            low, high = (middle, high) if self._nbytes_at(middle) <= budget_bytes else (low, middle)
        return low

    def _disk_empty(self) -> bool:
        """Whether no row is on disk: a put or pop then stays in host memory (one native pass, nothing to undo)."""
        return self.spill is None or not len(self.spill)

    def _grow_storage(self) -> None:
        """Make the per-slot storage cover the index's capacity (nothing moves: both live in reserved memory; every
        slot the index hands out is stamped as it is)."""
        self._rows.grow(self._index.capacity)
        self._stamp = self._stamp_store[: self._index.capacity]

    def _tick(self) -> None:
        """Advance the LRU clock; near int32's end, renumber the stamps (keeping their order) to start over."""
        self._clock += 1
        if self._clock < MAX_CLOCK:
            return
        used = self._stamp != FREE_STAMP
        order = torch.unique(self._stamp[used], return_inverse=True)[1].to(torch.int32)
        self._stamp[used] = order
        self._clock = int(order.max()) + 2 if order.numel() else 1

    def _read_host(self, keys: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Rows found in host memory (zeros elsewhere), the found mask, and their slots."""
        slots = self._index.lookup(keys)
        found = slots >= 0
        if bool(found.all()):
            return self._rows.gather(slots), found, slots
        hit = found.nonzero().squeeze(1)
        hit_slots = slots[hit]
        rows = torch.zeros(keys.numel(), self.width, dtype=self.dtype)
        if hit.numel():
            rows.index_copy_(0, hit, self._rows.gather(hit_slots))
        return rows, found, hit_slots

    def _promote(self, keys: torch.Tensor, rows: torch.Tensor, protect: torch.Tensor) -> None:
        """Move rows just read from disk (keys may repeat) into host memory, as far as they fit."""
        distinct = last_occurrence(keys)
        if distinct is not None:
            keys, rows = keys[distinct], rows[distinct]
        promoted = self._place(keys, rows, protect=protect, on_disk=True)
        self._counters["promotions"] += int(promoted > 0)
        self._counters["promoted_rows"] += promoted

    def _least_recent(self, num: int, protect: torch.Tensor) -> torch.Tensor:
        """Slots of the ``num`` least recently used rows, none of them in ``protect``."""
        kept = self._stamp[protect]  # protected stamps are set aside in place: no copy of every stamp
        self._stamp[protect] = FREE_STAMP
        victims = torch.topk(self._stamp, num, largest=False, sorted=False).indices
        self._stamp[protect] = kept
        return victims

    def _place(self, keys: torch.Tensor, rows: torch.Tensor, protect: torch.Tensor, on_disk: bool) -> int:
        """Store rows of distinct keys absent from host memory: in host memory as far as the budget allows
        (spilling LRU rows outside ``protect``), the rest on disk. ``on_disk``: the keys are on disk already
        (promotion), so rows that stay behind need no write. Writes to disk first: on failure nothing changes.
        Returns the number of rows placed in host memory.
        """
        num = keys.numel()
        free = self.max_rows - len(self._index)
        num_victims = 0
        if num > free and self.spill is not None:
            evictable = len(self._index) - torch.unique(protect).numel()  # a get may repeat a key
            num_victims = min(num - free + self._headroom_rows, evictable)
        keep = max(0, min(num, free + num_victims))
        victims = self._least_recent(num_victims, protect) if num_victims else torch.empty(0, dtype=torch.int64)
        victim_keys = self._index.keys_of(victims)
        direct_keys, direct_rows = (keys[:0], rows[:0]) if on_disk else (keys[keep:], rows[keep:])
        if victims.numel() or direct_keys.numel():
            if self.spill is None:
                raise StorageError(
                    f"{self.where}: {num} new rows do not fit: the host store holds {len(self._index)} of at most "
                    f"{self.max_rows} rows within budget_bytes={self.budget_bytes}. Raise the table's host memory "
                    f"budget to at least {self._nbytes_at(len(self._index) + num)} bytes, or give the table a disk "
                    f"directory so rows can spill to disk"
                )
            self.spill.put(torch.cat([victim_keys, direct_keys]), torch.cat([self._rows.gather(victims), direct_rows]))
        if victims.numel():
            self._index.pop(victim_keys, self._stamp_store, FREE_STAMP)
            self._counters["spills"] += 1
            self._counters["spilled_rows"] += victims.numel()
        self._counters["direct_disk_rows"] += direct_keys.numel()
        if keep:
            slots = self._index.insert(keys[:keep])
            self._grow_storage()
            self._rows.scatter(slots, rows[:keep])
            self._stamp.index_fill_(0, slots, self._clock)
            if self.spill is not None:
                self.spill.remove(keys[:keep])  # an older copy may sit on disk: each key lives in one tier
        return keep
