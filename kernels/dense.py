"""DENSE kernels: tables replicated on every rank (data_parallel), gradients all-reduced by DDP.

:class:`SequenceDenseEmbedding` replaces TorchRec's ``BatchedDenseEmbedding`` where fbgemm's dense TBE ignores
``PoolingMode.NONE`` (its CPU implementation pools anyway), which breaks EmbeddingCollection + data_parallel. It
keeps the stock parameter layout (one flat weight, a view per table) so state_dict and DDP are unchanged, and looks
rows up per feature with ``torch.nn.functional.embedding``.
"""

from __future__ import annotations

from typing import Any, List, Optional

import torch
from torchrec.distributed.batched_embedding_kernel import BatchedDenseEmbedding
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor


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

    def _table_weights(self) -> List[torch.Tensor]:
        module = self._emb_module
        offsets = module.weights_physical_offsets
        return [
            module.weights[offsets[t] : offsets[t + 1]].view(rows, cols)
            for t, (rows, cols) in enumerate(zip(self._local_rows, self._local_cols))
        ]

    def forward(self, features: KeyedJaggedTensor) -> torch.Tensor:
        tables = self._table_weights()
        values = features.values().long()
        lengths = features.length_per_key()
        per_feature = torch.split(values, lengths)
        return torch.cat(
            [torch.nn.functional.embedding(ids, tables[t]) for ids, t in zip(per_feature, self._feature_table_map)]
        )
