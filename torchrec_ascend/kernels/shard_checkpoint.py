"""A hash kernel's table shards as checkpoints carry them: what each shard is, its records out and back in.

A shard leaves as blocks of :class:`ShardRows` (:meth:`ShardCheckpoint.export_shard`) plus its state
(:meth:`ShardCheckpoint.shard_state`) and comes back through :meth:`ShardCheckpoint.restore_shard`; the pool's rows
are packed by the :class:`~torchrec_ascend.kernels.pool.Pool`, the rows below the pool are the row tier's
(FUSED: none; KEY_VALUE: the host and disk stores). Called between batches (by ``torchrec_ascend.checkpoint``),
never per batch.

Example::

    blocks, removed = kernel.checkpoint.export_shard(0, changed_only=True)
    kernel.checkpoint.shard_info(0).lower_tiers   # False for FUSED
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple

import torch

from torchrec_ascend.hash.configs import HashTableSpec
from torchrec_ascend.hash.slot_table import SlotTable
from torchrec_ascend.kernels import row_tier
from torchrec_ascend.kernels.pool import Pool
from torchrec_ascend.kernels.row_tier import RowTier

_EMPTY = torch.empty(0, dtype=torch.int64)


@dataclasses.dataclass
class ShardRows:
    """A block of one table shard's records, as checkpoints carry them.

    Attributes:
        ids: int64 ``[n]``, the keys the slot table holds: raw IDs (hash tables) or row indices within the shard
            (plain KEY_VALUE tables).
        slots: int64 ``[n]``, each ID's pool row, ``-1`` for rows held in a lower tier (KEY_VALUE host or disk).
        last_used: int64 ``[n]``, the step each pooled ID was last used at (0 for lower-tier rows).
        rows: ``[n, cols + optimizer state width]``, weights then optimizer states (:meth:`Pool.pack`).
    """

    ids: torch.Tensor
    slots: torch.Tensor
    last_used: torch.Tensor
    rows: torch.Tensor


@dataclasses.dataclass(frozen=True)
class ShardInfo:
    """What a checkpoint records about one table shard of a kernel.

    Attributes:
        name: the table's name.
        table: TorchRec's sharded table config (``local_metadata`` / ``global_metadata`` give the shard's place).
        hash_ids: keys are raw IDs (hash tables), not row indices (plain KEY_VALUE tables).
        spec: the table's hash options (policies).
        capacity: IDs the shard's pool holds.
        col0: the shard's first column; ``cols``: its number of columns.
        state_shapes: per optimizer state, its per-row shape: ``()`` row-wise, ``(cols,)`` element-wise.
        optimizer: fbgemm's name of the fused optimizer (e.g. ``"exact_adagrad"``).
        eviction: the pool has an eviction policy; ``admission``: the table has an admission policy.
        lower_tiers: rows also live below the pool (KEY_VALUE host and disk).
    """

    name: str
    table: Any
    hash_ids: bool
    spec: HashTableSpec
    capacity: int
    col0: int
    cols: int
    state_shapes: Tuple[Tuple[int, ...], ...]
    optimizer: str
    eviction: bool
    admission: bool
    lower_tiers: bool


class ShardCheckpoint:
    """Checkpoint records of one kernel's table shards; ``t`` is a table's index within the kernel.

    Args:
        slot_tables: the kernel's slot tables (which IDs the pool holds, where, and their checkpoint marks).
        pool: the kernel's pool.
        tier: the kernel's row tier (the rows below the pool).
        tables: per table, TorchRec's sharded config of the shard (the shard's own rows, not a cache's).
        hash_ids: per table, its keys are raw IDs (hash tables), not rows of the shard.
    """

    def __init__(
        self, slot_tables: Sequence[SlotTable], pool: Pool, tier: RowTier, tables: Sequence[Any], hash_ids: List[bool]
    ) -> None:
        self._slot_tables = slot_tables
        self._pool = pool
        self._tier = tier
        self._tables = tables
        self._hash_ids = hash_ids

    def shard_info(self, t: int) -> ShardInfo:
        """Where table ``t``'s shard sits and what its rows hold (see :class:`ShardInfo`).

        Example::

            info = checkpoint.shard_info(0)
            info.name, info.col0, info.cols, info.state_shapes   # ('user', 0, 16, ((16,),)) with Adagrad
        """
        table = self._slot_tables[t]
        return ShardInfo(
            name=self._pool.names[t],
            table=self._tables[t],
            hash_ids=self._hash_ids[t],
            spec=table.spec,
            capacity=table.capacity,
            col0=self._pool.col0(t),
            cols=self._pool.cols(t),
            state_shapes=self._pool.state_shapes(t),
            optimizer=self._pool.optimizer_name,
            eviction=table.eviction is not None,
            admission=table.admission is not None,
            lower_tiers=self._tier.lower_tiers,
        )

    def export_rows(self, t: int) -> Tuple[torch.Tensor, torch.Tensor, int]:
        """Every ID of table ``t``'s shard in any tier, its row (this shard's columns, on the host) and the shard's
        first column."""
        ids, slots = self._slot_tables[t].id_map.export()
        cols = self._pool.cols(t)
        below = self._tier.stored(t, row_tier.BLOCK_ROWS)
        parts = [(ids, self._pool.gather(t, slots))] + [(k, r[:, :cols]) for k, r in below]
        return torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts]), self._pool.col0(t)

    def export_shard(
        self, t: int, changed_only: bool = False
    ) -> Tuple[Iterator[ShardRows], Callable[[], torch.Tensor]]:
        """The records of table ``t``'s shard, in blocks, and what gives the IDs to drop.

        Args:
            t: the table's index within the kernel.
            changed_only: only what changed since the slot table's checkpoint mark (an incremental save).

        Returns:
            Tuple[Iterator[ShardRows], Callable[[], Tensor]]: blocks covering every ID in every tier (or every
            changed one); the rows below the pool are read a block at a time (at most ``row_tier.BLOCK_ROWS``), so
            neither a shard nor an increment is ever held whole. Then, called once the blocks are consumed, the IDs
            that left the shard since the mark (empty for a full export): which of the IDs that left the pool are
            gone is known only once the lower tiers were read.

        Raises:
            RuntimeError: ``changed_only`` without a checkpoint mark (the Saver checks the mark first), or the IDs
                to drop asked for before the blocks were consumed.
            StorageError: a lower-tier row cannot be read back intact.

        Example::

            blocks, removed = checkpoint.export_shard(0, changed_only=True)
            changed = sum(block.ids.numel() for block in blocks)
            gone = removed()
        """
        table = self._slot_tables[t]
        if changed_only:
            slots, left = table.changes_since_mark()
            ids, last_used = table.slot_ids[slots], table.last_used[slots]
        else:
            ids, slots, last_used = table.held()
        pool = ShardRows(ids, slots, last_used, self._pool.pack(t, slots))
        if not changed_only:
            lower = (_lower_tier_rows(keys, rows) for keys, rows in self._tier.stored(t, row_tier.BLOCK_ROWS))
            return itertools.chain([pool], lower), lambda: _EMPTY
        gone: List[torch.Tensor] = []

        def changed_below() -> Iterator[ShardRows]:
            for keys in left.split(row_tier.BLOCK_ROWS):
                rows, found = self._tier.read(t, keys)
                gone.append(keys[~found])
                yield _lower_tier_rows(keys[found], rows[found])

        def removed() -> torch.Tensor:
            if len(gone) < -(-left.numel() // row_tier.BLOCK_ROWS):
                raise RuntimeError(f"table {self._pool.names[t]!r}: the IDs an increment drops are known once its "
                                   "blocks were read; consume the blocks first")
            return torch.cat([_EMPTY, *gone])

        return itertools.chain([pool], changed_below()), removed

    def held_keys(self, t: int) -> Iterator[torch.Tensor]:
        """Every key table ``t``'s shard holds, in blocks: the pool's, then each lower tier's (the keys of a disk
        tier are in its records: they are read a block at a time, their rows never decoded)."""
        yield self._slot_tables[t].id_map.export()[0]
        yield from self._tier.stored_keys(t, row_tier.BLOCK_ROWS)

    def held_records(self, t: int, block_rows: int) -> Iterator[Tuple[torch.Tensor, torch.Tensor]]:
        """Every key table ``t``'s shard holds with its packed record (:meth:`read_records`' layout), in
        :meth:`held_keys`' order, at most ``block_rows`` at a time: the lower tiers read sequentially, as a full
        :meth:`export_shard` reads them."""
        keys, slots = self._slot_tables[t].id_map.export()
        for start in range(0, keys.numel(), block_rows):
            yield keys[start:start + block_rows], self._pool.pack(t, slots[start:start + block_rows])
        yield from self._tier.stored(t, block_rows)

    def read_records(self, t: int, keys: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """The current packed record (:meth:`Pool.pack` layout) of each of ``keys`` from whichever tier holds it;
        nothing moves between tiers and no counter changes.

        Returns:
            Tuple[Tensor, Tensor]: float32 ``[n, row_width]`` on the host (zeros where absent), and bool ``[n]``,
            which keys the shard holds.

        Example::

            rows, found = checkpoint.read_records(0, torch.tensor([7, 42]))
        """
        slots = self._slot_tables[t].id_map.lookup(keys)
        cached = slots >= 0
        rows = torch.zeros(keys.numel(), self._pool.row_width(t))
        rows[cached] = self._pool.pack(t, slots[cached])
        below = (~cached).nonzero().squeeze(1)
        stored, found_below = self._tier.read(t, keys[below])
        rows[below] = stored
        found = cached.clone()
        found[below] = found_below
        return rows, found

    def shard_state(self, t: int) -> Dict[str, Any]:
        """:meth:`SlotTable.checkpoint_state` of table ``t``, ``iteration`` (the fused optimizer's step count) and
        the row tier's counters (KEY_VALUE: ``swaps``).

        Example::

            state = checkpoint.shard_state(0)   # {"step": 12, "counters": {...}, "iteration": 12, ...}
        """
        return {
            **self._slot_tables[t].checkpoint_state(),
            "iteration": self._pool.iteration(),
            **self._tier.checkpoint_state(t),
        }

    def fill_lower(self, t: int, lower: Iterable[Tuple[torch.Tensor, torch.Tensor]]) -> Optional[Callable[[], None]]:
        """Fill table ``t``'s lower tiers with ``lower`` (as :meth:`restore_shard` takes it) ahead of
        :meth:`restore_shard`, if they hold no row: a load stores the rows as it checks them, reading them once.

        Returns:
            What empties the lower tiers again (a load that fails later calls it); None if nothing was taken from
            ``lower`` (a FUSED kernel, or the tiers hold rows: restore them with :meth:`restore_shard`).

        Raises:
            StorageError: a lower tier cannot take the rows, or as ``lower`` raises; the tiers are left empty.

        Example::

            undo = checkpoint.fill_lower(0, chunks)
            checkpoint.restore_shard(0, pooled, None if undo else chunks, state)
        """
        return self._tier.fill(t, lower)

    def restore_shard(
        self, t: int, pooled: ShardRows, lower: Optional[Iterable[Tuple[torch.Tensor, torch.Tensor]]],
        state: Dict[str, Any],
    ) -> None:
        """Make table ``t``'s shard hold exactly ``pooled`` at their slots and ``lower`` in the lower tiers.

        Args:
            t: the table's index within the kernel.
            pooled: the records with a pool slot.
            lower: ``(keys, packed rows)`` of the other records, distinct keys, in chunks (consumed once, so they
                may be read from files as they go); None: the lower tiers hold them already (:meth:`fill_lower`).
            state: as :meth:`shard_state` gives it (:meth:`SlotTable.restore` takes its part).

        Raises:
            CapacityError: more pooled IDs than the pool holds.
            ConfigError: rows without a pool slot for a kernel without lower tiers, or a policy state that does
                not fit.
            StorageError: a lower tier cannot take the rows.

        Example::

            pooled = ShardRows(ids, torch.arange(len(ids)), last_used, packed_rows)
            checkpoint.restore_shard(0, pooled, [], {"step": 12})
        """
        self._slot_tables[t].restore(pooled.ids, pooled.slots, pooled.last_used, state)
        self._pool.unpack(t, pooled.slots, pooled.rows)
        self._tier.restore(t, lower, state)


def _lower_tier_rows(keys: torch.Tensor, rows: torch.Tensor) -> ShardRows:
    """Records of rows held below the pool: no slot, no last use."""
    return ShardRows(keys, torch.full_like(keys, -1), torch.zeros_like(keys), rows)
