"""FUSED kernels for hash tables: fbgemm TBE over rows chosen per ID, the optimizer fused into backward.

TorchRec's FUSED kernels (``BatchedFusedEmbeddingBag`` for EmbeddingBagCollection, ``BatchedFusedEmbedding`` for
EmbeddingCollection) run fbgemm's table-batched embedding with the optimizer applied inside backward. Ours keep all
of that and put a :class:`~torchrec_ascend.hash.slot_table.SlotTable` per table in front: raw int64 IDs become rows
of the shard's pool before the TBE lookup. A row handed to a new ID is initialised as a function of (seed, ID,
column) and its optimizer state is zeroed, so state always belongs to the ID holding the row.

:class:`HashRows` is the shared machinery; the KEY_VALUE kernels subclass it and change only what happens to rows
that arrive (loaded from host memory instead of initialised) and leave (written back instead of dropped).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, List, Tuple

import torch
from torchrec.distributed.batched_embedding_kernel import BatchedFusedEmbedding, BatchedFusedEmbeddingBag
from torchrec.distributed.embedding_types import GroupedEmbeddingConfig
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from torchrec_ascend.hash.configs import FUSED_PARAMS_KEY, HashTableSpec, hash_spec_of
from torchrec_ascend.hash.slot_table import Assignment, SlotTable
from torchrec_ascend.kernels import ops


def without_hash_params(config: GroupedEmbeddingConfig) -> GroupedEmbeddingConfig:
    """The grouped config minus our fused_params entry (fbgemm would reject the unknown keyword)."""
    fused = {k: v for k, v in (config.fused_params or {}).items() if k != FUSED_PARAMS_KEY}
    return dataclasses.replace(config, fused_params=fused)


def with_values(features: KeyedJaggedTensor, values: torch.Tensor) -> KeyedJaggedTensor:
    """``features`` with ``values`` replaced (same keys, lengths, weights and variable-batch layout)."""
    return KeyedJaggedTensor(
        keys=features.keys(),
        values=values,
        weights=features.weights_or_none(),
        lengths=features.lengths(),
        offsets=features.offsets(),
        stride_per_key_per_rank=features.stride_per_key_per_rank() if features.variable_stride_per_key() else None,
        stride=None if features.variable_stride_per_key() else features.stride(),
        length_per_key=features.length_per_key(),
        offset_per_key=features.offset_per_key(),
    )


class HashRows:
    """Mixin for TorchRec TBE kernels: raw IDs -> rows through one :class:`SlotTable` per table.

    The kernel class calls :meth:`_init_hash_rows` at the end of ``__init__`` and :meth:`map_ids` at the start of
    ``forward``. Subclasses change :meth:`_rows_arrived` and :meth:`_rows_left`.
    """

    _slot_tables: torch.nn.ModuleList
    _specs: List[HashTableSpec]

    def _init_hash_rows(self, config: GroupedEmbeddingConfig, pool_rows: List[int], overflow: List[str]) -> None:
        self._specs = [hash_spec_of(t) or HashTableSpec() for t in config.embedding_tables]
        self._slot_tables = torch.nn.ModuleList(
            SlotTable(t.name, spec, rows, rule)
            for t, spec, rows, rule in zip(config.embedding_tables, self._specs, pool_rows, overflow)
        )
        self._table_names = [t.name for t in config.embedding_tables]
        self._feature_names = [f for t in config.embedding_tables for f in t.feature_names]
        self._init_ranges = [(t.get_weight_init_min(), t.get_weight_init_max()) for t in config.embedding_tables]

    def set_pipeline_depth(self, depth: int) -> None:
        """Pin the rows of ``depth`` in-flight batches besides the current one (called by pipelines)."""
        for table in self._slot_tables:
            table.set_window(depth + 1)

    def hash_stats(self) -> Dict[str, Dict[str, int]]:
        """Per-table counters of the slot tables (lookups, hits, inserted, evicted, rejected, size...)."""
        return {name: table.stats() for name, table in zip(self._table_names, self._slot_tables)}

    def export_rows(self, t: int) -> Tuple[torch.Tensor, torch.Tensor, int]:
        """Every ID held by table ``t``'s shard, its row (this shard's columns) and the shard's first column."""
        ids, slots = self._slot_tables[t].id_map.export()
        return ids, self._pool_weights(t)[slots].clone(), self._col_offset[t]  # type: ignore[attr-defined]

    def map_ids(self, features: KeyedJaggedTensor) -> KeyedJaggedTensor:
        """``features`` with raw IDs replaced by rows; new rows filled, evicted rows handed to the subclass."""
        values = features.values()
        per_feature = list(torch.split(values, features.length_per_key()))
        for i, (feature, ids) in enumerate(zip(self._feature_names, per_feature)):
            if ids.numel() and int(ids.min()) < 0:
                table = self._table_names[self._feature_table_map[i]]  # type: ignore[attr-defined]
                raise ValueError(
                    f"hash table {table!r}, feature {feature!r}: IDs must be non-negative int64, got "
                    f"{int(ids.min())}. Map negative IDs to non-negative ones (e.g. x & (2**63 - 1)) before lookup."
                )
        slots: List[Any] = [None] * len(per_feature)
        for t, table in enumerate(self._slot_tables):
            features_of_t = [i for i, ft in enumerate(self._feature_table_map) if ft == t]
            ids = torch.cat([per_feature[i] for i in features_of_t]) if features_of_t else values[:0]
            assignment = table.assign(ids.long(), training=self.training)  # type: ignore[attr-defined]
            if assignment.evicted_slots.numel():
                self._rows_left(t, assignment)
            if assignment.new_slots.numel():
                self._rows_arrived(t, assignment)
            self._write_default_row(t)
            for i, part in zip(features_of_t, torch.split(assignment.slots, [per_feature[i].numel() for i in features_of_t])):
                slots[i] = part
        return with_values(features, torch.cat(slots) if slots else values)

    def _pool_weights(self, t: int) -> torch.Tensor:
        return self._emb_module.split_embedding_weights()[t]  # type: ignore[attr-defined]

    def _pool_states(self, t: int) -> List[torch.Tensor]:
        states = self._emb_module.split_optimizer_states()  # type: ignore[attr-defined]
        return list(states[t]) if states else []  # stateless optimizers (SGD) have none

    def initial_rows(self, t: int, ids: torch.Tensor) -> torch.Tensor:
        """The deterministic initial values of ``ids`` for this shard's columns of table ``t``."""
        low, high = self._init_ranges[t]
        col0, cols = self._col_offset[t], self._local_cols[t]  # type: ignore[attr-defined]
        return ops.hash_uniform_init(ids, self._specs[t].init_seed, col0 + cols, low, high)[:, col0:]

    def _rows_arrived(self, t: int, assignment: Assignment) -> None:
        """Fill rows handed to IDs: initial values, zero optimizer state (FUSED: every arriving ID is new)."""
        with torch.no_grad():
            self._pool_weights(t)[assignment.new_slots] = self.initial_rows(t, assignment.new_ids)
            for state in self._pool_states(t):
                state[assignment.new_slots] = 0

    def _rows_left(self, t: int, assignment: Assignment) -> None:
        """Rows freed by eviction (FUSED: the IDs are dropped; their rows are overwritten by arriving ones)."""

    def _write_default_row(self, t: int) -> None:
        # Rejected and unknown IDs read this row; training may have moved it since the last batch.
        table = self._slot_tables[t]
        with torch.no_grad():
            self._pool_weights(t)[table.default_slot] = self._specs[t].not_admitted_value
            for state in self._pool_states(t):
                state[table.default_slot] = 0


class HashFusedEmbeddingBag(HashRows, BatchedFusedEmbeddingBag):
    """FUSED kernel of EmbeddingBagCollection hash tables (pooled lookups).

    Args:
        config: the grouped tables (all hash tables with the same options).
        pg: the process group.
        device: the device of the TBE.
        sharding_type: the tables' sharding type.
        env: the sharding env.

    Example::

        kernel = HashFusedEmbeddingBag(config=grouped_config, pg=pg, device=torch.device("cpu"))
        pooled = kernel(kjt_with_raw_ids)   # [B, sum of local dims]
    """

    def __init__(self, config: GroupedEmbeddingConfig, pg: Any = None, device: Any = None,
                 sharding_type: Any = None, env: Any = None) -> None:
        super().__init__(without_hash_params(config), pg, device, sharding_type, env)
        self._init_hash_rows(config, self._local_rows, [s.overflow for s in _specs(config)])

    def forward(self, features: KeyedJaggedTensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        return super().forward(self.map_ids(features), *args, **kwargs)


class HashFusedEmbedding(HashRows, BatchedFusedEmbedding):
    """FUSED kernel of EmbeddingCollection hash tables (sequence lookups); arguments as HashFusedEmbeddingBag."""

    def __init__(self, config: GroupedEmbeddingConfig, pg: Any = None, device: Any = None, env: Any = None) -> None:
        super().__init__(without_hash_params(config), pg, device)
        self._init_hash_rows(config, self._local_rows, [s.overflow for s in _specs(config)])

    def forward(self, features: KeyedJaggedTensor) -> torch.Tensor:
        return super().forward(self.map_ids(features))


def _specs(config: GroupedEmbeddingConfig) -> List[HashTableSpec]:
    return [hash_spec_of(t) or HashTableSpec() for t in config.embedding_tables]
