"""What the fused-optimizer tests feed a TBE, and torch's own lookup of it (the oracle's forward).

Example::

    batch = random_batch(torch.Generator().manual_seed(0), [(7, 4), (9, 8)], [0, 1, 1], 3)
    out = module(batch.indices, batch.offsets, batch.per_sample_weights(weighted=True))
"""

from __future__ import annotations

import dataclasses
from typing import Any, List, Optional, Sequence, Tuple

import torch
from fbgemm_gpu.split_table_batched_embeddings_ops_common import PoolingMode


@dataclasses.dataclass
class Batch:
    """Per feature its IDs, bag lengths and per-sample weights; flattened as a TBE takes them."""

    ids: List[torch.Tensor]
    lengths: List[torch.Tensor]
    psw: List[torch.Tensor]
    indices: torch.Tensor
    offsets: torch.Tensor

    def per_sample_weights(self, weighted: bool) -> Optional[torch.Tensor]:
        return torch.cat(self.psw) if weighted else None


def random_batch(gen: torch.Generator, specs: Sequence[Tuple[int, int]], features: Sequence[int],
                 batch: int) -> Batch:
    """Bags of 0-3 IDs from the lower half of each table: repeats within a step, empty bags, rows untouched in some
    steps."""
    lengths = [torch.randint(0, 4, (batch,), generator=gen) for _ in features]
    ids = [torch.randint(0, specs[t][0] // 2 + 1, (int(n.sum()),), generator=gen) for t, n in zip(features, lengths)]
    psw = [torch.rand(i.numel(), generator=gen) for i in ids]
    all_lengths = torch.cat(lengths)
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), torch.cumsum(all_lengths, 0)])
    return Batch(ids, lengths, psw, torch.cat(ids), offsets)


def oracle_lookup(weights: List[Any], features: Sequence[int], batch: Batch, weighted: bool,
                  pooling: PoolingMode) -> torch.Tensor:
    """What the TBE returns for ``batch``, from torch's own embedding ops."""
    if pooling == PoolingMode.NONE:
        return torch.cat([torch.nn.functional.embedding(i, weights[t]) for t, i in zip(features, batch.ids)])
    mode = "mean" if pooling == PoolingMode.MEAN else "sum"
    psw = batch.psw if weighted else [None] * len(features)
    return torch.cat([
        torch.nn.functional.embedding_bag(i, weights[t], torch.cumsum(n, 0) - n, mode=mode, per_sample_weights=w)
        for t, i, n, w in zip(features, batch.ids, batch.lengths, psw)
    ], dim=1)
