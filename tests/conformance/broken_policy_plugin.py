"""Test-only policy plugin, registered in-process: an LRU that returns its first victim ``num`` times."""

from __future__ import annotations

from typing import List

import torch

from torchrec_ascend.hookspecs import hookimpl
from torchrec_ascend.policies.base import PolicySpec
from torchrec_ascend.policies.builtin.recency import LRU

NAME = "conformance_duplicate_victims"


class DuplicateVictims(LRU):
    """Breaks the contract: victims must be distinct."""

    def select_victims(self, num: int, evictable: torch.Tensor, step: int) -> torch.Tensor:
        victims = super().select_victims(num, evictable, step)
        return victims[:1].repeat(num) if num > 1 else victims


@hookimpl
def torchrec_ascend_policies() -> List[PolicySpec]:
    return [PolicySpec(NAME, "eviction", lambda capacity: DuplicateVictims(capacity), "repeats its first victim")]
