"""Saver: save and load a sharded model's hash and KEY_VALUE tables, full or incremental, at any world size.

RecSDK users know ``Saver(rank).save(module, path, incremental=False)``; this is that, for a model sharded by stock
DistributedModelParallel. Every rank calls ``save`` / ``load`` together (they are collective). A save writes one
data file per rank, then rank 0 writes the save's metadata, which makes it complete (see
:mod:`~torchrec_ascend.checkpoint.versions`); a load reads the latest complete save (or a given version) and its
increments, exactly when the layout is unchanged and resharding otherwise (see
:mod:`~torchrec_ascend.checkpoint.restore`).

Incremental saves write the rows changed since the previous save of the same model in the same path: rows used by
training since then, rows that left a KEY_VALUE cache, IDs a FUSED table dropped. A load replays the full save and
its increments. An incremental save is written as a full one (with a warning) when there is nothing to build on:
no save in the path yet, the model's last save or exact load was another one, or a table was resharded at load.

Save between training steps, with no batch in flight in a pipeline (drain or detach it first). With several
hosts, ``path`` must be on a filesystem every rank sees (a load reads the files of the ranks that own its IDs). Pass
``process_group`` when the model is sharded over another group than the default one.

Example::

    saver = Saver()
    saver.save(dmp, "/ckpt")                     # full
    saver.save(dmp, "/ckpt", incremental=True)   # rows changed since
    info = Saver().load(new_dmp, "/ckpt")        # the latest save, any world size
"""

from __future__ import annotations

import logging
import os
import time
import uuid
from typing import Any, Dict, List, Optional

import torch

from torchrec_ascend.checkpoint.collectives import Group
from torchrec_ascend.checkpoint.files import FORMAT_VERSION, ArrayFileWriter, write_json
from torchrec_ascend.checkpoint.layout import ShardLayout
from torchrec_ascend.checkpoint.restore import LocalShard, Restore, apply_restores, discard_restores, read_restores
from torchrec_ascend.checkpoint.shard_files import write_shard
from torchrec_ascend.checkpoint.versions import (
    FORMAT,
    METADATA,
    CheckpointInfo,
    begin_save,
    complete_versions,
    resolve_chain,
    save_directory,
)
from torchrec_ascend.errors import ConfigError
from torchrec_ascend.kernels.fused import HashRows
from torchrec_ascend.kernels.walk import sharded_kernels
from torchrec_ascend.native.memory import no_numpy_huge_pages, reused_buffers

logger = logging.getLogger(__name__)


class Saver:
    """Saves and loads the tables torchrec-ascend's kernels hold: hash tables (FUSED or KEY_VALUE) and plain
    KEY_VALUE tables, with their IDs, weights, optimizer state, policy state and counters, from every tier.

    Args:
        rank: optional, as in RecSDK's ``Saver(rank)``: checked against this process's rank in the group.
        process_group: the ranks that save and load together; default: torch.distributed's default group when it
            is initialised, else this process alone.

    Example::

        saver = Saver()
        info = saver.save(dmp, "/ckpt", incremental=step % 1000 != 0)
        saver.load(dmp, "/ckpt")
    """

    def __init__(self, rank: Optional[int] = None, process_group: Optional[Any] = None) -> None:
        self.rank = rank
        self.process_group = process_group

    @no_numpy_huge_pages()
    @reused_buffers()  # the disk tier is read block after block: into memory faulted in once
    def save(self, model: torch.nn.Module, path: str, incremental: bool = False) -> CheckpointInfo:
        """Save the model's tables as a new version under ``path`` (collective: every rank calls it).

        Args:
            model: the sharded model (DistributedModelParallel, or a module holding sharded collections).
            path: the checkpoint path (a directory; created if missing).
            incremental: write only what changed since the model's previous save in ``path`` (falls back to a full
                save, with a warning, when there is none to build on).

        Returns:
            CheckpointInfo: the new save.

        Raises:
            ConfigError: the model holds no hash or KEY_VALUE table, two sharded modules use the same table name,
                or ``rank`` does not match.
            StorageError: a file cannot be written; the previous saves stay loadable.
        """
        group = self._group()
        shards = _collect(group, model)
        version, latest, token = group.from_rank0(
            "preparing the save directory", lambda: (*begin_save(path), uuid.uuid4().hex)
        )
        blockers = group.all_gather(_increment_blocker(shards, latest) if incremental else None)
        reasons = [b for b in blockers if b]
        changed_only = incremental and not reasons
        if incremental and reasons:
            logger.warning("checkpoint: save %d under '%s' is written in full: %s", version, path, reasons[0])
        directory = save_directory(path, version)
        written: Optional[Dict[str, Any]] = None
        error: Optional[BaseException] = None
        try:
            written = _write_rank_file(directory, group, shards, changed_only)
        except Exception as err:  # every rank must learn of it before raising
            error = err
        group.agree("writing the data files", error)
        files = group.all_gather(written)
        metadata = {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "id": token,
            "version": version,
            "kind": "incremental" if changed_only else "full",
            "chain": [*latest.chain, version] if changed_only and latest else [version],
            "world_size": group.size,
            "created": time.time(),
            "files": {f["file"]: f["bytes"] for f in files},
            "shards": [shard for f in files for shard in f["shards"]],
        }
        group.from_rank0("writing the metadata", lambda: _commit(directory, metadata))
        for kernel, t, _ in shards:
            kernel.slot_table(t).mark_checkpoint(token)
        return CheckpointInfo.of(directory, metadata)

    @no_numpy_huge_pages()  # reused_buffers while the blocks are read (CheckedChain), not beyond
    def load(
        self, model: torch.nn.Module, path: str, version: Optional[int] = None, strict: bool = True
    ) -> CheckpointInfo:
        """Load the model's tables from ``path`` (collective: every rank calls it).

        Args:
            model: the sharded model, built as when it was saved (tables, dimensions, optimizer); its world size,
                sharding types, capacities, kernels and policies may differ.
            path: the checkpoint path.
            version: the save to load (see :meth:`versions`); default: the latest complete one.
            strict: every table of the model must be in the checkpoint and every table of the checkpoint in the
                model; with False, missing tables keep their state and extra ones are ignored (with a warning).

        Returns:
            CheckpointInfo: the save loaded.

        Raises:
            ConfigError: tables missing (``strict``), or saved with another dimension or optimizer.
            StorageError: no complete save, or a file is missing, truncated or corrupted (the message names it).
            CapacityError: a FUSED shard cannot hold the IDs it now owns (raise num_embeddings or use more ranks).
        """
        group = self._group()
        shards = _collect(group, model)
        chain = group.from_rank0("reading the metadata", lambda: resolve_chain(path, version))
        directory, final = chain[-1]
        in_model = set().union(*group.all_gather({layout.table for _, _, layout in shards}))
        extra = sorted({entry["layout"]["table"] for entry in final["shards"]} - in_model)
        if extra and strict:
            raise ConfigError(
                f"the checkpoint at '{directory}' holds tables {extra} that the model does not have; load with "
                "strict=False to ignore them"
            )
        if extra:
            logger.warning("checkpoint at '%s': tables %s are not in the model and were not loaded", directory, extra)
        restores: List[Restore] = []
        error: Optional[BaseException] = None
        try:
            restores = read_restores(shards, chain, strict)  # every file read and checked, nothing applied yet
        except Exception as err:  # every rank must learn of it before raising
            error = err
        try:
            group.agree("reading the checkpoint", error)
        except BaseException:
            discard_restores(restores)  # another rank failed: nothing may stay loaded here either
            raise
        exact: List[bool] = []
        try:
            exact = apply_restores(shards, restores)
        except Exception as err:  # every rank must learn of it before raising
            error = err
        group.agree("restoring the tables", error)
        for (kernel, t, _), same in zip(shards, exact):
            if same:
                kernel.slot_table(t).mark_checkpoint(final["id"])
        return CheckpointInfo.of(directory, final)

    @staticmethod
    def versions(path: str) -> List[CheckpointInfo]:
        """The complete saves under ``path``, oldest first (incomplete ones, from interrupted saves, are not listed).

        Raises:
            StorageError: a save's metadata file is corrupted.
        """
        return complete_versions(path)

    def _group(self) -> Group:
        group = Group(self.process_group)
        if self.rank is not None and self.rank != group.rank:
            raise ConfigError(
                f"Saver(rank={self.rank}) runs on rank {group.rank} of its process group; pass this process's rank "
                "(or none)"
            )
        return group


def local_shards(model: torch.nn.Module) -> List[LocalShard]:
    """``(kernel, table index, layout)`` of every hash or KEY_VALUE table shard of ``model`` on this rank.

    Raises:
        ConfigError: two shards on this rank claim the same table, columns and rows (two sharded modules use the
            same table name: checkpoints identify tables by name).

    Example::

        for kernel, t, layout in local_shards(dmp):
            print(layout.table, layout.col0, layout.bucket, kernel.slot_table(t).stats()["size"])
    """
    shards: List[LocalShard] = [
        (kernel, t, ShardLayout.of(kernel.shard_info(t)))
        for kernel in sharded_kernels(model)
        if isinstance(kernel, HashRows)
        for t in range(kernel.num_tables)
    ]
    seen: Dict[Any, str] = {}
    for _, _, layout in shards:
        key = (layout.table, layout.col0, layout.block)
        if key in seen:
            raise ConfigError(
                f"two sharded modules hold a table named {layout.table!r}; checkpoints identify tables by name, so "
                "give every table of the model its own name"
            )
        seen[key] = layout.table
    return shards


def _collect(group: Group, model: torch.nn.Module) -> List[LocalShard]:
    shards: List[LocalShard] = []
    error: Optional[BaseException] = None
    try:
        shards = local_shards(model)
    except Exception as err:  # every rank must learn of it before raising
        error = err
    group.agree("finding the tables", error)
    if sum(group.all_gather(len(shards))) == 0:
        raise ConfigError(
            f"{type(model).__name__} holds no hash or KEY_VALUE table sharded by DistributedModelParallel; the Saver "
            "covers those. Save other state with torch.distributed.checkpoint (see torchrec_ascend.checkpoint)"
        )
    return shards


def _increment_blocker(shards: List[LocalShard], latest: Optional[CheckpointInfo]) -> Optional[str]:
    """Why this rank cannot write an incremental save over ``latest`` (None if it can)."""
    if latest is None:
        return "the path holds no complete save to build on"
    for kernel, t, layout in shards:
        if kernel.slot_table(t).checkpoint_mark != latest.id:
            return (
                f"table {layout.table!r} was not last saved to, or loaded with its layout unchanged from, the latest "
                f"save ({latest.version})"
            )
    return None


def _write_rank_file(directory: str, group: Group, shards: List[LocalShard], changed_only: bool) -> Dict[str, Any]:
    name = f"rank-{group.rank:05d}-of-{group.size:05d}.data"
    with ArrayFileWriter(os.path.join(directory, name)) as writer:
        entries = []
        for kernel, t, layout in shards:
            blocks, removed = kernel.export_shard(t, changed_only)
            entries.append(write_shard(writer, layout, blocks, removed, kernel.shard_state(t)))
        size = writer.commit()
    return {"file": name, "bytes": size, "shards": entries}


def _commit(directory: str, metadata: Dict[str, Any]) -> None:
    """Check the save is consistent, then write its metadata: from this moment the save exists."""
    seen = set()
    for entry in metadata["shards"]:
        layout = entry["layout"]
        key = (layout["table"], layout["col0"], layout["bucket"], layout["buckets"], layout["row_offset"])
        if key in seen:
            raise ConfigError(
                f"two ranks saved the same shard of table {layout['table']!r}: two sharded modules use that name; give "
                "every table of the model its own name"
            )
        seen.add(key)
    write_json(os.path.join(directory, METADATA), metadata)
