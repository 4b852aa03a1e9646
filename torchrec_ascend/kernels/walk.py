"""Find the embedding kernels inside a model sharded by DistributedModelParallel.

Sharded TorchRec modules hide their lookups from ``named_modules()`` (they list the table slices instead), so code
that needs the kernels (metrics, checkpoints, pipelines setting their depth) asks each module for them through the
lookups adapter (:mod:`torchrec_ascend.adapters.lookups`, which unwraps data_parallel lookups).

Example::

    from torchrec_ascend.kernels.walk import sharded_kernels
    for kernel in sharded_kernels(dmp):
        print(type(kernel).__name__, kernel.hash_stats())
"""

from __future__ import annotations

from typing import Iterator

import torch

from torchrec_ascend.adapters.lookups import kernels_of


def sharded_kernels(model: torch.nn.Module) -> Iterator[torch.nn.Module]:
    """Every embedding kernel (TBE wrapper) of every sharded embedding module in ``model``."""
    for module in model.modules():
        yield from kernels_of(module)
