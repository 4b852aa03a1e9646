"""The checkpoint directory protocol: a save exists once its metadata does; interrupted saves are ignored by loads
and cleared by the next save; chains resolve to the full save and its increments."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List

import pytest

from torchrec_ascend.checkpoint.files import FORMAT_VERSION, write_json
from torchrec_ascend.checkpoint.versions import (
    FORMAT,
    METADATA,
    all_versions,
    begin_save,
    complete_versions,
    resolve_chain,
    save_directory,
)
from torchrec_ascend.errors import StorageError


def complete(root: Path, version: int, chain: List[int], **extra: Any) -> Dict[str, Any]:
    metadata = {"format": FORMAT, "format_version": FORMAT_VERSION, "id": f"id{version}", "version": version,
                "kind": "full" if len(chain) == 1 else "incremental", "chain": chain, "world_size": 1,
                "created": 0.0, "files": {}, "shards": [], **extra}
    write_json(str(Path(save_directory(str(root), version)) / METADATA), metadata)
    return metadata


def test_versions_and_interrupted_saves(tmp_path: Path) -> None:
    root = tmp_path / "ckpt"
    version, latest = begin_save(str(root))
    assert (version, latest) == (1, None)
    complete(root, 1, [1])
    version, latest = begin_save(str(root))
    assert version == 2 and latest is not None and latest.id == "id1"
    junk = Path(save_directory(str(root), 2)) / "rank-00000-of-00001.data"
    junk.write_bytes(b"half a file")  # save 2 is interrupted here
    assert [info.version for info in complete_versions(str(root))] == [1]
    assert [d for d, _ in resolve_chain(str(root))] == [save_directory(str(root), 1)]
    version, latest = begin_save(str(root))
    assert version == 2 and latest.version == 1 and not junk.exists()
    assert all_versions(str(root)) == [1, 2]


def test_chain_of_increments(tmp_path: Path) -> None:
    for version in (1, 2, 3):
        Path(save_directory(str(tmp_path), version)).mkdir()
    complete(tmp_path, 1, [1])
    complete(tmp_path, 2, [1, 2])
    complete(tmp_path, 3, [1, 2, 3])
    assert [m["version"] for _, m in resolve_chain(str(tmp_path))] == [1, 2, 3]
    assert [m["version"] for _, m in resolve_chain(str(tmp_path), version=2)] == [1, 2]


def test_chain_errors(tmp_path: Path) -> None:
    with pytest.raises(StorageError, match="holds no complete save"):
        resolve_chain(str(tmp_path))
    for version in (1, 2):
        Path(save_directory(str(tmp_path), version)).mkdir()
    complete(tmp_path, 2, [1, 2])
    with pytest.raises(StorageError, match="increment over save 1, which is missing"):
        resolve_chain(str(tmp_path))
    with pytest.raises(StorageError, match="save 7 does not exist"):
        resolve_chain(str(tmp_path), version=7)


def test_unknown_format_version_is_refused(tmp_path: Path) -> None:
    Path(save_directory(str(tmp_path), 1)).mkdir()
    complete(tmp_path, 1, [1], format_version=FORMAT_VERSION + 1)
    with pytest.raises(StorageError, match="upgrade torchrec-ascend"):
        resolve_chain(str(tmp_path))
