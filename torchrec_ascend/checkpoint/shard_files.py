"""One table shard in a checkpoint: its records and state written to a rank's data file, and read back.

A shard's metadata entry holds its :class:`ShardLayout`, the JSON part of its state (step, counters, optimizer
iteration...), and the array entries of the rest: record blocks (``ids`` as global IDs, ``slots``, ``last_used``,
``rows``), the IDs an incremental save drops (``removed``), and the state tensors (the ID map's free slots, each
policy's state dict as ``eviction/<name>`` / ``admission/<name>``). A chain of saves reads back with
:class:`CheckedChain`: the records with a pool slot in memory, the others handed on block by block as they are
checked, or read again block by block as they are restored (:func:`read_chain`), so a KEY_VALUE shard may be larger
than memory.

Example::

    entry = write_shard(writer, layout, blocks, removed, kernel.shard_state(t))
    records = read_chain([(save_dir, entry)])
    records.pooled, records.lower_count
"""

from __future__ import annotations

import collections
import os
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable, Deque, Dict, Generator, Iterable, Iterator, List, Optional, Tuple

import numpy as np
import torch

from torchrec_ascend.checkpoint.files import (
    ArrayFileWriter,
    FileIdentity,
    confined,
    file_identity,
    read_array,
    will_read,
)
from torchrec_ascend.checkpoint.layout import ShardLayout
from torchrec_ascend.checkpoint.records import ShardRecords, concat
from torchrec_ascend.checkpoint.schema import RECORD_FIELDS
from torchrec_ascend.errors import StorageError
from torchrec_ascend.kernels.fused import ShardRows
from torchrec_ascend.native.memory import reused_buffers

CHECK_THREADS = 2  # blocks read and checked at once: a checksum (zlib, ~2 GB/s) takes as long as a cold read
# A block of a save whose surviving records have no pool slot: (directory, shard entry, block entry, which records,
# the data file's identity when it was checked); its rows are read again as they are restored.
LowerBlock = Tuple[str, Dict[str, Any], Dict[str, Any], torch.Tensor, FileIdentity]


def write_shard(
    writer: ArrayFileWriter,
    layout: ShardLayout,
    blocks: Iterable[ShardRows],
    removed: Callable[[], torch.Tensor],
    state: Dict[str, Any],
) -> Dict[str, Any]:
    """Append one shard's records and state to ``writer``; returns the shard's metadata entry.

    Args:
        writer: the rank's data file.
        layout: the shard's layout.
        blocks: its records, keys as the slot table holds them (converted to global IDs here).
        removed: gives the IDs an incremental save drops (slot table keys), asked for once ``blocks`` are written.
        state: :meth:`HashRows.shard_state` (tensors, dicts of tensors and JSON values).

    Raises:
        StorageError: the write failed.

    Example::

        blocks, removed = kernel.export_shard(t, changed_only=True)
        entry = write_shard(writer, layout, blocks, removed, kernel.shard_state(t))
    """
    entry: Dict[str, Any] = {"layout": layout.to_json(), "file": os.path.basename(writer.path), "blocks": []}
    for block in blocks:
        if block.ids.numel():
            block = ShardRows(layout.to_global(block.ids), block.slots, block.last_used, block.rows)
            entry["blocks"].append({f: writer.add(_numpy(getattr(block, f))) for f in RECORD_FIELDS})
    arrays = {"removed": writer.add(_numpy(layout.to_global(removed())))}
    values = {}
    for key, value in state.items():
        if isinstance(value, torch.Tensor):
            arrays[key] = writer.add(_numpy(value))
        elif isinstance(value, dict) and all(isinstance(v, torch.Tensor) for v in value.values()) and value:
            arrays.update({f"{key}/{name}": writer.add(_numpy(v)) for name, v in value.items()})
        else:
            values[key] = value
    entry["arrays"], entry["state"] = arrays, values
    return entry


def read_shard_state(directory: str, entry: Dict[str, Any]) -> Dict[str, Any]:
    """The state :func:`write_shard` wrote (tensors, policy state dicts and JSON values), read back.

    Example::

        state = read_shard_state(save_dir, entry)
        kernel.restore_shard(t, records, state)
    """
    state: Dict[str, Any] = dict(entry["state"])
    for key, array_entry in entry["arrays"].items():
        if key == "removed":
            continue
        value = torch.from_numpy(_read(directory, entry, array_entry, key))
        if "/" in key:  # a state dict of tensors (eviction, cadence, admission)
            group, name = key.split("/", 1)
            if not isinstance(state.setdefault(group, {}), dict):
                raise StorageError(
                    f"checkpoint folder '{directory}': table {entry['layout']['table']!r} saved {group!r} both as a "
                    "value and as arrays; the metadata is corrupted"
                )
            state[group][name] = value
        else:
            state[key] = value
    return state


class CheckedChain:
    """A shard's chain of saves (a full save and its increments) read and checked in one pass, block by block.

    Iterating it yields the surviving records without a pool slot, ``(IDs, rows)`` a block at a time, as each block
    is checked (the latest save's first), so a caller may store them as they come: a block yielded is checked, but
    a later one may still be damaged (StorageError), so keep them where they can be dropped until the iteration
    ends. :attr:`records` is the chain's result once every block is checked; it reads and checks what the
    iteration left (dropping those rows), so ``CheckedChain(chain).records`` alone is :func:`read_chain`.

    Every array is read and checksummed. A record survives when no later save of the chain changes or removes
    its ID. Memory: the pooled records, the IDs of the increments, 16 bytes per record of the largest save, 1 byte
    per record of the chain, ``CHECK_THREADS`` blocks (checked at once) besides the one yielded, and one freed block
    kept for the next read (:func:`~torchrec_ascend.native.memory.reused_buffers`).

    Args:
        chain: ``(save directory, shard entry)`` from the full save to the latest increment, in order.
        keep: a mask over global IDs (the IDs a new shard owns); records of other IDs are dropped as read.

    Example::

        checking = CheckedChain([(dir1, entry1), (dir2, entry2)])
        store.load(checking)           # fills as the blocks are checked; a damaged one raises StorageError
        checking.records.pooled        # the records with a pool slot
    """

    def __init__(
        self, chain: List[Tuple[str, Dict[str, Any]]], keep: Optional[Callable[[torch.Tensor], torch.Tensor]] = None
    ) -> None:
        self._checking = _check_chain(chain, keep)
        self._records: Optional[ShardRecords] = None

    def __iter__(self) -> Iterator[Tuple[torch.Tensor, torch.Tensor]]:
        if self._records is None:  # an iteration goes on where the one before stopped; none after the last block
            self._records = yield from self._checking

    @property
    def records(self) -> ShardRecords:
        """The chain's records (:func:`read_chain`), once every block is checked.

        Raises:
            StorageError: a data file is missing, truncated or corrupted, or one save holds an ID twice.
        """
        if self._records is None:
            for _ in self:
                pass
        assert self._records is not None
        return self._records


def read_chain(
    chain: List[Tuple[str, Dict[str, Any]]], keep: Optional[Callable[[torch.Tensor], torch.Tensor]] = None
) -> ShardRecords:
    """Read and check a shard's records after a full save and its increments, keeping only the pooled rows.

    As :class:`CheckedChain`; the rows of the records without a pool slot are read again, block by block, by
    :attr:`ShardRecords.lower_rows` (which raises StorageError if the files changed since; it reads the next block
    in a thread while the caller takes one, so two blocks are held).

    Raises:
        StorageError: a data file is missing, truncated or corrupted, or one save holds an ID twice.

    Example::

        records = read_chain([(dir1, entry1), (dir2, entry2)])
        records.pooled.ids.numel() + records.lower_count   # the shard's IDs
    """
    return CheckedChain(chain, keep).records


LowerChunks = Generator[Tuple[torch.Tensor, torch.Tensor], None, ShardRecords]


def _check_chain(
    chain: List[Tuple[str, Dict[str, Any]]], keep: Optional[Callable[[torch.Tensor], torch.Tensor]]
) -> LowerChunks:
    """See :class:`CheckedChain`: yields the lower records as checked, returns the records."""
    width = ShardLayout.from_json(chain[0][1]["layout"]).width
    pooled: List[ShardRows] = []
    lower_blocks: List[LowerBlock] = []
    later = torch.empty(0, dtype=torch.int64)  # IDs a later save changes or removes
    low, high = np.iinfo(np.int64).max, np.iinfo(np.int64).min
    # Block after block is read into memory faulted in once, one block's rows kept at most (a load's peak memory).
    block_bytes = max((int(block["rows"]["nbytes"]) for _, e in chain for block in e["blocks"]), default=0)
    with reused_buffers(block_bytes):
        for k in range(len(chain) - 1, -1, -1):
            directory, entry = chain[k]
            blocks = entry["blocks"]
            parts = [_read(directory, entry, block["ids"], "ids") for block in blocks]  # read (checked), then joined
            identity = file_identity(confined(directory, entry["file"], "a data file"))  # before its rows are checked
            bounds = np.cumsum([0] + [part.size for part in parts]).tolist()
            ids = np.concatenate(parts) if parts else np.empty(0, dtype=np.int64)
            del parts
            save_pooled, save_lower, (first, last) = yield from _check_blocks(
                directory, entry, ids, bounds, later, keep, identity
            )
            low, high = min(low, first), max(high, last)
            if k:
                removed = _read(directory, entry, entry["arrays"]["removed"], "removed")
                later = torch.unique(torch.cat([later, torch.from_numpy(ids), torch.from_numpy(removed)]))
            ids.sort()  # in place: a save's IDs are checked distinct without a second copy
            if bool((ids[1:] == ids[:-1]).any()):
                raise StorageError(
                    f"checkpoint file '{os.path.join(directory, entry['file'])}': table {entry['layout']['table']!r} "
                    "holds an ID in two records of one save; it is corrupted"
                )
            pooled[:0], lower_blocks[:0] = save_pooled, save_lower  # in save order

    def read_lower(k: int) -> Tuple[torch.Tensor, torch.Tensor]:
        # The rows were checked above: read again unless the file changed since (their checksums are not computed
        # twice; the IDs, 8 bytes a record, are).
        directory, entry, block, lower, identity = lower_blocks[k]
        if k + 1 < len(lower_blocks):
            _will_read(*lower_blocks[k + 1][:3])
        ids = torch.from_numpy(_read(directory, entry, block["ids"], "ids"))
        rows = torch.from_numpy(_read(directory, entry, block["rows"], "rows", identity))
        if not bool(lower.all()):  # a block of rows only below the pool is passed on without a copy
            ids, rows = ids[lower], rows[lower]
        return ids, rows

    def lower_rows() -> Iterator[Tuple[torch.Tensor, torch.Tensor]]:
        # A thread reads and checksums the next block while the caller stores this one (both release the GIL in
        # reads, checksums and writes), so a load holds at most two blocks besides the caller's own copies.
        with reused_buffers(block_bytes), ThreadPoolExecutor(1, thread_name_prefix="checkpoint-read") as reader:
            pending = [reader.submit(read_lower, 0)] if lower_blocks else []
            for k in range(len(lower_blocks)):
                ids, rows = pending.pop().result()
                if k + 1 < len(lower_blocks):
                    pending.append(reader.submit(read_lower, k + 1))
                yield ids, rows
                del ids, rows  # freed before the block after the next is read

    lower_count = sum(int(block[3].sum()) for block in lower_blocks)
    return ShardRecords(concat(pooled, width), lower_count, (low, high) if low <= high else (0, -1), width, lower_rows)


def _check_blocks(
    directory: str, entry: Dict[str, Any], ids: np.ndarray, bounds: List[int], later: torch.Tensor,
    keep: Optional[Callable[[torch.Tensor], torch.Tensor]], identity: FileIdentity,
) -> Generator[Tuple[torch.Tensor, torch.Tensor], None, Tuple[List[ShardRows], List[LowerBlock], Tuple[int, int]]]:
    """Read and check every block of one save (``ids``: its IDs, block ``b`` at ``bounds[b]:bounds[b + 1]``),
    yielding each block's surviving records without a pool slot once it is checked; returns the surviving records
    with a pool slot, the blocks holding survivors without one, and the survivors' ID range.

    ``CHECK_THREADS`` threads read and checksum blocks at once (reads and checksums release the GIL); the blocks are
    taken in order, so the first damaged one is the one reported, and the disk reads the next while they are checked
    (and while the caller stores the rows yielded).
    """
    blocks = entry["blocks"]
    pooled: List[ShardRows] = []
    lower_blocks: List[LowerBlock] = []
    low, high = np.iinfo(np.int64).max, np.iinfo(np.int64).min
    checking: Deque[Tuple[Dict[str, Any], torch.Tensor, torch.Tensor, Future]] = collections.deque()
    with ThreadPoolExecutor(CHECK_THREADS, thread_name_prefix="checkpoint-check") as checker:
        for b, block in enumerate(blocks):
            if b + 1 < len(blocks):
                _will_read(directory, entry, blocks[b + 1])
            block_ids = torch.from_numpy(ids[bounds[b] : bounds[b + 1]])
            survives = ~_in_sorted(block_ids, later)
            if keep is not None:
                survives &= keep(block_ids)
            checking.append((block, block_ids, survives,
                             checker.submit(_split_block, directory, entry, block, block_ids, survives)))
            while len(checking) >= CHECK_THREADS or (checking and b + 1 == len(blocks)):
                done, done_ids, done_survives, split = checking.popleft()
                here, lower, lower_ids, lower_rows = split.result()
                del split
                pooled.append(here)
                if bool(done_survives.any()):
                    kept = done_ids[done_survives]
                    low, high = min(low, int(kept.min())), max(high, int(kept.max()))
                if lower_ids.numel():
                    lower_blocks.append((directory, entry, done, lower, identity))
                    yield lower_ids, lower_rows
                del lower_ids, lower_rows  # dropped before the next block is taken
    return pooled, lower_blocks, (low, high)


def _in_sorted(values: torch.Tensor, sorted_set: torch.Tensor) -> torch.Tensor:
    """Bool mask: which ``values`` are in ``sorted_set`` (ascending, distinct). A binary search per value:
    ``torch.isin`` sorts both sides on every call, seconds a block against the IDs of a large increment."""
    if not sorted_set.numel():
        return torch.zeros(values.shape, dtype=torch.bool)
    at = torch.searchsorted(sorted_set, values).clamp_(max=sorted_set.numel() - 1)
    return sorted_set[at] == values


def _split_block(
    directory: str, entry: Dict[str, Any], block: Dict[str, Any], ids: torch.Tensor, survives: torch.Tensor
) -> Tuple[ShardRows, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Read and check one block's other arrays: the surviving records with a pool slot, the mask of the surviving
    ones without, and their IDs and rows (a block of rows only below the pool is passed on without a copy)."""
    slots = torch.from_numpy(_read(directory, entry, block["slots"], "slots"))
    last_used = torch.from_numpy(_read(directory, entry, block["last_used"], "last_used"))
    rows = torch.from_numpy(_read(directory, entry, block["rows"], "rows"))  # checksummed even if not kept
    pooled = survives & (slots >= 0)
    lower = survives & (slots < 0)
    here = ShardRows(ids[pooled], slots[pooled], last_used[pooled], rows[pooled])
    if bool(lower.all()):  # the IDs are a view of the save's, which are sorted in place once its blocks are read
        return here, lower, ids.clone(), rows
    return here, lower, ids[lower], rows[lower]


def read_chain_records(
    chain: List[Tuple[str, Dict[str, Any]]], keep: Optional[Callable[[torch.Tensor], torch.Tensor]] = None
) -> ShardRows:
    """Every record of :func:`read_chain` in memory (lower-tier rows with slot ``-1``, last use 0).

    Example::

        records = read_chain_records([(dir1, entry1), (dir2, entry2)], keep=new_layout.owns)
    """
    checking = CheckedChain(chain, keep)  # the rows are kept as they are checked: read once
    lower = [ShardRows(i, torch.full_like(i, -1), torch.zeros_like(i), rows) for i, rows in checking]
    records = checking.records
    return concat([records.pooled, *lower], records.width)


def _will_read(directory: str, entry: Dict[str, Any], block: Dict[str, Any]) -> None:
    """Start reading ``block``'s arrays into the page cache (a hint; see :func:`will_read`)."""
    try:
        path = confined(directory, entry["file"], "a data file")
    except StorageError:
        return  # reported by the read itself
    will_read(path, block.values())


def _read(directory: str, entry: Dict[str, Any], array_entry: Dict[str, Any], what: str,
          verified: Optional[FileIdentity] = None) -> np.ndarray:
    table = entry["layout"]["table"]
    what = f"{what} of table {table!r}"
    return read_array(confined(directory, entry["file"], f"the data file of {what}"), array_entry, what, verified)


def _numpy(tensor: torch.Tensor) -> np.ndarray:
    return tensor.detach().cpu().contiguous().numpy()
