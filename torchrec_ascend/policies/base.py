"""The policy interfaces: what a cache eviction or admission policy is, as the cache and hash tables call it.

pluggy only *discovers* policies (hook ``torchrec_ascend_policies``, see :mod:`torchrec_ascend.hookspecs`). The
per-batch path calls plain methods on a policy object, once per batch, with tensors: never once per ID.

Two kinds:

* :class:`EvictionPolicy` manages metadata for a fixed pool of ``capacity`` slots (a device cache, or a full hash
  table) and, when asked, picks which resident slots to free.
* :class:`AdmissionPolicy` decides whether a key that is not in the table yet gets a row at all. A rejected key
  is looked up as a default vector, stores no state, and is counted.

Conventions shared by both: ``keys`` are raw int64 IDs (any non-negative value up to 2**63-1), ``slots`` are int64
indices in ``[0, capacity)``, ``counts`` are int64 occurrences in the batch (>= 1), ``step`` is the training step
(monotone, starts at 0). All tensors are 1-D CPU tensors; the caller deduplicates, so ``slots`` within one call are
unique. A policy never mutates its inputs.
"""

from __future__ import annotations

import abc
import dataclasses
from typing import Any, Callable, Dict, Literal, Optional

import torch

PolicyKind = Literal["eviction", "admission"]


class EvictionPolicy(abc.ABC):
    """Ranks the resident slots of a fixed-capacity pool for eviction.

    The owner (cache or table) tells the policy about every change of residency and every access, then asks for
    victims. Residency is therefore known to the policy: slots inserted and not yet removed.

    Args:
        capacity: number of slots in the pool.
        **options: policy-specific options, from the table config (for example ``ttl_steps``).

    Example::

        policy = create_eviction_policy("lru", capacity=4)
        policy.on_insert(torch.tensor([0, 1]), keys=torch.tensor([10, 11]), step=0)
        policy.on_access(torch.tensor([0]), keys=torch.tensor([10]), counts=torch.tensor([2]), step=1)
        policy.select_victims(1, evictable=torch.ones(4, dtype=torch.bool), step=2)  # tensor([1])
    """

    def __init__(self, capacity: int, **options: Any) -> None:
        self.capacity = capacity

    @abc.abstractmethod
    def on_insert(
        self,
        slots: torch.Tensor,
        keys: torch.Tensor,
        step: int,
        counts: Optional[torch.Tensor] = None,
        signals: Optional[Dict[str, torch.Tensor]] = None,
    ) -> None:
        """``slots`` became resident, holding ``keys`` (also counts as their first access).

        ``counts`` (occurrences in the inserting batch; ``None`` means once each) and ``signals`` (per-slot tensors
        such as ``"clicks"``, aligned with ``slots``) describe that first access, as in :meth:`on_access`.
        """

    @abc.abstractmethod
    def on_access(
        self,
        slots: torch.Tensor,
        keys: torch.Tensor,
        counts: torch.Tensor,
        step: int,
        signals: Optional[Dict[str, torch.Tensor]] = None,
    ) -> None:
        """Resident ``slots`` (distinct) were used by the batch of ``step``, ``counts`` times each.

        ``signals`` carries optional per-slot tensors aligned with ``slots`` (for example ``"shows"``,
        ``"clicks"``); a policy ignores the ones it does not use.
        """

    @abc.abstractmethod
    def on_remove(self, slots: torch.Tensor) -> None:
        """``slots`` stopped being resident (evicted by this policy's choice or removed by the owner)."""

    @abc.abstractmethod
    def select_victims(self, num: int, evictable: torch.Tensor, step: int) -> torch.Tensor:
        """Return exactly ``num`` distinct resident slots to evict, all with ``evictable[slot]`` true.

        ``evictable`` is a bool tensor of shape ``[capacity]``; slots in use by in-flight batches are false. The
        owner guarantees at least ``num`` resident evictable slots exist. Does not change residency: the owner
        calls :meth:`on_remove` after moving the rows out. A policy may update its own bookkeeping here (queue
        promotions, for example), so the same inputs twice in a row need not give the same victims.
        """

    def expired(self, step: int) -> torch.Tensor:
        """Resident slots to evict regardless of pressure (time-to-live style policies); default: none."""
        return torch.empty(0, dtype=torch.int64)

    def state_dict(self) -> Dict[str, torch.Tensor]:
        """Tensors that restore this policy with :meth:`load_state_dict` (checkpoints)."""
        return {}

    def load_state_dict(self, state: Dict[str, torch.Tensor]) -> None:
        """Restore the state returned by :meth:`state_dict`."""


class AdmissionPolicy(abc.ABC):
    """Decides which keys not yet in a table get a row.

    Args:
        **options: policy-specific options (for example ``threshold``).

    Example::

        policy = create_admission_policy("count", threshold=2)
        policy.admit(torch.tensor([7, 8]), counts=torch.tensor([1, 2]), step=0)  # tensor([False, True])
    """

    def __init__(self, **options: Any) -> None:
        pass

    @abc.abstractmethod
    def admit(
        self,
        keys: torch.Tensor,
        counts: torch.Tensor,
        step: int,
        signals: Optional[Dict[str, torch.Tensor]] = None,
    ) -> torch.Tensor:
        """Return a bool mask over ``keys`` (unique, not in the table): true means give it a row now.

        ``signals`` carries optional per-key tensors aligned with ``keys`` (for example ``"clicks"``).
        """

    def forget(self, keys: torch.Tensor) -> None:
        """``keys`` left the table (evicted): drop or reset whatever the policy tracks for them."""

    def state_dict(self) -> Dict[str, torch.Tensor]:
        """Tensors that restore this policy with :meth:`load_state_dict` (checkpoints)."""
        return {}

    def load_state_dict(self, state: Dict[str, torch.Tensor]) -> None:
        """Restore the state returned by :meth:`state_dict`."""


@dataclasses.dataclass(frozen=True)
class PolicySpec:
    """What a plugin returns from the ``torchrec_ascend_policies`` hook.

    Args:
        name: the name tables use to choose the policy; lower case, unique across plugins.
        kind: ``"eviction"`` or ``"admission"``.
        factory: ``factory(capacity=..., **options)`` for eviction, ``factory(**options)`` for admission; returns
            the policy object.
        description: one line shown by ``torchrec-ascend policies``.
    """

    name: str
    kind: PolicyKind
    factory: Callable[..., Any]
    description: str = ""
