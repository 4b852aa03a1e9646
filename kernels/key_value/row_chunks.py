"""RowChunks: host-memory rows addressed by slot, grown by appending chunks so existing rows never move.

Growing one big tensor by doubling would copy every row (seconds for a multi-GiB table, stalling training) and
hold old and new copies at once (3x the old size at the peak, over any memory budget). Chunks of geometrically
growing size keep the chunk count logarithmic, so a gather or scatter loops over a few chunks, never over IDs.
"""

from __future__ import annotations

from typing import List

import torch

from .row_store import tensor_nbytes


class RowChunks:
    """Rows ``[capacity, width]`` stored as a list of chunks; slot ``s`` is row ``s - start`` of its chunk.

    Args:
        width (int): elements per row.
        dtype (torch.dtype): element type.

    Example::

        rows = RowChunks(width=2, dtype=torch.float32)
        rows.grow(4)
        rows.grow(8)  # a second chunk for slots 4..7; slots 0..3 stay where they are
        rows.scatter(torch.tensor([1, 6]), torch.ones(2, 2))
        rows.gather(torch.tensor([6]))  # tensor([[1., 1.]])
    """

    def __init__(self, width: int, dtype: torch.dtype) -> None:
        self.width = width
        self.dtype = dtype
        self.capacity = 0
        self._chunks: List[torch.Tensor] = []
        self._starts = torch.empty(0, dtype=torch.int64)

    @property
    def nbytes(self) -> int:
        """Bytes of all chunks (allocated capacity, used or not)."""
        return tensor_nbytes(*self._chunks)

    def grow(self, capacity: int) -> None:
        """Make slots ``[0, capacity)`` addressable; a no-op if they already are."""
        if capacity <= self.capacity:
            return
        self._chunks.append(torch.empty(capacity - self.capacity, self.width, dtype=self.dtype))
        self._starts = torch.cat([self._starts, torch.tensor([self.capacity])])
        self.capacity = capacity

    def _chunk_of(self, slots: torch.Tensor) -> torch.Tensor:
        return torch.searchsorted(self._starts, slots, right=True) - 1

    def gather(self, slots: torch.Tensor) -> torch.Tensor:
        """Copies of the rows at ``slots`` (int64 ``[n]``, each in ``[0, capacity)``), shape ``[n, width]``."""
        if len(self._chunks) == 1:
            return self._chunks[0].index_select(0, slots)
        out = torch.empty(slots.numel(), self.width, dtype=self.dtype)
        chunk_of = self._chunk_of(slots)
        for index, (start, chunk) in enumerate(zip(self._starts.tolist(), self._chunks)):
            where = (chunk_of == index).nonzero().squeeze(1)
            if where.numel():
                out.index_copy_(0, where, chunk.index_select(0, slots[where] - start))
        return out

    def scatter(self, slots: torch.Tensor, rows: torch.Tensor) -> None:
        """Write ``rows`` (``[n, width]``) to distinct ``slots`` (int64 ``[n]``)."""
        if len(self._chunks) == 1:
            self._chunks[0].index_copy_(0, slots, rows)
            return
        chunk_of = self._chunk_of(slots)
        for index, (start, chunk) in enumerate(zip(self._starts.tolist(), self._chunks)):
            where = (chunk_of == index).nonzero().squeeze(1)
            if where.numel():
                chunk.index_copy_(0, slots[where] - start, rows.index_select(0, where))
