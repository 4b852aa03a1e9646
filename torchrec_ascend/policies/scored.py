"""Building blocks for eviction policies that rank slots by a per-slot score held in capacity-sized tensors.

Most policies (LRU, LFU, their epoch variants, TTL, show/click) are "keep a few numbers per slot, evict the
lowest". :class:`ScoredEvictionPolicy` does the common part once: residency, victim selection (:func:`lowest`:
the lowest scores among the candidates) and ``state_dict`` round trips of the metadata tensors. A subclass says how
accesses update its metadata and how metadata becomes a score. Third-party policies may build on it too.
"""

from __future__ import annotations

import abc
from typing import Any, Dict, Optional, Tuple

import torch

from torchrec_ascend.errors import ConfigError
from torchrec_ascend.policies.base import EvictionPolicy
from torchrec_ascend.policies.options import load_tensors, positive_int

_LOW_BITS = 32
LOW_MAX = (1 << _LOW_BITS) - 1  # the most the low key of :func:`pack` holds (it saturates there)
_HIGH_MAX = (1 << (63 - _LOW_BITS)) - 1


def lowest(scores: torch.Tensor, candidates: torch.Tensor, num: int) -> torch.Tensor:
    """Return the ``num`` candidate slots with the lowest scores.

    Args:
        scores (torch.Tensor): ``[capacity]`` scores (any real dtype) on the CPU.
        candidates (torch.Tensor): ``[capacity]`` bool mask of the slots that may be chosen.
        num (int): how many to choose; at most ``candidates.sum()``.

    Returns:
        torch.Tensor: int64 ``[num]`` distinct slots, all candidates; no candidate left out scores lower than
        any chosen one (ties go to the lowest slots; NaN scores last).

    Example::

        lowest(torch.tensor([3, 1, 2]), torch.tensor([True, False, True]), 1)  # tensor([2])
    """
    if num <= 0:
        return torch.empty(0, dtype=torch.int64)
    # Imported here: policies load (plugin discovery at `import torchrec`) even where the native library does not.
    from torchrec_ascend.native import ops

    # One native radix selection: a few passes over the slots, where topk compared (value, index) pairs.
    wide = scores.to(torch.float64 if scores.is_floating_point() else torch.int64)  # exact for every real dtype
    return ops.select_lowest(wide, candidates, num)


def lowest_packed(high: torch.Tensor, low: torch.Tensor, candidates: torch.Tensor, num: int) -> torch.Tensor:
    """:func:`lowest` of ``pack(high, low)``, without building the packed scores (a pass over every slot fewer).

    Example::

        lowest_packed(torch.tensor([1, 0]), torch.tensor([0, 5]), torch.tensor([True, True]), 1)  # tensor([1])
    """
    if num <= 0:
        return torch.empty(0, dtype=torch.int64)
    from torchrec_ascend.native import ops  # (as in lowest)

    return ops.select_lowest_packed(high, low, candidates, num)


def pack(high: torch.Tensor, low: torch.Tensor) -> torch.Tensor:
    """Combine two non-negative int64 keys into one int64 score ordered by ``(high, low)``.

    ``low`` saturates at ``2**32 - 1`` and ``high`` at ``2**31 - 1``, which bounds steps and counts, not IDs.

    Example::

        pack(torch.tensor([1, 0]), torch.tensor([0, 9]))  # first > second
    """
    packed = high.clamp(0, _HIGH_MAX)
    packed <<= _LOW_BITS
    packed |= low.clamp(0, LOW_MAX)
    return packed


def ones_like_slots(slots: torch.Tensor, counts: Optional[torch.Tensor]) -> torch.Tensor:
    """``counts`` as int64, or ones when the owner passed none (an insert counts as one access)."""
    return torch.ones_like(slots) if counts is None else counts.to(torch.int64)


class ScoredEvictionPolicy(EvictionPolicy, abc.ABC):
    """An eviction policy that evicts the resident, evictable slots with the lowest :meth:`scores`.

    Subclasses list their per-slot metadata tensors in ``state_names`` (each an attribute of shape
    ``[capacity]``) and implement :meth:`reset` (a slot gets a new key), :meth:`record` (accesses) and
    :meth:`scores`. All of them receive whole batches of slots.

    Args:
        capacity (int): number of slots; at least 1.

    Raises:
        ConfigError: ``capacity`` is not a positive integer.

    Example::

        class MostRecentlyInserted(ScoredEvictionPolicy):
            state_names = ("inserted",)

            def __init__(self, capacity):
                super().__init__(capacity)
                self.inserted = torch.zeros(capacity, dtype=torch.int64)

            def reset(self, slots, keys, step):
                self.inserted[slots] = step

            def record(self, slots, counts, step, signals):
                pass

            def scores(self, step):
                return -self.inserted
    """

    state_names: Tuple[str, ...] = ()

    def __init__(self, capacity: int, **options: Any) -> None:
        if not isinstance(capacity, int) or isinstance(capacity, bool) or capacity < 1:
            raise ConfigError(f"an eviction policy needs a positive integer capacity, got {capacity!r}")
        super().__init__(capacity, **options)
        self.resident = torch.zeros(capacity, dtype=torch.bool)

    @abc.abstractmethod
    def reset(self, slots: torch.Tensor, keys: torch.Tensor, step: int) -> None:
        """``slots`` now hold new ``keys``: clear what was known about the previous occupants."""

    @abc.abstractmethod
    def record(
        self, slots: torch.Tensor, counts: torch.Tensor, step: int, signals: Optional[Dict[str, torch.Tensor]]
    ) -> None:
        """``slots`` were used ``counts`` (int64) times at ``step``."""

    @abc.abstractmethod
    def scores(self, step: int) -> torch.Tensor:
        """``[capacity]`` scores at ``step``; the lowest resident evictable ones are evicted first."""

    def on_insert(
        self,
        slots: torch.Tensor,
        keys: torch.Tensor,
        step: int,
        counts: Optional[torch.Tensor] = None,
        signals: Optional[Dict[str, torch.Tensor]] = None,
    ) -> None:
        self.resident.index_fill_(0, slots, True)
        self.reset(slots, keys, step)
        self.record(slots, ones_like_slots(slots, counts), step, signals)

    def on_access(
        self,
        slots: torch.Tensor,
        keys: torch.Tensor,
        counts: torch.Tensor,
        step: int,
        signals: Optional[Dict[str, torch.Tensor]] = None,
    ) -> None:
        self.record(slots, counts.to(torch.int64), step, signals)

    def on_remove(self, slots: torch.Tensor) -> None:
        self.resident.index_fill_(0, slots, False)

    def select_victims(self, num: int, evictable: torch.Tensor, step: int) -> torch.Tensor:
        return lowest(self.scores(step), self.resident & evictable, num)

    def state_dict(self) -> Dict[str, torch.Tensor]:
        names = ("resident",) + tuple(self.state_names)
        return {name: getattr(self, name).clone() for name in names}

    def load_state_dict(self, state: Dict[str, torch.Tensor]) -> None:
        names = ("resident",) + tuple(self.state_names)
        load_tensors(state, {name: getattr(self, name) for name in names}, type(self).__name__,
                     f"restore it into a policy with the same capacity ({self.capacity}) and options")


class EpochScoredPolicy(ScoredEvictionPolicy, abc.ABC):
    """A :class:`ScoredEvictionPolicy` that ranks slots by ``(epoch of the last access, one number of its own)``.

    Both live packed in one int64 per slot, ``packed = last_epoch << 32 | number`` (as :func:`pack` orders them), so
    :meth:`scores` is that tensor as it stands and an access rewrites only the slots it touched: no pass over the
    capacity per step. A subclass writes ``packed`` in :meth:`reset` and :meth:`record` (:meth:`epoch_bits` gives
    the epoch's part) and names the two numbers in ``state_names`` (``("last_epoch", <its own>)``): the
    ``state_dict`` holds them apart, so it reads like any other scored policy's.

    Args:
        capacity (int): number of slots.
        epoch_steps (int): steps per epoch; >= 1.
        policy (str): the policy's name, for messages.

    Raises:
        ConfigError: ``epoch_steps`` is not an integer >= 1.

    Example::

        class EpochFIFO(EpochScoredPolicy):
            state_names = ("last_epoch", "inserted_step")

            def __init__(self, capacity, epoch_steps=100):
                super().__init__(capacity, epoch_steps, "epoch_fifo")

            def reset(self, slots, keys, step):
                self.packed.index_fill_(0, slots, self.epoch_bits(step) | min(step, LOW_MAX))

            def record(self, slots, counts, step, signals):
                pass
    """

    def __init__(self, capacity: int, epoch_steps: int, policy: str) -> None:
        super().__init__(capacity)
        self.epoch_steps = positive_int(policy, "epoch_steps", epoch_steps)
        self.packed = torch.zeros(capacity, dtype=torch.int64)

    def epoch(self, step: int) -> int:
        """The epoch ``step`` falls in."""
        return step // self.epoch_steps

    def epoch_bits(self, step: int) -> int:
        """``packed``'s value for the epoch of ``step`` and a number of 0."""
        return min(self.epoch(step), _HIGH_MAX) << _LOW_BITS

    def scores(self, step: int) -> torch.Tensor:
        return self.packed

    def state_dict(self) -> Dict[str, torch.Tensor]:
        epoch, number = self.state_names
        return {"resident": self.resident.clone(), epoch: self.packed >> _LOW_BITS, number: self.packed & LOW_MAX}

    def load_state_dict(self, state: Dict[str, torch.Tensor]) -> None:
        epoch, number = self.state_names
        parts = {name: torch.empty_like(self.packed) for name in (epoch, number)}
        load_tensors(state, {"resident": self.resident, **parts}, type(self).__name__,
                     f"restore it into a policy with the same capacity ({self.capacity}) and options")
        self.packed.copy_(pack(parts[epoch], parts[number]))
