"""A third-party torchrec-ascend eviction policy: LFU whose counts fade, halving every ``half_life`` steps.

Plain LFU keeps yesterday's hot items forever; with a half-life an item must stay popular to stay cached. Built on
``ScoredEvictionPolicy`` (residency, ``topk`` victims, state_dict): two tensors indexed by slot, a few vectorised
ops per batch.

Example::

    policy = DecayedLFU(capacity=4, half_life=10)
    policy.on_insert(torch.tensor([0, 1]), keys=torch.tensor([10, 11]), step=0)
    policy.on_access(torch.tensor([1]), keys=torch.tensor([11]), counts=torch.tensor([3]), step=5)
    policy.select_victims(1, evictable=torch.ones(4, dtype=torch.bool), step=6)   # tensor([0])
"""

from typing import Dict, List, Optional

import torch

from torchrec_ascend.errors import ConfigError
from torchrec_ascend.hookspecs import hookimpl
from torchrec_ascend.policies.base import PolicySpec
from torchrec_ascend.policies.scored import ScoredEvictionPolicy


class DecayedLFU(ScoredEvictionPolicy):
    """Evicts the resident slots with the lowest decayed access count ``sum(count * 2 ** -(age / half_life))``."""

    state_names = ("score", "stamp")  # the decayed count as of step `stamp`

    def __init__(self, capacity: int, half_life: float = 100.0) -> None:
        super().__init__(capacity)
        if not half_life > 0:
            raise ConfigError(f"decayed_lfu: option half_life must be > 0 steps, got {half_life}")
        self.half_life = float(half_life)
        self.score = torch.zeros(capacity, dtype=torch.float64)
        self.stamp = torch.zeros(capacity, dtype=torch.int64)

    def reset(self, slots: torch.Tensor, keys: torch.Tensor, step: int) -> None:
        self.score[slots], self.stamp[slots] = 0.0, step

    def record(self, slots: torch.Tensor, counts: torch.Tensor, step: int,
               signals: Optional[Dict[str, torch.Tensor]]) -> None:
        self.score[slots] = self.score[slots] * torch.exp2((self.stamp[slots] - step) / self.half_life) + counts
        self.stamp[slots] = step

    def scores(self, step: int) -> torch.Tensor:
        return self.score * torch.exp2((self.stamp - step) / self.half_life)


@hookimpl
def torchrec_ascend_policies() -> List[PolicySpec]:
    """Offer ``decayed_lfu`` to tables (``eviction_policy="decayed_lfu"``, option ``half_life`` in steps)."""
    return [PolicySpec("decayed_lfu", "eviction", DecayedLFU, "LFU with counts halving every half_life steps")]
