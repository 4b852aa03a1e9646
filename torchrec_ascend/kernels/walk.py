"""Find the embedding kernels inside a model sharded by DistributedModelParallel.

Sharded TorchRec modules hide their lookups from ``named_modules()`` (they list the table slices instead), so code
that needs the kernels (metrics, checkpoints, pipelines setting their depth) walks ``_lookups`` and each lookup's
``_emb_modules`` explicitly, unwrapping DistributedDataParallel (data_parallel lookups).

Example::

    from torchrec_ascend.kernels.walk import sharded_kernels
    for kernel in sharded_kernels(dmp):
        print(type(kernel).__name__, kernel.hash_stats())
"""

from __future__ import annotations

from typing import Iterator

import torch


def sharded_kernels(model: torch.nn.Module) -> Iterator[torch.nn.Module]:
    """Every embedding kernel (TBE wrapper) of every sharded embedding module in ``model``."""
    for module in model.modules():
        for lookup in getattr(module, "_lookups", None) or []:
            lookup = getattr(lookup, "module", lookup)  # DistributedDataParallel wraps data_parallel lookups
            yield from getattr(lookup, "_emb_modules", None) or []
