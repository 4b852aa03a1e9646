"""Checkpoint files: arrays read back byte for byte, atomic writes, and damage reported as StorageError naming the
file. Oracle: the arrays written (compared as bytes, so NaN payloads count)."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from torchrec_ascend.checkpoint import files
from torchrec_ascend.checkpoint.files import (
    ArrayFileWriter,
    file_identity,
    read_array,
    read_json,
    will_read,
    write_json,
)
from torchrec_ascend.errors import StorageError

DTYPES = st.sampled_from([np.bool_, np.int8, np.uint8, np.int32, np.int64, np.float16, np.float32, np.float64])
SHAPES = hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=5)
ARRAYS = DTYPES.flatmap(lambda dtype: hnp.arrays(dtype, SHAPES))


def write(path: Path, *arrays: np.ndarray) -> list:
    with ArrayFileWriter(str(path)) as writer:
        entries = [writer.add(a) for a in arrays]
        writer.commit()
    return entries


@settings(deadline=None, max_examples=40)
@given(st.lists(ARRAYS, min_size=1, max_size=4))
def test_arrays_read_back_byte_for_byte(tmp_path_factory: pytest.TempPathFactory, arrays: list) -> None:
    path = tmp_path_factory.mktemp("files") / "rank.data"
    entries = write(path, *arrays)
    for array, entry in zip(arrays, entries):
        back = read_array(str(path), entry, "x")
        assert back.dtype == array.dtype and back.shape == array.shape
        assert back.tobytes() == np.ascontiguousarray(array).tobytes()
        back[...] = 0  # a fresh, writable copy


def test_nothing_appears_before_commit_and_an_error_leaves_nothing(tmp_path: Path) -> None:
    path = tmp_path / "rank.data"
    with pytest.raises(RuntimeError):
        with ArrayFileWriter(str(path)) as writer:
            writer.add(np.arange(10))
            assert not path.exists()
            raise RuntimeError("interrupted")
    assert os.listdir(tmp_path) == []


def test_truncated_file_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "rank.data"
    entry = write(path, np.arange(1000))[0]
    os.truncate(path, os.path.getsize(path) - 8)
    with pytest.raises(StorageError, match=f"'{path}' is truncated"):
        read_array(str(path), entry, "ids of table 't'")


def test_flipped_byte_fails_the_checksum(tmp_path: Path) -> None:
    path = tmp_path / "rank.data"
    entry = write(path, np.arange(1000, dtype=np.float32))[0]
    with open(path, "r+b") as f:
        f.seek(entry["offset"] + 100)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 1]))
    with pytest.raises(StorageError, match=f"'{path}' is corrupted: the checksum of rows"):
        read_array(str(path), entry, "rows")


def test_a_read_again_is_refused_once_the_file_changed_since_its_checksum_was_verified(tmp_path: Path) -> None:
    # A restore reads the rows below the pool twice: checked (checksum), then as they are restored, where the file's
    # identity taken before the check stands in for a second checksum.
    path = tmp_path / "rank.data"
    array = np.arange(1000, dtype=np.float32)
    entry = write(path, array)[0]
    verified = file_identity(str(path))
    assert read_array(str(path), entry, "rows").tobytes() == array.tobytes()
    assert read_array(str(path), entry, "rows", verified).tobytes() == array.tobytes()
    with open(path, "r+b") as f:
        f.seek(entry["offset"])
        f.write(b"\xff")
    info = os.stat(path)
    os.utime(path, ns=(info.st_atime_ns, info.st_mtime_ns + 10**9))  # a clock coarser than the test cannot hide it
    with pytest.raises(StorageError, match=f"'{path}' changed since the checksum of rows was verified"):
        read_array(str(path), entry, "rows", verified)


def test_arrays_read_back_with_writeback_started_as_they_are_written(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(files, "WRITE_BACK_BYTES", 64)  # every add starts the writeback of what came before
    arrays = [np.arange(n, dtype=np.int64) * 7 for n in (1, 100, 3, 1000)]
    entries = write(tmp_path / "rank.data", *arrays)
    for array, entry in zip(arrays, entries):
        assert read_array(str(tmp_path / "rank.data"), entry, "x").tobytes() == array.tobytes()


def test_a_failed_write_is_a_storage_error_and_leaves_nothing(tmp_path: Path, monkeypatch) -> None:
    """Arrays are written by the writer thread: its failure (a full disk) surfaces at the next add or the commit,
    naming the file, and the final name never appears."""
    path = tmp_path / "rank.data"
    writer = ArrayFileWriter(str(path))
    writer.add(np.arange(10))

    def full_disk(self, padding, data, end):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(ArrayFileWriter, "_write", full_disk)
    writer.add(np.arange(1000))  # in flight: fails on the writer thread
    with pytest.raises(StorageError, match=f"checkpoint file '{path}': write failed: .*No space left on device"):
        writer.commit()
    assert os.listdir(tmp_path) == []


def test_read_ahead_hints_ignore_malformed_entries_and_missing_files(tmp_path: Path) -> None:
    path = tmp_path / "rank.data"
    entry = write(path, np.arange(10))[0]
    will_read(str(path), [entry, None, {"offset": -1, "nbytes": 5}, {"offset": "0", "nbytes": 1}, {}])
    will_read(str(tmp_path / "missing.data"), [entry])
    will_read(str(tmp_path), [entry])  # a directory: not a regular file


def test_foreign_file_and_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "rank.data"
    entry = write(path, np.arange(4))[0]
    path.write_bytes(b"not a checkpoint" + bytes(100))
    with pytest.raises(StorageError, match="bad header"):
        read_array(str(path), entry, "ids")
    path.unlink()
    with pytest.raises(StorageError, match=f"'{path}': cannot read ids"):
        read_array(str(path), entry, "ids")


def test_only_numeric_dtypes(tmp_path: Path) -> None:
    with ArrayFileWriter(str(tmp_path / "rank.data")) as writer:
        with pytest.raises(StorageError, match="dtype object"):
            writer.add(np.array([{"a": 1}], dtype=object))
    entry = write(tmp_path / "ok.data", np.arange(4))[0]
    with pytest.raises(StorageError, match="inconsistent"):
        read_array(str(tmp_path / "ok.data"), {**entry, "dtype": "|O"}, "ids")


def test_json_round_trip_and_damage(tmp_path: Path) -> None:
    path = tmp_path / "metadata.json"
    assert read_json(str(path)) is None
    write_json(str(path), {"a": [1, 2], "b": {"c": "d"}})
    assert read_json(str(path)) == {"a": [1, 2], "b": {"c": "d"}}
    assert os.listdir(tmp_path) == ["metadata.json"]
    os.truncate(path, 5)
    with pytest.raises(StorageError, match=f"'{path}' cannot be read as JSON"):
        read_json(str(path))
