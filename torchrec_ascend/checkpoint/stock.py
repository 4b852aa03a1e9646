"""The stock-checkpoint side: FUSED hash tables in ``state_dict()``, and a ``state_dict()`` without the Saver's tables.

A sharded FUSED hash table's pool rows mean nothing without its ID map, so its ``state_dict()`` entry
``<prefix>.<table>.weight`` comes with ``<prefix>.<table>.weight_id`` (TorchRec's name for the IDs of a dynamic
table's rows): int64 ``[num_embeddings, column shards]``, the ID each weight row holds (-1: free), sharded like
the weight's rows. Stock ``load_state_dict()`` and ``torch.distributed.checkpoint`` (DCP) then round-trip the
table with the same sharding plan; DCP may also move a table to a layout without hash placement (e.g. row_wise ->
table_wise). A load that would put an ID on a shard that does not own it (another world size or
row-wise split) raises a :class:`~torchrec_ascend.errors.ConfigError` naming the table: reshard with the
:class:`~torchrec_ascend.checkpoint.Saver`. The table's policy state comes through ``fused_optimizer.state_dict()``
(:mod:`~torchrec_ascend.checkpoint.policy_state`) and is applied with its IDs.

:func:`dense_state_dict` gives what stock DCP should carry when the Saver carries the tables: ``state_dict()``
without hash tables and KEY_VALUE tables; load it back with ``load_state_dict(..., strict=False)``.

Example::

    import torch.distributed.checkpoint as dcp

    dcp.save({"model": dmp.state_dict()}, checkpoint_id="/ckpt/all")          # FUSED hash tables included
    state = {"model": dmp.state_dict()}
    dcp.load(state, checkpoint_id="/ckpt/all")
    dmp.load_state_dict(state["model"])

    dcp.save({"model": dense_state_dict(dmp)}, checkpoint_id="/ckpt/dense")   # with the Saver for the tables
"""

from __future__ import annotations

import re
from typing import Any, Dict, List, Set, Tuple

import torch
from torch.distributed._shard.sharded_tensor import Shard, ShardedTensor

from torchrec_ascend.checkpoint.layout import ShardLayout
from torchrec_ascend.checkpoint.policy_state import restore_pool, take_loaded
from torchrec_ascend.checkpoint.sharded import column_offsets, id_metadata, id_shard
from torchrec_ascend.errors import ConfigError
from torchrec_ascend.kernels.fused import HashRows
from torchrec_ascend.kernels.key_value.kernel import KeyValueRows
from torchrec_ascend.kernels.walk import sharded_kernels

#: The state_dict entry next to a FUSED hash table's ``weight``: the ID each weight row holds.
WEIGHT_ID = "weight_id"


def saver_keys(model: torch.nn.Module) -> Set[str]:
    """The keys of ``model.state_dict()`` that hold tables the Saver covers (hash tables, KEY_VALUE tables).

    Example::

        assert "ebc.embedding_bags.user.weight" in saver_keys(dmp)
    """
    names = {
        kernel.shard_info(t).name
        for kernel in sharded_kernels(model)
        if isinstance(kernel, HashRows)
        for t in range(kernel.num_tables)
    }
    if not names:
        return set()
    tables = "|".join(map(re.escape, names))
    pattern = re.compile(r"(^|\.)(embedding_bags|embeddings)\.(" + tables + r")\.(weight|" + WEIGHT_ID + ")$")
    return {key for key in model.state_dict() if pattern.search(key)}


def dense_state_dict(model: torch.nn.Module) -> Dict[str, Any]:
    """``model.state_dict()`` without the Saver's tables: dense parameters, buffers and plain FUSED tables.

    Returns:
        Dict[str, Any]: for DCP (``dcp.save`` / ``dcp.load``), then ``model.load_state_dict(..., strict=False)``.

    Example::

        dcp.save({"model": dense_state_dict(dmp)}, checkpoint_id="/ckpt/dense")
    """
    skip = saver_keys(model)
    return {key: value for key, value in model.state_dict().items() if key not in skip}


def add_weight_ids(module: torch.nn.Module, destination: Dict[str, Any], prefix: str, attr: str) -> None:
    """State-dict hook of a sharded collection: put ``<table>.weight_id`` next to each FUSED hash table's weight.

    Args:
        module: a sharded EmbeddingBagCollection / EmbeddingCollection.
        destination: the state_dict being built (its ``weight`` entries are in place).
        prefix: the module's key prefix; ``attr``: ``"embedding_bags"`` or ``"embeddings"``.
    """
    for name, shards in _fused_hash_shards(module).items():
        weight = destination.get(f"{prefix}{attr}.{name}.weight")
        if weight is None:
            continue
        key = f"{prefix}{attr}.{name}.{WEIGHT_ID}"
        if not isinstance(weight, ShardedTensor):  # data_parallel: every rank holds the whole table
            destination[key] = _row_ids(*shards[0])[:, None]
            continue
        pieces = [(kernel.shard_info(t).table.local_metadata, _row_ids(kernel, t)) for kernel, t in shards]
        table = shards[0][0].shard_info(shards[0][1]).table
        columns = column_offsets(table.global_metadata)
        metadata = id_metadata(table.global_metadata)
        local = [Shard(tensor=ids[:, None], metadata=id_shard(m, columns)) for m, ids in pieces]
        destination[key] = ShardedTensor._init_from_local_shards_and_global_metadata(
            local, metadata, process_group=weight._process_group
        )


def load_weight_ids(module: torch.nn.Module, state_dict: Dict[str, Any], prefix: str, attr: str) -> None:
    """Load-state-dict pre-hook of a sharded collection: take each FUSED hash table's ``weight_id`` out of
    ``state_dict`` and make the table's shards hold those IDs at those rows.

    Raises:
        ConfigError: the entry has no piece for one of this rank's shards, or puts an ID on a shard that does not
            own it (the state_dict was made with another sharding plan or world size), or ``state_dict`` holds a
            table's rows without their IDs (e.g. a trained unsharded module's).
    """
    for name, shards in _fused_hash_shards(module).items():
        key = f"{prefix}{attr}.{name}.{WEIGHT_ID}"
        if key not in state_dict:
            refuse_rows_without_ids(state_dict, f"{prefix}{attr}.{name}", name)
            continue
        value = state_dict.pop(key)
        if not isinstance(value, ShardedTensor):  # data_parallel: the whole table, placed by nobody
            for kernel, t in shards:
                _restore_ids(kernel, t, value[:, 0], key, placed=False)
            continue
        pieces = {(tuple(p.metadata.shard_offsets), p.metadata.shard_sizes[0]): p.tensor for p in value.local_shards()}
        for kernel, t in shards:
            info = kernel.shard_info(t)
            local = info.table.local_metadata
            columns = column_offsets(info.table.global_metadata)
            row0, rows = int(local.shard_offsets[0]), int(local.shard_sizes[0])
            ids = pieces.get(((row0, columns.index(int(local.shard_offsets[1]))), rows))
            if ids is None:
                raise ConfigError(
                    f"hash table {name!r}: {key!r} has no IDs for this rank's shard (rows {row0}-{row0 + rows - 1}): "
                    "it was saved with another sharding plan or world size. Load it with the same plan, or move the "
                    "table with torchrec_ascend.Saver, which reshards."
                )
            _restore_ids(kernel, t, ids[:, 0], key, placed=True)


def refuse_rows_without_ids(state_dict: Dict[str, Any], table_key: str, name: str) -> None:
    """Rows whose IDs are not in ``state_dict`` would be read as other IDs' rows: refuse them, unless they are an
    unsharded table holding no ID yet (TorchRec loads the unsharded module's state when it shards it)."""
    if f"{table_key}.weight" not in state_dict:
        return
    unsharded_ids = state_dict.get(f"{table_key}.slots.slot_ids")
    if unsharded_ids is not None and not bool((unsharded_ids >= 0).any()):
        return
    held = f"holds {int((unsharded_ids >= 0).sum())} IDs in an unsharded module" if unsharded_ids is not None else (
        f"has rows ('weight') without the ID of each row ({WEIGHT_ID!r})")
    raise ConfigError(
        f"hash table {name!r}: the state_dict {held}; loading it into sharded tables would lose them. Shard the "
        "module before training it, move trained hash tables with torchrec_ascend.Saver, or leave them out of the "
        "state_dict (dense_state_dict)."
    )


def _fused_hash_shards(module: torch.nn.Module) -> Dict[str, List[Tuple[HashRows, int]]]:
    """Table name -> this rank's (kernel, table index) shards of FUSED (pool-only) hash tables."""
    shards: Dict[str, List[Tuple[HashRows, int]]] = {}
    for kernel in sharded_kernels(module):
        if isinstance(kernel, HashRows) and not isinstance(kernel, KeyValueRows):
            for t in range(kernel.num_tables):
                shards.setdefault(kernel.slot_table(t).table, []).append((kernel, t))
    return shards


def _row_ids(kernel: HashRows, t: int) -> torch.Tensor:
    """The ID of every row of the shard (-1: free); the reserved not-admitted row is outside the shard's rows."""
    return kernel.slot_table(t).slot_ids.clone()


def _restore_ids(kernel: HashRows, t: int, row_ids: torch.Tensor, key: str, placed: bool) -> None:
    """Make shard ``t`` hold ``row_ids`` (one per row, -1 for none), with the policy state loaded for it if any;
    ``placed``: the shard owns a row block."""
    table = kernel.slot_table(t)
    slots = (row_ids >= 0).nonzero().squeeze(1)
    ids = row_ids[slots]
    owned = ShardLayout.of(kernel.shard_info(t)).owns(ids) if placed else torch.ones_like(ids, dtype=torch.bool)
    if bool((slots >= table.capacity).any()) or not bool(owned.all()):
        raise ConfigError(
            f"hash table {table.table!r}: {key!r} puts IDs on a shard that does not own them (saved with another "
            "row-wise split or world size; rows are placed by hash(ID) % world_size). Load it with the same plan, "
            "or move the table with torchrec_ascend.Saver, which reshards."
        )
    restore_pool(kernel, t, ids.clone(), slots, take_loaded(kernel, t) if placed else None)
