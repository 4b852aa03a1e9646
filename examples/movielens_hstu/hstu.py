"""HSTU (Hierarchical Sequential Transduction Unit) layers: the dense sequence encoder of the MovieLens example.

One HSTU layer, as in "Actions Speak Louder than Words" (Zhai et al., 2024), for a padded batch ``x`` of shape
``[B, L, D]``::

    U, V, Q, K = split(SiLU(Linear(LayerNorm(x))))          # pointwise projection, 4 x [B, L, D]
    A = SiLU(Q @ K^T) / L, masked causally (per head)          # no softmax: attention weights are not normalised
    y = x + Linear(Dropout(LayerNorm(A @ V) * U))              # U gates the attended values

Sequences are right-padded, so with the causal mask a real position never attends to padding; outputs at padded
positions are meaningless and callers ignore them. Positions are counted from the first item of a sequence, so a
position's output depends on that item and the earlier ones only (the layer is causal).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def check_length(length: int, max_seq_len: int) -> None:
    """Raise ``ValueError`` if a padded sequence is longer than the model was built for."""
    if length > max_seq_len:
        raise ValueError(
            f"HSTU: sequence length {length} exceeds max_seq_len={max_seq_len}; truncate the history or build "
            f"the model with a larger max_seq_len."
        )


class HSTULayer(nn.Module):
    """One HSTU block with a residual connection.

    Args:
        dim (int): model width ``D``; a multiple of ``num_heads``.
        num_heads (int): attention heads; each attends over ``D / num_heads`` channels.
        max_seq_len (int): the padded length ``L``; attention weights are divided by it.
        dropout (float): dropout on the gated attention output.

    Shapes:
        ``x``: float ``[B, L, D]`` -> float ``[B, L, D]``.

    Raises:
        ValueError: ``dim`` is not divisible by ``num_heads``, or ``x`` is longer than ``max_seq_len``.

    Example::

        layer = HSTULayer(dim=64, num_heads=2, max_seq_len=50)
        layer(torch.randn(8, 50, 64)).shape   # torch.Size([8, 50, 64])
    """

    def __init__(self, dim: int, num_heads: int, max_seq_len: int, dropout: float = 0.0) -> None:
        super().__init__()
        if dim % num_heads:
            raise ValueError(f"HSTULayer: dim={dim} must be a multiple of num_heads={num_heads}.")
        self.num_heads = num_heads
        self.max_seq_len = max_seq_len
        self.input_norm = nn.LayerNorm(dim)
        self.uvqk = nn.Linear(dim, 4 * dim)
        self.attention_norm = nn.LayerNorm(dim)
        self.output = nn.Linear(dim, dim)
        self.dropout = nn.Dropout(dropout)
        self.register_buffer("causal", torch.ones(max_seq_len, max_seq_len, dtype=torch.bool).tril(), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, dim = x.shape
        check_length(length, self.max_seq_len)
        u, v, q, k = F.silu(self.uvqk(self.input_norm(x))).chunk(4, dim=-1)
        v, q, k = (t.reshape(batch, length, self.num_heads, -1).transpose(1, 2) for t in (v, q, k))
        # SiLU instead of softmax keeps the intensity of user engagement (weights do not sum to 1); dividing by the
        # fixed padded length (not the number of items) keeps earlier outputs independent of later items.
        weights = F.silu(q @ k.transpose(-1, -2)) / self.max_seq_len
        weights = weights.masked_fill(~self.causal[:length, :length], 0.0)
        attended = (weights @ v).transpose(1, 2).reshape(batch, length, dim)
        return x + self.output(self.dropout(self.attention_norm(attended) * u))


class HSTUEncoder(nn.Module):
    """Learned absolute positions, a stack of :class:`HSTULayer` and a final LayerNorm.

    Args:
        dim (int): width ``D`` of the item embeddings and of the model.
        max_seq_len (int): padded length ``L`` of the input sequences.
        num_layers (int): number of HSTU layers.
        num_heads (int): heads per layer.
        dropout (float): dropout on the input embeddings and inside each layer.

    Shapes:
        ``items``: float ``[B, L, D]`` (right-padded item embeddings) -> float ``[B, L, D]``; output ``t`` summarises
        items ``0..t`` and is what predicts item ``t + 1``.

    Example::

        encoder = HSTUEncoder(dim=64, max_seq_len=50, num_layers=2, num_heads=2)
        encoder(torch.randn(8, 50, 64)).shape   # torch.Size([8, 50, 64])

    Raises:
        ValueError: the input is longer than ``max_seq_len``.
    """

    def __init__(self, dim: int, max_seq_len: int, num_layers: int, num_heads: int, dropout: float = 0.0) -> None:
        super().__init__()
        self.positions = nn.Embedding(max_seq_len, dim)
        # Unit-scale positions (norm ~1), like the unit-norm item embeddings they are added to.
        nn.init.normal_(self.positions.weight, std=dim**-0.5)
        self.dropout = nn.Dropout(dropout)
        self.layers = nn.ModuleList(HSTULayer(dim, num_heads, max_seq_len, dropout) for _ in range(num_layers))
        self.norm = nn.LayerNorm(dim)

    def forward(self, items: torch.Tensor) -> torch.Tensor:
        check_length(items.shape[1], self.positions.num_embeddings)
        x = self.dropout(items + self.positions.weight[: items.shape[1]])
        for layer in self.layers:
            x = layer(x)
        return self.norm(x)
