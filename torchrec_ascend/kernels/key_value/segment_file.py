"""SegmentFile: one append-only file of fixed-size records of the disk store, and the batched random read of records.

Writes are positional (``os.pwrite`` at ``count * record_bytes``), so the in-memory ``count`` is the truth: a
failed write is rolled back by resetting ``count``, and stray bytes past it are overwritten by the next write.
Random reads gather a whole batch, across files, with one native call (:func:`read_records`, the op
``torch.ops.torchrec_ascend.read_records``): it announces every record's pages to the kernel first
(``posix_fadvise(WILLNEED)``), so a batch of page-cache misses is one burst of parallel disk reads, not one read at
a time as page faults of a memory map would be (3x faster per batch of cold records on this machine's disk:
``benchmarks/bench_disk_reads.py``), then copies each record with ``pread``. Nothing is mapped, so reading files
many times the size of memory never shows as this process's memory, and a file truncated behind the store's back
gives a short read, never a SIGBUS.

Untrusted input: the file's name is made here from its number (a plain name inside the store's own folder, opened
without following symlinks, never an existing file); a read that comes back short or fails is a
:class:`StorageError` naming the file and the record.
"""

from __future__ import annotations

import errno
import os
from typing import Optional, Sequence

import numpy as np
import torch

from torchrec_ascend.errors import StorageError
from torchrec_ascend.native import ops
from torchrec_ascend.native.memory import plain_empty


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
        read_records([seg], np.array([0]), np.array([1]))  # array of shape [1, 4]
    """

    def __init__(self, directory: str, words: int, segment_id: int) -> None:
        self.path = os.path.join(directory, segment_name(segment_id))
        self.words = words
        self.record_bytes = 8 * words
        self.segment_id = segment_id
        self.count = 0
        self.live = 0
        self._synced = 0  # records known on disk and out of the page cache (see append's write_behind)
        flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
        self._fd: Optional[int] = os.open(self.path, flags, 0o644)

    def _open_fd(self) -> int:
        if self._fd is None:
            raise StorageError(f"segment file '{self.path}' is closed")
        return self._fd

    def append(self, records: np.ndarray, write_behind: Optional[int] = None) -> int:
        """Write ``records`` (uint64 ``[n, words]``, contiguous) after the last one; return the first offset.

        ``count`` only advances once every byte is written. With ``write_behind`` (bytes), once that many bytes
        wait in the page cache they are written out (``fdatasync``) and dropped from it (``posix_fadvise``), so a
        bulk write of many gigabytes holds at most that much dirty memory and reuses the pages it frees: writing
        0.5 GB into fresh page cache took 3.1-3.3 s on the project's virtual machine, 1.2-1.4 s this way, synced.

        Raises:
            OSError: the write (or the sync) failed; ``count`` is unchanged (call :meth:`truncate` to drop partial
                bytes).
        """
        first = self.count
        data = memoryview(np.ascontiguousarray(records)).cast("B")  # type: ignore[arg-type]  # numpy types ndarray as a buffer only for Python >= 3.12
        fd = self._open_fd()
        pwrite_all(fd, data, first * self.record_bytes)
        end = first + records.shape[0]
        if write_behind is not None and (end - self._synced) * self.record_bytes >= write_behind:
            os.fdatasync(fd)
            if hasattr(os, "posix_fadvise"):
                start = self._synced * self.record_bytes
                os.posix_fadvise(fd, start, end * self.record_bytes - start, os.POSIX_FADV_DONTNEED)
            self._synced = end
        self.count = end
        return first

    def truncate(self, count: int) -> None:
        """Forget records from ``count`` on and shrink the file to match (best effort: ``count`` rules)."""
        self.count = count
        self._synced = min(self._synced, count)
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

    def read_range(self, start: int, stop: int) -> np.ndarray:
        """Records ``[start, stop)`` read sequentially (``os.preadv``): uint64 ``[stop - start, words]``.

        Raises:
            StorageError: the range is not within the records written, or the file is shorter (truncated).
        """
        if not 0 <= start <= stop <= self.count:
            raise StorageError(f"segment file '{self.path}': records [{start}, {stop}) asked for, {self.count} written")
        records = plain_empty((stop - start, self.words), np.uint64)  # see plain_empty: faults that wait on writeback
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

    def close(self) -> None:
        """Close the descriptor (idempotent)."""
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


def read_records(segments: Sequence[SegmentFile], which: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Copies of the records at ``offsets[i]`` of ``segments[which[i]]`` (int64 ``[n]`` each, repeats allowed), in
    one native call for the whole batch: uint64 ``[n, words]``.

    The caller checks offsets against :meth:`SegmentFile.readable` first, to say which keys are lost; a read that
    still comes back short (the file was cut meanwhile) or fails raises here.

    Raises:
        StorageError: a record could not be read in full, naming its file, the record and the reason.

    Example::

        read_records([seg_a, seg_b], np.array([1, 0, 1]), np.array([7, 3, 0]))  # records 7 and 0 of seg_b, 3 of seg_a
    """
    if offsets.size == 0:
        return np.empty((0, segments[0].words if segments else 0), dtype=np.uint64)
    words = segments[0].words
    records = plain_empty((offsets.size, words), np.uint64)
    fds = np.array([seg._open_fd() for seg in segments], dtype=np.int64)[which]
    failed, error = ops.read_records(
        torch.from_numpy(fds), torch.from_numpy(np.ascontiguousarray(offsets, dtype=np.int64)), 8 * words,
        torch.from_numpy(records),
    ).tolist()
    if failed >= 0:
        seg = segments[int(which[failed])]
        reason = os.strerror(error) if error else f"the file ends at {seg.size_on_disk()} bytes"
        raise StorageError(
            f"segment file '{seg.path}': record {int(offsets[failed])} ({seg.record_bytes} bytes at byte "
            f"{int(offsets[failed]) * seg.record_bytes}) could not be read: {reason}"
        )
    return records
