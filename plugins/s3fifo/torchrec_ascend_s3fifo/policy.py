"""S3-FIFO eviction (Yang et al., "FIFO queues are all you need for cache eviction", SOSP 2023), vectorized.

The pool of slots is split logically into a small FIFO queue (probation, ``small_fraction`` of the capacity) and
a main queue managed like CLOCK; a ghost FIFO remembers keys recently evicted from the small queue.

* A new key enters the small queue, or the main queue if the ghost remembers it.
* Accesses raise a 2-bit frequency (saturating at 3); the access that inserted a key does not count.
* Eviction (``select_victims``): small-queue slots accessed at least ``promote_threshold`` times move to the main
  queue's tail; then each victim comes from the small queue's head (oldest first) while that queue holds at
  least its target size, as in the paper, and otherwise from the main queue by CLOCK: the hand evicts slots whose
  frequency is 0 and gives the others a second chance (frequency - 1, moved to the tail). Keys evicted from the
  small queue enter the ghost.

Everything is batched: a CLOCK sweep that evicts ``num`` slots is computed in closed form. Sweeping in FIFO
order, a slot with frequency ``f`` is evicted in pass ``f``, so victims are the first ``num`` slots in
``(frequency, queue position)`` order; every survivor loses one frequency per full pass, plus one if the last
(partial) pass went over it, and those go to the tail. The ghost is a
:class:`~torchrec_ascend.policies.key_table.BoundedKeyScores` of insertion times.
"""

from __future__ import annotations

from typing import Dict, Optional

import torch

from torchrec_ascend.policies.key_table import BoundedKeyScores
from torchrec_ascend.policies.options import fraction, positive_int
from torchrec_ascend.policies.scored import ScoredEvictionPolicy, lowest, ones_like_slots, pack

MAX_FREQ = 3


class S3FIFO(ScoredEvictionPolicy):
    """S3-FIFO over a fixed pool of slots (module docstring).

    Args:
        capacity (int): number of slots.
        small_fraction (float): target share of the small (probation) queue, in ``(0, 1)``.
        ghost_fraction (float): ghost entries as a share of the capacity, in ``(0, 1]``.
        promote_threshold (int): accesses after insertion that move a small-queue slot to the main queue.

    Raises:
        ConfigError: an option is out of range.

    Example::

        policy = create_eviction_policy("s3fifo", capacity=100_000, small_fraction=0.1)
    """

    state_names = ("in_main", "position", "freq", "key", "clocks")

    def __init__(
        self, capacity: int, small_fraction: float = 0.1, ghost_fraction: float = 0.9, promote_threshold: int = 1
    ) -> None:
        super().__init__(capacity)
        small = fraction("s3fifo", "small_fraction", small_fraction)
        ghost = fraction("s3fifo", "ghost_fraction", ghost_fraction)
        self.promote_threshold = positive_int("s3fifo", "promote_threshold", promote_threshold)
        self.small_target = max(1, round(small * capacity))
        self.ghost_span = max(1, round(ghost * capacity))
        self.in_main = torch.zeros(capacity, dtype=torch.bool)
        self.position = torch.zeros(capacity, dtype=torch.int64)  # FIFO order within each queue
        self.freq = torch.zeros(capacity, dtype=torch.int64)
        self.key = torch.zeros(capacity, dtype=torch.int64)
        self.clocks = torch.tensor([0, 1], dtype=torch.int64)  # next queue position, ghost clock (from 1)
        self.ghost = BoundedKeyScores(self.ghost_span)

    def _positions(self, n: int) -> torch.Tensor:
        start = int(self.clocks[0])
        self.clocks[0] = start + n
        return torch.arange(start, start + n, dtype=torch.int64)

    def reset(self, slots: torch.Tensor, keys: torch.Tensor, step: int) -> None:
        seen = self.ghost.lookup(keys)
        remembered = (seen > 0) & (float(self.clocks[1]) - seen <= self.ghost_span)
        self.ghost.discard(keys)
        self.in_main[slots] = remembered
        self.position[slots] = self._positions(slots.numel())
        self.key[slots] = keys

    def on_insert(
        self,
        slots: torch.Tensor,
        keys: torch.Tensor,
        step: int,
        counts: Optional[torch.Tensor] = None,
        signals: Optional[Dict[str, torch.Tensor]] = None,
    ) -> None:
        self.resident[slots] = True
        self.reset(slots, keys, step)
        # repeats within the inserting batch count as accesses after insertion
        self.freq[slots] = (ones_like_slots(slots, counts) - 1).clamp(0, MAX_FREQ)

    def record(
        self, slots: torch.Tensor, counts: torch.Tensor, step: int, signals: Optional[Dict[str, torch.Tensor]]
    ) -> None:
        self.freq[slots] = (self.freq[slots] + counts).clamp(max=MAX_FREQ)

    def scores(self, step: int) -> torch.Tensor:
        """Probation slots first, then by frequency and queue position (a summary; eviction uses the queues)."""
        return pack(self.in_main.long() * (MAX_FREQ + 1) + self.freq, self.position - self.position.min())

    def on_remove(self, slots: torch.Tensor) -> None:
        probation = slots[~self.in_main[slots]]
        if probation.numel():
            keys = self.key[probation]
            self.ghost.discard(keys)  # re-entering keys restart at the ghost's head
            self.ghost.add(keys, torch.full((keys.numel(),), float(self.clocks[1]), dtype=torch.float64))
            self.clocks[1] += probation.numel()
        super().on_remove(slots)

    def _promote(self) -> None:
        ready = (self.resident & ~self.in_main & (self.freq >= self.promote_threshold)).nonzero().squeeze(1)
        if ready.numel():
            ready = ready[torch.argsort(self.position[ready])]
            self.in_main[ready] = True
            self.position[ready] = self._positions(ready.numel())

    def _clock(self, candidates: torch.Tensor, num: int) -> torch.Tensor:
        slots = candidates.nonzero().squeeze(1)
        slots = slots[torch.argsort(self.position[slots])]
        rank = torch.arange(slots.numel(), dtype=torch.int64)
        order_key = self.freq[slots] * slots.numel() + rank
        chosen = torch.topk(order_key, num, largest=False).indices
        last = int(order_key[chosen].max())
        full_passes, last_rank = divmod(last, slots.numel())
        survivor = torch.ones(slots.numel(), dtype=torch.bool)
        survivor[chosen] = False
        passed = survivor & (rank < last_rank)
        self.freq[slots[survivor]] -= full_passes
        self.freq[slots[passed]] -= 1
        self.position[slots[passed]] = self._positions(int(passed.sum()))
        return slots[chosen]

    def select_victims(self, num: int, evictable: torch.Tensor, step: int) -> torch.Tensor:
        if num <= 0:
            return torch.empty(0, dtype=torch.int64)
        self._promote()
        candidates = self.resident & evictable
        small = candidates & ~self.in_main
        main = candidates & self.in_main
        small_size = int((self.resident & ~self.in_main).sum())
        # one eviction at a time, S3-FIFO takes from the small queue while it holds >= its target
        num_small = min(num, max(0, small_size - self.small_target + 1), int(small.sum()))
        num_main = min(num - num_small, int(main.sum()))
        num_small = num - num_main  # the main queue is short: the small queue gives the rest
        victims = lowest(self.position, small, num_small)
        if num_main:
            victims = torch.cat([victims, self._clock(main, num_main)])
        return victims

    def state_dict(self) -> Dict[str, torch.Tensor]:
        ghost = {f"ghost.{k}": v for k, v in self.ghost.state_dict().items()}
        return {**super().state_dict(), **ghost}

    def load_state_dict(self, state: Dict[str, torch.Tensor]) -> None:
        super().load_state_dict(state)
        self.ghost.load_state_dict({k[len("ghost.") :]: v for k, v in state.items() if k.startswith("ghost.")})
