"""Deliberately broken policies, registered in-process by tests to show the contract kit and wrappers catch them."""

from __future__ import annotations

from typing import Dict, List, Optional

import torch

from torchrec_ascend.hookspecs import hookimpl
from torchrec_ascend.policies.base import AdmissionPolicy, PolicySpec
from torchrec_ascend.policies.builtin.admission import CountAdmission
from torchrec_ascend.policies.builtin.recency import LRU


class DuplicateVictims(LRU):
    """Returns its first choice ``num`` times."""

    def select_victims(self, num: int, evictable: torch.Tensor, step: int) -> torch.Tensor:
        victims = super().select_victims(num, evictable, step)
        return victims[:1].repeat(num) if num > 1 else victims


class IgnoresEvictable(LRU):
    """Picks among all resident slots, including the ones in use."""

    def select_victims(self, num: int, evictable: torch.Tensor, step: int) -> torch.Tensor:
        return super().select_victims(num, torch.ones_like(evictable), step)


class RandomVictims(LRU):
    """Picks random resident evictable slots from an unseeded generator: valid but not deterministic."""

    def select_victims(self, num: int, evictable: torch.Tensor, step: int) -> torch.Tensor:
        candidates = (self.resident & evictable).nonzero().squeeze(1)
        return candidates[torch.randperm(candidates.numel())[:num]]


class ForgetfulState(LRU):
    """Saves nothing, so a restored instance decides differently."""

    def state_dict(self) -> Dict[str, torch.Tensor]:
        return {}

    def load_state_dict(self, state: Dict[str, torch.Tensor]) -> None:
        pass


class CrashingVictims(LRU):
    """Raises from select_victims."""

    def select_victims(self, num: int, evictable: torch.Tensor, step: int) -> torch.Tensor:
        raise RuntimeError("boom")


class WrongShapeAdmission(AdmissionPolicy):
    """Returns one decision too many."""

    def admit(
        self, keys: torch.Tensor, counts: torch.Tensor, step: int, signals: Optional[Dict[str, torch.Tensor]] = None
    ) -> torch.Tensor:
        return torch.ones(keys.numel() + 1, dtype=torch.bool)


class ForgetfulAdmission(CountAdmission):
    """Counts correctly but saves no state."""

    def __init__(self) -> None:
        super().__init__(threshold=2, max_tracked=64)

    def state_dict(self) -> Dict[str, torch.Tensor]:
        return {}

    def load_state_dict(self, state: Dict[str, torch.Tensor]) -> None:
        pass


BROKEN = {
    "broken_duplicates": DuplicateVictims,
    "broken_evictable": IgnoresEvictable,
    "broken_random": RandomVictims,
    "broken_state": ForgetfulState,
    "broken_crash": CrashingVictims,
}


@hookimpl
def torchrec_ascend_policies() -> List[PolicySpec]:
    """The broken policies, under the names of ``BROKEN`` plus two admission ones."""
    specs = [PolicySpec(name, "eviction", cls, "deliberately broken (tests)") for name, cls in BROKEN.items()]
    specs.append(PolicySpec("broken_shape", "admission", WrongShapeAdmission, "deliberately broken (tests)"))
    specs.append(PolicySpec("broken_admission_state", "admission", ForgetfulAdmission, "deliberately broken"))
    return specs
