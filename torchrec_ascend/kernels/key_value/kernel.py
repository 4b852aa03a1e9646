"""The KEY_VALUE kernels: a device cache of hot rows over a host store over a disk store.

The device cache is an fbgemm TBE with a fixed number of rows (TorchRec's ``CacheParams(load_factor=...)`` of the
shard's rows; the only part on the accelerator), trained exactly as the FUSED kernel trains its table: the optimizer
runs inside backward on the cached rows. A :class:`~torchrec_ascend.hash.slot_table.SlotTable` per table decides
which rows are cached; per batch it produces the swap plan (keys in, keys out, rows) with vectorized ops:

* rows leaving the cache (chosen by the table's eviction policy, never rows of the batches in flight) are written
  back, weights and optimizer state together, to the :class:`HostStore`, which spills to the :class:`DiskStore`
  beyond its byte budget;
* rows entering it are taken from those stores, or, for an ID never seen, initialised as a function of (seed, ID,
  column) with zero optimizer state (the admission policy may refuse a new ID: it then reads the not-admitted vector
  and keeps no state).

No row is ever lost, and a row's bytes go down and come back unchanged, so a KEY_VALUE table with a tiny cache
trains bit for bit like a FUSED table holding every row. Plain (non-hash) tables work the same way, keyed by row
index (initialised from the global row index).

Sizes, set the way TorchRec users set them (``ParameterConstraints``):

* ``cache_params=CacheParams(load_factor=f)``: the cache holds ``ceil(f * shard rows)`` rows (default 0.2), plus one
  extra row for the not-admitted vector, so ``load_factor=1.0`` holds the whole shard and trains exactly as FUSED;
* ``key_value_params=KeyValueParams(l2_cache_size=GB, ssd_storage_directory=DIR)``: the host budget in GB (fractional
  values allowed; default unbounded) and the directory of the disk tier (default: none, so an exhausted host budget
  is an error naming the table). Each rank and table gets its own subdirectory.

TorchRec's stock ``state_dict`` of a KEY_VALUE table holds a zero-cost placeholder of the table's shape (the rows live
in three tiers); :func:`cache_metrics` reports what is where, and the checkpoint ``Saver`` saves and loads the rows.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import math
import os
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Tuple, cast

import torch
from torchrec.distributed.batched_embedding_kernel import BatchedFusedEmbedding, BatchedFusedEmbeddingBag
from torchrec.distributed.embedding_kernel import get_state_dict
from torchrec.distributed.embedding_types import GroupedEmbeddingConfig
from torchrec.distributed.types import KeyValueParams
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from torchrec_ascend.adapters.tbe import TBE
from torchrec_ascend.errors import ConfigError, InputError
from torchrec_ascend.hash.configs import FUSED_PARAMS_KEY, hash_spec_of
from torchrec_ascend.kernels import fused_optimizers
from torchrec_ascend.kernels.fused import HashRows, place_vbe_output, pooled_lookup
from torchrec_ascend.kernels.id_mapper import with_values
from torchrec_ascend.kernels.key_value.tier import HostDiskTier
from torchrec_ascend.kernels.shard_checkpoint import ShardRows
from torchrec_ascend.kernels.tbe_config import with_block_rows
from torchrec_ascend.kernels.transfers import to_device, to_host
from torchrec_ascend.kernels.walk import sharded_kernels
from torchrec_ascend.native import ops
from torchrec_ascend.native.memory import reserve

logger = logging.getLogger(__name__)

DEFAULT_LOAD_FACTOR = 0.2
# Keys TorchRec merges into fused_params for key_value tables that fbgemm's TBE does not take.
_NOT_TBE_PARAMS = {f.name for f in KeyValueParams.__dataclass_fields__.values()} | {FUSED_PARAMS_KEY}


def cache_rows(local_rows: int, load_factor: Optional[float]) -> int:
    """Device-cache rows for a shard of ``local_rows`` rows: ``ceil(load_factor * local_rows)`` rows for IDs (at least
    one) plus the reserved row of the not-admitted vector, so ``load_factor=1.0`` caches the whole shard.

    Example::

        cache_rows(5, 1.0)   # 6: every row of the shard, and the reserved one
    """
    factor = DEFAULT_LOAD_FACTOR if load_factor is None else load_factor
    if not 0.0 < factor <= 1.0:
        raise ConfigError(f"key_value: CacheParams(load_factor={factor}) must be in (0, 1]")
    return max(1, math.ceil(factor * local_rows)) + 1


def _cache_table(table: Any, load_factor: Optional[float]) -> Any:
    """A sharded table as the cache sees it: every row block shrunk to its cache size (see :func:`with_block_rows`).

    TorchRec's fused optimizer wraps the TBE's (cache-sized) weights and states in ShardedTensors checked against
    the table's metadata, so the metadata must describe the cache consistently on every rank.
    """
    return with_block_rows(table, lambda rows: cache_rows(rows, load_factor))


def _cache_config(config: GroupedEmbeddingConfig) -> GroupedEmbeddingConfig:
    """The grouped config as the TBE must see it: cache-sized tables, no key-value-only parameters."""
    fused = {k: v for k, v in (config.fused_params or {}).items() if k not in _NOT_TBE_PARAMS}
    # Each table keeps its own load factor (TorchRec leaves it out of the group's fused_params on purpose).
    tables = [_cache_table(t, (t.fused_params or {}).get("cache_load_factor")) for t in config.embedding_tables]
    return dataclasses.replace(config, embedding_tables=tables, fused_params=fused)


def zeros_without_memory(rows: int, cols: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """A contiguous ``[rows, cols]`` of zeros (float32, float16 or bfloat16) that costs no memory until written
    (reserved address space, see :func:`reserve`: pages are materialised on touch only, and a table larger than RAM +
    swap still maps)."""
    import numpy as np

    kind = {torch.float32: np.float32, torch.float16: np.float16, torch.bfloat16: np.uint16}[dtype]
    return torch.from_numpy(reserve(kind, rows * cols)).view(dtype).view(rows, cols)  # NumPy has no bfloat16


def on_the_host(tables: List[Any]) -> List[Any]:
    """Copies of shard table configs whose shard placement is the host (same rank), as stock TorchRec's own
    KEY_VALUE kernel reports its shards: the rows live in host and disk tiers, and a contiguous placeholder of a
    table's shape on an accelerator would cost its memory (a zero-stride one is refused by ShardedTensor).

    Example::

        on_the_host(config.embedding_tables)[0].local_metadata.placement.device()   # device(type='cpu')
    """
    copies = copy.deepcopy(tables)
    for table in copies:
        placement = table.local_metadata.placement
        table.local_metadata.placement = torch.distributed._remote_device(f"rank:{placement.rank()}/cpu")
    return copies


class KeyValueRows(HashRows):
    """The hash kernel's parts over a :class:`HostDiskTier`: rows swapped to and from a host store (spilling to
    disk) instead of dropped; plus KEY_VALUE's cache metrics and evaluation from the tiers."""

    def _compose_key_value(self, config: GroupedEmbeddingConfig) -> None:
        """Build the parts; ``config`` is the shard's own (not cache-sized) grouped config."""
        tables = config.embedding_tables
        self._shard_tables = tables
        self._shard_rows = [t.local_rows for t in tables]
        self._tbe = TBE(self)
        is_hash = [hash_spec_of(t) is not None for t in tables]
        self._log_every = int(os.environ.get("TORCHREC_ASCEND_METRICS_EVERY", "1000"))
        self._batches = 0
        self._compose(
            config, self._tbe.local_rows, ["evict"] * len(tables),
            tier=lambda pool: HostDiskTier(pool, config, is_hash), shard_tables=tables, hash_ids=is_hash,
            on_batch=self._on_host_batch,
        )
        self._tier = cast(HostDiskTier, self.row_tier)
        self._stores = self._tier.stores  # read by the metrics below and the scale benchmark
        self._storage_directory = (config.fused_params or {}).get("ssd_storage_directory")
        self._load_hook: Optional[Callable[[], None]] = None
        self._load_hook_owner: Any = None
        self._tbe.route_prefetch(self._prefetch)

    # -- loads through stock state_dict views (torchrec_ascend.checkpoint.key_value_state) ---------------------------

    def set_load_hook(self, owner: Any, hook: Callable[[], None]) -> None:
        """Call ``hook`` before rows move (a batch's lookup or prefetch, a checkpoint export or restore): the owner
        of the table's state_dict views applies a load written into them. Only one owner."""
        self._load_hook_owner, self._load_hook = owner, hook

    def load_hook_owner(self) -> Any:
        """What :meth:`set_load_hook` was given (None before)."""
        return self._load_hook_owner

    def _settle_loads(self) -> None:
        if self._load_hook is not None:
            self._load_hook()

    def _prefetch(self, *args: Any, **kwargs: Any) -> None:
        self._settle_loads()
        self._mapper.prefetch(*args, **kwargs)

    def lookup_rows(self, features: KeyedJaggedTensor) -> KeyedJaggedTensor:
        self._settle_loads()
        return super().lookup_rows(features)

    def map_ids(self, features: KeyedJaggedTensor) -> KeyedJaggedTensor:
        self._settle_loads()
        return super().map_ids(features)

    def export_shard(
        self, t: int, changed_only: bool = False
    ) -> Tuple[Iterator[ShardRows], Callable[[], torch.Tensor]]:
        self._settle_loads()
        return super().export_shard(t, changed_only)

    def fill_lower(self, t: int, lower: Iterable[Tuple[torch.Tensor, torch.Tensor]]) -> Optional[Callable[[], None]]:
        self._settle_loads()
        return super().fill_lower(t, lower)

    def restore_shard(
        self, t: int, pooled: ShardRows, lower: Optional[Iterable[Tuple[torch.Tensor, torch.Tensor]]],
        state: Dict[str, Any],
    ) -> None:
        self._settle_loads()
        super().restore_shard(t, pooled, lower, state)

    def weight_dtype(self, t: int) -> torch.dtype:
        """The dtype of table ``t``'s weights."""
        return self._tbe.weights(t).dtype

    def storage_directory(self, t: int) -> Optional[str]:
        """The directory of table ``t``'s disk tier (None: no disk tier)."""
        return self._storage_directory

    @property
    def process_group(self) -> Any:
        """The kernel's process group (its tables' ShardedTensors live in it)."""
        return self._tbe.process_group

    def _eval_on_host(self, features: KeyedJaggedTensor) -> Optional[KeyedJaggedTensor]:
        """For an evaluation batch whose rows the cache cannot take now: the batch with its IDs on the host (for
        :meth:`rows_from_tiers`); None otherwise (training, or the batch fits)."""
        self._settle_loads()
        if self.training:
            return None
        on_host = with_values(features, to_host(features.values()))
        return None if self._mapper.fits(on_host) else on_host

    def rows_from_tiers(self, features: KeyedJaggedTensor) -> List[torch.Tensor]:
        """Per feature, the current row of each of its IDs (this shard's columns), read from whichever tier holds it.

        For evaluation batches larger than the cache: nothing moves between tiers and no counter changes. Unknown
        IDs of a hash table read the not-admitted vector; rows of a plain table never trained read their initial
        value (as they would in a FUSED table).

        Returns:
            List[Tensor]: per feature of ``features``, float32 ``[its IDs, its table's local columns]``.

        Example::

            rows = kernel.rows_from_tiers(kjt)   # kjt: this kernel's features, raw IDs
        """
        per_feature = list(torch.split(features.values(), features.length_per_key()))
        out: List[Any] = [None] * len(per_feature)
        for t, table in enumerate(self._slot_tables):
            features_of_t = [i for i, ft in enumerate(self._tbe.feature_table_map) if ft == t]
            if not features_of_t:
                continue
            ids = torch.cat([per_feature[i] for i in features_of_t]).long()
            unique, inverse, _ = ops.hash_unique(ids)
            cols = self.pool.cols(t)
            rows = torch.full((unique.numel(), cols), table.spec.not_admitted_value)
            slots = table.id_map.lookup(unique)
            cached = slots >= 0
            rows[cached] = self.pool.gather(t, slots[cached]).float()
            below = (~cached).nonzero().squeeze(1)
            stored, found = self._tier.read(t, unique[below])
            rows[below[found]] = stored[found, :cols].float()
            if not self._tier.is_hash[t]:
                fresh = below[~found]
                rows[fresh] = self.pool.initial_rows(t, unique[fresh] + self._tier.key_offsets[t]).float()
            per_id = rows[inverse]
            for i, part in zip(features_of_t, torch.split(per_id, [per_feature[i].numel() for i in features_of_t])):
                out[i] = part
        return out

    def _on_host_batch(self, features: KeyedJaggedTensor) -> None:
        """The ID mapper's call with each batch's host IDs, before they are mapped: plain tables' rows must lie in
        the shard; every ``TORCHREC_ASCEND_METRICS_EVERY`` batches the cache metrics are logged.

        Raises:
            InputError: a plain table's row beyond the shard (the message names the table and feature).
        """
        if not all(self._tier.is_hash):
            per_feature = torch.split(features.values(), features.length_per_key())
            for feature, t, ids in zip(features.keys(), self._tbe.feature_table_map, per_feature):
                if not self._tier.is_hash[t] and ids.numel() and int(ids.max()) >= self._shard_rows[t]:
                    raise InputError(
                        f"table {self._table_names[t]!r}, feature {feature!r}: row {int(ids.max())} is out of range "
                        f"for a shard of {self._shard_rows[t]} rows (num_embeddings too small for the IDs?)"
                    )
        self._batches += 1
        if self._log_every and self._batches % self._log_every == 0:
            logger.info("key_value cache metrics after %d batches: %s", self._batches, self.cache_stats())

    def cache_stats(self) -> Dict[str, Dict[str, int]]:
        """Per table: cache hits/lookups, rows swapped in/out, evictions, admitted/rejected, rows and bytes per tier."""
        out = {}
        for t, name in enumerate(self._table_names):
            slot = self._slot_tables[t].stats()
            store = self._stores[t].stats()
            out[name] = {
                **slot,
                **self._tier.swaps[t],
                "cache_rows": slot["capacity"],
                "cache_bytes": (slot["capacity"] + 1) * self._stores[t].row_bytes,
                **{k: v for k, v in store.items() if isinstance(v, int)},
            }
        return out

    def flush(self) -> None:
        """Nothing to flush: rows in the cache are the current ones; stores hold the rest."""

    def close(self) -> None:
        """Release the host and disk tiers (removes the disk files)."""
        for store in self._stores:
            store.close()

    def state_dict(self, destination: Any = None, prefix: str = "", keep_vars: bool = False) -> Dict[str, Any]:
        # TorchRec builds each table's ShardedTensor from this once, at sharding time: give it the shard's shape
        # without memory (the rows live in three tiers; the checkpoint Saver saves them).
        placeholders = [
            zeros_without_memory(rows, cols, self._tbe.weights(t).dtype)
            for t, (rows, cols) in enumerate(zip(self._shard_rows, self._tbe.local_cols))
        ]
        return get_state_dict(on_the_host(self._shard_tables), placeholders, self._tbe.process_group,
                              destination, prefix)


class KeyValueEmbeddingBag(KeyValueRows, BatchedFusedEmbeddingBag):
    """KEY_VALUE kernel of EmbeddingBagCollection tables (hash or plain); see the module docstring.

    Example::

        ParameterConstraints(compute_kernels=["key_value"], cache_params=CacheParams(load_factor=0.1),
                             key_value_params=KeyValueParams(l2_cache_size=4, ssd_storage_directory="/ssd"))
    """

    def __init__(self, config: GroupedEmbeddingConfig, pg: Any = None, device: Any = None,
                 sharding_type: Any = None, env: Any = None) -> None:
        cache_config = _cache_config(config)
        super().__init__(fused_optimizers.stock_config(cache_config, device), pg, device, sharding_type, env)
        fused_optimizers.finish(self, cache_config, device)
        self._compose_key_value(config)

    def forward(
        self,
        features: KeyedJaggedTensor,
        vbe_output: Optional[torch.Tensor] = None,
        vbe_output_offsets: Optional[torch.Tensor] = None,
    ) -> torch.Tensor:
        on_host = self._eval_on_host(features)
        if on_host is not None:  # evaluation larger than the free cache: nothing is swapped
            pooled = self._pooled_from_tiers(on_host, features.weights_or_none())
            device = features.values().device
            if not features.variable_stride_per_key():
                return to_device(torch.cat(pooled, dim=1), device)
            pooled_vbe = vbe_layout(pooled, features.stride_per_key_per_rank(), vbe_output, vbe_output_offsets)
            return to_device(pooled_vbe, device)
        return pooled_lookup(self, self.lookup_rows(features), vbe_output, vbe_output_offsets)

    def _pooled_from_tiers(self, features: KeyedJaggedTensor, weights: Optional[torch.Tensor]) -> List[torch.Tensor]:
        """Per feature, its pooled rows ``[its samples, its dim]`` computed from :meth:`rows_from_tiers` (evaluation;
        a variable batch's samples of each feature in rank order)."""
        from fbgemm_gpu.split_table_batched_embeddings_ops_common import PoolingMode

        rows = self.rows_from_tiers(features)
        weights = None if weights is None else to_host(weights)
        if weights is not None:
            rows = [r * w.unsqueeze(1).float() for r, w in zip(rows, torch.split(weights, features.length_per_key()))]
        lengths = to_host(features.lengths()).long()
        samples = features.stride_per_key()
        first = [sum(samples[:i]) for i in range(len(samples))]  # each feature's first sample
        bags = torch.repeat_interleave(torch.arange(lengths.numel()), lengths)
        mean = self._tbe.pooling_mode == PoolingMode.MEAN
        pooled = []
        for i, part in enumerate(rows):
            feature_bags = bags[features.offset_per_key()[i]:features.offset_per_key()[i + 1]] - first[i]
            sums = torch.zeros(samples[i], part.shape[1]).index_add_(0, feature_bags, part)
            if mean:
                sums = sums / lengths[first[i]:first[i] + samples[i]].clamp(min=1).unsqueeze(1)
            pooled.append(sums)
        return pooled


class KeyValueEmbedding(KeyValueRows, BatchedFusedEmbedding):
    """KEY_VALUE kernel of EmbeddingCollection tables (hash or plain); see the module docstring."""

    def __init__(self, config: GroupedEmbeddingConfig, pg: Any = None, device: Any = None, env: Any = None) -> None:
        cache_config = _cache_config(config)
        super().__init__(fused_optimizers.stock_config(cache_config, device), pg, device)
        fused_optimizers.finish(self, cache_config, device)
        self._compose_key_value(config)

    def forward(self, features: KeyedJaggedTensor) -> torch.Tensor:
        on_host = self._eval_on_host(features)
        if on_host is not None:  # evaluation larger than the free cache: nothing is swapped
            rows = self.rows_from_tiers(on_host)
            out = torch.cat(rows) if rows else torch.zeros(0, self._tbe.local_cols[0])
            return to_device(out, features.values().device)
        return BatchedFusedEmbedding.forward(self, self.lookup_rows(features))


def vbe_layout(
    pooled: List[torch.Tensor],
    samples_per_rank: List[List[int]],
    out: Optional[torch.Tensor],
    offsets: Optional[torch.Tensor],
) -> torch.Tensor:
    """Per-feature pooled rows in the TBE's variable-batch output layout: 1-D, rank-major, each (rank, feature)
    block its ``[samples, dim]`` rows flattened; placed at ``offsets[rank][feature]`` of ``out`` when TorchRec
    preallocated one output for several kernels (see :func:`place_vbe_output`).

    Example::

        vbe_layout([torch.ones(3, 2)], [[1, 2]], None, None)   # 6 values: rank 0's sample, then rank 1's two
    """
    blocks = [list(torch.split(p, ranks)) for p, ranks in zip(pooled, samples_per_rank)]
    world = len(samples_per_rank[0]) if samples_per_rank else 0
    flat = [blocks[f][r].flatten() for r in range(world) for f in range(len(blocks))]
    own = torch.cat(flat) if flat else torch.zeros(0)
    if out is None:
        return own
    assert offsets is not None, "TorchRec passes vbe_output_offsets with vbe_output"
    return place_vbe_output(own, samples_per_rank, [p.shape[1] for p in pooled], out, offsets)


def cache_metrics(model: torch.nn.Module) -> Dict[str, Dict[str, int]]:
    """Per-table KEY_VALUE metrics of a sharded model on this rank (see :meth:`KeyValueRows.cache_stats`).

    Example::

        stats = cache_metrics(dmp)["item"]
        hit_rate = stats["hits"] / max(1, stats["lookups"])
    """
    out: Dict[str, Dict[str, int]] = {}
    for kernel in sharded_kernels(model):
        if isinstance(kernel, KeyValueRows):
            out.update(kernel.cache_stats())
    return out


__all__ = ["KeyValueEmbedding", "KeyValueEmbeddingBag", "KeyValueRows", "cache_metrics", "cache_rows"]
