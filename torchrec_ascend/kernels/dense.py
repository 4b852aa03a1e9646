"""DENSE kernels: tables replicated on every rank (data_parallel), gradients all-reduced by DDP.

:class:`SequenceDenseEmbedding` replaces TorchRec's ``BatchedDenseEmbedding`` where fbgemm's dense TBE ignores
``PoolingMode.NONE`` (its CPU implementation pools anyway), which breaks EmbeddingCollection + data_parallel. It
keeps the stock parameter layout (one flat weight, a view per table) so state_dict and DDP are unchanged, and looks
rows up per feature with ``torch.nn.functional.embedding``.

:class:`HashDenseEmbeddingBag` / :class:`HashDenseEmbedding` are data_parallel hash tables (small ones). Every rank
holds a replica, so every replica must give an ID the same row: in training each rank gathers all ranks' IDs of the
batch and inserts them in rank order (one all-gather per batch on the IDs' device; the map lives on the host, so
the gathered lengths and IDs go down once and this rank's rows come back once), then looks its own IDs up. The
dense optimizer keeps per-row state outside the kernel, so these tables refuse ``overflow="evict"`` (a reused row
would inherit state).
"""

from __future__ import annotations

from typing import Any, List, Optional

import torch
import torch.distributed as dist
from torchrec.distributed.batched_embedding_kernel import BatchedDenseEmbedding, BatchedDenseEmbeddingBag
from torchrec.distributed.embedding_types import GroupedEmbeddingConfig
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from torchrec_ascend.adapters.tbe import TBE
from torchrec_ascend.errors import ConfigError
from torchrec_ascend.hash.configs import HashTableSpec, hash_spec_of
from torchrec_ascend.kernels.fused import HashRows
from torchrec_ascend.kernels.id_mapper import with_values
from torchrec_ascend.kernels.tbe_config import with_reserved_rows, without_hash_params
from torchrec_ascend.kernels.transfers import to_device, to_host


class SequenceDenseEmbedding(BatchedDenseEmbedding):
    """Unpooled (sequence) lookup over the stock dense TBE's weights.

    Args:
        config: torchrec ``GroupedEmbeddingConfig`` of the tables in this group (same embedding_dim).
        pg: the process group.
        device: the device of the weights.
        env: the sharding env (unused; accepted for the factory's signature).

    Example::

        kernel = SequenceDenseEmbedding(config=grouped_config, pg=None, device=torch.device("cpu"))
        rows = kernel(kjt)   # [kjt.values().numel(), embedding_dim]
    """

    def __init__(self, config: Any, pg: Optional[Any] = None, device: Optional[torch.device] = None, env: Any = None):
        super().__init__(config=config, pg=pg, device=device)
        self._tbe = TBE(self, optimizer_states=False)

    def forward(self, features: KeyedJaggedTensor) -> torch.Tensor:
        tables = self._tbe.dense_table_weights()  # the whole pool (a hash table's reserved row)
        values = features.values().long()
        lengths = features.length_per_key()
        per_feature = torch.split(values, lengths)
        return torch.cat(
            [torch.nn.functional.embedding(ids, tables[t]) for ids, t in zip(per_feature, self._tbe.feature_table_map)]
        )


def _specs(config: GroupedEmbeddingConfig) -> List[HashTableSpec]:
    specs = [hash_spec_of(t) or HashTableSpec() for t in config.embedding_tables]
    evicting = [t.name for t, s in zip(config.embedding_tables, specs) if s.overflow == "evict"]
    if evicting:
        raise ConfigError(
            f"data_parallel hash tables {evicting} cannot use overflow='evict': the dense optimizer keeps row state "
            "a reused row would inherit. Use overflow='error', or shard them table_wise/row_wise (FUSED)."
        )
    return specs


#: The fewest IDs per rank a data_parallel hash table's all-gather carries (2 KiB of int64): small batches never widen.
_MIN_GATHER_WIDTH = 256


def _lengths_per_key(features: KeyedJaggedTensor) -> torch.Tensor:
    """IDs per feature, on the IDs' device (computed there, unless the batch's stride varies per feature)."""
    if features.variable_stride_per_key():
        return to_device(torch.tensor(features.length_per_key(), dtype=torch.int64), features.values().device)
    return features.lengths().long().view(len(features.keys()), features.stride()).sum(dim=1)


def _gather_to_host(tensor: torch.Tensor, group: Any) -> torch.Tensor:
    """Every rank's ``tensor`` (same shape everywhere), gathered on its device, then on the host: [world, numel]."""
    out = torch.empty(dist.get_world_size(group) * tensor.numel(), dtype=tensor.dtype, device=tensor.device)
    dist.all_gather_into_tensor(out, tensor, group=group)
    return to_host(out).view(dist.get_world_size(group), -1)


class HashDenseRows(HashRows):
    """The hash kernel's parts for replicated tables, plus the mapping that keeps replicas equal: every replica
    inserts all ranks' IDs in the same order."""

    #: IDs per rank the all-gather carries: a power of two, at least twice the largest batch seen and at least
    #: _MIN_GATHER_WIDTH (every rank derives it from the same gathered sizes).
    _gather_width: int = 0

    def map_replicated(self, features: KeyedJaggedTensor) -> KeyedJaggedTensor:
        """Rows for this rank's IDs, after inserting every rank's IDs of the batch (training).

        One all-gather on the IDs' device (an accelerator's group may have no host backend) carries each rank's
        lengths per feature and its IDs padded to the agreed width, then comes to the host (where the map lives) in
        one copy; a batch larger than the width widens it on every rank and gathers the IDs once more.
        """
        group = self._tbe.process_group
        if not self.training or group is None or dist.get_world_size(group) == 1 or not features.keys():
            return self.map_ids(features)
        world, rank = dist.get_world_size(group), dist.get_rank(group)
        keys, ids = features.keys(), features.values().long()

        def padded(width: int) -> torch.Tensor:
            return torch.nn.functional.pad(ids[:width], (0, width - min(width, ids.numel())))

        packed = _gather_to_host(torch.cat([_lengths_per_key(features), padded(self._gather_width)]), group)
        all_lengths = list(packed[:, : len(keys)])
        sizes = [int(x.sum()) for x in all_lengths]
        if max(sizes) > self._gather_width:
            # Headroom (widening costs a second gather and copy): twice the batch, at least _MIN_GATHER_WIDTH.
            self._gather_width = max(_MIN_GATHER_WIDTH, 1 << (2 * max(sizes) - 1).bit_length())
            gathered = list(_gather_to_host(padded(self._gather_width), group))
        else:
            gathered = list(packed[:, len(keys):])
        # Feature-major over ranks: feature f holds rank 0's IDs, then rank 1's, ...
        per_rank = [list(torch.split(g[:n], lens.tolist())) for g, n, lens in zip(gathered, sizes, all_lengths)]
        values = torch.cat([per_rank[r][f] for f in range(len(keys)) for r in range(world)])
        global_lengths = torch.stack([lens for lens in all_lengths], dim=1).sum(dim=1)
        everyone = KeyedJaggedTensor(keys=keys, values=values, lengths=global_lengths)
        mapped = self.map_ids(everyone).values()
        starts = torch.cumsum(torch.stack(all_lengths), dim=0) - torch.stack(all_lengths)  # [world, F]
        offsets = torch.cumsum(global_lengths, 0) - global_lengths
        mine = [mapped[int(o + starts[rank, f]): int(o + starts[rank, f] + all_lengths[rank][f])]
                for f, o in enumerate(offsets)]
        if not mine:
            return features
        return with_values(features, to_device(torch.cat(mine), features.values().device))  # rows, once


class HashDenseEmbeddingBag(HashDenseRows, BatchedDenseEmbeddingBag):
    """data_parallel kernel of EmbeddingBagCollection hash tables (arguments as TorchRec's dense kernel)."""

    def __init__(self, config: GroupedEmbeddingConfig, pg: Any = None, device: Any = None,
                 sharding_type: Any = None, env: Any = None) -> None:
        specs = _specs(config)
        super().__init__(without_hash_params(with_reserved_rows(config)), pg, device, sharding_type)
        self._tbe = TBE(self, optimizer_states=False)
        self._tbe.hide_last_rows(without_hash_params(config))
        self._compose(config, [r + 1 for r in self._tbe.local_rows], [s.overflow for s in specs])

    def forward(self, features: KeyedJaggedTensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        return super().forward(self.map_replicated(features), *args, **kwargs)


class HashDenseEmbedding(HashDenseRows, SequenceDenseEmbedding):
    """data_parallel kernel of EmbeddingCollection hash tables (unpooled lookups)."""

    def __init__(self, config: GroupedEmbeddingConfig, pg: Any = None, device: Any = None, env: Any = None) -> None:
        specs = _specs(config)
        super().__init__(without_hash_params(with_reserved_rows(config)), pg, device)  # wraps the TBE
        self._tbe.hide_last_rows(without_hash_params(config))
        self._compose(config, [r + 1 for r in self._tbe.local_rows], [s.overflow for s in specs])

    def forward(self, features: KeyedJaggedTensor) -> torch.Tensor:
        return super().forward(self.map_replicated(features))
