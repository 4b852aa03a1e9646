"""A third-party torchrec-ascend eviction policy: LFU whose counts fade, halving every ``half_life`` steps.

Plain LFU keeps yesterday's hot items forever; with a half-life, an item must stay popular to stay cached. All
state is a few tensors indexed by slot, so each call is a handful of vectorised ops, whatever the batch size.

Example::

    policy = DecayedLFU(capacity=4, half_life=10)
    policy.on_insert(torch.tensor([0, 1]), keys=torch.tensor([10, 11]), step=0)
    policy.on_access(torch.tensor([1]), keys=torch.tensor([11]), counts=torch.tensor([3]), step=5)
    policy.select_victims(1, evictable=torch.ones(4, dtype=torch.bool), step=6)   # tensor([0])
"""

from typing import Any, Dict, List, Optional

import torch

from torchrec_ascend.hookspecs import hookimpl
from torchrec_ascend.policies.base import EvictionPolicy, PolicySpec


class DecayedLFU(EvictionPolicy):
    """Evicts the resident slots with the lowest decayed access count ``sum(count * 2 ** -(age / half_life))``."""

    def __init__(self, capacity: int, half_life: float = 100.0, **options: Any) -> None:
        super().__init__(capacity, **options)
        if not half_life > 0:
            raise ValueError(f"decayed_lfu: half_life must be > 0 steps, got {half_life}.")
        self.half_life = float(half_life)
        self.score = torch.zeros(capacity, dtype=torch.float64)  # decayed count as of step `stamp`
        self.stamp = torch.zeros(capacity, dtype=torch.int64)
        self.resident = torch.zeros(capacity, dtype=torch.bool)

    def _score_at(self, slots: torch.Tensor, step: int) -> torch.Tensor:
        return self.score[slots] * torch.exp2((self.stamp[slots] - step) / self.half_life)

    def on_insert(self, slots: torch.Tensor, keys: torch.Tensor, step: int,
                  counts: Optional[torch.Tensor] = None, signals: Optional[Dict[str, torch.Tensor]] = None) -> None:
        self.resident[slots], self.stamp[slots] = True, step
        self.score[slots] = 1.0 if counts is None else counts.double()

    def on_access(self, slots: torch.Tensor, keys: torch.Tensor, counts: torch.Tensor, step: int,
                  signals: Optional[Dict[str, torch.Tensor]] = None) -> None:
        self.score[slots] = self._score_at(slots, step) + counts
        self.stamp[slots] = step

    def on_remove(self, slots: torch.Tensor) -> None:
        self.resident[slots] = False

    def select_victims(self, num: int, evictable: torch.Tensor, step: int) -> torch.Tensor:
        eligible = self.resident & evictable
        if int(eligible.sum()) < num:
            raise ValueError(f"decayed_lfu: asked for {num} victims, only {int(eligible.sum())} evictable.")
        score = self._score_at(torch.arange(self.capacity), step).masked_fill(~eligible, float("inf"))
        return torch.topk(score, num, largest=False).indices

    def state_dict(self) -> Dict[str, torch.Tensor]:
        return {"score": self.score, "stamp": self.stamp, "resident": self.resident}

    def load_state_dict(self, state: Dict[str, torch.Tensor]) -> None:
        self.score, self.stamp, self.resident = (state[name].clone() for name in ("score", "stamp", "resident"))


@hookimpl
def torchrec_ascend_policies() -> List[PolicySpec]:
    """Offer ``decayed_lfu`` to tables (``eviction_policy="decayed_lfu"``, option ``half_life`` in steps)."""
    return [PolicySpec("decayed_lfu", "eviction", DecayedLFU, "LFU with counts halving every half_life steps")]
