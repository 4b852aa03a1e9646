"""Unsharded hash tables: the modules a stock EmbeddingBagCollection / EmbeddingCollection holds for hash configs.

With torchrec-ascend active, ``EmbeddingBagCollection(tables=[HashEmbeddingBagConfig(...)])`` holds a
:class:`HashEmbeddingBag` where it would hold an ``nn.EmbeddingBag`` (and ``EmbeddingCollection`` a
:class:`HashEmbedding`): same call signature, same ``weight`` parameter (``[num_embeddings, dim]``), plus the
:class:`~torchrec_ascend.hash.slot_table.SlotTable` that maps raw IDs to its rows. Both are ordinary modules, so
``state_dict()`` / ``load_state_dict()`` carry the ID map with the weights.

A dense optimizer (as used unsharded) keeps its own per-parameter state: with ``overflow="evict"`` a reused row keeps
that state. Shard the table (FUSED kernel) when rows are evicted under a stateful optimizer.

``HashEmbeddingBagCollection`` / ``HashEmbeddingCollection`` are the RecSDK migration names: the stock collections,
accepting only hash configs (shard them with :func:`~torchrec_ascend.sharders.get_default_hybrid_sharders`).

Example::

    ebc = HashEmbeddingBagCollection(tables=[HashEmbeddingBagConfig(
        name="item", embedding_dim=8, num_embeddings=1000, feature_names=["item_id"])])
    pooled = ebc(kjt)   # any non-negative int64 IDs
"""

from __future__ import annotations

import itertools
from typing import Any, Callable, List, Optional, Tuple, Union, cast

import torch
from torchrec.modules.embedding_configs import pooling_type_to_str
from torchrec.modules.embedding_modules import EmbeddingBagCollection, EmbeddingCollection
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from torchrec_ascend.errors import ConfigError, check_non_negative_ids
from torchrec_ascend.hash.configs import HashEmbeddingBagConfig, HashEmbeddingConfig, is_hash_config
from torchrec_ascend.hash.slot_table import SlotTable, refuse_unused_eviction_settings
from torchrec_ascend.native import ops

HashConfig = Union[HashEmbeddingBagConfig, HashEmbeddingConfig]


class _HashRowsModule(torch.nn.Module):
    """Weight ``[num_embeddings, dim]`` plus the slot table choosing its rows (shared by the two lookups)."""

    def __init__(self, config: HashConfig, device: Optional[torch.device]) -> None:
        super().__init__()
        self.table = config.name
        self.features = list(config.feature_names or [config.name])  # the stock lookup does not say which one
        self.spec = config.hash_spec()
        self.init_range = (config.get_weight_init_min(), config.get_weight_init_max())
        self.weight = torch.nn.Parameter(torch.empty(config.num_embeddings, config.embedding_dim, device=device))
        # Every weight row can hold an ID; the reserved default row (slot num_embeddings) is not in the weight.
        # Eviction settings overflow="error" ignores are refused at the first training batch, not here: a config is
        # often built unsharded only to be sharded as KEY_VALUE, whose device cache evicts by them.
        self.slots = SlotTable(config.name, self.spec, config.num_embeddings + 1, self.spec.overflow,
                               refuse_unused=False)
        self._settings_checked = False

    def assign_batch(self, per_feature: List[torch.Tensor]) -> None:
        """Choose the rows of every feature of this table for one batch at once (one step of the table's policies,
        as the sharded kernels do); the stock collection's per-feature calls then read them (see :meth:`rows_for`).

        Example::

            lookup.assign_batch([kjt["f"].values(), kjt["g"].values()])   # f and g share the table
        """
        sizes = [ids.numel() for ids in per_feature]
        slots = self._assign(torch.cat(per_feature) if per_feature else torch.empty(0, dtype=torch.int64),
                             lambda: list(itertools.accumulate(sizes)))
        self._batch_rows = [
            ((ids.data_ptr(), ids.numel()), part)
            for ids, part in zip(per_feature, torch.split(slots, [ids.numel() for ids in per_feature]))
        ]

    def rows_for(self, ids: torch.Tensor) -> torch.Tensor:
        """Rows of ``ids`` (on the host), inserting new IDs in training (their rows initialised from (seed, ID,
        column)); the rows :meth:`assign_batch` chose for them if it ran for this batch."""
        pending = getattr(self, "_batch_rows", None)
        if pending and pending[0][0] == (ids.data_ptr(), ids.numel()):
            return pending.pop(0)[1]
        self._batch_rows = []
        return self._assign(ids, lambda: [ids.numel()] * len(self.features))

    def _assign(self, ids: torch.Tensor, ends: Callable[[], List[int]]) -> torch.Tensor:
        """Host rows of ``ids`` (feature-major, each feature's segment ending at ``ends()``): the ID map and the
        policies are host work, so device IDs cross to the host in one copy, checked there (no device sync)."""
        if self.training and not self._settings_checked:
            refuse_unused_eviction_settings(self.table, self.spec, self.spec.overflow)
            self._settings_checked = True
        on_host = ids.to("cpu")
        check_non_negative_ids(on_host, self.features, ends, lambda _: self.table)
        assignment = self.slots.assign(on_host.long(), training=self.training)
        if assignment.new_slots.numel():
            low, high = self.init_range
            device = self.weight.device
            initial = ops.hash_uniform_init(assignment.new_ids, self.spec.init_seed, self.weight.shape[1], low, high)
            with torch.no_grad():
                self.weight[assignment.new_slots.to(device, non_blocking=True)] = initial.to(
                    device, self.weight.dtype, non_blocking=True)
        return assignment.slots

    def table_and_rows(self, ids: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """The table to look ``ids`` up in, and their rows of it (on ``ids``' device, one host-to-device copy):
        ``weight`` and the IDs' rows; or, when some IDs read the reserved default row (rejected, or unknown in
        eval), only the batch's distinct rows (gathered from ``weight``, the default row as ``not_admitted_value``)
        and each ID's index among them."""
        rows = self.rows_for(ids)  # on the host: the checks below read no device memory
        if not bool((rows == self.slots.default_slot).any()):
            return self.weight, rows.to(ids.device, non_blocking=True)
        distinct, index = torch.unique(rows, return_inverse=True)
        distinct = distinct.to(self.weight.device, non_blocking=True)
        gathered = self.weight[distinct.clamp(max=self.weight.shape[0] - 1)]
        return torch.where((distinct == self.slots.default_slot).unsqueeze(1), self.spec.not_admitted_value,
                           gathered), index.to(ids.device, non_blocking=True)

    def _apply(self, fn: Callable[..., Any], recurse: bool = True) -> "_HashRowsModule":
        """``.to(device)`` / casts move the weight; the slot table stays on the host (its ID map is a host op)."""
        slots = self._modules["slots"]
        self._modules["slots"] = None  # skipped by nn.Module._apply; the key keeps its place (state_dict order)
        try:
            return cast("_HashRowsModule", super()._apply(fn, recurse))
        finally:
            self._modules["slots"] = slots


class HashEmbeddingBag(_HashRowsModule):
    """Pooled lookup of one hash table (the ``nn.EmbeddingBag`` of a hash config).

    Args:
        config: the table's config.
        device: where the weight lives.
    """

    def __init__(self, config: HashEmbeddingBagConfig, device: Optional[torch.device] = None) -> None:
        super().__init__(config, device)
        self.mode = pooling_type_to_str(config.pooling)

    def forward(
        self, input: torch.Tensor, offsets: torch.Tensor, per_sample_weights: Optional[torch.Tensor] = None
    ) -> torch.Tensor:
        table, rows = self.table_and_rows(input)
        return torch.nn.functional.embedding_bag(
            rows, table, offsets, mode=self.mode, per_sample_weights=per_sample_weights, include_last_offset=True
        )


class HashEmbedding(_HashRowsModule):
    """Sequence lookup of one hash table (the ``nn.Embedding`` of a hash config).

    Args:
        config: the table's config.
        device: where the weight lives.
    """

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        table, rows = self.table_and_rows(input)
        return torch.nn.functional.embedding(rows, table)


def install_hash_modules(collection: torch.nn.Module, configs: List[Any], attribute: str) -> None:
    """Replace the stock lookups of hash configs in a collection (called after the stock ``__init__``)."""
    lookups = getattr(collection, attribute)
    device = getattr(collection, "_device", None)
    shared = []
    for config in configs:
        if is_hash_config(config):
            cls = HashEmbeddingBag if attribute == "embedding_bags" else HashEmbedding
            lookups[config.name] = cls(config, device=device)
            if len(lookups[config.name].features) > 1:
                shared.append(config.name)
    if shared:
        # A step is a batch: a table read by several features maps all of their IDs in one call per batch.
        collection.register_forward_pre_hook(lambda module, args: _assign_shared(getattr(module, attribute), shared,
                                                                                 args[0]))


def _assign_shared(lookups: torch.nn.ModuleDict, tables: List[str], features: KeyedJaggedTensor) -> None:
    per_key = features.to_dict()
    for name in tables:
        lookup = cast(_HashRowsModule, lookups[name])
        lookup.assign_batch([per_key[f].values() for f in lookup.features])


def _require_hash(configs: List[object], cls: str) -> None:
    plain = [getattr(c, "name", "?") for c in configs if not is_hash_config(c)]
    if plain:
        raise ConfigError(
            f"{cls} takes hash table configs only; {plain} are plain. Use HashEmbeddingBagConfig / "
            "HashEmbeddingConfig, or the stock collection for plain tables."
        )


class HashEmbeddingBagCollection(EmbeddingBagCollection):
    """RecSDK's name: an EmbeddingBagCollection of :class:`HashEmbeddingBagConfig` tables."""

    def __init__(self, tables: List[HashEmbeddingBagConfig], is_weighted: bool = False,
                 device: Optional[torch.device] = None) -> None:
        _require_hash(list(tables), type(self).__name__)
        super().__init__(tables=tables, is_weighted=is_weighted, device=device)


class HashEmbeddingCollection(EmbeddingCollection):
    """RecSDK's name: an EmbeddingCollection of :class:`HashEmbeddingConfig` tables."""

    def __init__(self, tables: List[HashEmbeddingConfig], device: Optional[torch.device] = None,
                 need_indices: bool = False) -> None:
        _require_hash(list(tables), type(self).__name__)
        super().__init__(tables=tables, device=device, need_indices=need_indices)


__all__ = [
    "HashEmbedding",
    "HashEmbeddingBag",
    "HashEmbeddingBagCollection",
    "HashEmbeddingCollection",
]
