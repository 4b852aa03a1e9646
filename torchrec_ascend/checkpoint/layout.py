"""Where a table shard sits, as checkpoints record it: which IDs and columns it owns, and what its rows hold.

A shard owns a set of IDs and a range of columns. Hash tables place IDs by hash: a table cut into ``buckets`` row
blocks (row-wise: one per rank; table-wise and column-wise: one) keeps in block ``b`` the IDs with
``hash_rank(id, buckets) == b``. Plain KEY_VALUE tables keep the global rows ``[row_offset, row_offset + rows)``.
Loading compares each shard of the model with the saved ones: an identical layout is restored exactly; any other is
assembled from the saved shards that own its IDs and columns (resharding).

Example::

    layout = ShardLayout.of(kernel.shard_info(0))
    mine = layout.owns(ids)   # bool mask over global IDs
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Dict, Tuple

import torch

from torchrec_ascend.kernels.fused import ShardInfo
from torchrec_ascend.native import ops


@dataclasses.dataclass(frozen=True)
class ShardLayout:
    """One table shard: its place in the table and the format of its rows.

    Attributes:
        table: the table's name.
        hash_ids: IDs are raw values placed by hash (hash tables), else global row indices (plain tables).
        dim: the table's full embedding dimension.
        col0: the shard's first column; ``cols``: its number of columns.
        bucket: the shard's row block, of ``buckets`` (hash placement).
        row_offset: the shard's first global row; ``rows``: its rows (range placement of plain tables; for hash
            tables the rows of the shard's slice of ``num_embeddings``).
        capacity: IDs the shard's pool holds.
        key_value: rows live in a device cache over host and disk (KEY_VALUE), else all in the pool (FUSED).
        optimizer: fbgemm's optimizer name.
        states: per optimizer state, ``"row"`` (one value per row), ``"element"`` (one per column) or
            ``"shape:<per-row shape>"`` (anything else: restored only into the same columns).
        eviction: the pool's eviction policy and options (``""`` if none); ``admission`` likewise.
    """

    table: str
    hash_ids: bool
    dim: int
    col0: int
    cols: int
    bucket: int
    buckets: int
    row_offset: int
    rows: int
    capacity: int
    key_value: bool
    optimizer: str
    states: Tuple[str, ...]
    eviction: str
    admission: str

    @classmethod
    def of(cls, info: ShardInfo) -> "ShardLayout":
        """The layout of a kernel's table shard (from :meth:`HashRows.shard_info`)."""
        table = info.table
        row_offset = table.local_metadata.shard_offsets[0]
        blocks = sorted({s.shard_offsets[0] for s in table.global_metadata.shards_metadata})
        return cls(
            table=info.name,
            hash_ids=info.hash_ids,
            dim=int(table.embedding_dim),
            col0=info.col0,
            cols=info.cols,
            bucket=blocks.index(row_offset),
            buckets=len(blocks),
            row_offset=int(row_offset),
            rows=int(table.local_metadata.shard_sizes[0]),
            capacity=info.capacity,
            key_value=info.lower_tiers,
            optimizer=info.optimizer,
            states=tuple(_state_kind(shape, info.cols) for shape in info.state_shapes),
            eviction=_policy_text(info.spec.eviction_policy, info.spec.eviction_options) if info.eviction else "",
            admission=_policy_text(info.spec.admission_policy, info.spec.admission_options) if info.admission else "",
        )

    @classmethod
    def from_json(cls, content: Dict[str, Any]) -> "ShardLayout":
        """The inverse of :meth:`to_json`.

        Raises:
            KeyError, TypeError: a field is missing or malformed (callers report the metadata file).
        """
        fields = {f.name: content[f.name] for f in dataclasses.fields(cls)}
        fields["states"] = tuple(fields["states"])
        return cls(**fields)

    def to_json(self) -> Dict[str, Any]:
        """The layout as a JSON-able dict."""
        return {**dataclasses.asdict(self), "states": list(self.states)}

    @property
    def block(self) -> Tuple[int, int]:
        """Identifies the shard's row block (the IDs it owns), whatever its columns."""
        return (self.bucket, self.buckets) if self.hash_ids else (self.row_offset, self.rows)

    @property
    def width(self) -> int:
        """Elements of a packed row: the columns, then the optimizer states."""
        return self.cols + sum(self.state_width(k) for k in range(len(self.states)))

    def state_width(self, k: int) -> int:
        """Per-row elements of optimizer state ``k``."""
        kind = self.states[k]
        if kind == "row":
            return 1
        if kind == "element":
            return self.cols
        width = 1
        for n in json.loads(kind[len("shape:"):]):
            width *= n
        return width

    def owns(self, ids: torch.Tensor) -> torch.Tensor:
        """Bool mask over global IDs: which ones this shard's row block holds."""
        if self.hash_ids:
            if self.buckets == 1:
                return torch.ones(ids.shape, dtype=torch.bool)
            return ops.hash_rank(ids, self.buckets) == self.bucket
        return (ids >= self.row_offset) & (ids < self.row_offset + self.rows)

    def to_global(self, keys: torch.Tensor) -> torch.Tensor:
        """The slot table's keys as global IDs (plain tables key rows by their index within the shard)."""
        return keys if self.hash_ids else keys + self.row_offset

    def to_local(self, ids: torch.Tensor) -> torch.Tensor:
        """Global IDs as the slot table's keys (the inverse of :meth:`to_global`)."""
        return ids if self.hash_ids else ids - self.row_offset


def _state_kind(shape: Tuple[int, ...], cols: int) -> str:
    if shape == ():
        return "row"
    if shape == (cols,):
        return "element"
    return f"shape:{json.dumps(list(shape))}"


def _policy_text(name: Any, options: Any) -> str:
    return f"{name} {json.dumps(dict(options), sort_keys=True, default=str)}"
