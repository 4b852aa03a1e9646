"""FUSED kernels for hash tables: fbgemm TBE over rows chosen per ID, the optimizer fused into backward.

TorchRec's FUSED kernels (``BatchedFusedEmbeddingBag`` for EmbeddingBagCollection, ``BatchedFusedEmbedding`` for
EmbeddingCollection) run fbgemm's table-batched embedding with the optimizer applied inside backward. Ours keep all
of that and put a :class:`~torchrec_ascend.hash.slot_table.SlotTable` per table in front: raw int64 IDs become rows
of the shard's pool before the TBE lookup. A row handed to a new ID is initialised as a function of (seed, ID,
column) and its optimizer state is zeroed, so state always belongs to the ID holding the row.

:class:`HashRows` is the shared machinery; what happens to rows that arrive in the pool and leave it is its row
tier's (:mod:`torchrec_ascend.kernels.row_tier`): FUSED initialises and drops them, KEY_VALUE loads them from and writes
them back to host memory.

Where the work happens: the pool (TBE weights and optimizer state) lives on the kernel's device; the slot tables
(ID maps, policies, counters) live on the host by design. So a batch's IDs cross once each way, explicitly and
batched, never per ID. Per training step and kernel, with the tables on an accelerator:

* one device-to-host copy of the batch's IDs (blocking: the step's one host sync for ID mapping); the
  negative-ID check runs on that host copy, never on the device;
* one host-to-device copy of the batch's rows (the mapped slots);
* per table that received new rows: two host-to-device copies, their slots and their initial values (KEY_VALUE:
  the rows read back from the host tier); per table that evicted rows (KEY_VALUE): one host-to-device copy of their
  slots and one device-to-host copy of their packed rows (blocking).

Under a pipeline that prefetches, the same copies happen in the prefetch, on the pipeline's host thread, and the
lookup reuses its rows. On the CPU every copy is a no-op.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple, cast

import torch
from torchrec.distributed.batched_embedding_kernel import (
    BatchedFusedEmbedding,
    BatchedFusedEmbeddingBag,
)
from torchrec.distributed.embedding_types import GroupedEmbeddingConfig
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from torchrec_ascend.adapters.tbe import TBE
from torchrec_ascend.hash.configs import HashTableSpec, hash_spec_of
from torchrec_ascend.hash.slot_table import Assignment, SlotTable
from torchrec_ascend.kernels.id_mapper import IdMapper, with_values
from torchrec_ascend.kernels.row_tier import PoolOnly, RowTier
from torchrec_ascend.kernels.tbe_config import with_reserved_rows, without_hash_params
from torchrec_ascend.native import ops

_EMPTY = torch.empty(0, dtype=torch.int64)


@dataclasses.dataclass
class ShardRows:
    """A block of one table shard's records, as checkpoints carry them.

    Attributes:
        ids: int64 ``[n]``, the keys the slot table holds: raw IDs (hash tables) or row indices within the shard
            (plain KEY_VALUE tables).
        slots: int64 ``[n]``, each ID's pool row, ``-1`` for rows held in a lower tier (KEY_VALUE host or disk).
        last_used: int64 ``[n]``, the step each pooled ID was last used at (0 for lower-tier rows).
        rows: ``[n, cols + optimizer state width]``, weights then optimizer states (:meth:`HashRows.pack_rows`).
    """

    ids: torch.Tensor
    slots: torch.Tensor
    last_used: torch.Tensor
    rows: torch.Tensor


@dataclasses.dataclass(frozen=True)
class ShardInfo:
    """What a checkpoint records about one table shard of a kernel.

    Attributes:
        name: the table's name.
        table: TorchRec's sharded table config (``local_metadata`` / ``global_metadata`` give the shard's place).
        hash_ids: keys are raw IDs (hash tables), not row indices (plain KEY_VALUE tables).
        spec: the table's hash options (policies).
        capacity: IDs the shard's pool holds.
        col0: the shard's first column; ``cols``: its number of columns.
        state_shapes: per optimizer state, its per-row shape: ``()`` row-wise, ``(cols,)`` element-wise.
        optimizer: fbgemm's name of the fused optimizer (e.g. ``"exact_adagrad"``).
        eviction: the pool has an eviction policy; ``admission``: the table has an admission policy.
        lower_tiers: rows also live below the pool (KEY_VALUE host and disk).
    """

    name: str
    table: Any
    hash_ids: bool
    spec: HashTableSpec
    capacity: int
    col0: int
    cols: int
    state_shapes: Tuple[Tuple[int, ...], ...]
    optimizer: str
    eviction: bool
    admission: bool
    lower_tiers: bool


class HashRows:
    """Mixin for TorchRec TBE kernels: raw IDs -> rows through one :class:`SlotTable` per table.

    The kernel class wraps its stock kernel's TBE in ``self._tbe`` (:class:`~torchrec_ascend.adapters.tbe.TBE`, the
    only way to the TBE's and the stock kernel's private fields) right after the stock constructor, calls
    :meth:`_init_hash_rows` at the end of ``__init__`` and :meth:`lookup_rows` at the start of ``forward``.
    Rows outside the pool are its row tier's (``tier`` of :meth:`_init_hash_rows`; :class:`PoolOnly` by default).
    """

    _slot_tables: Sequence[SlotTable]  # a torch.nn.ModuleList: registered, moved and saved with the kernel
    _specs: List[HashTableSpec]
    _tbe: TBE
    training: bool  # torch.nn.Module's, from the TorchRec kernel class this mixin is combined with

    def _init_hash_rows(
        self, config: GroupedEmbeddingConfig, pool_rows: List[int], overflow: List[str], tier: Optional[RowTier] = None
    ) -> None:
        self._tier: RowTier = PoolOnly(self) if tier is None else tier
        self._specs = [hash_spec_of(t) or HashTableSpec() for t in config.embedding_tables]
        self._slot_tables = cast(Sequence[SlotTable], torch.nn.ModuleList(
            SlotTable(t.name, spec, rows, rule)
            for t, spec, rows, rule in zip(config.embedding_tables, self._specs, pool_rows, overflow)
        ))
        self._table_names = [t.name for t in config.embedding_tables]
        self._feature_names = [f for t in config.embedding_tables for f in t.feature_names]
        self._init_ranges = [(t.get_weight_init_min(), t.get_weight_init_max()) for t in config.embedding_tables]
        self._mapper = IdMapper(self._slot_tables, self._feature_names, self._tbe.feature_table_map,
                                self._map_on_host, self._write_default_row)
        # TorchRec's prefetch (called for KEY_VALUE tables by prefetching pipelines) hands the TBE raw IDs, which
        # fbgemm's bounds check would clamp in place: it comes to the ID mapper instead (see IdMapper.prefetch).
        self._tbe.route_prefetch(self._mapper.prefetch)

    def set_pipeline_depth(self, depth: int) -> None:
        """Accept any depth: pins follow the batches actually in flight (see :meth:`IdMapper.prefetch`)."""
        self._mapper.set_pipeline_depth(depth)

    @property
    def prefetched_batches(self) -> int:
        """Lookups that found their rows ready (mapped by a prefetch)."""
        return self._mapper.prefetched_batches

    def lookup_rows(self, features: KeyedJaggedTensor) -> KeyedJaggedTensor:
        """``features`` with raw IDs replaced by rows: the prefetched ones, or chosen now (see :class:`IdMapper`)."""
        return self._mapper.lookup(features)

    def hash_stats(self) -> Dict[str, Dict[str, int]]:
        """Per-table counters of the slot tables (lookups, hits, inserted, evicted, rejected, size...)."""
        return {name: table.stats() for name, table in zip(self._table_names, self._slot_tables)}

    def export_rows(self, t: int) -> Tuple[torch.Tensor, torch.Tensor, int]:
        """Every ID held by table ``t``'s shard, its row (this shard's columns, on the host) and its first column."""
        ids, slots = self._slot_tables[t].id_map.export()
        weights = self._tbe.weights(t)
        return ids, weights[slots.to(weights.device)].cpu(), self._tbe.col_offsets[t]

    def map_ids(self, features: KeyedJaggedTensor) -> KeyedJaggedTensor:
        """``features`` with raw IDs replaced by rows; new rows filled, evicted rows handed to the subclass.

        The IDs cross to the host once and the rows come back once (see the module docstring); the result's values
        are on ``features``' device.
        """
        return self._mapper.map_now(features)

    def _map_on_host(self, on_host: KeyedJaggedTensor, device: torch.device) -> Tuple[torch.Tensor, KeyedJaggedTensor]:
        """Map ``on_host`` (a batch's raw IDs on the host): its rows on ``device`` (one host-to-device copy), and
        ``on_host`` with the rows in place of the IDs (on the host, for pinning)."""
        values = on_host.values()
        per_feature = list(torch.split(values, on_host.length_per_key()))
        for i, (feature, ids) in enumerate(zip(self._feature_names, per_feature)):
            if ids.numel() and int(ids.min()) < 0:
                table = self._table_names[self._tbe.feature_table_map[i]]
                raise ValueError(
                    f"hash table {table!r}, feature {feature!r}: IDs must be non-negative int64, got "
                    f"{int(ids.min())}. Map negative IDs to non-negative ones (e.g. x & (2**63 - 1)) before lookup."
                )
        slots: List[Any] = [None] * len(per_feature)
        for t, table in enumerate(self._slot_tables):
            features_of_t = [i for i, ft in enumerate(self._tbe.feature_table_map) if ft == t]
            ids = torch.cat([per_feature[i] for i in features_of_t]) if features_of_t else values[:0]
            assignment = table.assign(
                ids.long(), training=self.training,
                known=self._tier.known(t), on_evict=functools.partial(self._tier.left, t),
            )
            if assignment.new_slots.numel():
                try:
                    self._tier.arrived(t, assignment)
                except Exception:
                    table.remove(assignment.new_ids)  # unfilled rows must not stay mapped; the stores keep theirs
                    raise
            self._write_default_row(t)
            sizes = [per_feature[i].numel() for i in features_of_t]
            for i, part in zip(features_of_t, torch.split(assignment.slots, sizes)):
                slots[i] = part
        host_slots = torch.cat(slots) if slots else values
        return host_slots.to(device, non_blocking=True), with_values(on_host, host_slots)

    def initial_rows(self, t: int, ids: torch.Tensor) -> torch.Tensor:
        """The deterministic initial values of ``ids`` for this shard's columns of table ``t``."""
        low, high = self._init_ranges[t]
        col0, cols = self._tbe.col_offsets[t], self._tbe.local_cols[t]
        return ops.hash_uniform_init(ids, self._specs[t].init_seed, col0 + cols, low, high)[:, col0:]

    def initialise_rows(self, t: int, assignment: Assignment) -> None:
        """Give the rows handed to new IDs their initial values and zero optimizer state."""
        weights = self._tbe.weights(t)
        slots = assignment.new_slots.to(weights.device, non_blocking=True)
        with torch.no_grad():
            initial = self.initial_rows(t, assignment.new_ids)
            weights[slots] = initial.to(weights.device, weights.dtype, non_blocking=True)
            for state in self._tbe.states(t):
                state[slots] = 0

    def _write_default_row(self, t: int) -> None:
        # Rejected and unknown IDs read this row; training may have moved it since the last batch.
        table = self._slot_tables[t]
        with torch.no_grad():
            self._tbe.weights(t)[table.default_slot] = self._specs[t].not_admitted_value
            for state in self._tbe.states(t):
                state[table.default_slot] = 0

    # -- checkpoint support (torchrec_ascend.checkpoint) -------------------------------------------------------------
    # A shard leaves as blocks of ShardRows plus shard_state() and comes back through restore_shard(). FUSED keeps
    # every row in its pool; KEY_VALUE's row tier holds the rest (RowTier.stored, read, restore). Called between
    # batches, never per batch.

    @property
    def row_tier(self) -> RowTier:
        """Where the rows outside the pool live (see :mod:`torchrec_ascend.kernels.row_tier`)."""
        return self._tier

    @property
    def num_tables(self) -> int:
        """Tables (table shards) this kernel holds."""
        return len(self._slot_tables)

    def slot_table(self, t: int) -> SlotTable:
        """The slot table of table ``t`` (index within this kernel)."""
        return self._slot_tables[t]

    def shard_info(self, t: int) -> ShardInfo:
        """Where table ``t``'s shard sits and what its rows hold (see :class:`ShardInfo`).

        Example::

            info = kernel.shard_info(0)
            info.name, info.col0, info.cols, info.state_shapes   # ('user', 0, 16, ((16,),)) with Adagrad
        """
        table = self._slot_tables[t]
        return ShardInfo(
            name=self._table_names[t],
            table=self._tbe.config.embedding_tables[t],
            hash_ids=True,
            spec=self._specs[t],
            capacity=table.capacity,
            col0=self._tbe.col_offsets[t],
            cols=self._tbe.local_cols[t],
            state_shapes=tuple(tuple(s.shape[1:]) for s in self._tbe.states(t)),
            optimizer=self._tbe.optimizer_name,
            eviction=table.eviction is not None,
            admission=table.admission is not None,
            lower_tiers=self._tier.lower_tiers,
        )

    def row_width(self, t: int) -> int:
        """Elements of a packed row of table ``t``: its columns plus every optimizer state's per-row elements."""
        return self._tbe.local_cols[t] + sum(math.prod(s.shape[1:]) for s in self._tbe.states(t))

    def pack_rows(self, t: int, slots: torch.Tensor) -> torch.Tensor:
        """Pool rows ``slots`` of table ``t`` as ``[n, row_width]`` on the host: weights, then each optimizer state
        (gathered on the pool's device, then one device-to-host copy).

        Example::

            packed = kernel.pack_rows(0, torch.tensor([3, 5]))
            kernel.unpack_rows(0, torch.tensor([3, 5]), packed)   # no change
        """
        weights = self._tbe.weights(t)
        slots = slots.to(weights.device)
        parts = [weights[slots].float()]  # FP16 tables' rows travel as float32 (exactly)
        parts += [s[slots].view(slots.numel(), math.prod(s.shape[1:])).float() for s in self._tbe.states(t)]
        return torch.cat(parts, dim=1).cpu()

    def unpack_rows(self, t: int, slots: torch.Tensor, rows: torch.Tensor) -> None:
        """Write packed ``rows`` (``[n, row_width]``, see :meth:`pack_rows`) to pool rows ``slots`` of table ``t``."""
        cols = self._tbe.local_cols[t]
        weights = self._tbe.weights(t)
        slots, rows = slots.to(weights.device), rows.to(weights.device)
        with torch.no_grad():
            weights[slots] = rows[:, :cols].to(weights.dtype)
            start = cols
            for state in self._tbe.states(t):
                width = math.prod(state.shape[1:])
                state[slots] = rows[:, start:start + width].reshape((-1,) + tuple(state.shape[1:])).to(state.dtype)
                start += width

    def export_shard(self, t: int, changed_only: bool = False) -> Tuple[Iterator[ShardRows], torch.Tensor]:
        """The records of table ``t``'s shard, in blocks, and the IDs to drop.

        Args:
            t: the table's index within this kernel.
            changed_only: only what changed since the slot table's checkpoint mark (an incremental save).

        Returns:
            Tuple[Iterator[ShardRows], Tensor]: blocks covering every ID in every tier (or every changed one), and
            the IDs that left the shard since the mark (empty for a full export).

        Raises:
            RuntimeError: ``changed_only`` without a checkpoint mark.
            StorageError: a lower-tier row cannot be read back intact.

        Example::

            blocks, removed = kernel.export_shard(0, changed_only=True)
            changed = sum(block.ids.numel() for block in blocks)
        """
        table = self._slot_tables[t]
        if changed_only:
            slots, left = table.changes_since_mark()
            ids, last_used = table.slot_ids[slots], table.last_used[slots]
        else:
            ids, slots, last_used = table.held()
        pool = ShardRows(ids, slots, last_used, self.pack_rows(t, slots))
        if not changed_only:
            lower = (_lower_tier_rows(keys, rows) for keys, rows in self._tier.stored(t))
            return itertools.chain([pool], lower), _EMPTY
        rows, found = self._tier.read(t, left)
        return iter([pool, _lower_tier_rows(left[found], rows[found])]), left[~found]

    def shard_state(self, t: int) -> Dict[str, Any]:
        """:meth:`SlotTable.checkpoint_state` of table ``t`` plus ``iteration``, the fused optimizer's step count.

        Example::

            state = kernel.shard_state(0)   # {"step": 12, "counters": {...}, "iteration": 12, ...}
        """
        return {**self._slot_tables[t].checkpoint_state(), "iteration": self.optimizer_iteration()}

    def restore_shard(self, t: int, records: ShardRows, state: Dict[str, Any]) -> None:
        """Make table ``t``'s shard hold exactly ``records``: pooled ones at their slots, the rest in lower tiers.

        Args:
            t: the table's index within this kernel.
            records: the shard's records (slots ``-1`` go to the lower tiers).
            state: as :meth:`SlotTable.restore` takes it.

        Raises:
            CapacityError: more pooled IDs than the pool holds.
            ConfigError: rows without a pool slot for a kernel without lower tiers, or a policy state that does
                not fit.
            StorageError: a lower tier cannot take the rows.

        Example::

            records = ShardRows(ids, torch.arange(len(ids)), last_used, packed_rows)
            kernel.restore_shard(0, records, {"step": 12})
        """
        pooled = records.slots >= 0
        slots = records.slots[pooled]
        self._slot_tables[t].restore(records.ids[pooled], slots, records.last_used[pooled], state)
        self.unpack_rows(t, slots, records.rows[pooled])
        self._tier.restore(t, records.ids[~pooled], records.rows[~pooled])

    def optimizer_iteration(self) -> int:
        """The fused optimizer's step counter (fbgemm's ``iter``; Adam-style optimizers use it)."""
        return self._tbe.iteration()

    def set_optimizer_iteration(self, value: int) -> None:
        """Set the fused optimizer's step counter (and fbgemm's CPU copy of it, which it syncs only from 0)."""
        self._tbe.set_iteration(value)


def _lower_tier_rows(keys: torch.Tensor, rows: torch.Tensor) -> ShardRows:
    """Records of rows held below the pool: no slot, no last use."""
    return ShardRows(keys, torch.full_like(keys, -1), torch.zeros_like(keys), rows)


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
        super().__init__(without_hash_params(with_reserved_rows(config)), pg, device, sharding_type, env)
        self._tbe = TBE(self)
        self._tbe.hide_last_rows(without_hash_params(config))
        self._init_hash_rows(config, _pool_rows(config), [s.overflow for s in _specs(config)])

    def forward(self, features: KeyedJaggedTensor, vbe_output: Any = None, vbe_output_offsets: Any = None) -> Any:
        return pooled_lookup(self, self.lookup_rows(features), vbe_output, vbe_output_offsets)


class HashFusedEmbedding(HashRows, BatchedFusedEmbedding):
    """FUSED kernel of EmbeddingCollection hash tables (sequence lookups); arguments as HashFusedEmbeddingBag."""

    def __init__(self, config: GroupedEmbeddingConfig, pg: Any = None, device: Any = None, env: Any = None) -> None:
        super().__init__(without_hash_params(with_reserved_rows(config)), pg, device)
        self._tbe = TBE(self)
        self._tbe.hide_last_rows(without_hash_params(config))
        self._init_hash_rows(config, _pool_rows(config), [s.overflow for s in _specs(config)])

    def forward(self, features: KeyedJaggedTensor) -> torch.Tensor:
        return super().forward(self.lookup_rows(features))


def pooled_lookup(kernel: Any, features: KeyedJaggedTensor, vbe_output: Any, vbe_output_offsets: Any) -> Any:
    """The stock pooled forward of ``kernel`` (a BatchedFusedEmbeddingBag) on ``features`` (rows, not IDs).

    When a lookup has several kernels and a variable batch, TorchRec preallocates one output for all of them and
    passes each kernel its offsets; fbgemm's CPU TBE refuses that, so on the CPU the kernel's own output is placed
    into it (see :func:`place_vbe_output`).
    """
    tbe = kernel._tbe
    if vbe_output is None or not tbe.module.use_cpu:
        return BatchedFusedEmbeddingBag.forward(kernel, features, vbe_output, vbe_output_offsets)
    own = BatchedFusedEmbeddingBag.forward(kernel, features)
    dims = [tbe.local_cols[t] for t in tbe.feature_table_map]
    return place_vbe_output(own, features.stride_per_key_per_rank(), dims, vbe_output, vbe_output_offsets)


def place_vbe_output(
    own: torch.Tensor, samples_per_rank: List[List[int]], dims: List[int], shared: torch.Tensor, offsets: torch.Tensor
) -> torch.Tensor:
    """A kernel's variable-batch output (1-D: per rank, per feature, ``[samples, dim]`` flattened) placed at
    ``offsets[rank][feature]`` of the ``shared`` output, out of place so autograd reaches both.

    Example::

        place_vbe_output(torch.ones(6), [[1, 2]], [2], torch.zeros(10), torch.tensor([[4], [8]]))
        # ones at 4-5 (rank 0's sample) and 8-11 (rank 1's two)
    """
    world = len(samples_per_rank[0]) if samples_per_rank else 0
    sizes = [samples_per_rank[f][r] * dims[f] for r in range(world) for f in range(len(dims))]
    starts = offsets.to("cpu").flatten().tolist()  # [rank][feature], the order of ``own``'s blocks
    positions = torch.cat([torch.arange(s, s + n) for s, n in zip(starts, sizes)] or [_EMPTY])
    return shared.index_copy(0, positions.to(shared.device), own.to(shared.dtype))


def _specs(config: GroupedEmbeddingConfig) -> List[HashTableSpec]:
    return [hash_spec_of(t) or HashTableSpec() for t in config.embedding_tables]


def _pool_rows(config: GroupedEmbeddingConfig) -> List[int]:
    """Pool rows per table: the shard's rows, each holding an ID, plus the reserved default row."""
    return [t.local_rows + 1 for t in config.embedding_tables]
