"""Frequency-based eviction: LFU and EpochLFU (access counts that restart every epoch of steps)."""

from __future__ import annotations

from typing import Dict, Optional

import torch

from torchrec_ascend.policies.key_table import BoundedKeyScores
from torchrec_ascend.policies.options import non_negative_int
from torchrec_ascend.policies.scored import LOW_MAX, EpochScoredPolicy, ScoredEvictionPolicy, lowest_packed, pack


class LFU(ScoredEvictionPolicy):
    """Least frequently used: evicts the slots with the fewest accesses, ties to the least recently used.

    A slot's count is the sum of the batch ``counts`` it received while resident. With ``history > 0`` the
    counts of up to ``history`` evicted keys are remembered (a :class:`BoundedKeyScores`) and restored when the
    key comes back, so a popular key evicted once does not restart from zero (the idea of TinyLFU's frequency
    history; it moves LFU towards perfect LFU on skewed traces). Counts saturate at ``2**32 - 1``.

    Args:
        capacity (int): number of slots.
        history (int): evicted keys whose counts are remembered; 0 (default) is classic in-cache LFU.

    Raises:
        ConfigError: ``history`` is negative or not an integer.

    Example::

        lfu = LFU(capacity=2)
        lfu.on_insert(torch.tensor([0, 1]), torch.tensor([10, 11]), step=0, counts=torch.tensor([5, 1]))
        lfu.select_victims(1, torch.ones(2, dtype=torch.bool), step=1)  # tensor([1])
    """

    state_names = ("count", "last_step", "key")

    def __init__(self, capacity: int, history: int = 0) -> None:
        super().__init__(capacity)
        self.history = non_negative_int("lfu", "history", history)
        self.count = torch.zeros(capacity, dtype=torch.int64)
        self.last_step = torch.zeros(capacity, dtype=torch.int64)
        self.key = torch.zeros(capacity, dtype=torch.int64)
        self.remembered = BoundedKeyScores(self.history) if self.history else None

    def reset(self, slots: torch.Tensor, keys: torch.Tensor, step: int) -> None:
        self.key.index_copy_(0, slots, keys.to(torch.int64))
        if self.remembered is None:
            self.count.index_fill_(0, slots, 0)
            return
        self.count.index_copy_(0, slots, self.remembered.lookup(keys).to(torch.int64))
        self.remembered.discard(keys)

    def record(
        self, slots: torch.Tensor, counts: torch.Tensor, step: int, signals: Optional[Dict[str, torch.Tensor]]
    ) -> None:
        self.count.index_add_(0, slots, counts)  # (slots are distinct)
        self.last_step.index_fill_(0, slots, step)

    def scores(self, step: int) -> torch.Tensor:
        return pack(self.count, self.last_step)

    def select_victims(self, num: int, evictable: torch.Tensor, step: int) -> torch.Tensor:
        return lowest_packed(self.count, self.last_step, self.resident & evictable, num)  # the scores, unbuilt

    def on_remove(self, slots: torch.Tensor) -> None:
        if self.remembered is not None:
            self.remembered.add(self.key[slots], self.count[slots].to(torch.float64))
        super().on_remove(slots)

    def state_dict(self) -> Dict[str, torch.Tensor]:
        history = {} if self.remembered is None else self.remembered.state_dict()
        return {**super().state_dict(), **{f"history.{k}": v for k, v in history.items()}}

    def load_state_dict(self, state: Dict[str, torch.Tensor]) -> None:
        super().load_state_dict(state)
        if self.remembered is not None:
            prefix = "history."
            self.remembered.load_state_dict({k[len(prefix) :]: v for k, v in state.items() if k.startswith(prefix)})


class EpochLFU(EpochScoredPolicy):
    """Frequency within epochs of ``epoch_steps`` steps: slots unused for the most epochs go first, then the least used.

    A slot is ranked by ``(epoch of its last access, accesses within that epoch)``. Counts restart when a slot is
    first used in a new epoch, so popularity that faded does not pin a slot forever (LFU's cache pollution); they
    saturate at ``2**32 - 1``.

    Args, Raises: as :class:`EpochScoredPolicy` (``capacity``; ``epoch_steps`` >= 1, default 100).

    Example::

        policy = EpochLFU(capacity=1024, epoch_steps=100)
    """

    state_names = ("last_epoch", "epoch_count")

    def __init__(self, capacity: int, epoch_steps: int = 100) -> None:
        super().__init__(capacity, epoch_steps, "epoch_lfu")

    def reset(self, slots: torch.Tensor, keys: torch.Tensor, step: int) -> None:
        self.packed.index_fill_(0, slots, 0)  # no count, and an epoch record() moves on from

    def record(
        self, slots: torch.Tensor, counts: torch.Tensor, step: int, signals: Optional[Dict[str, torch.Tensor]]
    ) -> None:
        epoch = self.epoch_bits(step)
        # A slot last used in an earlier epoch is below `epoch`: raising it there restarts its count.
        counted = self.packed.index_select(0, slots).clamp_(min=epoch).add_(counts)
        self.packed.index_copy_(0, slots, counted.clamp_(max=epoch | LOW_MAX))  # counts saturate
