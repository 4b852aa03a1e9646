"""Checkpoint files: arrays read back byte for byte, atomic writes, and damage reported as StorageError naming the
file. Oracle: the arrays written (compared as bytes, so NaN payloads count)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from torchrec_ascend.checkpoint.files import ArrayFileWriter, read_array, read_json, write_json
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
