"""Checkpoint files: raw arrays in one data file per rank, JSON metadata, atomic writes, checksums; no pickle.

A data file is a 16-byte header (magic, format version) followed by arrays written back to back (64-byte aligned);
what is where lives in the metadata, one entry per array: offset, byte count, numpy dtype string, shape and CRC-32.
Only plain numeric dtypes are accepted back (bool, integers, floats), so reading never executes anything.

Every file is written atomically: to a temporary name in the same directory, flushed and fsynced, renamed into
place, then the directory is fsynced so the rename itself survives a power loss. A reader sees the old file or the
complete new one, never a torn one. Anything that does not read back intact (missing, truncated, wrong magic,
checksum mismatch, malformed JSON) raises :class:`StorageError` naming the file.

Readers treat files as untrusted (checkpoints travel between machines): names read from metadata must be plain file
names inside their folder (:func:`confined`), only regular files are opened (a FIFO would block), and an array's
entry is checked and compared with the file's size before anything is allocated (:func:`read_array`).

Example::

    with ArrayFileWriter("/ckpt/save-00000001/rank-00000-of-00001.data") as writer:
        entry = writer.add(np.arange(4))
        writer.commit()
    read_array("/ckpt/save-00000001/rank-00000-of-00001.data", entry, "ids of table 'user'")
"""

from __future__ import annotations

import concurrent.futures
import io
import json
import math
import os
import re
import stat
import struct
import zlib
from typing import Any, Dict, Iterable, Optional, Tuple

import numpy as np

from torchrec_ascend.errors import StorageError
from torchrec_ascend.native.memory import plain_empty

FORMAT_VERSION = 1
MAGIC = b"TRACKPT\x00"
HEADER = MAGIC + struct.pack("<II", FORMAT_VERSION, 0)
ALIGN = 64
NUMERIC_KINDS = "biuf"  # numpy dtype kinds a checkpoint may hold: bool, signed, unsigned, float
_CRC_CHUNK = 1 << 26
WRITE_BACK_BYTES = 32 << 20  # a data file's bytes written before their writeback is started (ArrayFileWriter)
ARRAY_KEYS = ("dtype", "shape", "offset", "nbytes", "crc32")
MAX_BYTES = 1 << 50  # no offset, size or dimension of a checkpoint array reaches 1 PiB
MAX_JSON_BYTES = 1 << 30  # a save's metadata is a few KiB per table shard
MAX_DIMS = 32  # numpy's own limit on dimensions
_DTYPE = re.compile(r"^[<>|=][biuf][1248]$")  # byte order, numeric kind, item size: what ArrayFileWriter writes


def fsync_directory(path: str) -> None:
    """Make a rename or file creation inside ``path`` durable (fsync of the directory itself).

    Raises:
        StorageError: the directory cannot be opened or synced.

    Example::

        os.replace(tmp, final)
        fsync_directory(os.path.dirname(final))
    """
    try:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as error:
        raise StorageError(f"checkpoint directory '{path}': cannot sync it to disk: {error}") from error


def crc32(data: memoryview) -> int:
    """CRC-32 of ``data`` (in chunks: zlib takes at most 4 GiB at once).

    Example::

        crc32(memoryview(np.arange(4)).cast("B"))
    """
    value = 0
    for start in range(0, len(data), _CRC_CHUNK):
        value = zlib.crc32(data[start : start + _CRC_CHUNK], value)
    return value


class ArrayFileWriter:
    """Writes numpy arrays into one data file, atomically: nothing appears under ``path`` before :meth:`commit`.

    Each array is checksummed and written by a writer thread while the caller makes the next one (a save reads,
    checks and copies rows while the previous block is summed and goes to the disk): one write is in flight at a
    time, and an array must not change after :meth:`add` until the next :meth:`add` or :meth:`commit` returns, which
    also completes its entry (its ``crc32``).

    Args:
        path: the final file name (its directory must exist).

    Raises:
        StorageError: the temporary file cannot be created.

    Example::

        with ArrayFileWriter(path) as writer:
            entries = {"ids": writer.add(ids.numpy())}
            writer.commit()
    """

    def __init__(self, path: str) -> None:
        self.path = path
        directory, name = os.path.split(path)
        self._tmp = os.path.join(directory, f".{name}.tmp-{os.getpid()}")
        try:
            self._file = open(self._tmp, "wb")
            self._file.write(HEADER)
        except OSError as error:
            raise StorageError(f"checkpoint file '{path}': cannot create it: {error}") from error
        self._offset = len(HEADER)
        self._written_back = 0  # the bytes before this offset are being written to the disk already (writer thread)
        self._committed = False
        self._writer = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="checkpoint-writer")
        # The write in flight, and the entry its checksum completes.
        self._in_flight: Optional[Tuple[concurrent.futures.Future, Dict[str, Any]]] = None

    def __enter__(self) -> "ArrayFileWriter":
        return self

    def __exit__(self, *exc: object) -> None:
        if not self._committed:
            self.abort()

    def add(self, array: np.ndarray) -> Dict[str, Any]:
        """Append ``array``; returns its metadata entry (``offset``, ``nbytes``, ``dtype``, ``shape``, and ``crc32``
        once the next :meth:`add` or :meth:`commit` returns).

        Raises:
            StorageError: a non-numeric dtype, or a write failed (disk full...): this array's or the previous one's.
        """
        if array.dtype.kind not in NUMERIC_KINDS:
            raise StorageError(f"checkpoint file '{self.path}': cannot store arrays of dtype {array.dtype}")
        array = np.require(array, requirements="C")  # keeps 0-d arrays 0-d (ascontiguousarray would not)
        data = memoryview(array).cast("B") if array.size else memoryview(b"")  # type: ignore[arg-type]  # numpy types ndarray as a buffer only for Python >= 3.12
        padding = -self._offset % ALIGN if len(data) else 0
        self._finish_write()
        end = self._offset + padding + len(data)
        entry = {"offset": self._offset + padding, "nbytes": len(data), "dtype": array.dtype.str,
                 "shape": list(array.shape), "crc32": None}
        self._in_flight = (self._writer.submit(self._write, padding, data, end), entry)
        self._offset = end
        return entry

    def _write(self, padding: int, data: memoryview, end: int) -> int:
        """(Writer thread.) Append ``padding`` zero bytes and ``data``, which end at offset ``end``; returns the
        CRC-32 of ``data`` (summed here, beside the caller's work: zlib releases the GIL)."""
        self._file.write(b"\0" * padding)
        self._file.write(data)
        self._write_back(end)
        return crc32(data)

    def _finish_write(self) -> None:
        """Wait for the write in flight.

        Raises:
            StorageError: it failed.
        """
        in_flight, self._in_flight = self._in_flight, None
        if in_flight is None:
            return
        write, entry = in_flight
        try:
            entry["crc32"] = write.result()
        except OSError as error:
            raise StorageError(f"checkpoint file '{self.path}': write failed: {error}") from error

    def _write_back(self, end: int) -> None:
        """Start writing what was added so far (up to ``end``) to the disk once :data:`WRITE_BACK_BYTES` are
        waiting, without waiting for it (``posix_fadvise(DONTNEED)`` starts the writeback of dirty pages, then drops
        the pages already written): the disk writes while the next arrays are made, instead of all at
        :meth:`commit`'s fsync, and a save does not fill the page cache. A hint only: errors surface at the fsync."""
        if end - self._written_back < WRITE_BACK_BYTES or not hasattr(os, "posix_fadvise"):
            return
        try:
            self._file.flush()
            os.posix_fadvise(self._file.fileno(), 0, end, os.POSIX_FADV_DONTNEED)
        except OSError:
            pass
        self._written_back = end

    def commit(self) -> int:
        """Flush, fsync and rename the file into place, then fsync its directory; returns the file's size.

        Raises:
            StorageError: any step failed (the temporary file is removed; ``path`` is untouched).
        """
        try:
            self._finish_write()
            self._writer.shutdown()
            self._file.flush()
            os.fsync(self._file.fileno())
            self._file.close()
            os.replace(self._tmp, self.path)
        except (OSError, StorageError) as error:
            self.abort()
            if isinstance(error, StorageError):
                raise
            raise StorageError(f"checkpoint file '{self.path}': cannot complete it: {error}") from error
        self._committed = True
        fsync_directory(os.path.dirname(self.path) or ".")
        return self._offset

    def abort(self) -> None:
        """Drop the temporary file (the final name never appears)."""
        self._writer.shutdown()  # waits for the write in flight: the file is closed after it
        self._in_flight = None
        self._file.close()
        if os.path.exists(self._tmp):
            os.remove(self._tmp)


def confined(directory: str, name: Any, what: str) -> str:
    """``directory/name`` for a file name read from a checkpoint, refusing anything that could leave the folder.

    The name must be a plain file name (a string without path separators, NUL, ``.`` or ``..``); if the file
    exists, its real path (symbolic links resolved) must lie inside ``directory``'s real path.

    Raises:
        StorageError: the name is not a plain file name of ``directory``, or a symbolic link leads out of it.

    Example::

        confined("/ckpt/save-00000001", "rank-00000-of-00001.data", "the data file of table 'user'")
    """
    if (not isinstance(name, str) or name in ("", ".", "..") or "\0" in name or "/" in name
            or (os.altsep is not None and os.altsep in name) or os.sep in name):
        raise StorageError(
            f"checkpoint folder '{directory}': {what} is named {name!r}, which is not a plain file name of the "
            "folder (no path separators, '..' or absolute paths); the metadata is corrupted or crafted"
        )
    path = os.path.join(directory, name)
    if os.path.lexists(path):
        real, folder = os.path.realpath(path), os.path.realpath(directory)
        if os.path.commonpath([real, folder]) != folder or real == folder:
            raise StorageError(
                f"checkpoint file '{path}' ({what}) is a symbolic link leading out of its folder (to '{real}'); "
                "refusing to read it"
            )
    return path


def open_regular(path: str, what: str, max_bytes: int) -> io.BufferedReader:
    """Open ``path`` for reading, refusing anything but a regular file of at most ``max_bytes`` (a FIFO or device
    would block or never end).

    Raises:
        FileNotFoundError: there is no such file.
        StorageError: it is not a regular file, or is larger than ``max_bytes``.
        OSError: it cannot be opened.

    Example::

        with open_regular(path, "the metadata", MAX_JSON_BYTES) as f:
            text = f.read()
    """
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    f = os.fdopen(fd, "rb")
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode) or info.st_size > max_bytes:
        f.close()
        rule = "is not a regular file" if not stat.S_ISREG(info.st_mode) else f"has {info.st_size} bytes"
        raise StorageError(f"checkpoint file '{path}' ({what}) {rule}; refusing to read it")
    return f


def _plain_int(value: Any, low: int, high: int) -> bool:
    return type(value) is int and low <= value <= high


def array_spec(entry: Any, where: str) -> Tuple[np.dtype, Tuple[int, ...], int, int, int]:
    """``(dtype, shape, offset, nbytes, crc32)`` of an array's metadata entry, every field checked.

    The dtype must be a plain numeric one (``<i8``, ``|b1``...), the shape non-negative ints whose product times
    the item size is ``nbytes``, the offset past the header, all within :data:`MAX_BYTES`.

    Args:
        entry: the array's metadata entry, as read from the metadata file.
        where: names the file and the entry; every message starts with it.

    Raises:
        StorageError: the entry is malformed: ``"{where}: "`` and the rule it breaks.

    Example::

        dtype, shape, offset, nbytes, crc = array_spec(entry, "checkpoint file 'm.json', array 'ids'")
    """
    if not isinstance(entry, dict):
        raise StorageError(f"{where}: an array entry must be a JSON object, got {type(entry).__name__}")
    missing = [key for key in ARRAY_KEYS if key not in entry]
    if missing:
        raise StorageError(f"{where}: the array entry lacks {missing}")
    dtype_text, shape, offset, nbytes, crc = (entry[key] for key in ARRAY_KEYS)
    if not isinstance(dtype_text, str) or not _DTYPE.match(dtype_text):
        raise StorageError(f"{where}: dtype {dtype_text!r} is not a plain numeric dtype ({NUMERIC_KINDS})")
    if not isinstance(shape, list) or len(shape) > MAX_DIMS or not all(_plain_int(n, 0, MAX_BYTES) for n in shape):
        raise StorageError(f"{where}: shape {shape!r} is not a list of at most {MAX_DIMS} non-negative ints")
    if not _plain_int(offset, len(HEADER), MAX_BYTES) or not _plain_int(nbytes, 0, MAX_BYTES):
        raise StorageError(f"{where}: offset {offset!r} / byte count {nbytes!r} out of range")
    if not _plain_int(crc, 0, 2**32 - 1):
        raise StorageError(f"{where}: checksum {crc!r} is not a CRC-32")
    dtype = np.dtype(dtype_text)
    needed = dtype.itemsize * math.prod(shape)
    if needed != nbytes:
        raise StorageError(f"{where}: shape {shape} of {dtype_text} needs {needed} bytes, not {nbytes}")
    return dtype, tuple(shape), offset, nbytes, crc


FileIdentity = Tuple[int, int, int, int, int]


def file_identity(path: str) -> FileIdentity:
    """What changes whenever ``path``'s content does: device, inode, size, modification and change times (ns).

    Raises:
        StorageError: the file cannot be stat'ed.

    Example::

        before = file_identity(path)   # then read and check it; later, read_array(..., verified=before)
    """
    try:
        info = os.stat(path)
    except OSError as error:
        raise StorageError(f"checkpoint file '{path}': cannot read it: {error}") from error
    return info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns


def read_array(path: str, entry: Dict[str, Any], what: str, verified: Optional[FileIdentity] = None) -> np.ndarray:
    """Read one array of a data file back, checking the entry, the header, the size and the checksum.

    Nothing is allocated before the entry is found consistent and the file found long enough to hold the array,
    so a crafted entry cannot ask for more memory than the file's size.

    Args:
        path: the data file.
        entry: the array's metadata entry (from :meth:`ArrayFileWriter.add`).
        what: names the array in messages (e.g. ``"rows of table 'user'"``).
        verified: for an array read (and its checksum verified) before, the file's :func:`file_identity` taken
            before that read: the file must still have it after this read, instead of the checksum being computed
            again (a change through the file system changes the modification time).

    Returns:
        np.ndarray: a fresh, writable array of the recorded dtype and shape.

    Raises:
        StorageError: the file is missing, truncated or corrupted, or the entry is malformed.

    Example::

        ids = read_array(path, entry, "ids of table 'user'")
    """
    dtype, shape, offset, nbytes, expected = array_spec(
        entry, f"checkpoint file '{path}': the metadata entry of {what} is inconsistent"
    )
    try:
        with open_regular(path, what, MAX_BYTES) as f:
            if f.read(len(HEADER)) != HEADER:
                raise StorageError(
                    f"checkpoint file '{path}' is not a torchrec-ascend checkpoint data file of format version "
                    f"{FORMAT_VERSION} (bad header); it is corrupted or from another version"
                )
            size = os.fstat(f.fileno()).st_size
            if offset + nbytes > size:
                raise StorageError(
                    f"checkpoint file '{path}' is truncated: {what} needs bytes {offset}..{offset + nbytes} but the "
                    f"file has {size}; load an earlier checkpoint version"
                )
            out = plain_empty(shape, dtype)  # no huge-page advice: its faults would wait on writeback
            f.seek(offset)
            view = memoryview(out).cast("B") if nbytes else memoryview(bytearray())  # type: ignore[arg-type]  # numpy types ndarray as a buffer only for Python >= 3.12
            if f.readinto(view) != nbytes:
                raise StorageError(f"checkpoint file '{path}': short read of {what}")
            info = os.fstat(f.fileno())
    except StorageError:
        raise
    except OSError as error:
        raise StorageError(f"checkpoint file '{path}': cannot read {what}: {error}") from error
    if verified is not None:
        if (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns) != verified:
            raise StorageError(
                f"checkpoint file '{path}' changed since the checksum of {what} was verified (its size, inode or "
                "modification time differ); load the checkpoint again"
            )
    elif crc32(view) != expected:
        raise StorageError(
            f"checkpoint file '{path}' is corrupted: the checksum of {what} does not match; load an earlier "
            "checkpoint version"
        )
    return out


def will_read(path: str, entries: Iterable[Any]) -> None:
    """Ask the kernel to start reading the byte span of the arrays ``entries`` of ``path`` into the page cache
    (``posix_fadvise(WILLNEED)``): the disk reads the next block while the current one is checked. A hint only:
    malformed entries and every error are ignored (:func:`read_array` checks and reports them).

    Example::

        will_read(path, block.values())   # then read_array(path, block["rows"], ...) finds it cached
    """
    spans = [(e["offset"], e["offset"] + e["nbytes"]) for e in entries if isinstance(e, dict)
             and _plain_int(e.get("offset"), 0, MAX_BYTES) and _plain_int(e.get("nbytes"), 0, MAX_BYTES)]
    if not spans or not hasattr(os, "posix_fadvise"):
        return
    start, end = min(s for s, _ in spans), max(e for _, e in spans)
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
        try:
            if stat.S_ISREG(os.fstat(fd).st_mode):
                os.posix_fadvise(fd, start, end - start, os.POSIX_FADV_WILLNEED)
        finally:
            os.close(fd)
    except OSError:
        pass


def write_json(path: str, content: Dict[str, Any]) -> None:
    """Write ``content`` as JSON to ``path`` atomically (temporary file, fsync, rename, directory fsync).

    Raises:
        StorageError: the file cannot be written.

    Example::

        write_json("/ckpt/save-00000001/metadata.json", {"version": 1})
    """
    directory, name = os.path.split(path)
    tmp = os.path.join(directory, f".{name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "w") as f:
            json.dump(content, f, indent=1, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as error:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise StorageError(f"checkpoint file '{path}': cannot write it: {error}") from error
    fsync_directory(directory or ".")


def read_json(path: str) -> Optional[Dict[str, Any]]:
    """The JSON object in ``path``, or None if the file does not exist.

    Raises:
        StorageError: the file exists but is not a JSON object (truncated or corrupted).

    Example::

        metadata = read_json("/ckpt/save-00000001/metadata.json")  # None while the save is incomplete
    """
    try:
        with open_regular(path, "JSON", MAX_JSON_BYTES) as f:
            content = json.loads(f.read())
    except FileNotFoundError:
        return None
    except StorageError:
        raise
    except (OSError, ValueError, RecursionError) as error:  # RecursionError: nesting deeper than the parser goes
        raise StorageError(f"checkpoint file '{path}' cannot be read as JSON: {error}; it is corrupted") from None
    if not isinstance(content, dict):
        raise StorageError(f"checkpoint file '{path}' does not hold a JSON object; it is corrupted")
    return content
