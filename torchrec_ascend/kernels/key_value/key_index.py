"""Compact key indexes of the KEY_VALUE host and disk stores: partitioned open addressing in numpy arrays.

Both tiers index keys with :class:`OpenTable`: ``partitions`` open-addressing tables (linear probing, tombstones)
laid out in one anonymous memory mapping that reserves address space for the largest size each partition may
reach and costs memory only for the pages it touches. A partition grows on its own (by about 1.3x, rehashing only
its entries), so growth never holds two copies of the index, only a copy of one partition; the load of every
partition stays in ``[LOW_LOAD, MAX_LOAD]`` = ``[0.62, 0.8]`` of its buckets. Every operation is vectorized over
a batch: one numpy pass per probe round, never a Python loop over keys.

* :class:`KeyIndex` (host tier): key -> slot. A bucket is a uint32 (``slot + 1``); the full key sits in the
  slot -> key column, which the host store needs anyway to name the rows it spills. Memory per slot: 8 (key) + 4 /
  load (buckets) = 13 to 14.5 bytes, plus 4 per slot of the free-slot stack up to the most slots freed at once.
* :class:`~torchrec_ascend.kernels.key_value.disk_store.DiskStore` keeps only a bucket per key: a uint64 of a
  28-bit fingerprint of the key's hash and the record's 36-bit location; the full key is verified in the record on
  disk. Memory per key: 8 / load = 10 to 13 bytes.

Example::

    index = KeyIndex(max_capacity=1000)
    slots = index.insert(torch.tensor([10, 20, 30]))  # tensor([0, 1, 2])
    index.lookup(torch.tensor([20, 99]))  # tensor([1, -1])
    index.remove(torch.tensor([10]))  # tensor([0]); slot 0 is reused by the next insert
"""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import os
from typing import Callable, Optional, Tuple, cast

import numpy as np
import torch
from numpy.typing import DTypeLike

from torchrec_ascend.errors import CapacityError

MAX_LOAD = 0.8  # a partition is rehashed before more of its buckets than this are used (live or tombstone)
GROWTH = 1.3  # a rehash sizes the partition for its keys at MAX_LOAD / GROWTH
LOW_LOAD = MAX_LOAD / GROWTH
MIN_BUCKETS = 8
WINDOW = 8  # buckets probed per key and round
_STEPS = np.arange(WINDOW)
PAGE = mmap.PAGESIZE
_MAP_NORESERVE = getattr(mmap, "MAP_NORESERVE", 0x4000)
_U64 = np.uint64


def reserve(dtype: DTypeLike, length: int) -> np.ndarray:
    """A zero-filled numpy array of ``length`` elements whose pages cost memory only once written.

    An anonymous private mapping with no swap reservation: growing what is used of it never copies and never
    holds a second copy, which ``np.resize`` or ``torch.cat`` would.

    Example::

        column = reserve(np.int64, 1 << 30)  # 8 GiB of address space, a few KiB of memory
        column[:4] = 7
    """
    nbytes = max(PAGE, length * np.dtype(dtype).itemsize)
    buffer = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | _MAP_NORESERVE)
    return np.frombuffer(buffer, dtype=dtype, count=length)


def release(array: np.ndarray, start: int, stop: int) -> None:
    """Give back to the system the whole pages of ``array[start:stop]`` (a :func:`reserve` array); they read 0."""
    base = array.__array_interface__["data"][0]
    first = -(-(base + start * array.itemsize) // PAGE) * PAGE
    last = (base + stop * array.itemsize) // PAGE * PAGE
    if last > first:
        cast(mmap.mmap, array.base).madvise(mmap.MADV_DONTNEED, first - base, last - first)  # reserve()'s mapping


def trim_heap() -> None:
    """Hand the C heap's free pages back to the system (glibc ``malloc_trim``; nothing elsewhere).

    Many small arrays freed together (a bulk load's per-partition pieces) leave the heap fragmented: without this
    the process keeps them resident, ~17 bytes a loaded row beyond the index.

    Example::

        trim_heap()
    """
    if _LIBC is not None and hasattr(_LIBC, "malloc_trim"):
        _LIBC.malloc_trim(0)


_LIBC_NAME = ctypes.util.find_library("c")
_LIBC = ctypes.CDLL(_LIBC_NAME) if _LIBC_NAME else None


def mix64(keys: np.ndarray) -> np.ndarray:
    """splitmix64 finaliser of uint64 ``keys`` (wrapping arithmetic): the hash every index uses.

    Example::

        mix64(np.arange(3, dtype=np.uint64))
    """
    z = keys + _U64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> _U64(30))) * _U64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> _U64(27))) * _U64(0x94D049BB133111EB)
    return z ^ (z >> _U64(31))


def scale(fraction: np.ndarray, bits: int, size: np.ndarray) -> np.ndarray:
    """``floor(fraction * size / 2**bits)`` as int64: a ``bits``-bit hash mapped onto ``[0, size)``."""
    return ((fraction.astype(_U64) * size.astype(_U64)) >> _U64(bits)).astype(np.int64)


class OpenTable:
    """Partitioned open-addressing buckets (see the module docstring); callers decide what a bucket holds.

    A bucket is an unsigned integer: 0 is empty, ``tomb`` a removed entry, anything else an entry. The caller
    maps keys to ``(partition, home)`` and tells a probe which entries match.

    Args:
        dtype: bucket type (``np.uint32`` or ``np.uint64``).
        partitions (int): a power of two.
        max_buckets (int): the most buckets one partition may have (address space is reserved for it).
        home_of (Callable): ``home_of(entries, partition, size) -> int64 homes``, for rehashing a partition.

    Example::

        table = OpenTable(np.uint32, 1, 64, lambda e, p, size: (e % size).astype(np.int64))
    """

    def __init__(self, dtype: DTypeLike, partitions: int, max_buckets: int,
                 home_of: Callable[[np.ndarray, int, int], np.ndarray]) -> None:
        self.dtype = np.dtype(dtype)
        self.tomb = np.iinfo(self.dtype).max
        self.partitions = partitions
        self.stride = max(MIN_BUCKETS, max_buckets)
        self.buckets = reserve(self.dtype, partitions * self.stride)
        self.size = np.zeros(partitions, dtype=np.int64)  # 0 until a partition holds a key: probes find it empty
        self.live = np.zeros(partitions, dtype=np.int64)
        self.used = np.zeros(partitions, dtype=np.int64)  # live + tombstones
        self._home_of = home_of

    @property
    def nbytes(self) -> int:
        """Bytes of the buckets in use (the memory this table costs, up to page rounding per partition)."""
        return int(self.size.sum()) * self.dtype.itemsize

    def __len__(self) -> int:
        return int(self.live.sum())

    def _window(self, part: np.ndarray, offset: np.ndarray) -> np.ndarray:
        """Global buckets ``[m, WINDOW]``: each key's next ``WINDOW`` probe positions from ``offset``."""
        size = self.size[part][:, None]  # 0 (an empty partition: its reserved buckets all read 0) or >= WINDOW
        positions = (offset % np.maximum(size[:, 0], 1))[:, None] + _STEPS  # wraps at most once below
        positions -= ((positions >= size) & (size > 0)) * size
        return (part * self.stride)[:, None] + positions

    def find(self, part: np.ndarray, home: np.ndarray,
             match: Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]) -> np.ndarray:
        """The bucket (global index) holding each key's entry, or -1.

        Probes ``WINDOW`` buckets per key and round (one 2-D gather), so a round usually settles every key.

        Args:
            part, home: int64 ``[n]``, each key's partition and home bucket in it.
            match: ``match(entries, which, buckets) -> bool``: whether the entries (neither empty nor tombstone)
                met by keys ``which`` (positions in ``[0, n)``) at ``buckets`` are theirs.
        """
        found = np.full(part.size, -1, dtype=np.int64)
        which = np.arange(part.size)
        offset = home.astype(np.int64, copy=True)
        while which.size:
            buckets = self._window(part[which], offset)
            entries = self.buckets[buckets]
            empty = entries == 0
            ends = np.where(empty.any(axis=1), empty.argmax(axis=1), WINDOW)  # the chain stops at an empty bucket
            before_end = _STEPS[None, :] < ends[:, None]
            rows, cols = np.nonzero(before_end & (entries != self.tomb))
            hit = np.zeros(entries.shape, dtype=bool)
            if rows.size:
                hit[rows, cols] = match(entries[rows, cols], which[rows], buckets[rows, cols])
            settled = hit.any(axis=1)
            first = hit.argmax(axis=1)
            found[which[settled]] = buckets[settled, first[settled]]
            going = ~settled & (ends == WINDOW)
            which, offset = which[going], offset[going] + WINDOW
        return found

    def insert(self, part: np.ndarray, home: np.ndarray, entries: np.ndarray) -> np.ndarray:
        """Store ``entries`` (of keys known to be absent) from their homes on; return their buckets.

        The caller calls :meth:`make_room` first.
        """
        placed = np.empty(part.size, dtype=np.int64)
        which = np.arange(part.size)
        offset = home.astype(np.int64, copy=True)
        while which.size:
            window = self._window(part[which], offset)
            old = self.buckets[window]
            free = (old == 0) | (old == self.tomb)
            has_free = free.any(axis=1)
            step = free.argmax(axis=1)
            bucket = window[np.arange(which.size), step]
            wants = np.flatnonzero(has_free)
            _, first = np.unique(bucket[wants], return_index=True)  # one entry per bucket per round
            won = wants[first]
            was_tomb = old[won, step[won]] == self.tomb
            self.buckets[bucket[won]] = entries[which[won]]
            placed[which[won]] = bucket[won]
            self.used -= np.bincount(part[which[won][was_tomb]], minlength=self.partitions)
            going = np.ones(which.size, dtype=bool)
            going[won] = False
            lost = going & has_free  # another key took that bucket: probe again from it
            offset = np.where(lost, offset + step, offset + WINDOW)
            which, offset = which[going], offset[going]
        counts = np.bincount(part, minlength=self.partitions)
        self.live += counts
        self.used += counts
        return placed

    def remove(self, buckets: np.ndarray) -> None:
        """Turn the entries at ``buckets`` (distinct, from :meth:`find`) into tombstones."""
        self.buckets[buckets] = self.tomb
        self.live -= np.bincount(buckets // self.stride, minlength=self.partitions)

    def make_room(self, part: np.ndarray) -> None:
        """Rehash the partitions that ``part`` (one per key about to be inserted) would fill past ``MAX_LOAD``.

        Raises:
            CapacityError: a partition would need more than ``max_buckets``.
        """
        incoming = np.bincount(part, minlength=self.partitions)
        for p in np.flatnonzero(self.used + incoming > MAX_LOAD * self.size).tolist():
            self.rehash(p, int(self.live[p] + incoming[p]))

    def rehash(self, p: int, keys: int, extra: Optional[np.ndarray] = None) -> None:
        """Rebuild partition ``p`` without tombstones, sized for ``keys`` keys at ``LOW_LOAD``, adding the
        entries ``extra`` (of keys absent from it; counted in ``keys`` and already in its live count)."""
        size = max(MIN_BUCKETS, int(np.ceil(keys / LOW_LOAD)) + 1)
        if size > self.stride:
            raise CapacityError(
                f"key index: partition {p} would need {size} buckets, more than the {self.stride} reserved; "
                f"the store holds more keys than it was sized for"
            )
        start, old_size = p * self.stride, int(self.size[p])
        region = self.buckets[start : start + old_size]
        entries = region[(region != 0) & (region != self.tomb)].copy()
        if extra is not None:
            entries = np.concatenate([entries, extra])
        region[:] = 0
        if size < old_size:
            release(self.buckets, start + size, start + old_size)
        self.size[p] = size
        self.live[p] = self.used[p] = len(entries)
        if entries.size:
            self._place_sorted(p, entries)

    def _place_sorted(self, p: int, entries: np.ndarray) -> None:
        """Lay out the entries of an emptied partition as linear probing would, without probing.

        Sorted by home, entry ``i`` lands at ``max(home_i, position_{i-1} + 1)`` = ``i + cummax(home_j - j)``;
        the few that run past the end wrap around through :meth:`insert`.
        """
        size = int(self.size[p])
        homes = self._home_of(entries, p, size)
        order = np.argsort(homes, kind="stable")
        entries, homes = entries[order], homes[order]
        ranks = np.arange(entries.size)
        positions = ranks + np.maximum.accumulate(homes - ranks)
        inside = positions < size
        self.buckets[p * self.stride + positions[inside]] = entries[inside]
        if not inside.all():
            self.live[p] -= int((~inside).sum())
            self.used[p] = self.live[p]
            part = np.full(int((~inside).sum()), p, dtype=np.int64)
            self.insert(part, homes[~inside], entries[~inside])

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

    Attributes:
        capacity (int): slots handed out so far (used or freed): per-slot storage must cover ``[0, capacity)``.

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
        self.capacity = 0
        parts = partitions_for(self.max_capacity)
        self._table = OpenTable(np.uint32, parts, self.max_buckets(self.max_capacity, parts), self._home_of)
        self._key = reserve(np.int64, self.max_capacity)
        self._free = reserve(np.int32, self.max_capacity)
        self._num_free = 0
        self._free_high = 0  # the most freed slots held at once: the stack's pages touched

    @staticmethod
    def max_buckets(max_keys: int, partitions: int) -> int:
        """Buckets reserved per partition: room for twice its share of keys (hashing spreads keys evenly)."""
        return int(2 * max_keys / partitions / LOW_LOAD) + 2 * MIN_BUCKETS

    def __len__(self) -> int:
        return len(self._table)

    @property
    def nbytes(self) -> int:
        """Bytes of this index: the buckets in use, the key column up to ``capacity`` and the free-slot stack up to
        the most slots it has held."""
        return self._table.nbytes + self.capacity * 8 + self._free_high * 4

    @staticmethod
    def nbytes_for(capacity: int) -> int:
        """An upper bound of :attr:`nbytes` with ``capacity`` keys: the stores' budget arithmetic."""
        parts = partitions_for(capacity)
        return capacity * 12 + 4 * (parts * (MIN_BUCKETS + 1) + int(np.ceil(capacity / LOW_LOAD)) + parts)

    def _hash(self, keys: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
        h = mix64(keys.view(_U64))
        return (h & _U64(self._table.partitions - 1)).astype(np.int64), h >> _U64(32)

    def _home_of(self, entries: np.ndarray, p: int, size: int) -> np.ndarray:
        return scale(self._hash(self._key[entries.astype(np.int64) - 1])[1], 32, np.int64(size))

    def _locate(self, keys: np.ndarray) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
        part, high = self._hash(keys)
        home = scale(high, 32, self._table.size[part])
        key = self._key
        buckets = self._table.find(part, home, lambda e, which, _: key[e.astype(np.int64) - 1] == keys[which])
        return part, home, buckets

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
        buckets = self._locate(keys.numpy())[2]
        slots = np.full(buckets.size, -1, dtype=np.int64)
        hit = buckets >= 0
        slots[hit] = self._table.buckets[buckets[hit]].astype(np.int64) - 1
        return torch.from_numpy(slots)

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
        if np.unique(values).size != n or bool((self.lookup(keys) >= 0).any()):
            # builtin: an internal invariant (the stores look keys up before inserting), never the user's input
            raise ValueError("KeyIndex.insert: keys must be distinct and absent; look them up first")
        reused = min(n, self._num_free)
        slots = np.empty(n, dtype=np.int64)
        slots[:reused] = self._free[self._num_free - reused : self._num_free][::-1]
        self._num_free -= reused
        slots[reused:] = np.arange(self.capacity, self.capacity + n - reused)
        self.capacity += n - reused
        self._key[slots] = values
        part, high = self._hash(values)
        self._table.make_room(part)
        self._table.insert(part, scale(high, 32, self._table.size[part]), (slots + 1).astype(np.uint32))
        return torch.from_numpy(slots)

    def remove(self, keys: torch.Tensor) -> torch.Tensor:
        """Forget keys; absent keys and repeats are ignored.

        Args:
            keys: 1-D int64 tensor ``[n]``.

        Returns:
            torch.Tensor: int64 ``[m]``, the slots freed (one per distinct present key).
        """
        if keys.numel() == 0 or len(self) == 0:
            return torch.empty(0, dtype=torch.int64)
        buckets = np.unique(self._locate(keys.numpy())[2])
        buckets = buckets[buckets >= 0]
        freed = self._table.buckets[buckets].astype(np.int64) - 1
        self._table.remove(buckets)
        self._free[self._num_free : self._num_free + freed.size] = freed
        self._num_free += freed.size
        self._free_high = max(self._free_high, self._num_free)
        return torch.from_numpy(freed)

    def keys_of(self, slots: torch.Tensor) -> torch.Tensor:
        """The key held by each of ``slots`` (int64 ``[n]``, slots in use)."""
        return torch.from_numpy(self._key[slots.numpy()])

    def export(self) -> Tuple[torch.Tensor, torch.Tensor]:
        """All ``(keys, slots)``, two int64 tensors ``[len(self)]``, sorted by slot."""
        entries, _ = self._table.entries()
        slots = np.sort(entries.astype(np.int64) - 1)
        return torch.from_numpy(self._key[slots]), torch.from_numpy(slots)


def physical_memory_bytes() -> int:
    """This machine's RAM in bytes (what no host tier can exceed).

    Example::

        physical_memory_bytes() // 2**30
    """
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
