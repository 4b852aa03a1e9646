"""The checkpoint directory: one subdirectory per save, complete once its metadata file is renamed into place.

Layout of a checkpoint path::

    path/
      save-00000001/        a full save
        rank-00000-of-00002.data
        rank-00001-of-00002.data
        metadata.json       written last, atomically: the save exists only once this file does
      save-00000002/        an incremental save: the rows changed since save 1 (its metadata names the chain)

A save killed at any point leaves a subdirectory without ``metadata.json``: loads ignore it, the next save removes
it, and the previous complete save is untouched. One writer per path at a time.

Example::

    for info in complete_versions("/ckpt"):
        print(info.version, info.kind, info.chain)
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
import shutil
from typing import Any, Dict, List, Optional, Tuple

from torchrec_ascend.checkpoint.files import FORMAT_VERSION, confined, fsync_directory, read_json
from torchrec_ascend.checkpoint.schema import check_files, check_metadata
from torchrec_ascend.errors import StorageError

logger = logging.getLogger(__name__)

FORMAT = "torchrec_ascend.checkpoint"
METADATA = "metadata.json"
_SAVE_DIR = re.compile(r"^save-(\d{8})$")


@dataclasses.dataclass(frozen=True)
class CheckpointInfo:
    """One complete save in a checkpoint path.

    Attributes:
        path: the save's directory.
        version: its number in the path (1, 2, ...).
        kind: ``"full"`` or ``"incremental"``.
        chain: the versions a load reads, the full save first, this one last.
        world_size: ranks that wrote it.
        id: a unique identifier (incremental saves check that the model was last saved to or loaded from it).
        created: seconds since the epoch.
    """

    path: str
    version: int
    kind: str
    chain: Tuple[int, ...]
    world_size: int
    id: str
    created: float

    @classmethod
    def of(cls, directory: str, metadata: Dict[str, Any]) -> "CheckpointInfo":
        return cls(
            path=directory,
            version=int(metadata["version"]),
            kind=str(metadata["kind"]),
            chain=tuple(int(v) for v in metadata["chain"]),
            world_size=int(metadata["world_size"]),
            id=str(metadata["id"]),
            created=float(metadata["created"]),
        )


def save_directory(root: str, version: int) -> str:
    """The directory of save ``version`` under ``root``.

    Example::

        save_directory("/ckpt", 3)   # '/ckpt/save-00000003'
    """
    return os.path.join(root, f"save-{version:08d}")


def all_versions(root: str) -> List[int]:
    """Every save number under ``root``, complete or not, ascending (none if ``root`` does not exist).

    Example::

        all_versions("/ckpt")   # [1, 2, 3]
    """
    try:
        names = os.listdir(root)
    except FileNotFoundError:
        return []
    return sorted(int(m.group(1)) for m in map(_SAVE_DIR.match, names) if m)


def read_metadata(root: str, version: int) -> Optional[Dict[str, Any]]:
    """The metadata of save ``version``, or None if that save is incomplete (no metadata file).

    Raises:
        StorageError: the metadata file is corrupted or of an unknown format version.

    Example::

        read_metadata("/ckpt", 3) is None   # save 3 was interrupted
    """
    directory = confined(root, os.path.basename(save_directory(root, version)), "a save folder")
    path = confined(directory, METADATA, "the metadata")
    metadata = read_json(path)
    if metadata is None:
        return None
    if metadata.get("format") != FORMAT or not isinstance(metadata.get("format_version"), int):
        raise StorageError(f"checkpoint file '{path}' is not a torchrec-ascend checkpoint's metadata")
    if metadata["format_version"] > FORMAT_VERSION:
        raise StorageError(
            f"checkpoint file '{path}' has format version {metadata['format_version']}; this torchrec-ascend reads up "
            f"to {FORMAT_VERSION}: upgrade torchrec-ascend to load it"
        )
    check_metadata(path, metadata, version)
    return metadata


def complete_versions(root: str) -> List[CheckpointInfo]:
    """Every complete save under ``root``, oldest first.

    Raises:
        StorageError: a save's metadata file is corrupted.
    """
    out = []
    for version in all_versions(root):
        metadata = read_metadata(root, version)
        if metadata is not None:
            out.append(CheckpointInfo.of(save_directory(root, version), metadata))
    return out


def resolve_chain(root: str, version: Optional[int] = None) -> List[Tuple[str, Dict[str, Any]]]:
    """``(directory, metadata)`` of every save a load of ``version`` (default: the latest complete one) reads.

    Raises:
        StorageError: no complete save, the requested one is missing or incomplete, a save of its chain is
            missing, or a metadata file is corrupted.

    Example::

        for directory, metadata in resolve_chain("/ckpt"):   # the full save first
            print(directory, metadata["kind"])
    """
    if version is None:
        for candidate in reversed(all_versions(root)):
            if read_metadata(root, candidate) is not None:
                version = candidate
                break
        else:
            raise StorageError(f"checkpoint path '{root}' holds no complete save; save one first (Saver.save)")
    target = read_metadata(root, version)
    if target is None:
        raise StorageError(
            f"checkpoint path '{root}': save {version} does not exist or is incomplete (no {METADATA}); complete "
            f"saves: {[info.version for info in complete_versions(root)]}"
        )
    chain = []
    for link in target["chain"]:
        metadata = target if link == version else read_metadata(root, link)
        if metadata is None:
            raise StorageError(
                f"checkpoint path '{root}': save {version} is an increment over save {link}, which is missing or "
                "incomplete; load an earlier full save"
            )
        directory = save_directory(root, link)
        check_files(directory, metadata)
        chain.append((directory, metadata))
    return chain


def begin_save(root: str) -> Tuple[int, Optional[CheckpointInfo]]:
    """Prepare a new save under ``root``: remove incomplete saves, create the next save's directory.

    Returns:
        Tuple[int, Optional[CheckpointInfo]]: the new save's version, and the latest complete save (None if there
        is none or its metadata is unreadable: the new save is then full).

    Raises:
        StorageError: ``root`` cannot be created or written.

    Example::

        version, latest = begin_save("/ckpt")   # (4, CheckpointInfo(version=3, ...))
    """
    try:
        os.makedirs(root, exist_ok=True)
        latest: Optional[CheckpointInfo] = None
        versions = all_versions(root)
        for version in reversed(versions):
            try:
                metadata = read_metadata(root, version)
            except StorageError as error:
                logger.warning("checkpoint: %s; the next save will be a full one", error)
                break
            if metadata is not None:
                latest = CheckpointInfo.of(save_directory(root, version), metadata)
                break
            shutil.rmtree(save_directory(root, version))  # an interrupted save: never loadable, never needed
        versions = all_versions(root)
        version = (versions[-1] if versions else 0) + 1
        os.makedirs(save_directory(root, version))
    except OSError as error:
        raise StorageError(f"checkpoint path '{root}': cannot prepare a new save: {error}") from error
    fsync_directory(root)
    return version, latest
