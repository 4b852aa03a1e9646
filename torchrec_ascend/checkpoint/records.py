"""A table shard's checkpoint records (:class:`ShardRows`): joining blocks, the records a load restores, resharding.

Records are whole batches of IDs; every operation here is a handful of tensor ops (no per-ID Python).

* :class:`ShardRecords`: what a load restores into one shard: the records with a pool slot, held, and the others
  (a KEY_VALUE shard's host and disk rows, possibly more than the host's memory) as chunks read on demand.
* :func:`assemble`: the records of a shard of any layout from saved shards of another: the IDs it owns, its
  columns cut from (or joined across) the saved column shards, optimizer states carried along: element-wise
  states are cut like the weights; row-wise states (one value per row, e.g. row-wise Adagrad) of several saved
  column shards are averaged, weighted by columns, which is exact when the new shard joins whole saved shards.

Example::

    mine = assemble(target_layout, [(saved_layout, saved_records), ...])
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Callable, Dict, Iterator, List, Sequence, Tuple, cast

import torch

from torchrec_ascend.checkpoint.layout import ShardLayout
from torchrec_ascend.errors import StorageError
from torchrec_ascend.kernels.fused import ShardRows

logger = logging.getLogger(__name__)


def empty(width: int) -> ShardRows:
    """No records, rows of ``width`` elements.

    Example::

        empty(24).rows.shape   # (0, 24)
    """
    none = torch.empty(0, dtype=torch.int64)
    return ShardRows(none, none, none, torch.empty(0, width))


def concat(blocks: Sequence[ShardRows], width: int) -> ShardRows:
    """The records of ``blocks`` one after the other (``width``: row width when there are none).

    Example::

        everything = concat(list(blocks), layout.width)
    """
    if not blocks:
        return empty(width)
    if len(blocks) == 1:
        return blocks[0]
    return ShardRows(
        torch.cat([b.ids for b in blocks]),
        torch.cat([b.slots for b in blocks]),
        torch.cat([b.last_used for b in blocks]),
        torch.cat([b.rows for b in blocks]),
    )


def select(records: ShardRows, index: torch.Tensor) -> ShardRows:
    """The records at ``index`` (a bool mask or int64 positions).

    Example::

        mine = select(records, layout.owns(records.ids))
    """
    return ShardRows(records.ids[index], records.slots[index], records.last_used[index], records.rows[index])


@dataclasses.dataclass
class ShardRecords:
    """The records a load restores into one table shard.

    Attributes:
        pooled: the records with a pool slot (``slots >= 0``), held in memory.
        lower_count: how many records have none (they go to the tiers below the pool).
        id_range: the least and greatest ID of every record (``(0, -1)`` when there are none).
        width: elements of a packed row.
        lower_rows: a fresh iterator over the ``(IDs, rows)`` of the records without a pool slot, in chunks (a
            checkpoint's reads them from its files again, block by block).

    Example::

        records = ShardRecords.held(rows)          # records already in memory
        sum(ids.numel() for ids, _ in records.lower_rows()) == records.lower_count
    """

    pooled: ShardRows
    lower_count: int
    id_range: Tuple[int, int]
    width: int
    lower_rows: Callable[[], Iterator[Tuple[torch.Tensor, torch.Tensor]]]

    @staticmethod
    def held(records: ShardRows) -> "ShardRecords":
        """``records`` (all in memory) split by their slots."""
        lower = records.slots < 0
        ids, rows = records.ids[lower], records.rows[lower]
        id_range = (int(records.ids.min()), int(records.ids.max())) if records.ids.numel() else (0, -1)
        return ShardRecords(select(records, ~lower), ids.numel(), id_range, records.rows.shape[1],
                            lambda: iter([(ids, rows)]))


def assemble(target: ShardLayout, sources: Sequence[Tuple[ShardLayout, ShardRows]]) -> ShardRows:
    """The records of shard ``target`` from saved shards of the same table, in any layout.

    Args:
        target: the shard to fill.
        sources: saved shards (same table and optimizer states), with their records keyed by global ID and
            already limited to the IDs ``target`` owns.

    Returns:
        ShardRows: sorted by ID; rows packed for ``target`` (its columns, then its optimizer states); ``slots`` and
        ``last_used`` as saved by the first column shard of each row block.

    Raises:
        StorageError: the saved shards lack some of ``target``'s columns, or column shards of one row block hold
            different IDs.

    Example::

        rows = assemble(new_layout, [(left_layout, left_records), (right_layout, right_records)])
    """
    blocks: Dict[Tuple[int, int], List[Tuple[ShardLayout, ShardRows]]] = {}
    for layout, records in sources:
        if _overlap(layout, target) > 0:
            blocks.setdefault(layout.block, []).append((layout, records))
    parts = [_join_columns(target, sorted(pieces, key=lambda p: p[0].col0)) for _, pieces in sorted(blocks.items())]
    merged = concat(parts, target.width)
    return select(merged, torch.argsort(merged.ids))


def _overlap(source: ShardLayout, target: ShardLayout) -> int:
    return min(source.col0 + source.cols, target.col0 + target.cols) - max(source.col0, target.col0)


def _join_columns(target: ShardLayout, pieces: List[Tuple[ShardLayout, ShardRows]]) -> ShardRows:
    """One row block's records for ``target``'s columns, from that block's saved column shards (sorted by col0)."""
    covered = sum(_overlap(layout, target) for layout, _ in pieces)
    if covered != target.cols:
        have = [(p.col0, p.col0 + p.cols) for p, _ in pieces]
        raise StorageError(
            f"table {target.table!r}: the checkpoint's shards of this row block cover columns {have}, not all of "
            f"[{target.col0}, {target.col0 + target.cols}); a shard of the checkpoint is missing"
        )
    ordered = [select(records, torch.argsort(records.ids)) for _, records in pieces]
    for (layout, _), records in zip(pieces[1:], ordered[1:]):
        if not torch.equal(records.ids, ordered[0].ids):
            raise StorageError(
                f"table {target.table!r}: the saved column shards of one row block hold different IDs (columns "
                f"{pieces[0][0].col0} and {layout.col0}); the checkpoint is inconsistent"
            )
    columns = [_column_slice(layout, target, records.rows, 0) for (layout, _), records in zip(pieces, ordered)]
    parts = [torch.cat(columns, dim=1)]
    offsets = [layout.cols for layout, _ in pieces]
    for k, kind in enumerate(target.states):
        parts.append(_join_state(target, k, kind, pieces, ordered, offsets))
        offsets = [o + layout.state_width(k) for o, (layout, _) in zip(offsets, pieces)]
    first = ordered[0]
    return ShardRows(first.ids, first.slots, first.last_used, torch.cat(parts, dim=1))


def _column_slice(source: ShardLayout, target: ShardLayout, rows: torch.Tensor, start: int) -> torch.Tensor:
    """The columns of ``target`` that ``source`` holds, from the block of ``rows`` starting at ``start``."""
    low = max(source.col0, target.col0) - source.col0
    return rows[:, start + low : start + low + _overlap(source, target)]


def _join_state(
    target: ShardLayout,
    k: int,
    kind: str,
    pieces: List[Tuple[ShardLayout, ShardRows]],
    ordered: List[ShardRows],
    offsets: List[int],
) -> torch.Tensor:
    if kind == "element":
        return torch.cat(
            [_column_slice(p, target, r.rows, o) for (p, _), r, o in zip(pieces, ordered, offsets)], dim=1
        )
    if kind == "row":
        weights = [_overlap(p, target) for p, _ in pieces]
        if any(w != p.cols for w, (p, _) in zip(weights, pieces)):
            logger.warning(
                "table %r: a saved column shard is split across new shards; its row-wise optimizer state (one value "
                "per row for its columns) is given to each part unchanged, an approximation", target.table,
            )
        if len(pieces) == 1:  # the value as saved (a weighted mean of one would round)
            return ordered[0].rows[:, offsets[0] : offsets[0] + 1]
        total = cast(torch.Tensor, sum(w * r.rows[:, o : o + 1] for w, r, o in zip(weights, ordered, offsets)))
        return total / sum(weights)
    source = pieces[0][0]
    if len(pieces) != 1 or (source.col0, source.cols) != (target.col0, target.cols):
        raise StorageError(
            f"table {target.table!r}: optimizer state {k} ({kind}) can only be restored into the same columns it was "
            f"saved with ({source.col0}..{source.col0 + source.cols}); load with the saved column layout"
        )
    return ordered[0].rows[:, offsets[0] : offsets[0] + target.state_width(k)]
