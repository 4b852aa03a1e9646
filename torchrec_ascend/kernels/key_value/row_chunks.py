"""RowChunks: host-memory rows addressed by slot, in one reserved mapping, so growing never moves or copies a row.

Growing one tensor by doubling would copy every row (seconds for a multi-GiB table, stalling training), hold old
and new copies at once (3x the old size at the peak, over any memory budget) and leave up to half of the capacity
unused. Here the rows live in address space reserved up front for ``max_rows`` rows (see
:func:`~torchrec_ascend.kernels.key_value.key_index.reserve`): memory is spent page by page as rows are written,
``grow`` only moves the addressable end, and a gather or scatter is one indexing op.
"""

from __future__ import annotations

import numpy as np
import torch

from torchrec_ascend.native.memory import reserve


class RowChunks:
    """Rows ``[capacity, width]`` of one dtype, addressable up to ``max_rows`` without ever moving.

    Args:
        width (int): elements per row.
        dtype (torch.dtype): element type.
        max_rows (int): the most rows it may ever address (address space, not memory).

    Example::

        rows = RowChunks(width=2, dtype=torch.float32, max_rows=1024)
        rows.grow(4)
        rows.grow(8)  # slots 4..7 become addressable; slots 0..3 stay where they are
        rows.scatter(torch.tensor([1, 6]), torch.ones(2, 2))
        rows.gather(torch.tensor([6]))  # tensor([[1., 1.]])
    """

    def __init__(self, width: int, dtype: torch.dtype, max_rows: int = 1 << 20) -> None:
        self.width = width
        self.dtype = dtype
        self.max_rows = max_rows
        self.capacity = 0
        row_bytes = width * torch.empty(0, dtype=dtype).element_size()
        self._all = torch.from_numpy(reserve(np.uint8, max_rows * row_bytes)).view(dtype).view(max_rows, width)

    @property
    def nbytes(self) -> int:
        """Bytes of the addressable rows (``capacity`` rows, used or not)."""
        return self.capacity * self.width * self._all.element_size()

    def grow(self, capacity: int) -> None:
        """Make slots ``[0, capacity)`` addressable; a no-op if they already are.

        Raises:
            ValueError: ``capacity`` exceeds ``max_rows``.
        """
        if capacity > self.max_rows:  # builtin: an internal invariant (the host store grows within its budget's rows)
            raise ValueError(f"RowChunks: {capacity} rows exceed max_rows={self.max_rows}")
        self.capacity = max(self.capacity, capacity)

    def gather(self, slots: torch.Tensor) -> torch.Tensor:
        """Copies of the rows at ``slots`` (int64 ``[n]``, each in ``[0, capacity)``), shape ``[n, width]``."""
        return self._all.index_select(0, slots)

    def scatter(self, slots: torch.Tensor, rows: torch.Tensor) -> None:
        """Write ``rows`` (``[n, width]``) to distinct ``slots`` (int64 ``[n]``)."""
        self._all.index_copy_(0, slots, rows)
