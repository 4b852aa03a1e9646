"""Row tiers: where a hash kernel's rows go when they leave its pool, and come from when IDs arrive.

A hash kernel keeps the rows of the IDs its slot tables hold in its pool (:class:`~torchrec_ascend.kernels.pool.Pool`,
the TBE) and hands every other row question to its :class:`RowTier`: what happens to the rows of IDs that arrive in
the pool and of IDs evicted from it, which IDs missing from the pool still have a row, and the rows (and counters)
held below the pool for checkpoints. FUSED and data_parallel kernels use :class:`PoolOnly` (no rows below the pool: an
evicted ID is dropped, an arriving one initialised); KEY_VALUE uses
:class:`~torchrec_ascend.kernels.key_value.tier.HostDiskTier` (a host store spilling to a disk store).

Example::

    tier = kernel.row_tier            # PoolOnly for a FUSED kernel
    tier.lower_tiers, list(tier.stored(0, BLOCK_ROWS))   # (False, [])
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Iterable, Iterator, Optional, Protocol, Tuple

import torch

from torchrec_ascend.errors import ConfigError
from torchrec_ascend.hash.slot_table import Assignment
from torchrec_ascend.kernels.pool import Pool

# Rows a checkpoint moves between the tiers below the pool and its files at a time (full and incremental saves
# alike), so a table whose rows do not fit in memory saves and loads a block at a time.
BLOCK_ROWS = 65536


class RowTier(Protocol):
    """What a hash kernel does with rows outside its pool; ``t`` is a table's index within the kernel.

    Attributes:
        lower_tiers: rows also live below the pool (checkpoints then carry records without a pool slot).
    """

    lower_tiers: bool

    def known(self, t: int) -> Optional[Callable[[torch.Tensor], torch.Tensor]]:
        """Which IDs missing from the pool have a row below it (a mask of the IDs given); None: no tier below."""

    def arrived(self, t: int, assignment: Assignment) -> None:
        """Fill the pool rows ``assignment.new_slots`` handed to ``assignment.new_ids`` (weights and state)."""

    def left(self, t: int, slots: torch.Tensor, ids: torch.Tensor) -> None:
        """Pool rows ``slots`` of ``ids`` are about to be freed by eviction."""

    def stored(self, t: int, block_rows: int) -> Iterator[Tuple[torch.Tensor, torch.Tensor]]:
        """Every ``(keys, packed rows)`` held below the pool, in blocks of at most ``block_rows`` rows."""

    def stored_keys(self, t: int, block_rows: int) -> Iterator[torch.Tensor]:
        """The keys of :meth:`stored`, in its order and blocks, without decoding the rows."""

    def read(self, t: int, keys: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """Packed rows of ``keys`` from below the pool, and which were found; moves nothing between tiers."""

    def checkpoint_state(self, t: int) -> Dict[str, Any]:
        """The tier's part of table ``t``'s checkpoint state (JSON values; merged into the shard's state)."""

    def fill(self, t: int, chunks: Iterable[Tuple[torch.Tensor, torch.Tensor]]) -> Optional[Callable[[], None]]:
        """If the tiers below the pool hold no row of table ``t``, fill them from ``chunks`` as :meth:`restore`
        would (they are left empty if that raises) and return what empties them again; else take nothing from
        ``chunks`` and return None (no tier below, or it holds rows)."""

    def restore(
        self, t: int, chunks: Optional[Iterable[Tuple[torch.Tensor, torch.Tensor]]], state: Dict[str, Any]
    ) -> None:
        """Make the tiers below the pool hold exactly the ``(keys, packed rows)`` of ``chunks`` (distinct keys,
        consumed once; None: what :meth:`fill` put there), and take the tier's part of the shard's checkpoint
        ``state`` back."""


class PoolOnly:
    """The row tier of FUSED and data_parallel hash kernels: every row lives in the pool.

    An arriving ID is new: its row gets the ID's initial values and zero optimizer state; an evicted ID is dropped
    (the arriving ones overwrite its row).

    Args:
        pool: the kernel's pool, where the rows live.
    """

    lower_tiers = False

    def __init__(self, pool: Pool) -> None:
        self._pool = pool

    def known(self, t: int) -> Optional[Callable[[torch.Tensor], torch.Tensor]]:
        return None

    def arrived(self, t: int, assignment: Assignment) -> None:
        self._pool.initialise(t, assignment)

    def left(self, t: int, slots: torch.Tensor, ids: torch.Tensor) -> None:
        return None

    def stored(self, t: int, block_rows: int) -> Iterator[Tuple[torch.Tensor, torch.Tensor]]:
        return iter(())

    def stored_keys(self, t: int, block_rows: int) -> Iterator[torch.Tensor]:
        return iter(())

    def read(self, t: int, keys: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        width = self._pool.row_width(t)
        return torch.zeros(keys.numel(), width), torch.zeros(keys.numel(), dtype=torch.bool)

    def checkpoint_state(self, t: int) -> Dict[str, Any]:
        return {}

    def fill(self, t: int, chunks: Iterable[Tuple[torch.Tensor, torch.Tensor]]) -> Optional[Callable[[], None]]:
        return None

    def restore(
        self, t: int, chunks: Optional[Iterable[Tuple[torch.Tensor, torch.Tensor]]], state: Dict[str, Any]
    ) -> None:
        rows = sum(keys.numel() for keys, _ in chunks or ())
        if rows:
            raise ConfigError(
                f"table {self._pool.names[t]!r}: {rows} rows to restore have no pool slot, but "
                "a FUSED table keeps every row in its pool; restore them with pool slots"
            )
