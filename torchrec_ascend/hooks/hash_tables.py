"""Hash tables inside stock TorchRec modules: unsharded lookups, sharding, and planning.

* Stock ``EmbeddingBagCollection`` / ``EmbeddingCollection`` build an ``nn.EmbeddingBag`` / ``nn.Embedding`` per
  table; for a hash config we swap in the hash lookup (same call signature) right after the stock ``__init__``.
* When those collections are sharded, each hash table's options travel to its kernel inside TorchRec's per-table
  ``fused_params`` (the only per-table channel that reaches the kernel factory), row-wise hash tables get the
  hash-placement input dist, and sharding types a hash table cannot use are refused with the table's name.
* The planner never proposes those sharding types for a hash table.
* ``EmbeddingCollectionSharder(use_index_dedup=True)`` dedups per table (exact for raw IDs, and on CPU).
* Sharded lookups prefetch FUSED hash kernels too (stock prefetches only cached kernels), so a prefetching pipeline
  maps their IDs on its host lane, not on the compute thread.
* A sharded FUSED hash table's ``state_dict()`` carries ``weight_id`` (the ID of every weight row), which stock
  loading restores (see :mod:`torchrec_ascend.checkpoint.stock`).
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Iterable, List, Set

from torchrec_ascend.errors import ConfigError
from torchrec_ascend.injection.patch import Patch
from torchrec_ascend.versions import TORCHREC

_MODULES = "torchrec.modules.embedding_modules"
_HASH_TABLES_ATTR = "_torchrec_ascend_hash_tables"


def _hash_configs(configs: Iterable[Any]) -> Dict[str, Any]:
    from torchrec_ascend.hash.configs import is_hash_config

    return {c.name: c for c in configs if is_hash_config(c)}


def _collection_init(attribute: str) -> Callable[[Callable[..., None]], Callable[..., None]]:
    def wrap(original: Callable[..., None]) -> Callable[..., None]:
        def __init__(self: Any, tables: Any, *args: Any, **kwargs: Any) -> None:
            original(self, tables, *args, **kwargs)
            if _hash_configs(tables):
                from torchrec_ascend.hash.modules import install_hash_modules

                install_hash_modules(self, list(tables), attribute)

        return __init__

    return wrap


def _attach_specs(infos_by_type: Dict[str, List[Any]], configs: Iterable[Any]) -> None:
    """Put each hash table's spec into its sharding info's fused_params; refuse unsupported sharding types."""
    from torchrec_ascend.hash.configs import FUSED_PARAMS_KEY
    from torchrec_ascend.sharders import HASH_SHARDING_TYPES

    hash_configs = _hash_configs(configs)
    for sharding_type, infos in infos_by_type.items():
        for info in infos:
            config = hash_configs.get(info.embedding_config.name)
            if config is None:
                continue
            if sharding_type not in HASH_SHARDING_TYPES:
                raise ConfigError(
                    f"hash table {config.name!r} cannot be sharded {sharding_type}: hash tables support "
                    f"{', '.join(HASH_SHARDING_TYPES)}. Constrain it with ParameterConstraints(sharding_types=[...])."
                )
            info.fused_params = {**(info.fused_params or {}), FUSED_PARAMS_KEY: config.hash_spec()}


def _pooled_infos(original: Callable[..., Any]) -> Callable[..., Any]:
    def create_grouped_sharding_infos(cls: Any, module: Any, *args: Any, **kwargs: Any) -> Any:
        infos = original(cls, module, *args, **kwargs)
        _attach_specs(infos, module.embedding_bag_configs())
        return infos

    return create_grouped_sharding_infos


def _sequence_infos(original: Callable[..., Any]) -> Callable[..., Any]:
    def create_grouped_sharding_infos(cls: Any, module: Any, *args: Any, **kwargs: Any) -> Any:
        infos = original(cls, module, *args, **kwargs)
        _attach_specs(infos, module.embedding_configs())
        return infos

    return create_grouped_sharding_infos


def _hash_row_wise(sharding_type: str, infos: List[Any]) -> bool:
    """True if ``infos`` are row-wise hash tables; raises if hash and plain row-wise tables are mixed."""
    from torchrec_ascend.hash.configs import FUSED_PARAMS_KEY

    if sharding_type != "row_wise":
        return False
    hashed = [FUSED_PARAMS_KEY in (i.fused_params or {}) for i in infos]
    if any(hashed) and not all(hashed):
        names = lambda flag: [i.embedding_config.name for i, h in zip(infos, hashed) if h == flag]
        raise ConfigError(
            f"row_wise hash tables {names(True)} and row_wise plain tables {names(False)} are in one module: "
            "make the plain ones hash tables (HashEmbeddingBagConfig / HashEmbeddingConfig with the same "
            "num_embeddings) or shard them another way."
        )
    return any(hashed)


def _pooled_sharding(original: Callable[..., Any]) -> Callable[..., Any]:
    def create_embedding_bag_sharding(cls: Any, sharding_infos: List[Any], env: Any, device: Any = None,
                                      *args: Any, **kwargs: Any) -> Any:
        if _hash_row_wise(sharding_infos[0].param_sharding.sharding_type, sharding_infos):
            from torchrec_ascend.sharders.hash_row_wise import HashRwPooledEmbeddingSharding

            return HashRwPooledEmbeddingSharding(
                sharding_infos, env, device, qcomm_codecs_registry=kwargs.get("qcomm_codecs_registry")
            )
        return original(cls, sharding_infos, env, device, *args, **kwargs)

    return create_embedding_bag_sharding


def _sequence_sharding(original: Callable[..., Any]) -> Callable[..., Any]:
    def create_embedding_sharding(cls: Any, sharding_type: str, sharding_infos: List[Any], env: Any,
                                  device: Any = None, qcomm_codecs_registry: Any = None) -> Any:
        if _hash_row_wise(sharding_type, sharding_infos):
            from torchrec_ascend.sharders.hash_row_wise import HashRwSequenceEmbeddingSharding

            return HashRwSequenceEmbeddingSharding(
                sharding_infos=sharding_infos, env=env, device=device, qcomm_codecs_registry=qcomm_codecs_registry
            )
        return original(cls, sharding_type, sharding_infos, env, device, qcomm_codecs_registry)

    return create_embedding_sharding


def _enumerate(original: Callable[..., Any]) -> Callable[..., Any]:
    def enumerate(self: Any, module: Any, sharders: Any) -> Any:
        names: Set[str] = set()
        for child in module.modules():
            for getter in ("embedding_bag_configs", "embedding_configs"):
                if hasattr(child, getter):
                    names |= set(_hash_configs(getattr(child, getter)()))
        setattr(self, _HASH_TABLES_ATTR, names)
        return original(self, module, sharders)

    return enumerate


def _filter_sharding_types(original: Callable[..., List[str]]) -> Callable[..., List[str]]:
    def _filter_sharding_types(self: Any, name: str, allowed: List[str], *args: Any, **kwargs: Any) -> List[str]:
        if name in getattr(self, _HASH_TABLES_ATTR, ()):
            from torchrec_ascend.sharders import HASH_SHARDING_TYPES

            allowed = [t for t in allowed if t in HASH_SHARDING_TYPES]
        return original(self, name, allowed, *args, **kwargs)

    return _filter_sharding_types


def _tables_attr(module: Any) -> str:
    """Where a sharded collection's state_dict keys its tables: ``embedding_bags`` (EBC) or ``embeddings`` (EC)."""
    return "embedding_bags" if hasattr(module, "embedding_bags") else "embeddings"


def _torch_state(original: Callable[..., None]) -> Callable[..., None]:
    def _initialize_torch_state(self: Any, skip_registering: bool = False) -> None:
        original(self, skip_registering)
        if not skip_registering:
            from torchrec_ascend.checkpoint.key_value_state import add_key_value_entries, install_views
            from torchrec_ascend.checkpoint.optimizer_state import install_optimizer_state
            from torchrec_ascend.checkpoint.stock import add_weight_ids

            install_views(self, self._model_parallel_name_to_sharded_tensor)
            install_optimizer_state(self)

            def hook(module: Any, destination: Dict[str, Any], prefix: str, _: Any) -> None:
                add_weight_ids(module, destination, prefix, _tables_attr(module))
                add_key_value_entries(module, destination, prefix, _tables_attr(module))

            self._register_state_dict_hook(hook)

    return _initialize_torch_state


def _pre_load(original: Callable[..., None]) -> Callable[..., None]:
    def _pre_load_state_dict_hook(self: Any, state_dict: Dict[str, Any], prefix: str, *args: Any) -> None:
        import torch

        from torchrec_ascend.checkpoint.key_value_state import load_key_value_entries
        from torchrec_ascend.checkpoint.stock import load_weight_ids

        load_weight_ids(self, state_dict, prefix, _tables_attr(self))  # sharded FUSED hash tables' IDs
        loaded = load_key_value_entries(self, state_dict, prefix, _tables_attr(self))  # KEY_VALUE rows, now
        # An unsharded hash table's ID map describes its own rows, not the shards' (placement is by hash): the
        # sharded kernels start empty and fill rows as IDs arrive (a map holding IDs was refused above). Moving
        # trained hash tables between layouts is the checkpoint Saver's job.
        for key in [k for k in state_dict if k.startswith(prefix) and ".slots." in k]:
            del state_dict[key]
        plan = getattr(self, "module_sharding_plan", {})
        for table, sharding in plan.items():  # loaded above, or missing from a partial (e.g. dense-only) state_dict:
            for attr in ("embeddings", "embedding_bags"):  # the stock hook needs the key, so it gets an empty
                key = f"{prefix}{attr}.{table}.weight"      # stand-in (it slices and concatenates nothing; the
                if sharding.compute_kernel == "key_value" and hasattr(self, attr) \
                        and (key not in state_dict or key in loaded):  # table's own windows would read every row)
                    state_dict[key] = torch.empty(0, 0)
        original(self, state_dict, prefix, *args)
        # A KEY_VALUE table's rows live in its tiers (loaded above), not in a tensor of its shape: stock loading skips
        # them.
        for table, sharding in getattr(self, "module_sharding_plan", {}).items():
            for key in (f"{prefix}embeddings.{table}.weight", f"{prefix}embedding_bags.{table}.weight"):
                if sharding.compute_kernel == "key_value" and key in state_dict:
                    del state_dict[key]
                    self._skip_missing_weight_key.append(key)

    return _pre_load_state_dict_hook


def _exact_index_dedup(original: Callable[..., Any]) -> Callable[..., Any]:
    def _dedup_indices(self: Any, ctx: Any, input_feature_splits: List[Any]) -> List[Any]:
        from torchrec_ascend.sharders.index_dedup import dedup_per_table, table_groups

        accumulate = bool(getattr(self, "_enable_feature_score_weight_accumulation", False))
        deduped = []
        for i, features in enumerate(input_feature_splits):
            groups = table_groups(self.get_buffer(f"_hash_size_offset_tensor_{i}"))
            features_once, reverse = dedup_per_table(features, groups, accumulate)
            ctx.input_features.append(features)
            ctx.reverse_indices.append(reverse)
            deduped.append(features_once)
        return deduped

    return _dedup_indices


def _prefetch_fused_hash(sequence: bool) -> Callable[[Callable[..., None]], Callable[..., None]]:
    def wrap(original: Callable[..., None]) -> Callable[..., None]:
        def prefetch(self: Any, sparse_features: Any, forward_stream: Any = None) -> None:
            original(self, sparse_features, forward_stream)
            from torchrec_ascend.adapters.lookups import kernels_with_features, prefetches_every_kernel
            from torchrec_ascend.kernels.fused import HashFusedEmbedding, HashFusedEmbeddingBag

            if sequence and prefetches_every_kernel(self):
                return  # the stock prefetch reached every kernel, FUSED ones included
            for kernel, features in kernels_with_features(self, sparse_features):
                if isinstance(kernel, (HashFusedEmbeddingBag, HashFusedEmbedding)):
                    # TorchRec's own call (routed to the kernel's ID mapper; VBE batches are mapped at the lookup)
                    kernel.emb_module.prefetch(
                        indices=features.values(), offsets=features.offsets(), forward_stream=forward_stream,
                        batch_size_per_feature_per_rank=(features.stride_per_key_per_rank()
                                                         if features.variable_stride_per_key() else None),
                    )

        return prefetch

    return wrap


_LOOKUP = "torchrec.distributed.embedding_lookup"
_EBC = "torchrec.distributed.embeddingbag:ShardedEmbeddingBagCollection"
_EC = "torchrec.distributed.embedding:ShardedEmbeddingCollection"
_ENUMERATOR = "torchrec.distributed.planner.enumerators:EmbeddingEnumerator"

PATCHES = [
    Patch.wrap(
        name="hash.ebc_lookups",
        target=f"{_MODULES}:EmbeddingBagCollection.__init__",
        requires=TORCHREC,
        reason="an unsharded EmbeddingBagCollection must look hash configs up by raw ID",
        wrapper=_collection_init("embedding_bags"),
    ),
    Patch.wrap(
        name="hash.ec_lookups",
        target=f"{_MODULES}:EmbeddingCollection.__init__",
        requires=TORCHREC,
        reason="an unsharded EmbeddingCollection must look hash configs up by raw ID",
        wrapper=_collection_init("embeddings"),
    ),
    Patch.wrap(
        name="hash.ebc_table_specs",
        target=f"{_EBC}.create_grouped_sharding_infos",
        requires=TORCHREC,
        reason="a hash table's options must reach its kernel (via per-table fused_params)",
        wrapper=_pooled_infos,
    ),
    Patch.wrap(
        name="hash.ec_table_specs",
        target=f"{_EC}.create_grouped_sharding_infos",
        requires=TORCHREC,
        reason="a hash table's options must reach its kernel (via per-table fused_params)",
        wrapper=_sequence_infos,
    ),
    Patch.wrap(
        name="hash.ebc_row_wise",
        target=f"{_EBC}.create_embedding_bag_sharding",
        requires=TORCHREC,
        reason="row-wise hash tables are placed by hash(ID) % world_size, not by row range",
        wrapper=_pooled_sharding,
    ),
    Patch.wrap(
        name="hash.ec_row_wise",
        target=f"{_EC}.create_embedding_sharding",
        requires=TORCHREC,
        reason="row-wise hash tables are placed by hash(ID) % world_size, not by row range",
        wrapper=_sequence_sharding,
    ),
    Patch.wrap(
        name="hash.ec_index_dedup",
        target=f"{_EC}._dedup_indices",
        requires=TORCHREC,
        reason="use_index_dedup linearizes IDs by num_embeddings (raw hash IDs of two tables merge) and has no CPU op",
        wrapper=_exact_index_dedup,
    ),
    Patch.wrap(
        name="hash.ebc_weight_ids",
        target=f"{_EBC}._initialize_torch_state",
        requires=TORCHREC,
        reason="a sharded FUSED hash table's state_dict must carry the ID of every weight row (weight_id)",
        wrapper=_torch_state,
    ),
    Patch.wrap(
        name="hash.ec_weight_ids",
        target=f"{_EC}._initialize_torch_state",
        requires=TORCHREC,
        reason="a sharded FUSED hash table's state_dict must carry the ID of every weight row (weight_id)",
        wrapper=_torch_state,
    ),
    Patch.wrap(
        name="hash.ebc_unsharded_copy",
        target=f"{_EBC}._pre_load_state_dict_hook",
        requires=TORCHREC,
        reason="stock loading must restore weight_id, skip unsharded ID maps and KEY_VALUE rows (kept in tiers)",
        wrapper=_pre_load,
    ),
    Patch.wrap(
        name="hash.ec_unsharded_copy",
        target=f"{_EC}._pre_load_state_dict_hook",
        requires=TORCHREC,
        reason="stock loading must restore weight_id, skip unsharded ID maps and KEY_VALUE rows (kept in tiers)",
        wrapper=_pre_load,
    ),
    Patch.wrap(
        name="hash.ebc_fused_prefetch",
        target=f"{_LOOKUP}:GroupedPooledEmbeddingsLookup.prefetch",
        requires=TORCHREC,
        reason="a prefetching pipeline must map a FUSED hash table's IDs on its lane (stock prefetches cached kernels)",
        wrapper=_prefetch_fused_hash(sequence=False),
    ),
    Patch.wrap(
        name="hash.ec_fused_prefetch",
        target=f"{_LOOKUP}:GroupedEmbeddingsLookup.prefetch",
        requires=TORCHREC,
        reason="a prefetching pipeline must map a FUSED hash table's IDs on its lane (stock prefetches cached kernels)",
        wrapper=_prefetch_fused_hash(sequence=True),
    ),
    Patch.wrap(
        name="hash.planner_tables",
        target=f"{_ENUMERATOR}.enumerate",
        requires=TORCHREC,
        reason="the planner must know which tables are hash tables",
        wrapper=_enumerate,
    ),
    Patch.wrap(
        name="hash.planner_sharding_types",
        target=f"{_ENUMERATOR}._filter_sharding_types",
        requires=TORCHREC,
        reason="never propose a sharding type a hash table cannot use",
        wrapper=_filter_sharding_types,
    ),
]
