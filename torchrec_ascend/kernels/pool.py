"""A hash kernel's pool: each table's rows on the kernel's device, the TBE's weights and optimizer states.

The pool writes and reads rows for the other parts: initial rows for IDs new to the pool, the reserved default row
(what rejected and unknown IDs read), and rows packed with their optimizer state (float32 ``[n, row_width]``:
weights, then each state) for checkpoints, stored by the row tiers in their :class:`RowCodec`'s encoding (16-bit
weights stay 16-bit). Every copy of rows and slots between the host and the pool's device is made here, through
:mod:`torchrec_ascend.kernels.transfers`; the batch's IDs and rows are the ID mapper's.

Example::

    pool = Pool(TBE(kernel), config.embedding_tables, specs, [t.default_slot for t in slot_tables])
    packed = pool.pack(0, torch.tensor([3, 5]))       # on the host
    pool.unpack(0, torch.tensor([3, 5]), packed)      # no change
    stored = pool.pack_stored(0, torch.tensor([3]))   # what a row tier keeps: pool.codec(0).decode(stored) is packed
"""

from __future__ import annotations

import math
from typing import Any, Dict, List, Sequence, Tuple

import torch

from torchrec_ascend.adapters.tbe import TBE
from torchrec_ascend.hash.configs import HashTableSpec
from torchrec_ascend.hash.slot_table import Assignment
from torchrec_ascend.kernels.transfers import to_device, to_host
from torchrec_ascend.native import ops

PACKED_ELEMENT_BYTES = 4  # packed rows are float32 whatever the table's dtype (16-bit rows travel exactly)
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


class RowCodec:
    """How a row tier stores a table's packed rows (float32 ``[n, cols + state elements]``): as they are for FP32
    weights; for 16-bit weights (FP16, BF16), as int16 ``[n, cols + 2 * state elements]`` holding the weights' own
    bits, then each FP32 state's bits, so a row costs its weight precision's bytes on every tier (the Saver's files
    and the stock state_dict keep float32 records).

    Args:
        cols: the row's weight columns.
        state_elements: the row's optimizer state elements (FP32).
        weight_dtype: the weights' dtype.

    Example::

        codec = RowCodec(cols=4, state_elements=1, weight_dtype=torch.bfloat16)
        codec.width, codec.dtype                 # 6, torch.int16
        codec.decode(codec.encode(packed))       # packed, when its weights are BF16 values
    """

    def __init__(self, cols: int, state_elements: int, weight_dtype: torch.dtype) -> None:
        self.cols = cols
        self.weight_dtype = weight_dtype
        self.compact = weight_dtype.itemsize == 2
        self.dtype = torch.int16 if self.compact else torch.float32
        self.width = cols + (2 if self.compact else 1) * state_elements

    def encode(self, packed: torch.Tensor) -> torch.Tensor:
        """Packed rows (float32) in the stored encoding."""
        if not self.compact:
            return packed
        weights = packed[:, :self.cols].to(self.weight_dtype).view(torch.int16)
        return torch.cat([weights, packed[:, self.cols:].contiguous().view(torch.int16)], dim=1)

    def decode(self, stored: torch.Tensor) -> torch.Tensor:
        """Stored rows as packed rows (float32)."""
        if not self.compact:
            return stored
        weights = stored[:, :self.cols].contiguous().view(self.weight_dtype).float()
        states = torch.empty(stored.shape[0], (self.width - self.cols) // 2, device=stored.device)
        states.view(torch.int16).copy_(stored[:, self.cols:])  # the bits, whatever the slice's offset and strides
        return torch.cat([weights, states], dim=1)


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
        self._codecs: Dict[int, RowCodec] = {}  # built on first use: every swap asks for one

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

    def codec(self, t: int) -> RowCodec:
        """How the row tiers store table ``t``'s packed rows."""
        if t not in self._codecs:
            self._codecs[t] = RowCodec(self.cols(t), self.row_width(t) - self.cols(t), self._tbe.weights(t).dtype)
        return self._codecs[t]

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
            # index_copy_ / index_select / index_fill_: a tensor index (weights[slots]) costs 1.2-4x as much here
            weights.index_copy_(0, slots, to_device(self.initial_rows(t, assignment.new_ids).to(weights.dtype),
                                                    weights.device))
            for state in self._tbe.states(t):
                state.index_fill_(0, slots, 0)

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
        parts = [weights.index_select(0, slots).float()]  # FP16 tables' rows travel as float32 (exactly)
        parts += [s.index_select(0, slots).view(slots.numel(), math.prod(s.shape[1:])).float()
                  for s in self._tbe.states(t)]
        return to_host(torch.cat(parts, dim=1))

    def pack_stored(self, t: int, slots: torch.Tensor) -> torch.Tensor:
        """Pool rows ``slots`` of table ``t`` on the host in :meth:`codec`'s encoding (encoded on the pool's device,
        then one device-to-host copy of the encoded bytes)."""
        codec = self.codec(t)
        if not codec.compact:
            return self.pack(t, slots)
        weights = self._tbe.weights(t)
        slots = to_device(slots, weights.device)
        parts = [weights.index_select(0, slots).view(torch.int16)]
        parts += [s.index_select(0, slots).view(slots.numel(), -1).float().contiguous().view(torch.int16)
                  for s in self._tbe.states(t)]
        return to_host(torch.cat(parts, dim=1))

    def unpack_stored(self, t: int, slots: torch.Tensor, stored: torch.Tensor) -> None:
        """Write rows ``stored`` in :meth:`codec`'s encoding (see :meth:`pack_stored`) to pool rows ``slots`` of table
        ``t`` (one host-to-device copy of the encoded bytes, decoded on the pool's device)."""
        device = self._tbe.weights(t).device
        self.unpack(t, slots, self.codec(t).decode(to_device(stored, device)))

    def unpack(self, t: int, slots: torch.Tensor, rows: torch.Tensor) -> None:
        """Write packed ``rows`` (``[n, row_width]``, see :meth:`pack`) to pool rows ``slots`` of table ``t``."""
        cols = self.cols(t)
        weights = self._tbe.weights(t)
        slots, rows = to_device(slots, weights.device), to_device(rows, weights.device)
        with torch.no_grad():
            weights.index_copy_(0, slots, rows[:, :cols].to(weights.dtype))
            start = cols
            for state in self._tbe.states(t):
                width = math.prod(state.shape[1:])
                state.index_copy_(0, slots, rows[:, start:start + width].reshape((-1,) + tuple(state.shape[1:]))
                                  .to(state.dtype))
                start += width
