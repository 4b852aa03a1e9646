"""SegmentFile: one append-only file of fixed-size records of the disk store, read through a memory map.

Writes are positional (``os.pwrite`` at ``count * record_bytes``), so the in-memory ``count`` is the truth: a
failed write is rolled back by resetting ``count``, and stray bytes past it are overwritten by the next write.
Reads gather records by offset from a read-only ``mmap`` of the open descriptor, so the file stays readable even
if its directory entry goes away, and one numpy fancy-index reads a whole batch (``MADV_RANDOM``: a page fault reads
its page, not the kernel's default read-around of 32 pages, which would multiply random reads by 32); afterwards
the mapped pages are dropped from the process (``MADV_DONTNEED``: they stay in the page cache), so reading a file
many times the size of memory never shows as this process's memory.

Untrusted input: the file's name is made here from its number (a plain name inside the store's own folder, opened
without following symlinks, never an existing file), and every read checks its offsets against the records written
and the file's size on disk before touching the map; failures are :class:`StorageError` naming the file.
"""

from __future__ import annotations

import errno
import mmap
import os
from typing import Optional

import numpy as np

from torchrec_ascend.errors import StorageError


def pwrite_all(fd: int, data: memoryview, offset: int) -> None:
    """Write all of ``data`` at ``offset`` of ``fd``, looping over short writes.

    Raises:
        OSError: from the operating system (``ENOSPC`` when the disk is full, ``EIO`` ...).

    Example::

        pwrite_all(fd, memoryview(b"abc"), 0)
    """
    done = 0
    while done < len(data):
        written = os.pwrite(fd, data[done:], offset + done)
        if written <= 0:  # no progress: treat like a full disk (the disk store reports a StorageError naming the file)
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        done += written


def segment_name(segment_id: int) -> str:
    """The file name of segment ``segment_id`` (a plain name, no directory part).

    Example::

        segment_name(3)  # 'segment-000003.rows'
    """
    if not isinstance(segment_id, int) or segment_id < 0:  # builtin: an internal invariant (the store numbers them)
        raise ValueError(f"segment ids are ints >= 0, got {segment_id!r}")
    return f"segment-{segment_id:06d}.rows"


class SegmentFile:
    """An open segment: ``count`` records of ``words`` uint64 each, of which ``live`` are still referenced.

    Args:
        directory (str): the store's folder; the file is ``directory/segment-<id>.rows`` and must not exist.
        words (int): 64-bit words per record.
        segment_id (int): the store's number for this file.

    Raises:
        OSError: the file cannot be created (directory missing, not a directory, read-only, name taken ...).

    Example::

        seg = SegmentFile("/tmp/t", words=4, segment_id=0)
        seg.append(np.zeros((2, 4), dtype=np.uint64))  # returns 0, the first offset
        seg.read(np.array([1]))  # array of shape [1, 4]
    """

    def __init__(self, directory: str, words: int, segment_id: int) -> None:
        self.path = os.path.join(directory, segment_name(segment_id))
        self.words = words
        self.record_bytes = 8 * words
        self.segment_id = segment_id
        self.count = 0
        self.live = 0
        flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
        self._fd: Optional[int] = os.open(self.path, flags, 0o644)
        self._map: Optional[mmap.mmap] = None
        self._view: Optional[np.ndarray] = None  # uint64 [mapped records, words] over a read-only mmap

    def _open_fd(self) -> int:
        if self._fd is None:
            raise StorageError(f"segment file '{self.path}' is closed")
        return self._fd

    def append(self, records: np.ndarray) -> int:
        """Write ``records`` (uint64 ``[n, words]``, contiguous) after the last one; return the first offset.

        ``count`` only advances once every byte is written.

        Raises:
            OSError: the write failed; ``count`` is unchanged (call :meth:`truncate` to drop partial bytes).
        """
        first = self.count
        data = memoryview(np.ascontiguousarray(records)).cast("B")  # type: ignore[arg-type]  # numpy types ndarray as a buffer only for Python >= 3.12
        pwrite_all(self._open_fd(), data, first * self.record_bytes)
        self.count += records.shape[0]
        return first

    def truncate(self, count: int) -> None:
        """Forget records from ``count`` on and shrink the file to match (best effort: ``count`` rules)."""
        self.count = count
        self._unmap()
        try:
            os.ftruncate(self._open_fd(), count * self.record_bytes)
        except OSError:
            pass  # bytes past `count` are never read and get overwritten by the next append

    def size_on_disk(self) -> int:
        """The file's current size in bytes, from ``fstat`` (shows truncation by anyone)."""
        return os.fstat(self._open_fd()).st_size

    def readable(self) -> int:
        """How many records can be read: those written that the file on disk still holds in full."""
        return min(self.count, self.size_on_disk() // self.record_bytes)

    def read(self, offsets: np.ndarray) -> np.ndarray:
        """Copies of the records at ``offsets`` (int64 ``[n]``).

        The caller checks offsets against :meth:`readable` first to say which keys are lost; this check repeats it,
        because touching a mapped page past the end of a truncated file raises SIGBUS, which no Python code can
        catch.

        Raises:
            StorageError: an offset is negative, not written, or past the end of the file.
        """
        if offsets.size == 0:
            return np.empty((0, self.words), dtype=np.uint64)
        low, high = int(offsets.min()), int(offsets.max())
        readable = self.readable()
        if low < 0 or high >= readable:
            raise StorageError(
                f"segment file '{self.path}': record {low if low < 0 else high} asked for, but only {readable} of "
                f"{self.count} written records are in the file ({self.size_on_disk()} bytes)"
            )
        if self._view is None or high >= self._view.shape[0]:
            self._unmap()
            self._map = mmap.mmap(self._open_fd(), readable * self.record_bytes, access=mmap.ACCESS_READ)
            self._map.madvise(mmap.MADV_RANDOM)  # no read-around: a 4 KiB page per record, not 128 KiB
            self._view = np.frombuffer(self._map, dtype=np.uint64).reshape(readable, self.words)
        records = self._view[offsets]
        assert self._map is not None  # mapped together with _view
        self._map.madvise(mmap.MADV_DONTNEED)
        return records

    def read_range(self, start: int, stop: int) -> np.ndarray:
        """Records ``[start, stop)`` read sequentially (``os.pread``, not the map): uint64 ``[stop - start, words]``.

        Raises:
            StorageError: the range is not within the records written, or the file is shorter (truncated).
        """
        if not 0 <= start <= stop <= self.count:
            raise StorageError(f"segment file '{self.path}': records [{start}, {stop}) asked for, {self.count} written")
        records = np.empty((stop - start, self.words), dtype=np.uint64)
        view, done = memoryview(records).cast("B"), 0  # type: ignore[arg-type]  # numpy types ndarray as a buffer only for Python >= 3.12
        while done < len(view):
            got = os.preadv(self._open_fd(), [view[done:]], start * self.record_bytes + done)
            if got <= 0:
                raise StorageError(
                    f"segment file '{self.path}' is truncated: {done} of {len(view)} bytes of records "
                    f"[{start}, {stop}) could be read"
                )
            done += got
        return records

    def _unmap(self) -> None:
        self._view = None
        if self._map is not None:
            try:
                self._map.close()
            except BufferError:
                pass  # a caller still holds a view of it; it goes with the last reference
            self._map = None

    def close(self) -> None:
        """Drop the map and close the descriptor (idempotent)."""
        self._unmap()
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def unlink(self) -> None:
        """Close and delete the file.

        Raises:
            OSError: the file cannot be deleted.
        """
        self.close()
        os.unlink(self.path)
