"""DiskStore: the KEY_VALUE kernel's bottom tier, rows in append-only, memory-mapped segment files.

Design. Each ``put`` encodes its rows as fixed-size records (key, checksum, exact row bytes; see
:mod:`.disk_record`) and appends them with one positional write per segment file touched; an in-memory index maps
key -> (segment, offset). Overwritten and removed records become garbage; a sealed segment whose garbage reaches
``compact_fraction`` of its records is compacted (its live records are re-appended, then the file is deleted)
before the next write. Reads gather records by offset from memory maps with numpy fancy indexing and verify every
record's checksum and key, so a corrupted or truncated file raises :class:`StorageError` naming the file and keys.
A write is made before the index changes: a failed ``put`` (disk full, directory gone) changes nothing.

Why memory-mapped files and not an embedded store (LMDB, RocksDB, SQLite): every row has the same size and every
access is a batch of thousands of keys, so an offset index plus one vectorized gather per batch is all the lookup
needed, without per-key calls through a database API or a log-structured merge's read and write amplification.
Such stores would also add a native dependency that must build for every target (Ascend hosts included) and
durability machinery (write-ahead logs, fsync, transactions) that a cache tier does not need: checkpoints are
written separately, through :meth:`DiskStore.chunks`. Files and mmap give the page cache for free.

Not durable by design: the index lives in memory and segment files are not fsync'ed; a store starts empty in a
fresh subdirectory of ``directory`` and deletes it on :meth:`DiskStore.close`. Not thread-safe.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from typing import Dict, Iterator, Optional, Set, Tuple

import numpy as np
import torch

from torchrec_ascend.errors import ConfigError, StorageError

from .disk_record import RecordFormat
from .key_index import KeyIndex
from .row_store import check_keys, check_rows, last_occurrence, tensor_nbytes
from .segment_file import SegmentFile

DEFAULT_SEGMENT_BYTES = 64 << 20
MAX_KEYS_IN_MESSAGE = 8


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
        compact_fraction (float): in ``(0, 1]``; a sealed segment is compacted once this fraction of its
            records is garbage. Lower means less disk space and more rewriting.
        initial_capacity (int): index slots before the first growth.

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
        self.segment_records = segment_bytes // self._format.nbytes
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
        self._index = KeyIndex(initial_capacity)
        self._segment_of = torch.full((self._index.capacity,), -1, dtype=torch.int32)
        self._offset_of = torch.zeros(self._index.capacity, dtype=torch.int64)
        self._segments: Dict[int, SegmentFile] = {}
        self._active: Optional[SegmentFile] = None
        self._next_segment_id = 0
        self._to_compact: Set[int] = set()
        self._damaged: Set[int] = set()  # segments that failed a read: never compacted again
        self._compactions = 0
        self._version = 0  # bumped by every change; chunks() refuses to continue across one
        self._closed = False

    def __len__(self) -> int:
        return len(self._index)

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
        """Bytes of host memory held by the index (key -> segment, offset)."""
        return self._index.nbytes + tensor_nbytes(self._segment_of, self._offset_of)

    def stats(self) -> Dict[str, int]:
        """Counters for metrics: rows, file/live/garbage bytes, segments, compactions, index bytes.

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
        }

    def _check_open(self) -> None:
        if self._closed:
            raise StorageError(f"{self.where}: the store is closed; create a new DiskStore")

    def put(self, keys: torch.Tensor, rows: torch.Tensor) -> None:
        """Insert or overwrite rows; for a repeated key the last row wins.

        Args:
            keys: int64 ``[n]`` raw IDs.
            rows: ``[n, width]`` of the store's dtype.

        Raises:
            ConfigError: malformed keys or rows.
            StorageError: the write failed (disk full, directory gone), or a compaction due before it did (the
                same, or a damaged record in the segment being compacted: that segment is then left as it is); the
                store is unchanged and stays usable.
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
        segments, offsets = self._append(self._format.encode(keys, rows), f"{keys.numel()} rows")
        slots = self._index.lookup(keys)
        present = slots >= 0
        self._release(slots[present])
        if not bool(present.all()):
            slots[~present] = self._index.insert(keys[~present])
            self._grow_columns()
        self._point(slots, segments, offsets)
        self._version += 1

    def contains(self, keys: torch.Tensor) -> torch.Tensor:
        """Bool ``[n]``: which keys the store holds (nothing is read)."""
        return self._index.lookup(check_keys(keys, self.where)) >= 0

    def get(self, keys: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """Read rows.

        Args:
            keys: int64 ``[n]``; repeats allowed.

        Returns:
            Tuple[torch.Tensor, torch.Tensor]: rows ``[n, width]`` (zeros where absent) and bool ``found [n]``.

        Raises:
            ConfigError: malformed keys.
            StorageError: a record is corrupted or its file truncated (the message names file and keys).
        """
        self._check_open()
        keys = check_keys(keys, self.where)
        slots = self._index.lookup(keys)
        found = slots >= 0
        rows = torch.zeros(keys.numel(), self.width, dtype=self.dtype)
        where = found.nonzero().squeeze(1)
        if where.numel():
            rows[where] = self._format.decode(self._read(keys[where], slots[where]))
        return rows, found

    def pop(self, keys: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """:meth:`get` then :meth:`remove` of the keys found; on a read error nothing is removed."""
        rows, found = self.get(keys)
        self.remove(keys[found])
        return rows, found

    def remove(self, keys: torch.Tensor) -> None:
        """Forget keys (their records become garbage); absent keys and repeats are ignored."""
        self._check_open()
        keys = check_keys(keys, self.where)
        self._release(self._index.remove(keys))
        self._version += 1

    def chunks(self, rows_per_chunk: int = 65536) -> Iterator[Tuple[torch.Tensor, torch.Tensor]]:
        """Every ``(keys int64 [m], rows [m, width])`` once, ``m <= rows_per_chunk``, in file order.

        Raises:
            RuntimeError: the store changed between two chunks.
            StorageError: a record is corrupted or its file truncated.
        """
        self._check_open()
        keys, slots = self._index.export()
        order = torch.argsort(self._segment_of[slots].long() * self.segment_records + self._offset_of[slots])
        keys, slots = keys[order], slots[order]
        version = self._version
        for start in range(0, keys.numel(), rows_per_chunk):
            if version != self._version:
                raise RuntimeError(f"{self.where}: the store changed while chunks() was iterating; do not mutate it")
            chunk_keys = keys[start : start + rows_per_chunk]
            yield chunk_keys, self._format.decode(self._read(chunk_keys, slots[start : start + rows_per_chunk]))

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

    def _grow_columns(self) -> None:
        grow = self._index.capacity - self._segment_of.numel()
        if grow > 0:
            self._segment_of = torch.cat([self._segment_of, torch.full((grow,), -1, dtype=torch.int32)])
            self._offset_of = torch.cat([self._offset_of, torch.zeros(grow, dtype=torch.int64)])

    def _point(self, slots: torch.Tensor, segments: torch.Tensor, offsets: torch.Tensor) -> None:
        """Record that ``slots`` now live at ``(segments, offsets)``."""
        self._segment_of[slots] = segments
        self._offset_of[slots] = offsets
        ids, counts = torch.unique(segments, return_counts=True)
        for segment_id, count in zip(ids.tolist(), counts.tolist()):
            self._segments[segment_id].live += count

    def _release(self, slots: torch.Tensor) -> None:
        """The records of ``slots`` become garbage; mark segments that are due for compaction."""
        if slots.numel() == 0:
            return
        ids, counts = torch.unique(self._segment_of[slots], return_counts=True)
        for segment_id, count in zip(ids.tolist(), counts.tolist()):
            seg = self._segments[segment_id]
            seg.live -= count
            if seg.count - seg.live >= self.compact_fraction * seg.count:
                self._to_compact.add(segment_id)
        self._segment_of[slots] = -1

    def _append(self, records: np.ndarray, what: str) -> Tuple[torch.Tensor, torch.Tensor]:
        """Append records, opening segments as needed; return their (segment id int32, offset int64) per record.

        All or nothing: on failure every touched file is cut back, new files are deleted, and StorageError says
        which file failed and why.
        """
        touched = []  # (segment, count before, created here)
        previous_active = self._active
        segment_ids, offsets = [], []
        seg = self._active
        position = 0
        try:
            while position < records.shape[0]:
                if seg is None or seg.count == self.segment_records:
                    path = os.path.join(self.path, f"segment-{self._next_segment_id:06d}.rows")
                    seg = SegmentFile(path, self._format.words, self._next_segment_id)
                    touched.append((seg, 0, True))
                    self._segments[seg.segment_id] = seg
                    self._next_segment_id += 1
                elif not touched or touched[-1][0] is not seg:
                    touched.append((seg, seg.count, False))
                take = min(records.shape[0] - position, self.segment_records - seg.count)
                first = seg.append(records[position : position + take])
                segment_ids.append(torch.full((take,), seg.segment_id, dtype=torch.int32))
                offsets.append(torch.arange(first, first + take, dtype=torch.int64))
                position += take
                self._active = seg
        except OSError as error:
            failed = getattr(error, "filename", None) or (seg.path if seg is not None else self.path)
            for touched_seg, count, created in reversed(touched):
                touched_seg.truncate(count)
                if created:
                    del self._segments[touched_seg.segment_id]
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
        return torch.cat(segment_ids), torch.cat(offsets)

    def _read(self, keys: torch.Tensor, slots: torch.Tensor) -> np.ndarray:
        """Verified records (uint64 ``[n, words]``) of present ``keys`` at their ``slots``."""
        segments = self._segment_of[slots]
        offsets = self._offset_of[slots]
        segment_ids = torch.unique(segments).tolist()
        if len(segment_ids) == 1:
            records = self._read_segment(segment_ids[0], keys, offsets)
        else:
            records = np.empty((keys.numel(), self._format.words), dtype=np.uint64)
            for segment_id in segment_ids:
                where = (segments == segment_id).nonzero().squeeze(1)
                records[where.numpy()] = self._read_segment(segment_id, keys[where], offsets[where])
        damaged = torch.from_numpy(self._format.damaged(records, keys))
        if bool(damaged.any()):
            bad_segments = segments[damaged]
            files = [self._segments[i].path for i in torch.unique(bad_segments).tolist()]
            self._damaged.update(torch.unique(bad_segments).tolist())
            raise StorageError(
                f"{self.where}: corrupted records in {', '.join(repr(f) for f in files)}: the rows of keys "
                f"{_keys_text(keys[damaged])} fail their checksum or hold another key; they are lost, the other rows "
                f"are intact. Restore the table from a checkpoint"
            )
        return records

    def _read_segment(self, segment_id: int, keys: torch.Tensor, offsets: torch.Tensor) -> np.ndarray:
        """Unverified records of ``keys`` at ``offsets`` of one segment, after checking the file is long enough."""
        seg = self._segments[segment_id]
        size = seg.size_on_disk()
        beyond = (offsets + 1) * self._format.nbytes > size
        if bool(beyond.any()):
            self._damaged.add(segment_id)
            raise StorageError(
                f"{self.where}: file '{seg.path}' is truncated ({size} bytes, {seg.count * self._format.nbytes} "
                f"written): the rows of keys {_keys_text(keys[beyond])} are lost; the other rows are intact. "
                f"Restore the table from a checkpoint"
            )
        return seg.read(offsets.numpy())

    def _compact_garbage(self) -> None:
        """Compact the sealed segments marked as due; raises StorageError with the store unchanged on failure."""
        for segment_id in sorted(self._to_compact):
            seg = self._segments[segment_id]
            if seg is self._active:
                continue
            self._to_compact.discard(segment_id)
            if segment_id in self._damaged:
                continue  # reading it again would fail again; its live rows stay where they are
            slots = (self._segment_of == segment_id).nonzero().squeeze(1)
            if slots.numel():
                keys = self._index.keys_of(slots)
                try:
                    records = self._read(keys, slots)
                    segments, offsets = self._append(records, f"{slots.numel()} live rows of '{seg.path}'")
                except StorageError:
                    if segment_id not in self._damaged:
                        self._to_compact.add(segment_id)  # a full disk may clear up: retry on a later put
                    raise
                seg.live -= slots.numel()
                self._point(slots, segments, offsets)
            del self._segments[segment_id]
            self._compactions += 1
            try:
                seg.unlink()
            except OSError as error:
                raise StorageError(
                    f"{self.where}: compacted '{seg.path}' but cannot delete it: {error}; its rows live elsewhere "
                    f"now, delete the file by hand"
                ) from error
