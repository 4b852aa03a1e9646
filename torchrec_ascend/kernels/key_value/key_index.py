"""Compact key indexes of the KEY_VALUE host and disk stores: partitioned open addressing in numpy arrays.

Both tiers index keys with :class:`OpenTable`: ``partitions`` open-addressing tables (linear probing, tombstones)
laid out in one anonymous memory mapping that reserves address space for the largest size each partition may
reach and costs memory only for the pages it touches. A partition grows on its own (rehashing only its entries), so
growth never holds two copies of the index, only a copy of one partition, and the load of every partition stays in
a band: ``[HOST_LOW_LOAD, HOST_MAX_LOAD]`` = ``[0.46, 0.6]`` of its buckets in the host index. Probes, inserts and
rebuilds are native ops over a whole batch (``torch.ops.torchrec_ascend.key_index_*`` and ``fingerprint_*``, see
:mod:`torchrec_ascend.native.ops`) working in place on these arrays: one pass over the keys, the home buckets
prefetched ahead, no temporaries beyond a few integers per key.

* :class:`KeyIndex` (host tier): key -> slot. A bucket is a uint32 (``slot + 1``); the full key sits in the
  slot -> key column, which the host store needs anyway to name the rows it spills. Memory per slot: 8 (key) + 4 /
  load (buckets) = 14.7 to 16.7 bytes, plus 4 per slot of the free-slot stack up to the most slots freed at once.
* :class:`~torchrec_ascend.kernels.key_value.disk_store.DiskStore` keeps only a bucket per key: a uint64 of a
  28-bit fingerprint of the key's hash and the record's 36-bit location; the full key is verified in the record on
  disk. Its partitions grow in smaller steps (``DISK_GROWTH``, load in ``[0.7, 0.8]``): rebuilding one reads no keys,
  and a bulk load, which sizes every partition at its low load, then costs 8 / 0.7 = 11.5 bytes a key, not 13.
  Memory per key: 8 / load = 10 to 11.5 bytes.

Example::

    index = KeyIndex(max_capacity=1000)
    slots = index.insert(torch.tensor([10, 20, 30]))  # tensor([0, 1, 2])
    index.lookup(torch.tensor([20, 99]))  # tensor([1, -1])
    index.remove(torch.tensor([10]))  # tensor([0]); slot 0 is reused by the next insert
"""

from __future__ import annotations

from typing import Optional, Tuple

import numpy as np
import torch
from numpy.typing import DTypeLike

from torchrec_ascend.errors import CapacityError
from torchrec_ascend.native import ops
from torchrec_ascend.native.memory import reserve

# The host index compares the full key (a read of the key column at random) at every entry a probe meets, and a
# put probes each new key to the end of its chain: at these loads the chains are about half as long as at the disk
# index's (a put of about 1,300 keys 279 -> 194 us in the KEY_VALUE benchmark), for about 2 more bytes per host row,
# whose row is 64 bytes or more.
HOST_MAX_LOAD = 0.6  # a partition is rehashed before more of its buckets than this are used (live or tombstone)
GROWTH = 1.3  # a rehash sizes the partition for its keys at HOST_MAX_LOAD / GROWTH
HOST_LOW_LOAD = HOST_MAX_LOAD / GROWTH
# The disk tier's fingerprint index: its probes compare fingerprints in the buckets, so it can be fuller; its rebuilds
# need no key reads (the home is in the entry), so they are cheap, and every disk key costs 8 / load bytes of host
# memory. (The host index's rebuilds read each entry's key from the key column at random, so it keeps the larger
# steps: fewer rebuilds as tombstones accumulate.)
MAX_LOAD = 0.8
DISK_GROWTH = 1.15
DISK_LOW_LOAD = MAX_LOAD / DISK_GROWTH
MIN_BUCKETS = 8
_U64 = np.uint64
_NO_STAMPS = torch.empty(0, dtype=torch.int32)  # key_index_pop without per-slot stamps


def mix64(keys: np.ndarray) -> np.ndarray:
    """splitmix64 finaliser of uint64 ``keys`` (wrapping arithmetic): the hash every index uses.

    Example::

        mix64(np.arange(3, dtype=np.uint64))
    """
    z = keys + _U64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> _U64(30))) * _U64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> _U64(27))) * _U64(0x94D049BB133111EB)
    return z ^ (z >> _U64(31))


class OpenTable:
    """Partitioned open-addressing buckets (see the module docstring); callers decide what a bucket holds.

    A bucket is an unsigned integer: 0 is empty, all ones a removed entry, anything else an entry. Probing,
    inserting and rebuilding partitions are native ops (:mod:`torchrec_ascend.native.ops` ``key_index_*`` and
    ``fingerprint_*``) working in place on :attr:`state`, torch views of these arrays.

    Args:
        dtype: bucket type (``np.uint32`` or ``np.uint64``).
        partitions (int): a power of two.
        max_buckets (int): the most buckets one partition may have (address space is reserved for it).

    Example::

        table = OpenTable(np.uint64, 4, 64)
        table.nbytes  # 0: no partition holds a key yet
    """

    def __init__(self, dtype: DTypeLike, partitions: int, max_buckets: int) -> None:
        self.dtype = np.dtype(dtype)
        self.tomb = np.iinfo(self.dtype).max
        self.partitions = partitions
        self.stride = max(MIN_BUCKETS, max_buckets)
        self.buckets = reserve(self.dtype, partitions * self.stride)
        self.size = np.zeros(partitions, dtype=np.int64)  # 0 until a partition holds a key: probes find it empty
        self.live = np.zeros(partitions, dtype=np.int64)
        self.used = np.zeros(partitions, dtype=np.int64)  # live + tombstones
        signed = np.int32 if self.dtype.itemsize == 4 else np.int64
        #: ``(buckets, sizes, live, used)`` as tensors sharing these arrays' memory (buckets as signed bits).
        self.state: Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor] = (
            torch.from_numpy(self.buckets.view(signed)),
            torch.from_numpy(self.size),
            torch.from_numpy(self.live),
            torch.from_numpy(self.used),
        )

    @property
    def nbytes(self) -> int:
        """Bytes of the buckets in use (the memory this table costs, up to page rounding per partition)."""
        return int(self.size.sum()) * self.dtype.itemsize

    def __len__(self) -> int:
        return int(self.live.sum())

    def full_error(self, p: int, where: str) -> CapacityError:
        """The error of an insert into ``where`` that found partition ``p`` would outgrow its reserved buckets."""
        return CapacityError(
            f"{where}: index partition {p} would need more than the {self.stride} buckets reserved for it; the store "
            f"holds more keys than it was sized for"
        )

    def remove(self, buckets: np.ndarray) -> None:
        """Turn the entries at ``buckets`` (distinct, found by a probe) into tombstones."""
        self.buckets[buckets] = self.tomb
        self.live -= np.bincount(buckets // self.stride, minlength=self.partitions)

    def entries(self) -> Tuple[np.ndarray, np.ndarray]:
        """Every live entry and its bucket, partition by partition (one pass over the used buckets)."""
        values, buckets = [], []
        for p in np.flatnonzero(self.live).tolist():
            start = p * self.stride
            region = self.buckets[start : start + int(self.size[p])]
            at = np.flatnonzero((region != 0) & (region != self.tomb))
            values.append(region[at])
            buckets.append(at + start)
        if not values:
            return np.empty(0, dtype=self.dtype), np.empty(0, dtype=np.int64)
        return np.concatenate(values), np.concatenate(buckets)


def partitions_for(num_keys: int) -> int:
    """Partitions of a table for up to ``num_keys`` keys: about 4096 keys each, between 1 and 256 (a power of 2).

    Example::

        partitions_for(10**9)  # 256
    """
    return 1 << min(8, max(0, (num_keys // 4096).bit_length() - 1))


class KeyIndex:
    """Raw int64 key -> slot in ``[0, capacity)`` for the host store, up to ``max_capacity`` keys.

    Slots are handed out like :class:`~torchrec_ascend.hash.id_map.IdMap` does: freed slots first (the most
    recently freed first), then fresh ones in increasing order, so ``capacity`` (the highest slot used + 1) only
    grows when no freed slot is left, and per-slot storage of the owner never moves.

    Args:
        initial_capacity (int): unused (kept for callers that size the first allocation; growth is free).
        max_capacity (Optional[int]): the most keys it may ever hold (address space is reserved for them);
            ``None``: ``2**26``.

    Example::

        index = KeyIndex(max_capacity=4)
        index.insert(torch.tensor([10, 20, 30]))  # tensor([0, 1, 2])
        index.keys_of(torch.tensor([1]))  # tensor([20])
    """

    def __init__(self, initial_capacity: int = 0, max_capacity: Optional[int] = None) -> None:
        if initial_capacity < 0 or (max_capacity is not None and max_capacity < 0):
            # builtin: an internal invariant (the host store passes capacities it derived), not a user's config
            raise ValueError(f"KeyIndex capacities must be >= 0, got {initial_capacity} and {max_capacity}")
        self.max_capacity = 1 << 26 if max_capacity is None else max_capacity
        parts = partitions_for(self.max_capacity)
        self._table = OpenTable(np.uint32, parts, self.max_buckets(self.max_capacity, parts))
        self._key = reserve(np.int64, self.max_capacity)
        self._key_column = torch.from_numpy(self._key)
        self._free = reserve(np.int32, self.max_capacity)
        # Slots on the free stack, slots handed out (the capacity), the most slots the stack has held (its pages
        # touched): one array, so the native put and pop update them in place.
        self._counts = np.zeros(3, dtype=np.int64)
        self._slot_state = (torch.from_numpy(self._free), torch.from_numpy(self._counts))

    @property
    def capacity(self) -> int:
        """Slots handed out so far (used or freed): per-slot storage must cover ``[0, capacity)``."""
        return int(self._counts[1])

    @staticmethod
    def max_buckets(max_keys: int, partitions: int) -> int:
        """Buckets reserved per partition: room for twice its share of keys (hashing spreads keys evenly)."""
        return int(2 * max_keys / partitions / HOST_LOW_LOAD) + 2 * MIN_BUCKETS

    def __len__(self) -> int:
        return int(self._counts[1] - self._counts[0])  # slots handed out less those freed: no pass over the table

    @property
    def nbytes(self) -> int:
        """Bytes of this index: the buckets in use, the key column up to ``capacity`` and the free-slot stack up to
        the most slots it has held."""
        return self._table.nbytes + self.capacity * 8 + int(self._counts[2]) * 4

    @staticmethod
    def nbytes_for(capacity: int) -> int:
        """An upper bound of :attr:`nbytes` with ``capacity`` keys: the stores' budget arithmetic."""
        parts = partitions_for(capacity)
        return capacity * 12 + 4 * (parts * (MIN_BUCKETS + 1) + int(np.ceil(capacity / HOST_LOW_LOAD)) + parts)

    def reserve(self, num_keys: int) -> None:
        """Check that ``num_keys`` keys fit.

        Raises:
            CapacityError: ``num_keys`` exceeds ``max_capacity``; the owner must make room first.
        """
        if num_keys > self.max_capacity:
            raise CapacityError(
                f"KeyIndex: {num_keys} keys exceed max_capacity={self.max_capacity}; the store must spill or evict "
                f"before inserting"
            )

    def lookup(self, keys: torch.Tensor) -> torch.Tensor:
        """Slot of each key (int64 ``[n]``, repeats allowed), ``-1`` where absent."""
        if keys.numel() == 0 or len(self) == 0:
            return torch.full_like(keys, -1)
        buckets, sizes = self._table.state[:2]
        return ops.key_index_lookup(buckets, sizes, self._key_column, keys)

    def insert(self, keys: torch.Tensor) -> torch.Tensor:
        """Give each key a slot (freed slots are reused first).

        Args:
            keys: 1-D int64 tensor ``[n]`` of distinct keys that are not present.

        Returns:
            torch.Tensor: int64 ``[n]``, the new slots.

        Raises:
            CapacityError: the keys do not fit under ``max_capacity``.
            ValueError: a key is already present or repeats (a caller bug); nothing is inserted.
        """
        n = keys.numel()
        if n == 0:
            return torch.empty(0, dtype=torch.int64)
        self.reserve(len(self) + n)
        values = keys.numpy()
        num_free, capacity = int(self._counts[0]), int(self._counts[1])
        reused = min(n, num_free)
        slots = np.empty(n, dtype=np.int64)
        slots[:reused] = self._free[num_free - reused : num_free][::-1]
        slots[reused:] = np.arange(capacity, capacity + n - reused)
        self._key[slots] = values
        full = ops.key_index_insert(*self._table.state, self._key_column, torch.from_numpy(slots), HOST_MAX_LOAD,
                                    HOST_LOW_LOAD)
        if full != -1:  # nothing was indexed: the slots stay where they were
            if full >= 0:
                raise self._table.full_error(full, "KeyIndex")
            # builtin: an internal invariant (the stores look keys up before inserting), never the user's input
            raise ValueError(f"KeyIndex.insert: key {int(values[-2 - full])} is present or repeats; keys must be "
                             f"distinct and absent, look them up first")
        self._counts[:2] = (num_free - reused, capacity + n - reused)
        return torch.from_numpy(slots)

    def upsert(self, keys: torch.Tensor, stamps: torch.Tensor, stamp: int) -> Tuple[torch.Tensor, torch.Tensor]:
        """Give every key a slot, keeping the slots of present keys and stamping each slot with ``stamp``: one
        native pass (``key_index_upsert``).

        Args:
            keys: int64 ``[n]``, repeats allowed.
            stamps: the owner's int32 per-slot stamps, ``[>= max_capacity]``, non-negative, none equal to ``stamp``.
            stamp: the owner's clock for this call.

        Returns:
            Tuple[torch.Tensor, torch.Tensor]: per distinct key its slot and the position of its last occurrence
            (``0 .. n-1`` in order when no key repeats).

        Raises:
            CapacityError: the keys may not fit under ``max_capacity`` (nothing changed); the owner makes room first.

        Example::

            slots, positions = index.upsert(torch.tensor([5, 6, 5]), stamps, 3)  # positions: tensor([2, 1])
        """
        self.reserve(len(self) + keys.numel())
        slots, positions, full = ops.key_index_upsert(*self._table.state, self._key_column, *self._slot_state,
                                                      stamps, keys, stamp, HOST_MAX_LOAD, HOST_LOW_LOAD)
        if full >= 0:
            raise self._table.full_error(full, "KeyIndex")
        return slots, positions

    def pop(self, keys: torch.Tensor, stamps: torch.Tensor, free_stamp: int) -> torch.Tensor:
        """Remove keys, returning the slot of each (``-1`` where absent; repeats get the same slot) and stamping the
        freed slots ``free_stamp``: one native pass (``key_index_pop``). The rows of freed slots stay until the
        next insert hands the slots out again.

        Example::

            slots = index.pop(torch.tensor([10, 99]), stamps, FREE)  # tensor([0, -1])
        """
        if len(self) == 0:
            return torch.full_like(keys, -1)
        buckets, sizes, live, _ = self._table.state
        return ops.key_index_pop(buckets, sizes, live, self._key_column, *self._slot_state, stamps, keys, free_stamp)[0]

    def remove(self, keys: torch.Tensor) -> torch.Tensor:
        """Forget keys; absent keys and repeats are ignored.

        Args:
            keys: 1-D int64 tensor ``[n]``.

        Returns:
            torch.Tensor: int64 ``[m]``, the slots freed (one per distinct present key, in order of first occurrence).
        """
        if keys.numel() == 0 or len(self) == 0:
            return torch.empty(0, dtype=torch.int64)
        buckets, sizes, live, _ = self._table.state
        return ops.key_index_pop(buckets, sizes, live, self._key_column, *self._slot_state, _NO_STAMPS, keys, 0)[1]

    def keys_of(self, slots: torch.Tensor) -> torch.Tensor:
        """The key held by each of ``slots`` (int64 ``[n]``, slots in use)."""
        return torch.from_numpy(self._key[slots.numpy()])

    def export(self) -> Tuple[torch.Tensor, torch.Tensor]:
        """All ``(keys, slots)``, two int64 tensors ``[len(self)]``, sorted by slot."""
        entries, _ = self._table.entries()
        slots = np.sort(entries.astype(np.int64) - 1)
        return torch.from_numpy(self._key[slots]), torch.from_numpy(slots)
