"""KeyIndex: a growable map from raw int64 keys to slots, for the KEY_VALUE host and disk stores.

:class:`~torchrec_ascend.kernels.id_map.IdMap` has a fixed capacity; the stores grow on demand. KeyIndex grows by
amortised doubling: it rebuilds a map of twice the capacity with ``IdMap.from_export(*map.export(), capacity)``,
which keeps every key's slot. So slots are stable while their key is present, and whatever a store keeps per slot
(rows, file locations) never moves when the index grows: it only has to cover the new capacity.

Why not one IdMap per fixed-size chunk (the other way to grow)? Every lookup would then query every chunk; here a
lookup is one native call, and the rebuild (rare, O(n) over a few dozen bytes per key) is the whole cost of growth.
KeyIndex also keeps each slot's key, so a store can name the rows it chooses to spill or compact.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch

from torchrec_ascend.errors import CapacityError
from torchrec_ascend.kernels.id_map import IdMap

from .row_store import tensor_nbytes

KEY_BYTES_PER_SLOT = 8  # the slot -> key column


def idmap_nbytes(id_map: IdMap) -> int:
    """Bytes of the tensors (buffers and parameters) an :class:`IdMap` holds.

    Example::

        idmap_nbytes(IdMap(1024))
    """
    return tensor_nbytes(*id_map.buffers(), *id_map.parameters())


def idmap_nbytes_for(capacity: int) -> int:
    """Bytes an :class:`IdMap` of ``capacity`` slots will hold, measured on the meta device (nothing allocated).

    Example::

        idmap_nbytes_for(1 << 20)
    """
    if capacity == 0:
        return 0
    with torch.device("meta"):
        return idmap_nbytes(IdMap(capacity))


class KeyIndex:
    """Raw int64 key -> slot in ``[0, capacity)``, growing by doubling up to ``max_capacity``.

    Args:
        initial_capacity (int): slots before the first growth (clipped to ``max_capacity``).
        max_capacity (Optional[int]): the most slots it may ever hold; ``None`` for no limit.

    Attributes:
        capacity (int): current number of slots; per-slot storage of the owner must cover ``[0, capacity)``.

    Example::

        index = KeyIndex(initial_capacity=2)
        slots = index.insert(torch.tensor([10, 20, 30]))  # grows to 4 slots; slots tensor([0, 1, 2])
        index.lookup(torch.tensor([20, 99]))  # tensor([1, -1])
        index.remove(torch.tensor([10]))  # tensor([0]); slot 0 is reused by the next insert
    """

    def __init__(self, initial_capacity: int = 1024, max_capacity: Optional[int] = None) -> None:
        if initial_capacity < 0 or (max_capacity is not None and max_capacity < 0):
            raise ValueError(f"KeyIndex capacities must be >= 0, got {initial_capacity} and {max_capacity}")
        self.max_capacity = max_capacity
        self.capacity = initial_capacity if max_capacity is None else min(initial_capacity, max_capacity)
        self._map: Optional[IdMap] = IdMap(self.capacity) if self.capacity else None  # IdMap needs >= 1 slot
        self._key = torch.empty(self.capacity, dtype=torch.int64)

    def __len__(self) -> int:
        return len(self._map) if self._map is not None else 0

    @property
    def nbytes(self) -> int:
        """Bytes of this index's tensors: the IdMap's and the slot -> key column."""
        return tensor_nbytes(self._key) + (idmap_nbytes(self._map) if self._map is not None else 0)

    @staticmethod
    def nbytes_for(capacity: int) -> int:
        """What :attr:`nbytes` is at ``capacity`` slots: the stores' budget arithmetic."""
        return KEY_BYTES_PER_SLOT * capacity + idmap_nbytes_for(capacity)

    def reserve(self, num_keys: int) -> None:
        """Grow (doubling) so that ``num_keys`` keys fit.

        Raises:
            CapacityError: ``num_keys`` exceeds ``max_capacity``; the owner must make room first.
        """
        if num_keys <= self.capacity:
            return
        if self.max_capacity is not None and num_keys > self.max_capacity:
            raise CapacityError(
                f"KeyIndex: {num_keys} keys exceed max_capacity={self.max_capacity}; the store must spill or evict "
                f"before inserting"
            )
        capacity = max(self.capacity, 1)
        while capacity < num_keys:
            capacity *= 2
        if self.max_capacity is not None:
            capacity = min(capacity, self.max_capacity)
        if self._map is None:
            self._map = IdMap(capacity)
        else:
            self._map = IdMap.from_export(*self._map.export(), capacity=capacity)
        self._key = torch.cat([self._key, torch.empty(capacity - self.capacity, dtype=torch.int64)])
        self.capacity = capacity

    def lookup(self, keys: torch.Tensor) -> torch.Tensor:
        """Slot of each key (int64 ``[n]``, repeats allowed), ``-1`` where absent."""
        if self._map is None:
            return torch.full_like(keys, -1)
        return self._map.lookup(keys)

    def insert(self, keys: torch.Tensor) -> torch.Tensor:
        """Give each key a slot (freed slots are reused first), growing first if needed.

        Args:
            keys: 1-D int64 tensor ``[n]`` of distinct keys that are not present.

        Returns:
            torch.Tensor: int64 ``[n]``, the new slots.

        Raises:
            CapacityError: the keys do not fit under ``max_capacity``.
            ValueError: a key is already present or repeats (a caller bug: they were inserted all the same).
        """
        if keys.numel() == 0:
            return torch.empty(0, dtype=torch.int64)
        self.reserve(len(self) + keys.numel())
        slots, is_new = self._map.insert_or_lookup(keys)
        if not bool(is_new.all()):
            raise ValueError("KeyIndex.insert: keys must be distinct and absent; look them up first")
        self._key[slots] = keys
        return slots

    def remove(self, keys: torch.Tensor) -> torch.Tensor:
        """Forget keys; absent keys and repeats are ignored.

        Args:
            keys: 1-D int64 tensor ``[n]``.

        Returns:
            torch.Tensor: int64 ``[m]``, the slots freed (one per distinct present key).
        """
        if self._map is None or keys.numel() == 0:
            return torch.empty(0, dtype=torch.int64)
        freed = self._map.remove(keys)
        return freed[freed >= 0]

    def keys_of(self, slots: torch.Tensor) -> torch.Tensor:
        """The key held by each of ``slots`` (int64 ``[n]``, slots in use)."""
        return self._key[slots]

    def export(self) -> Tuple[torch.Tensor, torch.Tensor]:
        """All ``(keys, slots)``, two int64 tensors ``[len(self)]``, sorted by slot."""
        if self._map is None:
            empty = torch.empty(0, dtype=torch.int64)
            return empty, empty
        return self._map.export()
