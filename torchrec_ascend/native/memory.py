"""Host memory for large buffers: address space reserved up front, huge pages where they help, none where they stall.

:func:`reserve` gives a zero-filled array over an anonymous mapping that costs memory only for the pages written:
the KEY_VALUE stores' rows, keys and indexes grow inside it without ever copying or holding a second copy.
:func:`trim_heap` hands the C heap's free pages back after bulk work; :func:`physical_memory_bytes` is the RAM every
host budget is capped by.

A table probed at random (the ID map's buckets: 256 MB for 10M slots) misses the TLB on nearly every probe with
4 KiB pages; backed by 2 MiB pages its whole span fits the TLB's reach. Linux in its default ``madvise`` mode gives
huge pages only to memory asked for with ``madvise(MADV_HUGEPAGE)`` before it is first touched, which is what
:func:`huge_page_full` does. Elsewhere (another OS, THP off, no libc) the tensor is an ordinary one: the advice is a
hint, never a requirement, and never changes a value.

A buffer a read fills at once (checkpoint arrays, disk-tier records) wants the opposite: :func:`plain_empty` gives
it memory without the huge-page advice numpy attaches to large arrays, whose first touch may wait on memory
compaction. :func:`no_numpy_huge_pages` turns that advice off for the arrays numpy makes inside bulk checkpoint work,
and inside :func:`reused_buffers` the large buffers of :func:`plain_empty` are reused once freed, so block after block
is read into memory already faulted in.

Example::

    column = reserve(np.int64, 1 << 30)  # 8 GiB of address space, a few KiB of memory
    buckets = huge_page_full((1 << 20, 2), -1, torch.int64)  # an ordinary int64 tensor filled with -1
    records = plain_empty((4096, 36), np.uint64)  # an ordinary numpy array, to read into
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import math
import mmap
import os
import sys
import threading
import weakref
from typing import Callable, Dict, Iterator, List, Optional, Sequence

import numpy as np
import torch
from numpy.typing import DTypeLike

__all__ = [
    "KeptBuffers",
    "huge_page_full",
    "no_numpy_huge_pages",
    "physical_memory_bytes",
    "plain_empty",
    "reserve",
    "reused_buffers",
    "trim_heap",
]

HUGE_PAGE = 2 << 20  # x86-64 and aarch64 (4 KiB base pages) transparent huge page size
MADV_HUGEPAGE = 14  # <sys/mman.h> on Linux
NUMPY_ADVICE_BYTES = 4 << 20  # numpy advises huge pages for arrays this large and larger
KEPT_BYTES = 128 << 20  # freed plain_empty buffers kept for reuse inside reused_buffers, at most
PAGE = mmap.PAGESIZE
_MAP_NORESERVE = getattr(mmap, "MAP_NORESERVE", 0x4000)


def _libc() -> Optional[ctypes.CDLL]:
    if not sys.platform.startswith("linux"):
        return None
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name, use_errno=True) if name else None
    except OSError:
        return None
    if libc is None:
        return None
    if hasattr(libc, "madvise"):
        libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        libc.madvise.restype = ctypes.c_int
    return libc


_LIBC = _libc()


def huge_page_full(shape: Sequence[int], value: int, dtype: torch.dtype) -> torch.Tensor:
    """``torch.full(shape, value, dtype=dtype)`` on the CPU, its whole 2 MiB pages advised as huge pages first.

    Args:
        shape (Sequence[int]): the tensor's shape.
        value (int): the fill value.
        dtype (torch.dtype): the element type.

    Returns:
        Tensor: a contiguous CPU tensor equal to ``torch.full(shape, value, dtype=dtype)``.

    Example::

        huge_page_full((4, 2), -1, torch.int64).tolist()  # [[-1, -1], [-1, -1], [-1, -1], [-1, -1]]
    """
    out = torch.empty(shape, dtype=dtype)
    begin = out.data_ptr()
    end = begin + out.numel() * out.element_size()
    first = -(-begin // HUGE_PAGE) * HUGE_PAGE
    last = end // HUGE_PAGE * HUGE_PAGE
    if _LIBC is not None and hasattr(_LIBC, "madvise") and last > first:
        _LIBC.madvise(first, last - first, MADV_HUGEPAGE)  # a refusal (THP off, old kernel) leaves 4 KiB pages
    return out.fill_(value)


def plain_empty(shape: Sequence[int], dtype: DTypeLike) -> np.ndarray:
    """``np.empty(shape, dtype)`` in memory given no huge-page advice: for large buffers a read fills at once.

    numpy advises huge pages for every array of 4 MiB or more (its default on Linux), and the first touch of such
    memory may compact memory synchronously, which waits on the page cache being written out: reading 32 MB from the
    page cache into one took 0.3-0.5 s instead of 10 ms while a restore wrote the disk tier. A buffer that large gets
    a mapping of its own here (heap memory may carry the advice numpy gave an array freed before); a smaller one is
    numpy's, which numpy never advises. Inside :func:`reused_buffers` the mapping is one freed before, when one of
    its size was.

    Args:
        shape (Sequence[int]): the array's shape.
        dtype (DTypeLike): its element type.

    Returns:
        np.ndarray: a writable, uninitialised, C-contiguous array that keeps its memory alive.

    Example::

        rows = plain_empty((1 << 20, 36), np.uint64)  # 288 MiB, filled by a read
    """
    dtype = np.dtype(dtype)
    count = math.prod(shape)
    if count * dtype.itemsize < NUMPY_ADVICE_BYTES:
        return np.empty(shape, dtype)
    size = -(-count * dtype.itemsize // PAGE) * PAGE
    buffer = _kept_buffer(size)
    if buffer is None:
        buffer = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    # Every view of the result keeps `whole` alive (numpy's views point at the array holding the buffer), so the
    # buffer is freed when nothing refers to any of its memory.
    whole = np.frombuffer(buffer, dtype=dtype, count=count)
    weakref.finalize(whole, _freed, buffer)
    return whole.reshape(tuple(shape))


def _kept_buffer(size: int) -> Optional[mmap.mmap]:
    """A kept buffer of ``size`` bytes, taken out of the kept ones, or None."""
    global _kept_bytes
    with _LOCK:
        kept = _kept.get(size)
        if not kept:
            return None
        _kept_bytes -= size
        return kept.pop()


def _freed(buffer: mmap.mmap) -> None:
    """Keep a freed :func:`plain_empty` buffer for reuse inside :func:`reused_buffers`, dropping (unmapping) kept
    ones of other sizes, the oldest first, where the limit would be passed: the next array most likely wants the size
    freed last (an odd-sized block would otherwise hold the room a stream of equal blocks reuses)."""
    global _kept_bytes
    with _LOCK:
        size = len(buffer)
        if not _reusers or size > _kept_limit:
            return
        for other in [s for s in _kept if s != size]:
            if _kept_bytes + size <= _kept_limit:
                break
            _kept_bytes -= other * len(_kept.pop(other))
        if _kept_bytes + size <= _kept_limit:
            _kept.setdefault(size, []).append(buffer)
            _kept_bytes += size


def reserve(dtype: DTypeLike, length: int) -> np.ndarray:
    """A zero-filled numpy array of ``length`` elements whose pages cost memory only once written.

    An anonymous private mapping with no swap reservation: growing what is used of it never copies and never
    holds a second copy, which ``np.resize`` or ``torch.cat`` would.

    Example::

        column = reserve(np.int64, 1 << 30)  # 8 GiB of address space, a few KiB of memory
        column[:4] = 7
    """
    dtype = np.dtype(dtype)
    buffer = mmap.mmap(-1, max(PAGE, length * dtype.itemsize),
                       flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | _MAP_NORESERVE)
    return np.frombuffer(buffer, dtype=dtype, count=length)


def trim_heap() -> None:
    """Hand the C heap's free pages back to the system (glibc ``malloc_trim``; nothing elsewhere).

    Many small arrays freed together (a bulk load's per-partition pieces) leave the heap fragmented: without this
    the process keeps them resident, ~17 bytes a loaded row beyond the index.

    Example::

        trim_heap()
    """
    if _LIBC is not None and hasattr(_LIBC, "malloc_trim"):
        _LIBC.malloc_trim(0)


def physical_memory_bytes() -> int:
    """This machine's RAM in bytes (what no host tier can exceed).

    Example::

        physical_memory_bytes() // 2**30
    """
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def _numpy_advice_switch() -> Optional[Callable[[bool], bool]]:
    """numpy's process-wide switch of its huge-page advice (a private function: it sets the advice, returns the
    previous setting), or None where this numpy has none."""
    for module in ("numpy._core.multiarray", "numpy.core.multiarray"):
        try:
            switch = getattr(__import__(module, fromlist=["_set_madvise_hugepage"]), "_set_madvise_hugepage", None)
        except ImportError:
            continue
        if switch is not None:
            return switch
    return None


_ADVICE_SWITCH = _numpy_advice_switch()
_LOCK = threading.Lock()  # guards the counters below and the kept buffers
_advice_holders = 0
_advice_before = True
_reusers = 0  # reused_buffers blocks running, in every thread
_kept: Dict[int, List[mmap.mmap]] = {}  # freed plain_empty buffers by size, while a reused_buffers block runs
_kept_bytes = 0
_kept_limit = KEPT_BYTES  # the innermost running reused_buffers block's limit


@contextlib.contextmanager
def no_numpy_huge_pages() -> Iterator[None]:
    """numpy's huge-page advice for large arrays (its default on Linux) off inside the block, then as it was.

    Checkpoint work over a KEY_VALUE table makes many short-lived arrays of megabytes while it fills the page cache;
    the first touch of advised memory then waited on memory compaction: loading a 250k-row table through
    ``torch.distributed.checkpoint`` spent 5.7 s in ``load_state_dict``, 0.9 s without the advice. The switch is
    numpy's and process-wide, so arrays other threads make meanwhile get no advice either (a hint: no value ever
    changes); the first block to enter turns it off and the last to leave restores it. Where numpy has no such switch
    nothing changes.

    Example::

        with no_numpy_huge_pages():
            records = np.concatenate(pieces)  # ordinary 4 KiB pages
    """
    global _advice_holders, _advice_before
    if _ADVICE_SWITCH is None:
        yield
        return
    with _LOCK:
        if _advice_holders == 0:
            _advice_before = _ADVICE_SWITCH(False)
        _advice_holders += 1
    try:
        yield
    finally:
        with _LOCK:
            _advice_holders -= 1
            if _advice_holders == 0:
                _ADVICE_SWITCH(_advice_before)


class KeptBuffers:
    """Freed :func:`plain_empty` buffers a caller keeps between its :func:`reused_buffers` blocks (``keep=``): a
    pass that reads a block per call (a DCP save reads a table a window at a time) then reads each into the memory of
    the call before, not fresh memory. They stay resident while this holds them; :meth:`clear` unmaps them.

    Example::

        kept = KeptBuffers()
        for start in range(0, len(segment), 65536):  # one call at a time, other work in between
            with reused_buffers(64 << 20, keep=kept):
                consume(segment.read_range(start, start + 65536))
        kept.clear()
    """

    def __init__(self) -> None:
        self.buffers: Dict[int, List[mmap.mmap]] = {}

    @property
    def nbytes(self) -> int:
        """Bytes held."""
        return sum(size * len(buffers) for size, buffers in self.buffers.items())

    def clear(self) -> None:
        """Unmap every buffer held (none has a view: each was freed)."""
        self.buffers = {}


@contextlib.contextmanager
def reused_buffers(limit: int = KEPT_BYTES, keep: Optional[KeptBuffers] = None) -> Iterator[None]:
    """Inside the block, a large buffer of :func:`plain_empty` is reused once freed: kept (up to ``limit`` bytes in
    all) and handed out again for the next array of its size. The last block to leave unmaps the kept ones, so
    nothing stays resident after the work.

    A kept buffer stays resident until it is reused, so a caller whose peak memory matters keeps ``limit`` to the
    buffers freed between two reads (a checkpoint load: one block). ``keep``: the block starts with its buffers and,
    when it is the last block to leave, hands what is kept back to it instead of unmapping them.

    A fresh mapping costs a page fault a 4 KiB page on its first touch: the Saver reads blocks of one size after
    another (checkpoint arrays, disk-tier records), and reading them into fresh memory took a third of the time a save
    spent reading the disk tier (1 GB: 0.45 s, 0.21 s into reused buffers).

    Example::

        with reused_buffers():
            for start in range(0, len(segment), 65536):
                consume(segment.read_range(start, start + 65536))  # each block lands in the one freed before
    """
    global _reusers, _kept_bytes, _kept_limit
    with _LOCK:
        _reusers += 1
        outer, _kept_limit = _kept_limit, -(-limit // PAGE) * PAGE  # buffers are whole pages
        if keep is not None:
            for size, buffers in keep.buffers.items():
                taken = buffers[:max(0, (_kept_limit - _kept_bytes) // size)]  # the rest are unmapped
                if taken:
                    _kept.setdefault(size, []).extend(taken)
                    _kept_bytes += size * len(taken)
            keep.clear()
    try:
        yield
    finally:
        with _LOCK:
            _reusers -= 1
            _kept_limit = outer
            if _reusers == 0:
                if keep is not None:
                    keep.buffers = {size: buffers for size, buffers in _kept.items() if buffers}
                _kept.clear()  # unmapped as they go: no view of them remains
                _kept_bytes = 0
