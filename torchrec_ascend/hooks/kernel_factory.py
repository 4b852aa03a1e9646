"""H2: the kernel factory. Chooses our kernel class where one applies, else builds the stock kernel.

TorchRec's lookups build kernels in a closed if/elif on the compute-kernel enum, and new kernel *names* cannot be
added (the enum is validated on the way). So we keep the stock names and decide by what the table is:

1. a hash table (see :mod:`torchrec_ascend.hash`): our hash kernel for its compute kernel;
2. ``key_value``: our KEY_VALUE kernel (device cache over host over disk) on every device;
3. a ``kernel_overrides`` entry of the device's profile (e.g. CPU's dense sequence kernel);
4. otherwise the stock kernel.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Type

from torchrec_ascend import backends
from torchrec_ascend.dotted import resolve_object
from torchrec_ascend.injection.patch import Patch
from torchrec_ascend.versions import TORCHREC

_LOOKUP = "torchrec.distributed.embedding_lookup"

# (lookup kind, compute kernel) -> our kernel class, for tables that are not hash tables.
_KEY_VALUE = {
    "pooled": "torchrec_ascend.kernels.key_value:KeyValueEmbeddingBag",
    "sequence": "torchrec_ascend.kernels.key_value:KeyValueEmbedding",
}
# Hash tables: compute kernel -> (pooled class, sequence class).
_HASH = {
    "fused": (
        "torchrec_ascend.kernels.fused:HashFusedEmbeddingBag",
        "torchrec_ascend.kernels.fused:HashFusedEmbedding",
    ),
    "dense": (
        "torchrec_ascend.kernels.dense:HashDenseEmbeddingBag",
        "torchrec_ascend.kernels.dense:HashDenseEmbedding",
    ),
    "key_value": (
        "torchrec_ascend.kernels.key_value:KeyValueEmbeddingBag",
        "torchrec_ascend.kernels.key_value:KeyValueEmbedding",
    ),
}


def _load(path: str) -> Type[Any]:
    return resolve_object(path)


def kernel_class(kind: str, config: Any, device: Any) -> Optional[Type[Any]]:
    """Our kernel class for a grouped table config, or None for the stock one.

    Args:
        kind: ``"pooled"`` (EmbeddingBagCollection) or ``"sequence"`` (EmbeddingCollection).
        config: torchrec ``GroupedEmbeddingConfig``.
        device: the ``torch.device`` the kernel is built for.
    """
    from torchrec_ascend.hash.configs import is_hash_group

    compute_kernel = config.compute_kernel.value
    if is_hash_group(config):
        if compute_kernel not in _HASH:
            from torchrec_ascend.errors import ConfigError

            names = ", ".join(t.name for t in config.embedding_tables)
            raise ConfigError(
                f"hash tables [{names}] cannot use compute kernel {compute_kernel!r}; use one of "
                f"{', '.join(_HASH)} (ParameterConstraints(compute_kernels=[...]))"
            )
        return _load(_HASH[compute_kernel][0 if kind == "pooled" else 1])
    if compute_kernel == "key_value":
        return _load(_KEY_VALUE[kind])
    profile = backends.profile_for(device.type if device is not None else "cpu")
    override = profile.kernel_overrides.get(f"{kind}/{compute_kernel}") if profile is not None else None
    return _load(override) if override else None


def check_kernel_config(config: Any, device: Any) -> None:
    """Refuse a weight precision or a fused optimizer the device cannot run, naming the tables and what it supports.

    fbgemm would otherwise fail deep inside the TBE constructor ("Optimizer adam is not supported in CPU mode") or at
    the first lookup ("split_embedding_cpu_forward_2" not implemented for 'BFloat16').
    """
    profile = backends.profile_for(device.type if device is not None else "cpu")
    if profile is None or config.compute_kernel.value not in ("fused", "key_value"):
        return
    from torchrec_ascend.errors import ConfigError

    tables = ", ".join(t.name for t in config.embedding_tables)
    dtype = getattr(config.data_type, "name", str(config.data_type))
    if dtype not in profile.weight_dtypes:
        raise ConfigError(
            f"tables [{tables}]: data_type {dtype} is not supported by the {profile.name} backend's "
            f"{config.compute_kernel.value} kernel (its weights are {', '.join(profile.weight_dtypes)}; optimizer "
            "state stays FP32). Set data_type=DataType.FP16 or FP32 in the table's config"
        )
    optimizer = (config.fused_params or {}).get("optimizer")
    if optimizer is None:
        return
    name = getattr(optimizer, "name", str(optimizer)).upper()
    if name not in profile.fused_optimizers:
        raise ConfigError(
            f"tables [{tables}]: the {profile.name} backend cannot fuse {name} into backward (it fuses "
            f"{', '.join(profile.fused_optimizers)}). Choose one of those, e.g. "
            "apply_optimizer_in_backward(torch.optim.Adagrad, ...) or RowWiseAdagrad."
        )
    from torchrec_ascend.kernels import fused_optimizers  # the kernels import TorchRec modules: not while it imports

    fused_optimizers.check_hyper_parameters(config.fused_params, [t.name for t in config.embedding_tables], dtype)


def _stock_kernel(build: Callable[[Any], Any], config: Any, device: Any) -> Any:
    """The stock kernel ``build(config)`` makes, trained by our fused Adam where fbgemm has none on ``device``."""
    from torchrec_ascend.kernels import fused_optimizers

    kernel = build(fused_optimizers.stock_config(config, device))
    fused_optimizers.finish(kernel, config, device)
    return kernel


def _pooled_factory(original: Callable[..., Any]) -> Callable[..., Any]:
    def _create_embedding_kernel(
        self: Any, config: Any, device: Any, pg: Any, sharding_type: Any, env: Any
    ) -> Any:
        check_kernel_config(config, device)
        cls = kernel_class("pooled", config, device)
        if cls is None:
            return _stock_kernel(lambda c: original(self, c, device, pg, sharding_type, env), config, device)
        return cls(config=config, pg=pg, device=device, sharding_type=sharding_type, env=env)

    return _create_embedding_kernel


def _sequence_factory(original: Callable[..., Any]) -> Callable[..., Any]:
    def _create_embedding_kernel(self: Any, config: Any, pg: Any, device: Any, env: Any = None) -> Any:
        check_kernel_config(config, device)
        cls = kernel_class("sequence", config, device)
        if cls is None:
            return _stock_kernel(lambda c: original(self, c, pg, device, env), config, device)
        if config.compute_kernel.value == "key_value":
            self._need_prefetch = True  # as the stock factory does: prefetching pipelines then call our kernel
        return cls(config=config, pg=pg, device=device, env=env)

    return _create_embedding_kernel


PATCHES = [
    Patch.wrap(
        name="h2.pooled_kernel_factory",
        target=f"{_LOOKUP}:GroupedPooledEmbeddingsLookup._create_embedding_kernel",
        requires=TORCHREC,
        reason="build our hash, KEY_VALUE and device-fix kernels for EmbeddingBagCollection lookups",
        wrapper=_pooled_factory,
    ),
    Patch.wrap(
        name="h2.sequence_kernel_factory",
        target=f"{_LOOKUP}:GroupedEmbeddingsLookup._create_embedding_kernel",
        requires=TORCHREC,
        reason="build our hash, KEY_VALUE and device-fix kernels for EmbeddingCollection lookups",
        wrapper=_sequence_factory,
    ),
]
