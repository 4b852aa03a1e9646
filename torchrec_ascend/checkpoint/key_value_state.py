"""KEY_VALUE tables in stock ``state_dict()``, ``fused_optimizer.state_dict()`` and torch.distributed.checkpoint.

A KEY_VALUE table's rows live in a device cache over host memory over disk, keyed by ID. Its stock state_dict
entries are ShardedTensors of the table's shape whose local shards are :class:`RowWindow` s over a
:class:`TableView` of the shard (one per ``state_dict()`` call and table, shared with the optimizer's until the next
batch), cut in windows of at most ``WINDOW_BYTES``:

* ``<table>.weight``: the weights; a hash table's row ``r`` holds the ID at ``<table>.weight_id[r]`` (-1: none),
  a plain table's row ``r`` is its row ``r`` (never trained: its initial value);
* ``<table>.weight_id`` (hash tables): int64 ``[num_embeddings, column shards]``, as for FUSED hash tables;
* each fused optimizer state in ``fused_optimizer.state_dict()``, sized by the table's rows (not the cache's).

Reading a window (DCP's save clones each one) reads its rows from whichever tier holds them: windows read front to
back (DCP's order) from one sequential pass over the tiers per part, others by looking each ID up. Writing into windows
(DCP's load, ``copy_`` as TorchRec's test harness does, ``load_state_dict``) stages the values by row in an unlinked
temporary file next to the table's disk tier; once the weights (and a hash table's ``weight_id``) and every
optimizer state are in, or at the next batch, ``state_dict()`` read or ``load_state_dict``, the shard becomes exactly
the loaded rows (optimizer states not loaded start fresh) through the same restore the Saver uses. A load that
misses part of the weights or IDs, puts an ID on a shard that does not own it, or repeats an ID is refused naming
the table, and the table is left as it was. So is a load into windows that misses a part the same view handed out
(the weights with ``fused_optimizer.state_dict()``'s states): a ``dcp.load`` that failed half-way, on a truncated
or missing file, is refused at the next batch instead of leaving rows with the wrong optimizer state.

Memory: a save holds one window, the pass's blocks it spans (a window's rows each) and 8 B per ID of the shard (a
hash table's IDs, enumerated once per ``state_dict()``); a load holds one window plus 8 B per row of the shard (the
staged IDs), and the restore's own blocks.

Example::

    import torch.distributed.checkpoint as dcp

    dcp.save({"model": dmp.state_dict(), "optim": dmp.fused_optimizer.state_dict()}, checkpoint_id="/ckpt/1")
    state = {"model": dmp.state_dict(), "optim": dmp.fused_optimizer.state_dict()}
    dcp.load(state, checkpoint_id="/ckpt/1")    # KEY_VALUE tables are restored when their rows are in
"""

from __future__ import annotations

import math
import os
import tempfile
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import numpy as np
import torch
from torch.distributed._shard.metadata import ShardMetadata
from torch.distributed._shard.sharded_tensor import ShardedTensor, ShardedTensorMetadata

from torchrec_ascend.checkpoint.layout import ShardLayout
from torchrec_ascend.checkpoint.policy_state import POLICY_STATE, SavedShard, awaited, take_loaded
from torchrec_ascend.checkpoint.restore import trial_slot_restore
from torchrec_ascend.checkpoint.row_window import RowWindow
from torchrec_ascend.checkpoint.sharded import column_offsets, id_metadata, rank_of, window_rows, windowed
from torchrec_ascend.checkpoint.stock import refuse_rows_without_ids
from torchrec_ascend.errors import CapacityError, ConfigError, StorageError
from torchrec_ascend.kernels.key_value.kernel import KeyValueRows
from torchrec_ascend.kernels.shard_checkpoint import ShardRows
from torchrec_ascend.kernels.walk import sharded_kernels
from torchrec_ascend.native.memory import KeptBuffers, no_numpy_huge_pages, plain_empty, reused_buffers

WEIGHTS, IDS = 0, 1  # parts of a table view; optimizer state k is part 2 + k
_EMPTY = torch.empty(0, dtype=torch.int64)


class TableView:
    """One KEY_VALUE table shard as one ``state_dict()`` shows it (a :class:`RowSource` for its windows).

    Args:
        kernel: the KEY_VALUE kernel holding the shard; ``t``: the table's index in it.
    """

    def __init__(self, kernel: KeyValueRows, t: int) -> None:
        self.kernel, self.t = kernel, t
        self.info = kernel.shard_info(t)
        self.layout = ShardLayout.of(self.info)
        self.rows, self.cols = self.layout.rows, self.info.cols
        state_widths = [math.prod(shape) for shape in self.info.state_shapes]
        self.width = self.cols + sum(state_widths)
        #: per part: its first column in a packed record and its width (IDS: not in records)
        self._columns = [(0, self.cols), (0, 1)] + [
            (self.cols + sum(state_widths[:k]), w) for k, w in enumerate(state_widths)
        ]
        self._weight_dtype = kernel.weight_dtype(t)
        # Every window reads whole records; sized by the widest shard's, so that every rank cuts the same windows.
        widest = max(int(m.shard_sizes[1]) for m in self.info.table.global_metadata.shards_metadata)
        self._step = window_rows(widest + sum(widest if shape else 1 for shape in self.info.state_shapes))
        self._ids: Optional[torch.Tensor] = None
        self._in_order: Optional[_InOrder] = _InOrder(lambda: kernel.checkpoint.held_records(t, self._step),
                                                      self.width, self.rows, self._step)
        self._staging: Optional[_Staging] = None
        self._handed_out: set = set()  # the parts whose windows a state_dict() call took: a load into them fills all
        self.applied = False  # a load into this view reached the table

    @property
    def name(self) -> str:
        return self.info.name

    def parts(self) -> List[int]:
        return [WEIGHTS] + ([IDS] if self.layout.hash_ids else []) + [2 + k for k in range(len(self.info.state_shapes))]

    # -- RowSource ----------------------------------------------------------------------------------------------------

    def dtype(self, part: int) -> torch.dtype:
        return self._weight_dtype if part == WEIGHTS else torch.int64 if part == IDS else torch.float32

    def holds(self, other: Any) -> bool:
        return other is self or (
            isinstance(other, TableView) and other.kernel is self.kernel and other.t == self.t and other.applied
        )

    @no_numpy_huge_pages()
    def read(self, part: int, row0: int, rows: int) -> torch.Tensor:
        self.settle()
        if part == IDS:
            return self._row_ids()[row0:row0 + rows, None].clone()  # the window's own (RowSource.read)
        keys = self._row_ids()[row0:row0 + rows] if self.layout.hash_ids else torch.arange(row0, row0 + rows)
        col0, width = self._columns[part]
        columns = slice(col0, col0 + width)
        values = self._in_order.take(row0, keys, columns) if self._in_order and self.layout.hash_ids else None
        if values is None:
            values = self._looked_up(keys)[:, columns]
        if part >= 2 and self.info.state_shapes[part - 2] == ():
            values = values[:, 0]
        return values.to(self.dtype(part))

    def _looked_up(self, keys: torch.Tensor) -> torch.Tensor:
        """The records of rows holding ``keys`` (-1: none), each looked up in whichever tier holds it."""
        records = torch.zeros(keys.numel(), self.width)
        held = (keys >= 0).nonzero().squeeze(1)
        found_rows, found = self.kernel.checkpoint.read_records(self.t, keys[held])
        if self.layout.hash_ids and not bool(found.all()):
            raise ConfigError(
                f"KEY_VALUE table {self.name!r}: {int((~found).sum())} IDs of this state_dict left the table since "
                "state_dict() was called; take state_dict() again right before saving"
            )
        fresh = ~found  # plain tables: a row never trained is its initial value, with fresh optimizer state
        found_rows[fresh, :self.cols] = self.kernel.initial_rows(self.t, self.layout.to_global(keys[held][fresh]))
        records[held] = found_rows
        return records

    @no_numpy_huge_pages()
    def write(self, part: int, row0: int, col0: int, values: torch.Tensor) -> None:
        if self.applied:
            raise ConfigError(
                f"KEY_VALUE table {self.name!r}: a load into this state_dict was applied to the table already; take "
                "state_dict() (or fused_optimizer.state_dict()) again and load into that"
            )
        rows = values.shape[0]
        if row0 < 0 or row0 + rows > self.rows:
            raise ConfigError(f"KEY_VALUE table {self.name!r}: rows {row0}-{row0 + rows - 1} are outside the shard")
        if self._staging is None:
            self._staging = _Staging(self.kernel.storage_directory(self.t), self.rows, self._columns)
        staging = self._staging
        if part == IDS:
            staging.ids[row0:row0 + rows] = values.reshape(rows).long()
        else:
            staging.write(part, row0, col0, values.reshape(rows, -1).float().numpy())
        staging.written[part] += values.numel()
        if all(staging.written[p] == self._size(p) for p in self.parts()) and not awaited(self.kernel, self.t):
            self.settle()  # everything is in (a whole DCP load of model and optimizer): apply it now

    def rows_move(self) -> None:
        """The table's rows are about to move (a batch, a load): windows read from now on look their IDs up, since a
        pass begun before would pair its IDs with rows that moved."""
        self._in_order = None

    # -- loads --------------------------------------------------------------------------------------------------------

    @no_numpy_huge_pages()
    def settle(self, expect_handed_out: bool = True) -> None:
        """Apply the values written into this view to the table, if any (see the module docstring).

        Args:
            expect_handed_out: refuse a load that left out a part this view handed out (a load through windows);
                ``load_state_dict`` passes False: it loads the model alone, and optimizer states start fresh.

        Raises:
            ConfigError: the load wrote part of the weights, IDs or an optimizer state, left out a part handed out,
                or placed its IDs on a shard that does not own them; the table is left as it was.
            CapacityError: more IDs than the shard holds.
        """
        staging, self._staging = self._staging, None
        if staging is None:
            return
        try:
            self._apply(staging, self._handed_out if expect_handed_out else set())
        finally:
            staging.close()
        self.applied = True

    def _apply(self, staging: "_Staging", expected: set) -> None:
        names = {WEIGHTS: "weight", IDS: "weight_id"}
        loaded = []
        for part in self.parts():
            written, size = staging.written[part], self._size(part)
            if written == size:
                loaded.append(part)
            elif part in names or written or part in expected:
                what = names.get(part, f"optimizer state {part - 2}")
                if not written:
                    what += ", which the same state_dict() handed out (a load that failed half-way?)"
                raise ConfigError(
                    f"KEY_VALUE table {self.name!r}: the load gave {written} of the {size} values of this rank's "
                    f"{what}; nothing was changed. Load a state_dict holding the whole table (its weight"
                    f"{' and weight_id' if self.layout.hash_ids else ''}), e.g. through torch.distributed.checkpoint"
                )
        keys = staging.ids if self.layout.hash_ids else torch.arange(self.rows)
        held = keys >= 0
        if self.layout.hash_ids:
            self._check_ids(keys[held])
        keep = torch.zeros(self.width, dtype=torch.bool)  # columns loaded; the others (states) start fresh
        for part in loaded:
            if part != IDS:
                col0, width = self._columns[part]
                keep[col0:col0 + width] = True
        fresh = (~keep).nonzero().squeeze(1)

        def chunks() -> Iterator[Tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
            """``(keys, records, mask)`` of each window of staged rows: ``mask``, the rows holding a record."""
            step = self._step
            for row0 in range(0, self.rows, step):
                rows = min(step, self.rows - row0)
                mask = held[row0:row0 + rows].clone()
                records = torch.from_numpy(staging.read(row0, rows))
                if fresh.numel():  # a no-op assignment still costs a pass over the records
                    records[:, fresh] = 0.0
                if not self.layout.hash_ids:  # a row still at its initial value needs no record (it reads as one)
                    initial = self.kernel.initial_rows(self.t, self.layout.to_global(keys[row0:row0 + rows]))
                    mask &= ~((records[:, :self.cols] == initial).all(1) & (records[:, self.cols:] == 0).all(1))
                yield keys[row0:row0 + rows], records, mask

        saved = take_loaded(self.kernel, self.t) if self.layout.hash_ids else None
        pooled = ShardRows(_EMPTY, _EMPTY, _EMPTY, torch.zeros(0, self.width))
        current = self.kernel.shard_state(self.t)
        state: Dict[str, Any] = {k: current[k] for k in ("step", "counters", "swaps") if k in current}
        if saved is not None and saved.layout == self.layout:  # the same plan: the cache and policies as saved
            pooled = self._saved_pool(saved, chunks())
            state = saved.state
            trial_slot_restore(self.kernel, self.t, pooled.ids, pooled.slots, pooled.last_used, state,
                               f"KEY_VALUE table {self.name!r}: the loaded {POLICY_STATE}'s IDs and state")
        elif saved is not None:  # another plan: policies start over at the saved step
            state["step"] = int(saved.state.get("step", 0))
        in_pool = torch.sort(pooled.ids).values

        def lower() -> Iterator[Tuple[torch.Tensor, torch.Tensor]]:
            for keys_, records, mask in chunks():
                mask &= ~torch.isin(keys_, in_pool)
                yield (keys_, records) if bool(mask.all()) else (keys_[mask], records[mask])

        self.rows_move()
        self.kernel.checkpoint.restore_shard(self.t, pooled, lower(), state)
        if saved is not None and "iteration" in saved.state:
            self.kernel.set_optimizer_iteration(int(saved.state["iteration"]))
        self._ids = keys.clone() if self.layout.hash_ids else None

    def _saved_pool(self, saved: SavedShard, chunks: Iterator[Tuple[torch.Tensor, torch.Tensor, torch.Tensor]]
                    ) -> ShardRows:
        """The saved cache: each pooled ID of ``saved`` at its slot, with its staged record.

        Raises:
            ConfigError: a pooled ID is not among the loaded rows (model and optimizer state from different saves).
        """
        order = torch.argsort(saved.ids)
        ids = saved.ids[order]
        rows = torch.zeros(ids.numel(), self.width)
        found = 0
        for keys, records, mask in chunks:
            cached = mask & torch.isin(keys, ids)
            rows[torch.searchsorted(ids, keys[cached])] = records[cached]
            found += int(cached.sum())
        if found != ids.numel():
            raise ConfigError(
                f"KEY_VALUE table {self.name!r}: the loaded {POLICY_STATE} caches {ids.numel() - found} IDs that are "
                "not among the loaded rows (the model's and the optimizer's state_dict come from different saves); "
                "nothing was changed. Load both from one checkpoint"
            )
        return ShardRows(ids, saved.slots[order], saved.last_used[order], rows)

    def _check_ids(self, ids: torch.Tensor) -> None:
        if ids.numel() != torch.unique(ids).numel():
            raise ConfigError(f"KEY_VALUE table {self.name!r}: the loaded weight_id holds an ID twice; nothing was "
                              "changed")
        owned = self.layout.owns(ids)
        if not bool(owned.all()):
            raise ConfigError(
                f"KEY_VALUE table {self.name!r}: the load puts {int((~owned).sum())} IDs on this rank's shard that do "
                "not belong to it (saved with another row-wise split or world size; rows are placed by "
                "hash(ID) % world_size); nothing was changed. Load with the same plan, or move the table with "
                "torchrec_ascend.Saver, which reshards"
            )

    def load(self, weight: Any, ids: Optional[Any]) -> None:
        """Load this shard's rows from a state_dict entry (``weight``, and ``ids``: ``weight_id`` for hash tables):
        every piece overlapping the shard is copied into this view, then applied.

        Raises:
            ConfigError: the entries do not cover this rank's shard, or as :meth:`settle`.
        """
        table = self.info.table
        row0, col0 = (int(o) for o in table.local_metadata.shard_offsets)
        covered = 0
        for piece, offsets in _pieces(weight):
            covered += self._copy_overlap(WEIGHTS, piece, offsets, row0, col0, self.cols)
        if ids is not None:
            column = column_offsets(table.global_metadata).index(col0)
            for piece, offsets in _pieces(ids):
                self._copy_overlap(IDS, piece, offsets, row0, column, 1)
        if covered != self.rows * self.cols:
            raise ConfigError(
                f"KEY_VALUE table {self.name!r}: the state_dict holds {covered} of the {self.rows * self.cols} values "
                "of this rank's shard (another sharding plan or world size?); nothing was changed. Load it through "
                "torch.distributed.checkpoint, which places rows by their offsets, or move the table with "
                "torchrec_ascend.Saver"
            )
        self.settle(expect_handed_out=False)

    def _copy_overlap(self, part: int, piece: torch.Tensor, offsets: Tuple[int, int], row0: int, col0: int,
                      cols: int) -> int:
        top, left = max(row0, offsets[0]), max(col0, offsets[1])
        bottom = min(row0 + self.rows, offsets[0] + piece.shape[0])
        right = min(col0 + cols, offsets[1] + piece.shape[1])
        if bottom <= top or right <= left:
            return 0
        source = piece[top - offsets[0]:bottom - offsets[0], left - offsets[1]:right - offsets[1]]
        RowWindow(self, part, top - row0, bottom - top, left - col0, right - left).copy_(source)
        return (bottom - top) * (right - left)

    # -- internals ----------------------------------------------------------------------------------------------------

    def _size(self, part: int) -> int:
        return self.rows * (1 if part == IDS else self._columns[part][1])

    def _row_ids(self) -> torch.Tensor:
        """The ID of each row of the shard (-1: none), enumerated once per view."""
        if self._ids is None:
            held = torch.cat(list(self.kernel.checkpoint.held_keys(self.t)))
            if held.numel() > self.rows:
                raise CapacityError(
                    f"KEY_VALUE table {self.name!r}: this shard holds {held.numel()} IDs, more than its "
                    f"{self.rows} rows of num_embeddings: raise num_embeddings to checkpoint it through state_dict()"
                )
            self._ids = torch.cat([held, torch.full((self.rows - held.numel(),), -1, dtype=torch.int64)])
        return self._ids

    # -- the ShardedTensors -------------------------------------------------------------------------------------------

    def weight(self) -> ShardedTensor:
        """``<table>.weight``: the table's rows in windows."""
        table = self.info.table
        self._handed_out.add(WEIGHTS)
        return windowed(table.global_metadata, table.local_metadata,
                        lambda r, n: RowWindow(self, WEIGHTS, r, n, 0, self.cols), self._weight_dtype,
                        self.kernel.process_group, self._step)

    def weight_id(self) -> ShardedTensor:
        """``<table>.weight_id`` (hash tables): the ID of each row."""
        table = self.info.table
        self._handed_out.add(IDS)
        local = id_metadata(table.global_metadata).shards_metadata[
            table.global_metadata.shards_metadata.index(table.local_metadata)]
        return windowed(id_metadata(table.global_metadata), local, lambda r, n: RowWindow(self, IDS, r, n, 0, 1),
                        torch.int64, self.kernel.process_group, self._step)

    def optimizer_state(self, k: int, cache_state: ShardedTensor) -> ShardedTensor:
        """Optimizer state ``k`` sized by the table's rows, laid out as TorchRec lays out ``cache_state`` (the
        device cache's state of the same table)."""
        table = self.info.table
        self._handed_out.add(2 + k)
        if self.info.state_shapes[k] != ():
            return windowed(table.global_metadata, table.local_metadata,
                            lambda r, n: RowWindow(self, 2 + k, r, n, 0, self.cols), torch.float32,
                            self.kernel.process_group, self._step)
        metadata, local = _rowwise_metadata(cache_state.metadata(), table.global_metadata,
                                            rank_of(table.local_metadata), self.name)
        return windowed(metadata, local, lambda r, n: RowWindow(self, 2 + k, r, n), torch.float32,
                        self.kernel.process_group, self._step)


class _InOrder:
    """A hash shard's records in the order its view enumerates the rows' IDs, read block by block from one
    sequential pass over the tiers: windows read front to back (as DCP's save reads them, once per part) cost a
    sequential read instead of a lookup per ID. Holds the blocks (a window's rows each) a window spans.

    Each window's blocks are read into the memory of the blocks the window before freed (kept here between two
    windows, at most a block's records as read and as decoded), not fresh memory to fault in: a DCP save of 1M rows
    x 128 took 4.1-4.4 s, 5.2-5.8 s without (cProfile on, interleaved runs).

    Args:
        blocks: starts a pass, ``(keys, records)`` blocks in the enumeration's order (``held_records``).
        width: floats per record.
        rows: the shard's rows: a window ending there ends the pass.
        block_rows: rows per block at most.
    """

    def __init__(self, blocks: Callable[[], Iterator[Tuple[torch.Tensor, torch.Tensor]]], width: int, rows: int,
                 block_rows: int) -> None:
        self._blocks, self._rows = blocks, rows
        self._pass: Optional[Iterator[Tuple[torch.Tensor, torch.Tensor]]] = None
        self._start = 0  # the row of the first record buffered
        self._buffered: List[Tuple[torch.Tensor, torch.Tensor]] = []
        self.kept = KeptBuffers()
        self._kept_limit = 2 * block_rows * (4 * width + 16)  # a disk record: its key, its checksum, its row

    def take(self, row0: int, keys: torch.Tensor, columns: slice) -> Optional[torch.Tensor]:
        """The ``columns`` of the records of rows ``row0, row0 + 1, ...`` holding ``keys`` (-1 after the last ID:
        zeros), a contiguous tensor of their own, or None if the pass does not give those keys there (the table
        changed) or ``row0`` lies behind it and is not the first row (windows read out of order): the caller looks
        them up."""
        if self._pass is None or row0 < self._start:
            if row0:
                return None
            self._pass, self._start, self._buffered = self._blocks(), 0, []
        end = row0 + keys.numel()
        with reused_buffers(self._kept_limit, keep=self.kept):
            while self._buffered and self._start + self._buffered[0][0].numel() <= row0:  # windows go forward
                self._start += self._buffered.pop(0)[0].numel()
            buffered_end = self._start + sum(k.numel() for k, _ in self._buffered)
            while buffered_end < end and (block := next(self._pass, None)) is not None:
                if buffered_end + block[0].numel() <= row0:  # the block ends before the window: skip it
                    self._start = buffered_end = buffered_end + block[0].numel()
                    continue
                self._buffered.append(block)
                buffered_end += block[0].numel()
        pieces, first = [], row0 - self._start
        for block_keys, block_records in self._buffered:
            rows = slice(max(first, 0), max(end - row0 + first, 0))
            pieces.append((block_keys[rows], block_records[rows]))
            first -= block_keys.numel()
        held = torch.cat([_EMPTY, *(k for k, _ in pieces)])
        if end >= self._rows:  # the last window: the pass and its kept buffers go
            self._pass, self._start, self._buffered = None, 0, []
            self.kept.clear()
        if not torch.equal(held, keys[:held.numel()]) or bool((keys[held.numel():] >= 0).any()):
            return None
        # A mapping of its own, not glibc's heap: window after window of these (DCP writes and drops each) grew
        # the heap by up to ten windows of freed memory it kept resident, in some runs and not others
        values = torch.from_numpy(plain_empty((keys.numel(), columns.stop - columns.start), np.float32))
        if pieces:
            torch.cat([r[:, columns] for _, r in pieces], out=values[:held.numel()])
        values[held.numel():] = 0
        return values


class _Staging:
    """A load's packed records by row, in an unlinked temporary file (no page of it counts as the process's memory),
    and its IDs (hash tables) in memory, until the load is applied. Each part's columns have a region of the file to
    themselves, so a window of a part is one write (DCP hands in whole rows of a part), not a read of the records
    it lands in and a write back.

    Args:
        directory: where the file lives (the table's storage; None: the system's temporary directory).
        rows: rows of the shard.
        columns: per part, its first column in a packed record and its width (:class:`TableView`'s; IDS aside).
    """

    def __init__(self, directory: Optional[str], rows: int, columns: List[Tuple[int, int]]) -> None:
        if directory:
            os.makedirs(directory, exist_ok=True)
        fd, path = tempfile.mkstemp(prefix="torchrec-ascend-load-", dir=directory)
        os.unlink(path)
        self._fd, self._columns = fd, columns
        self._parts = [p for p in range(len(columns)) if p != IDS]
        self._width = sum(columns[p][1] for p in self._parts)
        offsets = np.cumsum([0] + [4 * rows * columns[p][1] for p in self._parts])
        self._region = dict(zip(self._parts, offsets.tolist()))  # where each part's rows start
        os.ftruncate(fd, int(offsets[-1]))  # unwritten rows read as zeros
        self.ids = torch.full((rows,), -1, dtype=torch.int64)
        self.written = [0] * len(columns)

    def _read_part(self, part: int, row0: int, rows: int) -> np.ndarray:
        width = self._columns[part][1]
        out = np.empty((rows, width), dtype=np.float32)
        if os.preadv(self._fd, [out.data], self._region[part] + 4 * row0 * width) != out.nbytes:
            raise StorageError(f"the staging file of a load ended before rows {row0}-{row0 + rows - 1}")
        return out

    def write(self, part: int, row0: int, col0: int, values: np.ndarray) -> None:
        """``values`` ``[rows, n]`` into columns ``col0 ...`` of ``part`` (a record's columns of that part)."""
        rows, width = values.shape[0], self._columns[part][1]
        if (col0, values.shape[1]) != (0, width):  # a column-wise piece: the rest of its rows stays as written
            block = self._read_part(part, row0, rows)
            block[:, col0:col0 + values.shape[1]] = values
            values = block
        data = np.ascontiguousarray(values)
        if os.pwrite(self._fd, data.data, self._region[part] + 4 * row0 * width) != data.nbytes:
            raise StorageError(f"the staging file of a load took part of rows {row0}-{row0 + rows - 1}: disk full?")

    def read(self, row0: int, rows: int) -> np.ndarray:
        """Records ``[rows, width]`` of rows ``row0 ...``, each part's columns in their place."""
        records = np.empty((rows, self._width), dtype=np.float32)
        for part in self._parts:
            col0, width = self._columns[part]
            records[:, col0:col0 + width] = self._read_part(part, row0, rows)
        return records

    def close(self) -> None:
        os.close(self._fd)


def _pieces(value: Any) -> List[Tuple[torch.Tensor, Tuple[int, int]]]:
    """A state_dict entry's local pieces and their global offsets (rows, columns)."""
    if isinstance(value, ShardedTensor):
        return [(s.tensor, (int(s.metadata.shard_offsets[0]), int(s.metadata.shard_offsets[1])))
                for s in value.local_shards()]
    return [(value, (0, 0))]


def _rowwise_metadata(cache: ShardedTensorMetadata, table: ShardedTensorMetadata, rank: int,
                      name: str) -> Tuple[ShardedTensorMetadata, ShardMetadata]:
    """A row-wise optimizer state's metadata for the table's rows: TorchRec lays the cache's out as 1-D blocks, one per
    table shard, one after the other; each block here has its shard's rows instead. Returns it and this rank's."""
    rows_of: Dict[int, int] = {}
    for shard in table.shards_metadata:
        holder = rank_of(shard)
        if holder in rows_of:
            raise ConfigError(f"KEY_VALUE table {name!r}: rank {holder} holds two of its shards; shard it so that "
                              "each rank holds at most one (table_wise, row_wise, column_wise or table_row_wise)")
        rows_of[holder] = int(shard.shard_sizes[0])
    blocks, offset = [], 0
    for shard in sorted(cache.shards_metadata, key=lambda m: int(m.shard_offsets[0])):
        rows = rows_of[rank_of(shard)]
        blocks.append(ShardMetadata(shard_offsets=[offset], shard_sizes=[rows], placement=shard.placement))
        offset += rows
    metadata = ShardedTensorMetadata(blocks, torch.Size([offset]), cache.tensor_properties)
    return metadata, next(b for b in blocks if rank_of(b) == rank)


class KernelViews:
    """The :class:`TableView` s of one KEY_VALUE kernel, shared by every ``state_dict()`` call until the next batch
    (so a model's and its optimizer's state_dicts agree row for row)."""

    def __init__(self, kernel: KeyValueRows) -> None:
        self.kernel = kernel
        self._tables: Dict[int, TableView] = {}

    def table(self, t: int) -> TableView:
        if t not in self._tables or self._tables[t].applied:  # a view a load went through describes the past
            self._tables[t] = TableView(self.kernel, t)
        return self._tables[t]

    def settle(self) -> None:
        """Before rows move (a batch, a Saver save or load): apply pending loads, then start over."""
        for view in self.take():
            view.settle()
            view.rows_move()

    def take(self) -> List[TableView]:
        """The views so far; the next ``state_dict()`` makes new ones."""
        tables, self._tables = self._tables, {}
        return list(tables.values())


def views_of(kernel: KeyValueRows) -> KernelViews:
    """The kernel's :class:`KernelViews`, made (and registered with the kernel) on first use."""
    views = kernel.load_hook_owner()
    if not isinstance(views, KernelViews):
        views = KernelViews(kernel)
        kernel.set_load_hook(views, views.settle)
    return views


def install_views(module: torch.nn.Module, sharded_tensors: Dict[str, ShardedTensor]) -> None:
    """Give every KEY_VALUE kernel of a sharded collection its :class:`KernelViews`, and make the collection's own
    ShardedTensor of each KEY_VALUE table (``sharded_tensors``, which TorchRec deep-copies on every ``state_dict()``
    call) windows that hold no rows."""
    for name, (kernel, t) in key_value_shards(module).items():
        views_of(kernel)
        if name in sharded_tensors:
            for shard in sharded_tensors[name].local_shards():
                shard.tensor = RowWindow(TableView(kernel, t), WEIGHTS, 0, shard.tensor.shape[0], 0,
                                         shard.tensor.shape[1])


def settle_loads(model: torch.nn.Module) -> List[str]:
    """Apply every load written into ``model``'s KEY_VALUE state_dict views now (else each is applied, or refused, at
    its kernel's next batch); returns the refusals' messages, one per refused table.

    Example::

        dcp.load(state, checkpoint_id="/ckpt/1")
        assert not settle_loads(dmp)
    """
    refusals: List[str] = []
    for kernel in sharded_kernels(model):
        views = kernel.load_hook_owner() if isinstance(kernel, KeyValueRows) else None
        if isinstance(views, KernelViews):
            for view in views.take():
                try:
                    view.settle()
                except ConfigError as err:
                    refusals.append(str(err))
    return refusals


def key_value_shards(module: torch.nn.Module) -> Dict[str, Tuple[KeyValueRows, int]]:
    """Table name -> this rank's (kernel, table index) shard of each KEY_VALUE table of a sharded collection.

    Raises:
        ConfigError: a rank holds two shards of one KEY_VALUE table.
    """
    shards: Dict[str, Tuple[KeyValueRows, int]] = {}
    for kernel in sharded_kernels(module):
        if isinstance(kernel, KeyValueRows):
            for t in range(kernel.num_tables):
                name = kernel.shard_info(t).name
                if name in shards:
                    raise ConfigError(f"KEY_VALUE table {name!r}: this rank holds two of its shards; shard it so that "
                                      "each rank holds at most one")
                shards[name] = (kernel, t)
    return shards


def add_key_value_entries(module: torch.nn.Module, destination: Dict[str, Any], prefix: str, attr: str) -> None:
    """State-dict hook part: each KEY_VALUE table's ``weight`` (and a hash table's ``weight_id``) as windows over its
    rows in every tier."""
    for name, (kernel, t) in key_value_shards(module).items():
        key = f"{prefix}{attr}.{name}.weight"
        if key not in destination:
            continue
        view = views_of(kernel).table(t)
        destination[key] = view.weight()
        if view.layout.hash_ids:
            destination[f"{prefix}{attr}.{name}.weight_id"] = view.weight_id()


def load_key_value_entries(module: torch.nn.Module, state_dict: Dict[str, Any], prefix: str, attr: str) -> List[str]:
    """Load-state-dict pre-hook part: load each KEY_VALUE table's rows from ``state_dict`` (its ``weight_id`` is
    taken out). Returns the weight keys handled (the caller keeps them from the stock hook).

    Raises:
        ConfigError: a hash table's rows without their IDs, or as :meth:`TableView.load`.
    """
    handled = []
    for name, (kernel, t) in key_value_shards(module).items():
        key = f"{prefix}{attr}.{name}.weight"
        ids = state_dict.pop(f"{prefix}{attr}.{name}.weight_id", None)
        if key not in state_dict:
            continue
        view = views_of(kernel).table(t)
        if view.layout.hash_ids and ids is None:
            refuse_rows_without_ids(state_dict, f"{prefix}{attr}.{name}", name)
            continue  # an unsharded module's untrained table (TorchRec loads it when it shards the module)
        view.load(state_dict[key], ids)
        handled.append(key)
    return handled
