"""Time-to-live eviction: a slot expires when it has not been used for ``ttl_steps`` steps or ``ttl_seconds``."""

from __future__ import annotations

import time
from typing import Callable, Dict, Optional

import torch

from torchrec_ascend.errors import ConfigError
from torchrec_ascend.policies.options import non_negative, non_negative_int
from torchrec_ascend.policies.scored import ScoredEvictionPolicy


class TTL(ScoredEvictionPolicy):
    """Expires slots idle for longer than a time-to-live; under pressure evicts the longest idle first.

    Exactly one of ``ttl_steps`` and ``ttl_seconds`` is given. A slot last used at step ``s`` (or wall-clock time
    ``t``) is expired from step ``s + ttl_steps + 1`` (or once ``clock() > t + ttl_seconds``). :meth:`expired`
    lists them so the owner can free them regardless of pressure; :meth:`select_victims` ranks by idle time, so
    expired slots are chosen before any live one.

    Args:
        capacity (int): number of slots.
        ttl_steps (int, optional): idle steps a slot survives.
        ttl_seconds (float, optional): idle seconds a slot survives (wall clock, as RecSDK's evict_threshold).
        clock (Callable[[], float]): time source for ``ttl_seconds``; ``time.time`` so checkpoints stay valid
            across processes.

    Raises:
        ConfigError: neither or both TTLs are given, or one is negative.

    Example::

        ttl = TTL(capacity=4, ttl_steps=10)
        ttl.on_insert(torch.tensor([0]), torch.tensor([42]), step=0)
        ttl.expired(step=11)  # tensor([0])
    """

    state_names = ("last_step", "last_time")

    def __init__(
        self,
        capacity: int,
        ttl_steps: Optional[int] = None,
        ttl_seconds: Optional[float] = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        super().__init__(capacity)
        if (ttl_steps is None) == (ttl_seconds is None):
            raise ConfigError(
                "policy 'ttl': give exactly one of the options 'ttl_steps' and 'ttl_seconds', got "
                f"ttl_steps={ttl_steps!r}, ttl_seconds={ttl_seconds!r}"
            )
        self.ttl_steps = None if ttl_steps is None else non_negative_int("ttl", "ttl_steps", ttl_steps)
        self.ttl_seconds = None if ttl_seconds is None else non_negative("ttl", "ttl_seconds", ttl_seconds)
        self.clock = clock
        self.last_step = torch.zeros(capacity, dtype=torch.int64)
        self.last_time = torch.zeros(capacity, dtype=torch.float64)

    def reset(self, slots: torch.Tensor, keys: torch.Tensor, step: int) -> None:
        pass  # record() overwrites the metadata

    def record(
        self, slots: torch.Tensor, counts: torch.Tensor, step: int, signals: Optional[Dict[str, torch.Tensor]]
    ) -> None:
        self.last_step.index_fill_(0, slots, step)
        if self.ttl_seconds is not None:
            self.last_time.index_fill_(0, slots, self.clock())

    def scores(self, step: int) -> torch.Tensor:
        return self.last_step if self.ttl_seconds is None else self.last_time

    def expired(self, step: int) -> torch.Tensor:
        if self.ttl_steps is not None:
            old = self.last_step < step - self.ttl_steps
        else:
            assert self.ttl_seconds is not None  # __init__ sets exactly one of the two TTLs
            old = self.last_time < self.clock() - self.ttl_seconds
        return (self.resident & old).nonzero().squeeze(1)
