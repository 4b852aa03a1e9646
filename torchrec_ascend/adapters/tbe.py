"""Adapter for TorchRec's embedding kernels over an fbgemm TBE: the kernel's private fields and the TBE's internals.

TorchRec's batched kernels (``BatchedFusedEmbeddingBag``, ``BatchedFusedEmbedding``, ``BatchedDenseEmbeddingBag``,
``BatchedDenseEmbedding``) keep their fbgemm table-batched embedding and its layout in private fields
(``_emb_module``, ``_local_cols``, ``_col_offset``, ``_feature_table_map``, ...). The hash kernels read that layout,
write rows of the TBE's weights and optimizer states, hide each table's reserved last row from what TorchRec and
fbgemm report, and take over the TBE's ``prefetch``. :class:`TBE` is the only code that does so; a kernel builds one
right after the stock constructor. Reviewed against TorchRec 1.8.0 / fbgemm 1.8.0 and TorchRec 1.9.2 / fbgemm 1.9.0
(the version table's rows, :data:`ADAPTER`'s range); the fbgemm attributes it uses without an underscore
(``embedding_specs``, ``prefetch``, ``prefetch_pipeline``, ``iter``, ``iter_cpu``, ``weights_physical_offsets``)
were reviewed on the same versions.

Example::

    tbe = TBE(kernel)                        # kernel: a TorchRec batched kernel, just constructed
    tbe.local_cols, tbe.feature_table_map    # [16, 16], [0, 0, 1]
    tbe.weights(0)[slots] = rows             # table 0's rows in the TBE (a view outside autograd)
"""

from __future__ import annotations

from typing import Any, Callable, List

import torch
from torchrec.distributed.batched_embedding_kernel import EmbeddingFusedOptimizer
from torchrec.distributed.composable.table_batched_embedding_slice import TableBatchedEmbeddingSlice
from torchrec.distributed.embedding_types import GroupedEmbeddingConfig

from torchrec_ascend.adapters import Adapter
from torchrec_ascend.versions import TORCHREC

_MODULE = "torchrec.distributed.batched_embedding_kernel"
_BAG, _SEQ = f"{_MODULE}:BaseBatchedEmbeddingBag", f"{_MODULE}:BaseBatchedEmbedding"
_FIELDS = ("_emb_module", "_config", "_pg", "_local_rows", "_local_cols", "_col_offset", "_feature_table_map",
           "_param_per_table")

ADAPTER = Adapter(
    name="a.tbe",
    target=_BAG,
    privates=(
        *(f"{base}.{field}" for base in (_BAG, _SEQ) for field in _FIELDS),
        f"{_MODULE}:BatchedFusedEmbeddingBag._optim",
        f"{_MODULE}:BatchedFusedEmbedding._optim",
    ),
    requires=TORCHREC,  # each TorchRec row of the version table pins its fbgemm
    reason="hash kernels map IDs to rows of the stock kernel's fbgemm TBE: they read its table layout, write rows "
    "and optimizer state, hide each table's reserved row and route TorchRec's prefetch to the ID map",
)


class TBE:
    """One TorchRec batched kernel's fbgemm TBE, its table layout and its per-table row views.

    Args:
        kernel: the TorchRec kernel (its stock constructor has run).
        optimizer_states: the TBE holds optimizer states (FUSED); False where the optimizer lives outside it
            (the dense kernels: DDP and a dense optimizer).
    """

    def __init__(self, kernel: Any, optimizer_states: bool = True) -> None:
        self._kernel = kernel
        self._with_states = optimizer_states
        self._weight_views: List[torch.Tensor] = []
        self._state_views: List[List[torch.Tensor]] = []
        self._states_taken = False

    @property
    def module(self) -> Any:
        """The fbgemm TBE module."""
        return self._kernel._emb_module

    @property
    def local_rows(self) -> List[int]:
        """Per table, the rows TorchRec reports for this shard."""
        return list(self._kernel._local_rows)

    @property
    def local_cols(self) -> List[int]:
        """Per table, this shard's columns."""
        return self._kernel._local_cols

    @property
    def col_offsets(self) -> List[int]:
        """Per table, this shard's first column."""
        return self._kernel._col_offset

    @property
    def feature_table_map(self) -> List[int]:
        """Per feature (the kernel's feature order), the index of its table."""
        return self._kernel._feature_table_map

    @property
    def process_group(self) -> Any:
        """The kernel's process group."""
        return self._kernel._pg

    @property
    def config(self) -> GroupedEmbeddingConfig:
        """The grouped config TorchRec reports for the kernel."""
        return self._kernel._config

    def replace_optimizer(self, config: GroupedEmbeddingConfig, optimizer: Any) -> None:
        """Make ``config`` the kernel's grouped config and ``optimizer`` its fused optimizer (after the TBE was given
        another optimizer than the one it was built with)."""
        self._kernel._config = config
        self._kernel._optim = optimizer

    @property
    def optimizer_name(self) -> str:
        """fbgemm's name of the fused optimizer (e.g. ``"exact_adagrad"``)."""
        optimizer = self.module.optimizer
        return str(getattr(optimizer, "value", optimizer))

    @property
    def pooling_mode(self) -> Any:
        """fbgemm's ``PoolingMode`` of the TBE."""
        return self.module.pooling_mode

    # The TBE never reallocates its weights or states, so per-table views are taken once (cheap per batch). They
    # are `.data` views, outside autograd's version counting: a prefetch writes rows that no batch in flight uses
    # while an earlier batch's forward may have saved the whole tensor for its backward.
    def weights(self, t: int) -> torch.Tensor:
        """Table ``t``'s whole pool of weights ``[rows, cols]`` (a view, on the TBE's device)."""
        if not self._weight_views:
            self._weight_views = [w.data for w in self.module.split_embedding_weights()]
        return self._weight_views[t]

    def states(self, t: int) -> List[torch.Tensor]:
        """Table ``t``'s optimizer states (views, one ``[rows, ...]`` per state; none for SGD or a dense kernel)."""
        if not self._with_states:
            return []
        if not self._states_taken:
            states = self.module.split_optimizer_states()
            self._state_views = [[s.data for s in per_table] for per_table in states] if states else []
            self._states_taken = True
        return self._state_views[t] if self._state_views else []

    def hide_last_rows(self, config: GroupedEmbeddingConfig) -> None:
        """Make TorchRec and fbgemm report ``config`` (each table one row fewer than the TBE holds).

        Views of each table's whole pool are taken first; ``split_embedding_weights``, ``split_optimizer_states``,
        ``state_dict``, the fused optimizer's ShardedTensors and the dense kernels' per-table parameters then cover
        ``config``'s rows: fbgemm takes each table's row count for those views from ``embedding_specs``, and the
        fused optimizer is rebuilt on it. The TBE's lookup (offsets, bounds) keeps the whole pool.
        """
        kernel, emb = self._kernel, self.module
        self.weights(0)
        self.states(0)
        emb.embedding_specs = [(rows - 1, *rest) for rows, *rest in emb.embedding_specs]
        kernel._config = config
        kernel._local_rows = [t.local_rows for t in config.embedding_tables]
        if isinstance(getattr(kernel, "_optim", None), EmbeddingFusedOptimizer):
            kernel._optim = EmbeddingFusedOptimizer(config, emb, kernel._pg)
        if not self._with_states:  # dense: TorchRec registers these replicated per-table parameters
            offsets = emb.weights_physical_offsets
            kernel._param_per_table = {
                table.name: TableBatchedEmbeddingSlice(
                    data=emb.weights, start_offset=offsets[t], end_offset=offsets[t] + rows * cols,
                    num_embeddings=-1, embedding_dim=cols,
                )
                for t, (table, (rows, cols)) in enumerate(zip(config.embedding_tables, emb.embedding_specs))
            }

    def dense_table_weights(self) -> List[torch.Tensor]:
        """Per table, the whole pool of a dense TBE's flat weights as ``[rows, cols]`` (autograd tracks them)."""
        emb = self.module
        offsets = emb.weights_physical_offsets
        return [emb.weights[offsets[t]: offsets[t + 1]].view(-1, cols) for t, cols in enumerate(self.local_cols)]

    def route_prefetch(self, prefetch: Callable[..., None]) -> None:
        """TorchRec's prefetch of this kernel (called for KEY_VALUE tables by prefetching pipelines) calls
        ``prefetch(indices, offsets, forward_stream=None, batch_size_per_feature_per_rank=None)`` instead of the
        TBE's own (which would clamp raw IDs in place)."""
        self.module.prefetch = prefetch
        self.module.prefetch_pipeline = True  # TorchRec checks it for key_value

    def iteration(self) -> int:
        """The fused optimizer's step counter (fbgemm's ``iter``; Adam-style optimizers use it)."""
        return int(self.module.iter.item())

    def set_iteration(self, value: int) -> None:
        """Set the step counter (and fbgemm's CPU copy of it, which it syncs only from 0)."""
        emb = self.module
        emb.iter.fill_(value)
        if isinstance(getattr(emb, "iter_cpu", None), torch.Tensor):
            emb.iter_cpu.fill_(value)
