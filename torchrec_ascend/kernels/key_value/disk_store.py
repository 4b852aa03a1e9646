"""DiskStore: the KEY_VALUE kernel's bottom tier, rows in append-only segment files.

Design. Each ``put`` encodes its rows as fixed-size records (key, checksum, exact row bytes; see
:mod:`.disk_record`) and appends them with one positional write per segment file touched. The index in memory is
one 8-byte bucket per key (see :mod:`.key_index`): a 28-bit fingerprint of the key's hash and the record's 36-bit
location (segment number * records per segment + offset), 10 to 11.5 bytes of memory per key at its load; the
full key is checked in the record itself, whose checksum also covers its location. Overwritten and removed records
become garbage; a segment whose garbage reaches ``compact_fraction`` of its records is compacted (its live
records are re-appended, then the file is deleted, its number reused) before the next write (the segment being
appended to once that garbage also reaches 1 MiB: it is sealed first), so the files hold about
``1 / (1 - compact_fraction)`` times the live records at most, plus 1 MiB, however small the store. A read gathers a
batch's records across files in one native call that announces them all to the kernel first, so the disk serves
the page-cache misses in parallel (:func:`.segment_file.read_records`), and verifies every record's checksum and
key, so a corrupted, moved or truncated record raises :class:`StorageError` naming the file and keys, never a wrong
row or a silent miss.
A write is made before the index changes: a failed ``put`` (disk full, directory gone) changes nothing.

Why plain files and not an embedded store (LMDB, RocksDB, SQLite): every row has the same size and every
access is a batch of thousands of keys, so an offset index plus one vectorized gather per batch is all the lookup
needed, without per-key calls through a database API or a log-structured merge's read and write amplification.
Such stores would also add a native dependency that must build for every target (Ascend hosts included) and
durability machinery (write-ahead logs, fsync, transactions) that a cache tier does not need: checkpoints are
written separately, through :meth:`DiskStore.chunks`. Plain files give the page cache for free.

Not durable by design: the index lives in memory and segment files are not fsync'ed for durability (a bulk load
syncs what it wrote only to keep its dirty page cache bounded); a store starts empty in a fresh subdirectory of
``directory`` and deletes it on :meth:`DiskStore.close`. Not thread-safe.
"""

from __future__ import annotations

import functools
import heapq
import os
import re
import shutil
import tempfile
from typing import Callable, Dict, Iterator, List, NoReturn, Optional, Set, Tuple

import numpy as np
import torch

from torchrec_ascend.errors import ConfigError, StorageError
from torchrec_ascend.native import ops
from torchrec_ascend.native.memory import trim_heap

from .disk_record import RecordFormat
from .key_index import DISK_LOW_LOAD, MAX_LOAD, OpenTable, mix64
from .row_store import check_keys, check_rows, last_occurrence
from .segment_file import SegmentFile, read_records

DEFAULT_SEGMENT_BYTES = 256 << 20
MAX_KEYS_IN_MESSAGE = 8
BULK_PIECE_ROWS = 8192  # rows a bulk load encodes and writes at once
# Bytes a bulk load leaves in the page cache per file (see SegmentFile.append). 64 MiB spent 1.6 s of system time
# in a 1 GB restore on the project's virtual machine, 32 MiB 0.6-0.8 s (fresh page cache pages cost a fault in the
# host; smaller windows reuse the pages just dropped); 16, 8 and 4 MiB were no faster, with more fdatasync calls.
BULK_WRITE_BEHIND = 32 << 20
ACTIVE_GARBAGE_BYTES = 1 << 20  # garbage of the segment being appended to worth compacting (see DiskStore)
PARTITIONS = 256
MAX_BUCKETS = 1 << 25  # per partition: 256 * 2**25 * 0.8 = 6.8e9 keys at most, 64 GiB of address space
FINGERPRINT_BITS = 28
LOCATION_BITS = 64 - FINGERPRINT_BITS
MAX_LOCATIONS = (1 << LOCATION_BITS) - 2  # a bucket holds location + 1; all ones is the tombstone
_LOCATION_MASK = np.uint64((1 << LOCATION_BITS) - 1)
_SHIFT = np.uint64(LOCATION_BITS)


def _keys_text(keys: torch.Tensor) -> str:
    shown = keys[:MAX_KEYS_IN_MESSAGE].tolist()
    more = f" and {keys.numel() - len(shown)} more" if keys.numel() > len(shown) else ""
    return f"{shown}{more}"


class DiskStore:
    """Rows of one table on disk: ``put``/``get``/``pop``/``remove`` by batches of raw int64 keys.

    Args:
        directory (str): where to create this store's own subdirectory (created if missing).
        width (int): elements per row (embedding dim + optimizer-state width).
        dtype (torch.dtype): element type of the rows.
        name (str): the table's name, used in file names and messages.
        segment_bytes (int): target size of one segment file (at least one record).
        compact_fraction (float): in ``(0, 1]``; a segment is compacted once this fraction of its records is
            garbage (the one being appended to: and at least 1 MiB of them). Lower means less disk space and more
            rewriting.
        initial_capacity (int): unused (the index grows a partition at a time, at no transient cost).

    Raises:
        ConfigError: bad ``width``, ``segment_bytes`` or ``compact_fraction``.
        StorageError: the directory cannot be created or written.

    Example::

        store = DiskStore("/mnt/ssd/cache", width=128, name="user_id")
        store.put(torch.tensor([3, 5]), torch.randn(2, 128))
        rows, found = store.get(torch.tensor([5, 9]))  # found: tensor([True, False]); rows[1] is zeros
        store.close()
    """

    def __init__(
        self,
        directory: str,
        width: int,
        dtype: torch.dtype = torch.float32,
        name: str = "table",
        segment_bytes: int = DEFAULT_SEGMENT_BYTES,
        compact_fraction: float = 0.5,
        initial_capacity: int = 1024,
    ) -> None:
        self.name = name
        self.width = width
        self.dtype = dtype
        self.where = f"disk store of table '{name}'"
        if width <= 0:
            raise ConfigError(f"{self.where}: width must be > 0, got {width}")
        if not 0.0 < compact_fraction <= 1.0:
            raise ConfigError(f"{self.where}: compact_fraction must be in (0, 1], got {compact_fraction}")
        self._format = RecordFormat(width, dtype)
        if segment_bytes < self._format.nbytes:
            raise ConfigError(
                f"{self.where}: segment_bytes={segment_bytes} is smaller than one record ({self._format.nbytes} "
                f"bytes); use at least that, typically tens of MiB"
            )
        self.segment_records = min(segment_bytes // self._format.nbytes, MAX_LOCATIONS)
        # The segment being appended to is compacted too (else a store smaller than one segment never reclaims
        # space): once compact_fraction of it is garbage and that garbage is at least this many records.
        self._active_garbage_floor = max(1, min(self.segment_records // 2, ACTIVE_GARBAGE_BYTES // self._format.nbytes))
        self.max_segments = MAX_LOCATIONS // self.segment_records
        self.compact_fraction = compact_fraction
        try:
            os.makedirs(directory, exist_ok=True)
            prefix = re.sub(r"[^A-Za-z0-9_.-]", "_", name) + "-"
            self.path = tempfile.mkdtemp(prefix=prefix, dir=directory)
        except OSError as error:
            raise StorageError(
                f"{self.where}: cannot create a directory under '{directory}': {error}; give the table a writable "
                f"disk directory"
            ) from error
        self._table = OpenTable(np.uint64, PARTITIONS, MAX_BUCKETS)
        self._segments: Dict[int, SegmentFile] = {}
        self._free_ids: List[int] = []  # numbers of deleted segments, reused lowest first
        self._active: Optional[SegmentFile] = None
        self._next_segment_id = 0
        self._to_compact: Set[int] = set()
        self._damaged: Set[int] = set()  # segments that failed a read: never compacted again
        self._compactions = 0
        self._io = {"records_read": 0, "records_written": 0}
        self._version = 0  # bumped by every change; chunks() refuses to continue across one
        self._closed = False

    def __len__(self) -> int:
        return len(self._table)

    def __enter__(self) -> "DiskStore":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def nbytes(self) -> int:
        """Bytes of the segment files on disk, garbage included."""
        return sum(seg.count for seg in self._segments.values()) * self._format.nbytes

    @property
    def memory_nbytes(self) -> int:
        """Bytes of host memory held by the index: its buckets in use (8 per bucket)."""
        return self._table.nbytes

    def stats(self) -> Dict[str, int]:
        """Counters for metrics: rows, file/live/garbage bytes, segments, compactions, index bytes, records read
        (random reads: lookups and their verification) and written (puts and compactions).

        Example::

            store.stats()["garbage_bytes"]
        """
        live_bytes = len(self) * self._format.nbytes
        return {
            "rows": len(self),
            "file_bytes": self.nbytes,
            "live_bytes": live_bytes,
            "garbage_bytes": self.nbytes - live_bytes,
            "segments": len(self._segments),
            "compactions": self._compactions,
            "index_bytes": self.memory_nbytes,
            **self._io,
        }

    def _check_open(self) -> None:
        if self._closed:
            raise StorageError(f"{self.where}: the store is closed; create a new DiskStore")

    def put(self, keys: torch.Tensor, rows: torch.Tensor) -> None:
        """:meth:`RowStore.put`: insert or overwrite rows, the last of a repeated key wins.

        Raises:
            ConfigError: malformed keys or rows.
            StorageError: the write failed (disk full, directory gone), or a compaction due before it did (the
                same, or a damaged record in the segment being compacted: that segment is then left as it is), or
                a record read to check an overwritten key is damaged; the store is unchanged and stays usable.
        """
        self._check_open()
        keys = check_keys(keys, self.where)
        rows = check_rows(rows, keys.numel(), self.width, self.dtype, self.where)
        if keys.numel() == 0:
            return
        last = last_occurrence(keys)
        if last is not None:
            keys, rows = keys[last], rows[last]
        self._compact_garbage()
        buckets, _ = self._locate(keys)
        locations = self._append(self._format.encode(keys, rows, sealed=False), f"{keys.numel()} rows")
        part, fingerprint, _ = self._hash(keys.numpy())
        entries = (fingerprint << _SHIFT) | (locations.astype(np.uint64) + np.uint64(1))
        present = buckets >= 0
        self._insert(part[~present], entries[~present])
        self._release(self._locations_at(buckets[present]))
        self._table.buckets[buckets[present]] = entries[present]
        self._count_live(locations, +1)
        self._version += 1

    def bulk_load(self, chunks: Iterator[Tuple[torch.Tensor, torch.Tensor]]) -> int:
        """Fill an empty store from ``(keys, rows)`` chunks of distinct keys: records are appended chunk by chunk,
        then each index partition is laid out once (no probing), which is much faster than one ``put`` per chunk.

        While loading, the keys and buckets of every row are held (16 bytes a row, besides the index itself); they
        are handed back to the system when it returns. Each chunk is encoded and written in pieces of
        :data:`BULK_PIECE_ROWS` rows, so the load holds one chunk and one piece at a time, and the files are written
        behind (:data:`BULK_WRITE_BEHIND`): a restore of a table larger than memory leaves no gigabytes of dirty
        page cache behind it.

        Returns:
            int: the rows loaded.

        Raises:
            ConfigError: the store is not empty, a chunk is malformed, or a key repeats (nothing is loaded).
            StorageError: a write failed (nothing is loaded).

        Example::

            store.bulk_load(iter([(torch.arange(4), torch.zeros(4, store.width))]))
        """
        self._check_open()
        if len(self) or self._segments:
            raise ConfigError(f"{self.where}: bulk_load fills an empty store; this one holds {len(self)} rows")
        parts: List[List[Tuple[np.ndarray, np.ndarray]]] = [[] for _ in range(PARTITIONS)]
        # One buffer for every piece: a fresh array a piece cost a quarter of a restore (measured), in page faults.
        piece = np.empty((BULK_PIECE_ROWS, self._format.words), dtype=np.uint64)
        try:
            for keys, rows in chunks:
                keys = check_keys(keys, self.where)
                rows = check_rows(rows, keys.numel(), self.width, self.dtype, self.where)
                locations = np.concatenate([  # encoded in pieces: the records of a chunk are never all held
                    self._append(self._format.encode(k, r, sealed=False, out=piece), f"{k.numel()} rows",
                                 BULK_WRITE_BEHIND)
                    for k, r in zip(keys.split(BULK_PIECE_ROWS), rows.split(BULK_PIECE_ROWS))
                ] or [np.empty(0, dtype=np.int64)])
                part, fingerprint, _ = self._hash(keys.numpy())
                entries = (fingerprint << _SHIFT) | (locations.astype(np.uint64) + np.uint64(1))
                order = np.argsort(part.astype(np.uint8), kind="stable")  # a radix sort: partitions fit a byte
                bounds = np.searchsorted(part[order], np.arange(PARTITIONS + 1))
                for p in np.flatnonzero(np.diff(bounds)).tolist():
                    chosen = order[bounds[p] : bounds[p + 1]]
                    parts[p].append((keys.numpy()[chosen], entries[chosen]))
                del keys, rows  # freed before the next chunk is made: a load holds one chunk at a time
            for p, pieces in enumerate(parts):
                if pieces:
                    keys_p = np.sort(np.concatenate([k for k, _ in pieces]))  # a sort finds repeats faster
                    if bool((keys_p[1:] == keys_p[:-1]).any()):  # than np.unique's hash set
                        raise ConfigError(f"{self.where}: bulk_load got a key more than once; keys must be distinct")
                    entries_p = np.concatenate([e for _, e in pieces])
                    parts[p] = []
                    self._insert(np.full(entries_p.size, p, dtype=np.int64), entries_p)
        except BaseException:
            self.clear()
            raise
        finally:
            del parts
            trim_heap()
        for seg in self._segments.values():
            seg.live = seg.count
        self._version += 1
        return len(self)

    def clear(self) -> None:
        """Forget every row and delete every segment file; the store stays open (a file that cannot be deleted
        is left behind, holding no row the store knows of)."""
        self._check_open()
        for seg in list(self._segments.values()):
            self._drop_segment(seg)
            try:
                seg.unlink()
            except OSError:
                pass
        self._free_ids.clear()
        self._next_segment_id = 0
        self._active = None
        self._to_compact.clear()
        self._damaged.clear()
        self._table = OpenTable(np.uint64, PARTITIONS, MAX_BUCKETS)
        trim_heap()
        self._version += 1

    def contains(self, keys: torch.Tensor) -> torch.Tensor:
        """Bool ``[n]``: which keys the store holds (their records are read to verify the key).

        Raises:
            StorageError: a record checked is damaged.
        """
        self._check_open()
        return torch.from_numpy(self._locate(check_keys(keys, self.where))[0] >= 0)

    def get(self, keys: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """:meth:`RowStore.get`: copies of the rows (zeros where absent) and bool ``found``; repeats allowed.

        Raises:
            ConfigError: malformed keys.
            StorageError: a record is corrupted, moved or its file truncated (the message names file and keys).
        """
        self._check_open()
        keys = check_keys(keys, self.where)
        return self._rows_of(keys, self._locate(keys))

    def pop(self, keys: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """:meth:`get` then :meth:`remove` of the keys found; on a read error nothing is removed."""
        self._check_open()
        keys = check_keys(keys, self.where)
        located = self._locate(keys)
        rows, found = self._rows_of(keys, located)
        self._forget(located[0])
        return rows, found

    def remove(self, keys: torch.Tensor) -> None:
        """Forget keys (their records become garbage); absent keys and repeats are ignored.

        Raises:
            StorageError: a record read to verify a key is damaged; nothing is removed.
        """
        self._check_open()
        self._forget(self._locate(check_keys(keys, self.where))[0])

    def chunks(self, rows_per_chunk: int = 65536) -> Iterator[Tuple[torch.Tensor, torch.Tensor]]:
        """Every ``(keys int64 [m], rows [m, width])`` once, ``m <= rows_per_chunk``, in file order.

        Reads each segment sequentially once (checkpoints run at the disk's sequential speed), ``rows_per_chunk``
        records at a time.

        Raises:
            RuntimeError: the store changed between two chunks.
            StorageError: a live record is corrupted or its file truncated.
        """
        for records in self._every_live_record(rows_per_chunk):
            yield torch.from_numpy(records[:, 0].view(np.int64).copy()), self._format.decode(records)

    def keys(self, rows_per_chunk: int = 65536) -> Iterator[torch.Tensor]:
        """The keys of :meth:`chunks`, in its order and blocks, without decoding their rows.

        Raises:
            RuntimeError: the store changed between two blocks.
            StorageError: a live record is corrupted or its file truncated.
        """
        for records in self._every_live_record(rows_per_chunk):
            yield torch.from_numpy(records[:, 0].view(np.int64).copy())

    def _every_live_record(self, rows_per_chunk: int) -> Iterator[np.ndarray]:
        """Every live record once, in file order, at most ``rows_per_chunk`` at a time (none empty)."""
        self._check_open()
        version = self._version
        for segment_id in sorted(self._segments):
            for records, _, _ in self._live_blocks(self._segments[segment_id], rows_per_chunk):
                if version != self._version:  # builtin, like dict's: a caller mutating the store it iterates
                    raise RuntimeError(
                        f"{self.where}: the store changed while chunks() was iterating; do not mutate it"
                    )
                if len(records):
                    yield records

    def close(self) -> None:
        """Close the files and delete this store's directory (idempotent).

        Raises:
            StorageError: the directory cannot be deleted (the store is closed all the same).
        """
        if self._closed:
            return
        self._closed = True
        for seg in self._segments.values():
            seg.close()
        self._segments.clear()
        try:
            shutil.rmtree(self.path)
        except OSError as error:
            raise StorageError(f"{self.where}: cannot delete '{self.path}': {error}; delete it by hand") from error

    # -- internals ------------------------------------------------------------------------------------------------

    @staticmethod
    def _hash(keys: np.ndarray) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Partition (int64), fingerprint (uint64, 28 bits) and hash of int64 ``keys``."""
        h = mix64(keys.view(np.uint64))
        return (h & np.uint64(PARTITIONS - 1)).astype(np.int64), h >> _SHIFT, h

    def _insert(self, part: np.ndarray, entries: np.ndarray) -> None:
        """Index ``entries`` (uint64) of absent keys in partitions ``part``; nothing changes if one would not fit."""
        if part.size:
            full = ops.fingerprint_insert(
                *self._table.state, torch.from_numpy(part), torch.from_numpy(entries.view(np.int64)),
                FINGERPRINT_BITS, MAX_LOAD, DISK_LOW_LOAD,
            )
            if full >= 0:
                raise self._table.full_error(full, self.where)

    def _probe(
        self, part: np.ndarray, fingerprint: np.ndarray, accept: Callable[[np.ndarray, np.ndarray], np.ndarray]
    ) -> np.ndarray:
        """Each key's bucket, -1 where absent: the first bucket along its probe whose fingerprint matches and that
        ``accept(which, buckets) -> bool`` takes for keys ``which``; a rejected one (another key's entry with the
        same fingerprint) sends that key's probe on past it. One native probe per round; collisions are rare, so
        a batch usually settles in one round."""
        found = np.full(part.size, -1, dtype=np.int64)
        which = np.arange(part.size)
        after = found.copy()
        buckets, sizes = self._table.state[:2]
        while which.size:
            candidates = ops.fingerprint_find(
                buckets, sizes, torch.from_numpy(part[which]), torch.from_numpy(fingerprint[which].view(np.int64)),
                torch.from_numpy(after), FINGERPRINT_BITS,
            ).numpy()
            some = candidates >= 0
            which, candidates = which[some], candidates[some]
            mine = accept(which, candidates) if which.size else np.zeros(0, dtype=bool)
            found[which[mine]] = candidates[mine]
            which, after = which[~mine], candidates[~mine]
        return found

    def _locations_at(self, buckets: np.ndarray) -> np.ndarray:
        return (self._table.buckets[buckets] & _LOCATION_MASK).astype(np.int64) - 1

    def _locate(self, keys: torch.Tensor) -> Tuple[np.ndarray, np.ndarray]:
        """Each key's bucket (-1: absent) and verified record (zeros where absent).

        A bucket whose fingerprint matches is a candidate: its record is read and checked (checksum at its
        location, then key). A valid record of another key is a fingerprint collision (that key must hash to the
        same partition and fingerprint, or the record is out of place) and the probe goes on.
        """
        values = keys.numpy()
        records = np.zeros((values.size, self._format.words), dtype=np.uint64)
        if values.size == 0 or len(self) == 0:
            return np.full(values.size, -1, dtype=np.int64), records
        part, fingerprint, _ = self._hash(values)

        def verify(who: np.ndarray, buckets: np.ndarray) -> np.ndarray:
            locations = self._locations_at(buckets)
            got = self._read(locations, keys[torch.from_numpy(who)])
            mine = got[:, 0] == values[who].view(np.uint64)
            others = np.flatnonzero(~mine)
            if others.size:
                other_part, other_fingerprint, _ = self._hash(got[others, 0].view(np.int64))
                misplaced = (other_part != part[who[others]]) | (other_fingerprint != fingerprint[who[others]])
                if misplaced.any():
                    bad = others[misplaced]
                    self._raise_damaged(locations[bad], keys[torch.from_numpy(who[bad])])
            records[who[mine]] = got[mine]
            return mine

        return self._probe(part, fingerprint, verify), records

    def _rows_of(self, keys: torch.Tensor, located: Tuple[np.ndarray, np.ndarray]) -> Tuple[torch.Tensor, torch.Tensor]:
        buckets, records = located
        found = torch.from_numpy(buckets >= 0)
        rows = torch.zeros(keys.numel(), self.width, dtype=self.dtype)
        if bool(found.any()):
            rows[found] = self._format.decode(records[buckets >= 0])
        return rows, found

    def _forget(self, buckets: np.ndarray) -> None:
        buckets = np.unique(buckets[buckets >= 0])
        self._release(self._locations_at(buckets))
        self._table.remove(buckets)
        self._version += 1

    def _count_live(self, locations: np.ndarray, sign: int) -> np.ndarray:
        """Add ``sign`` to the live count of the segment of each location; return the segment ids touched."""
        ids, counts = np.unique(locations // self.segment_records, return_counts=True)
        for segment_id, count in zip(ids.tolist(), counts.tolist()):
            self._segments[segment_id].live += sign * count
        return ids

    def _release(self, locations: np.ndarray) -> None:
        """The records at ``locations`` become garbage; mark segments that are due for compaction."""
        if locations.size == 0:
            return
        for segment_id in self._count_live(locations, -1).tolist():
            seg = self._segments[segment_id]
            if seg.count - seg.live >= self.compact_fraction * seg.count:
                self._to_compact.add(segment_id)

    def _new_segment(self) -> SegmentFile:
        if self._free_ids:
            segment_id = heapq.heappop(self._free_ids)
        elif self._next_segment_id < self.max_segments:
            segment_id, self._next_segment_id = self._next_segment_id, self._next_segment_id + 1
        else:  # an OSError like a full disk's: the write path turns it into a StorageError naming the file
            raise OSError(0, f"the store already has {self.max_segments} segments, the most its index can address")
        try:
            seg = SegmentFile(self.path, self._format.words, segment_id)
        except OSError:
            heapq.heappush(self._free_ids, segment_id)
            raise
        self._segments[segment_id] = seg
        return seg

    def _drop_segment(self, seg: SegmentFile) -> None:
        del self._segments[seg.segment_id]
        heapq.heappush(self._free_ids, seg.segment_id)

    def _append(self, records: np.ndarray, what: str, write_behind: Optional[int] = None) -> np.ndarray:
        """Seal and append records, opening segments as needed; return each record's location (int64).
        ``write_behind``: see :meth:`SegmentFile.append`.

        All or nothing: on failure every touched file is cut back, new files are deleted, and StorageError says
        which file failed and why.
        """
        touched = []  # (segment, count before, created here)
        previous_active = self._active
        locations = np.empty(records.shape[0], dtype=np.int64)
        seg = self._active
        position = 0
        try:
            while position < records.shape[0]:
                if seg is None or seg.count == self.segment_records:
                    seg = None
                    seg = self._new_segment()
                    touched.append((seg, 0, True))
                elif not touched or touched[-1][0] is not seg:
                    touched.append((seg, seg.count, False))
                take = min(records.shape[0] - position, self.segment_records - seg.count)
                piece = slice(position, position + take)
                locations[piece] = seg.segment_id * self.segment_records + np.arange(seg.count, seg.count + take)
                seg.append(self._format.seal(records[piece], locations[piece]), write_behind)
                position += take
                self._active = seg
        except OSError as error:
            failed = getattr(error, "filename", None) or (seg.path if seg is not None else self.path)
            for touched_seg, count, created in reversed(touched):
                touched_seg.truncate(count)
                if created:
                    self._drop_segment(touched_seg)
                    try:
                        touched_seg.unlink()
                    except OSError:
                        pass  # an empty, unreferenced file; the directory is deleted on close()
            self._active = previous_active
            raise StorageError(
                f"{self.where}: writing {what} to '{failed}' failed: {error.strerror or error} (errno "
                f"{error.errno}); nothing was stored and every earlier row is intact. Free space on that disk or "
                f"give the table a writable disk directory with room for it"
            ) from error
        self._io["records_written"] += records.shape[0]
        return locations

    def _read(self, locations: np.ndarray, keys: torch.Tensor) -> np.ndarray:
        """Records at ``locations`` (for ``keys``, named in messages), checked against their checksums: one
        batched read over every segment touched (:func:`.segment_file.read_records`)."""
        if locations.size == 0:
            return np.empty((0, self._format.words), dtype=np.uint64)
        segment_ids = locations // self.segment_records
        offsets = locations - segment_ids * self.segment_records
        ids, which = np.unique(segment_ids, return_inverse=True)
        known = np.array([segment_id in self._segments for segment_id in ids.tolist()])
        if not known.all():
            mine = np.flatnonzero(~known[which])
            self._raise_damaged(locations[mine], keys[torch.from_numpy(mine)])
        segments = [self._segments[segment_id] for segment_id in ids.tolist()]
        readable = np.array([seg.readable() for seg in segments], dtype=np.int64)
        beyond = np.flatnonzero(offsets >= readable[which])
        if beyond.size:
            seg = segments[int(which[beyond[0]])]
            beyond = beyond[which[beyond] == which[beyond[0]]]
            self._damaged.add(seg.segment_id)
            raise StorageError(
                f"{self.where}: file '{seg.path}' is truncated ({seg.size_on_disk()} bytes, "
                f"{seg.count * self._format.nbytes} written): the rows of keys "
                f"{_keys_text(keys[torch.from_numpy(beyond)])} are lost; the other rows are intact. "
                f"Restore the table from a checkpoint"
            )
        try:
            records = read_records(segments, which, offsets)
        except StorageError as error:  # the file was cut or failed after the check above
            raise StorageError(f"{self.where}: {error}; restore the table from a checkpoint") from error
        self._io["records_read"] += locations.size
        bad = np.flatnonzero(records[:, 1] != self._format.checksums(records, locations))
        if bad.size:
            self._raise_damaged(locations[bad], keys[torch.from_numpy(bad)])
        return records

    def _raise_damaged(self, locations: np.ndarray, keys: torch.Tensor) -> NoReturn:
        ids = np.unique(locations // self.segment_records).tolist()
        self._damaged.update(ids)
        files = [self._segments[i].path if i in self._segments else f"segment {i}" for i in ids]
        raise StorageError(
            f"{self.where}: corrupted records in {', '.join(repr(f) for f in files)}: the rows of keys "
            f"{_keys_text(keys)} fail their checksum or hold another key; they are lost, the other rows are intact. "
            f"Restore the table from a checkpoint"
        )

    def _live_records(self, seg: SegmentFile) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The live records of ``seg`` (read sequentially), their locations and their buckets (see
        :meth:`_live_blocks`)."""
        blocks = list(self._live_blocks(seg, max(1, seg.count)))
        if not blocks:  # an empty segment
            return seg.read_range(0, 0), np.empty(0, np.int64), np.empty(0, np.int64)
        return blocks[0]

    def _holds(self, expected: np.ndarray, which: np.ndarray, at: np.ndarray) -> np.ndarray:
        """Which buckets ``at`` hold the ``expected[which]`` entries (a probe's match test)."""
        return self._table.buckets[at] == expected[which]

    def _live_blocks(self, seg: SegmentFile, block: int) -> Iterator[Tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """The live records of ``seg``, read sequentially ``block`` records at a time: per block, the records, their
        locations and their buckets.

        A record is live when the bucket of its key holds exactly its location. Damaged records can only be
        garbage: if fewer live records are found than the segment counts, a live one is damaged (raised after the
        last block).

        Raises:
            StorageError: the file is truncated or a live record is damaged.
        """
        found = 0
        for start in range(0, seg.count, block):
            stop = min(seg.count, start + block)
            try:
                records = seg.read_range(start, stop)
            except StorageError as error:
                self._damaged.add(seg.segment_id)
                raise StorageError(
                    f"{self.where}: {error}; its live rows are lost. Restore the table from a checkpoint"
                ) from error
            locations = seg.segment_id * self.segment_records + np.arange(start, stop, dtype=np.int64)
            valid = np.flatnonzero(records[:, 1] == self._format.checksums(records, locations))
            part, fingerprint, _ = self._hash(records[valid, 0].view(np.int64))
            expected = (fingerprint << _SHIFT) | (locations[valid].astype(np.uint64) + np.uint64(1))
            buckets = self._probe(part, fingerprint, functools.partial(self._holds, expected))
            live = buckets >= 0
            found_here = int(live.sum())
            found += found_here
            if found_here == stop - start:  # every record live (the common case): no copy of the block
                yield records, locations, buckets
            else:
                chosen = valid[live]
                yield records[chosen], locations[chosen], buckets[live]
        if found != seg.live:
            self._damaged.add(seg.segment_id)
            raise StorageError(
                f"{self.where}: corrupted records in '{seg.path}': {seg.live - found} of its {seg.live} "
                f"live rows fail their checksum; they are lost, the other rows are intact. Restore the table from a "
                f"checkpoint"
            )

    def _compact_garbage(self) -> None:
        """Compact the sealed segments marked as due; raises StorageError with the store unchanged on failure."""
        for segment_id in sorted(self._to_compact):
            seg = self._segments[segment_id]
            if seg is self._active:
                garbage = seg.count - seg.live
                if garbage < self.compact_fraction * seg.count or garbage < self._active_garbage_floor:
                    continue  # stays marked: appends to it are cheap until its garbage is worth a rewrite
                self._active = None  # sealed: the next append opens another segment
            self._to_compact.discard(segment_id)
            if segment_id in self._damaged:
                continue  # reading it again would fail again; its live rows stay where they are
            if seg.live:
                try:
                    records, _, buckets = self._live_records(seg)
                    locations = self._append(records, f"{seg.live} live rows of '{seg.path}'")
                except StorageError:
                    if segment_id not in self._damaged:
                        self._to_compact.add(segment_id)  # a full disk may clear up: retry on a later put
                    raise
                fingerprints = self._table.buckets[buckets] >> _SHIFT
                self._table.buckets[buckets] = (fingerprints << _SHIFT) | (locations.astype(np.uint64) + np.uint64(1))
                seg.live = 0
                self._count_live(locations, +1)
            self._drop_segment(seg)
            self._compactions += 1
            try:
                seg.unlink()
            except OSError as error:
                raise StorageError(
                    f"{self.where}: compacted '{seg.path}' but cannot delete it: {error}; its rows live elsewhere "
                    f"now, delete the file by hand"
                ) from error
