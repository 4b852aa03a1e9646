"""Crafted checkpoints are refused before anything is read: file names that leave the save's folder (``../``,
absolute paths, symbolic links out), files that are not regular files (a FIFO would block), arrays that claim more
bytes than their file holds, repeated shards, data files of another size than recorded. Each is a StorageError
naming the file. Oracle: the save written by ``tests/fuzz/fuzz_saves.py`` reads back exactly when left alone."""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
from pathlib import Path
from typing import Any, Callable, Dict, Iterator

import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "fuzz"))
from fuzz_saves import as_dict, read_everything, write_chain
from torchrec_ascend.checkpoint.files import read_array
from torchrec_ascend.checkpoint.versions import METADATA, save_directory
from torchrec_ascend.errors import StorageError

RANK1 = "rank-00001-of-00002.data"


@pytest.fixture
def ckpt(tmp_path: Path) -> Iterator[Path]:
    write_chain(tmp_path / "ckpt")
    (tmp_path / "elsewhere").mkdir()
    yield tmp_path / "ckpt"


def save2(root: Path) -> Path:
    return Path(save_directory(str(root), 2))


def edit_metadata(root: Path, change: Callable[[Dict[str, Any]], None]) -> None:
    path = save2(root) / METADATA
    metadata = json.loads(path.read_text())
    change(metadata)
    path.write_text(json.dumps(metadata))


def refused(root: Path, fragment: str) -> str:
    with pytest.raises(StorageError) as error:
        read_everything(root)
    assert fragment in str(error.value), str(error.value)
    return str(error.value)


def test_untouched_chain_reads_back(ckpt: Path) -> None:
    assert sum(len(rows) for rows in as_dict(read_everything(ckpt)).values()) == 2 * 2 * (6 - 1)


@pytest.mark.parametrize("name", ["../../elsewhere/" + RANK1, "/ELSEWHERE/" + RANK1, "..", "sub/" + RANK1])
def test_names_leaving_the_folder_are_refused(ckpt: Path, name: str) -> None:
    # the reproduction: the data file moved to a sibling folder, the metadata pointing there
    shutil.move(str(save2(ckpt) / RANK1), str(ckpt.parent / "elsewhere" / RANK1))
    name = name.replace("/ELSEWHERE", str(ckpt.parent / "elsewhere"))

    def point_away(metadata: Dict[str, Any]) -> None:
        metadata["files"][name] = metadata["files"].pop(RANK1)
        for shard in metadata["shards"]:
            if shard["file"] == RANK1:
                shard["file"] = name

    edit_metadata(ckpt, point_away)
    message = refused(ckpt, "which is not a plain file name of the folder")
    assert str(save2(ckpt)) in message


def test_shard_naming_a_file_outside_the_files_list_is_refused(ckpt: Path) -> None:
    edit_metadata(ckpt, lambda m: m["shards"][0].update(file="../save-00000001/" + RANK1))
    refused(ckpt, "which its files list does not hold")


def test_symbolic_link_out_of_the_folder_is_refused(ckpt: Path) -> None:
    outside = ckpt.parent / "elsewhere" / RANK1
    shutil.move(str(save2(ckpt) / RANK1), str(outside))
    (save2(ckpt) / RANK1).symlink_to(outside)
    message = refused(ckpt, "is a symbolic link leading out of its folder")
    assert str(save2(ckpt) / RANK1) in message


def test_symbolic_link_inside_the_folder_is_followed(ckpt: Path) -> None:
    before = as_dict(read_everything(ckpt))
    os.rename(save2(ckpt) / RANK1, save2(ckpt) / "moved.data")
    (save2(ckpt) / RANK1).symlink_to("moved.data")
    assert as_dict(read_everything(ckpt)) == before


def test_save_folder_linked_elsewhere_is_refused(ckpt: Path) -> None:
    shutil.move(str(save2(ckpt)), str(ckpt.parent / "elsewhere" / "save-00000002"))
    save2(ckpt).symlink_to(ckpt.parent / "elsewhere" / "save-00000002")
    refused(ckpt, "(a save folder) is a symbolic link leading out of its folder")


def test_fifo_instead_of_a_data_file_does_not_block(ckpt: Path) -> None:
    entry = json.loads((save2(ckpt) / METADATA).read_text())["shards"][-1]["arrays"]["removed"]
    os.remove(save2(ckpt) / RANK1)
    os.mkfifo(save2(ckpt) / RANK1)
    previous = signal.signal(signal.SIGALRM, lambda *_: pytest.fail("reading a FIFO blocked"))
    signal.alarm(20)
    try:
        refused(ckpt, "is not a regular file")
        with pytest.raises(StorageError, match="is not a regular file"):
            read_array(str(save2(ckpt) / RANK1), entry, "removed")
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def test_array_claiming_more_than_its_file_is_refused_before_reading(ckpt: Path) -> None:
    def grow(metadata: Dict[str, Any]) -> None:
        rows = metadata["shards"][0]["blocks"][0]["rows"]
        n = 2**40
        rows["shape"], rows["nbytes"] = [n, rows["shape"][1]], n * rows["shape"][1] * 4

    edit_metadata(ckpt, grow)
    refused(ckpt, "lie beyond its data file's")


def test_repeated_shard_is_refused(ckpt: Path) -> None:
    edit_metadata(ckpt, lambda m: m["shards"].append(m["shards"][0]))
    refused(ckpt, "repeats a shard of table")


def test_data_file_of_another_size_is_refused(ckpt: Path) -> None:
    with open(save2(ckpt) / RANK1, "ab") as f:
        f.write(b"\0" * 64)
    message = refused(ckpt, "but its save recorded")
    assert str(save2(ckpt) / RANK1) in message


@pytest.mark.parametrize("change, fragment", [
    (lambda m: m.update(chain=[2]), "does not match its chain"),
    (lambda m: m.update(chain=[0, 2]), "is not ascending save numbers"),
    (lambda m: m.update(chain=["1", 2]), "is not ascending save numbers"),
    (lambda m: m.update(version=True), "the field 'version' is a bool, not a int"),
    (lambda m: m.update(world_size=-2), "world_size -2 is not a positive int"),
    (lambda m: m.pop("shards"), "lacks the field 'shards'"),
    (lambda m: m["shards"][0]["layout"].update(cols=10**30), "not a non-negative int"),
    (lambda m: m["shards"][0]["layout"].update(states=["shape:[1e9]"]), "optimizer state kind"),
    (lambda m: m["shards"][0]["state"].update(step=-1), "state 'step' is -1"),
    (lambda m: m["shards"][0]["arrays"]["removed"].update(dtype="|O"), "is not a plain numeric dtype"),
    (lambda m: m["shards"][0]["blocks"][0]["ids"].update(dtype="<f8"), "ids must be int64"),
])
def test_hostile_fields_are_named(ckpt: Path, change: Callable[[Dict[str, Any]], None], fragment: str) -> None:
    edit_metadata(ckpt, change)
    message = refused(ckpt, fragment)
    assert str(save2(ckpt) / METADATA) in message
