"""The configs an fbgemm TBE of hash tables is built from: our options removed, each table's row blocks resized.

A hash table's pool has one more row than its shard (the reserved default row, :func:`with_reserved_rows`); a
KEY_VALUE table's TBE is its device cache, smaller than the shard (:func:`with_block_rows`). TorchRec's stock kernel
constructors check the TBE's weights against the tables' shard metadata, so the metadata is resized consistently on
every rank.

Example::

    tbe_config = without_hash_params(with_reserved_rows(config))   # what the stock FUSED constructor is given
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import torch
from torch.distributed._shard.metadata import ShardMetadata
from torch.distributed._shard.sharded_tensor.metadata import ShardedTensorMetadata
from torchrec.distributed.embedding_types import GroupedEmbeddingConfig

from torchrec_ascend.hash.configs import FUSED_PARAMS_KEY


def without_hash_params(config: GroupedEmbeddingConfig) -> GroupedEmbeddingConfig:
    """The grouped config minus our fused_params entry (fbgemm would reject the unknown keyword)."""
    fused = {k: v for k, v in (config.fused_params or {}).items() if k != FUSED_PARAMS_KEY}
    return dataclasses.replace(config, fused_params=fused)


def with_reserved_rows(config: GroupedEmbeddingConfig) -> GroupedEmbeddingConfig:
    """The grouped config the TBE is built from: one more local row per table than the shard owns.

    The extra (last) row of each table's pool is the reserved default row, which rejected IDs (and IDs unknown in
    eval mode) read as ``not_admitted_value``; every one of the shard's own rows holds an ID.
    :meth:`~torchrec_ascend.adapters.tbe.TBE.hide_last_rows` then keeps the extra row out of what TorchRec and
    fbgemm report.

    Example::

        with_reserved_rows(config).embedding_tables[0].local_rows   # config's local_rows + 1
    """
    tables = [with_block_rows(t, lambda rows: rows + 1) for t in config.embedding_tables]
    return dataclasses.replace(config, embedding_tables=tables)


def with_block_rows(table: Any, rows_of: Callable[[int], int]) -> Any:
    """A sharded table whose every row block of ``rows`` rows has ``rows_of(rows)`` rows, offsets recomputed.

    The stock constructor wraps the TBE's weights and optimizer states in ShardedTensors checked against the table's
    metadata, so a TBE of another size needs metadata that describes it consistently on every rank.

    Example::

        with_block_rows(table, lambda rows: rows + 1).local_rows   # table.local_rows + 1
    """
    if table.global_metadata is None or table.local_metadata is None:  # replicated: no shard metadata
        return dataclasses.replace(table, local_rows=rows_of(table.local_rows))
    shards = table.global_metadata.shards_metadata
    blocks = sorted({(s.shard_offsets[0], s.shard_sizes[0]) for s in shards})
    rows = {offset: rows_of(size) for offset, size in blocks}
    offsets, total = {}, 0
    for offset, _ in blocks:
        offsets[offset], total = total, total + rows[offset]

    def remap(s: ShardMetadata) -> ShardMetadata:
        row0, col0 = s.shard_offsets
        return ShardMetadata(shard_offsets=[offsets[row0], col0], shard_sizes=[rows[row0], s.shard_sizes[1]],
                             placement=s.placement)

    metadata = ShardedTensorMetadata(
        shards_metadata=[remap(s) for s in shards],
        size=torch.Size([total, table.global_metadata.size[1]]),
        tensor_properties=table.global_metadata.tensor_properties,
    )
    return dataclasses.replace(
        table, local_rows=rows[table.local_metadata.shard_offsets[0]], num_embeddings=total,
        local_metadata=remap(table.local_metadata), global_metadata=metadata,
    )
