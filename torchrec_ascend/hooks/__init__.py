"""The generic hooks H1-H6: patches of stock TorchRec that read every device difference from a backend profile.

One module per hook point (see README, "How TorchRec is hooked"):

* H1 :mod:`.sharding_allowlist`: sharding types, compute kernels and planner device aliasing per device.
* H2 :mod:`.kernel_factory`: which kernel class a lookup builds (our hash, KEY_VALUE and device-fix kernels);
  :mod:`.dense_device`: the stock dense (data_parallel) kernels keep their table on the NPU.
* H3 :mod:`.planner_constants`: bandwidths for (device, kernel) pairs TorchRec has no figure for.
* H3 :mod:`.planner_storage`: a KEY_VALUE shard's HBM estimate is its device cache with its optimizer state.
* H4 :mod:`.pipeline_streams`: streams for train pipelines and ``record_stream`` after collectives.
* H5 :mod:`.process_group`: ``DistributedModelParallel.copy()`` on builds without NCCL, and other PG plumbing;
  :mod:`.uneven_collectives`: uneven reduce-scatter backward on backends that gather equal sizes only (gloo).
* H6 :mod:`.sparse_ops`: fbgemm ops for devices that lack a kernel (host round trip): a registry entry
  (:func:`registrations`) that changes the op dispatcher, not TorchRec source; so does
  :mod:`.sharded_tensor_device` (H5): torch's ShardedTensor ``.device`` op for ranks without shards on the NPU.
* :mod:`.hash_tables`: hash tables inside stock EmbeddingBagCollection/EmbeddingCollection and default sharders.
"""

from __future__ import annotations

from typing import List

from torchrec_ascend.injection.patch import Patch


def registrations() -> List[Patch]:
    """Registry entries that are not TorchRec patches (no TorchRec target, nothing to review): applied first."""
    from torchrec_ascend.hooks import sharded_tensor_device, sparse_ops

    return [*sparse_ops.REGISTRATIONS, *sharded_tensor_device.REGISTRATIONS]


def default_patches() -> List[Patch]:
    """Every patch torchrec-ascend applies, in application order."""
    from torchrec_ascend.hooks import (
        dense_device,
        hash_tables,
        kernel_factory,
        pipeline_streams,
        planner_constants,
        planner_storage,
        process_group,
        sharding_allowlist,
        uneven_collectives,
    )

    return [
        *sharding_allowlist.PATCHES,
        *kernel_factory.PATCHES,
        *dense_device.PATCHES,
        *planner_constants.PATCHES,
        *planner_storage.PATCHES,
        *pipeline_streams.PATCHES,
        *process_group.PATCHES,
        *uneven_collectives.PATCHES,
        *hash_tables.PATCHES,
    ]
