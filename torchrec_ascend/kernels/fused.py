"""FUSED kernels for hash tables: fbgemm TBE over rows chosen per ID, the optimizer fused into backward.

TorchRec's FUSED kernels (``BatchedFusedEmbeddingBag`` for EmbeddingBagCollection, ``BatchedFusedEmbedding`` for
EmbeddingCollection) run fbgemm's table-batched embedding with the optimizer applied inside backward. Ours keep all
of that and put a :class:`~torchrec_ascend.hash.slot_table.SlotTable` per table in front: raw int64 IDs become rows
of the shard's pool before the TBE lookup. A row handed to a new ID is initialised as a function of (seed, ID,
column) and its optimizer state is zeroed, so state always belongs to the ID holding the row.

:class:`HashRows` wires what every hash kernel is made of, each part in its own module: the TBE adapter
(:mod:`torchrec_ascend.adapters.tbe`), the pool (:mod:`.pool`: the rows on the kernel's device), the row tier
(:mod:`.row_tier`: FUSED initialises arriving rows and drops evicted ones, KEY_VALUE loads them from and writes them
back to host memory), the ID mapper (:mod:`.id_mapper`: slot tables, prefetch, pins) and the shard checkpoint
(:mod:`.shard_checkpoint`). Each kernel class is its constructor and its forward.

Where the work happens: the pool lives on the kernel's device, the slot tables on the host; every copy between the
two goes through :mod:`torchrec_ascend.kernels.transfers`, whose docstring lists them per training step (a batch's
IDs cross once each way, explicitly and batched, never per ID; on the CPU every copy is a no-op).
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple, cast

import torch
from torchrec.distributed.batched_embedding_kernel import (
    BatchedFusedEmbedding,
    BatchedFusedEmbeddingBag,
)
from torchrec.distributed.embedding_types import GroupedEmbeddingConfig
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from torchrec_ascend.adapters.tbe import TBE
from torchrec_ascend.hash.configs import HashTableSpec, hash_spec_of
from torchrec_ascend.hash.slot_table import SlotTable
from torchrec_ascend.kernels import fused_optimizers
from torchrec_ascend.kernels.id_mapper import IdMapper
from torchrec_ascend.kernels.pool import Pool
from torchrec_ascend.kernels.row_tier import PoolOnly, RowTier
from torchrec_ascend.kernels.shard_checkpoint import ShardCheckpoint, ShardInfo, ShardRows
from torchrec_ascend.kernels.tbe_config import with_reserved_rows, without_hash_params
from torchrec_ascend.kernels.transfers import to_device


class HashRows:
    """What every hash kernel is made of, wired: raw IDs -> rows through one :class:`SlotTable` per table.

    A TorchRec kernel class combines this with its stock kernel (TorchRec's lookup constructs the stock classes), wraps
    the stock kernel's TBE in ``self._tbe`` (:class:`~torchrec_ascend.adapters.tbe.TBE`, the only way to the TBE's and
    the stock kernel's private fields) right after the stock constructor, calls :meth:`_compose` at the end of its
    ``__init__`` and :meth:`lookup_rows` at the start of ``forward``. The work is the parts': ``pool``
    (:class:`~torchrec_ascend.kernels.pool.Pool`), ``row_tier`` (:mod:`~torchrec_ascend.kernels.row_tier`), the ID
    mapper (:class:`~torchrec_ascend.kernels.id_mapper.IdMapper`) and ``checkpoint``
    (:class:`~torchrec_ascend.kernels.shard_checkpoint.ShardCheckpoint`); the methods below only delegate.
    """

    _slot_tables: Sequence[SlotTable]  # a torch.nn.ModuleList: registered, moved and saved with the kernel
    _tbe: TBE
    training: bool  # torch.nn.Module's, from the TorchRec kernel class this is combined with

    def _compose(
        self,
        config: GroupedEmbeddingConfig,
        pool_rows: List[int],
        overflow: List[str],
        tier: Callable[[Pool], RowTier] = PoolOnly,
        shard_tables: Optional[Sequence[Any]] = None,
        hash_ids: Optional[List[bool]] = None,
        on_batch: Optional[Callable[[KeyedJaggedTensor], None]] = None,
    ) -> None:
        """Build the parts.

        Args:
            config: the shard's own grouped config (the tables' hash options and initialisation ranges).
            pool_rows: per table, the pool's rows (its IDs' plus the reserved default row).
            overflow: per table, what a full pool does (``"evict"`` or ``"error"``).
            tier: builds the row tier over the pool (:class:`PoolOnly` by default).
            shard_tables: per table, the sharded config checkpoints record (default: what TorchRec reports).
            hash_ids: per table, its keys are raw IDs (default: all; plain KEY_VALUE tables are keyed by row).
            on_batch: the ID mapper's per-batch call on the host IDs (see :class:`IdMapper`).
        """
        tables = config.embedding_tables
        specs = [hash_spec_of(t) or HashTableSpec() for t in tables]
        self._slot_tables = cast(Sequence[SlotTable], torch.nn.ModuleList(
            SlotTable(t.name, spec, rows, rule) for t, spec, rows, rule in zip(tables, specs, pool_rows, overflow)
        ))
        self._table_names = [t.name for t in tables]
        self.pool = Pool(self._tbe, tables, specs, [t.default_slot for t in self._slot_tables])
        self.row_tier: RowTier = tier(self.pool)
        feature_names = [f for t in tables for f in t.feature_names]
        self._mapper = IdMapper(self._slot_tables, feature_names, self._tbe.feature_table_map, self.pool,
                                self.row_tier, lambda: self.training, on_batch)
        self.checkpoint = ShardCheckpoint(
            self._slot_tables, self.pool, self.row_tier,
            self._tbe.config.embedding_tables if shard_tables is None else shard_tables,
            [True] * len(tables) if hash_ids is None else hash_ids,
        )
        # TorchRec's prefetch (called for KEY_VALUE tables by prefetching pipelines) hands the TBE raw IDs, which
        # fbgemm's bounds check would clamp in place: it comes to the ID mapper instead (see IdMapper.prefetch).
        self._tbe.route_prefetch(self._mapper.prefetch)

    # -- the ID mapper's ----------------------------------------------------------------------------------------------

    def lookup_rows(self, features: KeyedJaggedTensor) -> KeyedJaggedTensor:
        """``features`` with raw IDs replaced by rows: the prefetched ones, or chosen now (see :class:`IdMapper`)."""
        return self._mapper.lookup(features)

    def map_ids(self, features: KeyedJaggedTensor) -> KeyedJaggedTensor:
        """``features`` with raw IDs replaced by rows chosen now (nothing pinned); the values on their device."""
        return self._mapper.map_now(features)

    def set_pipeline_depth(self, depth: int) -> None:
        """Accept any depth: pins follow the batches actually in flight (see :meth:`IdMapper.prefetch`)."""
        self._mapper.set_pipeline_depth(depth)

    @property
    def prefetched_batches(self) -> int:
        """Lookups that found their rows ready (mapped by a prefetch)."""
        return self._mapper.prefetched_batches

    # -- the slot tables' ---------------------------------------------------------------------------------------------

    @property
    def num_tables(self) -> int:
        """Tables (table shards) this kernel holds."""
        return len(self._slot_tables)

    def slot_table(self, t: int) -> SlotTable:
        """The slot table of table ``t`` (index within this kernel)."""
        return self._slot_tables[t]

    def hash_stats(self) -> Dict[str, Dict[str, int]]:
        """Per-table counters of the slot tables (lookups, hits, inserted, evicted, rejected, size...)."""
        return {name: table.stats() for name, table in zip(self._table_names, self._slot_tables)}

    # -- the pool's and the checkpoint part's (torchrec_ascend.checkpoint, conformance, tests) ------------------------

    def initial_rows(self, t: int, ids: torch.Tensor) -> torch.Tensor:
        """See :meth:`Pool.initial_rows`."""
        return self.pool.initial_rows(t, ids)

    def row_width(self, t: int) -> int:
        """See :meth:`Pool.row_width`."""
        return self.pool.row_width(t)

    def pack_rows(self, t: int, slots: torch.Tensor) -> torch.Tensor:
        """See :meth:`Pool.pack`."""
        return self.pool.pack(t, slots)

    def optimizer_iteration(self) -> int:
        """See :meth:`Pool.iteration`."""
        return self.pool.iteration()

    def set_optimizer_iteration(self, value: int) -> None:
        """See :meth:`Pool.set_iteration`."""
        self.pool.set_iteration(value)

    def export_rows(self, t: int) -> Tuple[torch.Tensor, torch.Tensor, int]:
        """See :meth:`ShardCheckpoint.export_rows`."""
        return self.checkpoint.export_rows(t)

    def shard_info(self, t: int) -> ShardInfo:
        """See :meth:`ShardCheckpoint.shard_info`."""
        return self.checkpoint.shard_info(t)

    def export_shard(
        self, t: int, changed_only: bool = False
    ) -> Tuple[Iterator[ShardRows], Callable[[], torch.Tensor]]:
        """See :meth:`ShardCheckpoint.export_shard`."""
        return self.checkpoint.export_shard(t, changed_only)

    def shard_state(self, t: int) -> Dict[str, Any]:
        """See :meth:`ShardCheckpoint.shard_state`."""
        return self.checkpoint.shard_state(t)

    def fill_lower(self, t: int, lower: Iterable[Tuple[torch.Tensor, torch.Tensor]]) -> Optional[Callable[[], None]]:
        """See :meth:`ShardCheckpoint.fill_lower`."""
        return self.checkpoint.fill_lower(t, lower)

    def restore_shard(
        self, t: int, pooled: ShardRows, lower: Optional[Iterable[Tuple[torch.Tensor, torch.Tensor]]],
        state: Dict[str, Any],
    ) -> None:
        """See :meth:`ShardCheckpoint.restore_shard`."""
        self.checkpoint.restore_shard(t, pooled, lower, state)


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
        tbe_config = without_hash_params(with_reserved_rows(config))
        super().__init__(fused_optimizers.stock_config(tbe_config, device), pg, device, sharding_type, env)
        fused_optimizers.finish(self, tbe_config, device)
        self._tbe = TBE(self)
        self._tbe.hide_last_rows(without_hash_params(config))
        self._compose(config, _pool_rows(config), [s.overflow for s in _specs(config)])

    def forward(self, features: KeyedJaggedTensor, vbe_output: Any = None, vbe_output_offsets: Any = None) -> Any:
        return pooled_lookup(self, self.lookup_rows(features), vbe_output, vbe_output_offsets)


class HashFusedEmbedding(HashRows, BatchedFusedEmbedding):
    """FUSED kernel of EmbeddingCollection hash tables (sequence lookups); arguments as HashFusedEmbeddingBag."""

    def __init__(self, config: GroupedEmbeddingConfig, pg: Any = None, device: Any = None, env: Any = None) -> None:
        tbe_config = without_hash_params(with_reserved_rows(config))
        super().__init__(fused_optimizers.stock_config(tbe_config, device), pg, device)
        fused_optimizers.finish(self, tbe_config, device)
        self._tbe = TBE(self)
        self._tbe.hide_last_rows(without_hash_params(config))
        self._compose(config, _pool_rows(config), [s.overflow for s in _specs(config)])

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
    # The offsets stay where they are (no host read, no sync): block i's positions are starts[i] + 0..sizes[i]-1.
    total, device = sum(sizes), shared.device
    counts = to_device(torch.tensor(sizes, dtype=torch.int64), device)  # the one host-to-device copy
    starts = offsets.flatten()[:len(sizes)].to(torch.int64)  # [rank][feature], the order of ``own``'s blocks
    block_of = torch.repeat_interleave(torch.arange(len(sizes), device=device), counts, output_size=total)
    first = torch.cumsum(counts, 0) - counts  # each block's first element in ``own``
    positions = starts[block_of] + torch.arange(total, device=device) - first[block_of]
    return shared.index_copy(0, positions, own.to(shared.dtype))


def _specs(config: GroupedEmbeddingConfig) -> List[HashTableSpec]:
    return [hash_spec_of(t) or HashTableSpec() for t in config.embedding_tables]


def _pool_rows(config: GroupedEmbeddingConfig) -> List[int]:
    """Pool rows per table: the shard's rows, each holding an ID, plus the reserved default row."""
    return [t.local_rows + 1 for t in config.embedding_tables]
