"""Fuzzing the MovieLens reader: a cached RecBole wheel damaged byte by byte, or an interaction file of hostile
text, gives back exactly the interactions written or a StorageError naming the file; never another exception,
never a download, never a decompression beyond the size limit. Oracle: the rows written."""

from __future__ import annotations

import io
import subprocess
import tracemalloc
import zipfile
from pathlib import Path
from typing import Any, List, Tuple

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fuzz_inputs import EXAMPLES, damage_bytes
from torchrec_ascend.datasets import movielens
from torchrec_ascend.datasets.movielens import load_movielens_100k, parse_inter_file
from torchrec_ascend.errors import StorageError

FUZZ = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
HEADER = "user_id:token\titem_id:token\trating:float\ttimestamp:float"
ROWS = st.lists(st.tuples(st.integers(0, 2**63 - 1), st.integers(0, 2**63 - 1), st.integers(1, 5),
                          st.integers(0, 2**40)), min_size=1, max_size=20)


def inter_text(rows: List[Tuple[int, int, int, int]]) -> str:
    return HEADER + "\n" + "".join(f"{u}\t{i}\t{r}\t{t}\n" for u, i, r, t in rows)


def wheel_bytes(text: str, method: int) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=method) as archive:
        archive.writestr("recbole/__init__.py", "")
        archive.writestr(movielens.ML100K_INTER, text)
    return buffer.getvalue()


@pytest.fixture(autouse=True)
def no_download(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("the reader tried to download the wheel")
    monkeypatch.setattr(subprocess, "run", refuse)


@FUZZ
@given(rows=ROWS, method=st.sampled_from([zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED]),
       how=st.sampled_from(["truncate", "flip", "junk"]), position=st.integers(0, 2**16), bits=st.integers(0, 255))
def test_damaged_wheel(tmp_path: Path, rows: list, method: int, how: str, position: int, bits: int) -> None:
    wheel = tmp_path / movielens.RECBOLE_WHEEL
    wheel.write_bytes(damage_bytes(wheel_bytes(inter_text(rows), method), how, position, bits))
    tracemalloc.start()
    try:
        data = load_movielens_100k(tmp_path)
    except StorageError as error:
        assert str(wheel) in str(error), error
        return
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        assert peak <= 4 * movielens.MAX_INTER_BYTES, f"reading the wheel allocated {peak} bytes"
    assert [tuple(map(int, r)) for r in zip(data.user, data.item, data.rating, data.timestamp)] == rows


def test_member_claiming_a_huge_size_is_refused_before_decompressing(tmp_path: Path) -> None:
    data = bytearray(wheel_bytes(inter_text([(1, 2, 3, 4)]), zipfile.ZIP_DEFLATED))
    central = data.rfind(b"PK\x01\x02")  # the central directory entry of the last member: the interaction file
    data[central + 24:central + 28] = (2**32 - 1).to_bytes(4, "little")  # its uncompressed size: 4 GiB
    (tmp_path / movielens.RECBOLE_WHEEL).write_bytes(bytes(data))
    with pytest.raises(StorageError, match="says it holds 4294967295 bytes, more than the"):
        load_movielens_100k(tmp_path)


def test_cached_wheel_must_be_a_file_of_the_folder(tmp_path: Path) -> None:
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / movielens.RECBOLE_WHEEL).write_bytes(wheel_bytes(inter_text([(1, 2, 3, 4)]), 0))
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / movielens.RECBOLE_WHEEL).symlink_to(tmp_path / "elsewhere" / movielens.RECBOLE_WHEEL)
    with pytest.raises(StorageError, match="symbolic link leading out of the data cache folder"):
        load_movielens_100k(tmp_path / "cache")
    (tmp_path / "dir").mkdir()
    (tmp_path / "dir" / movielens.RECBOLE_WHEEL).mkdir()
    with pytest.raises(StorageError, match="is not a regular file"):
        load_movielens_100k(tmp_path / "dir")


@FUZZ
@given(text=st.text(alphabet=st.sampled_from(list("0123456789-+.eE\t\n :abnifINFuser_idtokenratingfloatstamp")),
                    max_size=200))
def test_hostile_text(text: str) -> None:
    try:
        data = parse_inter_file(HEADER + "\n" + text, source="x.inter")
    except StorageError as error:
        assert "x.inter" in str(error)
        return
    assert data.user.min() >= 0 and data.item.min() >= 0 if len(data) else True
    assert bool(data.rating.isfinite().all()) and bool(data.timestamp.isfinite().all())


@FUZZ
@given(rows=ROWS)
def test_written_rows_read_back(rows: list) -> None:
    data = parse_inter_file(inter_text(rows))
    assert [tuple(map(int, r)) for r in zip(data.user, data.item, data.rating, data.timestamp)] == rows
