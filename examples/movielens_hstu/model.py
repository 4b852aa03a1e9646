"""The HSTU next-item recommender: a TorchRec ``EmbeddingCollection`` of items feeding a dense HSTU encoder.

Training objective: at every position of a user's history, predict the next item with a sampled softmax over the
batch's candidates (in-batch positives plus random negatives), on L2-normalised vectors with a temperature. Only
the candidates' rows are looked up, so one step touches a subset of the item table.
"""

from __future__ import annotations

from typing import List, Tuple

import torch
import torch.nn.functional as F
from torch import nn
from torchrec.modules.embedding_configs import EmbeddingConfig
from torchrec.modules.embedding_modules import EmbeddingCollection
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from batches import IGNORE, SequenceBatch
from embedding_tables import CANDIDATES, HISTORY
from hstu import HSTUEncoder


class HSTURecommender(nn.Module):
    """Item embeddings (sparse, shardable) + HSTU encoder (dense) + sampled-softmax loss.

    Args:
        tables (List[EmbeddingConfig]): the item table, read by features ``history`` and ``candidates``.
        max_seq_len (int): padded history length ``L``.
        num_layers, num_heads (int): HSTU depth and heads.
        dropout (float): dropout inside the encoder.
        temperature (float): softmax temperature on cosine similarities.
        device (torch.device): where the embedding table is created; ``meta`` lets DistributedModelParallel
            allocate only the shards of each rank.

    Example::

        model = HSTURecommender(item_tables(1683, 64), max_seq_len=50, device=torch.device("meta"))
        model = DistributedModelParallel(model, device=torch.device("cpu"), plan=plan, sharders=sharders)
        loss, _ = model(batch)
    """

    def __init__(
        self,
        tables: List[EmbeddingConfig],
        max_seq_len: int,
        num_layers: int = 2,
        num_heads: int = 2,
        dropout: float = 0.0,
        temperature: float = 0.2,
        device: torch.device = torch.device("cpu"),
    ) -> None:
        super().__init__()
        self.max_seq_len = max_seq_len
        self.temperature = temperature
        self.item_embeddings = EmbeddingCollection(tables=tables, device=device)
        dim = tables[0].embedding_dim
        self.encoder = HSTUEncoder(dim, max_seq_len, num_layers, num_heads, dropout)

    def encode(self, features: KeyedJaggedTensor) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Encode histories and embed candidates.

        Args:
            features: keys ``history`` (``B`` sequences of at most ``L`` items) and ``candidates`` (``C`` items).

        Returns:
            Tuple of ``states`` float ``[B, L, D]`` (unit norm; position ``t`` predicts item ``t + 1``),
            ``lengths`` int64 ``[B]`` (history lengths) and ``candidates`` float ``[C, D]`` (unit norm).
        """
        embeddings = self.item_embeddings(features)
        history = embeddings[HISTORY]
        padded = F.normalize(history.to_padded_dense(desired_length=self.max_seq_len), dim=-1)
        states = F.normalize(self.encoder(padded), dim=-1)
        return states, history.lengths(), F.normalize(embeddings[CANDIDATES].values(), dim=-1)

    def forward(self, batch: SequenceBatch) -> Tuple[torch.Tensor, torch.Tensor]:
        """Return ``(loss, loss.detach())``: the mean next-item cross-entropy over all real positions."""
        states, _, candidates = self.encode(batch.features)
        has_target = batch.labels != IGNORE
        logits = states[has_target] @ candidates.T / self.temperature
        loss = F.cross_entropy(logits, batch.labels[has_target])
        return loss, loss.detach()
