"""Hash table configs: TorchRec table configs whose IDs are raw int64 values, not row indices.

``HashEmbeddingBagConfig`` / ``HashEmbeddingConfig`` subclass TorchRec's ``EmbeddingBagConfig`` / ``EmbeddingConfig``.
With only the stock fields set, ``num_embeddings`` is the table's row *capacity* (the most IDs it holds at once) and
every other option has a default. A new ID's initial row is a function of ``init_seed``, the ID and the column only
(uniform in ``[weight_init_min, weight_init_max)``, TorchRec's defaults when unset), so results do not depend on
arrival order, world size or kernel.

Example::

    from torchrec import EmbeddingBagCollection
    from torchrec_ascend import HashEmbeddingBagConfig

    ebc = EmbeddingBagCollection(tables=[
        HashEmbeddingBagConfig(name="user", embedding_dim=16, num_embeddings=1_000_000, feature_names=["uid"]),
    ])
    # ebc now accepts any non-negative int64 user ID.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Dict, Optional, Tuple

import torch
from torchrec.modules.embedding_configs import BaseEmbeddingConfig, EmbeddingBagConfig, EmbeddingConfig

from torchrec_ascend.errors import ConfigError

OVERFLOW_RULES = ("error", "evict")
DEFAULT_EVICTION_POLICY = "lru"
CADENCE_OPTIONS = ("interval", "min_residency", "headroom")  # EvictionCadence's options
# Key under which a table's HashTableSpec travels in TorchRec's per-table fused_params (which must be hashable).
FUSED_PARAMS_KEY = "torchrec_ascend_hash"


@dataclasses.dataclass(frozen=True)
class HashTableSpec:
    """The hash options of one table, frozen and hashable: what kernels receive in the table's fused_params.

    Capacity and initial value range are not part of it (kernels read them from TorchRec's own table config), so
    hash tables with the same options share one grouped kernel as plain tables do.

    Args:
        overflow: ``"error"`` raises when an insert finds the table full; ``"evict"`` frees rows chosen by the
            eviction policy first (counted in the table's metrics).
        eviction_policy: policy name (see ``torchrec-ascend policies``); used by ``"evict"`` and by the KEY_VALUE
            device cache.
        eviction_options: policy options as sorted ``(name, value)`` pairs.
        admission_policy: policy name deciding whether a new ID gets a row; None admits every ID.
        admission_options: policy options as sorted pairs.
        not_admitted_value: every element of the vector a rejected (or, in eval mode, unknown) ID is looked up as.
        init_seed: seed of the deterministic per-ID initialisation.
        eviction_cadence: options of :class:`~torchrec_ascend.policies.cadence.EvictionCadence` as sorted pairs.
    """

    overflow: str = "error"
    eviction_policy: str = DEFAULT_EVICTION_POLICY
    eviction_options: Tuple[Tuple[str, Any], ...] = ()
    admission_policy: Optional[str] = None
    admission_options: Tuple[Tuple[str, Any], ...] = ()
    not_admitted_value: float = 0.0
    init_seed: int = 0
    eviction_cadence: Tuple[Tuple[str, Any], ...] = ()


@dataclasses.dataclass
class HashTableOptions:
    """The fields a hash config adds to TorchRec's (a dataclass mixed into both config classes, after theirs).

    A table holds up to ``num_embeddings`` IDs at once, however it is sharded (the vector rejected IDs read lives in
    one extra row per shard, outside ``num_embeddings``).

    Args:
        overflow: ``"error"`` (default) or ``"evict"`` when the capacity is full.
        eviction_policy: eviction policy name, default ``"lru"``.
        eviction_options: options of the eviction policy.
        admission_policy: admission policy name; None (default) admits every new ID.
        admission_options: options of the admission policy.
        not_admitted_value: value of the vector a rejected ID is looked up as.
        init_seed: seed of the deterministic per-ID initialisation.
        eviction_cadence: when the pool evicts (RecSDK fixes every 10 steps): ``interval`` (steps between bulk
            evictions, which also drop the rows the policy calls expired, e.g. TTL), ``min_residency`` (steps a new
            row is protected, against thrashing), ``headroom`` (fraction left free by a bulk eviction). Default:
            evict only what a batch needs, every step.
    """

    overflow: str = "error"
    eviction_policy: str = DEFAULT_EVICTION_POLICY
    eviction_options: Dict[str, Any] = dataclasses.field(default_factory=dict)
    admission_policy: Optional[str] = None
    admission_options: Dict[str, Any] = dataclasses.field(default_factory=dict)
    not_admitted_value: float = 0.0
    init_seed: int = 0
    eviction_cadence: Dict[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        assert isinstance(self, BaseEmbeddingConfig)
        where = f"hash table {self.name!r}"
        if not _is_int(self.num_embeddings) or self.num_embeddings < 1:  # before TorchRec's checks, which divide by it
            raise ConfigError(
                f"{where}: num_embeddings is the row capacity and must be an integer >= 1, got {self.num_embeddings!r}"
            )
        if not _is_int(self.embedding_dim) or self.embedding_dim < 1:
            raise ConfigError(
                f"{where}: embedding_dim is the width of a row and must be an integer >= 1, got {self.embedding_dim!r}"
            )
        ignored = [f"{name}={getattr(self, name)!r}" for name, default in IGNORED_STOCK_FIELDS.items()
                   if getattr(self, name, default) != default and not _stock_default_init(name, self)]
        if ignored:
            raise ConfigError(
                f"{where}: {', '.join(ignored)} would be ignored: a hash table maps raw IDs itself and initialises a "
                "new ID's row from init_seed, the ID and the column in [weight_init_min, weight_init_max). Remove "
                "them, or use a plain EmbeddingBagConfig / EmbeddingConfig for these features"
            )
        super().__post_init__()  # type: ignore[misc]  # TorchRec's config (next in the MRO)
        if self.overflow not in OVERFLOW_RULES:
            raise ConfigError(f"{where}: overflow must be one of {OVERFLOW_RULES}, got {self.overflow!r}")
        if not self.eviction_policy:
            raise ConfigError(f"{where}: eviction_policy must name a policy (see `torchrec-ascend policies`)")
        if not isinstance(self.eviction_options, dict):
            raise ConfigError(f"{where}: eviction_options must be a dict of the policy's options, got "
                              f"{type(self.eviction_options).__name__}")
        misplaced = sorted(set(self.eviction_options) & set(TABLE_OPTIONS))
        if misplaced:
            given = ", ".join(f"{k}={self.eviction_options[k]!r}" for k in misplaced)
            raise ConfigError(
                f"{where}: eviction_options holds {given}: table options the eviction policy never reads. Pass "
                f"{given} to the config itself, not inside eviction_options"
            )
        unknown = sorted(set(self.eviction_cadence) - set(CADENCE_OPTIONS))
        if unknown:
            raise ConfigError(
                f"{where}: eviction_cadence does not take {unknown}; it takes {', '.join(CADENCE_OPTIONS)}"
            )
        if self.admission_options and not self.admission_policy:
            raise ConfigError(f"{where}: admission_options {sorted(self.admission_options)} are given without an "
                              "admission_policy; name the policy they are for (see `torchrec-ascend policies`)")
        low, high = self.weight_init_min, self.weight_init_max
        if low is not None and high is not None and not low < high:
            raise ConfigError(f"{where}: weight_init_min ({low}) must be below weight_init_max ({high})")

    def hash_spec(self) -> HashTableSpec:
        """This table's options as a frozen :class:`HashTableSpec`."""
        return HashTableSpec(
            overflow=self.overflow,
            eviction_policy=self.eviction_policy,
            eviction_options=tuple(sorted(self.eviction_options.items())),
            admission_policy=self.admission_policy,
            admission_options=tuple(sorted(self.admission_options.items())),
            not_admitted_value=float(self.not_admitted_value),
            init_seed=int(self.init_seed),
            eviction_cadence=tuple(sorted(self.eviction_cadence.items())),
        )


TABLE_OPTIONS = tuple(f.name for f in dataclasses.fields(HashTableOptions))
# Stock TorchRec config fields (with their defaults) a hash table never reads: giving one is refused, not ignored.
IGNORED_STOCK_FIELDS: Dict[str, Any] = {
    "init_fn": None,
    "num_embeddings_post_pruning": None,
    "total_num_buckets": None,
    "use_virtual_table": False,
    "enable_embedding_update": False,
}


def _stock_default_init(name: str, config: Any) -> bool:
    """Whether ``name`` is ``init_fn`` holding TorchRec's own default (set by its ``__post_init__``; a copy made with
    ``dataclasses.replace`` passes it back in)."""
    init = getattr(config, name)
    return name == "init_fn" and isinstance(init, functools.partial) and init.func is torch.nn.init.uniform_


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclasses.dataclass
class HashEmbeddingBagConfig(HashTableOptions, EmbeddingBagConfig):
    """A pooled hash table: an ``EmbeddingBagConfig`` whose IDs are raw int64 values (options: HashTableOptions)."""


@dataclasses.dataclass
class HashEmbeddingConfig(HashTableOptions, EmbeddingConfig):
    """A sequence hash table: an ``EmbeddingConfig`` whose IDs are raw int64 values (options: HashTableOptions)."""


def is_hash_config(config: Any) -> bool:
    return isinstance(config, HashTableOptions)


def hash_spec_of(table: Any) -> Optional[HashTableSpec]:
    """The :class:`HashTableSpec` a sharded table carries in its fused_params, or None for a plain table."""
    fused_params = getattr(table, "fused_params", None) or {}
    return fused_params.get(FUSED_PARAMS_KEY)


def is_hash_group(grouped_config: Any) -> bool:
    """True if a TorchRec ``GroupedEmbeddingConfig`` holds hash tables (groups never mix hash and plain)."""
    return any(hash_spec_of(t) is not None for t in grouped_config.embedding_tables) or (
        hash_spec_of(grouped_config) is not None
    )
