"""Eviction cadence for cache owners: when to evict, how much, and protection against thrashing.

RecSDK evicts at a fixed 10-step interval. Here the interval is an option, and two rules keep a cache from
thrashing (rows swapped out and straight back in):

* **Bulk eviction on cadence.** Every ``interval`` steps the owner frees enough slots for the batch *plus*
  ``headroom * capacity`` spare slots, and drops the slots its policy calls expired. Between cadence steps it
  evicts only what the batch cannot fit without (a *forced* eviction: the batch's keys must be resident), so a
  large headroom makes forced evictions rare and the transfers bulky.
* **Minimum residency.** A slot inserted less than ``min_residency`` steps ago is not evictable unless nothing
  else is: :meth:`select` first asks the policy for victims among mature slots only, and only if there are too few
  adds young ones (the policy still ranks them). A new row therefore survives the next few batches (at least
  the pipeline depth is a good choice), instead of being evicted by LRU-like policies before it is reused.

The owner calls :meth:`on_insert`/:meth:`on_remove` alongside the policy's, then per batch::

    need = cadence.num_to_evict(num_free, num_missing, num_evictable, step)
    if cadence.due(step):
        expired = policy.expired(step)           # drop them (those not in use) first
    victims = cadence.select(policy, need, evictable, step)

Counters (``stats``) say how often each path ran, for the cache metrics.
"""

from __future__ import annotations

import math
from typing import Dict

import torch

from torchrec_ascend.errors import ConfigError
from torchrec_ascend.policies.base import EvictionPolicy
from torchrec_ascend.policies.options import fraction, load_tensors, non_negative_int, positive_int


class EvictionCadence:
    """Decides when and how many slots a cache evicts, and protects young slots (module docstring).

    Args:
        capacity (int): slots of the cache.
        interval (int): steps between bulk evictions; 1 evicts every step.
        min_residency (int): steps a newly inserted slot is protected; 0 disables the protection.
        headroom (float): fraction of the capacity a bulk eviction leaves free, in ``[0, 1)``.

    Raises:
        ConfigError: an option is out of range.

    Example::

        cadence = EvictionCadence(capacity=100_000, interval=10, min_residency=3, headroom=0.05)
        cadence.num_to_evict(num_free=100, num_needed=300, num_evictable=90_000, step=7)   # 200: forced
        cadence.num_to_evict(num_free=100, num_needed=300, num_evictable=90_000, step=10)  # 5200: leaves 5% free
    """

    def __init__(self, capacity: int, interval: int = 1, min_residency: int = 0, headroom: float = 0.0) -> None:
        self.capacity = positive_int("cadence", "capacity", capacity)
        self.interval = positive_int("cadence", "interval", interval)
        self.min_residency = non_negative_int("cadence", "min_residency", min_residency)
        self.headroom = fraction("cadence", "headroom", headroom)
        if self.headroom >= 1:
            raise ConfigError(f"cadence option 'headroom' must be below 1 (1 would empty the cache), got {headroom!r}")
        self.inserted_step = torch.zeros(capacity, dtype=torch.int64)
        self.resident = torch.zeros(capacity, dtype=torch.bool)
        self.stats: Dict[str, int] = {"bulk": 0, "forced": 0, "evicted": 0, "young_evicted": 0}

    def due(self, step: int) -> bool:
        """Whether ``step`` is a bulk-eviction step."""
        return step % self.interval == 0

    def on_insert(self, slots: torch.Tensor, step: int) -> None:
        """``slots`` became resident at ``step`` (starts their protection)."""
        self.inserted_step.index_fill_(0, slots, step)
        self.resident.index_fill_(0, slots, True)

    def on_remove(self, slots: torch.Tensor) -> None:
        """``slots`` stopped being resident."""
        self.resident.index_fill_(0, slots, False)

    def num_to_evict(self, num_free: int, num_needed: int, num_evictable: int, step: int) -> int:
        """How many slots to evict now so that ``num_needed`` new rows fit.

        Args:
            num_free (int): free slots now.
            num_needed (int): rows the batch must insert.
            num_evictable (int): resident slots not in use (the most that can be evicted).
            step (int): current step.

        Returns:
            int: ``max(0, num_needed - num_free)``; on cadence steps enough to also leave the headroom free,
            bounded by ``num_evictable``.
        """
        forced = max(0, num_needed - num_free)
        if not self.due(step):
            return forced
        spare = math.ceil(self.headroom * self.capacity)
        return max(forced, min(num_needed + spare - num_free, num_evictable))

    def select(self, policy: EvictionPolicy, num: int, evictable: torch.Tensor, step: int) -> torch.Tensor:
        """Ask ``policy`` for ``num`` victims among ``evictable``, mature slots first.

        Args:
            policy (EvictionPolicy): the cache's (checked) policy.
            num (int): victims wanted.
            evictable (torch.Tensor): ``[capacity]`` bool, false for slots in use.
            step (int): current step.

        Returns:
            torch.Tensor: int64 ``[num]`` victims.
        """
        if num <= 0:
            return torch.empty(0, dtype=torch.int64)
        self.stats["bulk" if self.due(step) else "forced"] += 1
        self.stats["evicted"] += num
        if self.min_residency == 0:
            return policy.select_victims(num, evictable, step)
        young = self.inserted_step > step - self.min_residency
        mature = evictable & ~young
        available = int((mature & self.resident).sum())
        if available >= num:
            return policy.select_victims(num, mature, step)
        self.stats["young_evicted"] += num - available
        first = policy.select_victims(available, mature, step) if available else torch.empty(0, dtype=torch.int64)
        return torch.cat([first, policy.select_victims(num - available, evictable & young, step)])

    def state_dict(self) -> Dict[str, torch.Tensor]:
        """Insertion steps and residency (the protection survives a checkpoint), as copies."""
        return {"inserted_step": self.inserted_step.clone(), "resident": self.resident.clone()}

    def load_state_dict(self, state: Dict[str, torch.Tensor]) -> None:
        """Restore :meth:`state_dict`'s output.

        Raises:
            ConfigError: the state is for another capacity.
        """
        load_tensors(state, {"inserted_step": self.inserted_step, "resident": self.resident}, "cadence",
                     f"load a state saved by a cadence of the same capacity ({self.capacity})")
