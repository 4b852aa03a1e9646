"""Composition of eviction policies by name: ``"ttl+lfu"`` evicts expired slots first, then ranks by LFU.

Semantics of ``"a+b+...+z"``:

* every component sees every event (insert, access, remove), so each keeps its own metadata;
* :meth:`expired` is the union of all components' expired slots;
* :meth:`select_victims` takes the *nominated* slots first (expired in any component, evictable), ranked by the
  last component ``z`` when there are more than needed; the remaining victims are ``z``'s choice among the other
  evictable slots. ``z`` is the ranker; the components before it act as filters.

So ``"ttl+lfu"`` means "expired slots (TTL) first, remaining victims by LFU", and ``"lfu"`` alone is unchanged.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence

import torch

from torchrec_ascend.errors import ConfigError
from torchrec_ascend.policies.base import EvictionPolicy


class CompositeEvictionPolicy(EvictionPolicy):
    """Eviction policies chained as filters followed by a ranker (see the module docstring).

    Args:
        names (Sequence[str]): component names, distinct, in order (for ``state_dict`` keys).
        components (Sequence[EvictionPolicy]): the policies, same capacity, in the same order; the last ranks.

    Raises:
        ConfigError: fewer than two components, lengths or capacities differ (the registry checks names first).

    Example::

        policy = create_eviction_policy("ttl+lfu", capacity=1024, ttl={"ttl_steps": 100})
    """

    def __init__(self, names: Sequence[str], components: Sequence[EvictionPolicy]) -> None:
        if len(components) < 2 or len(names) != len(components):
            raise ConfigError(f"a composite needs two or more named components, got {list(names)}")
        capacities = {c.capacity for c in components}
        if len(capacities) != 1:
            raise ConfigError(f"components {list(names)} have different capacities {sorted(capacities)}")
        super().__init__(components[0].capacity)
        self.names: List[str] = list(names)
        self.components: List[EvictionPolicy] = list(components)

    @property
    def ranker(self) -> EvictionPolicy:
        """The last component, which orders the victims."""
        return self.components[-1]

    def on_insert(
        self,
        slots: torch.Tensor,
        keys: torch.Tensor,
        step: int,
        counts: Optional[torch.Tensor] = None,
        signals: Optional[Dict[str, torch.Tensor]] = None,
    ) -> None:
        for component in self.components:
            component.on_insert(slots, keys, step, counts=counts, signals=signals)

    def on_access(
        self,
        slots: torch.Tensor,
        keys: torch.Tensor,
        counts: torch.Tensor,
        step: int,
        signals: Optional[Dict[str, torch.Tensor]] = None,
    ) -> None:
        for component in self.components:
            component.on_access(slots, keys, counts, step, signals=signals)

    def on_remove(self, slots: torch.Tensor) -> None:
        for component in self.components:
            component.on_remove(slots)

    def _expired_mask(self, step: int) -> torch.Tensor:
        mask = torch.zeros(self.capacity, dtype=torch.bool)
        for component in self.components:
            mask[component.expired(step)] = True
        return mask

    def expired(self, step: int) -> torch.Tensor:
        return self._expired_mask(step).nonzero().squeeze(1)

    def select_victims(self, num: int, evictable: torch.Tensor, step: int) -> torch.Tensor:
        nominated = self._expired_mask(step) & evictable
        found = int(nominated.sum())
        if found >= num:
            return self.ranker.select_victims(num, nominated, step)
        rest = self.ranker.select_victims(num - found, evictable & ~nominated, step)
        return torch.cat([nominated.nonzero().squeeze(1), rest])

    def state_dict(self) -> Dict[str, torch.Tensor]:
        """Each component's state under ``"<name>."``."""
        return {
            f"{name}.{key}": value
            for name, component in zip(self.names, self.components)
            for key, value in component.state_dict().items()
        }

    def load_state_dict(self, state: Dict[str, torch.Tensor]) -> None:
        for name, component in zip(self.names, self.components):
            prefix = f"{name}."
            component.load_state_dict({k[len(prefix) :]: v for k, v in state.items() if k.startswith(prefix)})
