"""SegmentFile: one append-only file of fixed-size records of the disk store, read through a memory map.

Writes are positional (``os.pwrite`` at ``count * record_bytes``), so the in-memory ``count`` is the truth: a
failed write is rolled back by resetting ``count``, and stray bytes past it are overwritten by the next write.
Reads gather records by offset from a read-only ``mmap`` of the open descriptor, so the file stays readable even
if its directory entry goes away, and one numpy fancy-index reads a whole batch.
"""

from __future__ import annotations

import errno
import mmap
import os
from typing import Optional

import numpy as np


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
        if written <= 0:  # no progress: treat like a full disk rather than loop forever
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        done += written


class SegmentFile:
    """An open segment: ``count`` records of ``words`` uint64 each, of which ``live`` are still referenced.

    Args:
        path (str): file to create; it must not exist.
        words (int): 64-bit words per record.
        segment_id (int): the store's number for this file.

    Raises:
        OSError: the file cannot be created (directory missing, not a directory, read-only ...).

    Example::

        seg = SegmentFile("/tmp/t/segment-000000.rows", words=4, segment_id=0)
        seg.append(np.zeros((2, 4), dtype=np.uint64))  # returns 0, the first offset
        seg.read(np.array([1]))  # array of shape [1, 4]
    """

    def __init__(self, path: str, words: int, segment_id: int) -> None:
        self.path = path
        self.words = words
        self.record_bytes = 8 * words
        self.segment_id = segment_id
        self.count = 0
        self.live = 0
        self._fd: Optional[int] = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        self._view: Optional[np.ndarray] = None  # uint64 [mapped records, words] over a read-only mmap

    def append(self, records: np.ndarray) -> int:
        """Write ``records`` (uint64 ``[n, words]``, contiguous) after the last one; return the first offset.

        ``count`` only advances once every byte is written.

        Raises:
            OSError: the write failed; ``count`` is unchanged (call :meth:`truncate` to drop partial bytes).
        """
        first = self.count
        pwrite_all(self._fd, memoryview(records).cast("B"), first * self.record_bytes)
        self.count += records.shape[0]
        return first

    def truncate(self, count: int) -> None:
        """Forget records from ``count`` on and shrink the file to match (best effort: ``count`` rules)."""
        self.count = count
        self._view = None
        try:
            os.ftruncate(self._fd, count * self.record_bytes)
        except OSError:
            pass  # bytes past `count` are never read and get overwritten by the next append

    def size_on_disk(self) -> int:
        """The file's current size in bytes, from ``fstat`` (shows truncation by anyone)."""
        return os.fstat(self._fd).st_size

    def read(self, offsets: np.ndarray) -> np.ndarray:
        """Copies of the records at ``offsets`` (int64 ``[n]``, each below ``count`` and inside the file).

        The caller checks :meth:`size_on_disk` first: touching a mapped page past the end of a truncated file
        raises SIGBUS, which no Python code can catch.
        """
        if self._view is None or int(offsets.max()) >= self._view.shape[0]:
            mapped = min(self.count, self.size_on_disk() // self.record_bytes)
            self._view = np.frombuffer(
                mmap.mmap(self._fd, mapped * self.record_bytes, access=mmap.ACCESS_READ), dtype=np.uint64
            ).reshape(mapped, self.words)
        return self._view[offsets]

    def close(self) -> None:
        """Drop the map and close the descriptor (idempotent)."""
        self._view = None
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
