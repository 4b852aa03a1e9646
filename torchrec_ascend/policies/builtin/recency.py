"""Recency-based eviction: LRU and EpochLRU (recency bucketed into epochs of steps, CLOCK-like)."""

from __future__ import annotations

from typing import Dict, Optional

import torch

from torchrec_ascend.policies.scored import LOW_MAX, EpochScoredPolicy, ScoredEvictionPolicy


class LRU(ScoredEvictionPolicy):
    """Least recently used: evicts the slots whose last access is the oldest step.

    Slots used in the same step tie; the lowest slots go first.

    Args:
        capacity (int): number of slots.

    Example::

        lru = LRU(capacity=2)
        lru.on_insert(torch.tensor([0, 1]), torch.tensor([10, 11]), step=0)
        lru.on_access(torch.tensor([0]), torch.tensor([10]), torch.tensor([1]), step=1)
        lru.select_victims(1, torch.ones(2, dtype=torch.bool), step=2)  # tensor([1])
    """

    state_names = ("last_step",)

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity)
        self.last_step = torch.zeros(capacity, dtype=torch.int64)

    def reset(self, slots: torch.Tensor, keys: torch.Tensor, step: int) -> None:
        pass  # record() overwrites the only metadata

    def record(
        self, slots: torch.Tensor, counts: torch.Tensor, step: int, signals: Optional[Dict[str, torch.Tensor]]
    ) -> None:
        self.last_step.index_fill_(0, slots, step)

    def scores(self, step: int) -> torch.Tensor:
        return self.last_step


class EpochLRU(EpochScoredPolicy):
    """Recency in epochs of ``epoch_steps`` steps: slots unused for the most epochs go first, oldest insert first.

    Within an epoch all accesses count the same (like a CLOCK reference bit that is cleared every epoch), so a
    slot is ranked by ``(epoch of its last access, step it was inserted)``: among the slots last used in the same
    epoch, the one resident longest goes first. With ``epoch_steps=1`` it is LRU with FIFO tie-breaking.

    Args, Raises: as :class:`EpochScoredPolicy` (``capacity``; ``epoch_steps`` >= 1, default 100).

    Example::

        policy = EpochLRU(capacity=1024, epoch_steps=100)
    """

    state_names = ("last_epoch", "inserted_step")

    def __init__(self, capacity: int, epoch_steps: int = 100) -> None:
        super().__init__(capacity, epoch_steps, "epoch_lru")

    def reset(self, slots: torch.Tensor, keys: torch.Tensor, step: int) -> None:
        self.packed.index_fill_(0, slots, min(step, LOW_MAX))  # record() sets the epoch

    def record(
        self, slots: torch.Tensor, counts: torch.Tensor, step: int, signals: Optional[Dict[str, torch.Tensor]]
    ) -> None:
        inserted = self.packed.index_select(0, slots).bitwise_and_(LOW_MAX)
        self.packed.index_copy_(0, slots, inserted.bitwise_or_(self.epoch_bits(step)))
