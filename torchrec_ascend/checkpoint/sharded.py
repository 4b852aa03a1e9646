"""ShardedTensor pieces the stock-checkpoint code builds: windowed shards, and the metadata of ``weight_id``.

Example::

    st = windowed(table.global_metadata, rank, lambda row0, rows: my_window(row0, rows), torch.float32, pg)
"""

from __future__ import annotations

from typing import Any, Callable, List

import torch
from torch.distributed._shard.metadata import ShardMetadata
from torch.distributed._shard.sharded_tensor import Shard, ShardedTensor, ShardedTensorMetadata, TensorProperties

#: The most bytes one window of a KEY_VALUE table's state_dict holds (DCP reads and writes a window at a time).
WINDOW_BYTES = 8 << 20


def window_rows(row_elements: int) -> int:
    """Rows per window when reading a row costs ``row_elements`` 4-byte values (a KEY_VALUE table's windows of every
    part read whole packed records: weights and optimizer states)."""
    return max(1, WINDOW_BYTES // (4 * row_elements))


def rank_of(shard: ShardMetadata) -> int:
    """The rank holding ``shard`` (TorchRec always places its shards)."""
    placement = shard.placement
    assert placement is not None and placement.rank() is not None, f"an unplaced shard: {shard}"
    return int(placement.rank())  # type: ignore[arg-type]  # checked just above


def host_placement(shard: ShardMetadata) -> Any:
    """``shard``'s rank, on its host: a KEY_VALUE table's rows live in host and disk tiers whatever the device."""
    return torch.distributed._remote_device(f"rank:{rank_of(shard)}/cpu")


def windowed(
    global_metadata: ShardedTensorMetadata,
    local: ShardMetadata,
    window: Callable[[int, int], torch.Tensor],
    dtype: torch.dtype,
    process_group: Any,
    step: int,
) -> ShardedTensor:
    """A ShardedTensor laid out as ``global_metadata`` with every shard cut into windows of ``step`` rows (the same
    on every rank); this rank's shard ``local`` is made of ``window(row0, rows)`` (rows counted within the shard).

    Example::

        windowed(table.global_metadata, table.local_metadata, lambda r, n: torch.zeros(n, 4), torch.float32, pg, 64)
    """
    shards: List[ShardMetadata] = []
    local_shards: List[Shard] = []
    for shard in global_metadata.shards_metadata:
        rows = int(shard.shard_sizes[0])
        is_local = rank_of(shard) == rank_of(local) and \
            list(shard.shard_offsets) == list(local.shard_offsets)
        for row0 in range(0, rows, step):
            n = min(step, rows - row0)
            metadata = ShardMetadata(
                shard_offsets=[int(shard.shard_offsets[0]) + row0] + [int(o) for o in shard.shard_offsets[1:]],
                shard_sizes=[n] + [int(s) for s in shard.shard_sizes[1:]],
                placement=host_placement(shard),
            )
            shards.append(metadata)
            if is_local:
                local_shards.append(Shard(tensor=window(row0, n), metadata=metadata))
    properties = TensorProperties(dtype=dtype)
    return ShardedTensor._init_from_local_shards_and_global_metadata(
        local_shards, ShardedTensorMetadata(shards, global_metadata.size, properties), process_group=process_group
    )


def column_offsets(global_metadata: ShardedTensorMetadata) -> List[int]:
    """A table's column-shard offsets, sorted (``weight_id`` has one column per column shard)."""
    return sorted({int(m.shard_offsets[1]) for m in global_metadata.shards_metadata})


def id_shard(weight_shard: ShardMetadata, columns: List[int]) -> ShardMetadata:
    """A weight shard's piece of ``weight_id``: the same rows, one column per column shard, on the same rank's host
    (the IDs live in the host slot table by design, whatever device holds the rows: no copy to the device)."""
    return ShardMetadata(
        shard_offsets=[int(weight_shard.shard_offsets[0]), columns.index(int(weight_shard.shard_offsets[1]))],
        shard_sizes=[int(weight_shard.shard_sizes[0]), 1],
        placement=host_placement(weight_shard),
    )


def id_metadata(global_metadata: ShardedTensorMetadata) -> ShardedTensorMetadata:
    """The metadata of a table's ``weight_id``: int64 ``[rows, column shards]``, sharded like the weight's rows."""
    columns = column_offsets(global_metadata)
    return ShardedTensorMetadata(
        shards_metadata=[id_shard(m, columns) for m in global_metadata.shards_metadata],
        size=torch.Size([global_metadata.size[0], len(columns)]),
        tensor_properties=TensorProperties(dtype=torch.int64),
    )
