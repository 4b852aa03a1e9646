"""Loading one rank's table shards from a checkpoint: exactly when the layout is unchanged, else by resharding.

For each table shard of the model on this rank:

* **same layout** (a saved shard with an identical :class:`ShardLayout`: place, capacity, kernel, optimizer
  states, policies): the saved records and state are restored as they were: IDs at their slots, KEY_VALUE rows in
  the cache or below it as saved, the ID map's free slots, policy state, step, counters. Training continues
  bit for bit. The rows below the pool are streamed, so a KEY_VALUE shard may be larger than the host's memory:
  into empty lower tiers (a fresh model) they are stored as each block is checked, read once; into tiers that hold
  rows, they are checked block by block first and read again as they are restored.
* **any other layout** (another world size, sharding type, column split, capacity, kernel or policy): the shard
  takes the IDs it owns from every saved shard of the table, its columns from the saved column shards, weights and
  optimizer state together (:func:`~torchrec_ascend.checkpoint.records.assemble`). FUSED shards hold them in their
  pool (sorted by ID), KEY_VALUE shards in their host store (the cache fills on demand); a resharded shard's
  records are held in memory while they are assembled. Lookups and optimizer
  updates are unchanged; policies start over (every ID counts as inserted at the saved step, admission state
  empty) and the table's counters move to its first row block.

Nothing is changed before everything is read and checked (:func:`read_restores`), so a damaged or crafted
checkpoint leaves the model as it was (lower tiers filled as they were checked are emptied again: a failed load finds
them empty and leaves them so); a multi-rank load agrees across ranks between reading and applying.

Example::

    restores = read_restores(shards, chain, strict=True)   # may raise; the model is unchanged
    exact = apply_restores(shards, restores)
"""

from __future__ import annotations

import dataclasses
import logging
import os
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Tuple

import torch

from torchrec_ascend.checkpoint.layout import ShardLayout
from torchrec_ascend.checkpoint.records import ShardRecords, assemble
from torchrec_ascend.checkpoint.schema import RECORD_FIELDS
from torchrec_ascend.checkpoint.shard_files import CheckedChain, read_chain_records, read_shard_state
from torchrec_ascend.errors import CapacityError, ConfigError, StorageError
from torchrec_ascend.hash.slot_table import SlotTable
from torchrec_ascend.kernels.fused import HashRows, ShardRows

logger = logging.getLogger(__name__)

LocalShard = Tuple[HashRows, int, ShardLayout]
Chain = List[Tuple[str, Dict[str, Any]]]


@dataclasses.dataclass
class Restore:
    """What one local shard becomes: its records (slot table keys) and state, read and checked, not yet applied.

    Attributes:
        records: the shard's records (``None``: the table is not in the checkpoint and keeps its state); the rows
            without a pool slot of an exact load are read from the checkpoint again as they are restored, unless
            ``undo`` is set.
        state: as :meth:`HashRows.restore_shard` takes it.
        exact: restored with the saved layout (else resharded).
        undo: set when the shard's lower tiers were empty and took its rows without a pool slot as they were
            checked (:meth:`HashRows.fill_lower`): it empties them again, for a load that fails before it applies.
    """

    records: Optional[ShardRecords]
    state: Dict[str, Any]
    exact: bool
    undo: Optional[Callable[[], None]] = None


def read_restores(shards: List[LocalShard], chain: Chain, strict: bool) -> List[Restore]:
    """Read and check what every shard of ``shards`` becomes, changing nothing in the model.

    Every array is read and checksummed, and every shard's records and state are checked against what its kernel
    accepts (distinct IDs and slots in range, row width, the ID map's free slots, policy state: a trial restore
    into a fresh slot table), so :func:`apply_restores` cannot fail on the checkpoint's content.

    One thing may change: a KEY_VALUE shard loaded with its saved layout whose lower tiers hold no row (a fresh
    model, the usual restore) takes its rows without a pool slot into them as they are checked, so they are read
    once; the tiers are emptied again if anything fails (here, or on another rank: :func:`discard_restores`), which
    leaves the model as it was.

    Args:
        shards: ``(kernel, table index, layout)`` of this rank's table shards.
        chain: ``(directory, metadata)`` of the saves to read.
        strict: a table absent from the checkpoint is an error; else it is left as it is (with a warning).

    Raises:
        ConfigError: a table is missing (``strict``), or saved with another dimension, key kind or optimizer.
        StorageError: a checkpoint file is missing, truncated or corrupted, or the saved shards are inconsistent
            (the message names the files), or a lower tier cannot take the rows.
        CapacityError: a shard cannot hold the IDs it owns, or loading it (saved layout) would need more host
            memory than is available (see :func:`_check_memory`; a KEY_VALUE shard's rows below the pool are
            streamed, so the shard itself may be larger than memory).
    """
    directory, final = chain[-1]
    saved: Dict[str, List[Tuple[ShardLayout, Dict[str, Any]]]] = {}
    for entry in final["shards"]:
        layout = _layout_of(entry, directory)
        saved.setdefault(layout.table, []).append((layout, entry))
    restores: List[Restore] = []
    try:
        for kernel, t, layout in shards:
            sources = saved.get(layout.table)
            if not sources:
                if strict:
                    raise ConfigError(
                        f"table {layout.table!r} is not in the checkpoint at '{directory}' (it holds "
                        f"{sorted(saved)}); load with strict=False to leave it as initialised"
                    )
                logger.warning("checkpoint at '%s' has no table %r; it keeps its current state", directory,
                               layout.table)
                restores.append(Restore(None, {}, False))
                continue
            _check_compatible(layout, sources[0][0], directory)
            restores.append(_read_restore(kernel, t, layout, sources, chain))
    except BaseException:
        discard_restores(restores)
        raise
    return restores


def discard_restores(restores: List[Restore]) -> None:
    """Undo what :func:`read_restores` stored ahead (a load failing before :func:`apply_restores`)."""
    for restore in restores:
        if restore.undo is not None:
            restore.undo()


def apply_restores(shards: List[LocalShard], restores: List[Restore]) -> List[bool]:
    """Restore every shard as :func:`read_restores` prepared it; returns the shards restored exactly.

    Raises:
        StorageError: a KEY_VALUE lower tier cannot take the rows (a disk failure), or the checkpoint's files
            changed since :func:`read_restores` checked them; the table is then partially loaded.
    """
    iterations: Dict[int, int] = {}
    for (kernel, t, layout), restore in zip(shards, restores):
        if restore.records is None:
            continue
        records = restore.records
        try:
            lower = None if restore.undo is not None else records.lower_rows()
            kernel.restore_shard(t, records.pooled, lower, restore.state)
        except StorageError as error:
            raise StorageError(
                f"{error}. Table {layout.table!r} is now partially loaded: load a checkpoint again before training"
            ) from error
        iterations[id(kernel)] = max(iterations.get(id(kernel), 0), int(restore.state.get("iteration", 0)))
    for kernel, _, _ in shards:
        if id(kernel) in iterations:
            kernel.set_optimizer_iteration(iterations[id(kernel)])
    return [restore.exact for restore in restores]


def _read_restore(
    kernel: HashRows, t: int, layout: ShardLayout, sources: List[Tuple[ShardLayout, Dict[str, Any]]], chain: Chain
) -> Restore:
    """One shard's :class:`Restore` (see :func:`read_restores`); its lower tiers are empty again if it raises."""
    directory = chain[-1][0]
    exact = next((entry for source, entry in sources if source == layout), None)
    undo = None
    try:
        if exact is not None:
            entries = _entries_of(chain, layout)
            files = _files_of(entries)
            _check_memory(layout, entries, directory)
            checking = CheckedChain(entries)  # empty lower tiers take the rows as they are checked: read once
            undo = kernel.fill_lower(t, _kernel_rows(kernel, t, layout, checking, files))
            records = checking.records
            state = read_shard_state(directory, exact)
        else:
            entries = [e for source, _ in sources for e in _entries_of(chain, source)]
            files = _files_of(entries)
            records, state = _resharded(layout, sources, chain)
        records = _as_kernel_holds(kernel, t, layout, records, files)
        _trial_restore(kernel, t, layout, records, state, files)
    except BaseException:
        if undo is not None:
            undo()
        raise
    return Restore(records, state, exact is not None, undo)


def _files_of(entries: List[Tuple[str, Dict[str, Any]]]) -> List[str]:
    return sorted({os.path.join(d, e["file"]) for d, e in entries})


def _kernel_rows(
    kernel: HashRows, t: int, layout: ShardLayout, chunks: Iterable[Tuple[torch.Tensor, torch.Tensor]],
    files: List[str],
) -> Iterator[Tuple[torch.Tensor, torch.Tensor]]:
    """``chunks`` of records below the pool (global IDs, saved rows) keyed as the shard's lower tiers key them, rows
    in the kernel's dtype, each chunk's keys checked against the shard's range (a crafted ID fails here, before a
    store sees it)."""
    dtype = kernel.pack_rows(t, torch.empty(0, dtype=torch.int64)).dtype
    for ids, rows in chunks:
        keys = layout.to_local(ids)
        if keys.numel():
            _check_rows(kernel, t, layout, rows.shape[1], (int(keys.min()), int(keys.max())), files)
        yield keys, rows.to(dtype)
        del ids, keys, rows  # freed before the next block is read: a load holds one block at a time


def _as_kernel_holds(kernel: HashRows, t: int, layout: ShardLayout, records: ShardRecords,
                     files: List[str]) -> ShardRecords:
    """``records`` (read from ``files``) keyed as the slot table keys them, rows in the kernel's dtype (the lower rows
    as they are read)."""
    dtype = kernel.pack_rows(t, torch.empty(0, dtype=torch.int64)).dtype
    pooled = records.pooled
    low, high = layout.to_local(torch.tensor(records.id_range)).tolist()
    local = ShardRows(layout.to_local(pooled.ids), pooled.slots, pooled.last_used, pooled.rows.to(dtype))
    return ShardRecords(local, records.lower_count, (low, high), records.width,
                        lambda: _kernel_rows(kernel, t, layout, records.lower_rows(), files))


def _check_rows(kernel: HashRows, t: int, layout: ShardLayout, width: int, keys: Tuple[int, int],
                files: List[str]) -> None:
    """Check records of ``width`` elements whose keys (local) lie in ``keys`` against what the shard holds."""
    low, high = keys
    problem = None
    if width != kernel.row_width(t):
        problem = f"hold rows of {width} elements, the shard's are {kernel.row_width(t)}"
    elif low <= high and (low < 0 or (not layout.hash_ids and high >= layout.rows)):
        problem = "hold IDs outside the shard's range (negative IDs, or rows beyond a plain shard)"
    if problem is not None:
        raise StorageError(
            f"table {layout.table!r}: the checkpoint files {files} {problem}; the checkpoint is corrupted"
        )


def _trial_restore(
    kernel: HashRows, t: int, layout: ShardLayout, records: ShardRecords, state: Dict[str, Any], files: List[str]
) -> None:
    """Check that ``kernel`` takes ``records`` and ``state`` without touching it: the row width, the keys, and
    a restore of the pooled records into a fresh slot table of the same options (IDs, slots, free slots, policy
    state). The records' IDs are distinct already (:class:`CheckedChain`, :func:`_resharded`)."""
    _check_rows(kernel, t, layout, records.width, records.id_range, files)
    where = f"table {layout.table!r}: the checkpoint files {files}"
    if not kernel.shard_info(t).lower_tiers and records.lower_count:
        raise StorageError(f"{where} hold rows without a pool slot, but a FUSED table keeps every row in its pool; "
                           "the checkpoint is corrupted")
    pooled = records.pooled
    trial_slot_restore(kernel, t, pooled.ids, pooled.slots, pooled.last_used, state, where)


def trial_slot_restore(kernel: HashRows, t: int, ids: torch.Tensor, slots: torch.Tensor, last_used: torch.Tensor,
                       state: Dict[str, Any], where: str) -> None:
    """Restore ``ids`` at ``slots`` with ``state`` into a fresh slot table of shard ``t``'s options (IDs, slots, free
    slots, policy state), leaving the shard untouched; ``where`` starts every message.

    Raises:
        CapacityError: more IDs than the shard holds.
        ConfigError: a policy state that does not fit the table's policies.
        StorageError: anything else the restore raises (a damaged or crafted state).
    """
    table = kernel.slot_table(t)
    try:
        trial = SlotTable(table.table, table.spec, table.capacity + 1, table.overflow)
        trial.restore(ids, slots, last_used, state)
    except CapacityError:
        raise
    except ConfigError as error:
        raise ConfigError(f"{where} do not fit the table: {error}") from None
    except Exception as error:  # whatever a crafted state makes the slot table raise is corruption
        raise StorageError(
            f"{where} do not restore: {type(error).__name__}: {error}; the checkpoint is corrupted"
        ) from None


def _resharded(
    layout: ShardLayout, sources: List[Tuple[ShardLayout, Dict[str, Any]]], chain: Chain
) -> Tuple[ShardRecords, Dict[str, Any]]:
    """The records and state of a shard whose layout no saved shard has (held in memory).

    Raises:
        StorageError: the saved shards hold an ID twice (overlapping row blocks), or as :func:`assemble`.
    """
    overlapping = [
        (s, e) for s, e in sources if min(s.col0 + s.cols, layout.col0 + layout.cols) > max(s.col0, layout.col0)
    ]
    pieces = [(source, read_chain_records(_entries_of(chain, source), keep=layout.owns)) for source, _ in overlapping]
    records = assemble(layout, pieces)
    n = records.ids.numel()
    if n and bool((records.ids[1:] == records.ids[:-1]).any()):  # assemble sorts by ID
        files = sorted({os.path.join(d, e["file"]) for s, _ in overlapping for d, e in _entries_of(chain, s)})
        raise StorageError(f"table {layout.table!r}: the checkpoint files {files} hold an ID twice; the checkpoint "
                           "is corrupted")
    slots = torch.full((n,), -1, dtype=torch.int64) if layout.key_value else torch.arange(n, dtype=torch.int64)
    last_used = torch.zeros(n, dtype=torch.int64) if layout.key_value else records.last_used
    states = [entry["state"] for _, entry in sources]
    state: Dict[str, Any] = {
        "step": max(int(s.get("step", 0)) for s in states),
        "iteration": max(int(s.get("iteration", 0)) for s in states),
    }
    if layout.bucket == 0 and layout.row_offset == 0:  # the table's totals go to its first row block
        first_columns: Dict[Any, Any] = {}
        for source, entry in sources:
            first_columns.setdefault(source.block, entry["state"])  # one column shard per saved row block
        for key in ("counters", "swaps"):
            totals: Dict[str, int] = {}
            for saved_state in first_columns.values():
                for name, value in saved_state.get(key, {}).items():
                    totals[name] = totals.get(name, 0) + int(value)
            state[key] = totals
    return ShardRecords.held(ShardRows(records.ids, slots, last_used, records.rows)), state


def available_memory() -> Optional[int]:
    """Bytes of host memory available to a new allocation (``MemAvailable``), or None where the system does not
    say (no ``/proc/meminfo``)."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


LOAD_BYTES_PER_RECORD = 33  # a save's IDs read and joined (16), which records survive (1), a disk bulk load's (16)


def _check_memory(layout: ShardLayout, entries: List[Tuple[str, Dict[str, Any]]], directory: str) -> None:
    """Refuse, before reading it, a shard whose load would hold more than the host memory available (sizes from
    the checked metadata): the load would be killed for memory instead of failing cleanly. A load holds
    :data:`LOAD_BYTES_PER_RECORD` per saved record, the pooled records (each save's first block) and three blocks
    (the one stored, the next one read meanwhile and one kept for the read after it); the rows below the pool are
    streamed."""
    blocks = [[sum(int(block[f]["nbytes"]) for f in RECORD_FIELDS) for block in e["blocks"]] for _, e in entries]
    records = sum(int(block["ids"]["shape"][0]) for _, e in entries for block in e["blocks"])
    need = LOAD_BYTES_PER_RECORD * records + sum(b[0] for b in blocks if b) + 3 * max(max(b, default=0) for b in blocks)
    available = available_memory()
    if available is not None and need > available:
        raise CapacityError(
            f"table {layout.table!r}: loading its shard from '{directory}' needs about {need / 1e9:.2f} GB of host "
            f"memory ({records} saved records: {LOAD_BYTES_PER_RECORD} bytes each, the pooled rows and three blocks of "
            f"records), and this host has {available / 1e9:.2f} GB available; load on more ranks, so that each "
            "shard is smaller, or on a host with more memory"
        )


def _entries_of(chain: Chain, layout: ShardLayout) -> List[Tuple[str, Dict[str, Any]]]:
    """The shard entry with ``layout`` in every save of the chain."""
    out = []
    for directory, metadata in chain:
        entry = next((e for e in metadata["shards"] if _layout_of(e, directory) == layout), None)
        if entry is None:
            raise StorageError(
                f"checkpoint save '{directory}' has no shard of table {layout.table!r} with the layout of the later "
                "saves of its chain; the checkpoint is inconsistent"
            )
        out.append((directory, entry))
    return out


def _layout_of(entry: Dict[str, Any], directory: str) -> ShardLayout:
    try:
        return ShardLayout.from_json(entry["layout"])
    except (KeyError, TypeError) as error:
        raise StorageError(
            f"checkpoint save '{directory}': a shard's layout in its metadata is malformed: {error}"
        ) from error


def _check_compatible(layout: ShardLayout, saved: ShardLayout, directory: str) -> None:
    problems = []
    if layout.dim != saved.dim:
        problems.append(f"embedding_dim {saved.dim} saved, {layout.dim} now")
    if layout.hash_ids != saved.hash_ids:
        problems.append("saved as a " + ("hash" if saved.hash_ids else "plain") + " table")
    if layout.states != saved.states or layout.optimizer != saved.optimizer:
        problems.append(f"optimizer states {list(saved.states)} ({saved.optimizer}) saved, {list(layout.states)} "
                        f"({layout.optimizer}) now")
    if problems:
        raise ConfigError(
            f"table {layout.table!r} does not match the checkpoint at '{directory}': {'; '.join(problems)}. Load "
            "into a model built with the table's saved options and optimizer"
        )
