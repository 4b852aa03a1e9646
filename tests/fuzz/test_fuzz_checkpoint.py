"""Fuzzing the checkpoint readers: a save chain damaged byte by byte (truncations, bit flips, junk) or with hostile
metadata (wrong types, huge and negative numbers, missing and extra keys, duplicated and shuffled entries, path
tricks with a real data file waiting outside the folder) is read exactly as written or refused with StorageError.
Never another exception, never more memory than the files hold, never a file outside the checkpoint folder.
Oracle: what ``fuzz_saves.write_chain`` wrote."""

from __future__ import annotations

import json
import shutil
import tracemalloc
from pathlib import Path
from typing import Any, Tuple

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from fuzz_inputs import EXAMPLES, HOSTILE_VALUES, OpenedFiles, damage_bytes, json_paths, mutate_json
from fuzz_saves import as_dict, assert_written, read_everything, write_chain
from torchrec_ascend.checkpoint.files import ArrayFileWriter, read_array
from torchrec_ascend.checkpoint.versions import METADATA, save_directory
from torchrec_ascend.errors import StorageError

FUZZ = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                          HealthCheck.too_slow])
SLACK = 1 << 20  # bytes a read may allocate beyond the file's size (interpreter and torch bookkeeping)
HOWS = st.sampled_from(["replace", "delete", "extra", "duplicate", "shuffle"])


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Tuple[Path, Any, Any]:
    """A written chain, what was written, and what the readers return from it untouched."""
    base = tmp_path_factory.mktemp("pristine")
    written = write_chain(base / "ckpt")
    return base, written, as_dict(read_everything(base / "ckpt"))


def fresh_copy(pristine: Tuple[Path, Any, Any], tmp: Path) -> Path:
    """A copy of the pristine chain in ``tmp/ckpt``, with a valid data file waiting outside it (``tmp/elsewhere``)
    for path tricks to reach."""
    if tmp.exists():
        shutil.rmtree(tmp)
    shutil.copytree(pristine[0] / "ckpt", tmp / "ckpt")
    (tmp / "elsewhere").mkdir()
    shutil.copy(Path(save_directory(str(tmp / "ckpt"), 1)) / "rank-00000-of-00002.data", tmp / "elsewhere")
    return tmp / "ckpt"


def read_guarded(root: Path) -> Tuple[Any, int]:
    """``read_everything(root)`` (or the StorageError it raised), checking it opened nothing outside ``root``;
    returns the result and the peak memory traced while reading."""
    tracemalloc.start()
    try:
        with OpenedFiles() as opened:
            try:
                result: Any = read_everything(root)
            except StorageError as error:
                result = error
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    outside = [p for p in opened.outside(str(root)) if not p.endswith((".py", ".pyc", ".so"))]
    assert not outside, f"a reader opened files outside the checkpoint folder: {outside}"
    return result, peak


def files_size(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


@FUZZ
@given(save=st.sampled_from([1, 2]), file=st.sampled_from(["rank-00000-of-00002.data", "rank-00001-of-00002.data",
                                                            METADATA]),
       how=st.sampled_from(["truncate", "flip", "junk"]), position=st.integers(0, 2**20), bits=st.integers(0, 255))
def test_damaged_bytes(pristine: Tuple[Path, Any, Any], tmp_path: Path, save: int, file: str, how: str,
                       position: int, bits: int) -> None:
    root = fresh_copy(pristine, tmp_path / "case")
    path = Path(save_directory(str(root), save)) / file
    path.write_bytes(damage_bytes(path.read_bytes(), how, position, bits))
    result, peak = read_guarded(root)
    assert peak <= files_size(root) + SLACK, f"reading allocated {peak} bytes"
    if not isinstance(result, StorageError):  # undamaged where it matters (padding, junk past the end, JSON spaces)
        assert as_dict(result) == pristine[2]
    else:
        assert str(path.parent) in str(result) or root.name in str(result), f"the error names no file: {result}"


@FUZZ
@given(save=st.sampled_from([1, 2]), pick=st.integers(0, 10**6), how=HOWS, value=HOSTILE_VALUES)
def test_hostile_metadata(pristine: Tuple[Path, Any, Any], tmp_path: Path, save: int, pick: int, how: str,
                          value: Any) -> None:
    root = fresh_copy(pristine, tmp_path / "case")
    path = Path(save_directory(str(root), save)) / METADATA
    metadata = json.loads(path.read_text())
    paths = json_paths(metadata)
    mutate_json(metadata, paths[pick % len(paths)], how, value)
    path.write_text(json.dumps(metadata))
    result, peak = read_guarded(root)
    assert peak <= files_size(root) + SLACK, f"reading allocated {peak} bytes"
    if isinstance(result, StorageError):
        assert "checkpoint" in str(result) and "'" in str(result), result
        return
    assert_written(result, pristine[1])
    if how in ("extra", "shuffle"):  # neutral for the records: same as read from the untouched chain
        assert as_dict(result) == pristine[2]


DTYPES = st.sampled_from([np.bool_, np.int8, np.uint16, np.int32, np.int64, np.float16, np.float32, np.float64])
ARRAYS = DTYPES.flatmap(lambda d: hnp.arrays(d, hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=6)))
FIELDS = st.sampled_from(["dtype", "shape", "offset", "nbytes", "crc32"])


@FUZZ
@given(arrays=st.lists(ARRAYS, min_size=1, max_size=3), damage=st.sampled_from(["none", "truncate", "flip", "junk"]),
       position=st.integers(0, 2**16), bits=st.integers(0, 255),
       entry_change=st.one_of(st.none(), st.tuples(FIELDS, HOSTILE_VALUES), st.tuples(FIELDS, st.just(None)),
                              st.tuples(st.just("grow"), st.integers(0, 2**40))))
def test_data_file_arrays(tmp_path: Path, arrays: list, damage: str, position: int, bits: int,
                          entry_change: Any) -> None:
    path = tmp_path / "rank-00000-of-00001.data"
    with ArrayFileWriter(str(path)) as writer:
        entries = [writer.add(a) for a in arrays]
        writer.commit()
    if damage != "none":
        path.write_bytes(damage_bytes(path.read_bytes(), damage, position, bits))
    size = path.stat().st_size
    for array, entry in zip(arrays, entries):
        if entry_change is not None and entry_change[0] == "grow":  # a consistent entry asking for up to 8 TiB
            n = entry_change[1]
            entry = {**entry, "shape": [n], "nbytes": n * np.dtype(entry["dtype"]).itemsize}
        elif entry_change is not None:
            field, value = entry_change
            entry = {k: v for k, v in entry.items() if k != field or value is not None}
            if value is not None:
                entry[field] = value
        tracemalloc.start()
        try:
            back = read_array(str(path), entry, "x")
        except StorageError as error:
            assert str(path) in str(error)
            continue
        finally:
            peak = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
        assert peak <= size + SLACK, f"read_array allocated {peak} bytes for a file of {size}"
        assert back.tobytes() == np.ascontiguousarray(array).tobytes()  # the bytes written, whatever the entry says
        assert back.flags.writeable and back.flags.owndata
