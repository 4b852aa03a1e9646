"""A hash kernel's pool: each table's rows on the kernel's device, the TBE's weights and optimizer states.

The pool writes and reads rows for the other parts: initial rows for IDs new to the pool, the reserved default row
(what rejected and unknown IDs read), and rows packed with their optimizer state (``[n, row_width]``: weights, then
each state) for the row tiers and checkpoints. Every copy of rows and slots between the host and the pool's device
is made here, through :mod:`torchrec_ascend.kernels.transfers`; the batch's IDs and rows are the ID mapper's.

Example::

    pool = Pool(TBE(kernel), config.embedding_tables, specs, [t.default_slot for t in slot_tables])
    packed = pool.pack(0, torch.tensor([3, 5]))       # on the host
    pool.unpack(0, torch.tensor([3, 5]), packed)      # no change
"""

from __future__ import annotations

import math
from typing import Any, List, Sequence, Tuple

import torch

from torchrec_ascend.adapters.tbe import TBE
from torchrec_ascend.hash.configs import HashTableSpec
from torchrec_ascend.hash.slot_table import Assignment
from torchrec_ascend.kernels.transfers import to_device, to_host
from torchrec_ascend.native import ops

PACKED_ELEMENT_BYTES = 4  # packed rows are float32 whatever the table's dtype (FP16 rows travel exactly)
SLOT_BYTES = 8  # a slot (pool row index) on the device: int64


def swap_bytes(rows: int, row_width: int) -> int:
    """Device bytes a move of ``rows`` rows of ``row_width`` elements (:meth:`Pool.row_width`) holds at its peak: in
    :meth:`Pool.pack`, their slots, each part gathered from the weights and states (float32), and the parts'
    concatenation, all live before the device-to-host copy; :meth:`Pool.unpack` holds less (the slots and one packed
    copy). Freed when the move returns. The planner counts it per KEY_VALUE shard (``hooks/planner_storage.py``).

    Example::

        swap_bytes(16, 16)   # 16 x 8 + 2 x 16 x 16 x 4 = 2176: 16 rows of dim 8 with Adagrad's state
    """
    return rows * SLOT_BYTES + 2 * rows * row_width * PACKED_ELEMENT_BYTES


class Pool:
    """The rows of one kernel's tables on its device; ``t`` is a table's index within the kernel.

    Args:
        tbe: the kernel's TBE adapter (its weights and optimizer states are the pool).
        tables: the kernel's table configs (names, initialisation ranges).
        specs: per table, its hash options (initialisation seed, the not-admitted value).
        default_slots: per table, its reserved row.

    Attributes:
        names: per table, its name.
    """

    def __init__(self, tbe: TBE, tables: Sequence[Any], specs: List[HashTableSpec], default_slots: List[int]) -> None:
        self._tbe = tbe
        self._specs = specs
        self._default_slots = default_slots
        self._init_ranges = [(t.get_weight_init_min(), t.get_weight_init_max()) for t in tables]
        self.names: List[str] = [t.name for t in tables]

    def col0(self, t: int) -> int:
        """Table ``t``'s first column in this shard."""
        return self._tbe.col_offsets[t]

    def cols(self, t: int) -> int:
        """Table ``t``'s columns in this shard."""
        return self._tbe.local_cols[t]

    def state_shapes(self, t: int) -> Tuple[Tuple[int, ...], ...]:
        """Per optimizer state of table ``t``, its per-row shape: ``()`` row-wise, ``(cols,)`` element-wise."""
        return tuple(tuple(s.shape[1:]) for s in self._tbe.states(t))

    def row_width(self, t: int) -> int:
        """Elements of a packed row of table ``t``: its columns plus every optimizer state's per-row elements."""
        return self.cols(t) + sum(math.prod(shape) for shape in self.state_shapes(t))

    @property
    def optimizer_name(self) -> str:
        """fbgemm's name of the fused optimizer (e.g. ``"exact_adagrad"``)."""
        return self._tbe.optimizer_name

    def iteration(self) -> int:
        """The fused optimizer's step counter (fbgemm's ``iter``; Adam-style optimizers use it)."""
        return self._tbe.iteration()

    def set_iteration(self, value: int) -> None:
        """Set the fused optimizer's step counter (and fbgemm's CPU copy of it, which it syncs only from 0)."""
        self._tbe.set_iteration(value)

    def initial_rows(self, t: int, ids: torch.Tensor) -> torch.Tensor:
        """The deterministic initial values of ``ids`` (on the host) for this shard's columns of table ``t``."""
        low, high = self._init_ranges[t]
        col0, cols = self.col0(t), self.cols(t)
        return ops.hash_uniform_init(ids, self._specs[t].init_seed, col0 + cols, low, high)[:, col0:]

    def initialise(self, t: int, assignment: Assignment) -> None:
        """Give the rows handed to new IDs their initial values and zero optimizer state (two copies up)."""
        weights = self._tbe.weights(t)
        slots = to_device(assignment.new_slots, weights.device)
        with torch.no_grad():
            weights[slots] = to_device(self.initial_rows(t, assignment.new_ids).to(weights.dtype), weights.device)
            for state in self._tbe.states(t):
                state[slots] = 0

    def write_default_row(self, t: int) -> None:
        """Rewrite table ``t``'s reserved row (training may have moved it since the last batch); no copy."""
        slot = self._default_slots[t]
        with torch.no_grad():
            self._tbe.weights(t)[slot] = self._specs[t].not_admitted_value
            for state in self._tbe.states(t):
                state[slot] = 0

    def gather(self, t: int, slots: torch.Tensor) -> torch.Tensor:
        """The weights of pool rows ``slots`` (host) of table ``t``, on the host, in the pool's dtype."""
        weights = self._tbe.weights(t)
        return to_host(weights[to_device(slots, weights.device)])

    def pack(self, t: int, slots: torch.Tensor) -> torch.Tensor:
        """Pool rows ``slots`` of table ``t`` as float32 ``[n, row_width]`` on the host: weights, then each optimizer
        state (gathered on the pool's device, then one device-to-host copy)."""
        weights = self._tbe.weights(t)
        slots = to_device(slots, weights.device)
        parts = [weights[slots].float()]  # FP16 tables' rows travel as float32 (exactly)
        parts += [s[slots].view(slots.numel(), math.prod(s.shape[1:])).float() for s in self._tbe.states(t)]
        return to_host(torch.cat(parts, dim=1))

    def unpack(self, t: int, slots: torch.Tensor, rows: torch.Tensor) -> None:
        """Write packed ``rows`` (``[n, row_width]``, see :meth:`pack`) to pool rows ``slots`` of table ``t``."""
        cols = self.cols(t)
        weights = self._tbe.weights(t)
        slots, rows = to_device(slots, weights.device), to_device(rows, weights.device)
        with torch.no_grad():
            weights[slots] = rows[:, :cols].to(weights.dtype)
            start = cols
            for state in self._tbe.states(t):
                width = math.prod(state.shape[1:])
                state[slots] = rows[:, start:start + width].reshape((-1,) + tuple(state.shape[1:])).to(state.dtype)
                start += width
