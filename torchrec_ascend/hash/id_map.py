"""IdMap: raw int64 IDs (0..2**63-1) -> dense slots ``[0, capacity)``, the core of every hash table.

The map is a native open-addressing table (linear probing over power-of-two buckets, keys and slots interleaved,
splitmix64 hashing, backward-shift deletion) whose whole state lives in three buffers, so ``state_dict()`` /
``load_state_dict()`` checkpoint it exactly:

* ``buckets``: int64 ``[num_buckets, 2]``, (key, slot) per bucket, key ``-1`` when empty;
* ``free_slots``: int64 ``[capacity]``, a stack of freed slots (only the first ``num_free`` entries count);
* ``counters``: int64 ``[2]``, ``(next_fresh, num_free)``.

Slot assignment is deterministic and independent of the bucket layout: the new IDs of one call take slots in order
of first occurrence, freed slots first (most recently freed first), then fresh slots in increasing order. So maps fed
the same calls (the column-wise shards of one table) stay identical. When no slot is left, an absent ID gets slot
``-1`` and is not inserted: the caller raises or evicts and retries.
"""

from __future__ import annotations

from typing import Tuple

import torch

from torchrec_ascend.errors import ConfigError
from torchrec_ascend.native import ops
from torchrec_ascend.native.memory import huge_page_full

__all__ = ["IdMap", "num_buckets_for"]

# Buckets per slot is kept in [4/3, 8/3): linear probes stay short (load factor <= 3/4 even when full).
MIN_BUCKETS = 16


def num_buckets_for(capacity: int) -> int:
    """Number of buckets of an :class:`IdMap` of ``capacity`` slots: the smallest power of two over capacity / 0.75.

    Args:
        capacity (int): number of slots, >= 1.

    Returns:
        int: a power of two, > capacity; the map holds ``16 * num_buckets + 8 * capacity`` bytes.

    Example::

        >>> num_buckets_for(1000)
        2048
    """
    needed = max(MIN_BUCKETS, -(-capacity * 4 // 3))
    return 1 << (needed - 1).bit_length()


class IdMap(torch.nn.Module):
    """Maps raw non-negative int64 IDs to slots in ``[0, capacity)`` (see the module docstring for the rules).

    All ID inputs are 1-D int64 CPU tensors. Every method is one native call (no per-ID Python).

    Args:
        capacity (int): number of slots, >= 1.

    Raises:
        ConfigError: ``capacity`` is not a positive int.

    Example::

        m = IdMap(capacity=4)
        slots, is_new = m.insert_or_lookup(torch.tensor([42, 7, 42]))  # [0, 1, 0], [True, True, False]
        m.remove(torch.tensor([42]))                                  # [0]; slot 0 is reused next
        ids, slots = m.export()                                        # [7], [1]
        clone = IdMap.from_export(ids, slots, capacity=8)
    """

    buckets: torch.Tensor
    free_slots: torch.Tensor
    counters: torch.Tensor

    def __init__(self, capacity: int) -> None:
        super().__init__()
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
            raise ConfigError(
                f"IdMap: capacity must be a positive int, got {capacity!r}; pass the table's number of rows."
            )
        self.capacity = capacity
        # Probed at random: huge pages spare most probes of a large table a TLB miss (native/memory.py).
        self.register_buffer("buckets", huge_page_full((num_buckets_for(capacity), 2), -1, torch.int64))
        self.register_buffer("free_slots", torch.zeros(capacity, dtype=torch.int64))
        self.register_buffer("counters", torch.zeros(2, dtype=torch.int64))

    def __len__(self) -> int:
        """Number of IDs currently held."""
        next_fresh, num_free = self.counters.tolist()
        return next_fresh - num_free

    def extra_repr(self) -> str:
        return f"capacity={self.capacity}, size={len(self)}, num_buckets={self.buckets.shape[0]}"

    def insert_or_lookup(self, ids: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """Slot of every ID, inserting the absent ones (one pass over ``ids``).

        Args:
            ids (Tensor): int64 ``[n]``, non-negative.

        Returns:
            Tuple[Tensor, Tensor]: ``slots`` int64 ``[n]`` (``-1`` where the map is full: that ID is NOT inserted) and
            ``is_new`` bool ``[n]`` (True at the first occurrence of each ID this call inserted).

        Raises:
            ValueError: an ID is negative (the message shows the first one and its position) or ``ids`` is not 1-D.
            TypeError: ``ids`` is not int64.

        Example::

            slots, is_new = IdMap(8).insert_or_lookup(torch.tensor([5, 6, 5]))  # [0, 1, 0], [True, True, False]
        """
        return ops.id_map_insert_or_lookup(self.buckets, self.free_slots, self.counters, ids)

    def insert_stamped(
        self, ids: torch.Tensor, last_used: torch.Tensor, step: int
    ) -> Tuple[torch.Tensor, torch.Tensor, int]:
        """:meth:`insert_or_lookup` that also writes ``step`` into ``last_used`` at every slot it maps (a slot
        table's training pass, one native call).

        Args:
            ids (Tensor): int64 ``[n]``, non-negative.
            last_used (Tensor): int64 ``[capacity]``, mutated.
            step (int): ``>= 0``.

        Returns:
            Tuple[Tensor, Tensor, int]: ``slots`` (``-1`` where the map is full: that ID is NOT inserted), the
            ascending positions of the IDs this call inserted (their first occurrences), and how many positions hold
            an ID the map held before the call.

        Example::

            last_used = torch.zeros(8, dtype=torch.int64)
            slots, new_positions, hits = IdMap(8).insert_stamped(torch.tensor([5, 6, 5]), last_used, step=1)
            # [0, 1, 0], [0, 1], 0; last_used[:2] == 1
        """
        slots, new_positions, hits = ops.id_map_insert_stamped(
            self.buckets, self.free_slots, self.counters, last_used, ids, step
        )
        return slots, new_positions, int(hits)

    def lookup(self, ids: torch.Tensor) -> torch.Tensor:
        """Slot of every ID, ``-1`` where absent; the map is not changed.

        Args:
            ids (Tensor): int64 ``[n]``, non-negative.

        Returns:
            Tensor: int64 ``[n]``.

        Raises:
            ValueError: an ID is negative or ``ids`` is not 1-D.
            TypeError: ``ids`` is not int64.

        Example::

            slots = m.lookup(torch.tensor([5, 99]))  # [0, -1]
        """
        return ops.id_map_lookup(self.buckets, ids)

    def remove(self, ids: torch.Tensor) -> torch.Tensor:
        """Removes IDs; their slots are handed out again before any fresh slot, most recently freed first.

        Args:
            ids (Tensor): int64 ``[n]``, non-negative.

        Returns:
            Tensor: int64 ``[n]``, the freed slot per ID, ``-1`` where absent (so also for later copies of an ID).

        Raises:
            ValueError: an ID is negative or ``ids`` is not 1-D.
            TypeError: ``ids`` is not int64.

        Example::

            freed = m.remove(torch.tensor([5, 99]))  # [0, -1]
        """
        return ops.id_map_remove(self.buckets, self.free_slots, self.counters, ids)

    def export(self) -> Tuple[torch.Tensor, torch.Tensor]:
        """Every ID held and its slot, sorted by slot (for checkpoints and resharding).

        Returns:
            Tuple[Tensor, Tensor]: ``ids`` and ``slots``, int64 ``[len(self)]``; ``slots`` strictly increasing.

        Example::

            ids, slots = m.export()
        """
        return ops.id_map_export(self.buckets, self.counters)

    @classmethod
    def from_export(cls, ids: torch.Tensor, slots: torch.Tensor, capacity: int) -> "IdMap":
        """A new map holding exactly ``ids[i] -> slots[i]`` (the inverse of :meth:`export`).

        The free-slot order is not part of an export: the unused slots below ``max(slots) + 1`` become free, lowest
        handed out first, and fresh slots continue from ``max(slots) + 1``. Maps rebuilt from the same export are
        identical.

        Args:
            ids (Tensor): int64 ``[n]``, distinct, non-negative.
            slots (Tensor): int64 ``[n]``, distinct, in ``[0, capacity)``.
            capacity (int): slots of the new map (may differ from the exporting map's).

        Returns:
            IdMap: the rebuilt map.

        Raises:
            ConfigError: ``capacity`` is not a positive int.
            ValueError: an ID is negative or repeated, a slot is repeated or outside ``[0, capacity)``, or the
                lengths differ.

        Example::

            bigger = IdMap.from_export(*m.export(), capacity=2 * m.capacity)
        """
        id_map = cls(capacity)
        ops.id_map_rebuild(id_map.buckets, id_map.free_slots, id_map.counters, ids, slots)
        return id_map
