"""H3: the planner's device-memory estimate of a KEY_VALUE shard is its device cache, weights and optimizer state, and
the staging of the rows a batch swaps.

TorchRec estimates a KEY_VALUE shard's HBM as ``min(KeyValueParams.max_l1_cache_size MB, rows x load factor x row
bytes)`` (its SSD kernel's L1 cache): 0 bytes unless ``max_l1_cache_size`` is set, and never the optimizer state.
Our KEY_VALUE kernel (:mod:`torchrec_ascend.kernels.key_value`) keeps on the device an fbgemm TBE of
:func:`~torchrec_ascend.kernels.key_value.kernel.cache_rows` rows per shard (``ceil(load_factor x shard rows) + 1``)
with the optimizer's state for those rows; the host and disk tiers hold the rest. Each batch moves rows between the
cache and the host: the rows leaving are gathered and packed with their state on the device before one copy down,
the rows entering come up packed (:func:`~torchrec_ascend.kernels.pool.swap_bytes`); the estimate adds that staging
for the IDs TorchRec expects on the shard per batch (its own input-size model: batch size, pooling factors,
sharding), at most the cache's rows. The ID map itself lives on the host. Measured on the emulated npu
(``tests/emulator/test_memory_estimate.py``, Adagrad, load factor 1/8, 2 ranks): the stock estimate was 0.06 of the
measured peak per rank at 65,536 x 64; with the cache alone it was within 10% there but 0.75-0.81 at the conformance
size 1,024 x 8, where a batch's swap staging (~2 KB) weighs against an 8 KB cache; with the staging every case is
within 10% (0.94-1.00 at 1,024 x 8). The pipeline buffers TorchRec adds (input and output of the lookup, on
cuda-like devices) are kept as estimated; on a cpu topology the cache and staging are host memory. So a plan whose
caches do not fit the topology's HBM is refused by the stock planner at planning time, naming the table. The staging
is counted per shard although a kernel moves one table's rows at a time: a conservative sum.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, List

from torchrec_ascend.injection.patch import Patch, Undo, resolve, set_attribute
from torchrec_ascend.versions import TORCHREC

KEY_VALUE = "key_value"


def key_value_hbm(shard_rows: int, dim: int, element_size: int, load_factor: float, optimizer_multiplier: float) -> int:
    """Device bytes of one KEY_VALUE shard's cache: its rows' weights and optimizer state (the batch's swap staging is
    :func:`key_value_swap_hbm`).

    Example::

        key_value_hbm(8192, 64, 4, 0.125, 1.0)   # 1025 rows x 256 B x 2 = 524800
    """
    from torchrec_ascend.kernels.key_value.kernel import cache_rows

    weights = cache_rows(shard_rows, load_factor) * dim * element_size
    return weights + math.ceil(weights * optimizer_multiplier)


def key_value_swap_hbm(ids_per_batch: float, shard_rows: int, dim: int, load_factor: float,
                       optimizer_multiplier: float) -> int:
    """Device bytes of one KEY_VALUE shard's per-batch swap staging: the rows of ``ids_per_batch`` IDs (at most the
    cache's ID rows) moved with their optimizer state, sized by the pool that moves them.

    Example::

        key_value_swap_hbm(16, 1024, 8, 0.125, 1.0)   # 16 rows of 16 float32 elements: 16 x 8 + 2 x 16 x 64 = 2176
    """
    from torchrec_ascend.kernels.key_value.kernel import cache_rows
    from torchrec_ascend.kernels.pool import swap_bytes

    rows = min(math.ceil(ids_per_batch), cache_rows(shard_rows, load_factor) - 1)
    return swap_bytes(rows, dim + math.ceil(dim * optimizer_multiplier))


def _ids_per_shard(kwargs: Any) -> List[float]:
    """Per shard, the IDs TorchRec expects it to receive per batch: its own input-size model (batch sizes, pooling
    factors, sharding type) in IDs rather than bytes."""
    from torchrec.distributed.planner import shard_estimators

    names = ("sharding_type", "batch_sizes", "world_size", "local_world_size", "input_lengths", "shard_sizes",
             "input_data_type_size", "output_data_type_size", "num_poolings", "is_pooled")
    input_sizes, _ = shard_estimators._calculate_shard_io_sizes(
        emb_dim=kwargs["tensor"].shape[1], **{name: kwargs[name] for name in names})
    return [size / kwargs["input_data_type_size"] for size in input_sizes]


def _stock_key_value_hbm(kwargs: Any) -> int:
    """TorchRec's own HBM figure for a KEY_VALUE shard (what the stock function added before its pipeline costs)."""
    tensor, params = kwargs["tensor"], kwargs.get("key_value_params")
    l1 = (getattr(params, "max_l1_cache_size", None) or 0) * 1024 * 1024
    from torchrec.distributed.planner.constants import KV_CACHING_RATIO

    factor = kwargs.get("kv_cache_load_factor", KV_CACHING_RATIO)
    return min(l1, math.ceil(tensor.shape[0] * factor * tensor.element_size() * tensor.shape[1]))


def _wrap(stock: Callable[..., List[Any]]) -> Callable[..., List[Any]]:
    from torchrec.distributed.planner import shard_estimators

    def calculate_shard_storages(*args: Any, **kwargs: Any) -> List[Any]:
        storages = stock(*args, **kwargs)
        if args or kwargs.get("compute_kernel") != KEY_VALUE or kwargs.get("is_inference"):
            return storages  # the planner passes keywords; anything else is not ours to change
        tensor = kwargs["tensor"]
        optimizer_class = getattr(tensor, "_optimizer_classes", [None])[0]
        multiplier = shard_estimators._get_optimizer_multipler(optimizer_class, tensor.shape)
        stock_hbm = _stock_key_value_hbm(kwargs)
        ratio = kwargs["caching_ratio"]
        caches = [
            key_value_hbm(int(size[0]), int(size[1]), tensor.element_size(), ratio, multiplier)
            + key_value_swap_hbm(ids, int(size[0]), int(size[1]), ratio, multiplier)
            for size, ids in zip(kwargs["shard_sizes"], _ids_per_shard(kwargs))
        ]
        if kwargs.get("compute_device") == "cpu":  # the "device" cache is host memory
            return [dataclasses.replace(s, ddr=s.ddr + cache) for s, cache in zip(storages, caches)]
        return [dataclasses.replace(s, hbm=max(s.hbm - stock_hbm, 0) + cache) for s, cache in zip(storages, caches)]

    calculate_shard_storages.__wrapped__ = stock  # type: ignore[attr-defined]
    return calculate_shard_storages


def _apply(patch: Patch) -> Undo:
    owner, attr = resolve(patch.target)
    return set_attribute(owner, attr, _wrap(getattr(owner, attr)))


PATCHES = [
    Patch(
        name="h3.key_value_storage",
        target="torchrec.distributed.planner.shard_estimators:calculate_shard_storages",
        requires=TORCHREC,
        reason="the storage estimate of a KEY_VALUE shard is 0 bytes of HBM unless max_l1_cache_size is set; our "
               "kernel's device cache (rows, optimizer state) is what the plan must fit",
        apply_fn=_apply,
    ),
]
