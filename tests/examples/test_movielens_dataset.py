"""The MovieLens loader: atomic-file parsing, reading from the cached wheel, and its errors (no network)."""

import subprocess
import zipfile

import pytest
import torch

from torchrec_ascend.datasets import movielens
from torchrec_ascend.datasets.movielens import Interactions, load_movielens_100k, parse_inter_file
from torchrec_ascend.errors import StorageError

HEADER = "user_id:token\titem_id:token\trating:float\ttimestamp:float"
ROWS = [(196, 242, 3, 881250949), (186, 302, 3, 891717742), (196, 377, 1, 878887116)]


def inter_text(rows=ROWS, header=HEADER) -> str:
    return header + "\n" + "".join("\t".join(map(str, row)) + "\n" for row in rows)


def test_parse_matches_rows():
    data = parse_inter_file(inter_text())
    assert data.user.tolist() == [r[0] for r in ROWS]
    assert data.item.tolist() == [r[1] for r in ROWS]
    assert data.rating.tolist() == [float(r[2]) for r in ROWS]
    assert data.timestamp.tolist() == [float(r[3]) for r in ROWS]
    assert (data.user.dtype, data.item.dtype, data.rating.dtype) == (torch.int64, torch.int64, torch.float32)
    assert (len(data), data.num_users, data.num_items, data.max_item_id) == (3, 2, 3, 377)


def test_parse_column_order_and_extra_columns():
    header = "timestamp:float\tlabel:token\titem_id:token\trating:float\tuser_id:token"
    text = header + "\n5\tx\t7\t4.5\t2\n"
    data = parse_inter_file(text)
    assert (data.user.item(), data.item.item(), data.rating.item(), data.timestamp.item()) == (2, 7, 4.5, 5.0)


def test_chronological_is_stable():
    data = Interactions(torch.tensor([1, 2, 3]), torch.tensor([10, 20, 30]), torch.ones(3),
                        torch.tensor([5.0, 1.0, 5.0], dtype=torch.float64))
    assert data.chronological().item.tolist() == [20, 10, 30]


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("", "empty"),
        ("user_id:token\titem_id:token\trating:float\n1\t2\t3\n", "lacks column(s) ['timestamp']"),
        (inter_text() + "1\t2\t3\n", "line 5: 3 fields"),
        (inter_text([(1, -2, 3, 4)]), "line 2, column 'item_id': '-2' is not a non-negative integer ID"),
        (inter_text([(1, 2, 3, 4), ("u1", 2, 3, 4)]), "line 3, column 'user_id': 'u1'"),
        (inter_text([(1, 2, "five", 4)]), "line 2, column 'rating': 'five' is not a number"),
    ],
)
def test_parse_errors_name_file_line_and_column(text, fragment):
    with pytest.raises(StorageError, match="demo.inter") as info:
        parse_inter_file(text, source="demo.inter")
    assert fragment in str(info.value)


def write_wheel(folder, text):
    with zipfile.ZipFile(folder / movielens.RECBOLE_WHEEL, "w") as archive:
        archive.writestr(movielens.ML100K_INTER, text)


def test_loads_from_cached_wheel_argument_and_env(tmp_path, monkeypatch):
    write_wheel(tmp_path, inter_text())
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: pytest.fail("must not download when cached"))
    assert load_movielens_100k(tmp_path).item.tolist() == [242, 302, 377]
    monkeypatch.setenv(movielens.DATA_ENV, str(tmp_path))
    assert movielens.default_cache_dir() == tmp_path
    assert len(load_movielens_100k()) == 3


def test_download_failure_says_where_to_put_the_wheel(tmp_path, monkeypatch):
    failed = subprocess.CompletedProcess([], returncode=1, stdout="", stderr="ERROR: no network")
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: failed)
    with pytest.raises(StorageError) as info:
        load_movielens_100k(tmp_path / "cache")
    message = str(info.value)
    assert "no network" in message and str(tmp_path / "cache" / movielens.RECBOLE_WHEEL) in message
    assert not list((tmp_path / "cache").iterdir()), "the staging folder must be cleaned up"


def test_corrupt_wheel_is_reported(tmp_path):
    (tmp_path / movielens.RECBOLE_WHEEL).write_bytes(b"not a zip")
    with pytest.raises(StorageError, match="Delete the file"):
        load_movielens_100k(tmp_path)
