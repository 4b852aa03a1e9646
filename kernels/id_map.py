"""IdMap: raw int64 IDs -> dense slots ``[0, capacity)`` (PLACEHOLDER: being replaced by the native op)."""

from __future__ import annotations

from typing import Tuple

import torch


class IdMap(torch.nn.Module):
    """Maps raw non-negative int64 IDs to slots in ``[0, capacity)``.

    New slots are assigned deterministically: for the new IDs of one call, in order of first occurrence, taking
    freed slots first (most recently freed first), then fresh slots in increasing order.
    """

    def __init__(self, capacity: int) -> None:
        super().__init__()
        self.capacity = capacity
        self._map: dict = {}
        self._free: list = []
        self._next = 0

    def __len__(self) -> int:
        return len(self._map)

    def insert_or_lookup(self, ids: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """Return ``(slots, is_new)`` per ID; slot ``-1`` (and not inserted) where the table is full."""
        out = torch.empty_like(ids)
        new = torch.zeros(ids.shape, dtype=torch.bool)
        for i, k in enumerate(ids.tolist()):
            s = self._map.get(k)
            if s is None:
                if self._free:
                    s = self._free.pop()
                elif self._next < self.capacity:
                    s = self._next
                    self._next += 1
                else:
                    out[i] = -1
                    continue
                self._map[k] = s
                new[i] = True
            out[i] = s
        return out, new

    def lookup(self, ids: torch.Tensor) -> torch.Tensor:
        return torch.tensor([self._map.get(k, -1) for k in ids.tolist()], dtype=torch.int64)

    def remove(self, ids: torch.Tensor) -> torch.Tensor:
        out = []
        for k in ids.tolist():
            s = self._map.pop(k, -1)
            if s >= 0:
                self._free.append(s)
            out.append(s)
        return torch.tensor(out, dtype=torch.int64)

    def export(self) -> Tuple[torch.Tensor, torch.Tensor]:
        items = sorted(self._map.items(), key=lambda kv: kv[1])
        return (
            torch.tensor([k for k, _ in items], dtype=torch.int64),
            torch.tensor([s for _, s in items], dtype=torch.int64),
        )
